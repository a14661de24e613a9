"""Repair an unsound rule: the weakest restriction under which the checker finds no counterexample.

:func:`repair_rule` searches a small lattice of restrictions, weakest first: dtypes (no bool, no
integers, floating dtypes only), shapes (no broadcasting between arguments), rank (at least
``k`` dimensions), layout (contiguous inputs) and values (finite, ``|x| <= bound``, ``x >= 0``,
``x > 0``), and combinations of two or three of them. Restrictions on dtypes, shapes and ranks
become ``where=`` guards, so that the repaired rule is enforced at rewrite time (they read graph
metadata); layout and value restrictions can only be declared as a ``domain=`` (the graph does
not know values): the rule's user must make sure such inputs cannot occur.

A restriction is a value (:class:`Restriction`: what it restricts and the bound or relation),
evaluated directly (:meth:`Restriction.admits` on concrete inputs, :meth:`Restriction.holds` on a
match) and rendered as the text the report shows (:meth:`Restriction.python`,
:meth:`Restriction.dsl`); nothing is evaluated from text.

The search is cheap: a candidate that admits a counterexample already seen is skipped without
running anything, and each remaining candidate gets a short search; the first one that passes
is verified by a second, larger search with other examples. Every counterexample found on the
way prunes the candidates after it. The candidates are checked by the checker handed in
(``check=``, :func:`~fxrewrite.testing.check_rule`, which is how the check asks for a repair).

>>> import torch
>>> from fxrewrite import Rule
>>> from fxrewrite.testing import check_rule
>>> result = check_rule(Rule.from_functions(lambda x: x * 1, lambda x: x, name="mul_one"))
>>> print(result.repair_code)
where=lambda m: all(m[n].dtype != torch.bool for n in ("x",)),
>>> check_rule(result.repair).ok
True
>>> RankRestriction(("x", "y"), at_least=2).dsl()
'x.dim() >= 2 and y.dim() >= 2'
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar, Literal, Protocol

import attrs
import torch

from ..rule import Rule
from ._report import CheckResult
from .strategies import DEFAULT_DTYPES

__all__ = [
    "VALUE_BOUNDS",
    "DtypeRestriction",
    "LayoutRestriction",
    "RankRestriction",
    "Repair",
    "Restriction",
    "RestrictionGuard",
    "ShapeRestriction",
    "ValueRestriction",
    "repair_report",
    "repair_rule",
    "restrictions_for",
]

logger = logging.getLogger(__name__)

#: Bounds tried for ``|x| <= bound``, loosest first.
VALUE_BOUNDS: tuple[float, ...] = (1e15, 1e6, 1e3, 1.0)

#: Examples of each candidate's search, and of the verification of the one that passes.
CANDIDATE_EXAMPLES = 30
VERIFY_EXAMPLES = 100
#: Candidates searched (after pruning) before giving up.
MAX_SEARCHES = 12


# -- restrictions --------------------------------------------------------------------------------


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


def _value_family(names: tuple[str, ...]) -> list[Restriction]:
    out: list[Restriction] = [ValueRestriction(names, finite=True)]
    for bound in VALUE_BOUNDS:
        out += [ValueRestriction(names, bound=bound), ValueRestriction(names, bound=bound, finite=True)]
    for sign in ("non-negative", "positive"):
        out += [ValueRestriction(names, sign=sign), ValueRestriction(names, sign=sign, finite=True)]
    out += [ValueRestriction(names, sign="positive", bound=bound, finite=True) for bound in VALUE_BOUNDS]
    return out


def restrictions_for(rule: Rule) -> dict[str, list[Restriction]]:
    """The lattice for ``rule``: per family, its restrictions from weakest to strongest."""
    names = tuple(p.name for p in rule.compiled.params if p.kind == "tensor")
    families: dict[str, list[Restriction]] = {
        "dtype": [DtypeRestriction(names, keep) for keep in ("not bool", "floating or bool", "floating")],
        "shape": [ShapeRestriction(names)] if len(names) >= 2 else [],
        "rank": [RankRestriction(names, k) for k in (1, 2)],
        "layout": [LayoutRestriction(names)],
        "values": _value_family(names),
    }
    return {family: chain for family, chain in families.items() if chain}


def candidates(rule: Rule, max_families: int = 3) -> Iterator[tuple[Restriction, ...]]:
    """Combinations of restrictions, one per family at most, weakest first: fewer families
    first, then the lower the positions in their chains, guards before domain declarations."""
    lattice = restrictions_for(rule)
    order = list(lattice)
    combos: list[tuple[tuple[int, int, int], tuple[Restriction, ...]]] = []
    for count in range(1, min(max_families, len(order)) + 1):
        for families in itertools.combinations(order, count):
            for positions in itertools.product(*(range(len(lattice[f])) for f in families)):
                chosen = tuple(lattice[f][i] for f, i in zip(families, positions))
                untestable_only = sum(not r.enforced for r in chosen)
                combos.append(((count, sum(positions) + untestable_only, untestable_only), chosen))
    combos.sort(key=lambda c: c[0])
    return (chosen for _, chosen in combos)


# -- the repaired rule ---------------------------------------------------------------------------


@attrs.frozen(eq=False)
class Repair:
    """A restricted rule the checker found sound, and how to write it."""

    rule: Rule
    restrictions: tuple[Restriction, ...]
    examples: int
    domain: Mapping[str, Any]

    @property
    def label(self) -> str:
        return " and ".join(r.label for r in self.restrictions)

    @property
    def enforced(self) -> bool:
        """True when every restriction is a guard (checked at rewrite time)."""
        return all(r.enforced for r in self.restrictions)

    def code(self) -> str:
        """The ``where=`` and ``domain=`` arguments to paste into the rule's definition."""
        lines = []
        guards = [text for text in (r.python() for r in self.restrictions) if text is not None]
        own = "  # in addition to the rule's own guards" if len(self.rule.where) > len(guards) else ""
        if len(guards) == 1:
            lines.append(f"where={guards[0]},{own}")
        elif guards:
            lines.append("where=(" + ", ".join(guards) + f"),{own}")
        if not self.enforced:
            shown = {k: v for k, v in self.domain.items() if k in _PRINTABLE_DOMAIN_KEYS}
            rest = "  # and the rule's other domain keys" if len(shown) < len(self.domain) else ""
            lines.append(f"domain={_show_domain(shown)},{rest}")
        return "\n".join(lines)

    def dsl(self) -> str:
        """The same for a ``.fxr`` rule: a ``where`` line for the guards, a ``domain`` line for
        the declarations (it replaces the rule's own ``domain`` line: a setting may be declared
        once)."""
        lines = []
        conditions = [text for text in (r.dsl() for r in self.restrictions) if text]
        if conditions:
            lines.append("where " + " and ".join(conditions))
        if not self.enforced:
            shown = {k: v for k, v in self.domain.items() if k in _PRINTABLE_DOMAIN_KEYS}
            lines.append("domain " + ", ".join(f"{k}={_show_value(v)}" for k, v in shown.items()))
        return "\n".join(lines)


_PRINTABLE_DOMAIN_KEYS = ("dtypes", "ranks", "sides", "shapes", "mixed_dtypes", "non_contiguous", "min_value",
                          "max_value", "special_values")


def _show_domain(domain: Mapping[str, Any]) -> str:
    return "{" + ", ".join(f'"{k}": {_show_value(v)}' for k, v in domain.items()) + "}"


def _show_value(value: Any) -> str:
    """``1e+15`` rather than ``1000000000000000.0``, when that is the same float."""
    if isinstance(value, float) and math.isfinite(value) and float(f"{value:g}") == value:
        return f"{value:g}" if ("e" in f"{value:g}" or "." in f"{value:g}") else f"{value:g}.0"
    if isinstance(value, tuple):
        return "(" + ", ".join(map(_show_value, value)) + ("," if len(value) == 1 else "") + ")"
    return repr(value)


def repair_report(fixed: Repair | None) -> str:
    """The report's ``repair:`` lines: the restricted rule as code to paste (and as a ``.fxr``
    ``where`` line when guards alone restrict it), or that none was found."""
    if fixed is None:
        return ("  repair:      none found: no restriction of dtypes, shapes, rank, layout or values tried makes "
                "the rule sound; fix the replacement.")
    if fixed.enforced:
        how = "enforced at rewrite time by a guard on the graph's metadata"
    elif any(r.enforced for r in fixed.restrictions):
        how = ("the guard is enforced at rewrite time, the domain only the checker sees: make sure other "
               "inputs cannot occur")
    else:
        how = "declared as a domain, which only the checker sees: make sure other inputs cannot occur"
    lines = [f"  repair:      restricted to {fixed.label}, the checker finds no counterexample in "
             f"{fixed.examples} examples ({how}):",
             *(f"                 {line}" for line in fixed.code().splitlines())]
    first, *more = fixed.dsl().splitlines()
    lines.append(f"               or, in a .fxr file:  {first}")
    lines += [f"                                    {line}" for line in more]
    return "\n".join(lines)


# -- the search ----------------------------------------------------------------------------------


class Checker(Protocol):
    """What checks a candidate: :func:`fxrewrite.testing.check_rule`."""

    def __call__(self, rule: Rule, *, max_examples: int, seed: int | None, repair: bool) -> CheckResult: ...


def _restricted(rule: Rule, chosen: Sequence[Restriction]) -> tuple[Rule, dict[str, Any]] | None:
    domain: dict[str, Any] | None = dict(rule.domain or {})
    for restriction in chosen:
        domain = restriction.narrow(domain) if domain is not None else None
    if domain is None:
        return None
    guards = tuple(guard for guard in (r.guard() for r in chosen) if guard is not None)
    return attrs.evolve(rule, where=(*rule.where, *guards), domain=domain), domain


def repair_rule(rule: Rule, counterexamples: Sequence[Mapping[str, Any]], *, check: Checker,
                seed: int | None = None, examples: int = CANDIDATE_EXAMPLES, verify_examples: int = VERIFY_EXAMPLES,
                max_searches: int = MAX_SEARCHES) -> Repair | None:
    """The weakest restriction of ``rule`` under which ``check`` (the checker,
    :func:`~fxrewrite.testing.check_rule`) finds no counterexample, as a :class:`Repair`;
    ``None`` when no candidate in the lattice passes within ``max_searches`` searches.
    ``counterexamples`` are inputs already known to break the rule (candidates admitting one of
    them are skipped without a search)."""
    known = [dict(c) for c in counterexamples]
    searches = 0
    verify_seed = 1 if seed is None else seed + 1
    for chosen in candidates(rule):
        if any(all(r.admits(c) for r in chosen) for c in known):
            continue
        restricted = _restricted(rule, chosen)
        if restricted is None:
            continue
        if searches >= max_searches:
            return None
        searches += 1
        candidate, domain = restricted
        try:
            result = check(candidate, max_examples=examples, seed=seed, repair=False)
            if result.ok:
                result = check(candidate, max_examples=verify_examples, seed=verify_seed, repair=False)
                if result.ok:
                    return Repair(candidate, tuple(chosen), result.examples_run, domain)
        except Exception as exc:  # e.g. the narrowed domain contradicts a per-input one: no values left
            logger.debug("repair of %s: candidate %s cannot be checked: %s", rule.name,
                         " and ".join(r.label for r in chosen), exc)
            continue
        known += [dict(c.inputs) for c in result.counterexamples]
    return None
