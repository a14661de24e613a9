"""One input, both sides: :func:`evaluate` runs a rule's pattern and replacement on the same
concrete inputs and says how they differ (a :class:`~fxrewrite.testing._report.Counterexample`),
or that the input is outside the rule's domain (:class:`PatternRaised`). The search
(:mod:`fxrewrite.testing._search`) calls it on every drawn input. No Hypothesis here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..domain import Tolerance
from ..rule import Rule
from ..verify import compare
from ._numerics import values_problem
from ._report import Counterexample, first_line
from ._running import call_rule_function

__all__ = ["PatternRaised", "evaluate"]


class PatternRaised(ValueError):
    """The pattern raised on an input: the input is outside the rule's domain."""


#: No declared tolerance: ``torch.testing.assert_close``'s defaults.
_DEFAULT_TOLERANCE = Tolerance()


def evaluate(rule: Rule, inputs: Mapping[str, Any], tolerance: Tolerance = _DEFAULT_TOLERANCE, *,
             notes: dict[str, str] | None = None) -> Counterexample | None:
    """Run the pattern and the replacement on ``inputs``; ``None`` when they agree.

    Raises :class:`PatternRaised` (a ``ValueError``) when the pattern itself raises: such inputs
    are not in the rule's domain. ``notes``, when given, receives what is worth reporting but is
    no counterexample (under ``"aliasing"``: an output that is an input on one side only).

    >>> import torch
    >>> from fxrewrite import Rule
    >>> rule = Rule.from_functions(lambda x: x / x, lambda x: torch.ones_like(x), name="div_self")
    >>> print(evaluate(rule, {"x": torch.tensor([2.0, 0.0])}).problem)
    values differ at 1 of 2 elements (rtol=1.3e-06, atol=1e-05): at index (1,) pattern nan, replacement 1.0
    """
    try:
        expected, pattern_args = call_rule_function(rule.pattern, inputs)
    except Exception as exc:
        raise PatternRaised(f"the pattern of rule '{rule.name}' raises on these inputs: {exc}") from exc
    try:
        actual, replacement_args = call_rule_function(rule.replacement, inputs)
    except Exception as exc:
        return Counterexample(inputs, f"the replacement raised {type(exc).__name__}: {first_line(exc)}",
                              expected, None, exc)
    problem = values_problem(rule, inputs, expected, actual, tolerance.rtol, tolerance.atol)
    if problem is None:
        problem = _mutation_problem(pattern_args, replacement_args, tolerance)
    if notes is not None and "aliasing" not in notes:
        aliasing = _aliasing_note(expected, pattern_args, actual, replacement_args)
        if aliasing:
            notes["aliasing"] = aliasing
    return Counterexample(inputs, problem, expected, actual) if problem else None


def _aliased_inputs(output: Any, args: Mapping[str, Any]) -> list[str]:
    """The tensor arguments whose storage an output shares (the output is the input, or a view)."""
    leaves = [output] if isinstance(output, torch.Tensor) else [o for o in output if isinstance(o, torch.Tensor)] \
        if isinstance(output, (tuple, list)) else []
    storages = {o.untyped_storage().data_ptr() for o in leaves if o.numel()}
    return [n for n, v in args.items() if isinstance(v, torch.Tensor) and v.numel()
            and v.untyped_storage().data_ptr() in storages]


def _aliasing_note(expected: Any, pattern_args: Mapping[str, Any], actual: Any,
                   replacement_args: Mapping[str, Any]) -> str | None:
    pattern, replacement = _aliased_inputs(expected, pattern_args), _aliased_inputs(actual, replacement_args)
    if pattern == replacement:
        return None
    def side(names: list[str]) -> str:
        return f"shares the storage of input {', '.join(repr(n) for n in names)}" if names else "is a new tensor"
    return (f"the replacement's output {side(replacement)} where the pattern's {side(pattern)}; rewrite() "
            f"clones such an output in context, so programs stay right, but code that writes into one of them "
            f"sees the difference")


def _mutation_problem(after_pattern: Mapping[str, Any], after_replacement: Mapping[str, Any],
                      tolerance: Tolerance) -> str | None:
    for name, value in after_pattern.items():
        if isinstance(value, torch.Tensor):
            problem = compare(value, after_replacement[name], rtol=tolerance.rtol, atol=tolerance.atol,
                              names=("pattern", "replacement"))
            if problem:
                return f"the two sides leave input '{name}' modified differently (in-place operations): {problem}"
    return None
