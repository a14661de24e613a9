"""fxrewrite.testing._values, asked directly: numbers of a dtype (``elements``), shapes, tensors and
the value lists a tensor is made of stay within the dtype, the bounds and the switches they promise;
the flattened draw (``FLAT_ELEMENTS``) and the capped lists (``CAPPED_VALUE_LISTS``) against their
slow twins."""

from __future__ import annotations

import math

import pytest
import torch
from _helpers import draws, replayed

from fxrewrite.testing import _values

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


# -- elements: numbers of a dtype --------------------------------------------------------------------

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INTEGERS = [torch.uint8, torch.int8, torch.int32, torch.int64]


def stored(values, dtype):
    """``values`` as a tensor of ``dtype`` holds them, back as float64 (the tensor rounds)."""
    return torch.tensor(values, dtype=dtype).double()


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("lo, hi", [(-1.005, 1.005), (0.1, 0.3), (65000.0, None)])
def test_bounded_floats_stay_finite_and_within_the_bounds_once_a_tensor_holds_them(dtype, lo, hi):
    # 1.005, 0.1 and 0.3 are no float16/bfloat16/float32 values: a tensor rounds what lies near them
    values = draws(_values.elements(dtype, min_value=lo, max_value=hi, special_values=False), 80)
    held = stored(values, dtype)
    assert bool(held.isfinite().all())
    assert lo is None or float(held.min()) >= lo
    assert hi is None or float(held.max()) <= hi


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_special_values_are_drawn_beside_bounded_finite_ones(dtype):
    values = draws(_values.elements(dtype, min_value=0.0, max_value=1.0), 200)
    assert any(math.isnan(v) for v in values) and math.inf in values and -math.inf in values
    finite = stored([v for v in values if math.isfinite(v)], dtype)
    assert bool(((finite >= 0) & (finite <= 1)).all())


def _invalid_share(strategy, tries=200) -> float:
    """The share of ``tries`` random draws of ``strategy`` that Hypothesis threw away as invalid."""
    from random import Random

    from hypothesis.control import BuildContext
    from hypothesis.errors import StopTest
    from hypothesis.internal.conjecture.data import ConjectureData

    invalid = 0
    for seed in range(tries):
        data = ConjectureData(random=Random(seed))
        try:
            with BuildContext(data, wrapped_test=None):
                data.draw(strategy)
        except StopTest:
            invalid += 1
    return invalid / tries


@pytest.mark.parametrize("lo, hi", [(1.0, 1e6), (0.05, 2.0), (-3.0, -1e-3), (None, None), (0.0, 1.0)])
def test_no_float_draw_is_thrown_away_whatever_the_bounds(lo, hi):
    # small values (0 to 0.1) drawn and filtered out where the bounds hold none made 20% of
    # draws invalid with min_value=1.0
    assert _invalid_share(_values.elements(torch.float32, min_value=lo, max_value=hi, special_values=False)) == 0


@pytest.mark.parametrize("dtype", INTEGERS, ids=str)
def test_integers_fit_their_dtype_and_the_bounds_rounded_inwards(dtype):
    info = torch.iinfo(dtype)
    assert all(type(v) is int and info.min <= v <= info.max for v in draws(_values.elements(dtype), 100))
    bounded = draws(_values.elements(dtype, min_value=0.5, max_value=6.5), 60)
    assert set(bounded) <= set(range(1, 7)) and {1, 6} <= set(bounded)


@pytest.mark.parametrize("dtype", [torch.int32, torch.uint8, torch.float32], ids=str)
def test_an_infinite_bound_is_no_bound_on_its_side(dtype):
    # {"min_value": 0, "max_value": inf} says "not negative"; math.floor(inf) raised OverflowError
    lists = draws(_values._value_lists(dtype, 4, 0.0, math.inf, False), 40)
    assert lists and all(x >= 0 for v in lists for x in v) and any(x > 3 for v in lists for x in v)
    assert all(x <= 0 for v in draws(_values._value_lists(dtype, 2, -math.inf, 0.0, False), 20) for x in v)
    with pytest.raises(ValueError, match="lies between min_value=inf"):
        _values.elements(dtype, min_value=math.inf)


def test_booleans_are_both_values():
    assert set(draws(_values.elements(torch.bool), 20)) == {False, True}


@pytest.mark.parametrize("call, message", [
    (lambda: _values.elements(torch.complex64), "complex tensors are not drawn"),
    (lambda: _values.elements(torch.float16, min_value=1.0, max_value=0.5), "swap them"),
    (lambda: _values.elements(torch.uint8, min_value=-5, max_value=-1), r"no torch\.uint8 value lies between"),
    (lambda: _values.elements(torch.float32, min_value=0.1, max_value=0.1), r"no torch\.float32 value lies between "
                                                                            r"min_value=0\.1 and max_value=0\.1"),
    (lambda: _values.elements(torch.bfloat16, min_value=1.001, max_value=1.002), "widen the bounds to hold 1.0078125"),
    (lambda: _values.tensors(dtypes=[]), "give at least one value"),
])
def test_what_cannot_be_drawn_is_an_error_that_says_why(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_ulp_neighbours_are_finite_values_of_the_dtype_in_pairs_of_signs_smallest_first(dtype):
    values = _values.ulp_neighbours(dtype)
    assert all(math.isfinite(v) and float(torch.tensor(v, dtype=dtype)) == v for v in values)
    assert set(values) == {-v for v in values}
    magnitudes = [abs(v) for v in values]
    assert magnitudes[:2] == [magnitudes[0]] * 2 and magnitudes[0] == min(magnitudes)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("value", [0.1, -0.1, 1.005, 3.0e-8, 1.0])
def test_a_representable_bound_is_a_value_of_the_dtype_on_the_inside(dtype, value):
    up, down = (_values._representable(value, dtype, up=flag) for flag in (True, False))
    for bound in (up, down):
        assert float(torch.tensor(bound, dtype=dtype)) == bound  # the dtype holds it as it is
    assert down <= value <= up and (up == down) == (float(torch.tensor(value, dtype=dtype)) == value)


# -- shapes and tensors --------------------------------------------------------------------------------


def test_shapes_keep_their_ranks_and_sides():
    shapes = draws(_values.tensor_shapes(min_rank=0, max_rank=3, min_side=0, max_side=2), 80)
    assert all(len(s) <= 3 and all(0 <= d <= 2 for d in s) for s in shapes)
    assert () in shapes and any(0 in s for s in shapes)  # 0-d and empty shapes are drawn


@pytest.mark.parametrize("shape", [(), (0,), (2, 0, 3), (1,), (2, 3, 1)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int64, torch.uint8, torch.bool], ids=str)
def test_a_tensor_of_a_given_shape_and_dtype_is_contiguous_and_on_the_cpu(shape, dtype):
    for t in draws(_values.tensors(dtypes=dtype, shapes=shape), 15):
        assert t.shape == shape and t.dtype == dtype and t.is_contiguous() and t.device.type == "cpu"


def test_dtypes_are_drawn_from_a_sequence_or_a_strategy():
    import hypothesis.strategies as st

    assert {t.dtype for t in draws(_values.tensors(dtypes=[torch.int32, torch.float64]), 40)} == \
        {torch.int32, torch.float64}
    assert {t.dtype for t in draws(_values.tensors(dtypes=st.just(torch.uint8)), 10)} == {torch.uint8}


def test_tensors_without_special_values_are_finite_and_bounded():
    for t in draws(_values.tensors(dtypes=torch.float32, min_value=-2.0, max_value=2.0, special_values=False), 60):
        assert bool(t.isfinite().all()) and bool((t.abs() <= 2).all())


def test_the_same_values_in_a_transposed_layout():
    t = torch.arange(6.0).reshape(2, 3)
    moved = _values._non_contiguous(t)
    assert not moved.is_contiguous() and torch.equal(moved, t)


# -- the value lists a tensor is made of -----------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 5, 40])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool], ids=str)
def test_a_value_list_has_the_tensors_size(size, dtype):
    assert {len(v) for v in draws(_values._value_lists(dtype, size, None, None, True), 20)} == {size}


def test_a_capped_value_list_repeats_at_most_as_many_values_as_the_tensor_holds():
    lists = draws(_values._value_lists(torch.float64, 3, None, None, False, capped=True), 60)
    assert all(len(v) == 3 for v in lists) and any(len({repr(x) for x in v}) == 3 for v in lists)
    longer = draws(_values._value_lists(torch.float64, 40, None, None, False), 60)
    assert max(len({repr(x) for x in v}) for v in longer) <= _values.MAX_DISTINCT_VALUES


def test_values_that_tell_dtypes_apart_stay_finite_in_a_float16_tensor():
    # 65520 and 1e5 tell bfloat16 from float16 once converted, but a float16 tensor holds them as inf
    lists = draws(_values._value_lists(torch.float16, 4, None, None, False, separate=True, only_separating=True), 60)
    assert lists and all(bool(stored(v, torch.float16).isfinite().all()) for v in lists)
    assert {abs(x) for v in lists for x in v} <= set(_values.DTYPE_SEPARATORS)


def test_nan_and_infinity_are_planted_only_where_special_values_are_asked_for():
    planted = draws(_values._value_lists(torch.float32, 6, 0.0, 1.0, True), 100)
    assert any(any(math.isnan(x) for x in v) for v in planted)
    assert any(math.inf in v or -math.inf in v for v in planted)
    plain = draws(_values._value_lists(torch.float32, 6, 0.0, 1.0, False), 100)
    assert all(0.0 <= x <= 1.0 for v in plain for x in v)


def test_cycle_and_plant_fill_and_mark_a_list():
    assert _values._cycle([1, 2], 5) == [1, 2, 1, 2, 1] and _values._cycle([], 3) == []
    assert _values._plant([1.0, 2.0, 3.0], math.inf, 4) == [1.0, math.inf, 3.0]
    assert _values._plant([1.0], None, 0) == [1.0] and _values._plant([], math.nan, 2) == []


# -- the flattened draw against its slow twin --------------------------------------------------------------


@pytest.mark.parametrize("dtype, bounds", [
    (torch.float32, (None, None, True)), (torch.bfloat16, (-4.0, 4.0, False)), (torch.int32, (None, None, True)),
], ids=str)
def test_a_value_list_drawn_flat_is_the_slow_twins_list_for_the_same_choices(dtype, bounds, monkeypatch):
    lo, hi, special = bounds
    flat = _values._value_lists(dtype, 7, lo, hi, special)
    monkeypatch.setattr(_values, "FLAT_ELEMENTS", False)
    slow = _values._value_lists(dtype, 7, lo, hi, special)
    assert "flat(" in repr(flat) and "flat(" not in repr(slow)
    for seed in range(40):
        for first, second in ((flat, slow), (slow, flat)):
            a, b = replayed(first, second, seed)
            assert repr(a) == repr(b), (seed, a, b)  # repr: nan is nan, -0.0 is not 0.0
