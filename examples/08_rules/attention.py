"""Masked attention written out, as one call of ``F.scaled_dot_product_attention``.

The guard reads shapes and dtypes: inside ``torch.compile`` every graph carries them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import fxrewrite


def additive_mask_fits(m: fxrewrite.Match) -> bool:
    """The mask is a float mask of the scores' dtype, at least 2-d (as SDPA's attn_mask)."""
    q, mask = m["q"], m["mask"]
    return mask.dtype == q.dtype and mask.dim() >= 2 and q.dim() >= 2


@fxrewrite.rule(priority=10, where=additive_mask_fits, tolerance={"rtol": 1e-4, "atol": 1e-5})
def masked_attention(q, k, v, mask, s: float):
    "Replaces softmax(q @ k^T * s + mask) @ v by scaled_dot_product_attention(q, k, v, mask, scale=s)."
    return torch.softmax(q @ k.transpose(-2, -1) * s + mask, dim=-1) @ v


@masked_attention.replacement
def masked_attention(q, k, v, mask, s: float):  # the decorator turned the pattern into a RuleBuilder
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=s)
