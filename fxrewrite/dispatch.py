"""Which rules can match at a graph node: a discrimination index below the anchor's op key.

The driver files rules by their anchor's op key, and used to try every rule of that key at
every node computing it. Rules that differ only in a literal (``(x + 1.5) * 2.0`` and
``(x + 0.5) * 3.0``) or in the ops feeding their anchor are then tried one by one: 1,000 such
rules cost 1,000 tries per node. :class:`RuleIndex` files each rule, below its anchor key, under
what its pattern pins at the anchor:

* a **literal** the anchor (depth 1) or an operation feeding it (depth 2) must be given, for a
  group of rules whose anchors are spelt alike (same target, same argument layout); the graph
  node's argument is read once per group, lined up the way the matcher lines it up
  (:func:`~fxrewrite.canon.lined_up_arguments`), both operand orders of a commutative call, and
  at depth 2 every node behind the identities the matcher looks through;
* else the (at most two, the rarest) **op keys of the operations feeding the anchor**
  (:attr:`Pattern.anchor_input_keys`, the keys the driver's pre-check already requires,
  identities looked through by :func:`~fxrewrite.canon.input_keys`);
* else nothing: the rule is a candidate at every node of its anchor key.

It is conservative by construction: whenever a step is not the matcher's own (an argument
compared *by meaning*: dims, ``dtype=``, Python division's ints as floats; a pattern identity
or size expression that the graph may hold otherwise; a literal that cannot be found unambiguously
in the lined-up call), the group's rules are all returned. Its options are the matcher's
defaults (:class:`~fxrewrite.match.MatchOptions()`), which the driver uses.

**Slow twin**: :meth:`RuleIndex.plain`, every rule filed under the node's keys (what the driver
tried before). ``tests/test_dispatch.py`` checks that both find exactly the same matches on the
shipped library and on random rule sets.

>>> import torch
>>> from fxrewrite import Rule
>>> def shifted(i, c):
...     return Rule.from_functions(lambda x: (x + c) * 2.0, lambda x: x * 2.0 + c * 2.0, name=f"r{i}")
>>> rules = [shifted(i, c) for i, c in enumerate((0.5, 1.5, 2.5))]
>>> gm = torch.fx.symbolic_trace(lambda x: (x + 1.5) * 2.0)
>>> mul = next(n for n in gm.graph.nodes if n.name == "mul")
>>> index = RuleIndex(rules)
>>> [r.name for r in index.candidates(mul)], len(index.plain(mul))
(['r1'], 3)
"""

from __future__ import annotations

import math
import operator
from collections.abc import Hashable, Iterable, Sequence
from typing import Any

import attrs
import torch
from torch.fx.node import Node

from .canon import (
    DIM_ARGUMENTS,
    DTYPE_ARGUMENTS,
    identity_source,
    input_keys,
    is_commutative_call,
    lined_up_arguments,
    node_key,
    node_keys,
)
from .pattern import Pattern
from .rule import Rule

__all__ = ["RuleIndex"]

#: Literal types indexed by value: hashable, and equal by :func:`~fxrewrite.canon.same_literal`
#: exactly when their ``(type, value)`` keys are equal.
_SCALARS = (bool, int, float, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)
_NOT_A_KEY = object()
_IDENTITY_HOPS = 16  # identities looked through from the anchor's argument to an inner operation
_MIN_GROUP = 3  # fewer rules alike are cheaper to try than to discriminate
#: Keep, per bucket without literal groups, the rules offered for each set of input keys met
#: (they depend on nothing else); ``False`` is the slow twin, worked out at every node
#: (``tests/test_dispatch.py`` checks both offer the same rules).
MEMO_BY_INPUTS = True
#: Ops whose arguments the matcher compares by meaning (dims, ``dtype=``, unordered pairs): a
#: pattern's literal is rewritten against the graph's rank there, so it is not a fixed key.
_BY_MEANING = frozenset({*DIM_ARGUMENTS, *DTYPE_ARGUMENTS, "transpose", "swapaxes", "swapdims"})

Position = tuple[str, Any]  # ("arg", i) or ("kw", name): where a value is written in a call


def _literal_key(value: Any) -> Any:
    """The index key of a literal (nan keyed as one value), or ``_NOT_A_KEY``."""
    if type(value) not in _SCALARS:
        return _NOT_A_KEY
    if type(value) is float and math.isnan(value):
        return (float, "nan")
    return (type(value), value)


def _written(node: Node, position: Position) -> Any:
    kind, where = position
    return node.args[where] if kind == "arg" else node.kwargs[where]


def _positions(node: Node) -> list[Position]:
    return [("arg", i) for i in range(len(node.args))] + [("kw", k) for k in node.kwargs]


def _shape(value: Any) -> Hashable:
    """A value's layout with literals reduced to their type (what lining up depends on)."""
    if isinstance(value, Node):
        return ("node", value.op)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_shape(v) for v in value))
    return ("literal", type(value).__name__)


def _template(pn: Node, pattern: Pattern) -> Hashable:
    """Two pattern operations with equal templates are lined up against any graph call alike."""
    return (pn.op, pn.target, node_key(pn), tuple(_shape(a) for a in pn.args),
            tuple((k, _shape(v)) for k, v in pn.kwargs.items()), pn in pattern.commutative)


def _comparable(pn: Node, pattern: Pattern) -> bool:
    """Does the matcher compare ``pn``'s literals as written against the graph call it binds?"""
    key = node_key(pn)
    name = key[1] if isinstance(key, tuple) and len(key) == 2 and key[0] == "aten" else None
    return (pn.op in ("call_function", "call_method") and name not in _BY_MEANING
            and pn.target is not operator.truediv and key != ("call_function", operator.getitem)
            and pn not in pattern.value_nodes and pn not in pattern.identities)


def _inner(pn: Node, position: Position, pattern: Pattern) -> Node | None:
    """The operation written at ``position`` of the anchor ``pn``, when the matcher can only
    bind it there (used once, not an output) and compares its literals as written."""
    value = _written(pn, position)
    if (not isinstance(value, Node) or value.op not in ("call_function", "call_method")
            or value in pattern.outputs or len(value.users) != 1
            or sum(a is value for a in (*pn.args, *pn.kwargs.values())) != 1):
        return None
    return value if _comparable(value, pattern) else None


@attrs.frozen
class _Probe:
    """Where a group's rules write their discriminating literal: at the anchor (``inner`` is
    ``None``), or in the operation written at ``inner`` of the anchor."""

    inner: Position | None
    literal: Position

    def operation(self, pattern: Pattern) -> Node:
        return pattern.anchor if self.inner is None else _written(pattern.anchor, self.inner)

    def literal_of(self, pattern: Pattern) -> Any:
        return _written(self.operation(pattern), self.literal)


def _probes(rules: Sequence[Rule]) -> list[_Probe]:
    """The probes every rule of a group (anchors with one template) can be discriminated by."""
    first = rules[0].compiled
    found = [_Probe(None, p) for p in _positions(first.anchor) if not isinstance(_written(first.anchor, p), Node)]
    for position in _positions(first.anchor):
        found_inner = [_inner(r.compiled.anchor, position, r.compiled) for r in rules]
        inner = [q for q in found_inner if q is not None]
        if len(inner) < len(rules) or len({_template(q, r.compiled) for q, r in zip(inner, rules)}) != 1:
            continue
        found += [_Probe(position, p) for p in _positions(inner[0]) if not isinstance(_written(inner[0], p), Node)]
    return found


def _slot(pn: Node, probe_literal: Any, lined: tuple[Any, ...]) -> tuple[int, bool] | None:
    """Where the literal ``probe_literal`` written in ``pn`` stands in ``pn``'s lined-up values,
    and whether lining up wrapped it in a list; ``None`` unless exactly one place holds it."""
    hits = [(j, False) for j, p in enumerate(lined) if p is probe_literal]
    hits += [(j, True) for j, p in enumerate(lined) if isinstance(p, list) and len(p) == 1 and p[0] is probe_literal]
    return hits[0] if len(hits) == 1 else None


def _graph_values(pn: Node, gn: Node, wanted: Any) -> list[Any] | None:
    """The graph values the pattern value ``wanted`` (an argument of ``pn``) may be compared
    with when ``pn`` is matched at ``gn``: its lined-up argument, and the other operand of a
    commutative call. ``None`` when that cannot be told (the caller then discriminates nothing)."""
    lined = lined_up_arguments(pn, gn)
    if lined is None:
        return None
    _, p_values, g_values = lined
    where = _slot(pn, wanted, p_values) if not isinstance(wanted, Node) else _node_slot(wanted, p_values)
    if where is None:
        return None
    j, wrapped = where
    found = [g_values[j]]
    if j < 2 and len(g_values) > 1 and is_commutative_call(gn.op, gn.target, gn.args, gn.kwargs):
        found.append(g_values[1 - j])
    if wrapped:
        found = [g[0] for g in found if isinstance(g, (list, tuple)) and len(g) == 1]
    return found


def _node_slot(value: Node, lined: tuple[Any, ...]) -> tuple[int, bool] | None:
    hits = [j for j, p in enumerate(lined) if p is value]
    return (hits[0], False) if len(hits) == 1 else None


def _behind_identities(value: Any) -> list[Node]:
    """``value`` and every node behind the identities in front of it (what the matcher may bind
    an inner operation to when it meets ``value``)."""
    chain: list[Node] = []
    while isinstance(value, Node) and len(chain) < _IDENTITY_HOPS:
        chain.append(value)
        value = identity_source(value)
    return chain


class _Group:
    """Rules whose anchors share a template, keyed by the literal one probe reads."""

    def __init__(self, rules: Sequence[Rule], positions: Sequence[int], probe: _Probe) -> None:
        self.probe = probe
        self.pattern = rules[0].compiled
        self.operation = probe.operation(self.pattern)
        self.literal = probe.literal_of(self.pattern)
        self.everyone = sorted(positions)
        self.by_literal: dict[Any, list[int]] = {}
        self.any: list[int] = []
        for rule, position in zip(rules, positions):
            key = _literal_key(probe.literal_of(rule.compiled))
            (self.any if key is _NOT_A_KEY else self.by_literal.setdefault(key, [])).append(position)

    def select(self, node: Node) -> list[int]:
        """Positions of the group's rules that may match at ``node`` (all when unsure)."""
        operations: list[Node] = [node]
        if self.probe.inner is not None:
            fed = _graph_values(self.pattern.anchor, node, self.operation)
            if fed is None:
                return self.everyone
            operations = [h for g in fed for h in _behind_identities(g) if node_key(self.operation) in node_keys(h)]
        selected = list(self.any)
        seen: set[Any] = set()
        for operation in operations:
            values = _graph_values(self.operation, operation, self.literal)
            if values is None:
                return self.everyone
            for value in values:
                key = _literal_key(value)  # a node or a value of another type matches no literal
                if key is not _NOT_A_KEY and key not in seen:
                    seen.add(key)
                    selected += self.by_literal.get(key, ())
        return selected


def _best_probe(rules: Sequence[Rule]) -> _Probe | None:
    """The probe telling most of ``rules`` apart (depth 1 first on a tie), if it tells any."""
    best, best_count = None, 1
    for probe in _probes(rules):
        count = len({_literal_key(probe.literal_of(r.compiled)) for r in rules} - {_NOT_A_KEY})
        if count > best_count:
            best, best_count = probe, count
    return best


class _Bucket:
    """The rules of one anchor key, in order, filed below it, and the visits it served."""

    def __init__(self, rules: Sequence[Rule]) -> None:
        self.rules = tuple(rules)
        self.position = {id(r): i for i, r in enumerate(self.rules)}
        self.full = 0  # visits at which the plain search would have reached every rule
        self.stops: dict[int, int] = {}  # position of the rule that fired -> visits that stopped there
        self.tried = [0] * len(self.rules)  # per rule, visits at which it was a candidate and was reached
        self.always: list[int] = []
        self.by_input: dict[frozenset[Hashable], list[int]] = {}
        self.groups: list[_Group] = []
        #: Per set of input keys, what :meth:`select` returns (buckets without literal groups).
        self._memo: dict[frozenset[Hashable], tuple[Sequence[int], Sequence[Rule]]] = {}
        alike: dict[Hashable, list[int]] = {}
        for i, rule in enumerate(self.rules):
            pattern = rule.compiled
            template = _template(pattern.anchor, pattern) if _comparable(pattern.anchor, pattern) else None
            alike.setdefault(template if template is not None else ("alone", i), []).append(i)
        rest: list[int] = []
        for positions in alike.values():
            probe = _best_probe([self.rules[i] for i in positions]) if len(positions) >= _MIN_GROUP else None
            if probe is None:
                rest += positions
            else:
                self.groups.append(_Group([self.rules[i] for i in positions], positions, probe))
        self._file_by_inputs(sorted(rest))
        self.everything: tuple[Sequence[int], Sequence[Rule]] = (range(len(self.rules)), self.rules)

    def _file_by_inputs(self, positions: list[int]) -> None:
        """Each rule under the two rarest op keys its anchor must read (one when it needs one),
        or with no key at all: a node offers the rules filed under a key, or a pair of keys, of
        what feeds it."""
        counts: dict[Hashable, int] = {}
        for i in positions:
            for key in self.rules[i].compiled.anchor_input_keys:
                counts[key] = counts.get(key, 0) + 1
        for i in positions:
            required = sorted(self.rules[i].compiled.anchor_input_keys, key=lambda k: (counts[k], repr(k)))
            if not required:
                self.always.append(i)
                continue
            self.by_input.setdefault(frozenset(required[:2]), []).append(i)

    def select(self, node: Node) -> tuple[Sequence[int], Sequence[Rule]]:
        """Positions of the rules that may match at ``node``, in order, and those rules. Without
        literal groups they depend on the input keys alone: one answer per set of input keys,
        worked out once (:data:`MEMO_BY_INPUTS`)."""
        if not self.by_input and not self.groups:
            return self.everything
        if self.groups or not MEMO_BY_INPUTS:
            positions = self._by_inputs(input_keys(node)) if self.by_input else list(self.always)
            for group in self.groups:
                positions += group.select(node)
            positions.sort()
            return positions, [self.rules[i] for i in positions]
        inputs = input_keys(node)
        found = self._memo.get(inputs)
        if found is None:
            positions = self._by_inputs(inputs)
            positions.sort()
            found = self._memo[inputs] = (tuple(positions), tuple(self.rules[i] for i in positions))
        return found

    def _by_inputs(self, inputs: frozenset[Hashable]) -> list[int]:
        """The positions of the rules offered by a node fed by ``inputs``: those filed under no key,
        under one of them, or under a pair of them (unsorted)."""
        positions = list(self.always)
        keys = sorted(inputs, key=repr)
        for j, key in enumerate(keys):
            positions += self.by_input.get(frozenset((key,)), ())
            for other in keys[j + 1:]:
                positions += self.by_input.get(frozenset((key, other)), ())
        return positions

    def visited(self, candidates: Sequence[int], stop: int | None) -> None:
        """One visit: the plain search would have tried the rules up to ``stop`` (all: ``None``)."""
        if stop is None:
            self.full += 1
        else:
            self.stops[stop] = self.stops.get(stop, 0) + 1
        for i in candidates:
            if stop is not None and i > stop:
                break
            self.tried[i] += 1

    def left_out(self) -> dict[str, int]:
        """Per rule, the visits at which the plain search would have tried it and the index did not
        offer it (a suffix sum over the stops: no loop over the rules per visit)."""
        out, reached = {}, self.full
        for i in range(len(self.rules) - 1, -1, -1):
            reached += self.stops.get(i, 0)
            out[self.rules[i].name] = reached - self.tried[i]
        return out


class RuleIndex:
    """The rules that may match at a node, in the order the driver tries them.

    ``rules`` are given in the driver's order (one priority level of a :class:`RuleSet`, in
    rule-set order). :meth:`candidates` returns a sub-list of :meth:`plain` (the rules filed
    under the node's keys, :func:`~fxrewrite.canon.node_keys` order, then rule order) that
    leaves out only rules the matcher cannot match at that node.
    """

    def __init__(self, rules: Iterable[Rule]) -> None:
        by_key: dict[Hashable, list[Rule]] = {}
        for rule in rules:
            by_key.setdefault(rule.anchor_key, []).append(rule)
        self._plain = {key: tuple(rs) for key, rs in by_key.items()}
        self._buckets = {key: _Bucket(rs) for key, rs in by_key.items()}
        self._last: tuple[Node | None, list[tuple[_Bucket, tuple[Sequence[int], Sequence[Rule]]]]] = (None, [])

    def candidates(self, node: Node) -> Sequence[Rule]:
        """The rules that may match with ``node`` as their anchor (never one that could, see
        the module's docstring)."""
        selected = [(bucket, bucket.select(node)) for key in node_keys(node)
                    if (bucket := self._buckets.get(key)) is not None]
        self._last = (node, selected)
        if len(selected) == 1:
            return selected[0][1][1]
        return [r for _, (_, rules) in selected for r in rules]

    def visited(self, node: Node, applied: Rule | None) -> None:
        """Note that the driver tried :meth:`candidates` of ``node`` in order until ``applied``
        fired (``None``: none did), so that :meth:`left_out` can say what the plain search
        would have counted. Costs O(candidates tried), never O(rules)."""
        last, selected = self._last
        if last is not node:
            selected = [(self._buckets[k], self._buckets[k].select(node)) for k in node_keys(node)
                        if k in self._buckets]
        stopped = False
        for bucket, (positions, _) in selected:
            if stopped:
                break  # the plain search never reached the rules of the later keys
            stop = bucket.position.get(id(applied)) if applied is not None else None
            bucket.visited(positions, stop)
            stopped = stop is not None

    def left_out(self) -> dict[str, int]:
        """Per rule, the visits (noted by :meth:`visited`) at which the plain search would have
        tried it and the index did not offer it: what a driver adds to the attempts it counted to
        report the plain search's ``attempts``."""
        return {name: n for bucket in self._buckets.values() for name, n in bucket.left_out().items()}

    def discriminates(self, key: Hashable) -> bool:
        """True when the index tells some rules anchored at ``key`` apart by a literal (rules alike
        but for a constant), which is where asking it pays even for a few rules."""
        bucket = self._buckets.get(key)
        return bucket is not None and bool(bucket.groups)

    def plain(self, node: Node) -> Sequence[Rule]:
        """The slow twin: every rule anchored at what ``node`` computes, under each of its keys."""
        keys = node_keys(node)
        if len(keys) == 1:
            return self._plain.get(keys[0], ())
        return [r for key in keys for r in self._plain.get(key, ())]
