"""Repair an unsound rule: the weakest restriction under which the checker finds no counterexample.

:func:`repair_rule` searches a small lattice of restrictions, weakest first: dtypes (no bool, no
integers, floating dtypes only), shapes (no broadcasting between arguments), rank (at least
``k`` dimensions), layout (contiguous inputs) and values (finite, ``|x| <= bound``, ``x >= 0``,
``x > 0``), and combinations of two or three of them. Restrictions on dtypes, shapes and ranks
become ``where=`` guards, so that the repaired rule is enforced at rewrite time (they read graph
metadata); layout and value restrictions can only be declared as a ``domain=`` (the graph does
not know values): the rule's user must make sure such inputs cannot occur.

The search is cheap: a candidate that admits a counterexample already seen is skipped without
running anything, and each remaining candidate gets a short search; the first one that passes
is verified by a second, larger search with other examples. Every counterexample found on the
way prunes the candidates after it.

>>> import torch
>>> from fxrewrite import Rule
>>> from fxrewrite.testing import check_rule
>>> result = check_rule(Rule.from_functions(lambda x: x * 1, lambda x: x, name="mul_one"))
>>> print(result.repair_code)
where=lambda m: all(m[n].dtype != torch.bool for n in ("x",)),
>>> check_rule(result.repair).ok
True
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import attrs
import torch

from ..rule import Rule
from .strategies import DEFAULT_DTYPES

__all__ = ["VALUE_BOUNDS", "Repair", "Restriction", "repair_rule", "restrictions_for"]

logger = logging.getLogger(__name__)

#: Bounds tried for ``|x| <= bound``, loosest first.
VALUE_BOUNDS: tuple[float, ...] = (1e15, 1e6, 1e3, 1.0)

#: Examples of each candidate's search, and of the verification of the one that passes.
CANDIDATE_EXAMPLES = 30
VERIFY_EXAMPLES = 100
#: Candidates searched (after pruning) before giving up.
MAX_SEARCHES = 12


@attrs.frozen
class Restriction:
    """One restriction of a rule's inputs.

    ``admits(inputs, names)`` says whether concrete inputs satisfy it (``names``: the rule's
    tensor parameters); ``guard`` is the source of a ``where=`` lambda enforcing it (``None``
    when the graph cannot tell, e.g. for values), ``dsl`` the same as a ``.fxr`` ``where``
    clause, and ``narrow(domain)`` the rule's ``domain`` narrowed so that the checker draws
    only admitted inputs (``None`` when nothing is left).
    """

    family: str
    label: str
    admits: Callable[[Mapping[str, Any], Sequence[str]], bool]
    narrow: Callable[[dict[str, Any]], dict[str, Any] | None]
    guard: str | None = None
    dsl: str | None = None


def _tensors(inputs: Mapping[str, Any], names: Sequence[str]) -> list[torch.Tensor]:
    return [inputs[n] for n in names if isinstance(inputs.get(n), torch.Tensor)]


def _names_tuple(names: Sequence[str]) -> str:
    return "(" + ", ".join(f'"{n}"' for n in names) + ("," if len(names) == 1 else "") + ")"


def _each(names: Sequence[str], template: str, joiner: str = " and ") -> str:
    return joiner.join(template.format(n=n) for n in names)


# -- the families --------------------------------------------------------------------------------


def _dtype_restriction(label: str, keep: Callable[[torch.dtype], bool], test: str, dsl: str,
                       names: Sequence[str]) -> Restriction:
    def narrow(domain: dict[str, Any]) -> dict[str, Any] | None:
        declared = domain.get("dtypes", DEFAULT_DTYPES)
        dtypes = tuple(d for d in ((declared,) if isinstance(declared, torch.dtype) else declared) if keep(d))
        return {**domain, "dtypes": dtypes} if dtypes else None

    return Restriction(
        "dtype", label, lambda inputs, names: all(keep(t.dtype) for t in _tensors(inputs, names)), narrow,
        guard=f"lambda m: all({test.format(v='m[n]')} for n in {_names_tuple(names)})",
        dsl=_each(names, dsl),
    )


def _dtype_family(names: Sequence[str]) -> list[Restriction]:
    return [
        _dtype_restriction("no bool tensors", lambda d: d != torch.bool, "{v}.dtype != torch.bool",
                           "{n}.dtype != torch.bool", names),
        _dtype_restriction("no integer tensors", lambda d: d.is_floating_point or d == torch.bool,
                           "({v}.dtype.is_floating_point or {v}.dtype == torch.bool)",
                           "({n}.dtype.is_floating_point or {n}.dtype == torch.bool)", names),
        _dtype_restriction("floating dtypes only", lambda d: d.is_floating_point, "{v}.dtype.is_floating_point",
                           "{n}.dtype.is_floating_point", names),
    ]


def _shape_family(names: Sequence[str]) -> list[Restriction]:
    if len(names) < 2:
        return []
    return [Restriction(
        "shape", "all tensor arguments of one shape (no broadcasting)",
        lambda inputs, names: len({tuple(t.shape) for t in _tensors(inputs, names)}) <= 1,
        lambda domain: {**domain, "shapes": "equal"},
        guard=f"lambda m: len({{tuple(m[n].shape) for n in {_names_tuple(names)}}}) == 1",
        dsl=" and ".join(f"{a}.shape == {b}.shape" for a, b in itertools.pairwise(names)),
    )]


def _rank_restriction(k: int, names: Sequence[str]) -> Restriction:
    def narrow(domain: dict[str, Any]) -> dict[str, Any] | None:
        low, high = domain.get("ranks", (0, 4))
        return {**domain, "ranks": (max(low, k), high)} if max(low, k) <= high else None

    return Restriction(
        "rank", f"at least {k} dimension{'s' if k > 1 else ''}",
        lambda inputs, names: all(t.dim() >= k for t in _tensors(inputs, names)), narrow,
        guard=f"lambda m: all(m[n].dim() >= {k} for n in {_names_tuple(names)})",
        dsl=_each(names, f"{{n}}.dim() >= {k}"),
    )


def _layout_family(names: Sequence[str]) -> list[Restriction]:
    return [Restriction(
        "layout", "contiguous inputs",
        lambda inputs, names: all(t.is_contiguous() for t in _tensors(inputs, names)),
        lambda domain: {**domain, "non_contiguous": False},
    )]


def _finite(t: torch.Tensor) -> bool:
    return bool(torch.isfinite(t).all()) if t.dtype.is_floating_point else True


def _within(t: torch.Tensor, low: float, high: float) -> bool:
    """Every finite value of ``t`` in ``[low, high]`` (non-finite values are another matter)."""
    values = t.detach().double() if t.dtype != torch.bool else t.to(torch.float64)
    finite = values[torch.isfinite(values)]
    return bool(((finite >= low) & (finite <= high)).all())


def _value_restriction(label: str, low: float | None, high: float | None, finite: bool) -> Restriction:
    lo = -math.inf if low is None else low
    hi = math.inf if high is None else high

    def admits(inputs: Mapping[str, Any], names: Sequence[str]) -> bool:
        return all(_within(t, lo, hi) and (not finite or _finite(t)) for t in _tensors(inputs, names))

    def narrow(domain: dict[str, Any]) -> dict[str, Any] | None:
        out = dict(domain)
        if low is not None:
            out["min_value"] = low if domain.get("min_value") is None else max(low, domain["min_value"])
        if high is not None:
            out["max_value"] = high if domain.get("max_value") is None else min(high, domain["max_value"])
        if finite:
            out["special_values"] = False
        low_, high_ = out.get("min_value"), out.get("max_value")
        return None if low_ is not None and high_ is not None and low_ > high_ else out

    return Restriction("values", label, admits, narrow)


def _value_family() -> list[Restriction]:
    out = [_value_restriction("finite values (no nan or inf)", None, None, True)]
    for bound in VALUE_BOUNDS:
        out.append(_value_restriction(f"|x| <= {bound:g}", -bound, bound, False))
        out.append(_value_restriction(f"finite, |x| <= {bound:g}", -bound, bound, True))
    out.append(_value_restriction("x >= 0", 0.0, None, False))
    out.append(_value_restriction("finite, x >= 0", 0.0, None, True))
    tiny = torch.finfo(torch.float32).tiny
    out.append(_value_restriction("x > 0", tiny, None, False))
    out.append(_value_restriction("finite, x > 0", tiny, None, True))
    for bound in VALUE_BOUNDS:
        out.append(_value_restriction(f"finite, 0 < x <= {bound:g}", tiny, bound, True))
    return out


def restrictions_for(rule: Rule) -> dict[str, list[Restriction]]:
    """The lattice for ``rule``: per family, its restrictions from weakest to strongest."""
    names = [p.name for p in rule.compiled.params if p.kind == "tensor"]
    families = {
        "dtype": _dtype_family(names),
        "shape": _shape_family(names),
        "rank": [_rank_restriction(k, names) for k in (1, 2)],
        "layout": _layout_family(names),
        "values": _value_family(),
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
                untestable_only = sum(r.guard is None for r in chosen)
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
        return all(r.guard is not None for r in self.restrictions)

    def code(self) -> str:
        """The ``where=`` and ``domain=`` arguments to paste into the rule's definition."""
        lines = []
        guards = [r.guard for r in self.restrictions if r.guard is not None]
        own = "  # in addition to the rule's own guards" if len(self.rule.where) > len(guards) else ""
        if len(guards) == 1:
            lines.append(f"where={guards[0]},{own}")
        elif guards:
            lines.append("where=(" + ", ".join(guards) + f"),{own}")
        if any(r.guard is None for r in self.restrictions):
            shown = {k: v for k, v in self.domain.items() if k in _PRINTABLE_DOMAIN_KEYS}
            rest = "  # and the rule's other domain keys" if len(shown) < len(self.domain) else ""
            lines.append(f"domain={_show_domain(shown)},{rest}")
        return "\n".join(lines)

    def dsl(self) -> str:
        """The same for a ``.fxr`` rule: a ``where`` line for the guards, a ``domain`` line for
        the declarations (it replaces the rule's own ``domain`` line: a setting may be declared
        once)."""
        lines = []
        conditions = [r.dsl for r in self.restrictions if r.dsl]
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


def _restricted(rule: Rule, chosen: Sequence[Restriction]) -> tuple[Rule, dict[str, Any]] | None:
    domain: dict[str, Any] | None = dict(rule.domain or {})
    for restriction in chosen:
        domain = restriction.narrow(domain) if domain is not None else None
    if domain is None:
        return None
    guards = tuple(eval(r.guard, {"torch": torch}) for r in chosen if r.guard is not None)  # our own text
    return attrs.evolve(rule, where=(*rule.where, *guards), domain=domain), domain


def repair_rule(rule: Rule, counterexamples: Sequence[Mapping[str, Any]], *, seed: int | None = None,
                examples: int = CANDIDATE_EXAMPLES, verify_examples: int = VERIFY_EXAMPLES,
                max_searches: int = MAX_SEARCHES) -> Repair | None:
    """The weakest restriction of ``rule`` under which the checker finds no counterexample, as
    a :class:`Repair`; ``None`` when no candidate in the lattice passes within
    ``max_searches`` searches. ``counterexamples`` are inputs already known to break the rule
    (candidates admitting one of them are skipped without a search)."""
    from .equivalence import check_rule

    known = [dict(c) for c in counterexamples]
    names = [p.name for p in rule.compiled.params if p.kind == "tensor"]
    searches = 0
    verify_seed = 1 if seed is None else seed + 1
    for chosen in candidates(rule):
        if any(all(r.admits(c, names) for r in chosen) for c in known):
            continue
        restricted = _restricted(rule, chosen)
        if restricted is None:
            continue
        if searches >= max_searches:
            return None
        searches += 1
        candidate, domain = restricted
        try:
            result = check_rule(candidate, max_examples=examples, seed=seed, repair=False)
            if result.ok:
                result = check_rule(candidate, max_examples=verify_examples, seed=verify_seed, repair=False)
                if result.ok:
                    return Repair(candidate, tuple(chosen), result.examples_run, domain)
        except Exception as exc:  # e.g. the narrowed domain contradicts a per-input one: no values left
            logger.debug("repair of %s: candidate %s cannot be checked: %s", rule.name,
                         " and ".join(r.label for r in chosen), exc)
            continue
        known += [dict(c.inputs) for c in result.counterexamples]
    return None
