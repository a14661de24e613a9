"""fxrewrite.index.OpIndex: nodes by op key, kept current while a rewrite changes the graph."""

from __future__ import annotations

import operator

import torch
import torch.fx as fx
from _helpers import counting_calls
from hypothesis import given, settings
from hypothesis.strategies import data as st_data

from fxrewrite import Rule, explain, rewrite
from fxrewrite.canon import node_keys
from fxrewrite.compat import find_fx_matches
from fxrewrite.index import OpIndex, scan
from fxrewrite.pattern import pattern_from_graph

NEG = ("aten", "neg")


def spellings_of_neg() -> fx.GraphModule:
    def f(x):
        a = torch.neg(x)
        b = a.neg()
        return operator.neg(b) + torch.relu(a)

    return fx.symbolic_trace(f)


def test_canonical_keys_gather_every_spelling_of_an_op_in_graph_order():
    gm = spellings_of_neg()
    assert [n.name for n in OpIndex(gm.graph).nodes(NEG)] == ["neg", "neg_1", "neg_2"]


def test_torch_fx_keys_keep_spellings_apart():
    gm = spellings_of_neg()
    index = OpIndex(gm.graph, canonical=False)
    assert [n.name for n in index.nodes(("call_function", torch.neg))] == ["neg"]
    assert [n.name for n in index.nodes(("call_method", "neg"))] == ["neg_1"]


def test_a_key_no_node_has_gives_an_empty_list():
    gm = spellings_of_neg()
    index = OpIndex(gm.graph)
    assert index.nodes(("aten", "sigmoid")) == [] and ("aten", "sigmoid") not in index and NEG in index


def test_added_nodes_come_in_graph_order_and_erased_nodes_leave():
    gm = spellings_of_neg()
    graph = gm.graph
    index = OpIndex(graph)
    first, second, third = index.nodes(NEG)
    with graph.inserting_before(second):
        new = graph.call_function(torch.neg, (first,))
    third.replace_all_uses_with(second)
    graph.erase_node(third)
    index.add([new])
    assert index.nodes(NEG) == [first, new, second]
    graph.lint()


def test_a_list_handed_out_is_never_changed_by_later_updates():
    gm = spellings_of_neg()
    graph = gm.graph
    index = OpIndex(graph)
    before = index.nodes(NEG)
    with graph.inserting_before(before[0]):
        new = graph.call_function(torch.neg, (next(iter(graph.nodes)),))
    index.add([new])
    assert len(before) == 3 and len(index.nodes(NEG)) == 4


def test_an_unchanged_bucket_is_not_filtered_again():
    gm = spellings_of_neg()
    index = OpIndex(gm.graph)
    assert index.nodes(NEG) is index.nodes(NEG)


def test_rewrite_explain_and_compat_answer_from_the_index():
    def f(x):
        return torch.neg(torch.neg(x)) * torch.neg(torch.relu(x))

    neg_neg = Rule.from_functions(lambda x: torch.neg(torch.neg(x)), lambda x: x, name="neg_neg")
    result = rewrite(f, neg_neg)
    assert result.report.applied["neg_neg"] == 1
    result.module.graph.lint()
    torch.testing.assert_close(result.module(torch.ones(3)), f(torch.ones(3)))
    assert explain(f, neg_neg)["neg_neg"].candidates == 3
    gm = fx.symbolic_trace(f)
    pattern = pattern_from_graph(fx.symbolic_trace(lambda x: torch.neg(torch.neg(x))).graph, where="pattern",
                                 fx_style=True)
    assert len(find_fx_matches(gm, pattern)) == 1


# -- cost: counted in function calls (deterministic), not seconds ---------------------------------

#: A pattern whose two outputs share no node: its second output is looked up by op key for every
#: candidate of its anchor (``sin``). The graph has one ``cos``, never fed by ``exp``, so the
#: rule is tried at every ``sin`` and never fires.
DISCONNECTED = Rule.from_functions(lambda x, y: (torch.cos(torch.exp(y)), torch.sin(x)),
                                   lambda x, y: (torch.cos(torch.exp(y)), torch.sin(x) * 1.0),
                                   name="disconnected")


def _sines(count: int) -> fx.GraphModule:
    g = fx.Graph()
    x = g.placeholder("x")
    value = g.call_function(torch.cos, (x,))
    for _ in range(count):
        value = g.call_function(torch.sin, (value,))
    g.output(value)
    return fx.GraphModule(torch.nn.Module(), g)


def _calls_to_rewrite(count: int) -> int:
    gm = _sines(count)
    result, calls = counting_calls(lambda: rewrite(gm, DISCONNECTED, inplace=True))
    assert result.report.applied["disconnected"] == 0 and result.report.attempts["disconnected"] == count
    torch.testing.assert_close(result.module(torch.ones(2)), gm(torch.ones(2)))
    return calls


def test_disconnected_patterns_cost_linear_work_not_a_graph_scan_per_candidate():
    # A scan of the graph per candidate makes 4x the nodes cost 16x the calls; the index, about 4x.
    _calls_to_rewrite(20)  # warm caches and lazy imports
    small, large = _calls_to_rewrite(400), _calls_to_rewrite(1600)
    assert large / small < 6, (small, large)


# -- the slow twin: a scan of the graph answers the same over random edits --------------------------

_OPS = (torch.neg, torch.relu, torch.sin, operator.neg, "neg", "relu")


def _random_edits(data) -> tuple[fx.Graph, OpIndex, bool]:
    from hypothesis import strategies as st

    canonical = data.draw(st.booleans())
    graph = fx.Graph()
    nodes = [graph.placeholder("x")]
    for target in data.draw(st.lists(st.sampled_from(_OPS), min_size=1, max_size=12)):
        op = "call_method" if isinstance(target, str) else "call_function"
        nodes.append(graph.create_node(op, target, (data.draw(st.sampled_from(nodes)),)))
    graph.output(nodes[-1])
    index = OpIndex(graph, canonical=canonical)
    for _ in range(data.draw(st.integers(0, 8))):
        live = [n for n in graph.nodes if n.op not in ("placeholder", "output")]
        if live and data.draw(st.booleans()):  # erase a node, its users reading its input instead
            victim = data.draw(st.sampled_from(live))
            victim.replace_all_uses_with(victim.args[0])
            graph.erase_node(victim)
            index.add([])
        else:  # insert a node before a random one
            where = data.draw(st.sampled_from([n for n in graph.nodes if n.op != "placeholder"]))
            target = data.draw(st.sampled_from(_OPS))
            before = list(graph.nodes)[:list(graph.nodes).index(where)]
            with graph.inserting_before(where):
                source = data.draw(st.sampled_from(before))
                op = "call_method" if isinstance(target, str) else "call_function"
                new = graph.create_node(op, target, (source,))
            index.add([new])
    return graph, index, canonical


@given(st_data())
@settings(max_examples=40, deadline=None, derandomize=True)
def test_the_index_answers_what_a_scan_of_the_graph_answers_after_random_edits(data):
    graph, index, canonical = _random_edits(data)
    graph.lint()
    keys = {k for n in graph.nodes for k in node_keys(n, canonical)} | {NEG, ("aten", "sigmoid")}
    for key in sorted(keys, key=repr):
        assert index.nodes(key) == scan(graph, key, canonical=canonical), key


def test_a_group_of_keys_gathers_each_node_under_any_of_them_once_in_graph_order():
    """``groups``: the nodes filed under any key of a group, as scanning the graph for each key and
    merging in graph order gives them, a node with two keys in one group once (a permute that
    swaps two dims is a transpose and a permute), a node in two groups in both."""
    from fxrewrite._torch import node_position

    def f(x):
        a = torch.neg(x).permute(1, 0)
        return torch.relu(a).neg() + torch.sigmoid(a.transpose(0, 1)) + a.permute(1, 0).relu()

    gm = fx.symbolic_trace(f)
    transpose, permute, relu = ("aten", "transpose"), ("aten", "permute"), ("aten", "relu")
    groups = {"views": {transpose, permute}, "unary": {NEG, relu, permute}, "none": {("aten", "cos")}}
    index = OpIndex(gm.graph, groups=groups)
    for name, keys in groups.items():
        expected = sorted({n for key in keys for n in scan(gm.graph, key)}, key=node_position)
        assert index.grouped[name] == expected, name
    assert len(index.grouped["views"]) == 3 and len(index.grouped["unary"]) == 6 and index.grouped["none"] == []
    assert [n.name for n in index.nodes(transpose)] == ["permute", "transpose", "permute_1"]  # (the buckets as before)


def test_an_index_filed_by_tuples_of_keys_is_the_index_filed_key_by_key(monkeypatch):
    """``FILED_BY_KEYS``: filing each node into the lists worked out once per tuple of keys builds
    the buckets (in the same order of keys) and the groups that filing it key by key builds, for
    nodes with one key and with two (a swapping permute), in no group, one group or two,
    canonical and as written."""
    import fxrewrite.index as index

    def f(x):
        a = torch.neg(x).permute(1, 0)
        b = torch.relu(a).neg() + torch.sigmoid(a.transpose(0, 1)) + a.permute(1, 0).relu()
        return operator.neg(b) + b.neg() + torch.cos(a.permute(1, 0)) + (1 / b)[:, None].sum()

    graph = fx.symbolic_trace(f).graph
    transpose, permute, relu = ("aten", "transpose"), ("aten", "permute"), ("aten", "relu")
    groups = {"views": {transpose, permute}, "unary": {NEG, relu, permute}, "none": {("aten", "cos")}}
    built = {}
    for filed_by_keys in (False, True):
        monkeypatch.setattr(index, "FILED_BY_KEYS", filed_by_keys)
        for canonical in (True, False):
            ix = OpIndex(graph, canonical=canonical, groups=groups)
            built[filed_by_keys, canonical] = (list(ix._buckets.items()), ix.grouped, ix._clean)
    for canonical in (True, False):
        assert built[True, canonical] == built[False, canonical], canonical
    buckets, grouped, _ = built[True, True]
    assert [len(dict(buckets)[key]) for key in (permute, transpose, NEG)] == [3, 4, 4]  # a permute is a transpose too
    assert [len(grouped[name]) for name in ("views", "unary", "none")] == [4, 9, 1], grouped
