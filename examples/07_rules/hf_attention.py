"""Hugging Face's eager attention (``eager_attention_forward`` in GPT-2 and most decoder models)
rewritten to ``F.scaled_dot_product_attention``.

The eager code is::

    attn_weights = torch.matmul(query, key.transpose(-1, -2)) * query.size(-1) ** -0.5
    attn_weights = attn_weights + attention_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1)
    attn_weights = attn_weights.type(value.dtype)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value)

In the graph torch.export makes of it, the scale is a constant (``0.25``), ``.type(value.dtype)``
is ``aten.to.dtype`` behind an ``_assert_tensor_metadata`` check, and eval-mode dropout is
``aten.dropout(x, 0.0, False)``: the rule below, written at the torch level, matches all of it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import fxrewrite


def shapes_fit(m: fxrewrite.Match) -> bool:
    """q, k, v are batches of the same rank (>= 2) with equal batch dimensions, and the mask has
    their dtype and broadcasts to the scores without enlarging them: what
    scaled_dot_product_attention needs to compute what the eager code computes. Needs shapes
    (torch.export graphs carry them)."""
    q, k, v, mask = (m[name] for name in ("q", "k", "v", "mask"))
    if not q.dim() == k.dim() == v.dim() >= 2 or not q.shape[:-2] == k.shape[:-2] == v.shape[:-2]:
        return False
    if mask.dim() < 2 or mask.dtype != q.dtype or k.shape[-2] != v.shape[-2]:
        return False
    scores = (*q.shape[:-2], q.shape[-2], k.shape[-2])
    try:
        return torch.broadcast_shapes(scores, mask.shape) == torch.Size(scores)
    except RuntimeError:
        return False


@fxrewrite.rule(priority=11, where=shapes_fit, tolerance={"rtol": 1e-4, "atol": 1e-5},
                domain={"dtypes": (torch.float32,), "ranks": (4, 4), "special_values": False,
                        "min_value": -8.0, "max_value": 8.0, "literals": {"p": (0.0, 0.1)}})
def hf_eager_attention(q, k, v, mask, p: float):
    "Replaces Hugging Face's eager attention (scale, additive mask, softmax, cast, eval dropout) by scaled_dot_product_attention."
    scores = torch.matmul(q, k.transpose(-1, -2)) * q.size(-1) ** -0.5
    weights = F.softmax(scores + mask, dim=-1).type(v.dtype)
    return torch.matmul(F.dropout(weights, p=p, training=False), v)


@hf_eager_attention.replacement
def hf_eager_attention(q, k, v, mask, p: float):
    # dropout is inactive (training=False) whatever p is
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
