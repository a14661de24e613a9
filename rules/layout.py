"""Layout rules that need Python: composing two permutes into one, computed at rewrite time.
(``x.mT`` is ``x.transpose(-2, -1)`` to the matcher wherever the rank is known to be 2 or more:
no rule re-spells it.)

A permute pattern of rank n has n literal captures per permute; the matcher lines up the
spellings ``x.permute(0, 2, 1)``, ``x.permute([0, 2, 1])`` and ``torch.permute(x, (0, 2, 1))``,
so one rule per rank covers them all.
"""

from __future__ import annotations

from collections.abc import Sequence

import fxrewrite


def _valid(dims: Sequence[int]) -> bool:
    n = len(dims)
    return all(-n <= d < n for d in dims) and sorted(d % n for d in dims) == list(range(n))


def _both_valid(rank: int):
    """Guard: both captured permutations are permutations of range(rank) (negative dims allowed)."""

    def guard(m: fxrewrite.Match) -> bool:
        first = [m[f"p{i}"] for i in range(rank)]
        second = [m[f"q{i}"] for i in range(rank)]
        return _valid(first) and _valid(second)

    guard.__name__ = guard.__qualname__ = f"valid_permutations(rank={rank})"
    return guard


def _composed(x, first: Sequence[int], second: Sequence[int]):
    """``x.permute(first).permute(second)`` as one permute: result dim i is ``first[second[i]]``."""
    n = len(first)
    dims = [first[d % n] % n for d in second]
    return x if dims == list(range(n)) else x.permute(*dims)


def _permute_domain(rank: int) -> dict:
    """Literal captures are drawn independently, so each position draws from the values it has
    in two permutations (one of them spelled with negative dims): choosing position by position
    gives either permutation, or an invalid one that the guard rejects."""
    reverse = tuple(range(rank - 1, -1, -1))
    swap = (0, *range(2, rank), 1)  # channels last
    literals = {}
    for i in range(rank):
        literals[f"p{i}"] = (swap[i], reverse[i] - rank)
        literals[f"q{i}"] = (reverse[i], swap[i] - rank)
    return {"ranks": (rank, rank), "literals": literals}


@fxrewrite.rule(where=_both_valid(3), domain=_permute_domain(3))
def permute_permute_3d(x, p0: int, p1: int, p2: int, q0: int, q1: int, q2: int):
    "Replaces x.permute(p).permute(q) on 3-d tensors by one permute (or by x when they cancel)."
    return x.permute(p0, p1, p2).permute(q0, q1, q2)


@permute_permute_3d.replacement
def permute_permute_3d(x, p0: int, p1: int, p2: int, q0: int, q1: int, q2: int):
    return _composed(x, (p0, p1, p2), (q0, q1, q2))


@fxrewrite.rule(where=_both_valid(4), domain=_permute_domain(4))
def permute_permute_4d(x, p0: int, p1: int, p2: int, p3: int, q0: int, q1: int, q2: int, q3: int):
    "Replaces x.permute(p).permute(q) on 4-d tensors by one permute (or by x when they cancel)."
    return x.permute(p0, p1, p2, p3).permute(q0, q1, q2, q3)


@permute_permute_4d.replacement
def permute_permute_4d(x, p0: int, p1: int, p2: int, p3: int, q0: int, q1: int, q2: int, q3: int):
    return _composed(x, (p0, p1, p2, p3), (q0, q1, q2, q3))


@fxrewrite.rule(where=_both_valid(5), domain=_permute_domain(5))
def permute_permute_5d(x, p0: int, p1: int, p2: int, p3: int, p4: int,
                       q0: int, q1: int, q2: int, q3: int, q4: int):
    "Replaces x.permute(p).permute(q) on 5-d tensors by one permute (or by x when they cancel)."
    return x.permute(p0, p1, p2, p3, p4).permute(q0, q1, q2, q3, q4)


@permute_permute_5d.replacement
def permute_permute_5d(x, p0: int, p1: int, p2: int, p3: int, p4: int,
                       q0: int, q1: int, q2: int, q3: int, q4: int):
    return _composed(x, (p0, p1, p2, p3, p4), (q0, q1, q2, q3, q4))
