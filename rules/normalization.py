"""Normalizations written out by hand, replaced by the torch function that computes them:
layer norm, RMS norm, softmax and log-softmax.

The hand-written formulas and the fused kernels round differently (declared tolerance), and
the kernels behave better at the edges (no overflow in exp, no 0/0), so the domains declare
finite inputs of moderate size; softmax written without subtracting the maximum overflows for
large inputs, and ``log(softmax(x))`` underflows to ``-inf``, so those rules declare how large.

Sub-expressions are written out in full where the formula repeats them (``exp(x - m)`` in
the numerator and the denominator): a pattern node may match a graph node that another pattern
node matches too, so the rule matches code that computes the repeated part once and code that
computes it twice.

The normalized dimension is the last one (``-1``) for layer norm and RMS norm, as
``F.layer_norm`` and ``F.rms_norm`` normalize trailing dimensions; its size is read in the
graph (``x.shape[-1]``), so no metadata is needed. The affine variants (``... * w + b``) need
shapes: ``w`` and ``b`` must be vectors over the last dimension to become the norm's weight
and bias (strict guards), otherwise the plain variant fires and the affine part stays.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import fxrewrite
from _fxrewrite_stdlib import FLOATS, dtype_in, feature_vector, floating, positive, rank_at_least

_NORM = {"rtol": 1e-4, "atol": 1e-4}
_NORM_DOMAIN = {"dtypes": FLOATS, "ranks": (1, 4), "special_values": False, "min_value": -100.0,
                "max_value": 100.0, "literals": {"eps": (1e-5, 1e-6, 1e-12, 0.1)}}
_NORM_GUARDS = (positive("eps"), floating("x"), rank_at_least(1, "x"))
_AFFINE_GUARDS = (*_NORM_GUARDS, feature_vector("w", of="x"), feature_vector("b", of="x"))
_AFFINE_DOMAIN = {**_NORM_DOMAIN, "mixed_dtypes": False}

# Layer norm written out subtracts a rounded mean: on a row whose variance is far below eps
# (a constant row) it returns its own rounding error divided by sqrt(eps) (2e-4 for a row of
# 3.33 with eps=1e-6; 0.2 with eps=1e-12), where F.layer_norm returns ~0. The replacement is
# the more accurate one; the declared tolerance and domain (|x| <= 10, eps >= 1e-5) are where
# the two agree to 1e-3.
_LAYER_NORM = {"rtol": 1e-4, "atol": 1e-3}
_LAYER_NORM_DOMAIN = {**_NORM_DOMAIN, "min_value": -10.0, "max_value": 10.0, "literals": {"eps": (1e-5, 1e-3, 0.1)}}
_LAYER_NORM_AFFINE_DOMAIN = {**_LAYER_NORM_DOMAIN, "mixed_dtypes": False}


def _last_dim(x):
    return (x.shape[-1],)


# ---- layer norm ------------------------------------------------------------------------------


def _layer_norm_var(x, eps):
    return (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + eps)


def _layer_norm_centered(x, eps):
    # x - u written twice: a pattern node may match a node the graph computes once and uses
    # twice, so this matches both `c = x - u; c / sqrt(c.pow(2)...)` and BERT's `(x - u)` twice.
    u = x.mean(-1, keepdim=True)
    return (x - u) / torch.sqrt((x - u).pow(2).mean(-1, keepdim=True) + eps)


@fxrewrite.rule(where=_NORM_GUARDS, tolerance=_LAYER_NORM, domain=_LAYER_NORM_DOMAIN)
def layer_norm_from_var(x, eps: float):
    "Replaces (x - x.mean(-1, keepdim=True)) / sqrt(x.var(-1, keepdim=True, unbiased=False) + eps) by layer_norm(x, (x.shape[-1],), eps=eps)."
    return _layer_norm_var(x, eps)


@layer_norm_from_var.replacement
def layer_norm_from_var(x, eps: float):
    return F.layer_norm(x, _last_dim(x), eps=eps)


@fxrewrite.rule(where=_AFFINE_GUARDS, tolerance=_LAYER_NORM, domain=_LAYER_NORM_AFFINE_DOMAIN, priority=1)
def layer_norm_from_var_affine(x, w, b, eps: float):
    "Replaces (x - x.mean(-1, keepdim=True)) / sqrt(x.var(-1, keepdim=True, unbiased=False) + eps) * w + b by layer_norm(x, (x.shape[-1],), w, b, eps) (needs shapes)."
    return _layer_norm_var(x, eps) * w + b


@layer_norm_from_var_affine.replacement
def layer_norm_from_var_affine(x, w, b, eps: float):
    return F.layer_norm(x, _last_dim(x), w, b, eps)


@fxrewrite.rule(where=_NORM_GUARDS, tolerance=_LAYER_NORM, domain=_LAYER_NORM_DOMAIN)
def layer_norm_from_centered(x, eps: float):
    "Replaces (x - u) / sqrt((x - u).pow(2).mean(-1, keepdim=True) + eps) with u = x.mean(-1, keepdim=True) by layer_norm(x, (x.shape[-1],), eps=eps)."
    return _layer_norm_centered(x, eps)


@layer_norm_from_centered.replacement
def layer_norm_from_centered(x, eps: float):
    return F.layer_norm(x, _last_dim(x), eps=eps)


@fxrewrite.rule(where=_AFFINE_GUARDS, tolerance=_LAYER_NORM, domain=_LAYER_NORM_AFFINE_DOMAIN, priority=1)
def layer_norm_from_centered_affine(x, w, b, eps: float):
    "Replaces w * ((x - u) / sqrt((x - u).pow(2).mean(-1, keepdim=True) + eps)) + b with u = x.mean(-1, keepdim=True) by layer_norm(x, (x.shape[-1],), w, b, eps) (needs shapes)."
    return w * _layer_norm_centered(x, eps) + b


@layer_norm_from_centered_affine.replacement
def layer_norm_from_centered_affine(x, w, b, eps: float):
    return F.layer_norm(x, _last_dim(x), w, b, eps)


# ---- RMS norm --------------------------------------------------------------------------------


def _rms_norm(x, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


@fxrewrite.rule(where=_NORM_GUARDS, tolerance=_NORM, domain=_NORM_DOMAIN)
def rms_norm_from_rsqrt(x, eps: float):
    "Replaces x * rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) by rms_norm(x, (x.shape[-1],), eps=eps)."
    return _rms_norm(x, eps)


@rms_norm_from_rsqrt.replacement
def rms_norm_from_rsqrt(x, eps: float):
    return F.rms_norm(x, _last_dim(x), eps=eps)


@fxrewrite.rule(where=(*_NORM_GUARDS, feature_vector("w", of="x")), tolerance=_NORM, domain=_AFFINE_DOMAIN,
                priority=1)
def rms_norm_from_rsqrt_affine(x, w, eps: float):
    "Replaces w * (x * rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)) by rms_norm(x, (x.shape[-1],), w, eps) (needs shapes)."
    return w * _rms_norm(x, eps)


@rms_norm_from_rsqrt_affine.replacement
def rms_norm_from_rsqrt_affine(x, w, eps: float):
    return F.rms_norm(x, _last_dim(x), w, eps)


@fxrewrite.rule(where=_NORM_GUARDS, tolerance=_NORM, domain=_NORM_DOMAIN)
def rms_norm_from_sqrt(x, eps: float):
    "Replaces x / sqrt(x.pow(2).mean(-1, keepdim=True) + eps) by rms_norm(x, (x.shape[-1],), eps=eps)."
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


@rms_norm_from_sqrt.replacement
def rms_norm_from_sqrt(x, eps: float):
    return F.rms_norm(x, _last_dim(x), eps=eps)


# ---- RMS norm computed in float32 (Llama, Gemma, T5) ------------------------------------------
# Hugging Face's RMSNorms upcast a float16/bfloat16 input to float32, normalize, and cast back
# (Gemma's, whose guards are plain conditions, is in normalization.fxr).
# F.rms_norm computes in float32 for such inputs too (bitwise the same as
# ``(x.float() * rsqrt(...)).to(x.dtype)`` on CPU), but multiplies by its weight before the one
# rounding, where Llama and T5 round first and multiply in the half dtype: so for half inputs the
# weight stays outside (``w * rms_norm(x)``, the same computation), and only float32 fuses it
# (a float64 input loses the float32 rounding of the formula: more accurate, within tolerance).
# In float32 graphs the casts are no-ops; these rules fire there too.

_UPCAST_DOMAIN = {**_AFFINE_DOMAIN, "dtypes": (*FLOATS, torch.bfloat16, torch.float16)}


def _rms_norm_float32(x, eps):
    xf = x.to(torch.float32)
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)


def _weight_times_rms_norm(x, w, eps):
    if x.dtype == torch.float32:
        return F.rms_norm(x, _last_dim(x), w, eps)
    return w * F.rms_norm(x, _last_dim(x), eps=eps)


@fxrewrite.rule(where=(*_NORM_GUARDS, feature_vector("w", of="x")), tolerance=_NORM, domain=_UPCAST_DOMAIN,
                priority=2)
def rms_norm_upcast_affine(x, w, eps: float):
    "Replaces w * (x.float() * rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) (Llama's RMSNorm) by w * rms_norm(x, (x.shape[-1],), eps=eps), or rms_norm(x, (x.shape[-1],), w, eps) for float32 x (needs shapes)."
    return w * _rms_norm_float32(x, eps).to(x.dtype)


@rms_norm_upcast_affine.replacement
def rms_norm_upcast_affine(x, w, eps: float):
    return _weight_times_rms_norm(x, w, eps)


def _rms_norm_t5(x, eps):
    """T5LayerNorm: the variance of the upcast input, applied to the input itself (a float32
    result for half inputs, by type promotion)."""
    return x * torch.rsqrt(x.to(torch.float32).pow(2).mean(-1, keepdim=True) + eps)


# x * rsqrt(float32) is float32 for a half x, where rms_norm(x) would be half: float32/64 only.
@fxrewrite.rule(where=(*_NORM_GUARDS, feature_vector("w", of="x"), dtype_in("x", FLOATS)), tolerance=_NORM,
                domain=_AFFINE_DOMAIN, priority=2)
def rms_norm_t5_affine(x, w, eps: float):
    "Replaces w * (x * rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)) (T5's layer norm, float32 weights) by rms_norm(x, (x.shape[-1],), w, eps) (needs shapes)."
    return w * _rms_norm_t5(x, eps)


@rms_norm_t5_affine.replacement
def rms_norm_t5_affine(x, w, eps: float):
    return F.rms_norm(x, _last_dim(x), w, eps)


@fxrewrite.rule(where=(*_NORM_GUARDS, feature_vector("w", of="x")), tolerance=_NORM, domain=_UPCAST_DOMAIN,
                priority=2)
def rms_norm_t5_half(x, w, eps: float):
    "Replaces w * (x * rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)).to(w.dtype) (T5's layer norm, half weights) by w * rms_norm(x, (x.shape[-1],), eps=eps), or rms_norm(x, (x.shape[-1],), w, eps) for float32 x (needs shapes)."
    return w * _rms_norm_t5(x, eps).to(w.dtype)


@rms_norm_t5_half.replacement
def rms_norm_t5_half(x, w, eps: float):
    return _weight_times_rms_norm(x, w, eps)


# ---- softmax and log-softmax ---------------------------------------------------------------------

_SOFTMAX = {"rtol": 1e-5, "atol": 1e-6}


def _softmax_formula(x, d, shifted):
    """exp(shifted(x)) / exp(shifted(x)).sum(d, keepdim=True), with shifted(x) written twice."""
    return torch.exp(shifted(x)) / torch.exp(shifted(x)).sum(d, keepdim=True)
_SOFTMAX_DOMAIN = {"dtypes": FLOATS, "special_values": False, "min_value": -1e4, "max_value": 1e4}


@fxrewrite.rule(where=floating("x"), tolerance=_SOFTMAX, domain=_SOFTMAX_DOMAIN)
def softmax_from_exp_amax(x, d: int):
    "Replaces e / e.sum(d, keepdim=True) with e = exp(x - x.amax(d, keepdim=True)) by softmax(x, d)."
    return _softmax_formula(x, d, lambda t: t - t.amax(d, keepdim=True))


@softmax_from_exp_amax.replacement
def softmax_from_exp_amax(x, d: int):
    return torch.softmax(x, d)


@fxrewrite.rule(where=floating("x"), tolerance=_SOFTMAX, domain=_SOFTMAX_DOMAIN)
def softmax_from_exp_max(x, d: int):
    "Replaces e / e.sum(d, keepdim=True) with e = exp(x - x.max(d, keepdim=True)[0]) by softmax(x, d)."
    return _softmax_formula(x, d, lambda t: t - t.max(d, keepdim=True)[0])


@softmax_from_exp_max.replacement
def softmax_from_exp_max(x, d: int):
    return torch.softmax(x, d)


@fxrewrite.rule(where=floating("x"), tolerance=_SOFTMAX, domain=_SOFTMAX_DOMAIN)
def softmax_from_exp_max_values(x, d: int):
    "Replaces e / e.sum(d, keepdim=True) with e = exp(x - x.max(d, keepdim=True).values) by softmax(x, d)."
    return _softmax_formula(x, d, lambda t: t - t.max(d, keepdim=True).values)


@softmax_from_exp_max_values.replacement
def softmax_from_exp_max_values(x, d: int):
    return torch.softmax(x, d)


# exp(x) overflows float32 above 88 and underflows to 0 below -103 (then 0 / 0): |x| <= 60 only.
@fxrewrite.rule(where=floating("x"), tolerance=_SOFTMAX,
                domain={**_SOFTMAX_DOMAIN, "min_value": -60.0, "max_value": 60.0})
def softmax_from_exp(x, d: int):
    "Replaces exp(x) / exp(x).sum(d, keepdim=True) by softmax(x, d) (for |x| <= 60, where exp does not overflow)."
    return _softmax_formula(x, d, lambda t: t)


@softmax_from_exp.replacement
def softmax_from_exp(x, d: int):
    return torch.softmax(x, d)


# x - logsumexp(x) cancels: its error is a rounding of |x|, so |x| <= 100 with an absolute tolerance.
@fxrewrite.rule(where=floating("x"), tolerance={"rtol": 1e-5, "atol": 1e-4},
                domain={**_SOFTMAX_DOMAIN, "min_value": -100.0, "max_value": 100.0})
def log_softmax_from_logsumexp(x, d: int):
    "Replaces x - logsumexp(x, d, keepdim=True) by log_softmax(x, d)."
    return x - torch.logsumexp(x, d, keepdim=True)


@log_softmax_from_logsumexp.replacement
def log_softmax_from_logsumexp(x, d: int):
    return torch.log_softmax(x, d)


# softmax underflows to 0 (log gives -inf) once values in a row are ~87 apart: |x| <= 20 only.
@fxrewrite.rule(where=floating("x"), tolerance=_SOFTMAX,
                domain={**_SOFTMAX_DOMAIN, "min_value": -20.0, "max_value": 20.0})
def log_softmax_from_log(x, d: int):
    "Replaces log(softmax(x, d)) by log_softmax(x, d) (for |x| <= 20, where softmax does not underflow)."
    return torch.log(torch.softmax(x, d))


@log_softmax_from_log.replacement
def log_softmax_from_log(x, d: int):
    return torch.log_softmax(x, d)
