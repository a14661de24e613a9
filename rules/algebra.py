"""Algebraic identities that need a guard or a tolerance (the exact, unconditional ones are in
algebra.fxr).

* Sign identities (``x + (-y) => x - y``) hold when no type promotion happens between the
  negation and the other operation: ``-y`` on an int64 ``y`` wraps around at the minimum before
  it is promoted to ``x``'s float dtype, and ``-y`` on uint8 is ``256 - y``. A soft guard checks
  the dtypes when the graph has metadata; the domain declares it otherwise.
* ``log1p``, ``expm1``, ``rsqrt`` and ``mean`` replace a two-step computation by the fused,
  more accurate one: the values agree up to rounding (declared tolerance), on floating-point
  inputs (``x + 1`` wraps around on integers).
"""

from __future__ import annotations

import torch

import fxrewrite
from _fxrewrite_stdlib import FLOAT_DOMAIN, Guard, floating, literal_equals, view


def _same_dtype(*names: str) -> Guard:
    """The tensors ``names`` have one dtype, and it is signed (or floating). Without metadata:
    all of them are known to be floating (then mixed float dtypes promote alike either way),
    else the guard refuses (uint8 or mixed integer inputs would be wrong by 256)."""

    def guard(m: fxrewrite.Match) -> bool:
        views = [view(m, n) for n in names]
        if any(v is None for v in views):
            return all(m[n].is_floating_point() for n in names)
        return len({v.dtype for v in views}) == 1 and views[0].dtype.is_signed

    guard.__name__ = guard.__qualname__ = f"same_signed_dtype({', '.join(names)})"
    return guard


def _signed(name: str) -> Guard:
    """``name`` has a signed dtype (``-x`` on uint8 is ``256 - x``); without metadata, it is
    known to be floating, else the guard refuses."""

    def guard(m: fxrewrite.Match) -> bool:
        v = view(m, name)
        return m[name].is_floating_point() if v is None else v.dtype.is_signed

    guard.__name__ = guard.__qualname__ = f"signed({name})"
    return guard


_SAME_DTYPE_DOMAIN = {"mixed_dtypes": False, "dtypes": (torch.float32, torch.float64, torch.int64, torch.int32)}
_SMOOTH = {"rtol": 1e-5, "atol": 1e-6}


# ---- sign identities ------------------------------------------------------------------------


@fxrewrite.rule(where=_same_dtype("x", "y"), domain=_SAME_DTYPE_DOMAIN)
def add_neg(x, y):
    "Replaces x + (-y) by x - y."
    return x + torch.neg(y)


@add_neg.replacement
def add_neg(x, y):
    return x - y


@fxrewrite.rule(where=_same_dtype("x", "y"), domain=_SAME_DTYPE_DOMAIN)
def sub_neg(x, y):
    "Replaces x - (-y) by x + y."
    return x - torch.neg(y)


@sub_neg.replacement
def sub_neg(x, y):
    return x + y


@fxrewrite.rule(where=_same_dtype("x", "y"), domain=_SAME_DTYPE_DOMAIN)
def mul_neg_neg(x, y):
    "Replaces (-x) * (-y) by x * y."
    return torch.neg(x) * torch.neg(y)


@mul_neg_neg.replacement
def mul_neg_neg(x, y):
    return x * y


# Integers have no -0: (-1) / (-0) is -inf after promotion, 1 / 0 is inf. Floats only.
@fxrewrite.rule(where=floating("x", "y"), domain=FLOAT_DOMAIN)
def div_neg_neg(x, y):
    "Replaces (-x) / (-y) by x / y."
    return torch.neg(x) / torch.neg(y)


@div_neg_neg.replacement
def div_neg_neg(x, y):
    return x / y


@fxrewrite.rule(where=_signed("x"), domain={"dtypes": (torch.float32, torch.float64, torch.int64, torch.int32)})
def abs_neg(x):
    "Replaces abs(-x) by abs(x)."
    return torch.abs(torch.neg(x))


@abs_neg.replacement
def abs_neg(x):
    return torch.abs(x)


# ---- fused elementary functions -------------------------------------------------------------


@fxrewrite.rule(where=(literal_equals("one", 1), floating("x")), tolerance=_SMOOTH,
                domain={**FLOAT_DOMAIN, "literals": {"one": (1, 1.0)}})
def log1p_from_log(x, one: float):
    "Replaces log(x + 1) by log1p(x)."
    return torch.log(x + one)


@log1p_from_log.replacement
def log1p_from_log(x, one: float):
    return torch.log1p(x)


@fxrewrite.rule(where=(literal_equals("one", 1), floating("x")), tolerance=_SMOOTH,
                domain={**FLOAT_DOMAIN, "literals": {"one": (1, 1.0)}})
def expm1_from_exp(x, one: float):
    "Replaces exp(x) - 1 by expm1(x)."
    return torch.exp(x) - one


@expm1_from_exp.replacement
def expm1_from_exp(x, one: float):
    return torch.expm1(x)


# 1 / y is reciprocal(y) to the matcher, however the 1 is written (1, 1.0) and in exported
# graphs (aten.reciprocal): no literal capture needed
@fxrewrite.rule(where=floating("x"), tolerance=_SMOOTH, domain=FLOAT_DOMAIN)
def rsqrt_from_sqrt(x):
    "Replaces 1 / sqrt(x) by rsqrt(x)."
    return 1 / torch.sqrt(x)


@rsqrt_from_sqrt.replacement
def rsqrt_from_sqrt(x):
    return torch.rsqrt(x)


@fxrewrite.rule(where=floating("x"), tolerance=_SMOOTH, domain=FLOAT_DOMAIN)
def mean_from_sum(x):
    "Replaces x.sum() / x.numel() by x.mean()."
    return x.sum() / x.numel()


@mean_from_sum.replacement
def mean_from_sum(x):
    return x.mean()
