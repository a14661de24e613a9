"""Property-test a rule: does its replacement compute what its pattern computes?

:func:`check_rule` draws inputs with :func:`~fxrewrite.testing.strategies.inputs_for`, calls the
pattern and the replacement eagerly on each, and compares the results with
:func:`fxrewrite.verify.compare` under the rule's declared tolerance. A *counterexample* is an
input on which the pattern runs and the replacement raises, returns another shape, dtype or
values, or leaves its inputs modified differently. Hypothesis shrinks it to a small one, and the
report shows it in full:

>>> import torch
>>> from fxrewrite import Rule
>>> mul_zero = Rule.from_functions(lambda x: x * 0.0, lambda x: torch.zeros_like(x), name="mul_zero",
...                                domain={"dtypes": (torch.float32,)})
>>> result = check_rule(mul_zero, max_examples=50)
>>> result.ok, result.verdict, result.counterexample["x"]
(False, 'unsound', tensor(inf))
>>> print(result.message.splitlines()[0])
rule 'mul_zero' is unsound: the replacement computes different values
>>> check_rule(Rule.from_functions(lambda x: torch.neg(torch.neg(x)), lambda x: x, name="double_neg")).ok
True

:func:`assert_rule_equivalent` raises :class:`~fxrewrite.errors.NotEquivalent` with the same
report, for use in tests.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import attrs
import torch
from hypothesis import HealthCheck, Phase, Verbosity, given, reject, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.errors import FailedHealthCheck, Flaky, Unsatisfiable

from ..errors import NotEquivalent, RuleDefinitionError
from ..rule import Rule
from ..verify import compare, default_tolerance, format_value
from .strategies import GuardRaised, InputPlan, call_rule_function, plan_inputs

__all__ = ["CheckResult", "Counterexample", "PatternRaised", "Tolerance", "Verdict", "assert_rule_equivalent",
           "check_rule", "evaluate"]

Verdict = Literal["sound", "unsound", "untestable", "error"]

#: Examples drawn per rule unless told otherwise.
DEFAULT_EXAMPLES = 100

_TOLERANCE_KEYS = ("rtol", "atol")


@attrs.frozen
class Tolerance:
    """A rule's ``tolerance`` declaration: ``{"rtol": ..., "atol": ...}``; a missing key keeps
    ``torch.testing.assert_close``'s default for the output's dtype."""

    rtol: float | None = None
    atol: float | None = None

    @classmethod
    def parse(cls, declared: Mapping[str, float] | None, *, where: str) -> Tolerance:
        declared = dict(declared or {})
        unknown = sorted(set(declared) - set(_TOLERANCE_KEYS))
        if unknown:
            raise RuleDefinitionError(
                f"{where}: unknown tolerance key(s) {unknown}; declare tolerance={{'rtol': ..., 'atol': ...}} "
                f"(either may be left out).")
        for key, value in declared.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise RuleDefinitionError(f"{where}: tolerance['{key}'] must be a number >= 0, got {value!r}.")
        return cls(**{k: float(v) for k, v in declared.items()})

    @property
    def declared(self) -> bool:
        return self.rtol is not None or self.atol is not None

    def describe(self, dtype: torch.dtype | None = None) -> str:
        """One line for reports, with the values in effect for ``dtype``."""
        if dtype is None:
            dtype = torch.float32
        default_rtol, default_atol = default_tolerance(dtype)
        rtol = default_rtol if self.rtol is None else self.rtol
        atol = default_atol if self.atol is None else self.atol
        exact = not (dtype.is_floating_point or dtype.is_complex)
        effective = "exact" if exact else f"rtol={rtol:g}, atol={atol:g}"
        if not self.declared:
            return f"default (as torch.testing.assert_close; for {dtype}: {effective})"
        declared = {k: v for k, v in (("rtol", self.rtol), ("atol", self.atol)) if v is not None}
        return f"declared {declared} (for {dtype}: {effective})"


@attrs.frozen(eq=False)
class Counterexample:
    """An input on which the replacement does not compute what the pattern computes."""

    inputs: Mapping[str, Any]
    problem: str
    pattern_output: Any = None
    replacement_output: Any = None
    replacement_error: BaseException | None = None

    @property
    def headline(self) -> str:
        if self.replacement_error is not None:
            return "the replacement raises where the pattern does not"
        if self.problem.startswith("the "):
            return self.problem.split(":")[0]
        for what in ("shapes", "dtypes", "lengths", "keys", "devices"):
            if f"{what} differ" in self.problem:
                return f"the replacement returns different {what}"
        return "the replacement computes different values"


class PatternRaised(ValueError):
    """The pattern raised on an input: the input is outside the rule's domain."""


def evaluate(rule: Rule, inputs: Mapping[str, Any], tolerance: Tolerance = Tolerance()) -> Counterexample | None:
    """Run the pattern and the replacement on ``inputs``; ``None`` when they agree.

    Raises :class:`PatternRaised` (a ``ValueError``) when the pattern itself raises: such inputs
    are not in the rule's domain.
    """
    try:
        expected, pattern_args = call_rule_function(rule.pattern, inputs)
    except Exception as exc:
        raise PatternRaised(f"the pattern of rule '{rule.name}' raises on these inputs: {exc}") from exc
    try:
        actual, replacement_args = call_rule_function(rule.replacement, inputs)
    except Exception as exc:
        return Counterexample(inputs, f"the replacement raised {type(exc).__name__}: {_first_line(exc)}",
                              expected, None, exc)
    problem = compare(expected, actual, rtol=tolerance.rtol, atol=tolerance.atol, names=("pattern", "replacement"))
    if problem is None:
        problem = _mutation_problem(pattern_args, replacement_args, tolerance)
    return Counterexample(inputs, problem, expected, actual) if problem else None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def _mutation_problem(after_pattern: Mapping[str, Any], after_replacement: Mapping[str, Any],
                      tolerance: Tolerance) -> str | None:
    for name, value in after_pattern.items():
        if isinstance(value, torch.Tensor):
            problem = compare(value, after_replacement[name], rtol=tolerance.rtol, atol=tolerance.atol,
                              names=("pattern", "replacement"))
            if problem:
                return f"the two sides leave input '{name}' modified differently (in-place operations): {problem}"
    return None


@attrs.frozen(eq=False)
class CheckResult:
    """The verdict on one rule.

    ``verdict`` is ``"sound"`` (no counterexample in ``examples_run`` examples), ``"unsound"``
    (``counterexample`` holds the shrunk inputs), ``"untestable"`` (no input could be drawn that
    the pattern and the guards accept) or ``"error"`` (a guard raised, the domain is malformed,
    the rule is not deterministic...). ``message`` is the readable report.
    """

    rule: str
    origin: str
    verdict: Verdict
    examples_run: int
    seconds: float
    message: str
    counterexample: Mapping[str, Any] | None = None
    details: Counterexample | None = None

    @property
    def ok(self) -> bool:
        return self.verdict == "sound"


class _Unsound(Exception):
    def __init__(self, counterexample: Counterexample) -> None:
        super().__init__(counterexample.problem)
        self.counterexample = counterexample


@attrs.define
class _Search:
    """One Hypothesis run over a rule's inputs, counting examples until the first failure."""

    rule: Rule
    tolerance: Tolerance
    examples: int = 0
    failed: bool = False

    def body(self, inputs: dict[str, Any]) -> None:
        try:
            counterexample = evaluate(self.rule, inputs, self.tolerance)
        except PatternRaised:
            reject()
        if not self.failed:
            self.examples += 1
        if counterexample is not None:
            self.failed = True
            raise _Unsound(counterexample)

    def run(self, plan: InputPlan, max_examples: int, seed: int | None) -> None:
        test = given(plan.strategy())(self.body)
        test = settings(
            max_examples=max_examples, deadline=None, database=None, derandomize=seed is None,
            suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet, report_multiple_bugs=False,
            print_blob=False, phases=(Phase.explicit, Phase.generate, Phase.shrink),
        )(test)
        if seed is not None:
            test = hypothesis_seed(seed)(test)
        test()


def check_rule(rule: Rule, *, max_examples: int = DEFAULT_EXAMPLES, seed: int | None = None) -> CheckResult:
    """Property-test ``rule`` on up to ``max_examples`` drawn inputs.

    Without ``seed`` the search is derandomized (the same examples every run); a ``seed`` draws
    other, equally reproducible, examples. The result's ``message`` is the report to show.
    """
    start = time.perf_counter()
    where = f"rule '{rule.name}' ({rule.origin})"
    try:
        plan = plan_inputs(rule)
        tolerance = Tolerance.parse(rule.tolerance, where=where)
    except RuleDefinitionError as exc:
        return _result(rule, "error", 0, start, f"{where} cannot be checked: {exc}")
    search = _Search(rule, tolerance)
    context = _Context(plan, tolerance, max_examples, seed)
    try:
        with _one_thread():
            search.run(plan, max_examples, seed)
    except _Unsound as exc:
        found = exc.counterexample
        message = unsound_report(rule, found, context, search.examples)
        return _result(rule, "unsound", search.examples, start, message, found)
    except GuardRaised as exc:
        found = Counterexample(exc.inputs, str(exc))
        return _result(rule, "error", search.examples, start, guard_report(rule, exc, context), found)
    except (Unsatisfiable, FailedHealthCheck) as exc:
        return _result(rule, "untestable", search.examples, start, untestable_report(rule, context, exc))
    except Flaky as exc:
        message = (f"{where} is not deterministic: a failing input passed when tried again "
                   f"({type(exc).__name__}). Make the pattern and replacement pure functions of their inputs.")
        return _result(rule, "error", search.examples, start, message)
    except RuleDefinitionError as exc:
        return _result(rule, "error", search.examples, start, f"{where} cannot be checked: {exc}")
    if search.examples == 0:
        return _result(rule, "untestable", 0, start, untestable_report(rule, context, None))
    message = f"rule '{rule.name}' is sound on {search.examples} examples ({where}; domain {plan.domain.describe()})"
    return _result(rule, "sound", search.examples, start, message)


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """Run torch on one thread: the inputs are tiny, and waking a thread pool for each of them
    costs milliseconds (exact GELU took 4 ms a call on two threads, 15 µs on one)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _result(rule: Rule, verdict: Verdict, examples: int, start: float, message: str,
            found: Counterexample | None = None) -> CheckResult:
    return CheckResult(
        rule=rule.name, origin=rule.origin, verdict=verdict, examples_run=examples,
        seconds=time.perf_counter() - start, message=message,
        counterexample=dict(found.inputs) if found is not None else None, details=found,
    )


def assert_rule_equivalent(rule: Rule, *, max_examples: int = DEFAULT_EXAMPLES, seed: int | None = None) -> CheckResult:
    """:func:`check_rule`, raising :class:`~fxrewrite.errors.NotEquivalent` with the report
    unless the rule is sound. Returns the result (for its example count and time)."""
    result = check_rule(rule, max_examples=max_examples, seed=seed)
    if not result.ok:
        raise NotEquivalent(result.message)
    return result


# -- reports ------------------------------------------------------------------------------------


@attrs.frozen(eq=False)
class _Context:
    plan: InputPlan
    tolerance: Tolerance
    max_examples: int
    seed: int | None

    def search_line(self, examples: int) -> str:
        seed = "derandomized" if self.seed is None else f"seed={self.seed}"
        return f"found after {examples} example(s), then shrunk (max_examples={self.max_examples}, {seed})"


def _output_dtype(value: Any) -> torch.dtype | None:
    if isinstance(value, torch.Tensor):
        return value.dtype
    if isinstance(value, (tuple, list)):
        for v in value:
            dtype = _output_dtype(v)
            if dtype is not None:
                return dtype
    return None


def _input_lines(inputs: Mapping[str, Any]) -> list[str]:
    lines = []
    for name, value in inputs.items():
        lines.append(f"    {name} = {format_value(value)}")
        if isinstance(value, torch.nn.Module):
            for attr, tensor in (*value.named_parameters(recurse=False), *value.named_buffers(recurse=False)):
                if tensor is not None and tensor.dim() > 0:
                    lines.append(f"    {name}.{attr} = {format_value(tensor.detach())}")
    return lines


def _rule_line(rule: Rule) -> str:
    doc = f"  -- {rule.doc}" if rule.doc else ""
    return f"  rule:        {rule.name} at {rule.origin}{doc}"


def unsound_report(rule: Rule, found: Counterexample, context: _Context, examples: int) -> str:
    """The report for a counterexample, as ``check_rule`` prints it."""
    replacement = (f"raised {type(found.replacement_error).__name__}: {_first_line(found.replacement_error)}"
                   if found.replacement_error is not None else format_value(found.replacement_output))
    lines = [
        f"rule '{rule.name}' is unsound: {found.headline}",
        _rule_line(rule),
        "  inputs:",
        *_input_lines(found.inputs),
        f"  pattern     -> {format_value(found.pattern_output)}",
        f"  replacement -> {replacement}",
        f"  difference:  {found.problem}",
        f"  tolerance:   {context.tolerance.describe(_output_dtype(found.pattern_output))}",
        f"  domain:      {context.plan.domain.describe()}",
        f"  search:      {context.search_line(examples)}",
        "  fix:         restrict the rule with a where= guard so it does not fire on such inputs, fix the "
        "replacement, or declare domain=/tolerance= if such inputs cannot occur.",
    ]
    return "\n".join(lines)


def guard_report(rule: Rule, exc: GuardRaised, context: _Context) -> str:
    lines = [
        f"rule '{rule.name}' has a guard that raises on inputs the pattern accepts (a rewrite would fail there)",
        _rule_line(rule),
        "  inputs:",
        *_input_lines(exc.inputs),
        f"  error:       {exc}",
        f"  domain:      {context.plan.domain.describe()}",
        "  fix:         make the guard return False for such inputs (e.g. check m['x'].dim() first).",
    ]
    return "\n".join(lines)


def untestable_report(rule: Rule, context: _Context, exc: BaseException | None) -> str:
    plan = context.plan
    why = plan.probe_failure or "the pattern or the guards rejected every drawn input"
    reason = f" ({type(exc).__name__})" if exc is not None else ""
    return "\n".join([
        f"rule '{rule.name}' could not be tested: no drawn input was accepted{reason}",
        _rule_line(rule),
        f"  pattern:     {why}",
        f"  domain:      {plan.domain.describe()}",
        "  fix:         declare a domain that produces inputs the pattern and guards accept, e.g. "
        "domain={'dtypes': (torch.float32,), 'ranks': (2, 4), 'sides': (2, 4)}, or values for literal "
        "captures: domain={'literals': {'n': [1, 2]}}.",
    ])
