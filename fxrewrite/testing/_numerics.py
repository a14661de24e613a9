"""A rule's numerics contract, enforced: how close the replacement's values must be to the
pattern's (see :data:`fxrewrite.rule.NUMERICS`).

* ``tolerance`` (the default): :func:`fxrewrite.verify.compare` with the declared tolerance, or
  ``torch.testing.assert_close``'s default for the output's dtype;
* ``bitwise``: the same values, ``nan`` where ``nan``, the same sign of zero;
* ``ulp:K``: every value within ``K`` units in the last place of the pattern's (``inf`` equals
  only ``inf``, ``nan`` only ``nan``);
* ``as-precise``: every value at least as close as the pattern's to the *reference*, the pattern
  computed on the inputs in float64 (floating tensors, floating ``torch.dtype`` captures and
  modules upcast), give or take half a unit in the last place of the output's dtype.

Structure, shape and dtype are compared first, as ``compare`` does; only the values' rule
changes. A value problem always says ``values differ``, so a counterexample's kind stays
``values``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch

from ..rule import Rule
from ..verify import compare
from ._running import call_rule_function

__all__ = ["values_problem"]

_NAMES = ("pattern", "replacement")


def values_problem(rule: Rule, inputs: Mapping[str, Any], expected: Any, actual: Any,
                   rtol: float | None, atol: float | None) -> str | None:
    """What breaks ``rule``'s numerics contract between the pattern's ``expected`` and the
    replacement's ``actual`` outputs on ``inputs``; ``None`` when nothing does."""
    contract = rule.numerics or "tolerance"
    if contract == "tolerance":
        return compare(expected, actual, rtol=rtol, atol=atol, names=_NAMES)
    exact = compare(expected, actual, rtol=0.0, atol=0.0, names=_NAMES)
    if exact is not None and "values differ" not in exact:
        return exact  # structure, shape or dtype
    pairs = list(_float_pairs(expected, actual))
    if contract == "bitwise":
        return exact or _signed_zero_problem(pairs)
    if exact is None:
        return None
    if contract.startswith("ulp:"):
        return _ulp_problem(pairs, int(contract.partition(":")[2])) or _non_float_problem(expected, actual)
    reference = _reference(rule, inputs)
    if reference is None:  # the pattern does not run in float64 here: only exact agreement is as precise
        return exact
    return _precision_problem(pairs, list(_float_leaves(reference))) or _non_float_problem(expected, actual)


def _float_leaves(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _float_leaves(v)


def _float_pairs(expected: Any, actual: Any) -> Any:
    for e, a in zip(_float_leaves(expected), _float_leaves(actual)):
        yield e.detach(), a.detach()


def _non_float_problem(expected: Any, actual: Any) -> str | None:
    """Integer and bool outputs stay exact under every contract."""
    for e, a in _float_pairs(expected, actual):
        if not e.dtype.is_floating_point and not torch.equal(e, a):
            return compare(e, a, rtol=0.0, atol=0.0, names=_NAMES)
    return None


def _first(mask: torch.Tensor) -> tuple[int, ...]:
    index = int(mask.reshape(-1).nonzero()[0])
    out = []
    for size in reversed(mask.shape):
        out.append(index % size)
        index //= size
    return tuple(reversed(out))


def _signed_zero_problem(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> str | None:
    for e, a in pairs:
        if e.dtype.is_floating_point:
            wrong = (e == 0) & (a == 0) & (torch.signbit(e) != torch.signbit(a))
            if bool(wrong.any()):
                at = _first(wrong)
                return (f"values differ in the sign of zero at {int(wrong.sum())} of {e.numel()} elements (numerics "
                        f"bitwise): at index {at} pattern {e[at].item()}, replacement {a[at].item()}")
    return None


def _ulps(reference: torch.Tensor) -> torch.Tensor:
    """The spacing of ``reference``'s dtype at each of its values, in float64."""
    magnitude = reference.abs()
    up = torch.nextafter(magnitude, torch.full_like(magnitude, float("inf")))
    return (up.double() - magnitude.double()).nan_to_num(posinf=float("inf"))


def _disagree(e: torch.Tensor, a: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Elements where ``e`` and ``a`` differ, unless both are finite and ``allowed`` there."""
    same = (e == a) | (e.isnan() & a.isnan())
    return ~same & ~(e.isfinite() & a.isfinite() & allowed)


def _ulp_problem(pairs: list[tuple[torch.Tensor, torch.Tensor]], k: int) -> str | None:
    for e, a in pairs:
        if not e.dtype.is_floating_point:
            continue
        distance = (a.double() - e.double()).abs()
        spacing = _ulps(e)
        wrong = _disagree(e, a, distance <= k * spacing)
        if bool(wrong.any()):
            at = _first(wrong)
            off = float(distance[at] / spacing[at]) if bool(spacing[at] > 0) else float("inf")
            return (f"values differ by more than {k} ulp at {int(wrong.sum())} of {e.numel()} elements (numerics "
                    f"ulp:{k}): at index {at} pattern {e[at].item()}, replacement {a[at].item()} ({off:.3g} ulp)")
    return None


def _precision_problem(pairs: list[tuple[torch.Tensor, torch.Tensor]], reference: list[torch.Tensor]) -> str | None:
    for (e, a), r in zip(pairs, reference):
        if not e.dtype.is_floating_point or r.shape != e.shape:
            continue
        r64, e64, a64 = r.detach().double(), e.double(), a.double()
        inf = float("inf")
        # an error is 0 where a value is the reference (inf too), inf where it is nan and the reference is not
        pattern_error = torch.where(e64 == r64, 0.0, (e64 - r64).abs()).nan_to_num(nan=inf)
        replacement_error = torch.where(a64 == r64, 0.0, (a64 - r64).abs()).nan_to_num(nan=inf)
        same = (e == a) | (e.isnan() & a.isnan())
        wrong = ~(same | r64.isnan() | (replacement_error <= pattern_error + _ulps(e) / 2))
        if bool(wrong.any()):
            at = _first(wrong)
            return (f"values differ and are less precise at {int(wrong.sum())} of {e.numel()} elements (numerics "
                    f"as-precise): at index {at} pattern {e[at].item()}, replacement {a[at].item()}, the pattern "
                    f"in float64 {r64[at].item()}")
    return None


def _upcast(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dtype.is_floating_point:
        return value.double()
    if isinstance(value, torch.dtype) and value.is_floating_point:
        return torch.float64
    if isinstance(value, torch.nn.Module):
        return copy.deepcopy(value).double()
    return value


def _reference(rule: Rule, inputs: Mapping[str, Any]) -> Any:
    """The pattern computed on ``inputs`` upcast to float64; ``None`` when it does not run so."""
    try:
        return call_rule_function(rule.pattern, {k: _upcast(v) for k, v in inputs.items()})[0]
    except Exception:
        return None
