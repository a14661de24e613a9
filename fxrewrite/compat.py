"""Drop-in replacements for ``torch.fx.replace_pattern`` and ``replace_pattern_with_filters``.

Same signatures, same return types (``torch.fx.subgraph_rewriter.Match`` and
``ReplacedPatterns``), same matches and same rewritten graphs as torch.fx on everything torch.fx
gets right; found by fxrewrite's indexed matcher, so the cost is linear in the graph size
(torch.fx runs a whole-graph cycle check for every match and scans the graph for insertion
points). One deliberate difference: with ``ignore_literals=True`` torch.fx lets a literal in the
pattern stand for a graph *node* and then silently drops that node; fxrewrite refuses such a
match (a pattern literal still matches any literal). See ``docs/compat.md``.

>>> import torch, torch.fx as fx
>>> class M(torch.nn.Module):
...     def forward(self, x, w1, w2):
...         return torch.cat([w1, w2]).sum() + x
>>> gm = fx.symbolic_trace(M())
>>> matches = replace_pattern(gm, lambda w1, w2: torch.cat([w1, w2]), lambda w1, w2: torch.stack([w1, w2]))
>>> len(matches), "torch.stack" in gm.code
(1, True)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.fx as fx
from torch.fx.node import Node
from torch.fx.passes.utils.matcher_utils import InternalMatch
from torch.fx.subgraph_rewriter import Match, ReplacedPatterns

from ._torch import copy_replacement_attributes
from .canon import op_key_of
from .index import OpIndex
from .isolation import torch_state_preserved
from .match import Match as _FxrMatch
from .match import MatchOptions, match_at, node_position
from .pattern import TRACING, Pattern, pattern_from_graph

__all__ = ["SubgraphMatcher", "SubgraphMatcherWithNameNodeMap", "replace_pattern", "replace_pattern_with_filters"]

MatchFilter = Callable[[InternalMatch, fx.Graph, fx.Graph], bool]


def replace_pattern(
    gm: fx.GraphModule,
    pattern: Callable[..., Any] | fx.GraphModule,
    replacement: Callable[..., Any] | fx.GraphModule,
) -> list[Match]:
    """Replace every non-overlapping occurrence of ``pattern`` in ``gm`` by ``replacement``,
    exactly as ``torch.fx.replace_pattern`` does; returns the matches."""
    replaced = _replace_pattern(gm, pattern, replacement)
    return [Match(anchor=r.anchor, nodes_map=r.nodes_map) for r in replaced]


def replace_pattern_with_filters(
    gm: fx.GraphModule,
    pattern: Callable[..., Any] | fx.Graph | fx.GraphModule,
    replacement: Callable[..., Any] | fx.Graph | fx.GraphModule | None = None,
    match_filters: list[MatchFilter] | None = None,
    ignore_literals: bool = False,
    replacement_callback: Callable[[InternalMatch, fx.Graph, fx.Graph], fx.Graph] | None = None,
    node_name_match: str = "",
) -> list[ReplacedPatterns]:
    """``torch.fx.subgraph_rewriter.replace_pattern_with_filters``, at linear cost.

    ``node_name_match`` (torch.fx's escape hatch that lets any graph node whose name contains
    the string match any pattern node) is delegated to torch.fx itself.
    """
    if node_name_match:
        from torch.fx.subgraph_rewriter import replace_pattern_with_filters as fx_replace

        return fx_replace(gm, pattern, replacement, match_filters, ignore_literals, replacement_callback,
                          node_name_match)
    return _replace_pattern(gm, pattern, replacement, match_filters, ignore_literals, replacement_callback)


def _graph_of(obj: Callable[..., Any] | fx.Graph | fx.GraphModule) -> fx.Graph:
    if isinstance(obj, fx.GraphModule):
        return obj.graph
    if isinstance(obj, fx.Graph):
        return obj
    with TRACING, torch_state_preserved():  # a pattern or replacement function runs here: it changes nothing global
        return fx.symbolic_trace(obj).graph


def _replace_pattern(
    gm: fx.GraphModule,
    pattern: Callable[..., Any] | fx.Graph | fx.GraphModule,
    replacement: Callable[..., Any] | fx.Graph | fx.GraphModule | None,
    match_filters: list[MatchFilter] | None = None,
    ignore_literals: bool = False,
    replacement_callback: Callable[[InternalMatch, fx.Graph, fx.Graph], fx.Graph] | None = None,
) -> list[ReplacedPatterns]:
    pattern_graph = _graph_of(pattern)
    compiled = pattern_from_graph(pattern_graph, where="pattern", fx_style=True)
    matches = [
        m for m in find_fx_matches(gm, compiled, ignore_literals=ignore_literals)
        if all(f(m, gm.graph, pattern_graph) for f in match_filters or ())
    ]
    if replacement_callback is None and replacement is None:
        raise ValueError("Must provide either a replacement GraphModule or a replacement callback")
    common = _graph_of(replacement) if replacement is not None else None
    changed: dict[Node, Node] = {}
    replaced = []
    for m in matches:
        graph = replacement_callback(m, gm.graph, pattern_graph) if replacement_callback else common
        assert graph is not None  # common is built whenever there is no callback
        replaced.append(_splice_copy(gm.graph, m, pattern_graph, graph, changed))
    gm.recompile()
    if isinstance(replacement, torch.nn.Module):
        copy_replacement_attributes(gm, replacement)
    return replaced


def _fx_anchors(pattern: Pattern) -> list[Node]:
    """torch.fx's anchors: the returned pattern nodes used by nothing but the output."""
    return [n for n in pattern.outputs if len(n.users) == 1]


def find_fx_matches(gm: fx.GraphModule, pattern: Pattern, *, ignore_literals: bool = False) -> list[InternalMatch]:
    """Every match torch.fx's ``SubgraphMatcher`` would return (non-overlapping, in its order),
    as ``InternalMatch`` objects."""
    return _fx_matches(gm.graph, gm, pattern, ignore_literals=ignore_literals)


def _fx_matches(graph: fx.Graph, owner: torch.nn.Module | None, pattern: Pattern, *, ignore_literals: bool = False,
                remove_overlapping: bool = True) -> list[InternalMatch]:
    """The matches of ``pattern`` in ``graph`` (owned by ``owner``, for ``call_module`` targets)
    by torch.fx's rules, in torch.fx's order; without overlaps unless ``remove_overlapping`` is false."""
    options = MatchOptions.torch_fx(ignore_literals=ignore_literals)
    anchors = _fx_anchors(pattern)
    index = OpIndex(graph, canonical=False)
    found: list[_FxrMatch] = []
    modules = dict(owner.named_modules()) if owner is not None else {}
    anchor_key = op_key_of(pattern.anchor.op, pattern.anchor.target, canonical=False)
    for gn in index.nodes(anchor_key):
        found.extend(match_at(pattern, gn, owner, options=options, candidates=index, modules=modules))
    found.sort(key=lambda m: tuple(node_position(m.node_map[a]) for a in anchors))
    kept = _without_overlaps(found) if remove_overlapping else iter(found)
    return [_internal_match(pattern, m, anchors) for m in kept]


class SubgraphMatcher:
    """Drop-in for ``torch.fx.passes.utils.matcher_utils.SubgraphMatcher``: the same arguments,
    attributes and results (a list of torch.fx ``InternalMatch``, in torch.fx's order), found by
    fxrewrite's indexed matcher at linear cost (torch.fx tries every anchor at every node and runs
    a whole-graph cycle check per match). As in :func:`replace_pattern_with_filters`, a pattern
    literal under ``ignore_literals=True`` stands for any literal, never for a graph node.
    ``match_output=True``, ``match_placeholder=True`` and ``node_name_match`` are handed to
    torch.fx's own matcher.

    >>> import torch, torch.fx as fx
    >>> pattern = fx.symbolic_trace(lambda x, w: torch.relu(torch.matmul(x, w))).graph
    >>> graph = fx.symbolic_trace(lambda a, b: torch.relu(torch.matmul(a, b)) + 1).graph
    >>> [(m.anchors[0].name, m.returning_nodes[0].name) for m in SubgraphMatcher(pattern).match(graph)]
    [('relu', 'relu')]
    """

    def __init__(self, pattern: fx.Graph, match_output: bool = False, match_placeholder: bool = False,
                 remove_overlapping_matches: bool = True, ignore_literals: bool = False) -> None:
        from torch.fx.passes.utils.matcher_utils import SubgraphMatcher as FxMatcher

        self.pattern = pattern
        self.match_output = match_output
        self.match_placeholder = match_placeholder
        self.remove_overlapping_matches = remove_overlapping_matches
        self.ignore_literals = ignore_literals
        # torch.fx's checks (an empty pattern, dead code) and public attributes, as torch.fx has them
        self._fx = FxMatcher(pattern, match_output, match_placeholder, remove_overlapping_matches, ignore_literals)
        self.pattern_placeholder_nodes = self._fx.pattern_placeholder_nodes
        self.pattern_returning_nodes = self._fx.pattern_returning_nodes
        self.pattern_anchors = self._fx.pattern_anchors
        self._compiled: Pattern | None = None

    def match(self, graph: fx.Graph, node_name_match: str = "") -> list[InternalMatch]:
        """The matched subgraphs, as torch.fx's ``SubgraphMatcher.match`` returns them."""
        if node_name_match or self.match_output or self.match_placeholder:
            return self._fx.match(graph, node_name_match)
        if self._compiled is None:
            self._compiled = pattern_from_graph(self.pattern, where="pattern", fx_style=True)
        return _fx_matches(graph, graph.owning_module, self._compiled, ignore_literals=self.ignore_literals,
                           remove_overlapping=self.remove_overlapping_matches)


class SubgraphMatcherWithNameNodeMap(SubgraphMatcher):
    """Drop-in for ``torch.fx.passes.utils.matcher_with_name_node_map_utils.SubgraphMatcherWithNameNodeMap``:
    the pattern ``GraphModule`` returns its outputs and a dict naming pattern nodes
    (``return relu, {"conv": conv, "relu": relu}``), and each match's ``name_node_map`` maps
    those names to the matched graph nodes (as torchao's quantizers use it)."""

    def __init__(self, pattern_gm: fx.GraphModule, match_output: bool = False, match_placeholder: bool = False,
                 remove_overlapping_matches: bool = True, ignore_literals: bool = False) -> None:
        from torch.fx.passes.utils.matcher_with_name_node_map_utils import _split_to_graph_and_name_node_map

        pattern_gm, name_node_map = _split_to_graph_and_name_node_map(pattern_gm)
        self.name_node_map = name_node_map
        super().__init__(pattern_gm.graph, match_output, match_placeholder, remove_overlapping_matches,
                         ignore_literals)

    def match(self, graph: fx.Graph, node_name_match: str = "") -> list[InternalMatch]:
        """The matches, each with ``name_node_map`` from the pattern's names to graph nodes."""
        matches = super().match(graph, node_name_match)
        for m in matches:
            for name, node in self.name_node_map.items():
                m.name_node_map[name] = m.nodes_map[node]
        return matches


def _without_overlaps(matches: list[_FxrMatch]) -> Iterator[_FxrMatch]:
    taken: set[Node] = set()
    for m in matches:
        if not any(n in taken for n in m.nodes):
            taken.update(m.nodes)
            yield m


def _internal_match(pattern: Pattern, m: _FxrMatch, anchors: list[Node]) -> InternalMatch:
    placeholders = [n for n in pattern.graph.nodes if n.op == "placeholder"]
    return InternalMatch(
        anchors=anchors,
        nodes_map=dict(m.node_map),
        placeholder_nodes=[m.node_map[p] for p in placeholders],
        returning_nodes=list(m.outputs),
    )


def _splice_copy(graph: fx.Graph, match: InternalMatch, pattern_graph: fx.Graph, replacement: fx.Graph,
                 changed: dict[Node, Node]) -> ReplacedPatterns:
    """Copy ``replacement`` into ``graph`` in place of ``match``, as torch.fx does."""
    placeholders = [n for n in replacement.nodes if n.op == "placeholder"]
    if len(match.placeholder_nodes) != len(placeholders):
        raise ValueError(
            f"the replacement takes {len(placeholders)} inputs but the pattern binds "
            f"{len(match.placeholder_nodes)}; give the replacement the same parameters as the pattern."
        )
    returned = next(n for n in reversed(replacement.nodes) if n.op == "output").args[0]
    n_returned = len(returned) if isinstance(returned, (tuple, list)) else 1
    if n_returned != len(match.returning_nodes):  # checked before the graph is touched
        raise ValueError(
            f"the pattern returns {len(match.returning_nodes)} values but the replacement returns "
            f"{n_returned}; both must return the same number of values."
        )
    _follow_earlier_replacements(match, changed)
    val_map: dict[Node, Any] = dict(zip(placeholders, match.placeholder_nodes))
    with graph.inserting_before(_insert_point(match)):
        copied = graph.graph_copy(replacement, val_map)
    outputs = (copied,) if isinstance(copied, Node) else tuple(copied)  # type: ignore[arg-type]
    inputs = set(n for n in match.placeholder_nodes if isinstance(n, Node))
    new_nodes = [v for v in val_map.values() if isinstance(v, Node) and v not in inputs]
    for old, new in zip(match.returning_nodes, outputs):
        old.replace_all_uses_with(new)
        changed[old] = new
    for pn in reversed(pattern_graph.nodes):
        if pn.op not in ("placeholder", "output"):
            graph.erase_node(match.nodes_map[pn])
    return ReplacedPatterns(anchor=match.anchors[0], nodes_map=match.nodes_map, replacements=new_nodes)


def _follow_earlier_replacements(match: InternalMatch, changed: dict[Node, Node]) -> None:
    """An input of this match may be the output of a match replaced before it."""
    for i, gn in enumerate(match.placeholder_nodes):
        if isinstance(gn, Node) and gn in changed:
            new = changed[gn]
            match.placeholder_nodes[i] = new
            for pn, value in match.nodes_map.items():
                if value is gn:
                    match.nodes_map[pn] = new


def _insert_point(match: InternalMatch) -> Node:
    users = {u for n in match.returning_nodes for u in n.users}
    if users:
        return min(users, key=node_position)
    return max(match.returning_nodes, key=node_position).next
