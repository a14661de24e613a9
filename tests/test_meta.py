"""Value metadata on nodes (``fxrewrite.meta``): fake tensors from example inputs, values of new
nodes, and nothing real touched on the way."""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx
import torch.nn as nn
from _helpers import X, assert_same_state, graph_state, neg_neg, traced_net

from fxrewrite import rewrite
from fxrewrite.errors import RewriteError
from fxrewrite.meta import has_values, propagate_inputs, propagate_values


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
