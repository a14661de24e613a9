"""What the checker draws beyond plain tensors (issue 21): each argument its own dtype, edge
masks, module constructor attributes, dtype pairs and the values that separate them, a 0-dim
argument that wins the type promotion, one value in two arguments; and what it reports beside
counterexamples (too few examples, distinct kinds of value differences, aliasing outputs,
inputs the pattern raises on but the replacement does not)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, find, given, settings
from torch import nn

from fxrewrite import Rule
from fxrewrite.testing import check_rule
from fxrewrite.testing.strategies import DTYPE_SEPARATORS, plan_inputs

pytestmark = pytest.mark.slow  # property searches of a few seconds each

FIND = settings(max_examples=2000, database=None, suppress_health_check=list(HealthCheck))


def _rule(pattern, replacement, **kw) -> Rule:  # type: ignore[no-untyped-def]
    return Rule.from_functions(pattern, replacement, name="r", **kw)


def masked_attention(q, k, v, mask):
    return torch.softmax((q @ k.transpose(-2, -1)).masked_fill(~mask, -1e30), dim=-1) @ v


def sdpa(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)


ATTENTION = _rule(masked_attention, sdpa, domain={"dtypes": (torch.float32, torch.bool), "special_values": False})


def test_an_argument_gets_a_dtype_of_its_own_when_the_pattern_runs_on_no_single_dtype():
    plan = plan_inputs(ATTENTION)
    assert plan.probe_failure is None
    assert plan.param_dtypes("mask") == (torch.bool,) and plan.param_dtypes("q") == (torch.float32,)
    inputs = find(plan.strategy(), lambda d: True, settings=FIND)
    assert inputs["mask"].dtype == torch.bool and inputs["q"].dtype == torch.float32


def test_masks_are_drawn_with_a_fully_masked_row_and_all_false():
    strategy = plan_inputs(ATTENTION).strategy()

    def row_masked(d):  # type: ignore[no-untyped-def]
        m = d["mask"]
        return m.dim() >= 2 and m.shape[-2] > 1 and bool((~m).all(-1).any()) and bool(m.any())

    assert row_masked(find(strategy, row_masked, settings=FIND))
    assert not find(strategy, lambda d: d["mask"].numel() > 3 and not d["mask"].any(), settings=FIND)["mask"].any()


def test_float_masks_get_rows_of_their_most_negative_value():
    rule = _rule(lambda x, m: torch.softmax(x + m, -1), lambda x, m: torch.softmax(m + x, -1),
                 domain={"dtypes": (torch.float32,), "special_values": False})
    low = torch.finfo(torch.float32).min
    found = find(plan_inputs(rule).strategy(),
                 lambda d: d["m"].dim() >= 2 and d["m"].shape[-2] > 1 and bool((d["m"] == low).all(-1).any())
                 and not bool((d["m"] == low).all()), settings=FIND)
    assert bool((found["m"] == low).all(-1).any())


def deconv_bn(x, conv: nn.ConvTranspose2d, bn: nn.BatchNorm2d):
    return bn(conv(x))


def test_module_captures_are_built_with_drawn_constructor_attributes():
    rule = _rule(deconv_bn, deconv_bn, domain={"dtypes": (torch.float32,)})
    strategy = plan_inputs(rule).strategy()
    grouped = find(strategy, lambda d: d["conv"].groups > 1 and d["conv"].stride != (1, 1), settings=FIND)
    assert grouped["conv"].in_channels % grouped["conv"].groups == 0
    assert find(strategy, lambda d: d["bn"].eps != 1e-5, settings=FIND)["bn"].eps in (1e-3, 0.1)
    padded = find(strategy, lambda d: d["conv"].output_padding != (0, 0), settings=FIND)["conv"]
    assert padded.output_padding[0] < max(padded.stride[0], padded.dilation[0])


def cast_twice(x, d1: torch.dtype, d2: torch.dtype):
    return x.to(d1).to(d2)


def cast_once(x, d1: torch.dtype, d2: torch.dtype):
    return x.to(d2)


def test_dtype_captures_are_drawn_as_pairs_with_values_that_separate_them():
    plan = plan_inputs(_rule(cast_twice, cast_once))
    assert plan.separates_dtypes
    pair = find(plan.strategy(), lambda d: (d["d1"], d["d2"]) == (torch.bfloat16, torch.float16), settings=FIND)
    assert pair["d1"] == torch.bfloat16
    separating = plan.with_separation().strategy()
    found = find(separating, lambda d: d["x"].dtype == torch.float32 and d["x"].numel() > 0, settings=FIND)
    kept = {float(torch.tensor(v, dtype=torch.float32)) for x in DTYPE_SEPARATORS for v in (x, -x)}
    assert all(float(v) in kept or not torch.isfinite(v) or v == 0 for v in found["x"].flatten())


def test_a_0_dim_argument_of_a_higher_category_is_drawn_beside_dimensioned_ones():
    plan = plan_inputs(_rule(lambda x, y: x / y, lambda x, y: x * torch.reciprocal(y)))
    assert plan.promotable == ("x", "y")
    found = find(plan.with_zero_dim("x").strategy(), lambda d: d["y"].dim() >= 1, settings=FIND)
    assert found["x"].dim() == 0 and found["x"].dtype.is_floating_point and not found["y"].dtype.is_floating_point


def test_x_over_y_as_x_times_reciprocal_y_is_unsound_by_promotion_and_by_subnormals():
    result = check_rule(_rule(lambda x, y: x / y, lambda x, y: x * torch.reciprocal(y)), repair=False)
    kinds = [c.kind for c in result.counterexamples]
    assert result.verdict == "unsound" and "dtype" in kinds and "values" in kinds, result.message


def test_one_value_is_drawn_into_two_arguments():
    # Equal float tensors whose elements vary come in about 1 draw of 200 (x - y == 0 is then
    # the interesting case): counted over a fixed, derandomized sample of 2,000 (7 of them), not
    # searched with `find`, whose derandomized run met none in its 2,000 tries.
    strategy = plan_inputs(_rule(lambda x, y: x - y, lambda x, y: x + (-y))).strategy()
    equal_and_varied = []

    @settings(FIND, derandomize=True)
    @given(strategy)
    def draw(d):  # type: ignore[no-untyped-def]
        x, y = d["x"], d["y"]
        if (x.dtype == y.dtype == torch.float32 and x.shape == y.shape and x.numel() > 1
                and torch.equal(x, y) and bool(x.ne(x[..., :1]).any())):
            equal_and_varied.append(d)

    draw()
    assert equal_and_varied, "no draw gave two float arguments one varied value"


# -- what is reported beside counterexamples -----------------------------------------------------


def test_a_rule_accepted_on_a_handful_of_inputs_is_untestable_never_sound():
    rare = _rule(lambda x: torch.relu(x) * 2, lambda x: torch.relu(x) + torch.relu(x),
                 where=lambda m: tuple(m["x"].shape) == (3, 1, 2) and m["x"].dtype == torch.uint8)
    result = check_rule(rare, repair=False)
    assert result.verdict == "untestable", result.message
    # how many of the draws meet the guard (none, or a few) depends on the draw order: either way
    # the rule is reported untested, with the count when there is one
    assert "could not be tested" in result.message
    if "could not be tested enough" in result.message:
        assert "fewer than the 10 needed" in result.message


def test_a_nan_does_not_hide_a_second_different_value_bug():
    def replacement(x):
        return torch.where(x.isnan(), torch.zeros_like(x), torch.where(x > 5, x + 1, x))

    result = check_rule(_rule(lambda x: x * 1.0, replacement, domain={"dtypes": (torch.float32,)}), repair=False)
    keys = [c.key for c in result.counterexamples]
    assert keys[:2] == ["values", "values:finite"], result.message
    finite = result.counterexamples[1]
    assert bool(torch.isfinite(finite.pattern_output).all()) and bool(finite.inputs["x"].gt(5).any())


def test_an_output_that_is_an_input_on_one_side_only_is_reported():
    result = check_rule(_rule(lambda x: x * 1, lambda x: x, domain={"dtypes": (torch.float32,)}), repair=False)
    assert result.ok
    assert "aliasing:    the replacement's output shares the storage of input 'x' where the pattern's is a new " \
           "tensor" in result.message


def test_inputs_the_pattern_raises_on_but_the_replacement_does_not_are_reported():
    result = check_rule(_rule(lambda x: x.view(-1), lambda x: x.reshape(-1)), repair=False)
    assert result.ok, result.message
    assert "diverges:    the pattern raises where the replacement returns" in result.message
    assert "the pattern raised RuntimeError: view size is not compatible" in result.message


def test_int_captures_are_drawn_as_sizes_that_add_up_to_a_side():
    def split_second(x, a: int, b: int, c: int):
        return torch.split_with_sizes(x, [a, b, c], -1)[1]

    strategy = plan_inputs(_rule(split_second, lambda x, a, b, c: x.narrow(-1, a, b))).strategy()
    found = find(strategy, lambda d: d["x"].dim() >= 1 and d["x"].shape[-1] >= 3
                 and sorted((d["a"], d["b"], d["c"])) != [0, 1, 2] and min(d["a"], d["b"], d["c"]) >= 1,
                 settings=FIND)
    assert found["a"] + found["b"] + found["c"] == found["x"].shape[-1]
