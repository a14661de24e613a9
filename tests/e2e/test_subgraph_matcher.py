"""fxrewrite.compat.SubgraphMatcher and SubgraphMatcherWithNameNodeMap, differentially against
torch.fx's: the same ``InternalMatch`` objects (anchors, nodes_map, placeholder and returning
nodes, name_node_map), in the same order, on traced and exported graphs."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch.fx.passes.utils.matcher_utils import InternalMatch
from torch.fx.passes.utils.matcher_utils import SubgraphMatcher as FxMatcher
from torch.fx.passes.utils.matcher_with_name_node_map_utils import (
    SubgraphMatcherWithNameNodeMap as FxNameMatcher,
)

from fxrewrite.compat import SubgraphMatcher, SubgraphMatcherWithNameNodeMap

# ---- traced patterns and graphs ------------------------------------------------------------------


def relu_matmul(x, w):
    return torch.relu(torch.matmul(x, w))


def two_relu_matmuls(a, b, c):
    y = torch.relu(torch.matmul(a, b))
    leak = torch.matmul(b, c)  # used outside: no match here
    return torch.relu(torch.matmul(y, c)) + torch.relu(leak) + leak


def add_mul(x, y):
    s = x + y
    return s, s * y  # two outputs


def adds_and_muls(a, b, c):
    s = a + b
    t = s * b
    u = (c + a) * a
    return t + u + s + (c + c) * c


def add_const(x):
    return x + 2


def add_consts(a):
    # adds of a literal only: under ignore_literals torch.fx lets `x + 2` match `a + b` too (see below)
    return (a + 2) * (a + 3) - (a + 2.0) * torch.relu(a)


def cat_sum(w1, w2):
    return torch.cat([w1, w2]).sum()


def two_cat_sums(x, w1, w2):
    return x + torch.cat([w1, w2]).sum() + torch.cat([w2, w1]).sum()


def chain(x):
    return torch.neg(torch.neg(x))


def long_chain(x):
    return torch.neg(torch.neg(torch.neg(torch.neg(torch.neg(x)))))


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.lin(x))


class TwoBlocks(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.other = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.lin(x)) + torch.relu(self.other(torch.relu(self.lin(x))))


TRACED_CASES = [
    (relu_matmul, two_relu_matmuls),
    (add_mul, adds_and_muls),
    (add_const, add_consts),
    (cat_sum, two_cat_sums),
    (chain, long_chain),
    (Block(), TwoBlocks()),
]


def graphs(pattern, target) -> tuple[fx.GraphModule, fx.GraphModule]:
    return fx.symbolic_trace(pattern), fx.symbolic_trace(target)


def assert_same_matches(ours: list[InternalMatch], theirs: list[InternalMatch]) -> None:
    assert all(type(m) is InternalMatch for m in ours)
    assert [_shown(m) for m in ours] == [_shown(m) for m in theirs]
    assert ours == theirs  # the very nodes (InternalMatch is a dataclass: field by field)


def _shown(m: InternalMatch) -> tuple:
    def name(v):
        return v.name if isinstance(v, fx.Node) else v

    return ([name(a) for a in m.anchors], {name(k): name(v) for k, v in m.nodes_map.items()},
            [name(n) for n in m.placeholder_nodes], [name(n) for n in m.returning_nodes],
            {k: name(v) for k, v in m.name_node_map.items()})


@pytest.mark.parametrize("remove_overlapping", [True, False])
@pytest.mark.parametrize("ignore_literals", [False, True])
@pytest.mark.parametrize(("pattern", "target"), TRACED_CASES, ids=lambda c: getattr(c, "__name__", type(c).__name__))
def test_matches_equal_torch_fx_on_traced_graphs(pattern, target, ignore_literals, remove_overlapping):
    pattern_gm, target_gm = graphs(pattern, target)
    options = {"remove_overlapping_matches": remove_overlapping, "ignore_literals": ignore_literals}
    ours = SubgraphMatcher(pattern_gm.graph, **options).match(target_gm.graph)
    theirs = FxMatcher(pattern_gm.graph, **options).match(target_gm.graph)
    assert_same_matches(ours, theirs)


def test_the_cases_find_matches_and_leave_some_out():
    counts = {}
    for pattern, target in TRACED_CASES:
        pattern_gm, target_gm = graphs(pattern, target)
        counts[getattr(pattern, "__name__", "block")] = len(SubgraphMatcher(pattern_gm.graph).match(target_gm.graph))
    assert counts == {"relu_matmul": 2, "add_mul": 2, "add_const": 1, "cat_sum": 2, "chain": 2, "block": 2}
    pattern_gm, target_gm = graphs(chain, long_chain)  # overlapping matches kept when asked
    assert len(SubgraphMatcher(pattern_gm.graph, remove_overlapping_matches=False).match(target_gm.graph)) == 4


def test_the_matcher_has_torch_fx_attributes_and_checks():
    pattern_gm = fx.symbolic_trace(add_mul)
    ours, theirs = SubgraphMatcher(pattern_gm.graph), FxMatcher(pattern_gm.graph)
    for attribute in ("pattern", "match_output", "match_placeholder", "remove_overlapping_matches", "ignore_literals",
                      "pattern_placeholder_nodes", "pattern_returning_nodes", "pattern_anchors"):
        assert getattr(ours, attribute) == getattr(theirs, attribute), attribute
    with pytest.raises(ValueError, match="empty pattern"):
        SubgraphMatcher(fx.Graph())
    dead = fx.symbolic_trace(add_const).graph
    with dead.inserting_before(next(iter(reversed(dead.nodes)))):
        dead.call_function(torch.neg, (next(iter(dead.nodes)),))
    with pytest.raises(AssertionError, match="dead code"):
        SubgraphMatcher(dead)


@pytest.mark.parametrize("options", [{"match_output": True}, {"match_placeholder": True}])
def test_match_output_and_match_placeholder_are_torch_fx_s(options):
    pattern_gm, target_gm = graphs(relu_matmul, two_relu_matmuls)
    ours = SubgraphMatcher(pattern_gm.graph, **options).match(target_gm.graph)
    assert_same_matches(ours, FxMatcher(pattern_gm.graph, **options).match(target_gm.graph))


def test_a_pattern_literal_under_ignore_literals_never_stands_for_a_node():
    """The one documented difference (docs/compat.md): torch.fx lets ``x + 1`` match ``x + y``."""
    pattern_gm = fx.symbolic_trace(add_const)
    target_gm = fx.symbolic_trace(lambda a, b: (a + b) * (a + 5))
    ours = SubgraphMatcher(pattern_gm.graph, ignore_literals=True).match(target_gm.graph)
    theirs = FxMatcher(pattern_gm.graph, ignore_literals=True).match(target_gm.graph)
    assert [m.returning_nodes[0].args for m in theirs] == [(target_gm.graph.find_nodes(op="placeholder")[0],
                                                            target_gm.graph.find_nodes(op="placeholder")[1]),
                                                           (target_gm.graph.find_nodes(op="placeholder")[0], 5)]
    assert ours == theirs[1:]


# ---- exported patterns with a name map, as torchao's quantizers use them ------------------------


def exported(fn, *inputs) -> fx.GraphModule:
    """``fn`` captured with torch.export, as torchao captures its patterns (guards removed, dead
    code eliminated)."""

    class Wrapper(torch.nn.Module):
        def forward(self, *args):
            return fn(*args)

    gm = torch.export.export(Wrapper(), inputs).module()
    for node in list(gm.graph.nodes):
        if node.op == "call_module" and node.target == "_guards_fn":
            gm.graph.erase_node(node)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


def conv_relu_named(x, w, b):
    conv = F.conv2d(x, w, b)
    relu = F.relu(conv)
    return relu, {"input": x, "weight": w, "conv": conv, "relu": relu}


def linear_named(x, w, b):
    out = F.linear(x, w, b)
    return out, {"input": x, "weight": w, "bias": b, "output": out}


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = torch.nn.Conv2d(3, 4, 3), torch.nn.Conv2d(4, 4, 3)
        self.lin = torch.nn.Linear(4, 2)

    def forward(self, x):
        y = F.relu(self.c1(x))
        z = self.c2(y)
        return self.lin(F.relu(z).mean((2, 3))) + self.lin(z.mean((2, 3)))


CONV_INPUTS = (torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(4))
LINEAR_INPUTS = (torch.randn(2, 4), torch.randn(2, 4), torch.randn(2))


@pytest.mark.parametrize(("pattern", "inputs"), [(conv_relu_named, CONV_INPUTS), (linear_named, LINEAR_INPUTS)],
                         ids=["conv_relu", "linear"])
@pytest.mark.parametrize("ignore_literals", [True, False])
def test_name_node_maps_equal_torch_fx_on_exported_graphs(pattern, inputs, ignore_literals):
    model = ConvNet().eval()
    target = torch.export.export(model, (torch.randn(1, 3, 10, 10),)).module()
    pattern_gm = exported(pattern, *inputs)
    ours = SubgraphMatcherWithNameNodeMap(copy.deepcopy(pattern_gm), ignore_literals=ignore_literals)
    theirs = FxNameMatcher(copy.deepcopy(pattern_gm), ignore_literals=ignore_literals)
    ours_found, theirs_found = ours.match(target.graph), theirs.match(target.graph)
    assert ours_found and all(m.name_node_map for m in ours_found)
    assert [_shown(m) for m in ours_found] == [_shown(m) for m in theirs_found]
    assert [m.name_node_map for m in ours_found] == [m.name_node_map for m in theirs_found]
    assert sorted(ours.name_node_map) == sorted(theirs.name_node_map)


def test_a_bare_graph_without_an_owning_module_matches_as_in_torch_fx():
    pattern = fx.symbolic_trace(Block()).graph
    owned = fx.symbolic_trace(TwoBlocks()).graph
    bare = fx.Graph()
    bare.output(bare.graph_copy(owned, {}))
    assert bare.owning_module is None
    assert_same_matches(SubgraphMatcher(pattern).match(bare), FxMatcher(pattern).match(bare))
    assert len(SubgraphMatcher(pattern).match(bare)) == 2
