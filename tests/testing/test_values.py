"""fxrewrite.testing._values, asked directly: numbers of a dtype (``elements``), shapes, tensors and
the value lists a tensor is made of stay within the dtype, the bounds and the switches they promise;
the flattened draw (``FLAT_ELEMENTS``) and the capped lists (``CAPPED_VALUE_LISTS``) against their
slow twins."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from fxrewrite.testing import _values


def draws(strategy, n=60):
    """``n`` deterministic draws of ``strategy`` (the ``ci`` profile's bound, derandomized)."""
    seen = []

    @settings(max_examples=n, database=None, derandomize=True, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(value):
        seen.append(value)

    collect()
    return seen


# -- the switches of the value lists ----------------------------------------------------------------


def test_turning_a_switch_off_gives_its_slow_twin_even_after_the_fast_one_was_made(monkeypatch):
    def made() -> str:
        return repr(_values._value_lists(torch.int64, 3, None, None, True, capped=True))

    assert "max_size=3)" in made() and "flat(" in made()  # the fast ones, now remembered
    monkeypatch.setattr(_values, "CAPPED_VALUE_LISTS", False)
    assert "max_size=3)" not in made() and "max_size=32" in made()
    monkeypatch.setattr(_values, "FLAT_ELEMENTS", False)
    assert "flat(" not in made()
    monkeypatch.undo()
    assert "max_size=3)" in made() and "flat(" in made()
