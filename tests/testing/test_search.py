"""fxrewrite.testing._search: the Hypothesis search, its focused searches and the hunt for every kind
of difference."""

from __future__ import annotations

import sys

import pytest
import torch
from hypothesis.errors import Flaky

from fxrewrite import Rule
from fxrewrite.testing import Counterexample, check_rule
from fxrewrite.testing._search import Unsound, counterexamples_in, leaves

if sys.version_info >= (3, 11):
    from builtins import BaseExceptionGroup, ExceptionGroup
else:
    from exceptiongroup import BaseExceptionGroup, ExceptionGroup

EXAMPLES = 60
FLOATS = {"dtypes": (torch.float32, torch.float64)}


def rule(pattern, replacement, name="r", **kw):
    return Rule.from_functions(pattern, replacement, name=name, **kw)


DOUBLE_NEG = rule(lambda x: torch.neg(torch.neg(x)), lambda x: x, name="double_neg")


def test_leaves_open_exception_groups_but_not_a_flaky_one():
    a, b, c = ValueError("a"), KeyError("b"), TypeError("c")
    assert leaves(ExceptionGroup("g", [a, ExceptionGroup("h", [b, c])])) == [a, b, c]
    flaky = Flaky("f", [a]) if issubclass(Flaky, BaseExceptionGroup) else Flaky("f")
    assert leaves(flaky) == [flaky] and leaves(a) == [a]


def test_counterexamples_are_taken_from_the_errors_in_kind_order():
    shape = Counterexample({}, "shapes differ: pattern (1,), replacement (2,)")
    finite = Counterexample({}, "values differ", torch.tensor(1.0), torch.tensor(2.0))
    errors = [Unsound(shape), RuntimeError("not a counterexample"), Unsound(finite)]
    assert counterexamples_in(errors) == (finite, shape)


@pytest.mark.slow
def test_the_search_is_deterministic_and_a_seed_changes_it():
    wrong = rule(lambda x: torch.exp(torch.log(x)), lambda x: x, name="exp_log", domain=FLOATS)
    first, second = check_rule(wrong, max_examples=EXAMPLES), check_rule(wrong, max_examples=EXAMPLES)
    assert first.message.splitlines()[:8] == second.message.splitlines()[:8]
    seeded = [check_rule(wrong, max_examples=EXAMPLES, seed=s) for s in (1, 1, 2)]
    assert seeded[0].message.splitlines()[:8] == seeded[1].message.splitlines()[:8]
    assert all(not r.ok for r in seeded)
    assert "seed=1" in seeded[0].message and "derandomized" in first.message


def test_dtypes_the_main_search_hardly_drew_get_examples_of_their_own():
    seen = set()

    def pattern(x):
        seen.add(x.dtype)
        return torch.neg(x)

    result = check_rule(rule(pattern, lambda x: torch.neg(x), name="neg"), max_examples=5)
    assert result.ok and result.examples_run > 5
    assert {torch.float32, torch.float64, torch.int64, torch.int32, torch.uint8} <= seen


def test_torch_thread_count_is_restored():
    threads = torch.get_num_threads()
    check_rule(DOUBLE_NEG, max_examples=5)
    assert torch.get_num_threads() == threads
