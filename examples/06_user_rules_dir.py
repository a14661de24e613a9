"""A rules directory of your own: load it, property-test every rule, apply the sound ones.

``examples/06_my_rules/`` holds a user's rules in both kinds of rule file:

* ``cleanup.fxr`` (the rule language): ``square_self`` and ``normalize_last``;
* ``smooth.py`` (Python): ``softplus_from_log1p_exp`` and ``residual_axpy`` written with
  ``@fxrewrite.rule``, and ``clamp_both`` as a pair of functions ``clamp_both_pattern`` /
  ``clamp_both_replacement``.

``fxrewrite.load_rules("examples/06_my_rules")`` loads them all, in a deterministic order
(files sorted by path). ``fxrewrite.testing.check_rule`` then draws inputs with Hypothesis --
several dtypes, broadcasting shapes, ``0``, ``inf``, ``nan``, huge and tiny values -- runs each
rule's pattern and replacement on them and compares. It finds that ``normalize_last`` is not
an equivalence: ``x / x.norm()`` is ``nan`` for a zero vector, where ``F.normalize`` gives 0.

A search can miss a rare edge, so the user also keeps the inputs they know to be delicate, per
rule, and runs them with ``fxrewrite.testing.evaluate`` (:data:`KNOWN_EDGES`): in
``residual_axpy``, ``y * s`` overflows to ``inf`` before the addition in the pattern, while
``torch.add(x, y, alpha=s)`` does not, so ``-inf + y * s`` is ``nan`` on one side and ``-inf``
on the other.

The script applies only the rules that pass both. (``fxrewrite check examples/06_my_rules``
runs the property tests from the command line.)

Run:  python examples/06_user_rules_dir.py
CLI:  fxrewrite apply examples/06_user_rules_dir.py:model --rules examples/06_my_rules --export --check
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import fxrewrite

RULES_DIR = Path(__file__).resolve().parent / "06_my_rules"

#: Inputs known to be delicate for a rule: each must give the same result before and after.
KNOWN_EDGES: dict[str, list[dict[str, object]]] = {
    "residual_axpy": [{"x": torch.tensor(float("-inf")), "y": torch.tensor(-3e38), "s": -2.0}],
    "softplus_from_log1p_exp": [{"x": torch.tensor([-100.0, 0.0, 20.0, 30.0])}],
}


class EmbeddingHead(nn.Module):
    """A small retrieval head: a gated projection, clamped, squared and L2-normalised."""

    def __init__(self, features: int = 32, hidden: int = 64, out: int = 16) -> None:
        super().__init__()
        self.proj = nn.Linear(features, hidden)
        self.gate = nn.Linear(features, hidden)
        self.out = nn.Linear(hidden, out)

    def forward(self, x):
        h = self.proj(x)
        g = torch.log1p(torch.exp(self.gate(x)))  # softplus, written out
        h = h + g * 0.5
        h = torch.clamp_max(torch.clamp_min(h, -3.0), 3.0)
        e = self.out(h * h)
        return e / e.norm(dim=-1, keepdim=True)


def model(seed: int = 0) -> EmbeddingHead:
    """The ``fxrewrite apply`` target."""
    torch.manual_seed(seed)
    return EmbeddingHead().eval()


def example_inputs() -> tuple[torch.Tensor]:
    return (torch.randn(4, 32, generator=torch.Generator().manual_seed(1)),)


def load() -> fxrewrite.RuleSet:
    return fxrewrite.load_rules(RULES_DIR)


def check_all(rules: fxrewrite.RuleSet, max_examples: int = 100) -> dict[str, object]:
    """``check_rule`` on every rule, by name (Hypothesis is imported only here)."""
    from fxrewrite.testing import check_rule

    return {rule.name: check_rule(rule, max_examples=max_examples) for rule in rules}


def known_edge_failures(rules: fxrewrite.RuleSet) -> dict[str, list[object]]:
    """For each rule, the counterexamples among its KNOWN_EDGES (``evaluate`` returns None when
    pattern and replacement agree)."""
    from fxrewrite.testing import evaluate

    return {rule.name: [found for inputs in KNOWN_EDGES.get(rule.name, ()) if (found := evaluate(rule, inputs))]
            for rule in rules}


def main() -> dict[str, object]:
    rules = load()
    print(f"loaded {len(rules)} rules from {RULES_DIR.name}/:")
    for r in rules:
        print(f"  {r.name:<24} {Path(r.origin).name}  {r.doc}")

    results = check_all(rules)
    print("\nproperty tests (fxrewrite.testing.check_rule):")
    for name, result in results.items():
        print(f"  {name:<24} {result.verdict:<10} {result.examples_run:>4} example(s)")
    for result in results.values():
        if not result.ok:
            print(f"\n{result.message}")
    edges = known_edge_failures(rules)
    print("\nknown edge cases (fxrewrite.testing.evaluate):")
    for name, inputs in KNOWN_EDGES.items():
        print(f"  {name:<24} {len(inputs)} input(s): {'FAIL' if edges[name] else 'ok'}")
        for found in edges[name]:
            inputs = ", ".join(f"{k}={v!r}" for k, v in found.inputs.items())
            print(f"    {inputs}: {found.problem}")

    sound = fxrewrite.RuleSet([r for r in rules if results[r.name].ok and not edges[r.name]])
    print("\napplying:", ", ".join(sound.names))
    net = model()
    (x,) = example_inputs()
    result = fxrewrite.rewrite(net, sound, example_inputs=(x,))  # square_self's guard reads dtypes
    print("\nbefore:", torch.fx.symbolic_trace(net).code)
    print("after:", result.code)
    print(result.report)
    result.module.graph.lint()
    with torch.no_grad():
        torch.testing.assert_close(result.module(x), net(x))
    print("outputs match")
    return {"rules": rules, "checks": results, "edges": edges, "applied": sound.names, "result": result}


if __name__ == "__main__":
    main()
