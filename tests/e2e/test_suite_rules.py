"""The test suite's own rules hold: the one-second rule of ``tests/conftest.py`` fails an unmarked
slow test, and the one equivalence check of ``tests/_helpers.py`` compares every output."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _helpers import assert_same_outputs

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).resolve().parent.parent / "conftest.py"

BURNING = """
import time

import pytest


def burn(seconds):
    start = time.process_time()
    while time.process_time() - start < seconds:
        pass


def test_quick():
    pass


def test_unmarked_and_slow():
    burn(0.15)


@pytest.mark.slow
def test_marked_and_slow():
    burn(0.15)


def test_failing_and_slow():
    burn(0.15)
    assert 1 == 2, "its own failure"


def test_first_use_of_a_module():
    import first_used_here  # noqa: F401  (a one-time import cost, which any test may be first to pay)

    burn(0.15)
"""

FIRST_USED = """
import time

start = time.process_time()
while time.process_time() - start < 0.15:
    pass
"""


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    """A copy of the project's conftest with a 0.1 s limit (so the test stays quick), and BURNING."""
    text = CONFTEST.read_text()
    assert "SLOW_SECONDS = 1.0\n" in text
    pytester.makeconftest(text.replace("SLOW_SECONDS = 1.0\n", "SLOW_SECONDS = 0.1\n"))
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n")
    pytester.makepyfile(test_burning=BURNING, first_used_here=FIRST_USED)
    pytester.syspathinsert()
    return pytester


def test_an_unmarked_test_over_the_cpu_limit_fails_and_says_what_to_do(suite):
    result = suite.runpytest("-p", "no:fxrewrite", "-p", "no:cacheprovider", "-rf")
    result.assert_outcomes(passed=3, failed=2)
    result.stdout.fnmatch_lines([
        "*test_burning.py::test_unmarked_and_slow took 0.* s of CPU time (the limit for an unmarked test is 0.1 s): "
        "mark it @pytest.mark.slow or make it faster",
    ])
    result.stdout.fnmatch_lines(["*its own failure*"])  # a test that failed keeps its own failure
    assert "test_marked_and_slow took" not in result.stdout.str()
    assert "test_first_use_of_a_module took" not in result.stdout.str()


HEAPED = """
import gc

HEAP = [[i] for i in range(600_000)]  # what a full run keeps alive: each full collection walks it


def test_full_collections_over_a_large_heap():
    for _ in range(8):
        gc.collect()
"""

#: The line of tests/conftest.py that leaves full collections out of a test's CPU time.
_UNCHARGED = "spent = cpu_seconds() - start - (_FULL_COLLECTIONS.seconds - collecting)\n"


@pytest.mark.parametrize("charged", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["as-shipped", "collections-charged"])
def test_full_garbage_collections_are_not_charged_to_the_test_that_triggers_them(pytester, charged):
    """A full collection walks every object the process keeps alive and falls on whichever test
    allocates past the threshold: the one-second rule leaves it out (with the conftest charging
    it, the same test fails, which shows the case is one the rule must handle)."""
    text = CONFTEST.read_text()
    assert "SLOW_SECONDS = 1.0\n" in text and _UNCHARGED in text
    text = text.replace("SLOW_SECONDS = 1.0\n", "SLOW_SECONDS = 0.1\n")
    if charged:
        text = text.replace(_UNCHARGED, "spent = cpu_seconds() - start\n")
    pytester.makeconftest(text)
    pytester.makepyfile(test_heaped=HEAPED)
    result = pytester.runpytest("-p", "no:fxrewrite", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=0 if charged else 1, failed=1 if charged else 0)


# ---- assert_same_outputs, the comparison behind assert_rewrite_sound -------------------------------------


def test_every_output_of_a_tuple_is_compared():
    assert_same_outputs((torch.ones(2), torch.ones(3)), (torch.ones(2), torch.ones(3)))
    with pytest.raises(AssertionError, match=r"output \[1\]"):
        assert_same_outputs((torch.ones(2), torch.zeros(3)), (torch.ones(2), torch.ones(3)))


@pytest.mark.parametrize(("actual", "expected"), [
    (torch.ones(2), (torch.ones(2),)),  # a tensor is not a one-tuple
    ((torch.ones(2),), [torch.ones(2)]),  # a tuple is not a list
    ((torch.ones(2),), (torch.ones(2), torch.ones(2))),  # an output missing
    ({"a": torch.ones(2)}, {"b": torch.ones(2)}),  # other keys
    ([[torch.ones(1)], torch.ones(1)], [[torch.ones(1), torch.ones(1)]]),  # nested otherwise
])
def test_outputs_structured_otherwise_differ(actual, expected):
    with pytest.raises(AssertionError, match="differ in structure"):
        assert_same_outputs(actual, expected)


@pytest.mark.parametrize("actual", [
    torch.ones(2, dtype=torch.float64),  # dtype
    torch.ones(1, 2),  # shape
    torch.ones(2) + 1e-3,  # values
])
def test_a_tensor_differs_in_dtype_shape_or_values(actual):
    with pytest.raises(AssertionError, match="the output"):
        assert_same_outputs(actual, torch.ones(2))


def test_nested_outputs_are_compared_leaf_by_leaf():
    expected = {"logits": torch.ones(2), "past": [(torch.ones(1), torch.zeros(1))]}
    assert_same_outputs({"logits": torch.ones(2), "past": [(torch.ones(1), torch.zeros(1))]}, expected)
    with pytest.raises(AssertionError, match=r"output \['past'\]\[0\]\[1\]"):
        assert_same_outputs({"logits": torch.ones(2), "past": [(torch.ones(1), torch.ones(1))]}, expected)


# ---- the parse cache of a test run ----------------------------------------------------------------------


def test_a_test_run_caches_parsed_rule_files_in_a_temporary_directory_not_the_users(tmp_path):
    import os
    import tempfile

    import fxrewrite

    home = Path(os.environ["XDG_CACHE_HOME"])
    assert home.name.startswith("fxrewrite-test-cache-") and Path(tempfile.gettempdir()) in home.parents
    rules = tmp_path / "cached.fxr"
    rules.write_text('rule neg_neg_cached "Replaces -(-x) by x.":\n    torch.neg(torch.neg(x)) => x\n')
    before = set((home / "fxrewrite").glob("*")) if (home / "fxrewrite").exists() else set()
    assert [r.name for r in fxrewrite.load_rules(rules)] == ["neg_neg_cached"]
    assert set((home / "fxrewrite").glob("*.ast")) - before, "loading a .fxr file wrote no cache entry there"
