"""The driver: apply a rule set to one graph until nothing matches, within a budget.

Three pieces, each a class of its own (as xDSL's rewriter, its listener and its walker are):

* the **splicer** (:class:`fxrewrite.replace.Splicer`) changes the graph: it puts one
  replacement in a match's place. After each splice, once the graph is consistent again, it
  tells its listeners what it did as a **change event** (:class:`~fxrewrite.replace.Change`):
  the nodes it created, the matched nodes it erased, which node now stands for each of the
  pattern's outputs, and the values the match read (each of them lost users).
* the **worklist** (:class:`Worklist`) holds the graph nodes still to visit: one queue per
  priority level, each in graph order, a node at most once per level, and only at the levels
  that have a rule anchored at one of its op keys.
* the **driver** (:class:`Driver`) pops a node, tries the rules of that level anchored at its
  op that a :class:`~fxrewrite.dispatch.RuleIndex` does not rule out (literals and input ops
  below the anchor; ``PLAIN_RULES`` is its slow twin; the report counts attempts as the plain
  search does), cheap pre-checks first, applies the first match that neither the engine nor a guard
  refuses, and listens to the splicer: the op index files the created nodes, and the worklist
  is refilled from the event alone (the driver never looks at the graph to guess what changed).

**Order.** The driver always serves the highest priority level that has work, so where two rules
could fire, the higher-priority one wins; within a level nodes are visited in graph order (inputs
before users), and rules in the rule set's order. After a change event the worklist gets the
created nodes, and what lies downstream of them and of the inputs that lost a user, as far as the
deepest pattern reaches (a pattern of depth d anchored further down cannot see a change more than
d users away). An input that lost a user is a new candidate only if it has no more users than the
largest pattern has nodes (only then can it now be an inner node of a match). A value that a
deletion made stand for a matched output (``neg(neg(x)) => x``) gained the output's users: those
users read a new input, so they and what lies downstream of them are queued too, however many
users that value has (the users it had before are no new candidates). Its users from before are
not walked either when one of the users it gained lies beyond the furthest node popped and is no
check node: no match anchored at a node popped already can hold the value as an inner node then
(:data:`SHORT_DELETION_REQUEUE`). The event does not name the gained users, so the driver notes the
matched outputs' users just before the splice.

**Why it stops.** Every visit pops a node; a visit that rewrites nothing pushes nothing, so
without rewrites the worklist drains (at most one visit per node and level). Each rewrite pushes
a bounded number of nodes (the created nodes and their neighbourhood up to the reach). So the
drive ends unless rewrites go on for ever, which a budget (``max_rewrites``, by default eight per
node plus 64) turns into :class:`~fxrewrite.errors.DidNotConverge`, naming the rules that fired
last. Two guards keep sound rule sets far from the budget: a rule whose replacement is again its
own match with the same bindings (``x + y => y + x``) is not tried again at the node it produced
("settled"), and a match refused once is not retried until a change event queues its node again.

>>> import torch
>>> from fxrewrite import Rule, RuleSet
>>> gm = torch.fx.symbolic_trace(lambda a: torch.neg(torch.neg(torch.neg(torch.neg(a)))))
>>> neg_neg = Rule.from_functions(lambda x: torch.neg(torch.neg(x)), lambda x: x, name="neg_neg")
>>> driver = Driver(gm, RuleSet([neg_neg]), budget=10, debug=False)
>>> driver.run()
>>> driver.rewrites, [n.op for n in gm.graph.nodes]
(2, ['placeholder', 'call_method', 'output'])

(the ``clone`` keeps the output a tensor of its own, as it was before rewriting.)
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import operator
import time
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from typing import Any

import attrs
import torch
import torch.fx as fx
from torch.fx.node import Node

from ._torch import is_erased, node_position, side_table_buckets, tree_flatten, tree_leaves, tree_unflatten
from .canon import (
    alias_class,
    input_keys,
    is_aten_graph,
    is_check,
    node_keys,
    same_literal,
    writers_of,
    writes_in_place,
)
from .canon.effects import named_modules
from .canon.identities import may_be_identity
from .canon.meaning import input_target
from .dispatch import RuleIndex
from .errors import DidNotConverge, Refuse, RewriteError
from .index import OpIndex
from .match import Match, anchor_input_module_classes, anchor_module_class, matcher
from .meta import copy_value
from .replace import Change, Splicer, placement_refusal
from .report import MAX_REASONS, Report, RuleStats
from .rule import Rule, RuleSet

__all__ = ["Driver", "Worklist"]

logger = logging.getLogger(__name__)

_PROGRESS_EVERY = 2048  # visits between two on_progress calls

#: Try every rule filed under a node's op keys instead of the :class:`~fxrewrite.dispatch.RuleIndex`'s
#: candidates: the slow twin, kept equal by ``tests/test_driver.py``'s differential test.
PLAIN_RULES = False
#: Rules under one op key from which the RuleIndex is asked at its nodes: below it, the plain list
#: and the anchor-input pre-check cost less than asking the index and telling it what fired
#: (bench_rewrite 8k, CPU medians: with 4, create3 50% R=50 and delete dag R=50, whose 50 rules
#: are filed 4-19 per key, took 3-10% longer than without the index).
_INDEXED_FROM = 32
#: Keep the initial fill of each level as a list sorted in graph order and serve it ahead of the
#: heap of later pushes (a pop from it costs no heap sift); ``False`` is the slow twin, everything
#: in one heap (``tests/test_driver.py`` checks both pop the same nodes in the same order).
SORTED_FILL = True
#: Take a fill handed over in graph order (the op index gathers each level's nodes as it is built)
#: as it is, at a level where nothing waits yet; ``False`` is the slow twin, the fill sorted and its
#: duplicates dropped (``tests/test_driver.py`` checks both pop the same nodes in the same order).
#: 64k nodes, delete dag: the fill 11.8 ms.
ORDERED_FILL = True
#: Skip, without the matcher, a rule anchored at a module capture's call at a ``call_module`` node
#: whose module is not of the capture's class (:func:`~fxrewrite.match.anchor_module_class`: the
#: search refuses it first thing); ``False`` is the slow twin (the search says no), kept equal by
#: ``tests/test_driver.py``'s differential test. modules 10% 8k: ~4 searches per fold, 2 of them here.
FAST_MODULE_ANCHOR = True
#: Skip, without the matcher, a rule whose anchor reads the call of a module capture (``lin(x) + b``)
#: at a node none of whose inputs calls a module of the capture's class nor may be an identity
#: (:func:`~fxrewrite.match.anchor_input_module_classes`: the search refuses every input there);
#: ``False`` is the slow twin (the search says no), kept equal by ``tests/test_driver.py``.
#: modules 10% 8k: linear_layer_add_bias at the 61 sums reading a BatchNorm, 30 us a search.
FAST_MODULE_INPUTS = True
_GROUPED_FROM = 3  # rules under one op key from which the index may tell some apart by a literal
#: Run the anchor-input pre-check once per op key and set of input keys (:class:`_Screen`), not
#: once per rule and visit: a visit tries only the rules that pass it, and the others count their
#: attempts in bulk; ``False`` is the slow twin, each rule pre-checked at each visit
#: (``tests/test_driver.py`` checks both make the same graph and report). delete dag 50% R=50:
#: 837 visits of a relu pre-checked its 19 rules, 1 or 2 of which pass.
SCREENED = True
#: Keep each :class:`_Screen` also under the op key of the node and the ``(op, target)`` of its one
#: input where that input alone decides the node's input keys (:func:`~fxrewrite.canon.meaning.input_target`),
#: and take it from there without working the input keys out; a visit whose screen passes no rule
#: counts its miss without a try. ``False`` is the slow twin, the input keys worked out at every
#: visit (``tests/test_driver.py`` checks both make the same graph and report). delete dag 50% R=50
#: 8k: a screen 1.05 -> 0.5 us, at 4,773 visits.
SCREENS_BY_INPUT = True
#: Leave out of a change event's requeue what lies beyond the furthest node popped so far
#: (:attr:`Worklist.mark`; it and all downstream of it still wait where a rule anchors at them);
#: ``False`` is the slow twin, the whole neighbourhood pushed again (``tests/test_driver.py``
#: checks both make the same graph and report). Only where no node can gain an anchor key while it
#: waits (see :func:`_may_rekey`). delete dag 50% R=50: 5.7 nodes reached per rewrite, 0.06 new.
PRUNED_REQUEUE = True
#: In a pruned requeue (:data:`PRUNED_REQUEUE`), a deletion (no node created) does not walk from a
#: value it made stand for a matched output when that value gained a user beyond the mark that is
#: no check node: only the users moved to it at or before the mark are walked (see :func:`_rewired`).
#: ``False`` is the slow twin, the value's users all walked (``tests/test_driver.py`` checks both
#: make the same graph and rewrites; the attempts differ by the visits saved). delete dag 50% R=50
#: 8k: 1,988 deletions walked from their value and reached 360 visited nodes again, none of which
#: could match anew; now none is walked (4,813 -> 4,773 visits).
SHORT_DELETION_REQUEUE = True
#: Tell an ATen graph (:func:`~fxrewrite.canon.is_aten_graph`) by the ``call_function`` targets its
#: side table files nodes under (a few distinct targets), not by a pass over its nodes; ``False`` is
#: the slow twin, ``is_aten_graph(graph.nodes)`` (``tests/test_driver.py`` checks both agree, also
#: once the graph's only ATen call is erased). modules chain 8k: 0.35 ms a drive.
ATEN_BY_TARGETS = True
#: The keys :func:`~fxrewrite.canon.respelled` may give a node besides its own, which it may gain
#: or lose when its arguments change (an in-place op's functional twin aside: see :func:`_may_rekey`).
_RESPELLED_KEYS = frozenset({("aten", "unsqueeze"), ("aten", "transpose"), ("aten", "reciprocal"), ("aten", "size"),
                             ("call_function", operator.getitem)})


class Worklist:
    """Graph nodes waiting to be visited: one queue per priority level, the highest level with
    work served first; within a level, graph order (earliest first); a node at most once per
    level, and only at the levels whose rules anchor at one of its op keys.

    >>> import torch, torch.fx as fx
    >>> from fxrewrite.canon import node_keys
    >>> gm = fx.symbolic_trace(lambda x: torch.relu(torch.neg(x)))
    >>> neg, relu = [n for n in gm.graph.nodes if n.op == "call_function"]
    >>> work = Worklist({10: {node_keys(relu)[0]}, 0: {node_keys(neg)[0], node_keys(relu)[0]}})
    >>> for node in (relu, neg, relu):
    ...     work.push(node)
    >>> len(work), [(node.name, level) for node, level in iter(work.pop, None)]
    (3, [('relu', 10), ('neg', 0), ('relu', 0)])
    """

    def __init__(self, anchors: Mapping[int, Collection[Hashable]]) -> None:
        #: Per priority level, the op keys its rules anchor at.
        self.anchors = {p: frozenset(keys) for p, keys in anchors.items()}
        #: The priority levels, highest first.
        self.levels = sorted(anchors, reverse=True)
        self._queues: dict[int, list[tuple[Any, int, Node]]] = {p: [] for p in self.levels}
        self._queued: dict[int, set[Node]] = {p: set() for p in self.levels}
        self._seq = itertools.count()  # ties (same position) in push order; nodes are never compared
        #: Per level, the filled nodes in graph order (:data:`SORTED_FILL`), served from ``_next``
        #: on; ahead of a heap entry at the same position (an erased node's: it was filled first).
        self._filled: dict[int, list[Node]] = {p: [] for p in self.levels}
        self._next: dict[int, int] = {p: 0 for p in self.levels}
        #: Per tuple of op keys, the levels whose rules anchor at one of them (highest first).
        self._levels_of: dict[tuple[Hashable, ...], tuple[int, ...]] = {}
        #: The furthest graph position popped at any level (``None`` before the first pop): a node
        #: beyond it was never popped, so it still waits at each level it was queued at.
        self.mark: Any = None

    def fill(self, level: int, nodes: Iterable[Node], *, in_graph_order: bool = False) -> None:
        """Queue ``nodes`` at ``level`` in one go (the initial fill: one sort, not a push each).
        ``in_graph_order``: the caller hands distinct nodes in graph order (the op index's groups);
        at a level where nothing waits yet they are kept as they are (:data:`ORDERED_FILL`),
        without the sort."""
        queue, queued = self._queues[level], self._queued[level]
        if in_graph_order and ORDERED_FILL and SORTED_FILL and not queued:
            self._filled[level] = filled = list(nodes)
            self._next[level] = 0
            queued.update(filled)
            return
        fresh = [n for n in dict.fromkeys(nodes) if n not in queued]
        queued.update(fresh)
        if SORTED_FILL:
            filled = self._filled[level]
            self._filled[level] = sorted([*filled[self._next[level]:], *fresh], key=node_position)
            self._next[level] = 0
            return
        queue.extend((node_position(n), next(self._seq), n) for n in fresh)
        heapq.heapify(queue)

    def push(self, node: Node) -> None:
        """Queue ``node`` at every level with a rule anchored at one of its op keys, unless it is
        already waiting there."""
        keys = None  # computed only for a node not already waiting at some level
        for p in self.levels:
            queued = self._queued[p]
            if node in queued:
                continue
            if keys is None:
                keys = node_keys(node)
            if not self.anchors[p].isdisjoint(keys):
                queued.add(node)
                heapq.heappush(self._queues[p], (node_position(node), next(self._seq), node))

    def push_all(self, nodes: Iterable[Node]) -> None:
        """:meth:`push` each of ``nodes``, in one call (the driver's requeue after a rewrite)."""
        queues, queued_at, seq, levels_of = self._queues, self._queued, self._seq, self._levels_of
        for node in nodes:
            keys = node_keys(node)
            levels = levels_of.get(keys)
            if levels is None:
                levels = levels_of[keys] = tuple(p for p in self.levels if not self.anchors[p].isdisjoint(keys))
            for p in levels:
                queued = queued_at[p]
                if node not in queued:
                    queued.add(node)
                    heapq.heappush(queues[p], (node_position(node), next(seq), node))

    def pop(self) -> tuple[Node, int] | None:
        """The earliest live node of the highest level with work, and that level; ``None`` when
        no node waits. Nodes erased while they waited are dropped here."""
        for level in self.levels:
            queue, queued = self._queues[level], self._queued[level]
            filled, i = self._filled[level], self._next[level]
            end = len(filled)
            while queue or i < end:
                if i < end:
                    position = node_position(filled[i])
                    if queue and queue[0][0] < position:  # (the filled node first on a tie)
                        position, _, node = heapq.heappop(queue)
                    else:
                        node = filled[i]
                        i += 1
                else:
                    position, _, node = heapq.heappop(queue)
                queued.discard(node)
                if not is_erased(node):
                    self._next[level] = i
                    if self.mark is None or position > self.mark:
                        self.mark = position
                    return node, level
            self._next[level] = i
        return None

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values()) + sum(
            len(filled) - self._next[p] for p, filled in self._filled.items())


@attrs.define
class _Tally:
    """One rule's counts during a drive (frozen into a :class:`~fxrewrite.report.RuleStats`)."""

    attempts: int = 0
    applied: int = 0
    rejected: int = 0
    seconds: float = 0.0
    reasons: list[str] = attrs.Factory(list)

    def freeze(self, left_out: int = 0) -> RuleStats:
        """The counts, with ``left_out`` attempts (visits the rule index did not offer the rule at) added."""
        return RuleStats(self.attempts + left_out, self.applied, self.rejected, self.seconds, tuple(self.reasons))

    def refused(self, node: Node, reason: str) -> None:
        self.rejected += 1
        if len(self.reasons) < MAX_REASONS:
            self.reasons.append(f"at '{node.name}': {reason}")


class _Matchers(dict[str, Callable[[Node], Iterable[Match]]]):
    """Per rule name, the rule's matches at a node (:func:`~fxrewrite.match.matcher`, made at the
    rule's first try)."""

    def __init__(self, ruleset: RuleSet, gm: fx.GraphModule, modules: Mapping[str, torch.nn.Module],
                 candidates: Callable[[Any], Iterable[Node]]) -> None:
        super().__init__()
        self.ruleset, self.gm, self.modules, self.candidates = ruleset, gm, modules, candidates

    def __missing__(self, name: str) -> Callable[[Node], Iterable[Match]]:
        found = self[name] = matcher(self.ruleset[name].compiled, self.gm, modules=self.modules,
                                     candidates=self.candidates)
        return found


class _Writers:
    """:func:`~fxrewrite.canon.writers_of`, cached per node with its user count: a node that only
    lost users keeps its answer (a rewrite adds no in-place write into a value it did not make:
    replacements writing into anything else are refused, and matches whose outputs are written
    are never applied; a write into a tensor of its own comes with new users), so a widely used
    input is scanned once, not once per rewrite."""

    def __init__(self) -> None:
        self._cache: dict[Node, tuple[int, tuple[Node, ...] | None]] = {}

    def __call__(self, value: Node) -> tuple[Node, ...] | None:
        cached = self._cache.get(value)
        if cached is None or len(value.users) > cached[0]:
            cached = self._cache[value] = (len(value.users), writers_of(value))
        return cached[1]


def _pays(index: RuleIndex, key: Hashable, count: int) -> bool:
    """Does asking ``index`` at nodes of ``key`` (with ``count`` rules) cost less than the plain list?
    When the key has ``_INDEXED_FROM`` rules or more, or the index tells some of them apart by a
    literal (rules alike but for a constant: each plain try walks the whole pattern before the
    constant differs; literal family of bench_rules, R=10 at 16k nodes: 996 -> 514 ms CPU)."""
    return count >= _INDEXED_FROM or (count >= _GROUPED_FROM and index.discriminates(key))


class _Screen:
    """The rules of one op key's list (``rules``) that pass the driver's anchor-input pre-check at
    a node fed by the input keys ``keys`` (:data:`SCREENED`), in the list's order, and the ones it
    screens out. The plain search counts an attempt of a screened-out rule at each visit until a
    rule fired, so the screen counts the visits at which none fired (:attr:`misses`), and a fire
    counts the screened-out rules before the rule fired at once."""

    __slots__ = ("_places", "keys", "misses", "passing", "screened_out")

    def __init__(self, rules: Sequence[Rule], keys: frozenset[Hashable]) -> None:
        self.keys = keys
        self.passing = [r for r in rules if r.compiled.anchor_input_keys <= keys]
        #: The rules the pre-check refuses, with their places in ``rules``.
        self.screened_out = [(i, r.name) for i, r in enumerate(rules) if not r.compiled.anchor_input_keys <= keys]
        self._places = {r.name: i for i, r in enumerate(rules)}
        self.misses = 0  # visits at which no rule fired

    def visited(self, applied: Rule | None, tallies: Mapping[str, _Tally]) -> None:
        """A visit ended, ``applied`` the rule that fired (``None``: none did): count the attempts."""
        if applied is None:
            self.misses += 1
        elif self.screened_out:
            self.fired(applied, tallies)

    def fired(self, rule: Rule, tallies: Mapping[str, _Tally]) -> None:
        """``rule`` fired at a visit: the screened-out rules before it count an attempt each."""
        place = self._places[rule.name]
        for i, name in self.screened_out:
            if i < place:
                tallies[name].attempts += 1


class _Candidates:
    """The rules to try at a node: per priority level, the rules anchored at each op key, in
    rule-set order, and the :class:`~fxrewrite.dispatch.RuleIndex` that leaves out the ones that
    cannot match there. The index is asked only at nodes of an op key where it pays (:func:`_pays`;
    elsewhere the plain list and the driver's anchor-input pre-check are cheaper; the differential
    test asks it everywhere), and not at all with ``PLAIN_RULES`` (the slow twin: every rule of
    the node's op keys). Where the index is not asked, the pre-check is run once per set of input
    keys (:meth:`screen`)."""

    def __init__(self, ruleset: RuleSet) -> None:
        self.by_level: dict[int, dict[Hashable, list[Rule]]] = {p: {} for p in sorted({r.priority for r in ruleset})}
        for r in ruleset:  # RuleSet order within a level
            self.by_level[r.priority].setdefault(r.anchor_key, []).append(r)
        #: Per level, the index (built where a key has rules enough to tell apart: ~1 ms for the library).
        self.index = {} if PLAIN_RULES else {
            p: RuleIndex([r for r in ruleset if r.priority == p]) for p, rules in self.by_level.items()
            if any(len(rs) >= min(_INDEXED_FROM, _GROUPED_FROM) for rs in rules.values())}
        self.indexed_keys = {p: {k for k, rs in rules.items() if p in self.index and _pays(self.index[p], k, len(rs))}
                             for p, rules in self.by_level.items()}
        #: The index that gave the current visit's rules (told what fired by the driver), if any.
        self.asked: RuleIndex | None = None
        #: Per level, per op key whose rules are not indexed and pre-check their anchor's inputs, the
        #: :class:`_Screen` of each set of input keys met so far (:data:`SCREENED`).
        self.screens: dict[int, dict[Hashable, dict[frozenset[Hashable], _Screen]]] = {
            p: {k: {} for k, rs in rules.items() if k not in self.indexed_keys[p]
                and any(r.compiled.anchor_input_keys for r in rs)} if SCREENED else {}
            for p, rules in self.by_level.items()}
        #: The same screens by ``(level, op key, (op, target) of the one input)`` (:data:`SCREENS_BY_INPUT`).
        self.by_input: dict[tuple[int, Hashable, tuple[str, Any]], _Screen] = {}

    def at(self, node: Node, level: int) -> Iterable[Rule]:
        """The rules of ``level`` that may match with ``node`` as their anchor, in the order to try them."""
        rules, indexed = self.by_level[level], self.indexed_keys[level]
        keys = node_keys(node)
        if len(keys) == 1:
            if keys[0] not in indexed:
                return rules.get(keys[0], ())
        elif not any(key in indexed for key in keys):
            return [r for key in keys for r in rules.get(key, ())]
        self.asked = self.index[level]
        return self.asked.candidates(node)

    def screen(self, node: Node, level: int) -> _Screen | None:
        """The :class:`_Screen` of ``node``'s rules at ``level`` for the keys of its inputs; ``None``
        where the rules are not screened (the index is asked, a node filed under two keys, or no
        rule pre-checks its anchor's inputs)."""
        keys = node_keys(node)
        if len(keys) != 1:
            return None
        table = self.screens[level].get(keys[0])
        if table is None:
            return None
        target = input_target(node) if SCREENS_BY_INPUT else None
        if target is not None:
            found = self.by_input.get((level, keys[0], target))
            if found is not None:
                return found
        inputs = input_keys(node)
        found = table.get(inputs)
        if found is None:
            found = table[inputs] = _Screen(self.by_level[level][keys[0]], inputs)
        if target is not None:
            self.by_input[level, keys[0], target] = found
        return found

    def left_out(self) -> dict[str, int]:
        """Per rule, the attempts the plain search would have counted that the index saved."""
        return {name: n for index in self.index.values() for name, n in index.left_out().items()}

    def screened_out(self) -> dict[str, int]:
        """Per rule, the attempts at visits where the screens kept it from being tried and no rule fired."""
        counts: dict[str, int] = collections.Counter()
        for tables in self.screens.values():
            for table in tables.values():
                for screen in table.values():
                    if screen.misses:
                        for _, name in screen.screened_out:
                            counts[name] += screen.misses
        return counts


class Driver:
    """Drives one graph to a fixed point (see the module's docstring); :meth:`run` once, then
    read :attr:`rewrites`, :meth:`report` and :meth:`applied_rules`."""

    def __init__(self, gm: fx.GraphModule, ruleset: RuleSet, *, budget: int, debug: bool,
                 on_progress: Callable[[int, int], None] | None = None, stop_after: int | None = None) -> None:
        self.gm, self.graph, self.ruleset = gm, gm.graph, ruleset
        self.budget, self.debug, self.on_progress, self.stop_after = budget, debug, on_progress, stop_after
        self.tallies = {r.name: _Tally() for r in ruleset}
        self.rewrites = 0
        self.recent: collections.deque[str] = collections.deque(maxlen=64)  # names of the last rules applied
        self._last: tuple[Rule, str] | None = None  # the last rewrite's rule and anchor name
        #: The rewrite being spliced, for its change event: its rule, match, and each output's users before.
        self._applying: tuple[Rule, Match, tuple[tuple[Node, ...], ...]] | None = None
        self.rules = _Candidates(ruleset)
        self.by_level = self.rules.by_level
        self.reach = max((r.compiled.depth for r in ruleset), default=1)
        self.largest = max((len(r.compiled.inner_nodes) for r in ruleset), default=1)
        #: Is some pattern multi-output? (Its anchor may be another user of a value a deletion moved users to.)
        self.multi_output = any(r.compiled.is_multi_output for r in ruleset)
        needs_modules = any(r.compiled.module_captures for r in ruleset)
        self.modules: dict[str, torch.nn.Module] = named_modules(gm) if needs_modules else {}
        self.settled: dict[str, set[Node]] = {}  # per rule, the nodes it produced from its own pattern
        #: Per rule, the class its anchor's module must have, and the classes its anchor's inputs must call.
        self.anchor_classes, self.input_classes = _module_classes(ruleset) if needs_modules else ({}, {})
        #: Does anything in the graph write in place? Without writes, no match needs the alias walk.
        #: (A replacement may add a write only into a tensor it made; :meth:`_on_change` notes it.)
        self.graph_writes = writes_in_place(self.graph.nodes)
        self.pruned = PRUNED_REQUEUE and not self.graph_writes and not _may_rekey(r.anchor_key for r in ruleset)
        self._writers = _Writers()
        # one pass; kept current by the splicer's change events; it gathers each level's fill on the way
        self.index = OpIndex(self.graph, groups=self.by_level)
        self._matchers = _Matchers(ruleset, gm, self.modules, self.index.nodes)
        self.worklist = Worklist(self.by_level)
        for p in self.by_level:
            self.worklist.fill(p, self.index.grouped[p], in_graph_order=True)
        self.splicer = Splicer(gm, self.modules)
        self.splicer.listen(self._on_change)
        self._logs_rewrites = False  # does the logger take each rewrite (set when a drive starts)

    def run(self) -> None:
        """Rewrite until the worklist is empty (or ``stop_after`` rewrites were made); then keep
        the outputs that were tensors of their own so (see :func:`_keep_outputs_fresh`)."""
        fresh = _fresh_outputs(self.graph)
        aten = _is_aten(self.graph)
        self._logs_rewrites = logger.isEnabledFor(logging.DEBUG)  # (asked once a drive, not at every rewrite)
        visits = 0
        with self.splicer:  # (what recording module calls replaces stays replaced until the drive ends)
            while self.stop_after is None or self.rewrites < self.stop_after:
                popped = self.worklist.pop()
                if popped is None:
                    break
                visits += 1
                if self.on_progress is not None and visits % _PROGRESS_EVERY == 0:
                    self.on_progress(self.rewrites, len(self.worklist))
                self._visit(*popped)
        if self.on_progress is not None:
            self.on_progress(self.rewrites, 0)
        if self.rewrites:
            _keep_outputs_fresh(self.graph, fresh, aten=aten)

    def _visit(self, node: Node, level: int) -> None:
        """Try the rules of ``level`` anchored at ``node``; apply the first match nothing refuses
        (and tell the rule index or the screen which rule fired, so that the report counts the
        attempts the plain search would have made). Screened only while no rule has settled a
        node (a settled rule is not counted: the screen's bulk count does not know it)."""
        screen = self.rules.screen(node, level) if not self.settled else None
        if screen is not None:
            if not screen.passing and SCREENS_BY_INPUT:  # no rule tried, a miss
                screen.misses += 1
            else:
                screen.visited(self._try(node, screen.passing, screen.keys), self.tallies)
            return
        self.rules.asked = None
        applied = self._try(node, self._rules_at(node, level))
        if self.rules.asked is not None:
            self.rules.asked.visited(node, applied)

    def _try(self, node: Node, rules: Iterable[Rule], keys: frozenset[Hashable] | None = None) -> Rule | None:
        """Try ``rules`` at ``node`` in order (``keys``: its :func:`~fxrewrite.canon.input_keys`,
        if known); the rule applied, or ``None``."""
        settled, tallies, matchers = self.settled, self.tallies, self._matchers
        for rule in rules:
            if settled and node in settled.get(rule.name, ()):
                continue  # the rule produced this node from its own pattern: trying again would loop
            tally = tallies[rule.name]
            tally.attempts += 1
            pattern = rule.compiled
            required = pattern.anchor_input_keys
            if required:
                keys = input_keys(node) if keys is None else keys
                if not required <= keys:
                    continue
            if (self.anchor_classes or self.input_classes) and _unbindable(self, rule.name, node):
                continue
            refusal = None
            for match in matchers[rule.name](node):
                # (the common case, no guard and nothing to place, without a call)
                if self.graph_writes or pattern.is_multi_output:
                    refusal = _refusal(rule, match, self._writers if self.graph_writes else None)
                elif rule.where:  # (no placement to check: the guards only, as _refusal would)
                    refusal = rule.refusal(match)
                if refusal is None:
                    try:
                        self._apply(rule, match, tally)
                        return rule
                    except Refuse as declined:  # the graph is as it was; record why and go on
                        refusal = f"the replacement refused: {declined}"
            if refusal is not None:  # every match at this node was refused (a guard, or the engine): count it once
                tally.refused(node, refusal)
        return None

    def _rules_at(self, node: Node, level: int) -> Iterable[Rule]:
        """The rules of ``level`` to try at ``node`` (see :class:`_Candidates`)."""
        return self.rules.at(node, level)

    def _apply(self, rule: Rule, match: Match, tally: _Tally) -> None:
        """Splice ``rule``'s replacement in at ``match``; the change event refills the worklist."""
        if self.rewrites >= self.budget:
            raise _did_not_converge(self.ruleset, self.recent, self.budget)
        self._last = (rule, match.anchor.name)
        outputs = match.outputs
        users = (tuple(outputs[0].users),) if len(outputs) == 1 else tuple([tuple(out.users) for out in outputs])
        self._applying = (rule, match, users)
        started = time.perf_counter()
        try:
            created = self.splicer.splice(match, rule)
        finally:
            self._applying = None
        tally.seconds += time.perf_counter() - started
        tally.applied += 1
        self.rewrites += 1
        self.recent.append(rule.name)
        if self._logs_rewrites:
            logger.debug("rule %s rewrote %s into %d node(s)", rule.name, match.anchor, len(created))
        if self.debug:
            _lint_after(self.graph, rule)

    def _on_change(self, change: Change) -> None:
        """The splicer's change event: file the new nodes, note a rule that reproduced its own
        match, and queue what the change may have made matchable. A replacement that wrote in
        place (into a tensor of its own) makes the graph one that writes: placements are checked
        from then on, and the requeue is no longer pruned (:data:`PRUNED_REQUEUE`)."""
        self.index.add(change.created)
        if change.writes and not self.graph_writes:
            self.graph_writes, self.pruned = True, False
        rewired: list[Node] = []
        unwalked: list[Node] = []
        if self._applying is not None:
            rule, match, users = self._applying
            new_anchor = _standing_for(change, match.anchor)
            if self._reproduces(rule, match, new_anchor):
                self.settled.setdefault(rule.name, set()).add(new_anchor)
            short = (SHORT_DELETION_REQUEUE and self.pruned and not change.created and not self.multi_output)
            rewired, unwalked = _rewired(change, users, self.largest, self.multi_output,
                                         self.worklist.mark if short else None)
        self._requeue(change, rewired, unwalked)

    def _reproduces(self, rule: Rule, match: Match, new_anchor: Node) -> bool:
        """True when the rewrite's result is, canonically, the subgraph it replaced (the rule's
        pattern matches it again with the same bindings: ``F.relu(x, inplace=False) =>
        torch.relu(x)``, ``x + y => y + x``): the rule is not tried there again, so such a rule
        fires once per place instead of looping until the budget runs out."""
        if self.anchor_classes and _wrong_module(self.anchor_classes.get(rule.name), new_anchor, self.modules):
            return False  # (first: a module call is filed under its opcode alone, a fold's result under the anchor's)
        if rule.compiled.anchor_key not in node_keys(new_anchor):
            return False
        return any(_same_bindings(again.bindings, match.bindings) for again in self._matchers[rule.name](new_anchor))

    def _requeue(self, change: Change, rewired: Iterable[Node] = (), unwalked: Collection[Node] = ()) -> None:
        """Queue what ``change`` may have made matchable (:func:`_reached`; ``rewired``: the users
        a deletion moved to a value not walked from, ``unwalked`` or one with many users), in one
        go: the worklist keeps graph order whatever the push order."""
        mark = self.worklist.mark if self.pruned else None
        reached = _reached(change, self.reach, self.largest, mark, rewired, unwalked)
        if reached:
            self.worklist.push_all(reached)

    @property
    def last_rewrite(self) -> str | None:
        """The last rewrite applied (formatted only when asked: the bisection of ``check_inputs``
        reads it once, the drive sets it at every rewrite)."""
        if self._last is None:
            return None
        rule, anchor = self._last
        return f"rule '{rule.name}' ({rule.origin}) at graph node '{anchor}'"

    def report(self, seconds: float) -> Report:
        """What this drive did, rule by rule, as a :class:`Report`. A rule's ``attempts`` are the
        visits of a node it is anchored at until a rule fired there, as the plain search counts
        them: those at which the rule index left it out are added."""
        left_out = collections.Counter(self.rules.left_out())
        left_out.update(self.rules.screened_out())
        stats = {r.name: self.tallies[r.name].freeze(left_out.get(r.name, 0)) for r in self.ruleset}
        return Report(stats, self.rewrites, seconds, self.last_rewrite)

    def applied_rules(self) -> str:
        """The rules applied and how often (``"relu_relu (4x)"``), or ``"none"``, for error messages."""
        return ", ".join(f"{name} ({t.applied}x)" for name, t in self.tallies.items() if t.applied) or "none"


def _wrong_module(cls: type | None, node: Node, modules: Mapping[str, torch.nn.Module]) -> bool:
    """True when ``node`` calls a module that a rule's anchor, a call of a module capture of class
    ``cls``, cannot bind (:data:`FAST_MODULE_ANCHOR`): the search would refuse it first thing."""
    return (FAST_MODULE_ANCHOR and cls is not None and node.op == "call_module"
            and not isinstance(modules.get(str(node.target)), cls))


def _module_classes(ruleset: RuleSet) -> tuple[dict[str, type], dict[str, tuple[type, ...]]]:
    """Per rule anchored at a module capture's call, the class its anchor's module must have
    (:func:`~fxrewrite.match.anchor_module_class`); per rule whose anchor reads module captures'
    calls, their classes (:func:`~fxrewrite.match.anchor_input_module_classes`)."""
    anchors = {r.name: cls for r in ruleset if (cls := anchor_module_class(r.compiled)) is not None}
    inputs = {r.name: classes for r in ruleset if (classes := anchor_input_module_classes(r.compiled))}
    return anchors, inputs


def _unbindable(driver: Driver, name: str, node: Node) -> bool:
    """True when rule ``name`` cannot match at ``node`` for the class of a module its pattern calls
    (:func:`_wrong_module`, :func:`_no_module_input`): the search would refuse it."""
    if _wrong_module(driver.anchor_classes.get(name), node, driver.modules):
        return True
    classes = driver.input_classes.get(name)
    return classes is not None and _no_module_input(classes, node, driver.modules)


def _no_module_input(classes: tuple[type, ...] | None, node: Node, modules: Mapping[str, torch.nn.Module]) -> bool:
    """True when, for one of ``classes`` (the classes of the module captures a rule's anchor reads
    the calls of), no input of ``node`` calls a module of that class and none may be an identity
    the search would look through (:data:`FAST_MODULE_INPUTS`): the search refuses every way."""
    if not (FAST_MODULE_INPUTS and classes):
        return False
    inputs = node._input_nodes
    for cls in classes:
        if not any(a.op == "call_module" and isinstance(modules.get(str(a.target)), cls) for a in inputs):
            return not any(may_be_identity(a) for a in inputs)  # (the costlier test last)
    return False


def _refusal(rule: Rule, match: Match, writers: Callable[[Node], tuple[Node, ...] | None] | None) -> str | None:
    """Why ``match`` cannot be applied: the engine's placement check (``writers``: what writes
    into a value, ``None`` in a graph that writes nowhere in place), then the rule's guards."""
    if writers is not None or match.pattern.is_multi_output:  # else the anchor is the place
        refusal = placement_refusal(match, writers if writers is not None else _no_writers)
        if refusal is not None:
            return refusal
    return rule.refusal(match)


def _is_aten(graph: fx.Graph) -> bool:
    """``is_aten_graph(graph.nodes)``, asked of one node per non-empty ``call_function`` bucket of
    the side table (:data:`ATEN_BY_TARGETS`; a bucket's nodes share their target, and only a
    call_function's target may be an ATen overload)."""
    if not ATEN_BY_TARGETS:
        return is_aten_graph(graph.nodes)
    return is_aten_graph(next(iter(filed)) for (op, _), filed in side_table_buckets(graph).items()
                         if op == "call_function" and filed)


def _lint_after(graph: fx.Graph, rule: Rule) -> None:
    try:
        graph.lint()
    except Exception as exc:
        raise RewriteError(
            f"debug check: the graph fails lint after rule '{rule.name}' ({rule.origin}) was applied: {exc}"
        ) from exc


def _standing_for(change: Change, output: Node) -> Node:
    """The node that stands for the matched ``output`` after ``change`` (a pattern has few outputs:
    a scan, no dict built per rewrite)."""
    for old, new in change.replaced:
        if old is output:
            return new
    raise KeyError(output)


def _rewired(change: Change, users: Sequence[tuple[Node, ...]], largest: int,
             multi_output: bool = False, mark: Any = None) -> tuple[list[Node], list[Node]]:
    """The nodes that read a matched output (``users``: each output's users before the splice, in
    the order of ``change.replaced``, the pattern's) and now read the value standing for it, where
    :func:`_reached` does not walk from that value: a value the match read (a deletion's result)
    with more than ``largest`` users. With ``multi_output`` patterns, all of that value's users: a
    match of ``(sin(x), cos(x))`` anchored at a ``sin`` reading it may now find its ``cos`` among
    the nodes moved there.

    Given the worklist's ``mark`` (a pruned requeue after a deletion of a single-output match,
    :data:`SHORT_DELETION_REQUEUE`), also where such a value gained a user beyond the mark that is
    no check node (then only the moved users at or before the mark: those beyond it wait, with
    what follows them); those values are returned second, for :func:`_reached` to leave out. A node at
    or before the mark that did not read the value anew (no moved user) can gain no match from the
    change: its inputs are as they were, and the value cannot be an inner node of a match anchored
    there (inner nodes come before the anchor; the value's user beyond the mark is outside any such
    match and no check node, which a match may take along); the value's other inputs' users did
    not change (the deletion erased only nodes of the match)."""
    rewired: list[Node] = []
    unwalked: list[Node] = []
    for (old, new), moved in zip(change.replaced, users):
        if new is old or is_erased(new):
            continue
        if len(new.users) > largest:
            rewired += list(new.users) if multi_output else [u for u in moved if not is_erased(u)]
        elif mark is not None:
            before = _moved_short_of(moved, mark)
            if before is not None:
                rewired += before
                unwalked.append(new)
    return rewired, unwalked


def _moved_short_of(moved: Iterable[Node], mark: Any) -> list[Node] | None:
    """The ``moved`` users at or before ``mark`` (those beyond wait already, with what follows
    them), when one beyond it is no check node; else ``None``."""
    beyond = False
    before = []
    for user in moved:
        if node_position(user) > mark:
            beyond = beyond or not is_check(user)
        elif not is_erased(user):
            before.append(user)
    return before if beyond else None


def _reached(change: Change, reach: int, largest: int, mark: Any = None, rewired: Iterable[Node] = (),
             unwalked: Collection[Node] = ()) -> list[Node]:
    """The created nodes, and what lies downstream of them and of the inputs that lost a user, up
    to ``reach`` (the deepest pattern's) users away; such an input may now be an inner node of a
    match, but only if it has no more users than the largest pattern has nodes (``largest``).
    The ``rewired`` nodes (users a deletion moved to such an input with more users: they read a
    new value) count as one user away, and what lies downstream of them is reached too. An input
    that reads another input is reached as its user (that input may now be an inner node of a
    match anchored at it). The inputs ``unwalked`` are not walked from (:func:`_rewired`).
    Given the worklist's ``mark``, none beyond it: those and what follows them wait already."""
    created = [n for n in change.created if not is_erased(n)] if change.created else []
    # per node of the frontier, its users; the rewired nodes first, one user away from the value they now read
    frontier: list[Iterable[Node]] = [rewired] if rewired else []
    for n in created:  # (loops, not comprehensions: a deletion's event walks from one or two inputs)
        frontier.append(n.users)
    for n in change.inputs:
        if not is_erased(n) and len(n.users) <= largest and (not unwalked or n not in unwalked):
            frontier.append(n.users)
    if not frontier:
        return created
    seen = set(created)  # not the inputs: one that reads another input is reached as its user
    reached = created
    for _ in range(reach):
        found = []
        for users in frontier:
            for user in users:
                if user not in seen:
                    seen.add(user)
                    if mark is None or node_position(user) <= mark:
                        found.append(user)
        if not found:
            break
        reached += found
        frontier = [n.users for n in found]
    return reached


def _may_rekey(anchor_keys: Iterable[Hashable]) -> bool:
    """Can a waiting node gain a key some rule anchors at (a call that becomes another op
    respelled when its arguments change: ``x.max(d).values`` is a ``getitem`` only while the
    source is a reduction)? In a graph that writes nowhere in place (an in-place op may become its
    functional twin), only for the keys of :data:`_RESPELLED_KEYS`."""
    return not _RESPELLED_KEYS.isdisjoint(anchor_keys)


def _did_not_converge(ruleset: RuleSet, recent: Iterable[str], budget: int) -> DidNotConverge:
    """The error for a drive that used up its ``budget``, naming the rules ``recent``ly applied."""
    counts = collections.Counter(recent).most_common()
    firing = ", ".join(f"'{name}' ({k}x)" for name, k in counts)
    origins = "; ".join(f"{name} at {ruleset[name].origin}" for name, _ in counts)
    return DidNotConverge(
        f"the rewrite did not reach a fixed point within {budget} rewrites; the last "
        f"{sum(k for _, k in counts)} rewrites were by {firing}. Rules that undo each other (a rule and its "
        f"inverse) never settle: remove one, or add a where= guard. ({origins}). Raise max_rewrites "
        f"if the graph really needs more rewrites."
    )


def _same_bindings(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return a.keys() == b.keys() and all(
        a[k] is b[k] or (not isinstance(a[k], Node) and same_literal(a[k], b[k])) for k in a)


def _no_writers(value: Node) -> tuple[Node, ...]:
    """What writes into a value in a graph without in-place writes."""
    return ()


# -- the outputs' aliasing contract ---------------------------------------------------------------


def _output_values(graph: fx.Graph) -> tuple[Node, list[Any]]:
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    return output, tree_leaves(output.args)


def _shares_an_input(value: Any) -> bool:
    """True when a graph output may be (a view of) an input or an attribute of the module."""
    if not isinstance(value, Node):
        return False
    members = alias_class(value)
    return members is None or any(m.op in ("placeholder", "get_attr") for m in members)


def _fresh_outputs(graph: fx.Graph) -> list[bool]:
    """For each graph output: does it hold a tensor of its own (shares no storage with an input)?"""
    return [not _shares_an_input(v) for v in _output_values(graph)[1]]


def _keep_outputs_fresh(graph: fx.Graph, fresh: list[bool], *, aten: bool) -> None:
    """Keep the outputs' aliasing contract: an output that was a new tensor stays one. After
    ``neg(neg(x)) => x`` the module would return its input itself, and a caller writing into the
    result would write into its input; such an output is cloned instead."""
    output, values = _output_values(graph)
    if len(values) != len(fresh):
        return
    stale = [was_fresh and _shares_an_input(v) for v, was_fresh in zip(values, fresh)]
    if not any(stale):
        return
    clones: dict[Node, Node] = {}
    for value, needs_clone in zip(values, stale):
        if needs_clone and value not in clones:
            with graph.inserting_before(output):
                clone = (graph.call_function(torch.ops.aten.clone.default, (value,)) if aten
                         else graph.call_method("clone", (value,)))
            copy_value(value, clone)
            clone.meta["stack_trace"] = "fxrewrite: the output was a new tensor before rewriting; it stays one\n"
            clones[value] = clone
    positions = iter(stale)
    leaves, spec = tree_flatten(output.args)
    output.args = tree_unflatten(
        [clones[v] if next(positions) else v for v in leaves], spec)
