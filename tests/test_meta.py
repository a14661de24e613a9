"""Value metadata on nodes (``fxrewrite.meta``): fake tensors from example inputs, values of new
nodes, and nothing real touched on the way."""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx
import torch.nn as nn
from _helpers import X, assert_same_state, graph_state, neg_neg, traced_net
from torch.fx.passes.shape_prop import ShapeProp

from fxrewrite import rewrite
from fxrewrite.errors import RewriteError
from fxrewrite.meta import (
    as_dynamo_value,
    copy_value,
    described,
    forget_value,
    has_value,
    has_values,
    is_dynamo_value,
    lend_constant,
    lent_constant,
    propagate_inputs,
    propagate_values,
    rule_metadata,
    rule_of,
    tensor_value,
    value_of,
)


def test_example_inputs_give_every_node_a_fake_value():
    gm = fx.symbolic_trace(lambda x: torch.relu(x).sum(-1))
    assert not has_values(gm.graph.nodes)
    propagate_inputs(gm, (torch.randn(3, 5),))
    assert has_values(gm.graph.nodes)
    shapes = [tuple(n.meta["val"].shape) for n in gm.graph.nodes if n.op != "output"]
    assert shapes == [(3, 5), (3, 5), (3,)]


def test_propagation_changes_no_real_parameter_or_buffer():
    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    gm = fx.symbolic_trace(model)
    propagate_inputs(gm, (torch.randn(4, 3),))
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name


def test_inputs_that_do_not_fit_are_a_rewrite_error():
    gm = fx.symbolic_trace(lambda a, b: a + b)
    with pytest.raises(RewriteError, match="could not propagate shapes"):
        propagate_inputs(gm, (torch.randn(2), torch.randn(3)))


def test_new_nodes_get_values_from_their_inputs():
    gm = fx.symbolic_trace(lambda x: torch.relu(x))
    propagate_inputs(gm, (torch.randn(2, 4),))
    relu = next(n for n in gm.graph.nodes if n.target is torch.relu)
    with gm.graph.inserting_after(relu):
        new = gm.graph.call_function(torch.sum, (relu, 0))
    propagate_values(gm, [new])
    assert tuple(new.meta["val"].shape) == (4,)


def test_nodes_whose_inputs_have_no_values_are_left_alone():
    gm = fx.symbolic_trace(lambda x: torch.relu(x))
    relu = next(n for n in gm.graph.nodes if n.target is torch.relu)
    propagate_values(gm, [relu])
    assert "val" not in relu.meta


# ---- example_inputs given to rewrite ------------------------------------------------------------------


def test_example_inputs_that_do_not_fit_are_a_rewrite_error():
    _, gm = traced_net()
    before = graph_state(gm)
    with pytest.raises(RewriteError, match="could not propagate shapes with the given example_inputs"):
        rewrite(gm, neg_neg(lambda x: x), example_inputs=(torch.randn(3, 5),))
    assert_same_state(before, graph_state(gm))


@pytest.mark.filterwarnings("ignore::fxrewrite.RuleWarning")  # neg_neg(lambda x: None) ignores x
def test_example_inputs_are_not_modified_by_a_failing_rewrite():
    _, gm = traced_net()
    x = X.clone()
    with pytest.raises(RewriteError):
        rewrite(gm, neg_neg(lambda x: None), example_inputs=(x,))
    assert torch.equal(x, X)


def _dynamo_style(fn, *inputs):
    """A traced graph annotated the way Dynamo annotates its graphs: ``meta["example_value"]``."""
    gm = fx.symbolic_trace(fn)
    propagate_inputs(gm, inputs)
    for node in gm.graph.nodes:
        if "val" in node.meta:
            node.meta["example_value"] = node.meta.pop("val")
    return gm


def test_dynamo_example_values_are_values():
    gm = _dynamo_style(lambda x: x.float().relu(), torch.ones(2, 3, dtype=torch.half))
    x, _, relu, _ = gm.graph.nodes
    assert has_value(x) and value_of(x).dtype == torch.half
    assert tensor_value(relu).shape == (2, 3) and described(relu).dtype == torch.float32


def test_shape_prop_metadata_is_described_but_is_no_value():
    gm = fx.symbolic_trace(lambda x: x.relu())
    ShapeProp(gm).propagate(torch.ones(4, 2))
    relu = list(gm.graph.nodes)[1]
    assert not has_value(relu) and value_of(relu) is None
    assert tuple(described(relu).shape) == (4, 2) and tuple(tensor_value(relu).shape) == (4, 2)


def test_a_node_without_metadata_is_described_as_nothing():
    relu = list(fx.symbolic_trace(lambda x: x.relu()).graph.nodes)[1]
    assert (has_value(relu), value_of(relu), described(relu), tensor_value(relu)) == (False, None, None, None)


def test_copy_value_keeps_the_convention_of_the_graph():
    gm = _dynamo_style(lambda x: x.relu().neg(), torch.ones(3))
    x, relu, neg, _ = gm.graph.nodes
    fresh = gm.graph.create_node("call_function", torch.relu, (x,))
    copy_value(neg, fresh)
    assert "val" not in fresh.meta and fresh.meta["example_value"] is neg.meta["example_value"]
    relu.meta["example_value"] = "its own"
    copy_value(neg, relu)  # what a node says of itself stays
    assert relu.meta["example_value"] == "its own"


def test_forget_value_makes_propagation_compute_it_again():
    gm = fx.symbolic_trace(lambda x: x.relu())
    propagate_inputs(gm, (torch.ones(3),))
    relu = list(gm.graph.nodes)[1]
    forget_value(relu)
    assert not has_value(relu)
    propagate_values(gm, [relu])
    assert tensor_value(relu).shape == (3,)


def test_lent_constants_and_rules_are_read_back():
    node = fx.Graph().placeholder("c")
    assert (lent_constant(node), rule_of(node)) == (None, None)
    lend_constant(node, torch.tensor(2.0))
    node.meta.update(rule_metadata("double_neg", "trace\n"))
    assert lent_constant(node).item() == 2.0 and rule_of(node) == "double_neg"
    assert node.meta["stack_trace"] == "trace\n"


def test_a_node_made_in_a_dynamo_graph_gets_its_value_where_dynamo_keeps_it():
    gm = _dynamo_style(lambda x: x.relu(), torch.ones(3))
    _, relu, _ = gm.graph.nodes
    assert is_dynamo_value(relu)
    fresh = gm.graph.create_node("call_function", torch.neg, (relu,))
    propagate_values(gm, [fresh])
    assert not is_dynamo_value(fresh) and tensor_value(fresh).shape == (3,)
    as_dynamo_value(fresh)
    assert is_dynamo_value(fresh) and tensor_value(fresh).shape == (3,)


def test_has_values_says_what_asking_value_of_every_node_says():
    """``has_values`` (written out) against ``any(isinstance(n, Node) and value_of(n) is a fake
    tensor)``: ``val`` or ``example_value`` fake, a real tensor, ``val`` of None hiding a fake
    ``example_value``, ShapeProp's description only, no metadata, and values that are no nodes."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake = torch.empty(2)
    graph = fx.Graph()
    metas = [{"val": fake}, {"example_value": fake}, {"val": torch.ones(2)}, {"val": None, "example_value": fake},
             {"tensor_meta": object()}, {}, {"val": (fake,)}]
    nodes = []
    for k, meta in enumerate(metas):
        node = graph.placeholder(f"x{k}")
        node.meta.update(meta)
        nodes.append(node)
    assert [has_values([n]) for n in nodes] == [True, True, False, False, False, False, False]
    for some in ([], [fake, 3, None], nodes, nodes[2:], [*nodes[2:], fake, nodes[1]], {"x": nodes[0]}.values()):
        some = list(some)
        expected = any(isinstance(n, fx.Node) and isinstance(value_of(n), torch._subclasses.FakeTensor) for n in some)
        assert has_values(some) == expected
