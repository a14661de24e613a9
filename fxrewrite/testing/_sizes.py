"""Literal captures that are the new sizes of a ``view`` or ``reshape``, and the size tuples that
fit a number of elements: the input plan draws such sizes by construction (``x.view(a, b, c, d)``
runs only when ``a * b * c * d`` is ``x.numel()``, or one of them is ``-1`` and the others divide
it), where independent draws of ``a``, ``b``, ``c``, ``d`` from ``(-1, 1, 2)`` fitted a few in a
hundred draws and most of ``reshape4_reshape4``'s layouts were refused.

>>> fitting_sizes(((-1, 1, 2), (-1, 1, 2)), 4)
((-1, 1), (-1, 2), (1, -1), (2, -1), (2, 2))
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence

import attrs
import torch
from torch.fx.node import Node

from ..rule import Rule

#: Methods whose arguments after the tensor are its new sizes (one by one, or as one sequence).
_SIZED_METHODS = frozenset({"view", "reshape"})
#: Functions of the same form.
_SIZED_FUNCTIONS = (torch.reshape, torch.Tensor.view, torch.Tensor.reshape)


@attrs.frozen
class SizedOp:
    """A ``view``/``reshape`` of the pattern whose every size is an ``int`` literal capture
    (``names``, in argument order), applied to tensor argument ``source`` or to a chain of such
    ops on it (so its input has ``source``'s number of elements)."""

    names: tuple[str, ...]
    source: str


def _is_sized(node: Node) -> bool:
    if node.op == "call_method":
        return str(node.target) in _SIZED_METHODS
    return node.op == "call_function" and node.target in _SIZED_FUNCTIONS


def _size_arguments(node: Node) -> tuple[object, ...]:
    sizes = node.args[1:]
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
        return tuple(sizes[0])
    return tuple(sizes)


def sized_ops(rule: Rule, int_literals: Sequence[str], tensors: Sequence[str]) -> tuple[SizedOp, ...]:
    """The sized ops of ``rule``'s pattern whose sizes are all among ``int_literals`` (each
    taken once) and whose input is one of ``tensors`` through sized ops only."""
    placeholders = rule.compiled.placeholders
    by_node = {node: name for name, node in placeholders.items()}
    found: list[SizedOp] = []
    taken: set[str] = set()
    for node in rule.compiled.graph.nodes:
        if not _is_sized(node) or node.kwargs or not node.args:
            continue
        sizes = _size_arguments(node)
        names = tuple(by_node.get(s, "") if isinstance(s, Node) else "" for s in sizes)
        if not names or any(n not in int_literals or n in taken for n in names):
            continue
        source = node.args[0]
        while isinstance(source, Node) and _is_sized(source):
            source = source.args[0]
        if isinstance(source, Node) and by_node.get(source) in tensors:
            found.append(SizedOp(names, by_node[source]))
            taken.update(names)
    return tuple(found)


@functools.lru_cache(maxsize=1024)
def fitting_sizes(candidates: tuple[tuple[int, ...], ...], numel: int) -> tuple[tuple[int, ...], ...]:
    """The tuples of sizes, the i-th among ``candidates[i]``, that a tensor of ``numel``
    elements can be viewed or reshaped to: at most one ``-1`` (then the others' product divides
    ``numel``), no other negative size, and otherwise a product of ``numel``. In the order of
    the candidates (the first is what shrinking prefers)."""
    out = []
    for sizes in itertools.product(*candidates):
        if sum(s == -1 for s in sizes) > 1 or any(s < -1 for s in sizes):
            continue
        known = math.prod(s for s in sizes if s != -1)
        if -1 in sizes:
            if known > 0 and numel % known == 0:  # an empty tensor too: (0,) views to (-1, 2)
                out.append(sizes)
        elif known == numel:
            out.append(sizes)
    return tuple(out)
