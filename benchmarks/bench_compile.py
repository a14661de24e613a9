"""What an fxrewrite rule set costs inside ``torch.compile``.

On a GPT-2-style model (Hugging Face ``GPT2LMHeadModel`` with a small config and random
weights, eager attention; or, with ``--model tiny`` or without ``transformers``, the hand-written
decoder of ``examples/08_rules_in_torch_compile.py``) the script compiles the model with CPU
Inductor, in one process:

* once without any custom pass (the baseline compile time);
* once per ``--stages`` entry with ``fxrewrite.inductor_pass(rules, stage=...)`` installed.

Every compile starts cold (``torch._dynamo.reset()`` and a fresh Inductor cache directory), after
one warm-up compile of a tiny function, and its output is compared with eager. For each compile
it reports the whole compile time (the first call), the time spent in the fxrewrite pass per
graph (rewrite, preparation and lowering: ``RulePass.seconds``), and the time of Inductor's own
pattern-matcher passes (``pass_pattern_*`` in ``torch._dynamo.utils.compilation_time_metrics``,
joint and post-grad), then the ratios of the pass to both.

Run:
    python benchmarks/bench_compile.py                       # GPT-2, 2 layers, the standard rules
    python benchmarks/bench_compile.py --layers 12            # GPT-2 small (slow: minutes)
    python benchmarks/bench_compile.py --model tiny --stages pre_grad,post_grad
    python benchmarks/bench_compile.py --rules examples/08_rules
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

import fxrewrite

ROOT = Path(__file__).resolve().parent.parent
_PATTERN_TIMER = re.compile(r"^pass\.(joint_graph|post_grad)_passes\.pass_pattern_\d+$")


def gpt2(layers: int, seq: int) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """Hugging Face GPT-2 with GPT-2 small's widths, ``layers`` blocks, random weights."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=layers, n_embd=768, n_head=12, n_positions=1024, vocab_size=50257)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config).eval()
    model.config.use_cache = False
    ids = torch.randint(0, config.vocab_size, (1, seq), generator=torch.Generator().manual_seed(1))
    return _Logits(model), (ids,)


class _Logits(torch.nn.Module):
    """The model's logits as a plain tensor output."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(ids, use_cache=False).logits


def tiny(layers: int) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """The hand-written GPT-style decoder of example 08."""
    path = ROOT / "examples" / "08_rules_in_torch_compile.py"
    spec = importlib.util.spec_from_file_location("bench_example_08", path)
    example = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = example
    spec.loader.exec_module(example)
    torch.manual_seed(0)
    net = example.TinyGPT(layers=layers).eval()
    return net, (example.tokens_for(net),)


def build(kind: str, layers: int, seq: int) -> tuple[str, torch.nn.Module, tuple[torch.Tensor, ...]]:
    if kind == "hf":
        try:
            model, inputs = gpt2(layers, seq)
            return f"GPT-2 ({layers} layers, 768 wide, {seq} tokens)", model, inputs
        except ImportError:
            print("transformers is not installed: using the hand-written decoder (--model tiny)")
    model, inputs = tiny(layers)
    return f"hand-written GPT-style decoder ({layers} layers)", model, inputs


def compile_once(model: torch.nn.Module, inputs: Sequence[torch.Tensor], options: dict[str, Any]) -> dict[str, float]:
    """One cold compile (first call) with ``options``; checks the output against eager."""
    from torch._dynamo.utils import compilation_time_metrics
    from torch._inductor.utils import fresh_cache

    torch._dynamo.reset()
    compilation_time_metrics.clear()
    with fresh_cache(), torch.no_grad():
        started = time.perf_counter()
        out = torch.compile(model, options=options)(*inputs)
        seconds = time.perf_counter() - started
        torch.testing.assert_close(out, model(*inputs), rtol=1e-3, atol=1e-3)
    patterns = sum(sum(times) for name, times in compilation_time_metrics.items() if _PATTERN_TIMER.match(name))
    return {"compile": seconds, "patterns": patterns}


def warm_up() -> None:
    with contextlib.redirect_stdout(None):
        compile_once(torch.nn.ReLU(), (torch.randn(4),), {})


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    rules = fxrewrite.load_rules(args.rules)
    name, model, inputs = build(args.model, args.layers, args.seq)
    print(f"{name}; {len(rules)} rules from {args.rules or 'the standard library'}")
    warm_up()
    rows = [{"stage": "(no pass)", **compile_once(model, inputs, {}), "pass": 0.0, "graphs": 0, "rewrites": 0}]
    for stage in args.stages:
        rules_pass = fxrewrite.inductor_pass(rules, stage=stage)
        timings = compile_once(model, inputs, rules_pass.options)
        rows.append({"stage": stage, **timings, "pass": rules_pass.seconds, "graphs": rules_pass.graphs,
                     "rewrites": rules_pass.report.rewrites,
                     "fired": {k: v for k, v in rules_pass.report.applied.items() if v}})
    return rows


def show(rows: list[dict[str, Any]]) -> None:
    print(f"\n{'stage':<15} {'compile s':>10} {'graphs':>6} {'pass ms/graph':>14} {'Inductor patterns ms':>21} "
          f"{'pass/compile':>13} {'pass/patterns':>14} {'rewrites':>9}")
    for r in rows:
        per_graph = r["pass"] / r["graphs"] * 1e3 if r["graphs"] else 0.0
        to_compile = f"{r['pass'] / r['compile']:.2%}" if r["graphs"] else "-"
        to_patterns = f"{r['pass'] / r['patterns']:.2f}x" if r["graphs"] and r["patterns"] else "-"
        print(f"{r['stage']:<15} {r['compile']:>10.2f} {r['graphs']:>6} {per_graph:>14.1f} "
              f"{r['patterns'] * 1e3:>21.1f} "
              f"{to_compile:>13} {to_patterns:>14} {r['rewrites']:>9}")
    for r in rows[1:]:
        print(f"  {r['stage']}: fired {r['fired'] or 'nothing'}")


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("hf", "tiny"), default="hf",
                        help="GPT-2 from transformers, or example 08's decoder")
    parser.add_argument("--layers", type=int, default=2, help="transformer blocks (GPT-2 small has 12)")
    parser.add_argument("--seq", type=int, default=64, help="tokens per sequence (GPT-2 only)")
    parser.add_argument("--stages", type=lambda s: s.split(","), default=["pre_grad", "post_grad"],
                        help="comma-separated stages to install the pass at (see fxrewrite.inductor.STAGES)")
    parser.add_argument("--rules", default=None, help="a rules file or directory (default: the standard library)")
    args = parser.parse_args(argv)
    rows = run(args)
    show(rows)
    return rows


if __name__ == "__main__":
    main()
