"""A user's own rules written in Python: both styles the loader understands.

* ``@fxrewrite.rule`` / ``@NAME.replacement``: a finished ``Rule`` bound at module level, with
  a guard, a declared tolerance and a declared domain for the property checker;
* a pair of module-level functions ``NAME_pattern`` / ``NAME_replacement``: the loader makes a
  rule ``NAME`` of them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import fxrewrite


def _floating(*names: str):
    """Soft guard: the tensors are floating point (or their dtype is unknown)."""

    def floating(m: fxrewrite.Match) -> bool:
        try:
            return all(m[n].dtype.is_floating_point for n in names)
        except fxrewrite.MetadataError:
            return True

    return floating


@fxrewrite.rule(where=_floating("x"), tolerance={"rtol": 1e-5, "atol": 1e-6},
                domain={"dtypes": (torch.float32, torch.float64), "max_value": 80.0})
def softplus_from_log1p_exp(x):
    "Replaces log1p(exp(x)) by softplus(x) (for x <= 80, where exp does not overflow in float32)."
    return torch.log1p(torch.exp(x))


@softplus_from_log1p_exp.replacement
def softplus_from_log1p_exp(x):
    return F.softplus(x)


@fxrewrite.rule(where=_floating("x", "y"), tolerance={"rtol": 1e-5, "atol": 1e-6},
                domain={"dtypes": (torch.float32, torch.float64), "mixed_dtypes": False})
def residual_axpy(x, y, s: float):
    "Replaces x + y * s by torch.add(x, y, alpha=s) (one kernel instead of two)."
    return x + y * s


@residual_axpy.replacement
def residual_axpy(x, y, s: float):
    return torch.add(x, y, alpha=s)


def clamp_both_pattern(x, low: float, high: float):
    "Replaces clamp_max(clamp_min(x, low), high) by clamp(x, low, high)."
    return torch.clamp_max(torch.clamp_min(x, low), high)


def clamp_both_replacement(x, low: float, high: float):
    return torch.clamp(x, low, high)
