"""Known truth: rules whose soundness is known, and the verdict check_rule must give.

Every rule below is sound or unsound for a reason written next to it; check_rule must agree,
within a small example budget: no counterexample in 100 examples for a sound rule, one within
200 for an unsound rule (most turn up within 20; the search is derandomized, so the verdicts
are reproducible).
Unsound rules cover the ways rewrites go wrong: special values (inf, nan, 0, -0.0), huge and
tiny values, broadcasting, integer and bool dtypes, type promotion, precision (a declared
tolerance, a low-precision dtype) and module captures. Slow, larger searches are marked
``slow``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import attrs
import pytest
import torch
import torch.nn.functional as F
from _helpers import folded_conv
from torch import nn

from fxrewrite import Rule
from fxrewrite.testing import check_rule

FLOATS = (torch.float32, torch.float64)
FLOAT_DOMAIN = {"dtypes": FLOATS}
FINITE = {"dtypes": FLOATS, "special_values": False}
MODERATE = {**FINITE, "min_value": -1e3, "max_value": 1e3}
NUMBERS = (torch.float32, torch.float64, torch.int64, torch.int32, torch.uint8)

BUDGET = 100  # examples for a sound rule (the search must find nothing)
UNSOUND_BUDGET = 200  # examples within which the counterexample of an unsound rule must turn up


@attrs.frozen
class Case:
    rule: Rule
    expected: str
    why: str
    examples: int
    kind: str | None = None  # the kind of difference an unsound rule must show


def case(name: str, pattern: Callable[..., Any], replacement: Callable[..., Any], expected: str, why: str, *,
         kind: str | None = None, examples: int | None = None, **declarations: Any) -> Case:
    with warnings.catch_warnings():  # some replacements ignore an operand on purpose
        warnings.simplefilter("ignore")
        rule = Rule.from_functions(pattern, replacement, name=name, **declarations)
    budget = examples or (BUDGET if expected == "sound" else UNSOUND_BUDGET)
    return Case(rule, expected, why, budget, kind)


# -- patterns with captures ---------------------------------------------------------------------


def transpose_twice(x, a: int, b: int):
    return x.transpose(a, b).transpose(a, b)


def identity(x, a: int, b: int):
    return x


def sum_keepdim_squeeze(x, d: int):
    return x.sum(d, keepdim=True).squeeze(d)


def sum_dim(x, d: int):
    return x.sum(d)


def linear_relu(x, lin: nn.Linear):
    return torch.relu(lin(x))


def functional_linear_relu(x, lin: nn.Linear):
    return F.relu(F.linear(x, lin.weight, lin.bias))


def conv_bn(x, conv: nn.Conv2d, bn: nn.BatchNorm2d):
    return bn(conv(x))


def conv_bn_folded(x, conv: nn.Conv2d, bn: nn.BatchNorm2d):
    return folded_conv(conv, bn, with_bias=True)(x)


def conv_bn_folded_without_conv_bias(x, conv: nn.Conv2d, bn: nn.BatchNorm2d):
    return folded_conv(conv, bn, with_bias=False)(x)


CONV_BN = dict(domain={"dtypes": (torch.float32,), "special_values": False, "min_value": -10, "max_value": 10},
               tolerance={"rtol": 1e-4, "atol": 1e-4})


# -- the cases ----------------------------------------------------------------------------------

SOUND = [
    case("double_neg", lambda x: torch.neg(torch.neg(x)), lambda x: x, "sound",
         "negation is exact and wraps around the same way on integers"),
    case("relu_relu", lambda x: torch.relu(torch.relu(x)), lambda x: torch.relu(x), "sound", "relu is idempotent"),
    case("transpose_transpose", lambda x: x.transpose(-2, -1).transpose(-2, -1), lambda x: x, "sound",
         "a transposition is an involution"),
    case("transpose_dims_twice", transpose_twice, identity, "sound", "for any dims a, b the same involution"),
    case("abs_abs", lambda x: torch.abs(torch.abs(x)), lambda x: torch.abs(x), "sound", "abs is idempotent"),
    case("maximum_self", lambda x: torch.maximum(x, x), lambda x: x, "sound", "max(x, x) is x, nan included"),
    case("bitwise_not_twice", lambda x: torch.bitwise_not(torch.bitwise_not(x)), lambda x: x, "sound",
         "~ is an involution on integers and bools"),
    case("sum_keepdim_squeeze", sum_keepdim_squeeze, sum_dim, "sound", "the same reduction"),
    case("mul_one_floats", lambda x: x * 1, lambda x: x, "sound", "x * 1 is exact on floats",
         domain=FLOAT_DOMAIN),
    case("mul_two_is_add", lambda x: x * 2, lambda x: x + x, "sound", "doubling is exact, wraps the same way",
         domain={"dtypes": NUMBERS}),
    case("mul_zero_finite", lambda x: x * 0, lambda x: torch.zeros_like(x), "sound",
         "finite x * 0 is +-0 (and -0.0 == 0.0)", domain=FINITE),
    case("sqrt_square_moderate", lambda x: torch.sqrt(x * x), lambda x: torch.abs(x), "sound",
         "sqrt(RN(x*x)) == |x| in binary floating point when x*x neither overflows nor underflows",
         domain=MODERATE),
    case("relu_from_clamp_numbers", lambda x: torch.clamp(x, min=0), lambda x: torch.relu(x), "sound",
         "clamp(x, min=0) is relu(x) on numbers (nan and -0.0 included)", domain={"dtypes": NUMBERS}),
    case("int_floordiv_one", lambda x: x // 1, lambda x: x, "sound", "x // 1 is x on integers",
         domain={"dtypes": (torch.int64, torch.int32)}),
    case("pow_two", lambda x: torch.pow(x, 2), lambda x: x * x, "sound", "pow(x, 2) is computed as x * x",
         domain={"dtypes": (torch.float32, torch.float64, torch.int64, torch.int32)}),
    case("gelu_tanh_declared", lambda x: F.gelu(x), lambda x: F.gelu(x, approximate="tanh"), "sound",
         "the tanh approximation is within 5e-4 of gelu, inside the declared atol=1e-3",
         domain=MODERATE, tolerance={"atol": 1e-3}),
    case("log1p_float32", lambda x: torch.log(1 + x), lambda x: torch.log1p(x), "sound",
         "in float32/64 the rounding of 1 + x costs < 1e-7 absolute, inside the default atol", domain=FLOAT_DOMAIN),
    case("expm1_float32", lambda x: torch.exp(x) - 1, lambda x: torch.expm1(x), "sound",
         "in float32/64 exp(x) - 1 is within the default tolerance of expm1(x), overflow included",
         domain=FLOAT_DOMAIN),
    case("sigmoid_from_exp_floats", lambda x: 1 / (1 + torch.exp(-x)), lambda x: torch.sigmoid(x), "sound",
         "the textbook sigmoid, within rounding (exp overflow gives 1/inf = 0)", domain=FLOAT_DOMAIN),
    case("mean_from_sum_floats", lambda x: x.sum(-1) / x.size(-1), lambda x: x.mean(-1), "sound",
         "mean is sum / n on floats", domain=FLOAT_DOMAIN),
    case("linear_relu_module", linear_relu, functional_linear_relu, "sound",
         "a Linear module computes F.linear with its own weight and bias"),
    case("conv_bn_fold", conv_bn, conv_bn_folded, "sound",
         "folding an eval-mode BatchNorm into the conv, up to rounding", **CONV_BN),
]

UNSOUND = [
    # special values
    case("mul_zero", lambda x: x * 0.0, lambda x: torch.zeros_like(x), "unsound", "inf * 0 and nan * 0 are nan",
         kind="values", domain=FLOAT_DOMAIN),
    case("div_self", lambda x: x / x, lambda x: torch.ones_like(x), "unsound", "0 / 0 is nan, even without inf/nan",
         kind="values", domain=FINITE),
    case("sub_self", lambda x: x - x, lambda x: torch.zeros_like(x), "unsound", "inf - inf is nan",
         kind="values", domain=FLOAT_DOMAIN),
    case("exp_log", lambda x: torch.exp(torch.log(x)), lambda x: x, "unsound", "log of a negative number is nan",
         kind="values", domain=FLOAT_DOMAIN),
    case("where_relu_nan", lambda x: torch.where(x > 0, x, 0.0), lambda x: torch.relu(x), "unsound",
         "nan > 0 is False, so the pattern maps nan to 0, relu keeps it", kind="values", domain=FLOAT_DOMAIN),
    case("floordiv_one_floats", lambda x: x // 1, lambda x: x, "unsound", "0.5 // 1 is 0 (and inf // 1 is nan)",
         kind="values", domain=FINITE),
    # huge values
    case("sqrt_square", lambda x: torch.sqrt(x * x), lambda x: torch.abs(x), "unsound",
         "x * x overflows to inf for |x| > 1.8e19 in float32", kind="values", domain=FINITE),
    case("softmax_manual", lambda x: torch.exp(x) / torch.exp(x).sum(-1, keepdim=True),
         lambda x: torch.softmax(x, -1), "unsound", "exp overflows for x > 88: inf / inf is nan",
         kind="values", domain=FINITE),
    case("double_roundtrip_int64", lambda x: x.to(torch.float64).to(torch.int64), lambda x: x, "unsound",
         "int64 values above 2**53 do not survive a float64 round trip", kind="values",
         domain={"dtypes": (torch.int64,)}),
    # broadcasting
    case("mul_ones_like_broadcast", lambda x, y: x * torch.ones_like(y), lambda x, y: x, "unsound",
         "when y has more dimensions the product has y's shape", kind="shape",
         domain={**MODERATE, "mixed_dtypes": False}),
    case("add_sub", lambda x, y: x + y - y, lambda x, y: x, "unsound",
         "y broadcasts x to a larger shape (and rounding)", kind="shape", domain={**MODERATE, "mixed_dtypes": False}),
    # integer and bool dtypes
    case("mul_one", lambda x: x * 1, lambda x: x, "unsound", "bool * 1 is an int64 tensor", kind="dtype"),
    case("mul_two_bool", lambda x: x * 2, lambda x: x + x, "unsound", "bool * 2 is int64, bool + bool is bool",
         kind="dtype"),
    case("div2_mul2", lambda x: x / 2 * 2, lambda x: x, "unsound", "true division of integers returns floats",
         kind="dtype", domain={"dtypes": (torch.int64, torch.int32)}),
    case("relu_from_clamp", lambda x: torch.clamp(x, min=0), lambda x: torch.relu(x), "unsound",
         "clamp accepts bool tensors, relu raises on them", kind="raises"),
    case("mean_from_sum_ints", lambda x: x.sum(-1) / x.size(-1), lambda x: x.mean(-1), "unsound",
         "mean raises on integer tensors, sum / n does not", kind="raises"),
    case("sigmoid_from_exp_uint8", lambda x: 1 / (1 + torch.exp(-x)), lambda x: torch.sigmoid(x), "unsound",
         "-x on uint8 is 256 - x", kind="values", domain={"dtypes": (torch.uint8,)}),
    # type promotion
    case("neg_mul_promotion", lambda x, y: torch.neg(x) * y, lambda x, y: torch.neg(x * y), "unsound",
         "-x wraps at the int64 minimum before it is promoted to float64 (x drawn among large negatives)",
         kind="values", domain={"inputs": {"x": {"dtypes": (torch.int64,), "max_value": -(2**62)},
                                           "y": {"dtypes": (torch.float64,)}}}),
    # precision and tolerance
    case("gelu_tanh_default", lambda x: F.gelu(x), lambda x: F.gelu(x, approximate="tanh"), "unsound",
         "the approximation is off by up to 5e-4, beyond the default atol", kind="values", domain=MODERATE),
    case("log1p_float16", lambda x: torch.log(1 + x), lambda x: torch.log1p(x), "unsound",
         "in float16 1 + x loses small x entirely", kind="values", domain={"dtypes": (torch.float16,)}),
    case("expm1_float16", lambda x: torch.exp(x) - 1, lambda x: torch.expm1(x), "unsound",
         "in float16 exp(x) - 1 cancels catastrophically near 0", kind="values", domain={"dtypes": (torch.float16,)}),
    # module captures
    case("conv_bn_fold_without_conv_bias", conv_bn, conv_bn_folded_without_conv_bias, "unsound",
         "the folded conv forgets the conv's own bias", kind="values", **CONV_BN),
]

CASES = SOUND + UNSOUND


def test_the_suite_is_large_and_balanced():
    assert len(CASES) >= 25 and len(SOUND) >= 10 and len(UNSOUND) >= 10
    assert len({c.rule.name for c in CASES}) == len(CASES)
    assert all(c.examples <= 200 for c in CASES)


@pytest.mark.slow
@pytest.mark.parametrize("known", CASES, ids=lambda c: f"{c.rule.name}-{c.expected}")
def test_verdict_matches_the_known_truth(known: Case):
    result = check_rule(known.rule, max_examples=known.examples)
    assert result.verdict == known.expected, f"{known.why}\n{result.message}"
    if known.expected == "sound":
        assert result.examples_run >= known.examples
    else:
        assert known.kind in [c.kind for c in result.counterexamples], result.message


# -- slow: rarer counterexamples -----------------------------------------------------------------

SLOW = [
    case("reassociate_add", lambda x, y, z: (x + y) + z, lambda x, y, z: x + (y + z), "unsound",
         "floating-point addition is not associative (overflow, cancellation, and 0-d type promotion)",
         kind="values", examples=1000, domain=FINITE),
    case("neg_mul_promotion_mixed", lambda x, y: torch.neg(x) * y, lambda x, y: torch.neg(x * y), "unsound",
         "as neg_mul_promotion, but the dtypes must be mixed by the search itself", kind="values", examples=2000,
         domain={"dtypes": (torch.int64, torch.float64)}),
    case("double_neg_long", lambda x: torch.neg(torch.neg(x)), lambda x: x, "sound", "as double_neg",
         examples=2000),
]


@pytest.mark.slow
@pytest.mark.parametrize("known", SLOW, ids=lambda c: f"{c.rule.name}-{c.expected}")
def test_verdict_matches_the_known_truth_on_long_searches(known: Case):
    test_verdict_matches_the_known_truth(known)
