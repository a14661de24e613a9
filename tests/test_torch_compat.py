"""The private torch APIs fxrewrite relies on (``fxrewrite/_torch.py``), checked against the
installed torch: when a release moves one, this file fails with its name."""

from __future__ import annotations

import torch
import torch.fx as fx
import torch.nn as nn

from fxrewrite import _torch


def test_node_positions_follow_graph_order_and_erasure_is_visible():
    graph = fx.Graph()
    a = graph.placeholder("a")
    b = graph.call_function(torch.neg, (a,))
    c = graph.call_function(torch.relu, (b,))
    graph.output(c)
    assert _torch.node_position(a) < _torch.node_position(b) < _torch.node_position(c)
    with graph.inserting_before(c):
        d = graph.call_function(torch.abs, (b,))
    assert _torch.node_position(b) < _torch.node_position(d) < _torch.node_position(c)
    assert not _torch.is_erased(d)
    graph.erase_node(d)
    assert _torch.is_erased(d)


def test_a_graph_module_gets_a_graph_without_compiling_it_and_attributes_by_path():
    source = nn.Sequential(nn.Linear(2, 2))
    target = fx.GraphModule(nn.Module(), fx.Graph())
    _torch.copy_attribute(source, target, "0.weight")
    assert target.get_submodule("0").weight is source[0].weight
    graph = fx.symbolic_trace(nn.ReLU()).graph
    _torch.set_graph_without_compiling(target, graph)
    assert target.graph is graph and graph.owning_module is target
    target.recompile()
    x = torch.randn(3)
    torch.testing.assert_close(target(x), torch.relu(x))


def test_fake_tensors_are_detected_and_modules_run_reparametrized():
    mode = _torch.FakeTensorMode()
    fake = mode.from_tensor(torch.randn(2))
    assert isinstance(fake, _torch.FakeTensor)
    assert _torch.detect_fake_mode([fake]) is mode
    assert _torch.detect_fake_mode([torch.randn(2)]) is None
    lin = nn.Linear(2, 2)
    zeros = {"weight": torch.zeros(2, 2), "bias": torch.zeros(2)}
    with _torch.reparametrized(lin, zeros):
        assert torch.equal(lin(torch.ones(2)), torch.zeros(2))
    assert not torch.equal(lin.weight, torch.zeros(2, 2))


def test_pytrees_flatten_and_rebuild_node_arguments():
    leaves, spec = _torch.tree_flatten(((1, [2, 3]), {"k": 4}))
    assert leaves == [1, 2, 3, 4] == _torch.tree_leaves(((1, [2, 3]), {"k": 4}))
    assert _torch.tree_unflatten([5, 6, 7, 8], spec) == ((5, [6, 7]), {"k": 8})


def test_replacement_attributes_are_copied_as_torch_fx_does():
    class WithConst(nn.Module):
        def __init__(self):
            super().__init__()
            self.c = torch.tensor([3.0])

        def forward(self, x):
            return x + self.c

    gm = fx.symbolic_trace(WithConst())  # its graph reads self.c ...
    delattr(gm, "c")  # ... which only the replacement module has
    _torch.copy_replacement_attributes(gm, fx.symbolic_trace(WithConst()))
    assert torch.equal(gm.c, torch.tensor([3.0]))
