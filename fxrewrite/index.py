"""The nodes of one graph by op key, built in one pass and kept current while the graph changes.

Rewriting asks "which nodes compute op K?" for its initial worklists and, for patterns whose
outputs share no node, once per anchor candidate. Scanning ``graph.nodes`` for each question
would make those rules cost O(N) per candidate; :class:`OpIndex` answers from buckets built
once. Whoever changes the graph tells the index which nodes it created
(:meth:`OpIndex.add`); erased nodes are dropped lazily, the next time their bucket is read.

**Slow twin**: :func:`scan`, one pass over ``graph.nodes`` per question;
``tests/test_index.py`` keeps both equal over random edits.

>>> import torch, torch.fx as fx
>>> gm = fx.symbolic_trace(lambda x: torch.neg(torch.relu(x)) + torch.neg(x))
>>> index = OpIndex(gm.graph)
>>> [n.name for n in index.nodes(("aten", "neg"))]
['neg', 'neg_1']
>>> with gm.graph.inserting_before(index.nodes(("aten", "neg"))[1]):
...     new = gm.graph.call_function(torch.neg, (index.nodes(("aten", "relu"))[0],))
>>> index.add([new])
>>> [n.name for n in index.nodes(("aten", "neg"))]  # graph order, not insertion order
['neg', 'neg_2', 'neg_1']
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Iterable, Mapping
from typing import Any

import torch.fx as fx
from torch.fx.node import Node

from ._torch import is_erased, node_position
from .canon import node_keys

__all__ = ["OpIndex", "scan"]

#: Build the index by filing each node into the lists worked out once for its tuple of keys (its
#: buckets and its groups' lists); ``False`` is the slow twin, each node filed key by key
#: (``tests/test_index.py`` checks both build the same buckets and groups). delete dag 8k: 2.2 -> 1.7 ms.
FILED_BY_KEYS = True


def scan(graph: fx.Graph, key: Hashable, *, canonical: bool = True) -> list[Node]:
    """The slow twin of :meth:`OpIndex.nodes`: the nodes of ``graph`` filed under ``key``, by a
    pass over the whole graph.

    >>> import torch, torch.fx as fx
    >>> gm = fx.symbolic_trace(lambda x: torch.neg(x).neg())
    >>> [n.name for n in scan(gm.graph, ("aten", "neg"))]
    ['neg', 'neg_1']
    """
    return [n for n in graph.nodes if key in node_keys(n, canonical)]


class OpIndex:
    """Nodes of ``graph`` by :func:`~fxrewrite.canon.node_keys` key (``canonical=False``: the
    target as written, torch.fx's notion of "same op").

    A bucket is returned as a list in graph order; the list is never modified afterwards (a
    later change builds a new one), so callers may iterate it while rewriting. Reading a bucket
    that did not change since it was last read costs O(1); after a change, O(size of the bucket).
    """

    def __init__(self, graph: fx.Graph, *, canonical: bool = True,
                 groups: Mapping[Any, Collection[Hashable]] | None = None) -> None:
        self.graph = graph
        self.canonical = canonical
        self._buckets: dict[Hashable, list[Node]] = {}
        self._added: dict[Hashable, list[Node]] = {}
        self._generation = 0  # bumped by every change the index is told about
        #: Per group of keys in ``groups``, the nodes filed under any of its keys when the index was
        #: built, each once, in graph order (the driver's first fill of each priority level, without
        #: a sort); not kept current.
        self.grouped: dict[Hashable, list[Node]] = {name: [] for name in groups or ()}
        if FILED_BY_KEYS:
            self._file(graph.nodes, groups or {})
        else:
            self._file_each(graph.nodes, groups or {})
        #: Per key, the generation at which its bucket was last filtered (all live when built).
        self._clean: dict[Hashable, int] = dict.fromkeys(self._buckets, 0)

    def _file(self, nodes: Iterable[Node], groups: Mapping[Any, Collection[Hashable]]) -> None:
        """File ``nodes`` in their buckets and their groups' lists, in order: the lists a node goes
        into are worked out once per tuple of keys (:data:`FILED_BY_KEYS`)."""
        buckets, canonical = self._buckets, self.canonical
        into_of: dict[tuple[Hashable, ...], list[list[Node]]] = {}  # per tuple of keys, the lists its nodes go into
        for node in nodes:
            keys = node_keys(node, canonical)
            into = into_of.get(keys)
            if into is None:
                into = into_of[keys] = [*(buckets.setdefault(key, []) for key in keys), *self._groups_of(keys, groups)]
            for found in into:
                found.append(node)

    def _groups_of(self, keys: tuple[Hashable, ...], groups: Mapping[Any, Collection[Hashable]]) -> list[list[Node]]:
        """The lists of the groups with one of ``keys``."""
        return [self.grouped[name] for name, group in groups.items() if any(key in group for key in keys)]

    def _file_each(self, nodes: Iterable[Node], groups: Mapping[Any, Collection[Hashable]]) -> None:
        """:meth:`_file`'s slow twin: each node filed key by key, then in its groups' lists."""
        buckets = self._buckets
        groups_of: dict[tuple[Hashable, ...], list[list[Node]]] = {}  # per tuple of keys, the groups' lists
        for node in nodes:
            keys = node_keys(node, self.canonical)
            for key in keys:
                bucket = buckets.get(key)
                if bucket is None:
                    buckets[key] = [node]
                else:
                    bucket.append(node)
            if groups:
                into = groups_of.get(keys)
                if into is None:
                    into = groups_of[keys] = self._groups_of(keys, groups)
                for grouped in into:
                    grouped.append(node)

    def keys(self, node: Node) -> tuple[Hashable, ...]:
        """The keys ``node`` is filed under (:func:`~fxrewrite.canon.node_keys`: one, or two for a
        call that is another op respelled)."""
        return node_keys(node, self.canonical)

    def add(self, nodes: Iterable[Node]) -> None:
        """File nodes just created in the graph (erased ones are skipped), and note that the
        graph changed: nodes erased since are dropped from their buckets when next read."""
        added, canonical = self._added, self.canonical
        for node in nodes:
            if not is_erased(node):
                for key in node_keys(node, canonical):
                    bucket = added.get(key)
                    if bucket is None:
                        added[key] = [node]
                    else:
                        bucket.append(node)
        self._generation += 1

    def nodes(self, key: Hashable) -> list[Node]:
        """The live nodes filed under ``key``, in graph order."""
        added = self._added.pop(key, None)
        bucket = self._buckets.get(key)
        if bucket is None and added is None:
            return []
        if added is not None or self._clean.get(key) != self._generation:
            live = [n for n in (*(bucket or ()), *(added or ())) if not is_erased(n)]
            if added is not None:
                live.sort(key=node_position)
            self._buckets[key] = bucket = live
            self._clean[key] = self._generation
        return bucket or []

    __call__ = nodes

    def __contains__(self, key: Hashable) -> bool:
        return bool(self.nodes(key))
