"""What the checker reports: the verdict on a rule (:class:`CheckResult`), the inputs that break
it (:class:`Counterexample`) and the words of every message (:func:`unsound_report`,
:func:`untestable_report`, ...). Nothing here runs a rule or draws an input: the search
(:mod:`fxrewrite.testing._search`) finds counterexamples, the orchestration
(:mod:`fxrewrite.testing.equivalence`) decides the verdict and asks this module to word it.

>>> import torch
>>> found = Counterexample({"x": torch.tensor(0.0)}, "values differ at 1 of 1 elements", torch.tensor(float("nan")),
...                        torch.tensor(1.0))
>>> found.kind, found.key, found.headline
('values', 'values', 'the replacement computes different values')
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import attrs
import torch

from ..domain import Tolerance
from ..rule import Rule, describe_numerics
from ..verify import format_value
from ._plan import InputPlan
from ._running import GuardRaised

__all__ = [
    "KEY_ORDER",
    "CheckContext",
    "CheckResult",
    "Counterexample",
    "Kind",
    "Verdict",
    "first_line",
]

Verdict = Literal["sound", "unsound", "untestable", "error"]
Kind = Literal["values", "shape", "dtype", "structure", "raises", "mutation"]

_KIND_ORDER: tuple[Kind, ...] = ("values", "shape", "dtype", "structure", "raises", "mutation")
#: Kinds of difference as the search tells them apart: differing values where an output holds nan
#: or inf are one kind, differing finite values another, so that a nan cannot hide a second bug.
KEY_ORDER: tuple[str, ...] = ("values", "values:finite", *_KIND_ORDER[1:])
_HEADLINES: Mapping[Kind, str] = {
    "values": "the replacement computes different values",
    "shape": "the replacement returns a different shape",
    "dtype": "the replacement returns a different dtype",
    "structure": "the replacement returns a different structure",
    "raises": "the replacement raises where the pattern does not",
    "mutation": "the two sides modify their inputs differently",
}


@attrs.frozen(eq=False)
class Counterexample:
    """An input on which the replacement does not compute what the pattern computes."""

    inputs: Mapping[str, Any]
    problem: str
    pattern_output: Any = None
    replacement_output: Any = None
    replacement_error: BaseException | None = None

    @property
    def kind(self) -> Kind:
        if self.replacement_error is not None:
            return "raises"
        if self.problem.startswith("the two sides"):
            return "mutation"
        for word, kind in (("shapes differ", "shape"), ("dtypes differ", "dtype"), ("values differ", "values")):
            if word in self.problem:
                return kind  # type: ignore[return-value]
        return "structure"

    @property
    def key(self) -> str:
        """The kind, with differing values split by whether an output holds nan or inf."""
        kind = self.kind
        if kind == "values" and not (_non_finite(self.pattern_output) or _non_finite(self.replacement_output)):
            return "values:finite"
        return kind

    @property
    def headline(self) -> str:
        return _HEADLINES[self.kind]


def _non_finite(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.dtype.is_floating_point and not bool(value.isfinite().all())
    if isinstance(value, (tuple, list)):
        return any(_non_finite(v) for v in value)
    return isinstance(value, float) and not math.isfinite(value)


def first_line(exc: BaseException) -> str:
    """The first line of an error's message ("" for an empty one)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


@attrs.frozen(eq=False)
class CheckResult:
    """The verdict on one rule.

    ``verdict`` is ``"sound"`` (no counterexample in ``examples_run`` examples), ``"unsound"``,
    ``"untestable"`` (no drawn input was accepted by the pattern and the guards) or ``"error"``
    (a guard raised, the domain is malformed, the rule is not deterministic...).
    ``counterexample`` holds the shrunk inputs of the first counterexample, ``counterexamples``
    one per kind of difference found; ``message`` is the readable report. For an unsound rule,
    ``repair`` is the rule restricted by the weakest restriction under which the checker finds
    no counterexample (see :mod:`fxrewrite.testing.repair`), ``None`` when none was found, and
    ``repair_code`` the ``where=``/``domain=`` arguments that restrict it, to paste.
    """

    rule: str
    origin: str
    verdict: Verdict
    examples_run: int
    seconds: float
    message: str
    counterexamples: tuple[Counterexample, ...] = ()
    repair: Rule | None = None
    repair_code: str | None = None

    @property
    def ok(self) -> bool:
        return self.verdict == "sound"

    @property
    def counterexample(self) -> Mapping[str, Any] | None:
        return self.counterexamples[0].inputs if self.counterexamples else None


@attrs.frozen(eq=False)
class CheckContext:
    """One check of one rule: the rule, what is drawn for it, its tolerance and the search's
    budget; what every search of the check and every line of its report read."""

    rule: Rule
    plan: InputPlan
    tolerance: Tolerance
    max_examples: int
    seed: int | None
    #: What the searches noted that is no counterexample (aliasing outputs, see ``evaluate``).
    notes: dict[str, str] = attrs.Factory(dict)

    def search_line(self, examples: int) -> str:
        seed = "derandomized" if self.seed is None else f"seed={self.seed}"
        budget = f"max_examples={self.max_examples}, {seed}"
        return f"first counterexample after {examples} example(s), then shrunk ({budget})"

    def rule_line(self) -> str:
        doc = f"  -- {self.rule.doc}" if self.rule.doc else ""
        return f"  rule:        {self.rule.name} at {self.rule.origin}{doc}"


# -- the lines of a report -----------------------------------------------------------------------


def _output_dtype(value: Any) -> torch.dtype | None:
    if isinstance(value, torch.Tensor):
        return value.dtype
    if isinstance(value, (tuple, list)):
        return next((d for d in map(_output_dtype, value) if d is not None), None)
    return None


def _input_lines(inputs: Mapping[str, Any], indent: str) -> list[str]:
    lines = []
    for name, value in inputs.items():
        lines.append(f"{indent}{name} = {format_value(value)}")
        if isinstance(value, torch.nn.Module):
            for attr, tensor in (*value.named_parameters(recurse=False), *value.named_buffers(recurse=False)):
                if tensor is not None and tensor.dim() > 0:
                    lines.append(f"{indent}{name}.{attr} = {format_value(tensor.detach())}")
    return lines


def _counterexample_lines(found: Counterexample, indent: str) -> list[str]:
    replacement = (f"raised {type(found.replacement_error).__name__}: {first_line(found.replacement_error)}"
                   if found.replacement_error is not None else format_value(found.replacement_output))
    return [
        f"{indent}inputs:",
        *_input_lines(found.inputs, indent + "  "),
        f"{indent}pattern     -> {format_value(found.pattern_output)}",
        f"{indent}replacement -> {replacement}",
        f"{indent}difference:  {found.problem}",
    ]


def _numerics_lines(rule: Rule) -> list[str]:
    return [f"  numerics:    {describe_numerics(rule)}"] if rule.numerics else []


def note_lines(context: CheckContext) -> list[str]:
    """What the searches saw that is no counterexample: an output aliasing an input on one side
    only, and inputs on which the pattern raises but the replacement returns."""
    lines = []
    if "aliasing" in context.notes:
        lines.append(f"  aliasing:    {context.notes['aliasing']}")
    found = context.plan.pattern_errors.found if context.plan.pattern_errors is not None else None
    if found is not None:
        inputs, error = found
        lines += ["  diverges:    the pattern raises where the replacement returns (not a counterexample: the rule "
                  "never matches a program that raises, but after a rewrite such a program would run):",
                  *_input_lines(inputs, "                 "), f"               the pattern raised {error}"]
    return lines


# -- the reports, one per verdict ----------------------------------------------------------------


def sound_report(context: CheckContext, examples: int) -> str:
    """The report for a sound rule: how many examples, under which domain, and the notes."""
    rule = context.rule
    return "\n".join([f"rule '{rule.name}' is sound on {examples} examples (rule '{rule.name}' ({rule.origin}); "
                      f"domain {context.plan.domain.describe()})", *_numerics_lines(rule), *note_lines(context)])


def unsound_report(context: CheckContext, found: Sequence[Counterexample], examples: int, repair: str = "") -> str:
    """The report for an unsound rule: its first counterexample in full, then one for each other
    kind of difference, then the declarations, how the search went, the ``repair`` lines (see
    :func:`fxrewrite.testing.repair.repair_report`) and what to do."""
    first, others = found[0], found[1:]
    more = f" (and {len(others)} more kind{'s' if len(others) > 1 else ''} of difference below)" if others else ""
    lines = [f"rule '{context.rule.name}' is unsound: {first.headline}{more}", context.rule_line(),
             *_counterexample_lines(first, "  ")]
    for other in others:
        lines += [f"  another counterexample: {other.headline}", *_counterexample_lines(other, "    ")]
    lines += [
        f"  tolerance:   {context.tolerance.describe(_output_dtype(first.pattern_output))}",
        *_numerics_lines(context.rule),
        f"  domain:      {context.plan.domain.describe()}",
        f"  search:      {context.search_line(examples)}",
        *note_lines(context),
        *repair.splitlines(),
        "  fix:         fix the replacement, or restrict the rule with a where= guard so it does not fire on "
        "such inputs, or declare domain=/tolerance= if such inputs cannot occur.",
    ]
    return "\n".join(lines)


def guard_report(context: CheckContext, exc: GuardRaised) -> str:
    """The report for a rule whose guard raises on inputs its pattern accepts."""
    return "\n".join([
        f"rule '{context.rule.name}' has a guard that raises on inputs the pattern accepts "
        f"(a rewrite would fail there)",
        context.rule_line(),
        "  inputs:",
        *_input_lines(exc.inputs, "    "),
        f"  error:       {exc}",
        f"  domain:      {context.plan.domain.describe()}",
        "  fix:         make the guard return False for such inputs (e.g. check m['x'].dim() first).",
    ])


def untested_report(context: CheckContext, examples: int, needed: int) -> str:
    """The report for a rule of which fewer than ``needed`` drawn inputs were accepted."""
    return "\n".join([
        f"rule '{context.rule.name}' could not be tested enough: only {examples} drawn input(s) were accepted by "
        f"the pattern and its guards, fewer than the {needed} needed to call it sound",
        context.rule_line(),
        f"  domain:      {context.plan.domain.describe()}",
        "  fix:         declare a domain whose inputs the pattern and its guards accept (dtypes, ranks, sides, "
        "'inputs' for one argument, 'literals' for literal captures), so that the search can try the rule.",
    ])


def untestable_report(context: CheckContext, exc: BaseException | None) -> str:
    """The report for a rule of which no drawn input was accepted (``exc``: why the search gave up)."""
    plan = context.plan
    why = plan.probe_failure or "the pattern or the guards rejected every drawn input"
    reason = f" ({type(exc).__name__})" if exc is not None else ""
    return "\n".join([
        f"rule '{context.rule.name}' could not be tested: no drawn input was accepted{reason}",
        context.rule_line(),
        f"  pattern:     {why}",
        f"  domain:      {plan.domain.describe()}",
        "  fix:         declare a domain that produces inputs the pattern and guards accept, e.g. "
        "domain={'dtypes': (torch.float32,), 'ranks': (2, 4), 'sides': (2, 4)}, or values for literal "
        "captures: domain={'literals': {'n': [1, 2]}}.",
    ])


def cannot_check_report(rule: Rule, error: BaseException) -> str:
    """The one-line report for a rule whose declarations cannot be checked (a malformed domain...)."""
    return f"rule '{rule.name}' ({rule.origin}) cannot be checked: {error}"


def flaky_report(rule: Rule, exc: BaseException) -> str:
    """The one-line report for a rule that does not compute the same thing twice on one input."""
    return (f"rule '{rule.name}' ({rule.origin}) cannot be checked: it is not deterministic, a failing input passed "
            f"when tried again ({type(exc).__name__}). Make the pattern and replacement pure functions of their "
            f"inputs.")
