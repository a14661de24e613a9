"""The graph copy behind copying-mode ``rewrite``: what ``copy.deepcopy`` builds, built cheaply."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.fx as fx

from fxrewrite import Rule, rewrite
from fxrewrite.loader import import_file
from fxrewrite.target import _copy_graph, _copy_graph_module

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _example(name: str):
    return import_file(EXAMPLES / f"{name}.py", prefix="tests_copy_")


def _traced_models() -> dict[str, fx.GraphModule]:
    resnet = _example("02_conv_bn_folding").trained_model().eval()
    sdpa = _example("03_attention_to_sdpa")
    gpt = sdpa.gpt().eval()
    return {
        "resnet": fx.symbolic_trace(resnet),
        "gpt": fx.symbolic_trace(gpt),
        "gpt_exported": torch.export.export(gpt, sdpa.example_inputs()).module(),
        "resnet_exported": torch.export.export(resnet, (torch.randn(1, 3, 16, 16),)).module(),
    }


MODELS = _traced_models()


def _description(graph: fx.Graph) -> list[tuple]:
    return [(n.name, n.op, n.target, n.type, n.format_node(), sorted(n.meta), sorted(u.name for u in n.users))
            for n in graph.nodes]


def _users(graph: fx.Graph) -> list[list[str]]:
    return [[u.name for u in n.users] for n in graph.nodes]


@pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")  # from copy.deepcopy, the reference
@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_copy_is_what_deepcopy_builds(name):
    graph = MODELS[name].graph
    ours, theirs = _copy_graph(graph), copy.deepcopy(graph)
    assert _description(ours) == _description(theirs) == _description(graph)
    assert _users(ours) == _users(theirs)  # users in graph order (the original may list them as they came)
    assert ours.python_code("self").src == theirs.python_code("self").src == graph.python_code("self").src
    for mine, original in zip(ours.nodes, graph.nodes):
        assert mine.meta == original.meta and mine.meta is not original.meta
        assert mine.graph is ours
    ours.lint()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_copied_module_runs_like_the_original_and_leaves_it_alone(name):
    gm = MODELS[name]
    before = gm.code
    new = _copy_graph_module(gm)
    new.recompile()
    new.graph.lint()
    assert new.code == before and gm.code == before and new.graph is not gm.graph
    inputs = (torch.randn(1, 3, 16, 16),) if "resnet" in name else _example("03_attention_to_sdpa").example_inputs()
    torch.testing.assert_close(new(*inputs), gm(*inputs))


def test_names_created_in_the_copy_are_those_the_original_would_create():
    gm = fx.symbolic_trace(lambda x: torch.relu(torch.relu(x)))
    graph = gm.graph
    doomed = next(n for n in graph.nodes if n.name == "relu_1")
    doomed.replace_all_uses_with(doomed.args[0])
    graph.erase_node(doomed)  # 'relu_1' stays taken in the original's namespace
    copied = _copy_graph(graph)
    relu = next(n for n in copied.nodes if n.name == "relu")
    with copied.inserting_after(relu):
        new = copied.call_function(torch.relu, (relu,))
    with graph.inserting_after(next(n for n in graph.nodes if n.name == "relu")):
        expected = graph.call_function(torch.relu, (next(n for n in graph.nodes if n.name == "relu"),))
    assert new.name == expected.name == "relu_2"


def test_copying_rewrite_matches_inplace_rewrite_node_for_node():
    relu_relu = Rule.from_functions(lambda x: torch.relu(torch.relu(x)), lambda x: torch.clamp(x, min=0.0),
                                    name="relu_relu")
    gm = MODELS["gpt"]
    copied = rewrite(gm, relu_relu).module
    inplace = rewrite(_copy_graph_module(gm), relu_relu, inplace=True).module
    assert copied.code == inplace.code
    copied.graph.lint()


def test_a_traced_target_keeps_what_symbolic_trace_gives_and_is_compiled_once(monkeypatch):
    resnet = _example("02_conv_bn_folding").trained_model().eval()
    compiled = []
    original = fx.GraphModule.recompile
    monkeypatch.setattr(fx.GraphModule, "recompile", lambda self: (compiled.append(len(self.graph.nodes)),
                                                                   original(self))[1])
    relu_relu = Rule.from_functions(lambda x: torch.relu(torch.relu(x)), lambda x: torch.relu(x), name="relu_relu")
    result = rewrite(resnet, relu_relu)
    assert [n for n in compiled if n > 1] == [len(result.module.graph.nodes)]  # the final compile only
    reference = fx.symbolic_trace(resnet)
    assert result.module.code == reference.code and type(result.module).__name__ == type(reference).__name__
    # traced by fxrewrite's tracer: torch.fx's, confined to its thread and reading buffers as graph values
    from fxrewrite.pattern import ThreadConfinedTracer

    assert result.module.training is False and result.module._tracer_cls is ThreadConfinedTracer
    assert issubclass(ThreadConfinedTracer, reference._tracer_cls)
    x = torch.randn(2, 3, 16, 16)
    torch.testing.assert_close(result.module(x), resnet(x))
    result.module.graph.lint()


def test_the_copy_keeps_the_training_flag_and_tracer_class():
    gm = MODELS["resnet"]
    new = _copy_graph_module(gm)
    assert new.training is gm.training is False and new._tracer_cls is gm._tracer_cls
