"""Property-test a rule: does its replacement compute what its pattern computes?

:func:`check_rule` draws inputs with :func:`~fxrewrite.testing.strategies.inputs_for`, calls the
pattern and the replacement eagerly on each, and compares the results with
:func:`fxrewrite.verify.compare` under the rule's declared tolerance. A *counterexample* is an
input on which the pattern runs and the replacement raises, returns another shape, dtype or
values, or leaves its inputs modified differently. Hypothesis shrinks it to a small one, and the
report shows it in full (one counterexample per kind of difference):

>>> import torch
>>> from fxrewrite import Rule
>>> mul_zero = Rule.from_functions(lambda x: x * 0.0, lambda x: torch.zeros_like(x), name="mul_zero",
...                                domain={"dtypes": (torch.float32,)})
>>> result = check_rule(mul_zero, max_examples=50)
>>> result.ok, result.verdict, bool(result.counterexample["x"].isfinite())  # inf or nan: x * 0.0 is nan
(False, 'unsound', False)
>>> print(result.message.splitlines()[0])
rule 'mul_zero' is unsound: the replacement computes different values
>>> check_rule(Rule.from_functions(lambda x: torch.neg(torch.neg(x)), lambda x: x, name="double_neg")).ok
True

:func:`assert_rule_equivalent` raises :class:`~fxrewrite.errors.NotEquivalent` with the same
report, for use in tests.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

import attrs
import torch
from hypothesis import HealthCheck, Phase, Verbosity, given, reject, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.errors import FailedHealthCheck, Flaky, Unsatisfiable

from ..errors import NotEquivalent, RuleDefinitionError
from ..rule import Rule, describe_numerics
from ..verify import compare, default_tolerance, format_value
from ._numerics import values_problem
from ._plan import PatternErrors
from .repair import Repair, repair_rule
from .strategies import GuardRaised, InputPlan, call_rule_function, plan_inputs

if sys.version_info >= (3, 11):
    from builtins import BaseExceptionGroup
else:  # Python 3.10: Hypothesis depends on the backport
    from exceptiongroup import BaseExceptionGroup

__all__ = [
    "CheckResult",
    "Counterexample",
    "DEFAULT_EXAMPLES",
    "PatternRaised",
    "Tolerance",
    "Verdict",
    "assert_rule_equivalent",
    "check_rule",
    "evaluate",
]

Verdict = Literal["sound", "unsound", "untestable", "error"]
Kind = Literal["values", "shape", "dtype", "structure", "raises", "mutation"]

#: Examples drawn per rule unless told otherwise.
DEFAULT_EXAMPLES = 100

_TOLERANCE_KEYS = ("rtol", "atol")
_KIND_ORDER: tuple[Kind, ...] = ("values", "shape", "dtype", "structure", "raises", "mutation")
#: Kinds of difference as the search tells them apart: differing values where an output holds nan
#: or inf are one kind, differing finite values another, so that a nan cannot hide a second bug.
_KEY_ORDER: tuple[str, ...] = ("values", "values:finite", *_KIND_ORDER[1:])
_HEADLINES: Mapping[Kind, str] = {
    "values": "the replacement computes different values",
    "shape": "the replacement returns a different shape",
    "dtype": "the replacement returns a different dtype",
    "structure": "the replacement returns a different structure",
    "raises": "the replacement raises where the pattern does not",
    "mutation": "the two sides modify their inputs differently",
}


# -- tolerance ----------------------------------------------------------------------------------


@attrs.frozen
class Tolerance:
    """A rule's ``tolerance`` declaration: ``{"rtol": ..., "atol": ...}``; a missing key keeps
    ``torch.testing.assert_close``'s default for the output's dtype.

    >>> Tolerance.parse({"atol": 1e-3}, where="rule 'r'").describe(torch.float32)
    "declared {'atol': 0.001} (for torch.float32: rtol=1.3e-06, atol=0.001)"
    """

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
        """One line for reports, with the values in effect for ``dtype`` (default float32)."""
        dtype = torch.float32 if dtype is None else dtype
        default_rtol, default_atol = default_tolerance(dtype)
        rtol = default_rtol if self.rtol is None else self.rtol
        atol = default_atol if self.atol is None else self.atol
        exact = not (dtype.is_floating_point or dtype.is_complex)
        effective = "exact" if exact else f"rtol={rtol:g}, atol={atol:g}"
        if not self.declared:
            return f"default (as torch.testing.assert_close; for {dtype}: {effective})"
        declared = {k: v for k, v in (("rtol", self.rtol), ("atol", self.atol)) if v is not None}
        return f"declared {declared} (for {dtype}: {effective})"


# -- one evaluation -----------------------------------------------------------------------------


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


class PatternRaised(ValueError):
    """The pattern raised on an input: the input is outside the rule's domain."""


def evaluate(rule: Rule, inputs: Mapping[str, Any], tolerance: Tolerance = Tolerance(), *,
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
        return Counterexample(inputs, f"the replacement raised {type(exc).__name__}: {_first_line(exc)}",
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


# -- the search ---------------------------------------------------------------------------------


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


class _Unsound(Exception):
    """Raised by the search body on a counterexample; one subclass per kind, so that Hypothesis
    shrinks and reports each kind of difference separately."""

    def __init__(self, counterexample: Counterexample) -> None:
        super().__init__(counterexample.problem)
        self.counterexample = counterexample


_UNSOUND_BY_KIND: Mapping[str, type[_Unsound]] = {
    key: type(f"_Unsound_{key.replace(':', '_')}", (_Unsound,), {}) for key in _KEY_ORDER
}


@attrs.define
class _Search:
    """One Hypothesis run over a rule's inputs, counting examples until the first failure."""

    rule: Rule
    tolerance: Tolerance
    #: Kinds of difference already reported: inputs showing only them count as passing.
    known: frozenset[str] = frozenset()
    examples: int = 0
    failed: bool = False
    #: How many examples had a tensor of each dtype.
    dtypes: Counter[torch.dtype] = attrs.Factory(Counter)
    #: What is worth reporting but no counterexample (see :func:`evaluate`), shared by the searches.
    notes: dict[str, str] = attrs.Factory(dict)

    def body(self, inputs: dict[str, Any]) -> None:
        try:
            counterexample = evaluate(self.rule, inputs, self.tolerance, notes=self.notes)
        except PatternRaised:
            reject()
        if not self.failed:
            self.examples += 1
            self.dtypes.update({v.dtype for v in inputs.values() if isinstance(v, torch.Tensor)})
        if counterexample is not None and counterexample.key not in self.known:
            self.failed = True
            raise _UNSOUND_BY_KIND[counterexample.key](counterexample)

    def run(self, plan: InputPlan, max_examples: int, seed: int | None, *, give_up_when_filtered: bool = False) -> None:
        """Search; ``give_up_when_filtered`` ends it (``FailedHealthCheck``) when the first 50
        draws hold fewer than 10 accepted inputs, instead of drawing until Hypothesis' own limit
        (up to ~1000 draws for a focus the guards mostly reject)."""
        test = given(plan.strategy())(self.body)
        checks = [c for c in HealthCheck if not (give_up_when_filtered and c == HealthCheck.filter_too_much)]
        test = settings(
            max_examples=max_examples, deadline=None, database=None, derandomize=seed is None,
            suppress_health_check=checks, verbosity=Verbosity.quiet, report_multiple_bugs=True,
            print_blob=False, phases=(Phase.explicit, Phase.generate, Phase.shrink),
        )(test)
        if seed is not None:
            test = hypothesis_seed(seed)(test)
        with _one_thread():
            test()


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


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup) and not isinstance(exc, Flaky):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def check_rule(rule: Rule, *, max_examples: int = DEFAULT_EXAMPLES, seed: int | None = None,
               repair: bool = True) -> CheckResult:
    """Property-test ``rule`` on up to ``max_examples`` drawn inputs.

    Without ``seed`` the search is derandomized (the same examples every run); a ``seed`` draws
    other, equally reproducible, examples. Short focused searches (each tensor argument made to
    broadcast; each dtype the main search hardly drew) add a few examples to ``examples_run``.
    The result's ``message`` is the report to show.

    When a counterexample is found, a search with half the examples runs again ignoring that
    kind of difference (values, shape, dtype, ...), so that the report shows one counterexample
    per kind: fixing the first one does not hide the next. Then, unless ``repair=False``, the
    weakest restriction that makes the rule pass is searched for (``result.repair``).
    """
    _check_arguments("check_rule", rule, max_examples, seed)
    start = time.perf_counter()
    where = f"rule '{rule.name}' ({rule.origin})"
    try:
        plan = attrs.evolve(plan_inputs(rule), pattern_errors=PatternErrors())
        tolerance = Tolerance.parse(rule.tolerance, where=where)
    except RuleDefinitionError as exc:
        return _result(rule, "error", 0, start, f"{where} cannot be checked: {exc}")
    context = _Context(rule, plan, tolerance, max_examples, seed)
    searches: list[_Search] = []
    try:
        _search(context, searches)
    except (Unsatisfiable, FailedHealthCheck) as exc:
        return _result(rule, "untestable", _examples(searches), start, untestable_report(context, exc))
    except Flaky as exc:
        message = (f"{where} cannot be checked: it is not deterministic, a failing input passed when tried "
                   f"again ({type(exc).__name__}). Make the pattern and replacement pure functions of their inputs.")
        return _result(rule, "error", _examples(searches), start, message)
    except Exception as exc:
        errors, examples = _leaves(exc), _examples(searches)
        found = _counterexamples(errors)
        if not found:
            return _error(context, errors, examples, start)
        found = _more_counterexamples(context, found)
        fixed = repair_rule(rule, [c.inputs for c in found], seed=seed) if repair else None
        message = unsound_report(context, found, examples, repair_report(fixed) if repair else "")
        return _result(rule, "unsound", examples, start, message, found, fixed)
    examples = _examples(searches)
    if examples == 0:
        return _result(rule, "untestable", 0, start, untestable_report(context, None))
    if examples < enough_examples(max_examples):
        return _result(rule, "untestable", examples, start, untested_report(context, examples))
    message = "\n".join([
        f"rule '{rule.name}' is sound on {examples} examples ({where}; domain {plan.domain.describe()})",
        *([f"  numerics:    {describe_numerics(rule)}"] if rule.numerics else []), *note_lines(context)])
    return _result(rule, "sound", examples, start, message)


def enough_examples(max_examples: int) -> int:
    """Accepted examples below which a rule is reported untestable, never sound: a tenth of the
    budget (10 of the default 100)."""
    return max(1, max_examples // 10)


#: Examples of each focused search after the main one (see :func:`_search`).
SWEEP_EXAMPLES = 10
#: Examples of the focused search per tensor argument drawn 0-dim with a dtype that wins the promotion.
ZERO_DIM_EXAMPLES = 5
#: Examples of the focused search of a rule with dtype captures: pairs of dtypes, separating values.
DTYPE_PAIR_EXAMPLES = 20


def _search(context: _Context, searches: list[_Search]) -> None:
    """Short focused searches around the main one (Hypothesis' draws are correlated, so a shape
    relation or a dtype can go untried for many examples): first one per tensor argument made
    to broadcast against the others, then the main search, then one per dtype the main search
    hardly drew. Raises on a counterexample; ``searches`` keeps every search started, for their
    example counts."""
    plan, budget = context.plan, min(SWEEP_EXAMPLES, context.max_examples)
    for name in plan.broadcastable:
        _focused_search(context, plan.with_smaller(name), budget, searches)
    for name in plan.promotable:
        _focused_search(context, plan.with_zero_dim(name), min(ZERO_DIM_EXAMPLES, budget), searches)
    for name in plan.deviants:
        _focused_search(context, plan.with_own_dtype(name), budget, searches)
    if plan.separates_dtypes:
        _focused_search(context, plan.with_separation(), min(DTYPE_PAIR_EXAMPLES, context.max_examples), searches)
    main = _Search(context.rule, context.tolerance, notes=context.notes)
    searches.append(main)
    main.run(plan, context.max_examples, context.seed)
    for dtype in plan.dtypes:
        if main.dtypes[dtype] < budget:
            _focused_search(context, plan.only(dtype), budget, searches)


def _focused_search(context: _Context, plan: InputPlan, examples: int, searches: list[_Search]) -> None:
    search = _Search(context.rule, context.tolerance, notes=context.notes)
    searches.append(search)
    try:
        search.run(plan, examples, context.seed, give_up_when_filtered=True)
    except (Unsatisfiable, FailedHealthCheck):
        pass  # the focus admits (almost) no input: little to learn here, and drawing is the cost


def _examples(searches: Sequence[_Search]) -> int:
    return sum(s.examples for s in searches)


def _counterexamples(errors: Sequence[BaseException]) -> tuple[Counterexample, ...]:
    found = (e.counterexample for e in errors if isinstance(e, _Unsound))
    return tuple(sorted(found, key=lambda c: _KEY_ORDER.index(c.key)))


def _more_counterexamples(context: _Context, found: tuple[Counterexample, ...]) -> tuple[Counterexample, ...]:
    """Search again, ignoring the kinds of difference already found, until no new kind turns up."""
    while len(found) < len(_KEY_ORDER):
        search = _Search(context.rule, context.tolerance, known=frozenset(c.key for c in found))
        try:
            search.run(context.plan, max(10, context.max_examples // 2), context.seed)
        except Exception as exc:  # any other failure ends the hunt; the first search already reported
            new = [c for c in _counterexamples(_leaves(exc)) if c.key not in search.known]
            if new:
                found = tuple(sorted((*found, *new), key=lambda c: _KEY_ORDER.index(c.key)))
                continue
        break
    return found


def _error(context: _Context, errors: Sequence[BaseException], examples: int, start: float) -> CheckResult:
    rule = context.rule
    guard = next((e for e in errors if isinstance(e, GuardRaised)), None)
    if guard is not None:
        found = Counterexample(guard.inputs, str(guard))
        return _result(rule, "error", examples, start, guard_report(context, guard), (found,))
    error = errors[0]
    if isinstance(error, RuleDefinitionError):
        return _result(rule, "error", examples, start, f"rule '{rule.name}' ({rule.origin}) cannot be checked: {error}")
    raise error


def _result(rule: Rule, verdict: Verdict, examples: int, start: float, message: str,
            found: tuple[Counterexample, ...] = (), fixed: Repair | None = None) -> CheckResult:
    return CheckResult(rule=rule.name, origin=rule.origin, verdict=verdict, examples_run=examples,
                       seconds=time.perf_counter() - start, message=message, counterexamples=found,
                       repair=fixed.rule if fixed else None, repair_code=fixed.code() if fixed else None)


def _check_arguments(function: str, rule: Any, max_examples: Any, seed: Any) -> None:
    """The arguments of :func:`check_rule` and :func:`assert_rule_equivalent`, checked before any
    search: an :class:`~fxrewrite.errors.ArgumentError` names the one that is wrong."""
    from ..errors import ArgumentError

    if not isinstance(rule, Rule):
        raise ArgumentError(f"{function}(): rule takes a fxrewrite.Rule (e.g. from fxrewrite.Rule.from_functions or "
                            f"load_rules(...)['name']), got {rule!r} ({type(rule).__name__}).")
    if not isinstance(max_examples, int) or isinstance(max_examples, bool) or max_examples < 1:
        raise ArgumentError(f"{function}(): max_examples= takes a number of examples >= 1, got {max_examples!r}.")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise ArgumentError(f"{function}(): seed= takes an int or None (derandomized), got {seed!r}.")


def assert_rule_equivalent(rule: Rule, *, max_examples: int = DEFAULT_EXAMPLES, seed: int | None = None) -> CheckResult:
    """:func:`check_rule`, raising :class:`~fxrewrite.errors.NotEquivalent` with the report
    unless the rule is sound. Returns the result (for its example count and time).

    >>> import torch
    >>> from fxrewrite import Rule
    >>> assert_rule_equivalent(Rule.from_functions(lambda x: x - x, lambda x: torch.zeros_like(x), name="sub_self"))
    Traceback (most recent call last):
    ...
    fxrewrite.errors.NotEquivalent: rule 'sub_self' is unsound: the replacement computes different values...
    """
    _check_arguments("assert_rule_equivalent", rule, max_examples, seed)
    result = check_rule(rule, max_examples=max_examples, seed=seed)
    if not result.ok:
        raise NotEquivalent(result.message)
    return result


# -- reports ------------------------------------------------------------------------------------


@attrs.frozen(eq=False)
class _Context:
    rule: Rule
    plan: InputPlan
    tolerance: Tolerance
    max_examples: int
    seed: int | None
    #: What the searches noted that is no counterexample (aliasing outputs, see :func:`evaluate`).
    notes: dict[str, str] = attrs.Factory(dict)

    def search_line(self, examples: int) -> str:
        seed = "derandomized" if self.seed is None else f"seed={self.seed}"
        budget = f"max_examples={self.max_examples}, {seed}"
        return f"first counterexample after {examples} example(s), then shrunk ({budget})"

    def rule_line(self) -> str:
        doc = f"  -- {self.rule.doc}" if self.rule.doc else ""
        return f"  rule:        {self.rule.name} at {self.rule.origin}{doc}"


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
    replacement = (f"raised {type(found.replacement_error).__name__}: {_first_line(found.replacement_error)}"
                   if found.replacement_error is not None else format_value(found.replacement_output))
    return [
        f"{indent}inputs:",
        *_input_lines(found.inputs, indent + "  "),
        f"{indent}pattern     -> {format_value(found.pattern_output)}",
        f"{indent}replacement -> {replacement}",
        f"{indent}difference:  {found.problem}",
    ]


def unsound_report(context: _Context, found: Sequence[Counterexample], examples: int, repair: str = "") -> str:
    """The report for an unsound rule: its first counterexample in full, then one for each other
    kind of difference, then the declarations, how the search went, the ``repair`` lines (see
    :func:`repair_report`) and what to do."""
    first, others = found[0], found[1:]
    more = f" (and {len(others)} more kind{'s' if len(others) > 1 else ''} of difference below)" if others else ""
    lines = [f"rule '{context.rule.name}' is unsound: {first.headline}{more}", context.rule_line(),
             *_counterexample_lines(first, "  ")]
    for other in others:
        lines += [f"  another counterexample: {other.headline}", *_counterexample_lines(other, "    ")]
    lines += [
        f"  tolerance:   {context.tolerance.describe(_output_dtype(first.pattern_output))}",
        *([f"  numerics:    {describe_numerics(context.rule)}"] if context.rule.numerics else []),
        f"  domain:      {context.plan.domain.describe()}",
        f"  search:      {context.search_line(examples)}",
        *note_lines(context),
        *repair.splitlines(),
        "  fix:         fix the replacement, or restrict the rule with a where= guard so it does not fire on "
        "such inputs, or declare domain=/tolerance= if such inputs cannot occur.",
    ]
    return "\n".join(lines)


def repair_report(fixed: Repair | None) -> str:
    """The report's ``repair:`` lines: the restricted rule as code to paste (and as a ``.fxr``
    ``where`` line when guards alone restrict it), or that none was found."""
    if fixed is None:
        return ("  repair:      none found: no restriction of dtypes, shapes, rank, layout or values tried makes "
                "the rule sound; fix the replacement.")
    if fixed.enforced:
        how = "enforced at rewrite time by a guard on the graph's metadata"
    elif any(r.guard is not None for r in fixed.restrictions):
        how = ("the guard is enforced at rewrite time, the domain only the checker sees: make sure other "
               "inputs cannot occur")
    else:
        how = "declared as a domain, which only the checker sees: make sure other inputs cannot occur"
    lines = [f"  repair:      restricted to {fixed.label}, the checker finds no counterexample in "
             f"{fixed.examples} examples ({how}):",
             *(f"                 {line}" for line in fixed.code().splitlines())]
    first, *more = fixed.dsl().splitlines()
    lines.append(f"               or, in a .fxr file:  {first}")
    lines += [f"                                    {line}" for line in more]
    return "\n".join(lines)


def guard_report(context: _Context, exc: GuardRaised) -> str:
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


def note_lines(context: _Context) -> list[str]:
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


def untested_report(context: _Context, examples: int) -> str:
    needed = enough_examples(context.max_examples)
    return "\n".join([
        f"rule '{context.rule.name}' could not be tested enough: only {examples} drawn input(s) were accepted by "
        f"the pattern and its guards, fewer than the {needed} needed to call it sound",
        context.rule_line(),
        f"  domain:      {context.plan.domain.describe()}",
        "  fix:         declare a domain whose inputs the pattern and its guards accept (dtypes, ranks, sides, "
        "'inputs' for one argument, 'literals' for literal captures), so that the search can try the rule.",
    ])


def untestable_report(context: _Context, exc: BaseException | None) -> str:
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
