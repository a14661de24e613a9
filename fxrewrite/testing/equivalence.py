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

This module is the orchestration: which searches run with which budget, what their outcome
means (the verdict), and the repair of an unsound rule. The pieces live beside it, one job each,
each importing only those before it:

* ``_report``: the verdict and counterexample values and the words of every report
  (:class:`CheckResult`, :class:`Counterexample`);
* ``_evaluation``: one input, both sides (:func:`evaluate`, :class:`PatternRaised`);
* ``_search``: the Hypothesis search for counterexamples;
* ``_restrictions``: a restriction of a rule's inputs as a value, evaluated directly and
  rendered as the text a report shows;
* :mod:`~fxrewrite.testing.repair`: the weakest restriction that makes an unsound rule pass,
  each candidate checked by the :func:`check_rule` it is handed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import attrs
from hypothesis.errors import FailedHealthCheck, Flaky, Unsatisfiable

from ..domain import Tolerance
from ..errors import ArgumentError, NotEquivalent, RuleDefinitionError
from ..rule import Rule
from ._evaluation import PatternRaised, evaluate
from ._plan import PatternErrors
from ._report import (
    CheckContext,
    CheckResult,
    Counterexample,
    Verdict,
    cannot_check_report,
    flaky_report,
    guard_report,
    sound_report,
    unsound_report,
    untestable_report,
    untested_report,
)
from ._search import (
    Search,
    counterexamples_in,
    examples_in,
    leaves,
    more_counterexamples,
    one_thread,
    run_searches,
)
from .repair import Repair, repair_report, repair_rule
from .strategies import GuardRaised, plan_inputs

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

#: Examples drawn per rule unless told otherwise.
DEFAULT_EXAMPLES = 100


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
    with one_thread():  # probing and plan making call the pattern too: as in the searches, one thread
        return _check(rule, max_examples, seed, repair)


def _check(rule: Rule, max_examples: int, seed: int | None, repair: bool) -> CheckResult:
    start = time.perf_counter()
    try:
        plan = attrs.evolve(plan_inputs(rule), pattern_errors=PatternErrors())
        tolerance = Tolerance.parse(rule.tolerance, where=f"rule '{rule.name}' ({rule.origin})")
    except RuleDefinitionError as exc:
        return _result(rule, "error", 0, start, cannot_check_report(rule, exc))
    context = CheckContext(rule, plan, tolerance, max_examples, seed)
    searches: list[Search] = []
    try:
        run_searches(context, searches)
    except (Unsatisfiable, FailedHealthCheck) as exc:
        return _result(rule, "untestable", examples_in(searches), start, untestable_report(context, exc))
    except Flaky as exc:
        return _result(rule, "error", examples_in(searches), start, flaky_report(rule, exc))
    except Exception as exc:
        return _failed(context, leaves(exc), examples_in(searches), start, repair)
    return _passed(context, examples_in(searches), start)


def enough_examples(max_examples: int) -> int:
    """Accepted examples below which a rule is reported untestable, never sound: a tenth of the
    budget (10 of the default 100)."""
    return max(1, max_examples // 10)


def _passed(context: CheckContext, examples: int, start: float) -> CheckResult:
    """The verdict when no search failed: sound, unless too few inputs were accepted."""
    rule = context.rule
    if examples == 0:
        return _result(rule, "untestable", 0, start, untestable_report(context, None))
    needed = enough_examples(context.max_examples)
    if examples < needed:
        return _result(rule, "untestable", examples, start, untested_report(context, examples, needed))
    return _result(rule, "sound", examples, start, sound_report(context, examples))


def _failed(context: CheckContext, errors: Sequence[BaseException], examples: int, start: float,
            repair: bool) -> CheckResult:
    """The verdict when a search failed: unsound (with every kind of difference and, when asked,
    the repair), or an error."""
    found = counterexamples_in(errors)
    if not found:
        return _error(context, errors, examples, start)
    rule = context.rule
    found = more_counterexamples(context, found)
    fixed = repair_rule(rule, [c.inputs for c in found], seed=context.seed, check=check_rule) if repair else None
    message = unsound_report(context, found, examples, repair_report(fixed) if repair else "")
    return _result(rule, "unsound", examples, start, message, found, fixed)


def _error(context: CheckContext, errors: Sequence[BaseException], examples: int, start: float) -> CheckResult:
    rule = context.rule
    guard = next((e for e in errors if isinstance(e, GuardRaised)), None)
    if guard is not None:
        found = Counterexample(guard.inputs, str(guard))
        return _result(rule, "error", examples, start, guard_report(context, guard), (found,))
    error = errors[0]
    if isinstance(error, RuleDefinitionError):
        return _result(rule, "error", examples, start, cannot_check_report(rule, error))
    raise error


def _result(rule: Rule, verdict: Verdict, examples: int, start: float, message: str,
            found: tuple[Counterexample, ...] = (), fixed: Repair | None = None) -> CheckResult:
    return CheckResult(rule=rule.name, origin=rule.origin, verdict=verdict, examples_run=examples,
                       seconds=time.perf_counter() - start, message=message, counterexamples=found,
                       repair=fixed.rule if fixed else None, repair_code=fixed.code() if fixed else None)


def _check_arguments(function: str, rule: Any, max_examples: Any, seed: Any) -> None:
    """The arguments of :func:`check_rule` and :func:`assert_rule_equivalent`, checked before any
    search: an :class:`~fxrewrite.errors.ArgumentError` names the one that is wrong."""
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
