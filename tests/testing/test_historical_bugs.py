"""Bugs that shipped in real rewrite rules, each ported as an fxrewrite rule with its fix.

Every entry names the public tracker it comes from, the rule as it shipped (``buggy``) and the
rule as it was fixed (``fixed``), in our own words and code. ``check_rule`` at its default budget
must call every buggy rule unsound, with a shrunk counterexample of the bug's own kind among the
ones it reports, and every fixed rule sound (or untestable, with the reason printed). The
ports keep the shape of each bug (what was captured, what was assumed) rather than the
original's IR: Inductor's ``prims.convert_element_type`` is ``Tensor.to``, an onnxscript
``Gemm`` is ``torch.addmm``, an ExecuTorch pass is a module-capture fold.

Where a port declares a ``domain`` or a ``tolerance``, it is the testing declaration the rule's
authors would have needed for its *fixed* form (a fold rounds differently; attention is computed
in another order); the buggy form gets the same declarations, so nothing but the bug separates
the two.
"""

from __future__ import annotations

import math

import attrs
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.fusion import fuse_conv_bn_weights, fuse_linear_bn_weights

from fxrewrite import Rule
from fxrewrite.testing import check_rule
from fxrewrite.testing.strategies import default_module

pytestmark = pytest.mark.slow


@attrs.frozen
class HistoricalBug:
    name: str
    tracker: str  # "owner/repo#number" of the issue or pull request
    url: str
    buggy: Rule
    fixed: Rule
    #: The kind of difference the bug is about (see fxrewrite.testing.Counterexample.kind).
    kind: str


BUGS: list[HistoricalBug] = []


def _bug(name: str, tracker: str, url: str, kind: str, buggy: Rule, fixed: Rule) -> None:
    BUGS.append(HistoricalBug(name, tracker, url, buggy, fixed, kind))


def _rule(name: str, pattern, replacement, **options) -> Rule:  # type: ignore[no-untyped-def]
    return Rule.from_functions(pattern, replacement, name=name, **options)


# ---- 1. ConvTranspose + BatchNorm fold ignores groups (pytorch #180995, fix #184076) ---------------


def _bn_scale(bn: nn.modules.batchnorm._BatchNorm) -> torch.Tensor:
    return (bn.weight / torch.sqrt(bn.running_var + bn.eps)).detach()


def _deconv_bn_pattern(x, conv: nn.ConvTranspose2d, bn: nn.BatchNorm2d):
    return bn(conv(x))


def _deconv(x, conv: nn.ConvTranspose2d, weight: torch.Tensor, bias: torch.Tensor):  # type: ignore[no-untyped-def]
    return F.conv_transpose2d(x, weight, bias, conv.stride, conv.padding, conv.output_padding, conv.groups,
                              conv.dilation)


def _deconv_bn_as_shipped(x, conv: nn.ConvTranspose2d, bn: nn.BatchNorm2d):
    """torch.nn.utils.fusion.fuse_conv_bn_weights(transpose=True): scales weight dim 1, which is
    out_channels / groups, as if it were out_channels."""
    weight, bias = fuse_conv_bn_weights(conv.weight.detach(), None if conv.bias is None else conv.bias.detach(),
                                        bn.running_mean, bn.running_var, bn.eps, bn.weight.detach(),
                                        bn.bias.detach(), transpose=True)
    return _deconv(x, conv, weight.detach(), bias.detach())


def _deconv_bn_per_group(x, conv: nn.ConvTranspose2d, bn: nn.BatchNorm2d):
    """Weight layout (in, out / groups, k...): output channel g * (out / groups) + j is dim 1's j
    in the rows of group g."""
    scale = _bn_scale(bn)
    groups, per_group = conv.groups, conv.weight.shape[1]
    rows = conv.weight.shape[0] // groups
    by_row = scale.reshape(groups, 1, per_group).expand(groups, rows, per_group).reshape(-1, per_group)
    weight = conv.weight.detach() * by_row.reshape(*by_row.shape, *([1] * (conv.weight.dim() - 2)))
    bias = conv.bias.detach() if conv.bias is not None else torch.zeros_like(bn.running_mean)
    return _deconv(x, conv, weight, (bias - bn.running_mean) * scale + bn.bias.detach())


_FOLD = {"dtypes": (torch.float32, torch.float64), "special_values": False, "min_value": -8.0, "max_value": 8.0}
_FOLD_TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}

_bug("deconv_bn_groups", "pytorch/pytorch#180995", "https://github.com/pytorch/pytorch/issues/180995", "raises",
     _rule("deconv_bn_groups_buggy", _deconv_bn_pattern, _deconv_bn_as_shipped, domain=_FOLD,
           tolerance=_FOLD_TOLERANCE),
     _rule("deconv_bn_groups_fixed", _deconv_bn_pattern, _deconv_bn_per_group, domain=_FOLD,
           tolerance=_FOLD_TOLERANCE))


# ---- 2. ConvTranspose + BatchNorm fold scales the input-channel axis (executorch #22517) -----------


def _deconv_bn_conv_layout(x, conv: nn.ConvTranspose2d, bn: nn.BatchNorm2d):
    """The fold written for Conv2d (scale weight dim 0) applied to a transposed conv."""
    weight, bias = fuse_conv_bn_weights(conv.weight.detach(), None if conv.bias is None else conv.bias.detach(),
                                        bn.running_mean, bn.running_var, bn.eps, bn.weight.detach(),
                                        bn.bias.detach(), transpose=False)
    return _deconv(x, conv, weight.detach(), bias.detach())


_bug("deconv_bn_axis", "pytorch/executorch#22517", "https://github.com/pytorch/executorch/pull/22517", "values",
     _rule("deconv_bn_axis_buggy", _deconv_bn_pattern, _deconv_bn_conv_layout, domain=_FOLD,
           tolerance=_FOLD_TOLERANCE),
     _rule("deconv_bn_axis_fixed", _deconv_bn_pattern, _deconv_bn_per_group, domain=_FOLD,
           tolerance=_FOLD_TOLERANCE))


# ---- 3. Gemm + BatchNorm fold forgets Gemm's beta (onnxscript #3027) -------------------------------


def _gemm_bn_pattern(c, a, w, bn: nn.BatchNorm1d, beta: float):
    return bn(torch.addmm(c, a, w, beta=beta))


def _gemm_bn_as_shipped(c, a, w, bn: nn.BatchNorm1d, beta: float):
    """Folds as if beta were 1, then keeps beta on the new Gemm (the folded bias scaled again)."""
    scale = _bn_scale(bn)
    return torch.addmm((c - bn.running_mean) * scale + bn.bias.detach(), a, w * scale, beta=beta)


def _gemm_bn_with_beta(c, a, w, bn: nn.BatchNorm1d, beta: float):
    scale = _bn_scale(bn)
    return torch.addmm((beta * c - bn.running_mean) * scale + bn.bias.detach(), a, w * scale)


_GEMM = {**_FOLD, "literals": {"beta": [1.0, 0.5, 2.0, -1.0]},
         "inputs": {"c": {"shape": (2,)}, "a": {"shape": (3, 4)}, "w": {"shape": (4, 2)}},
         "modules": {"bn": lambda: default_module(nn.BatchNorm1d, width=2, kernel=1, bias=True)}}

_bug("gemm_bn_beta", "microsoft/onnxscript#3027", "https://github.com/microsoft/onnxscript/pull/3027", "values",
     _rule("gemm_bn_beta_buggy", _gemm_bn_pattern, _gemm_bn_as_shipped, domain=_GEMM, tolerance=_FOLD_TOLERANCE),
     _rule("gemm_bn_beta_fixed", _gemm_bn_pattern, _gemm_bn_with_beta, domain=_GEMM, tolerance=_FOLD_TOLERANCE))


# ---- 4. Linear + BatchNorm1d fold on (N, C, L) inputs (executorch #17736) --------------------------


def _linear_bn_pattern(x, lin: nn.Linear, bn: nn.BatchNorm1d):
    return bn(lin(x))


def _linear_bn_fold(x, lin: nn.Linear, bn: nn.BatchNorm1d):
    weight, bias = fuse_linear_bn_weights(lin.weight.detach(), None if lin.bias is None else lin.bias.detach(),
                                          bn.running_mean, bn.running_var, bn.eps, bn.weight.detach(),
                                          bn.bias.detach())
    return F.linear(x, weight.detach(), bias.detach())


def _two_dims(m) -> bool:  # type: ignore[no-untyped-def]
    """BatchNorm1d normalizes the last dimension (the one Linear produces) only on (N, C) inputs."""
    return m["x"].dim() == 2


_bug("linear_bn_rank", "pytorch/executorch#17736", "https://github.com/pytorch/executorch/pull/17736", "values",
     _rule("linear_bn_rank_buggy", _linear_bn_pattern, _linear_bn_fold, domain=_FOLD, tolerance=_FOLD_TOLERANCE),
     _rule("linear_bn_rank_fixed", _linear_bn_pattern, _linear_bn_fold, where=_two_dims, domain=_FOLD,
           tolerance=_FOLD_TOLERANCE))


# ---- 5. Attention fusion with a boolean mask: fully masked rows (pytorch #100318) ------------------

_MASKED = -1e30  # what the eager model writes where the mask is False (finite: a masked row stays finite)


def _bool_mask_attention(q, k, v, mask):
    return torch.softmax((q @ k.transpose(-2, -1)).masked_fill(~mask, _MASKED), dim=-1) @ v


def _sdpa_bool_mask(q, k, v, mask):
    """The fused op with the boolean mask as it is: SDPA gives 0 (NaN in 2023) on a fully masked row."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)


def _sdpa_additive_mask(q, k, v, mask):
    additive = torch.zeros(mask.shape, dtype=q.dtype).masked_fill(~mask, _MASKED)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=additive, scale=1.0)


def _attention_ranks(m) -> bool:  # type: ignore[no-untyped-def]
    """The shapes scaled_dot_product_attention takes: queries, keys and values of one rank (2 or
    more) and the same batch dimensions, as many keys as values, and a mask that broadcasts to the
    scores' shape without growing it (and has two dimensions or more)."""
    q, k, v, mask = (m[n] for n in ("q", "k", "v", "mask"))
    if not (q.dim() == k.dim() == v.dim() >= 2 and q.shape[:-2] == k.shape[:-2] == v.shape[:-2] and mask.dim() >= 2):
        return False
    scores = (*q.shape[:-1], k.shape[-2])
    try:
        return k.shape[-2] == v.shape[-2] and torch.broadcast_shapes(mask.shape, scores) == scores
    except RuntimeError:
        return False


_ATTENTION = {"dtypes": (torch.float32, torch.float64, torch.bool), "special_values": False,
              "min_value": -4.0, "max_value": 4.0}
_ATTENTION_TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}

_bug("sdpa_bool_mask", "pytorch/pytorch#100318", "https://github.com/pytorch/pytorch/issues/100318", "values",
     _rule("sdpa_bool_mask_buggy", _bool_mask_attention, _sdpa_bool_mask, where=_attention_ranks,
           domain=_ATTENTION, tolerance=_ATTENTION_TOLERANCE),
     _rule("sdpa_bool_mask_fixed", _bool_mask_attention, _sdpa_additive_mask, where=_attention_ranks,
           domain=_ATTENTION, tolerance=_ATTENTION_TOLERANCE))


# ---- 6. fp16 attention with an fp32 additive mask cast to fp16 (pytorch #195784, fix #196118) -----


def _float_mask_attention(q, k, v, mask):
    return torch.softmax(q @ k.transpose(-2, -1) + mask, dim=-1).type_as(q) @ v


def _sdpa_mask_as_query(q, k, v, mask):
    """Casts the mask to the query's dtype: float32's most negative value becomes -inf in fp16."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.type_as(q), scale=1.0)


def _sdpa_mask_promoted(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(torch.promote_types(q.dtype, mask.dtype)),
                                          scale=1.0).type_as(q)


def _fp32_mask(m) -> bool:  # type: ignore[no-untyped-def]
    """The patterns #196118 adds: a float32 mask (added to the scores in float32 by eager too; with a
    float16 mask eager rounds the sum to float16, which a fused kernel does not)."""
    return m["mask"].dtype == torch.float32


_HALF_ATTENTION = {"dtypes": (torch.float16, torch.float32), "special_values": False,
                   "inputs": {n: {"min_value": -2.0, "max_value": 2.0} for n in "qkv"}}

_bug("sdpa_mask_cast", "pytorch/pytorch#195784", "https://github.com/pytorch/pytorch/issues/195784", "values",
     _rule("sdpa_mask_cast_buggy", _float_mask_attention, _sdpa_mask_as_query, where=(_attention_ranks, _fp32_mask),
           domain=_HALF_ATTENTION, tolerance={"rtol": 2e-2, "atol": 2e-2}),
     _rule("sdpa_mask_cast_fixed", _float_mask_attention, _sdpa_mask_promoted, where=(_attention_ranks, _fp32_mask),
           domain=_HALF_ATTENTION, tolerance={"rtol": 2e-2, "atol": 2e-2}))


# ---- 7. cumsum of ones rewritten to arange drops cumsum's dtype= (pytorch #189518, fix #189533) ----


def _ones_cumsum_dtype(x, d: int, dt: torch.dtype):
    return torch.ones_like(x).cumsum(d, dtype=dt)


def _arange_like(x, d: int, dtype: torch.dtype) -> torch.Tensor:
    n = x.shape[d]
    shape = [1] * x.dim()
    shape[d] = n
    return torch.arange(1, n + 1, dtype=dtype).view(shape).expand(x.shape)


def _arange_input_dtype(x, d: int, dt: torch.dtype):
    return _arange_like(x, d, torch.int64 if x.dtype == torch.bool else x.dtype)


def _arange_cumsum_dtype(x, d: int, dt: torch.dtype):
    return _arange_like(x, d, dt)


def _has_dims(m) -> bool:  # type: ignore[no-untyped-def]
    return m["x"].dim() >= 1


_bug("cumsum_dtype", "pytorch/pytorch#189518", "https://github.com/pytorch/pytorch/issues/189518", "dtype",
     _rule("cumsum_dtype_buggy", _ones_cumsum_dtype, _arange_input_dtype, where=_has_dims),
     _rule("cumsum_dtype_fixed", _ones_cumsum_dtype, _arange_cumsum_dtype, where=_has_dims))


# ---- 8. the same rewrite without type promotion (pytorch #109925, fix #109960) ----------------------


def _ones_cumsum(x, d: int):
    return torch.ones_like(x).cumsum(d)


def _arange_same_dtype(x, d: int):
    return _arange_like(x, d, torch.int64 if x.dtype == torch.bool else x.dtype)


def _arange_promoted(x, d: int):
    return _arange_like(x, d, x.dtype if x.dtype.is_floating_point else torch.int64)


_bug("cumsum_promotion", "pytorch/pytorch#109925", "https://github.com/pytorch/pytorch/issues/109925", "dtype",
     _rule("cumsum_promotion_buggy", _ones_cumsum, _arange_same_dtype, where=_has_dims),
     _rule("cumsum_promotion_fixed", _ones_cumsum, _arange_promoted, where=_has_dims))


# ---- 9. two casts removed when they are "of the same type group" (onnxruntime #17953) --------------

_LOSSLESS = {
    (torch.float16, torch.float32), (torch.float16, torch.float64), (torch.bfloat16, torch.float32),
    (torch.bfloat16, torch.float64), (torch.float32, torch.float64), (torch.int8, torch.int16),
    (torch.int8, torch.int32), (torch.int8, torch.int64), (torch.int16, torch.int32), (torch.int16, torch.int64),
    (torch.int32, torch.int64), (torch.uint8, torch.int16), (torch.uint8, torch.int32), (torch.uint8, torch.int64),
}


def _cast_cast(x, d1: torch.dtype, d2: torch.dtype):
    return x.to(d1).to(d2)


def _one_cast(x, d1: torch.dtype, d2: torch.dtype):
    return x.to(d2)


def _group(dtype: torch.dtype) -> str:
    return "bool" if dtype == torch.bool else "float" if dtype.is_floating_point else "int"


def _same_group(m) -> bool:  # type: ignore[no-untyped-def]
    return _group(m["x"].dtype) == _group(m["d1"]) == _group(m["d2"])


def _first_cast_lossless(m) -> bool:  # type: ignore[no-untyped-def]
    return m["d1"] == m["x"].dtype or (m["x"].dtype, m["d1"]) in _LOSSLESS


_bug("duplicate_cast", "microsoft/onnxruntime#17953", "https://github.com/microsoft/onnxruntime/pull/17953",
     "values",
     _rule("duplicate_cast_buggy", _cast_cast, _one_cast, where=_same_group),
     _rule("duplicate_cast_fixed", _cast_cast, _one_cast, where=_first_cast_lossless))


# ---- 10. split into equal sections when the dim is not divisible (pytorch #197080) -----------------


def _split_first(x, n: int):
    return torch.split(x, n, dim=-1)[-1]


def _split_equal_sections(x, n: int):
    sections = math.ceil(x.shape[-1] / n)
    return torch.split_with_sizes(x, [n] * sections, dim=-1)[-1]


def _split_exact_sections(x, n: int):
    size = x.shape[-1]
    sizes = [n] * (size // n) + ([size % n] if size % n else [])
    return torch.split_with_sizes(x, sizes, dim=-1)[-1]


_bug("split_sections", "pytorch/pytorch#197080", "https://github.com/pytorch/pytorch/issues/197080", "raises",
     _rule("split_sections_buggy", _split_first, _split_equal_sections),
     _rule("split_sections_fixed", _split_first, _split_exact_sections))


# ---- 11. pad before matmul done in place, assuming the pad grows (pytorch #194558, fix #195465) -----


def _pad_matmul(x, w, p: int):
    return F.pad(x, (0, p)) @ w


def _grown_matmul(x, w, p: int):
    return torch.cat([x, x.new_zeros((*x.shape[:-1], p))], dim=-1) @ w


def _grown_or_cut_matmul(x, w, p: int):
    if p < 0:
        return x[..., : x.shape[-1] + p] @ w
    return torch.cat([x, x.new_zeros((*x.shape[:-1], p))], dim=-1) @ w


_bug("negative_pad", "pytorch/pytorch#194558", "https://github.com/pytorch/pytorch/issues/194558", "raises",
     _rule("negative_pad_buggy", _pad_matmul, _grown_matmul),
     _rule("negative_pad_fixed", _pad_matmul, _grown_or_cut_matmul))


# ---- 12. division as multiplication by the reciprocal (tenstorrent/tt-metal #55294, #52094) --------


def _divide(x, y):
    return x / y


def _times_reciprocal(x, y):
    return x * torch.reciprocal(y)


def _divide_by(x, c: float):
    return x / c


def _times_exact_reciprocal(x, c: float):
    return x * (1.0 / c)


def _exact_power_of_two(m) -> bool:  # type: ignore[no-untyped-def]
    """1 / c is exact and c, 1 / c are normal numbers in every float dtype, float16 included."""
    c = m["c"]
    if not math.isfinite(c) or c == 0:
        return False
    mantissa, exponent = math.frexp(abs(c))
    return mantissa == 0.5 and -13 <= exponent - 1 <= 13


_bug("div_reciprocal", "tenstorrent/tt-metal#55294", "https://github.com/tenstorrent/tt-metal/issues/55294",
     "values",
     _rule("div_reciprocal_buggy", _divide, _times_reciprocal),
     _rule("div_reciprocal_fixed", _divide_by, _times_exact_reciprocal, where=_exact_power_of_two))


# ---- 13. two float conversions collapsed into the last one (Inductor's pointless_convert) ----------
# torch/_inductor/fx_passes/joint_graph.py in torch 2.13: fires when the intermediate dtype is not
# narrower than the final one, so bfloat16 -> float16 (same size, other format) is collapsed. No
# tracker entry found for it; kept as the issue's own example beside the twelve above.

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _inductor_guard(m) -> bool:  # type: ignore[no-untyped-def]
    d1, d2 = m["d1"], m["d2"]
    return m["x"].dtype in _FLOATS and d1 in _FLOATS and d2 in _FLOATS and d1.itemsize >= d2.itemsize


def _lossless_guard(m) -> bool:  # type: ignore[no-untyped-def]
    return m["x"].dtype in _FLOATS and m["d2"] in _FLOATS and _first_cast_lossless(m)


POINTLESS_CONVERT = HistoricalBug(
    "pointless_convert", "torch 2.13 torch/_inductor/fx_passes/joint_graph.py", "",
    _rule("pointless_convert_buggy", _cast_cast, _one_cast, where=_inductor_guard),
    _rule("pointless_convert_fixed", _cast_cast, _one_cast, where=_lossless_guard), "values")


# ---- the checks ------------------------------------------------------------------------------------


def test_the_suite_holds_at_least_twelve_bugs_from_public_trackers():
    assert len(BUGS) >= 12
    assert len({b.tracker for b in BUGS}) == len(BUGS)
    for bug in BUGS:
        owner_repo, _, number = bug.tracker.partition("#")
        assert number.isdigit() and owner_repo.count("/") == 1, bug.tracker
        assert bug.url.startswith(f"https://github.com/{owner_repo}/") and bug.url.endswith(f"/{number}")


@pytest.mark.parametrize("bug", [*BUGS, POINTLESS_CONVERT], ids=lambda b: b.name)
def test_the_buggy_rule_is_unsound_with_a_counterexample_of_its_kind(bug):
    result = check_rule(bug.buggy, repair=False)
    assert result.verdict == "unsound", result.message
    kinds = [c.kind for c in result.counterexamples]
    assert bug.kind in kinds, f"{bug.tracker}: expected a '{bug.kind}' counterexample, got {kinds}\n{result.message}"


@pytest.mark.parametrize("bug", [*BUGS, POINTLESS_CONVERT], ids=lambda b: b.name)
def test_the_fixed_rule_is_sound(bug):
    result = check_rule(bug.fixed, repair=False)
    assert result.verdict in ("sound", "untestable"), result.message
    assert result.ok or "could not be tested" in result.message
