"""fxrewrite.testing._reproducible: a derandomized check draws the same inputs whatever else the
process imported (Hypothesis mixes in the literals of imported local modules otherwise)."""

from __future__ import annotations

import hashlib
import threading

import pytest
import torch
import torch.fx

from fxrewrite import Rule
from fxrewrite.testing import _reproducible, check_rule

providers = pytest.importorskip("hypothesis.internal.conjecture.providers")
constants_ast = pytest.importorskip("hypothesis.internal.constants_ast")

DRAWN: list[torch.Tensor] = []


@torch.fx.wrap
def recorded(x):
    DRAWN.append(x.detach().clone())
    return x


def shifted(x):
    return recorded(x) + 1.0


def drawn_by_a_check(seed: int | None = None) -> str:
    """A digest of every input a check of an always-sound rule ran (derandomized by default)."""
    DRAWN.clear()
    result = check_rule(Rule.from_functions(shifted, shifted, name="shifted"), max_examples=40, seed=seed,
                        repair=False)
    assert result.ok, result.message
    return hashlib.sha1(b"".join(t.to(torch.float64).numpy().tobytes() for t in DRAWN)).hexdigest()


@pytest.fixture
def a_module_full_of_constants(monkeypatch):
    """What importing a user's module with many small literals does to Hypothesis: its lookup of
    local constants returns them (the ``tests`` conftest pins it empty for the suite)."""
    many = constants_ast.Constants(integers=set(range(-40, 41)), floats={i / 8 for i in range(-80, 81)})

    def imported():
        monkeypatch.setattr(providers, "_get_local_constants", lambda: many)
        providers.CONSTANTS_CACHE.cache.clear()

    yield imported
    providers.CONSTANTS_CACHE.cache.clear()


def test_a_check_draws_the_same_inputs_after_a_module_with_constants_is_imported(a_module_full_of_constants):
    before = drawn_by_a_check()
    a_module_full_of_constants()
    assert drawn_by_a_check() == before


@pytest.mark.slow  # four searches
def test_without_the_switch_the_imported_constants_change_the_draws(a_module_full_of_constants, monkeypatch):
    """The test above can fail: Hypothesis's default draws depend on the process's imports (a
    constant is drawn now and then: of the two searches compared, one must differ; each does in
    practice, even with 40 examples)."""
    monkeypatch.setattr(_reproducible, "OWN_CONSTANTS_ONLY", False)
    seeds = (None, 1)
    before = [drawn_by_a_check(seed) for seed in seeds]
    a_module_full_of_constants()
    assert [drawn_by_a_check(seed) for seed in seeds] != before


def test_the_callers_lookup_and_cache_are_back_after_the_check(a_module_full_of_constants):
    a_module_full_of_constants()
    lookup = providers._get_local_constants
    providers.CONSTANTS_CACHE.cache["marker"] = ((), (7,))
    drawn_by_a_check()
    assert providers._get_local_constants is lookup
    assert providers.CONSTANTS_CACHE.cache.get("marker") == ((), (7,))


def test_nested_and_concurrent_entries_restore_the_lookup_once_the_last_leaves():
    lookup = providers._get_local_constants
    entered, release = threading.Barrier(2), threading.Event()

    def other_thread():
        with _reproducible.own_constants_only():
            entered.wait()
            release.wait()

    thread = threading.Thread(target=other_thread)
    thread.start()
    with _reproducible.own_constants_only():
        with _reproducible.own_constants_only():
            assert providers._get_local_constants is not lookup
            assert len(providers._get_local_constants().floats) == 0
        entered.wait()
    assert providers._get_local_constants is not lookup  # the other thread is still inside
    release.set()
    thread.join()
    assert providers._get_local_constants is lookup
