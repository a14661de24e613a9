"""``rewrite``: apply a rule set to a program until nothing matches.

The driver keeps one worklist per priority level, each ordered by graph position and holding
only nodes whose op key some rule of that level can match. It always serves the highest
level that has work, so a high-priority rule wins over a lower one wherever both could fire.
After each rewrite only the nodes the rewrite could have affected are queued again: the new
nodes, and what lies downstream of the new nodes and of the inputs that lost a user, as far as
the deepest pattern reaches. A budget turns a rule set that never settles into
:class:`DidNotConverge`. The graph is linted and recompiled once, at the end.

>>> import torch
>>> from fxrewrite import Rule, rewrite
>>> relu_relu = Rule.from_functions(lambda x: torch.relu(torch.relu(x)), lambda x: torch.relu(x),
...                                 name="relu_relu")
>>> class Net(torch.nn.Module):
...     def forward(self, x):
...         for _ in range(5):
...             x = torch.relu(x)
...         return x
>>> result = rewrite(Net(), relu_relu)
>>> result.report.applied["relu_relu"], sum(n.target is torch.relu for n in result.module.graph.nodes)
(4, 1)
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import os
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any

import attrs
import torch
import torch.fx as fx
from torch.fx.node import Node

from ._gc import collections_paused
from ._torch import is_erased, tree_flatten, tree_leaves, tree_unflatten
from .canon import alias_class, input_keys, mutation, node_keys, same_literal, writers_of
from .errors import ArgumentError, DidNotConverge, FxRewriteError, Refuse, RewriteError
from .index import OpIndex
from .match import Match, match_at, node_position
from .meta import propagate_inputs
from .replace import Splicer, placement_refusal
from .report import MAX_REASONS, Report, RewriteResult, RuleStats
from .rule import Rule, RuleSet, RulesLike, as_ruleset
from .target import to_graph_module

__all__ = ["rewrite", "rewrite_graph"]

logger = logging.getLogger(__name__)


@attrs.define
class _Tally:
    attempts: int = 0
    applied: int = 0
    rejected: int = 0
    seconds: float = 0.0
    reasons: list[str] = attrs.Factory(list)

    def freeze(self) -> RuleStats:
        return RuleStats(self.attempts, self.applied, self.rejected, self.seconds, tuple(self.reasons))


_PROGRESS_EVERY = 2048  # visits between two on_progress calls


def rewrite(
    target: torch.nn.Module | Callable[..., Any],
    rules: RulesLike,
    *,
    inplace: bool = False,
    max_rewrites: int | None = None,
    example_inputs: Sequence[Any] | None = None,
    debug: bool | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    check_inputs: Sequence[Any] | None = None,
    _stop_after: int | None = None,
) -> RewriteResult:
    """Rewrite ``target`` with ``rules`` to a fixed point.

    >>> import torch, fxrewrite
    >>> neg_neg = fxrewrite.Rule.from_functions(lambda x: torch.neg(torch.neg(x)), lambda x: x, name="neg_neg")
    >>> result = fxrewrite.rewrite(lambda a: torch.relu(torch.neg(torch.neg(a))), neg_neg)
    >>> result.report.applied, "neg" in result.code
    ({'neg_neg': 1}, False)

    ``target`` is an ``nn.Module`` or a function (traced with ``torch.fx.symbolic_trace``), a
    ``GraphModule`` (copied unless ``inplace=True``) or a ``torch.export.ExportedProgram`` (its
    lifted graph is rewritten; the result's ``exported_program`` is the rewritten program, with
    the same signature and state dict, and ``module`` its ``.module()``); the caller's module is
    never modified unless ``inplace=True``.

    ``max_rewrites`` bounds the number of rewrites (default: eight per graph node, plus 64).
    ``example_inputs`` gives a graph without metadata the shapes and dtypes guards and
    replacements read (fake tensors are propagated, see :mod:`fxrewrite.meta`; the rewrite is then
    specialised to them). ``debug`` (or ``FXREWRITE_DEBUG=1``) lints the graph after every
    rewrite and names the rule after which a check failed. ``on_progress(rewrites, queued)`` is
    called now and then (for progress displays). ``check_inputs`` (a tuple of arguments, or a list
    of such tuples) verifies the result against the original on them; when they differ, the
    rewrites are bisected and :class:`NotEquivalent` names the first rewrite that changed the
    result. A bad option is an :class:`ArgumentError` naming it.
    """
    _check_arguments(inplace=inplace, max_rewrites=max_rewrites, example_inputs=example_inputs, debug=debug,
                     on_progress=on_progress, check_inputs=check_inputs)
    ruleset = as_ruleset(rules)
    with collections_paused():  # a big rewrite would otherwise spend most of its time in full collections
        if check_inputs is not None:
            return _checked_rewrite(target, ruleset, check_inputs, inplace=inplace, max_rewrites=max_rewrites,
                                    example_inputs=example_inputs, debug=debug, on_progress=on_progress)
        if isinstance(target, torch.export.ExportedProgram):  # rewrite the lifted graph, build a program again
            from .exported import rewrite_program

            return rewrite_program(target, ruleset, inplace=inplace, example_inputs=example_inputs,
                                   max_rewrites=max_rewrites, debug=debug, on_progress=on_progress,
                                   _stop_after=_stop_after)
        return _rewrite_module(target, ruleset, inplace=inplace, max_rewrites=max_rewrites,
                               example_inputs=example_inputs, debug=debug, on_progress=on_progress,
                               stop_after=_stop_after)


def _rewrite_module(target: torch.nn.Module | Callable[..., Any], ruleset: RuleSet, *, inplace: bool,
                    max_rewrites: int | None, example_inputs: Sequence[Any] | None, debug: bool | None,
                    on_progress: Callable[[int, int], None] | None, stop_after: int | None) -> RewriteResult:
    """``rewrite`` of a module or function (arguments checked)."""
    gm = to_graph_module(target, inplace=inplace)
    if example_inputs is not None:
        propagate_inputs(gm, example_inputs)
    started = time.perf_counter()
    driver = _Driver(gm, ruleset, budget=_budget(gm.graph, max_rewrites), debug=_debug(debug), on_progress=on_progress,
                     stop_after=stop_after)
    try:
        driver.run()
    except FxRewriteError as exc:
        if inplace and driver.rewrites:
            gm.recompile()
            _add_note(exc, f"inplace=True: the module keeps the {driver.rewrites} rewrite(s) applied before this "
                           f"error.")
        raise
    _check_lint(gm.graph, driver, how="rerun with debug=True (or FXREWRITE_DEBUG=1)")
    if driver.rewrites:
        _drop_dead_attributes(gm, owned=not inplace)
    _recompile(gm, driver, inplace=inplace)
    return RewriteResult(gm, driver.report(time.perf_counter() - started))


def _budget(graph: fx.Graph, max_rewrites: int | None) -> int:
    """The rewrite budget: ``max_rewrites``, or eight rewrites per graph node plus 64."""
    return max_rewrites if max_rewrites is not None else 8 * len(graph.nodes) + 64


def _debug(debug: bool | None) -> bool:
    """``debug``, or when it is ``None`` the environment variable ``FXREWRITE_DEBUG``."""
    return debug if debug is not None else os.environ.get("FXREWRITE_DEBUG", "") not in ("", "0")


def _check_lint(graph: fx.Graph, driver: _Driver, *, how: str) -> None:
    """The rewritten graph lints, else a :class:`RewriteError` naming the rules applied and
    ``how`` to find the one after which it broke."""
    try:
        graph.lint()
    except Exception as exc:
        raise RewriteError(
            f"the rewritten graph is invalid ({exc}); {how} to find the rule after which it broke. Rules applied: "
            f"{driver.applied_rules()}."
        ) from exc


def _recompile(gm: fx.GraphModule, driver: _Driver, *, inplace: bool) -> None:
    """Generate the rewritten module's code; a graph Python cannot be generated from is a
    :class:`RewriteError` naming the rules applied, never a raw error from code generation."""
    try:
        gm.recompile()
    except Exception as exc:
        kept = (" With inplace=True the module's graph holds the rewrites but its code is the old one: rebuild it "
                "from a fresh trace." if inplace else " The caller's module is untouched.")
        raise RewriteError(
            f"the rewritten graph could not be turned into Python code ({type(exc).__name__}: {exc}). Rules "
            f"applied: {driver.applied_rules()}.{kept}") from exc


def _add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)`` (Python 3.11+); on 3.10 the note joins the message."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:
        exc.args = (f"{exc.args[0] if exc.args else ''}\n{note}", *exc.args[1:])


def _check_arguments(*, inplace: Any, max_rewrites: Any, example_inputs: Any, debug: Any, on_progress: Any,
                     check_inputs: Any) -> None:
    """``rewrite``'s options, checked before anything is traced: an :class:`ArgumentError` names
    the argument, what it got and what it takes."""
    def refuse(name: str, got: Any, takes: str) -> ArgumentError:
        return ArgumentError(f"rewrite(): {name}= takes {takes}, got {got!r} ({type(got).__name__}).")

    if not isinstance(inplace, bool):
        raise refuse("inplace", inplace, "True or False")
    if debug is not None and not isinstance(debug, bool):
        raise refuse("debug", debug, "True, False or None")
    if max_rewrites is not None and (not isinstance(max_rewrites, int) or isinstance(max_rewrites, bool)
                                     or max_rewrites < 0):
        raise refuse("max_rewrites", max_rewrites, "a number of rewrites >= 0, or None for the default")
    if on_progress is not None and not callable(on_progress):
        raise refuse("on_progress", on_progress, "a function on_progress(rewrites, queued), or None")
    if example_inputs is not None and not isinstance(example_inputs, (tuple, list)):
        raise refuse("example_inputs", example_inputs, "a tuple of the forward() arguments, e.g. (x,)")
    if check_inputs is not None:
        cases = check_inputs if isinstance(check_inputs, list) else [check_inputs]
        for case in cases:
            if not isinstance(case, tuple) or not any(isinstance(v, torch.Tensor) for v in case):
                raise refuse("check_inputs", check_inputs, "a tuple of forward() arguments with at least one tensor, "
                                                           "e.g. (torch.randn(2, 3),), or a list of such tuples")


def _checked_rewrite(target: Any, ruleset: RuleSet, check_inputs: Sequence[Any], *, inplace: bool,
                     **options: Any) -> RewriteResult:
    """``rewrite`` followed by a comparison with the original on ``check_inputs``; on a
    difference, bisect the (deterministic) sequence of rewrites for the first culprit."""
    from .errors import NotEquivalent
    from .verify import assert_equivalent

    reference = to_graph_module(target)  # an untouched copy: inplace may change ``target``
    reference.recompile()  # a copy of a GraphModule is not compiled yet (rewrite() compiles its own result)

    def differs(module: torch.nn.Module) -> str | None:
        try:
            assert_equivalent(reference, module, check_inputs)
        except NotEquivalent as exc:
            return str(exc)
        return None

    result = rewrite(target, ruleset, inplace=inplace, **options)
    problem = differs(result.module)
    if problem is None:
        return result
    low, high = 0, result.report.rewrites  # the first `high` rewrites differ, the first `low` do not
    while high - low > 1:
        middle = (low + high) // 2
        partial = rewrite(reference, ruleset, _stop_after=middle, **options)
        low, high = (low, middle) if differs(partial.module) else (middle, high)
    culprit = rewrite(reference, ruleset, _stop_after=high, **options).report.last_rewrite
    raise NotEquivalent(
        f"the rewritten module differs from the original on check_inputs: {problem}. The first rewrite that "
        f"changes the result is #{high} of {result.report.rewrites}: {culprit}. Restrict that rule with a "
        f"guard or a declared domain (fxrewrite.testing.check_rule finds its counterexamples), or remove it."
    )


def _drop_dead_attributes(gm: fx.GraphModule, *, owned: bool) -> None:
    """After rewriting: erase ``get_attr`` nodes nothing reads any more, and the submodules no
    node calls (the conv and bn a folding rule replaced); in a module fxrewrite made itself
    (``owned``), also its own parameters and buffers no node reads. Attributes inside
    submodules are never touched: those modules are shared with the caller's model."""
    for node in list(gm.graph.nodes):
        if node.op == "get_attr" and not node.users:
            gm.graph.erase_node(node)
    gm.delete_all_unused_submodules()
    if not owned:
        return
    read = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
    for name, _ in [*gm.named_parameters(recurse=False), *gm.named_buffers(recurse=False)]:
        if name not in read:  # only gm's own attributes: submodules may be shared with the caller
            delattr(gm, name)


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
            clone.meta.update({k: value.meta[k] for k in ("val", "tensor_meta") if k in value.meta})
            clone.meta["stack_trace"] = "fxrewrite: the output was a new tensor before rewriting; it stays one\n"
            clones[value] = clone
    positions = iter(stale)
    leaves, spec = tree_flatten(output.args)
    output.args = tree_unflatten(
        [clones[v] if next(positions) else v for v in leaves], spec)


def _same_bindings(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return a.keys() == b.keys() and all(
        a[k] is b[k] or (not isinstance(a[k], Node) and same_literal(a[k], b[k])) for k in a)


def _input_keys(node: Node) -> frozenset[Hashable]:
    """The op keys of the nodes feeding ``node``, identities looked through (for the cheap
    pre-check before matching: a pattern whose anchor reads an op ``node`` does not read cannot
    match there)."""
    return input_keys(node)


def _no_writers(value: Node) -> tuple[Node, ...]:
    """What writes into a value in a graph without in-place writes."""
    return ()


class _Driver:
    """The worklist: one queue of graph nodes per priority level, served highest first."""

    def __init__(self, gm: fx.GraphModule, ruleset: RuleSet, *, budget: int, debug: bool,
                 on_progress: Callable[[int, int], None] | None = None, stop_after: int | None = None) -> None:
        self.on_progress = on_progress
        self.stop_after = stop_after
        self._last: tuple[Rule, str] | None = None  # the last rewrite's rule and anchor name
        self.gm = gm
        self.graph = gm.graph
        self.ruleset = ruleset
        self.budget = budget
        self.debug = debug
        self.logging = logger.isEnabledFor(logging.DEBUG)
        self.tallies = {r.name: _Tally() for r in ruleset}
        self.rewrites = 0
        self.recent: collections.deque[str] = collections.deque(maxlen=64)
        self.levels = sorted({r.priority for r in ruleset}, reverse=True)
        self.by_level: dict[int, dict[Hashable, list[Rule]]] = {p: {} for p in self.levels}
        for r in ruleset:  # RuleSet order within a level
            self.by_level[r.priority].setdefault(r.anchor_key, []).append(r)
        self.reach = max((r.compiled.depth for r in ruleset), default=1)
        self.largest = max((len(r.compiled.inner_nodes) for r in ruleset), default=1)
        self.needs_modules = any(r.compiled.module_captures for r in ruleset)
        self.modules: dict[str, torch.nn.Module] = dict(gm.named_modules()) if self.needs_modules else {}
        self.splicer = Splicer(gm, self.modules)
        self.mutation_cache: dict[Node, tuple[int, tuple[Node, ...] | None]] = {}
        #: Does anything in the graph write in place? (Rewrites never add a write: replacements
        #: writing into their inputs are refused.) Without writes, no match needs the alias walk.
        self.graph_writes = any(mutation(n) is not None for n in self.graph.nodes)
        self.settled: dict[str, set[Node]] = {}
        self.seq = itertools.count()
        self.queues: dict[int, list[tuple[Any, int, Node]]] = {}
        self.queued: dict[int, set[Node]] = {}
        self.index = OpIndex(self.graph)  # one pass; kept current by _apply
        for p in self.levels:
            nodes = [n for key in self.by_level[p] for n in self.index.nodes(key)]
            self.queues[p] = [(node_position(n), next(self.seq), n) for n in nodes]
            heapq.heapify(self.queues[p])
            self.queued[p] = set(nodes)

    def run(self) -> None:
        fresh = _fresh_outputs(self.graph)
        aten = any(isinstance(n.target, torch._ops.OpOverload) for n in self.graph.nodes)
        with self.splicer:
            self._drain()
        if self.rewrites:
            _keep_outputs_fresh(self.graph, fresh, aten=aten)

    def _drain(self) -> None:
        visits = 0
        queues, levels, pop = self.queues, self.levels, heapq.heappop
        while True:
            for level in levels:
                if queues[level]:
                    break
            else:
                level = None
            if self.stop_after is not None and self.rewrites >= self.stop_after:
                level = None
            if level is None:
                if self.on_progress is not None:
                    self.on_progress(self.rewrites, 0)
                return
            visits += 1
            if self.on_progress is not None and visits % _PROGRESS_EVERY == 0:
                self.on_progress(self.rewrites, sum(len(q) for q in queues.values()))
            node = pop(queues[level])[2]
            self.queued[level].discard(node)
            if not is_erased(node):
                self._visit(node, level)

    def _visit(self, node: Node, level: int) -> None:
        input_keys = None
        for rule in self._rules_at(node, level):
            if node in self.settled.get(rule.name, ()):
                continue  # the rule produced this node from its own pattern: trying again would loop
            tally = self.tallies[rule.name]
            tally.attempts += 1
            required = rule.compiled.anchor_input_keys
            if required:
                input_keys = _input_keys(node) if input_keys is None else input_keys
                if not required <= input_keys:
                    continue
            refusal = None
            for match in match_at(rule.compiled, node, self.gm, modules=self.modules, candidates=self._nodes_with_key):
                refusal = None
                if self.graph_writes or match.pattern.is_multi_output:  # else the anchor is the place
                    refusal = placement_refusal(match, self._writers if self.graph_writes else _no_writers)
                if refusal is None:
                    refusal = rule.refusal(match)
                if refusal is None:
                    try:
                        self._apply(rule, match, tally)
                        return
                    except Refuse as declined:  # the graph is as it was; record why and go on
                        refusal = f"the replacement refused: {declined}"
            if refusal is not None:  # every match at this node was refused (a guard, or the engine): count it once
                tally.rejected += 1
                if len(tally.reasons) < MAX_REASONS:
                    tally.reasons.append(f"at '{node.name}': {refusal}")

    def _rules_at(self, node: Node, level: int) -> Iterable[Rule]:
        """The rules of ``level`` anchored at what ``node`` computes (under each of its keys)."""
        rules = self.by_level[level]
        keys = node_keys(node)
        if len(keys) == 1:
            return rules.get(keys[0], ())
        return [r for key in keys for r in rules.get(key, ())]

    def _writers(self, value: Node) -> tuple[Node, ...] | None:
        """:func:`~fxrewrite.canon.writers_of`, cached per node with its user count: a node that only
        lost users keeps its answer (a rewrite never adds an in-place write: replacements writing
        into inputs are refused, and matches whose outputs are written are never applied), so a
        widely used input is scanned once, not once per rewrite."""
        cached = self.mutation_cache.get(value)
        if cached is None or len(value.users) > cached[0]:
            cached = self.mutation_cache[value] = (len(value.users), writers_of(value))
        return cached[1]

    @property
    def last_rewrite(self) -> str | None:
        """The last rewrite applied (formatted only when asked: the bisection of ``check_inputs``
        reads it once, the drive sets it at every rewrite)."""
        if self._last is None:
            return None
        rule, anchor = self._last
        return f"rule '{rule.name}' ({rule.origin}) at graph node '{anchor}'"

    def report(self, seconds: float) -> Report:
        """What this drive did, rule by rule, as a :class:`Report`."""
        return Report({r.name: self.tallies[r.name].freeze() for r in self.ruleset}, self.rewrites, seconds,
                      self.last_rewrite)

    def applied_rules(self) -> str:
        return ", ".join(f"{name} ({t.applied}x)" for name, t in self.tallies.items() if t.applied) or "none"

    def _nodes_with_key(self, key: Hashable) -> list[Node]:
        """Candidates for patterns whose outputs share no node, from the op index (no scan of
        the graph per anchor candidate)."""
        return self.index.nodes(key)

    def _apply(self, rule: Rule, match: Match, tally: _Tally) -> None:
        if self.rewrites >= self.budget:
            raise self._did_not_converge()
        inputs = [v for v in match.bindings.values() if isinstance(v, Node)]
        self._last = (rule, match.anchor.name)
        started = time.perf_counter()
        created = self.splicer.splice(match, rule)
        self.index.add(created)
        new_anchor = self.splicer.last_outputs[match.outputs.index(match.anchor)]
        if self._reproduces(rule, match, new_anchor):
            self.settled.setdefault(rule.name, set()).add(new_anchor)
        tally.seconds += time.perf_counter() - started
        tally.applied += 1
        self.rewrites += 1
        self.recent.append(rule.name)
        if self.logging:
            logger.debug("rule %s rewrote %s into %d node(s)", rule.name, match.anchor, len(created))
        if self.debug:
            self._lint_after(rule)
        self._requeue(created, inputs)

    def _reproduces(self, rule: Rule, match: Match, new_anchor: Node) -> bool:
        """True when the rewrite's result is, canonically, the subgraph it replaced (the rule's
        pattern matches it again with the same bindings: ``F.relu(x, inplace=False) =>
        torch.relu(x)``, ``x + y => y + x``): the rule is not tried there again, so such a rule
        fires once per place instead of looping until the budget runs out."""
        if rule.anchor_key not in node_keys(new_anchor):
            return False
        return any(_same_bindings(again.bindings, match.bindings)
                   for again in match_at(rule.compiled, new_anchor, self.gm, modules=self.modules,
                                         candidates=self._nodes_with_key))

    def _requeue(self, created: list[Node], inputs: Iterable[Node]) -> None:
        """Queue what the rewrite may have made matchable: the new nodes, and what lies
        downstream of them and of the inputs that lost a user (such an input may now be an inner
        node of a match, but only if it has no more users than the largest pattern has nodes)."""
        lost_a_user = [n for n in inputs if not is_erased(n) and len(n.users) <= self.largest]
        frontier = [n for n in (*created, *lost_a_user) if not is_erased(n)]
        seen = set(frontier)
        for n in created:
            if not is_erased(n):
                self._push(n)
        for _ in range(self.reach):
            next_frontier = []
            for n in frontier:
                for user in n.users:
                    if user not in seen:
                        seen.add(user)
                        next_frontier.append(user)
                        self._push(user)
            frontier = next_frontier

    def _push(self, node: Node) -> None:
        keys = node_keys(node)
        for p in self.levels:
            if node not in self.queued[p] and any(key in self.by_level[p] for key in keys):
                self.queued[p].add(node)
                heapq.heappush(self.queues[p], (node_position(node), next(self.seq), node))

    def _lint_after(self, rule: Rule) -> None:
        try:
            self.graph.lint()
        except Exception as exc:
            raise RewriteError(
                f"debug check: the graph fails lint after rule '{rule.name}' ({rule.origin}) was applied: {exc}"
            ) from exc

    def _did_not_converge(self) -> DidNotConverge:
        counts = collections.Counter(self.recent).most_common()
        firing = ", ".join(f"'{name}' ({k}x)" for name, k in counts)
        origins = "; ".join(f"{name} at {self.ruleset[name].origin}" for name, _ in counts)
        return DidNotConverge(
            f"the rewrite did not reach a fixed point within {self.budget} rewrites; the last "
            f"{len(self.recent)} rewrites were by {firing}. Rules that undo each other (a rule and its "
            f"inverse) never settle: remove one, or add a where= guard. ({origins}). Raise max_rewrites "
            f"if the graph really needs more rewrites."
        )


def rewrite_graph(graph: fx.Graph, rules: RulesLike, *, max_rewrites: int | None = None) -> Report:
    """Rewrite a bare ``torch.fx.Graph`` in place with ``rules`` to a fixed point; return the
    :class:`Report`.

    For passes that are handed a graph rather than a module (Inductor's custom graph passes,
    see :func:`fxrewrite.inductor_pass`). Tensors and modules a replacement creates are
    registered on ``graph.owning_module``; a graph without an owning module gets a new
    ``GraphModule`` as its owner. The owning module is recompiled when something changed.

    >>> import torch, torch.fx as fx
    >>> from fxrewrite import Rule
    >>> graph = fx.symbolic_trace(lambda a: torch.neg(torch.neg(a)) + 1).graph
    >>> report = rewrite_graph(graph, Rule.from_functions(lambda x: torch.neg(torch.neg(x)), lambda x: x,
    ...                                                   name="neg_neg"))
    >>> report.applied, [n.op for n in graph.nodes]
    ({'neg_neg': 1}, ['placeholder', 'call_function', 'output'])
    """
    if not isinstance(graph, fx.Graph):
        raise ArgumentError(
            f"rewrite_graph takes a torch.fx.Graph, got {type(graph).__name__}; pass gm.graph, or use "
            f"fxrewrite.rewrite for modules, functions and ExportedPrograms."
        )
    ruleset = as_ruleset(rules)
    owner = graph.owning_module
    gm = owner if isinstance(owner, fx.GraphModule) else fx.GraphModule(owner or torch.nn.Module(), graph)
    started = time.perf_counter()
    driver = _Driver(gm, ruleset, budget=_budget(graph, max_rewrites), debug=_debug(None))
    with collections_paused():
        driver.run()
        if driver.rewrites:
            _check_lint(graph, driver, how="set FXREWRITE_DEBUG=1")
            _drop_dead_attributes(gm, owned=False)
            gm.recompile()
    return driver.report(time.perf_counter() - started)
