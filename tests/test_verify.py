"""fxrewrite.verify: comparing results, printing values, checking whole programs."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

import fxrewrite
from fxrewrite.errors import NotEquivalent
from fxrewrite.verify import assert_equivalent, compare, default_tolerance, format_value, fresh_copy

inf, nan = math.inf, math.nan


def t(values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype)


# -- compare: special values ------------------------------------------------------------------


def test_nan_equals_nan():
    assert compare(t([nan, 1.0]), t([nan, 1.0])) is None


def test_nan_differs_from_a_number_and_from_inf():
    assert "expected nan, actual 0.0" in compare(t([nan]), t([0.0]))
    assert compare(t([nan]), t([inf])) is not None
    assert compare(t([inf]), t([nan])) is not None


def test_inf_equals_only_itself():
    assert compare(t([inf, -inf]), t([inf, -inf])) is None
    assert compare(t([inf]), t([-inf])) is not None
    assert compare(t([inf]), t([3.4e38])) is not None
    assert compare(t([1e30]), t([inf])) is not None


def test_positive_and_negative_zero_are_equal():
    assert compare(t([0.0]), t([-0.0])) is None


# -- compare: tolerance -----------------------------------------------------------------------


def test_default_tolerance_is_assert_close_per_dtype():
    assert default_tolerance(torch.float32) == (1.3e-6, 1e-5)
    assert default_tolerance(torch.float64) == (1e-7, 1e-7)
    assert default_tolerance(torch.float16) == (1e-3, 1e-5)
    assert default_tolerance(torch.int64) == (0.0, 0.0)
    assert compare(t([1.0]), t([1.0 + 1e-6])) is None
    assert compare(t([1.0], torch.float64), t([1.0 + 1e-6], torch.float64)) is not None


def test_explicit_tolerance_overrides_one_or_both():
    assert compare(t([1.0]), t([1.01])) is not None
    assert compare(t([1.0]), t([1.01]), atol=0.1) is None
    assert compare(t([100.0]), t([101.0]), rtol=0.02) is None
    assert compare(t([100.0]), t([101.0]), rtol=0.001, atol=0.0) is not None


def test_integers_and_bools_compare_exactly():
    assert compare(t([1, 2], torch.int64), t([1, 2], torch.int64)) is None
    assert "exactly" in compare(t([1, 2], torch.int64), t([1, 3], torch.int64))
    assert compare(t([True], torch.bool), t([False], torch.bool)) is not None


# -- compare: structure -----------------------------------------------------------------------


def test_shape_mismatch_is_described():
    assert compare(torch.zeros(2, 3), torch.zeros(3, 2)) == "shapes differ: expected (2, 3), actual (3, 2)"


def test_broadcastable_shapes_still_differ():
    assert compare(torch.zeros(1), torch.zeros(())) is not None


def test_dtype_mismatch_is_described():
    problem = compare(torch.zeros(2), torch.zeros(2, dtype=torch.float64))
    assert problem == "dtypes differ: expected torch.float32, actual torch.float64"


def test_nested_results_name_where_they_differ():
    expected = {"a": (torch.zeros(1), [torch.ones(2)])}
    actual = {"a": (torch.zeros(1), [torch.tensor([1.0, 2.0])])}
    assert compare(expected, expected) is None
    assert compare(expected, actual).startswith("['a'][1][0]: values differ at 1 of 2 elements")
    assert "lengths differ" in compare((torch.zeros(1),), (torch.zeros(1), torch.zeros(1)))
    assert "keys differ" in compare({"a": 1}, {"b": 1})


def test_tensor_against_non_tensor_is_a_difference():
    assert "expected is a tensor of shape (), actual is 1.0 (float)" in compare(torch.tensor(1.0), 1.0)


def test_python_scalars_compare_with_nan_and_tolerance():
    assert compare(nan, nan) is None
    assert compare(1.0, 1.0 + 1e-12) is None
    assert compare(1, 2) is not None
    assert compare(None, None) is None
    assert compare(1, 1.0) is not None


def test_mismatch_reports_the_first_index_count_and_difference():
    problem = compare(torch.zeros(2, 2), torch.tensor([[0.0, 0.0], [0.5, 0.25]]), names=("pattern", "replacement"))
    assert problem == ("values differ at 2 of 4 elements (rtol=1.3e-06, atol=1e-05): at index (1, 0) "
                       "pattern 0.0, replacement 0.5 (absolute difference 0.5)")


def test_empty_tensors_of_one_shape_are_equal():
    assert compare(torch.zeros(0, 3), torch.ones(0, 3)) is None


# -- format_value -----------------------------------------------------------------------------


def test_small_tensors_print_in_full_with_dtype_and_shape():
    assert format_value(t([[1.0, -0.0], [inf, nan]])) == (
        "torch.tensor([[1.0, -0.0], [inf, nan]], dtype=torch.float32)  # shape (2, 2)")
    assert format_value(t(3, torch.int32)) == "torch.tensor(3, dtype=torch.int32)  # shape ()"
    assert format_value(t([True, False], torch.bool)) == "torch.tensor([True, False], dtype=torch.bool)  # shape (2,)"


def test_floats_print_with_the_shortest_text_that_round_trips_in_their_dtype():
    assert format_value(t([0.1])) == "torch.tensor([0.1], dtype=torch.float32)  # shape (1,)"
    assert format_value(t([0.1], torch.float64)) == "torch.tensor([0.1], dtype=torch.float64)  # shape (1,)"
    assert "3.4028235e38" in format_value(t([torch.finfo(torch.float32).max]))
    assert "0.0999755859375" not in format_value(t([0.1], torch.float16))


def test_printed_tensors_can_be_pasted_back():
    original = t([[1.5, -0.0, inf], [nan, 1e-45, 3.4028235e38]])
    code = format_value(original).split("  #")[0]
    again = eval(code, {"torch": torch, "inf": inf, "nan": nan})
    assert torch.equal(torch.isnan(again), torch.isnan(original))
    assert compare(original, again, rtol=0, atol=0) is None


def test_large_tensors_are_summarized():
    text = format_value(torch.arange(100.0).reshape(10, 10))
    assert text.startswith("<tensor of shape (10, 10), dtype=torch.float32: min 0.0, max 99.0")


def test_non_contiguous_tensors_say_so():
    assert "non-contiguous" in format_value(torch.zeros(2, 3).t())


def test_containers_and_modules_are_formatted():
    assert format_value((torch.tensor(1.5), 2)) == "(torch.tensor(1.5, dtype=torch.float32)  # shape (), 2)"
    assert format_value(torch.nn.ReLU()) == "ReLU()"
    assert format_value(0.5) == "0.5"


def test_fresh_copy_clones_tensors_and_modules():
    x = torch.zeros(2)
    m = torch.nn.Linear(1, 1)
    copied = fresh_copy({"x": x, "m": m, "n": 3})
    copied["x"].add_(1)
    assert x.sum() == 0 and copied["m"] is not m and copied["n"] == 3


# -- assert_equivalent ------------------------------------------------------------------------


def test_assert_equivalent_passes_on_equal_models_and_several_inputs():
    model = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.ReLU())
    assert_equivalent(model, torch.nn.ReLU(), [(torch.randn(3),), (t([nan, -inf]),), torch.zeros(2)])


def test_assert_equivalent_reports_inputs_and_both_outputs():
    with pytest.raises(NotEquivalent) as info:
        assert_equivalent(lambda x, y: x + y, lambda x, y: x - y, (t([1.0]), t([2.0])))
    message = str(info.value)
    assert "differs from the one before on call 1 of 1: values differ" in message
    assert "x = torch.tensor([1.0], dtype=torch.float32)  # shape (1,)" in message
    assert "y = torch.tensor([2.0], dtype=torch.float32)  # shape (1,)" in message
    assert "before -> torch.tensor([3.0]" in message and "after  -> torch.tensor([-1.0]" in message


def test_assert_equivalent_reports_an_after_that_raises():
    def broken(x):
        raise RuntimeError("boom")

    with pytest.raises(NotEquivalent, match="raises on call 1 of 1") as info:
        assert_equivalent(torch.relu, broken, (torch.zeros(1),))
    assert "after  -> raised RuntimeError: boom" in str(info.value)


def test_assert_equivalent_checks_a_rewritten_module():
    class Model(torch.nn.Module):
        def forward(self, x):
            return torch.neg(torch.neg(x)) * 2

    rule = fxrewrite.Rule.from_functions(lambda x: torch.neg(torch.neg(x)), lambda x: x, name="double_neg")
    after = fxrewrite.rewrite(Model(), rule).module
    assert_equivalent(Model(), after, [(torch.randn(2, 3),), (t([inf, nan]),)])


def test_each_side_gets_its_own_copy_of_the_inputs():
    def mutating(x):
        x.add_(1)
        return x

    x = torch.zeros(1)
    assert_equivalent(mutating, lambda x: x + 1, (x,))
    assert x.item() == 0.0


@pytest.mark.slow
def test_verify_imports_neither_hypothesis_nor_pytest():
    code = "import sys, fxrewrite.verify; print(sorted(m for m in ('pytest', 'hypothesis') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
