"""The Hypothesis search for a counterexample to a rule: :class:`Search` is one Hypothesis run
over the rule's drawn inputs, evaluating both sides on each (:func:`~fxrewrite.testing._evaluation.evaluate`)
and failing on the first counterexample, which Hypothesis then shrinks; :func:`run_searches`
runs the main search with short focused ones around it; :func:`more_counterexamples` searches
again for the kinds of difference not found yet. What the searches find is raised (an
exception group of :class:`Unsound` errors, or Hypothesis' own); deciding the verdict is the
orchestration's job (:mod:`fxrewrite.testing.equivalence`).

>>> import torch
>>> from fxrewrite import Rule
>>> from fxrewrite.testing.strategies import plan_inputs
>>> from fxrewrite.testing._report import CheckContext
>>> from fxrewrite.domain import Tolerance
>>> rule = Rule.from_functions(lambda x: torch.neg(torch.neg(x)), lambda x: x, name="double_neg")
>>> searches = []
>>> run_searches(CheckContext(rule, plan_inputs(rule), Tolerance(), max_examples=20, seed=None), searches)
>>> examples_in(searches) >= 20
True
"""

from __future__ import annotations

import contextlib
import sys
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import attrs
import torch
from hypothesis import HealthCheck, Phase, Verbosity, given, reject, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.errors import FailedHealthCheck, Flaky, Unsatisfiable

from ..domain import Tolerance
from ..rule import Rule
from ._evaluation import PatternRaised, evaluate
from ._plan import InputPlan, admits_inputs
from ._report import KEY_ORDER, CheckContext, Counterexample
from ._reproducible import own_constants_only

if sys.version_info >= (3, 11):
    from builtins import BaseExceptionGroup
else:  # Python 3.10: Hypothesis depends on the backport
    from exceptiongroup import BaseExceptionGroup

__all__ = [
    "DTYPE_PAIR_EXAMPLES",
    "SWEEP_EXAMPLES",
    "ZERO_DIM_EXAMPLES",
    "Search",
    "Unsound",
    "counterexamples_in",
    "examples_in",
    "leaves",
    "more_counterexamples",
    "one_thread",
    "run_searches",
]

#: Examples of each focused search after the main one (see :func:`run_searches`).
SWEEP_EXAMPLES = 10
#: Examples of the focused search per tensor argument drawn 0-dim with a dtype that wins the promotion.
ZERO_DIM_EXAMPLES = 5
#: Examples of the focused search of a rule with dtype captures: pairs of dtypes, separating values.
DTYPE_PAIR_EXAMPLES = 20


class Unsound(Exception):
    """Raised by the search body on a counterexample; one subclass per kind, so that Hypothesis
    shrinks and reports each kind of difference separately."""

    def __init__(self, counterexample: Counterexample) -> None:
        super().__init__(counterexample.problem)
        self.counterexample = counterexample


_UNSOUND_BY_KIND: Mapping[str, type[Unsound]] = {
    key: type(f"_Unsound_{key.replace(':', '_')}", (Unsound,), {}) for key in KEY_ORDER
}


@attrs.define
class Search:
    """One Hypothesis run over a rule's inputs, counting examples until the first failure."""

    rule: Rule
    tolerance: Tolerance
    #: Kinds of difference already reported: inputs showing only them count as passing.
    known: frozenset[str] = frozenset()
    examples: int = 0
    failed: bool = False
    #: How many examples had a tensor of each dtype.
    dtypes: Counter[torch.dtype] = attrs.Factory(Counter)
    #: What is worth reporting but no counterexample (see ``evaluate``), shared by the searches.
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
        with one_thread(), own_constants_only():
            test()


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run torch on one thread: the inputs are tiny, and waking a thread pool for each of them
    costs milliseconds (exact GELU took 4 ms a call on two threads, 15 µs on one)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def leaves(exc: BaseException) -> list[BaseException]:
    """The errors a search raised, out of Hypothesis' exception groups (a ``Flaky`` stays whole)."""
    if isinstance(exc, BaseExceptionGroup) and not isinstance(exc, Flaky):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


def run_searches(context: CheckContext, searches: list[Search]) -> None:
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
    main = Search(context.rule, context.tolerance, notes=context.notes)
    searches.append(main)
    main.run(plan, context.max_examples, context.seed)
    for dtype in plan.dtypes:
        if main.dtypes[dtype] < budget:
            _focused_search(context, plan.only(dtype), budget, searches)


def _focused_search(context: CheckContext, plan: InputPlan, examples: int, searches: list[Search]) -> None:
    if not admits_inputs(plan):
        return  # no layout of this focus is accepted: Hypothesis would give it up after 50 refusals
    search = Search(context.rule, context.tolerance, notes=context.notes)
    searches.append(search)
    try:
        search.run(plan, examples, context.seed, give_up_when_filtered=True)
    except (Unsatisfiable, FailedHealthCheck):
        pass  # the focus admits (almost) no input: little to learn here, and drawing is the cost


def examples_in(searches: Sequence[Search]) -> int:
    """The examples the searches ran, together."""
    return sum(s.examples for s in searches)


def counterexamples_in(errors: Sequence[BaseException]) -> tuple[Counterexample, ...]:
    """The counterexamples among a search's errors, in the order of :data:`KEY_ORDER`."""
    found = (e.counterexample for e in errors if isinstance(e, Unsound))
    return tuple(sorted(found, key=lambda c: KEY_ORDER.index(c.key)))


def more_counterexamples(context: CheckContext, found: tuple[Counterexample, ...]) -> tuple[Counterexample, ...]:
    """Search again, ignoring the kinds of difference already found, until no new kind turns up."""
    while len(found) < len(KEY_ORDER):
        search = Search(context.rule, context.tolerance, known=frozenset(c.key for c in found))
        try:
            search.run(context.plan, max(10, context.max_examples // 2), context.seed)
        except Exception as exc:  # any other failure ends the hunt; the first search already reported
            new = [c for c in counterexamples_in(leaves(exc)) if c.key not in search.known]
            if new:
                found = tuple(sorted((*found, *new), key=lambda c: KEY_ORDER.index(c.key)))
                continue
        break
    return found
