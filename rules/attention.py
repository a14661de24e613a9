"""Scaled dot-product attention spelled out, replaced by ``F.scaled_dot_product_attention``.

The patterns use one spelling; the matcher covers the others: canonical ops (``torch.matmul`` /
``@`` / ``.matmul``; ``F.softmax(s, dim=-1)`` / ``torch.softmax(s, -1)`` / ``s.softmax(-1)``),
dims by meaning (``k.mT``, ``k.transpose(-1, -2)`` and, on rank 4, ``k.transpose(2, 3)`` are
``k.transpose(-2, -1)``; ``q.shape[-1]`` is ``q.size(-1)``) and no-op identities (Hugging Face's
``.to(q.dtype)`` of a value already of that dtype, eval-mode dropout). The scale is a literal capture (``* 0.125``,
``/ 8.0``, ``/ math.sqrt(64)`` all trace to a constant) or computed in the graph from a size,
``/ math.sqrt(q.size(-1))``, which the replacement computes the same way.

Priority 10: attention is matched before the small rules that could rewrite a piece of it.

Soundness. ``scaled_dot_product_attention`` broadcasts batch dimensions like ``@`` does, but
needs ``q`` and ``v`` with at least 2 dimensions (``softmax(...) @ v`` also accepts a 1-d
``v``): a soft guard checks ranks when the graph has shapes, and the domain declares them.
It computes ``softmax(q @ k^T * scale) @ v`` in another order (declared tolerance), and
handles overflowing scores and non-finite inputs differently, so the domain is finite inputs
of moderate size.

Masks. An additive mask becomes ``attn_mask`` only when it has the scores' floating dtype, at
least 2 dimensions, and broadcasts to the scores without enlarging them: a strict guard, so
the masked rules fire only when the graph has shapes (``example_inputs=``). A row masked
entirely with ``-inf`` gives nan in the formula and 0 in ``scaled_dot_product_attention``;
the domain (finite masks) leaves such rows out. Two additive terms (T5's position bias and mask,
``scores * s + bias + mask``) become one ``attn_mask=bias + mask`` when each fits (the sum is
rounded in another order: declared tolerance).

Boolean masks. ``where(c, scores, m)`` and ``scores.masked_fill(c, m)`` before the softmax, alone
or followed by an additive mask (GPT-Neo), are first turned into an additive mask
(``scores + where(c, 0, m)``, rules in attention.fxr), which the rules here then take: exactly
the same values when ``m`` is ``-inf`` or at most ``-1e30`` (``scores + m`` rounds to ``m`` for any
score below 1e22 in float32), including a row masked entirely, where both give uniform weights
(finite ``m``) or nan (``-inf``). A smaller ``m`` (``-1e4``, ``-1e9``) is not absorbed (a fully
masked row would change from uniform weights to the softmax of its scores): no rule. The scores
must be finite: ``where`` hides a nan or inf score at a masked position, an additive mask does not
(the domains exclude them). A mask value held in a tensor (GPT-Neo's ``torch.tensor(finfo.min)``,
a 0-d constant) is a graph value, not a literal: the rules' ``m: float`` cannot bind it, so they
do not fire there yet.

The float32 softmax upcast (``softmax(s, -1, dtype=torch.float32).to(q.dtype)``, Llama, OPT, ...)
is ``softmax_upcast`` (normalization.fxr): it leaves the plain softmax these patterns match.

Not expressible. Gemma-2's soft-capping (``tanh(scores / cap) * cap`` before the mask) applies
a function to the scores between the matmul and the softmax; ``scaled_dot_product_attention``
takes only a scale and an additive or boolean mask, so no rule can replace it. ALiBi written as
``(scores + alibi) * s + mask`` (Falcon) would need the bias scaled into the mask: no rule yet.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

import fxrewrite
from _fxrewrite_stdlib import FLOATS, broadcast_shape, finite, rank_at_least, sqrt, view

PRIORITY = 10
_TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}
_DOMAIN = {"dtypes": FLOATS, "mixed_dtypes": False, "ranks": (2, 4), "sides": (1, 4),
           "special_values": False, "min_value": -4.0, "max_value": 4.0}
_RANKS = rank_at_least(2, "q", "v")


def _nonzero(name: str):
    def guard(m: fxrewrite.Match) -> bool:
        return math.isfinite(m[name]) and m[name] != 0

    guard.__name__ = guard.__qualname__ = f"finite_nonzero({name})"
    return guard


def _scalar_domain(**literals: tuple) -> dict:
    return {**_DOMAIN, "literals": literals}


# ---- the scale is a constant -------------------------------------------------------------------


@fxrewrite.rule(priority=PRIORITY, where=(finite("s"), _RANKS), tolerance=_TOLERANCE,
                domain=_scalar_domain(s=(0.125, 0.5, 1.0, 2.0, -0.25)))
def attention_scaled(q, k, v, s: float):
    "Replaces softmax(q @ k.transpose(-2, -1) * s, -1) @ v by scaled_dot_product_attention(q, k, v, scale=s)."
    return torch.softmax(q @ k.transpose(-2, -1) * s, -1) @ v


@attention_scaled.replacement
def attention_scaled(q, k, v, s: float):
    return F.scaled_dot_product_attention(q, k, v, scale=float(s))


@fxrewrite.rule(priority=PRIORITY, where=(_nonzero("s"), _RANKS), tolerance=_TOLERANCE,
                domain=_scalar_domain(s=(8.0, 2.0, math.sqrt(3.0), 1.0, 0.5)))
def attention_divided(q, k, v, s: float):
    "Replaces softmax(q @ k.transpose(-2, -1) / s, -1) @ v by scaled_dot_product_attention(q, k, v, scale=1 / s)."
    return torch.softmax(q @ k.transpose(-2, -1) / s, -1) @ v


@attention_divided.replacement
def attention_divided(q, k, v, s: float):
    return F.scaled_dot_product_attention(q, k, v, scale=1.0 / s)


@fxrewrite.rule(priority=PRIORITY, where=(finite("s"), _RANKS), tolerance=_TOLERANCE,
                domain=_scalar_domain(s=(0.125, 0.5, 1.0, 2.0, -0.25)))
def attention_prescaled(q, k, v, s: float):
    "Replaces softmax((q * s) @ k.transpose(-2, -1), -1) @ v by scaled_dot_product_attention(q, k, v, scale=s)."
    return torch.softmax((q * s) @ k.transpose(-2, -1), -1) @ v


@attention_prescaled.replacement
def attention_prescaled(q, k, v, s: float):
    return F.scaled_dot_product_attention(q, k, v, scale=float(s))


@fxrewrite.rule(priority=PRIORITY, where=_RANKS, tolerance=_TOLERANCE, domain=_DOMAIN)
def attention_unscaled(q, k, v):
    "Replaces softmax(q @ k.transpose(-2, -1), -1) @ v by scaled_dot_product_attention(q, k, v, scale=1.0)."
    return torch.softmax(q @ k.transpose(-2, -1), -1) @ v


@attention_unscaled.replacement
def attention_unscaled(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, scale=1.0)


@fxrewrite.rule(priority=PRIORITY, where=finite("s"), tolerance=_TOLERANCE,
                domain={**_scalar_domain(s=(0.125, 0.5, 1.0, 2.0)), "ranks": (3, 3)})
def attention_bmm(q, k, v, s: float):
    "Replaces bmm(softmax(bmm(q, k.transpose(1, 2)) * s, -1), v) by scaled_dot_product_attention(q, k, v, scale=s)."
    return torch.bmm(torch.softmax(torch.bmm(q, k.transpose(1, 2)) * s, -1), v)


@attention_bmm.replacement
def attention_bmm(q, k, v, s: float):
    # bmm takes 3-d tensors only, where transpose(1, 2) is transpose(-2, -1).
    return F.scaled_dot_product_attention(q, k, v, scale=float(s))


# ---- the scale is 1 / sqrt(head dimension), computed in the graph ------------------------------
# `t` is whichever tensor the code takes the size of (q, k, or another): the replacement computes
# the same scale from it, so the rule holds whatever t is. (t.shape[-1] is t.size(-1) to the
# matcher.)

_DIM_DOMAIN = {**_DOMAIN, "shapes": "broadcast"}


@fxrewrite.rule(priority=PRIORITY, where=_RANKS, tolerance=_TOLERANCE, domain=_DIM_DOMAIN)
def attention_sqrt_dim(q, k, v, t):
    "Replaces softmax(q @ k.transpose(-2, -1) / math.sqrt(t.size(-1)), -1) @ v by scaled_dot_product_attention(q, k, v, scale=1 / math.sqrt(t.size(-1)))."
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(t.size(-1)), -1) @ v


@attention_sqrt_dim.replacement
def attention_sqrt_dim(q, k, v, t):
    return F.scaled_dot_product_attention(q, k, v, scale=1.0 / sqrt(t.size(-1)))


# 1 / math.sqrt(...) and 1.0 / math.sqrt(...) are one division of numbers to the matcher, and
# torch.export folds it to the constant it gives: no literal capture for the 1
@fxrewrite.rule(priority=PRIORITY, where=_RANKS, tolerance=_TOLERANCE, domain=_DIM_DOMAIN)
def attention_inverse_sqrt_dim(q, k, v, t):
    "Replaces softmax(q @ k.transpose(-2, -1) * (1 / math.sqrt(t.size(-1))), -1) @ v by scaled_dot_product_attention(q, k, v, scale=1 / math.sqrt(t.size(-1)))."
    return torch.softmax(q @ k.transpose(-2, -1) * (1 / math.sqrt(t.size(-1))), -1) @ v


@attention_inverse_sqrt_dim.replacement
def attention_inverse_sqrt_dim(q, k, v, t):
    return F.scaled_dot_product_attention(q, k, v, scale=1 / sqrt(t.size(-1)))


# ---- additive mask -------------------------------------------------------------------------------


def _scores_shape(q, k) -> tuple[int, ...]:
    return (*broadcast_shape(q.shape[:-2], k.shape[:-2]), q.shape[-2], k.shape[-2])


def _masks_fit(*masks: str):
    """Strict guard: each mask has the scores' dtype, at least 2 dimensions, and broadcasts to the
    scores' shape without enlarging it (what scaled_dot_product_attention requires of attn_mask)."""

    def guard(m: fxrewrite.Match) -> bool:
        tensors = [view(m, n) for n in ("q", "k", "v", *masks)]
        if any(t is None for t in tensors) or min(t.dim() for t in tensors) < 2:
            return False
        q, k = tensors[0], tensors[1]
        if any(t.dtype != q.dtype or not t.dtype.is_floating_point for t in tensors[3:]):
            return False
        try:
            scores = _scores_shape(q, k)
            return all(broadcast_shape(scores, t.shape) == scores for t in tensors[3:])
        except RuntimeError:
            return False

    guard.__name__ = guard.__qualname__ = "_mask_fits" if masks == ("mask",) else f"masks_fit({', '.join(masks)})"
    return guard


_mask_fits = _masks_fit("mask")
_MASKED_DOMAIN = {**_DOMAIN, "shapes": "broadcast"}


# ---- ALiBi attention on (batch * heads) rows (Bloom) ---------------------------------------------
# Bloom computes its scores with baddbmm on batch*heads rows, viewed as (b, h, t, -1) to add the
# mask, then viewed back for bmm: scaled_dot_product_attention on the (b, h) view, with the ALiBi
# bias (one row per batch*head) and the mask added into attn_mask.


def _alibi_fits(m: fxrewrite.Match) -> bool:
    """Strict guard: the two views split and join the batch*heads dimension as (b, h) and keep the
    query length, the bias has one row per batch*head and broadcasts over the queries, the mask
    broadcasts to the (b, h, t, keys) scores without enlarging them, all of one floating dtype."""
    q, kt, v, bias, mask = (view(m, n) for n in ("q", "kt", "v", "bias", "mask"))
    if any(t is None for t in (q, kt, v, bias, mask)) or (q.dim(), kt.dim(), v.dim(), bias.dim()) != (3, 3, 3, 3):
        return False
    b, h, t, n, bh, t2, n2 = (m[name] for name in ("b", "h", "t", "n", "bh", "t2", "n2"))
    keys = kt.shape[-1]
    rows = q.shape[0]
    if not (b * h == bh == rows == kt.shape[0] == v.shape[0] and t == t2 == q.shape[1] and n in (-1, keys)
            and n2 in (-1, keys) and v.shape[1] == keys and m["beta"] == 1 and math.isfinite(m["s"])):
        return False
    if bias.shape[0] != rows or bias.shape[1] != 1 or bias.shape[2] not in (1, keys) or mask.dim() > 4:
        return False
    if not q.dtype.is_floating_point or any(x.dtype != q.dtype for x in (kt, v, bias, mask)):
        return False
    try:
        return broadcast_shape((b, h, t, keys), mask.shape) == (b, h, t, keys)
    except RuntimeError:
        return False


_ALIBI_SHAPES = {"q": (4, 3, 5), "kt": (4, 5, 6), "v": (4, 6, 2), "bias": (4, 1, 6), "mask": (2, 1, 3, 6)}


@fxrewrite.rule(priority=PRIORITY, where=_alibi_fits, tolerance=_TOLERANCE,
                domain={**_DOMAIN, "dtypes": (torch.float32, torch.float64),
                        "inputs": {name: {"shape": shape} for name, shape in _ALIBI_SHAPES.items()},
                        "literals": {"s": (0.5, 0.125), "beta": (1.0, 1), "b": (2,), "h": (2,), "t": (3,),
                                     "n": (-1, 6), "bh": (4,), "t2": (3,), "n2": (-1, 6)}})
def attention_alibi_bmm(q, kt, v, bias, mask, s: float, beta: float, b: int, h: int, t: int, n: int, bh: int,
                        t2: int, n2: int):
    "Replaces Bloom's bmm(softmax(baddbmm(bias, q, kt, alpha=s).view(b, h, t, n) + mask, -1).view(bh, t, n), v) by scaled_dot_product_attention on the (b, h) view with attn_mask=bias + mask."
    scores = torch.baddbmm(bias, q, kt, beta=beta, alpha=s).view(b, h, t, n) + mask
    return torch.bmm(torch.softmax(scores, -1).view(bh, t2, n2), v)


@attention_alibi_bmm.replacement
def attention_alibi_bmm(q, kt, v, bias, mask, s: float, beta: float, b: int, h: int, t: int, n: int,
                        bh: int, t2: int, n2: int):
    heads = (b, h)
    out = F.scaled_dot_product_attention(q.unflatten(0, heads), kt.transpose(-2, -1).unflatten(0, heads),
                                         v.unflatten(0, heads), attn_mask=bias.unflatten(0, heads) + mask,
                                         scale=float(s))
    return out.flatten(0, 1)


@fxrewrite.rule(priority=PRIORITY, where=(finite("s"), _mask_fits), tolerance=_TOLERANCE,
                domain={**_MASKED_DOMAIN, "literals": {"s": (0.125, 0.5, 1.0, 2.0)}})
def attention_masked(q, k, v, mask, s: float):
    "Replaces softmax(q @ k.transpose(-2, -1) * s + mask, -1) @ v by scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=s)."
    return torch.softmax(q @ k.transpose(-2, -1) * s + mask, -1) @ v


@attention_masked.replacement
def attention_masked(q, k, v, mask, s: float):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=float(s))


@fxrewrite.rule(priority=PRIORITY, where=(_nonzero("s"), _mask_fits), tolerance=_TOLERANCE,
                domain={**_MASKED_DOMAIN, "literals": {"s": (8.0, 2.0, 1.0, 0.5)}})
def attention_masked_divided(q, k, v, mask, s: float):
    "Replaces softmax(q @ k.transpose(-2, -1) / s + mask, -1) @ v by scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1 / s)."
    return torch.softmax(q @ k.transpose(-2, -1) / s + mask, -1) @ v


@attention_masked_divided.replacement
def attention_masked_divided(q, k, v, mask, s: float):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0 / s)


@fxrewrite.rule(priority=PRIORITY, where=_mask_fits, tolerance=_TOLERANCE, domain=_MASKED_DOMAIN)
def attention_masked_sqrt_dim(q, k, v, mask, t):
    "Replaces softmax(q @ k.transpose(-2, -1) / math.sqrt(t.size(-1)) + mask, -1) @ v by scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1 / math.sqrt(t.size(-1)))."
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(t.size(-1)) + mask, -1) @ v


@attention_masked_sqrt_dim.replacement
def attention_masked_sqrt_dim(q, k, v, mask, t):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0 / sqrt(t.size(-1)))


@fxrewrite.rule(priority=PRIORITY, where=_mask_fits, tolerance=_TOLERANCE, domain=_MASKED_DOMAIN)
def attention_masked_inverse_sqrt_dim(q, k, v, mask, t):
    "Replaces softmax(q @ k.transpose(-2, -1) * (1 / math.sqrt(t.size(-1))) + mask, -1) @ v by scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1 / math.sqrt(t.size(-1)))."
    return torch.softmax(q @ k.transpose(-2, -1) * (1 / math.sqrt(t.size(-1))) + mask, -1) @ v


@attention_masked_inverse_sqrt_dim.replacement
def attention_masked_inverse_sqrt_dim(q, k, v, mask, t):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1 / sqrt(t.size(-1)))


@fxrewrite.rule(priority=PRIORITY, where=_mask_fits, tolerance=_TOLERANCE, domain=_MASKED_DOMAIN)
def attention_masked_unscaled(q, k, v, mask):
    "Replaces softmax(q @ k.transpose(-2, -1) + mask, -1) @ v by scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)."
    return torch.softmax(q @ k.transpose(-2, -1) + mask, -1) @ v


@attention_masked_unscaled.replacement
def attention_masked_unscaled(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)


# ---- two additive terms (T5: position bias and mask) ---------------------------------------------


@fxrewrite.rule(priority=PRIORITY, where=(finite("s"), _masks_fit("bias", "mask")), tolerance=_TOLERANCE,
                domain={**_MASKED_DOMAIN, "literals": {"s": (1.0, 0.125, 0.5, 2.0)}})
def attention_masked_two_terms(q, k, v, bias, mask, s: float):
    "Replaces softmax(q @ k.transpose(-2, -1) * s + bias + mask, -1) @ v by scaled_dot_product_attention(q, k, v, attn_mask=bias + mask, scale=s)."
    return torch.softmax(q @ k.transpose(-2, -1) * s + bias + mask, -1) @ v


@attention_masked_two_terms.replacement
def attention_masked_two_terms(q, k, v, bias, mask, s: float):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias + mask, scale=float(s))
