"""fxrewrite.target: what a user hands us, as a GraphModule to rewrite, and the model a command
line names."""

from __future__ import annotations

import sys
import warnings

import pytest
import torch
import torch.fx as fx
from _helpers import StatefulNet, assert_same_state, module_state, neg_neg

from fxrewrite import RewriteError, Rule, TargetError, rewrite
from fxrewrite.target import load_target, to_graph_module, traced_or_exported

NEG_NEG = Rule.from_functions(lambda x: torch.neg(torch.neg(x)), lambda x: x, name="neg_neg")


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.neg(torch.neg(self.lin(x))) + 1


def checked(result, model, inputs):
    result.module.graph.lint()
    torch.testing.assert_close(result.module(*inputs), model(*inputs))
    return result


# ---- load_target ---------------------------------------------------------------------------------------------


def test_a_target_file_imports_the_modules_next_to_it(tmp_path, monkeypatch):
    (tmp_path / "layers.py").write_text("import torch\n\nclass Twice(torch.nn.Module):\n"
                                        "    def forward(self, x):\n        return x * 2\n")
    (tmp_path / "net.py").write_text("from layers import Twice\n\nmodel = Twice()\n\n"
                                     "def example_inputs():\n    import torch\n    return torch.ones(3)\n")
    monkeypatch.chdir(tmp_path)
    path_before = list(sys.path)
    target = load_target("net.py:model")
    assert sys.path == path_before
    assert type(target.model).__name__ == "Twice"
    assert len(target.example_inputs) == 1  # a single tensor becomes a tuple of one
    torch.testing.assert_close(target.model(*target.example_inputs), torch.full((3,), 2.0))


def test_a_target_file_and_a_rule_file_with_the_same_name_do_not_collide(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "model.py").write_text("import torch\nmodel = torch.nn.ReLU()\n")
    (tmp_path / "b" / "model.py").write_text("import torch\nmodel = torch.nn.Tanh()\n")
    first = load_target(f"{tmp_path / 'a' / 'model.py'}:model")
    second = load_target(f"{tmp_path / 'b' / 'model.py'}:model")
    assert (type(first.model), type(second.model)) == (torch.nn.ReLU, torch.nn.Tanh)
    assert "model" not in sys.modules


def test_a_target_file_that_raises_leaves_no_module_behind(tmp_path):
    bad = tmp_path / "bad_target.py"
    bad.write_text("raise RuntimeError('broken on purpose')\n")
    modules_before = set(sys.modules)
    with pytest.raises(TargetError, match=r"cannot import .*bad_target.py.*RuntimeError: broken on purpose"):
        load_target(f"{bad}:model")
    assert not {m for m in set(sys.modules) - modules_before if "bad_target" in m}


def test_a_package_module_target():
    target = load_target("torch.nn:ReLU")
    assert isinstance(target.model, torch.nn.ReLU) and target.example_inputs is None


# ---- traced_or_exported --------------------------------------------------------------------------------------------


def test_traced_or_exported_traces_or_exports_the_model(tmp_path):
    (tmp_path / "net.py").write_text("import torch\nmodel = torch.nn.Sequential(torch.nn.Linear(3, 2))\n\n"
                                     "def example_inputs():\n    return (torch.randn(5, 3),)\n")
    target = load_target(f"{tmp_path / 'net.py'}:model")
    traced = traced_or_exported(target, export=False)
    exported = traced_or_exported(target, export=True)
    assert [n.op for n in traced.graph.nodes] == ["placeholder", "call_module", "output"]
    assert any(n.target is torch.ops.aten.linear.default for n in exported.graph.nodes)
    x = torch.randn(5, 3)
    torch.testing.assert_close(exported(x), target.model(x))


def test_export_without_example_inputs_says_what_to_define():
    with pytest.raises(TargetError, match=r"--export needs example inputs: define example_inputs\(\) next to"):
        traced_or_exported(load_target("torch.nn:ReLU"), export=True)


# ---- to_graph_module -----------------------------------------------------------------------------------------------


def test_a_copied_graph_module_has_its_own_graph_and_shares_the_weights():
    gm = fx.symbolic_trace(Net())
    copy = to_graph_module(gm)
    copy.recompile()
    assert copy is not gm and copy.graph is not gm.graph
    assert copy.lin.weight is gm.lin.weight
    assert [n.name for n in copy.graph.nodes] == [n.name for n in gm.graph.nodes]
    x = torch.randn(2, 4)
    torch.testing.assert_close(copy(x), gm(x))


def test_copying_an_exported_module_prints_no_warning():
    """torch.fx's Graph.__deepcopy__ rebuilds the pytree specs of the codegen; rebuilding a
    LeafSpec warns (FutureWarning) in torch 2.10+."""
    gm = torch.export.export(Net(), (torch.randn(2, 4),)).module()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        copy = to_graph_module(gm)
        copy.recompile()
    assert [n.meta.get("val") is not None for n in copy.graph.nodes] == \
        [n.meta.get("val") is not None for n in gm.graph.nodes]
    x = torch.randn(2, 4)
    torch.testing.assert_close(copy(x), gm(x))


def test_rewriting_an_exported_program_prints_no_warning():
    ep = torch.export.export(Net(), (torch.randn(2, 4),))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = rewrite(ep.module(), NEG_NEG)
    assert result.report.applied["neg_neg"] == 1
    checked(result, ep.module(), (torch.randn(2, 4),))


# ---- check_inputs on every kind of target (the reference copy is compiled) -----------------------------------------


@pytest.mark.parametrize("make", [
    lambda net, x: net,
    lambda net, x: fx.symbolic_trace(net),
    lambda net, x: torch.export.export(net, x).module(),
    lambda net, x: torch.export.export(net, x),
], ids=["module", "graph_module", "ep.module()", "exported_program"])
def test_check_inputs_works_on_every_kind_of_target(make):
    net = Net()
    x = (torch.randn(2, 4),)
    result = rewrite(make(net, x), NEG_NEG, check_inputs=x)
    assert result.report.applied["neg_neg"] == 1
    checked(result, net, x)


# ---- what cannot be rewritten -------------------------------------------------------------------------------


@pytest.mark.parametrize("target, fragment", [
    (42, "cannot rewrite 42 (int): pass an nn.Module, a torch.fx.GraphModule or a function of tensors"),
    ("model.py:Net", "cannot rewrite 'model.py:Net' (str)"),
    (None, "cannot rewrite None (NoneType)"),
])
def test_target_that_is_not_a_module_is_a_rewrite_error(target, fragment):
    with pytest.raises(RewriteError) as info:
        rewrite(target, neg_neg(lambda x: x))
    assert fragment in str(info.value)


class Branchy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x) if x.sum() > 0 else -x


def test_untraceable_target_is_a_rewrite_error_and_the_module_is_untouched():
    model = Branchy()
    before = module_state(model)
    with pytest.raises(RewriteError) as info:
        rewrite(model, neg_neg(lambda x: x))
    assert "symbolic_trace could not trace Branchy" in str(info.value) and "concrete_args or torch.export" in str(
        info.value)
    assert_same_state(before, module_state(model))


def test_inplace_needs_a_graph_module_and_leaves_the_module_alone():
    model = StatefulNet().eval()
    before = module_state(model)
    with pytest.raises(RewriteError, match=r"inplace=True needs a torch.fx.GraphModule, got StatefulNet"):
        rewrite(model, neg_neg(lambda x: x), inplace=True)
    assert_same_state(before, module_state(model))
