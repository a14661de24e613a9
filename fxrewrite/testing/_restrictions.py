"""A restriction of a rule's inputs, as a value: what it restricts (the rule's tensor arguments)
and the bound or relation, one class per family (:class:`DtypeRestriction`,
:class:`ShapeRestriction`, :class:`RankRestriction`, :class:`LayoutRestriction`,
:class:`ValueRestriction`). A restriction evaluates directly (:meth:`Restriction.admits` on
concrete inputs, :meth:`Restriction.holds` on a match, :meth:`Restriction.guard` as a ``where=``
guard) and renders as the text a report shows (:meth:`Restriction.python`,
:meth:`Restriction.dsl`); nothing is evaluated from text. :mod:`fxrewrite.testing.repair`
searches combinations of them for the weakest that makes an unsound rule pass.

>>> import torch
>>> rank = RankRestriction(("x", "y"), at_least=2)
>>> rank.label, rank.dsl()
('at least 2 dimensions', 'x.dim() >= 2 and y.dim() >= 2')
>>> rank.admits({"x": torch.ones(2, 3), "y": torch.ones(3)})
False
>>> print(rank.python())
lambda m: all(m[n].dim() >= 2 for n in ("x", "y"))
>>> ValueRestriction(("x",), sign="positive", bound=1e3, finite=True).narrow({"dtypes": (torch.float32,)})
{'dtypes': (torch.float32,), 'min_value': 1.1754943508222875e-38, 'max_value': 1000.0, 'special_values': False}
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

import attrs
import torch

from .strategies import DEFAULT_DTYPES

__all__ = [
    "DtypeRestriction",
    "LayoutRestriction",
    "RankRestriction",
    "Restriction",
    "RestrictionGuard",
    "ShapeRestriction",
    "ValueRestriction",
]


@attrs.frozen
class Restriction:
    """One restriction of a rule's tensor arguments ``names``; a subclass per family says what
    is restricted and how.

    ``admits(inputs)`` says whether concrete inputs satisfy it; ``enforced`` restrictions (the
    graph's metadata can tell) also evaluate on a match (``holds(match)``), which is what the
    ``where=`` guard of a repaired rule does (``guard()``), and render as that guard's Python
    source (``python()``) and as a ``.fxr`` ``where`` clause (``dsl()``); ``narrow(domain)`` is
    the rule's ``domain`` narrowed so that the checker draws only admitted inputs (``None``
    when nothing is left).
    """

    names: tuple[str, ...]
    family: ClassVar[str] = ""
    #: True when a ``where=`` guard enforces it at rewrite time (from the graph's metadata).
    enforced: ClassVar[bool] = False

    @property
    def label(self) -> str:
        raise NotImplementedError

    def admits(self, inputs: Mapping[str, Any]) -> bool:
        """Whether the tensors among ``inputs`` satisfy the restriction."""
        return self._holds_for([inputs[n] for n in self.names if isinstance(inputs.get(n), torch.Tensor)])

    def holds(self, match: Any) -> bool:
        """Whether a match's tensor values satisfy it, as the graph's metadata shows them."""
        if not self.enforced:
            raise TypeError(f"restriction '{self.label}' cannot be read from a match (the graph does not know "
                            f"values or layouts); it can only be declared as a domain.")
        return self._holds_for([match[n] for n in self.names])

    def guard(self) -> RestrictionGuard | None:
        """The ``where=`` guard enforcing it, ``None`` when the graph cannot tell."""
        return RestrictionGuard(self) if self.enforced else None

    def python(self) -> str | None:
        """The source of a ``where=`` lambda enforcing it, ``None`` when the graph cannot tell."""
        return None

    def dsl(self) -> str | None:
        """The same condition as a ``.fxr`` ``where`` clause, ``None`` when the graph cannot tell."""
        return None

    def narrow(self, domain: dict[str, Any]) -> dict[str, Any] | None:
        raise NotImplementedError

    def _holds_for(self, values: Sequence[Any]) -> bool:
        """The condition on the restricted values (tensors, or a match's views of them)."""
        raise NotImplementedError


class RestrictionGuard:
    """A restriction as a ``where=`` guard: ``guard(match) -> bool``, named by its ``.fxr`` text."""

    def __init__(self, restriction: Restriction) -> None:
        self.restriction = restriction
        self.__name__ = self.__qualname__ = f"'where {restriction.dsl()}' (repair)"  # what reports name it by

    def __call__(self, match: Any) -> bool:
        return self.restriction.holds(match)

    def __repr__(self) -> str:
        return f"<guard {self.__qualname__}>"


def _names_tuple(names: Sequence[str]) -> str:
    return "(" + ", ".join(f'"{n}"' for n in names) + ("," if len(names) == 1 else "") + ")"


DtypeKind = Literal["not bool", "floating or bool", "floating"]
#: Per kind of dtype restriction: its label, the dtypes it keeps, and the same as text (``{v}``: the value).
_DTYPE_KINDS: Mapping[str, tuple[str, Any, str]] = {
    "not bool": ("no bool tensors", lambda d: d != torch.bool, "{v}.dtype != torch.bool"),
    "floating or bool": ("no integer tensors", lambda d: d.is_floating_point or d == torch.bool,
                         "({v}.dtype.is_floating_point or {v}.dtype == torch.bool)"),
    "floating": ("floating dtypes only", lambda d: d.is_floating_point, "{v}.dtype.is_floating_point"),
}


@attrs.frozen
class DtypeRestriction(Restriction):
    """The arguments' dtypes: ``keep`` is which (not bool; floating or bool; floating)."""

    keep: DtypeKind = "not bool"
    family: ClassVar[str] = "dtype"
    enforced: ClassVar[bool] = True

    @property
    def label(self) -> str:
        return _DTYPE_KINDS[self.keep][0]

    def keeps(self, dtype: torch.dtype) -> bool:
        return bool(_DTYPE_KINDS[self.keep][1](dtype))

    def _holds_for(self, values: Sequence[Any]) -> bool:
        return all(self.keeps(v.dtype) for v in values)

    def python(self) -> str:
        return f"lambda m: all({_DTYPE_KINDS[self.keep][2].format(v='m[n]')} for n in {_names_tuple(self.names)})"

    def dsl(self) -> str:
        return " and ".join(_DTYPE_KINDS[self.keep][2].format(v=n) for n in self.names)

    def narrow(self, domain: dict[str, Any]) -> dict[str, Any] | None:
        declared = domain.get("dtypes", DEFAULT_DTYPES)
        dtypes = tuple(d for d in ((declared,) if isinstance(declared, torch.dtype) else declared) if self.keeps(d))
        return {**domain, "dtypes": dtypes} if dtypes else None


@attrs.frozen
class ShapeRestriction(Restriction):
    """All the arguments of one shape (no broadcasting between them)."""

    family: ClassVar[str] = "shape"
    enforced: ClassVar[bool] = True

    @property
    def label(self) -> str:
        return "all tensor arguments of one shape (no broadcasting)"

    def _holds_for(self, values: Sequence[Any]) -> bool:
        return len({tuple(v.shape) for v in values}) <= 1

    def python(self) -> str:
        return f"lambda m: len({{tuple(m[n].shape) for n in {_names_tuple(self.names)}}}) == 1"

    def dsl(self) -> str:
        return " and ".join(f"{a}.shape == {b}.shape" for a, b in itertools.pairwise(self.names))

    def narrow(self, domain: dict[str, Any]) -> dict[str, Any] | None:
        return {**domain, "shapes": "equal"}


@attrs.frozen
class RankRestriction(Restriction):
    """Every argument with at least ``at_least`` dimensions."""

    at_least: int = 1
    family: ClassVar[str] = "rank"
    enforced: ClassVar[bool] = True

    @property
    def label(self) -> str:
        return f"at least {self.at_least} dimension{'s' if self.at_least > 1 else ''}"

    def _holds_for(self, values: Sequence[Any]) -> bool:
        return all(v.dim() >= self.at_least for v in values)

    def python(self) -> str:
        return f"lambda m: all(m[n].dim() >= {self.at_least} for n in {_names_tuple(self.names)})"

    def dsl(self) -> str:
        return " and ".join(f"{n}.dim() >= {self.at_least}" for n in self.names)

    def narrow(self, domain: dict[str, Any]) -> dict[str, Any] | None:
        low, high = domain.get("ranks", (0, 4))
        return {**domain, "ranks": (max(low, self.at_least), high)} if max(low, self.at_least) <= high else None


@attrs.frozen
class LayoutRestriction(Restriction):
    """Contiguous arguments (a domain declaration: the graph does not know layouts)."""

    family: ClassVar[str] = "layout"

    @property
    def label(self) -> str:
        return "contiguous inputs"

    def _holds_for(self, values: Sequence[Any]) -> bool:
        return all(v.is_contiguous() for v in values)

    def narrow(self, domain: dict[str, Any]) -> dict[str, Any] | None:
        return {**domain, "non_contiguous": False}


#: The smallest positive normal float32: the lower bound of ``x > 0``.
_TINY = torch.finfo(torch.float32).tiny


@attrs.frozen
class ValueRestriction(Restriction):
    """The arguments' values (a domain declaration: the graph does not know values): ``sign``
    (any, ``x >= 0``, ``x > 0``), ``bound`` (``|x| <= bound``, or ``x <= bound`` with a sign;
    ``None``: unbounded) and ``finite`` (no nan or inf). The bounds apply to finite values."""

    sign: Literal["any", "non-negative", "positive"] = "any"
    bound: float | None = None
    finite: bool = False
    family: ClassVar[str] = "values"

    @property
    def low(self) -> float | None:
        if self.sign == "any":
            return None if self.bound is None else -self.bound
        return 0.0 if self.sign == "non-negative" else _TINY

    @property
    def high(self) -> float | None:
        return self.bound

    @property
    def label(self) -> str:
        if self.sign == "any" and self.bound is None:
            return "finite values (no nan or inf)" if self.finite else "any values"
        if self.sign == "any":
            text = f"|x| <= {self.bound:g}"
        elif self.bound is None:
            text = "x >= 0" if self.sign == "non-negative" else "x > 0"
        else:
            text = f"{'0 <= x' if self.sign == 'non-negative' else '0 < x'} <= {self.bound:g}"
        return f"finite, {text}" if self.finite else text

    def _holds_for(self, values: Sequence[Any]) -> bool:
        low = -math.inf if self.low is None else self.low
        high = math.inf if self.high is None else self.high
        return all(_within(t, low, high) and (not self.finite or _finite(t)) for t in values)

    def narrow(self, domain: dict[str, Any]) -> dict[str, Any] | None:
        out = dict(domain)
        if self.low is not None:
            out["min_value"] = self.low if domain.get("min_value") is None else max(self.low, domain["min_value"])
        if self.high is not None:
            out["max_value"] = self.high if domain.get("max_value") is None else min(self.high, domain["max_value"])
        if self.finite:
            out["special_values"] = False
        low, high = out.get("min_value"), out.get("max_value")
        return None if low is not None and high is not None and low > high else out


def _finite(t: torch.Tensor) -> bool:
    return bool(torch.isfinite(t).all()) if t.dtype.is_floating_point else True


def _within(t: torch.Tensor, low: float, high: float) -> bool:
    """Every finite value of ``t`` in ``[low, high]`` (non-finite values are another matter)."""
    values = t.detach().double() if t.dtype != torch.bool else t.to(torch.float64)
    finite = values[torch.isfinite(values)]
    return bool(((finite >= low) & (finite <= high)).all())
