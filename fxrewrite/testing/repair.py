"""Repair an unsound rule: the weakest restriction under which the checker finds no counterexample.

:func:`repair_rule` searches a small lattice of restrictions, weakest first: dtypes (no bool, no
integers, floating dtypes only), shapes (no broadcasting between arguments), rank (at least
``k`` dimensions), layout (contiguous inputs) and values (finite, ``|x| <= bound``, ``x >= 0``,
``x > 0``), and combinations of two or three of them. Restrictions on dtypes, shapes and ranks
become ``where=`` guards, so that the repaired rule is enforced at rewrite time (they read graph
metadata); layout and value restrictions can only be declared as a ``domain=`` (the graph does
not know values): the rule's user must make sure such inputs cannot occur.

A restriction is a value (:class:`~fxrewrite.testing._restrictions.Restriction`: what it
restricts and the bound or relation), evaluated directly and rendered as the text the report
shows; nothing is evaluated from text.

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
from typing import Any, Protocol

import attrs

from ..rule import Rule
from ._report import CheckResult
from ._restrictions import (
    DtypeRestriction,
    LayoutRestriction,
    RankRestriction,
    Restriction,
    RestrictionGuard,
    ShapeRestriction,
    ValueRestriction,
)

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


# -- the lattice ---------------------------------------------------------------------------------


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
