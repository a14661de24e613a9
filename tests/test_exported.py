"""ExportedProgram in, ExportedProgram out: ``rewrite(program, rules).exported_program`` keeps the
input/output signature, state dict and constants, gives new nodes fake ``meta["val"]``, and
survives ``.module()``, ``run_decompositions()``, ``torch.export.save``/``load`` (and, in a slow
test, AOTInductor). Numbers are compared with the original model by ``assert_close``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _helpers import assert_rewrite_sound, hf_attention_rule, tiny_eager_gpt2
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.export import Dim, ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

import fxrewrite
from fxrewrite import Rule, RuleSet
from fxrewrite.errors import ArgumentError, RewriteError

SILU = Rule.from_functions(lambda x: x * torch.sigmoid(x), lambda x: F.silu(x), name="silu")
NEG_NEG = Rule.from_functions(lambda x: torch.neg(torch.neg(x)), lambda x: x, name="neg_neg")
TWICE = Rule.from_functions(lambda x: x + x, lambda x: x * torch.tensor(2.0), name="twice")  # makes a tensor


class Block(nn.Module):
    """Parameters, a buffer, a buffer written in place, two outputs (one is -(-x))."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(6, 6)
        self.register_buffer("shift", torch.linspace(-1, 1, 6))
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls.add_(1)
        y = self.proj(x)
        return y * torch.sigmoid(y) + self.shift, -(-x)  # noqa: B002 (two negations, on purpose)


X = torch.randn(3, 6)


@pytest.fixture
def model() -> Block:
    torch.manual_seed(0)
    return Block().eval()


@pytest.fixture
def program(model) -> ExportedProgram:
    return torch.export.export(model, (X,))


def run_fresh(program: ExportedProgram, model: Block, *inputs):
    """``program.module()`` and a copy of ``model`` on ``inputs``, from the same buffer state."""
    expected_model = Block().eval()
    expected_model.load_state_dict(model.state_dict())
    with torch.no_grad():
        return program.module()(*inputs), expected_model(*inputs)


def specs(program: ExportedProgram) -> list[tuple]:
    """The signature without value names: kind, target, persistence of each input and output."""
    sig = program.graph_signature
    return ([(s.kind, s.target, s.persistent) for s in sig.input_specs],
            [(s.kind, s.target) for s in sig.output_specs])


def test_rewrite_returns_an_exported_program_with_the_same_signature_and_state(model, program):
    result = fxrewrite.rewrite(program, RuleSet([SILU, NEG_NEG]))
    rewritten = result.exported_program
    assert isinstance(rewritten, ExportedProgram)
    assert result.report.applied == {"silu": 1, "neg_neg": 1}
    assert specs(rewritten) == specs(program)
    assert rewritten.graph_signature.user_inputs == program.graph_signature.user_inputs
    assert rewritten.state_dict.keys() == program.state_dict.keys()
    assert all(rewritten.state_dict[k] is v for k, v in program.state_dict.items())
    assert rewritten.call_spec == program.call_spec
    rewritten.graph_module.graph.lint()
    targets = {n.target for n in rewritten.graph.nodes if n.op == "call_function"}
    assert torch.ops.aten.silu.default in targets and torch.ops.aten.neg.default not in targets
    got, expected = run_fresh(rewritten, model, X)
    torch.testing.assert_close(got, expected)


def test_a_functional_program_keeps_its_buffer_mutation_outputs(model, program):
    functional = program.run_decompositions()  # the in-place add_ becomes an output that writes the buffer
    assert functional.graph_signature.output_specs[0].kind == OutputKind.BUFFER_MUTATION
    result = fxrewrite.rewrite(functional, RuleSet([SILU, NEG_NEG]))
    rewritten = result.exported_program
    assert specs(rewritten) == specs(functional)
    assert rewritten.graph_signature.buffers_to_mutate == functional.graph_signature.buffers_to_mutate
    got, expected = run_fresh(rewritten, model, X)
    torch.testing.assert_close(got, expected)
    module = rewritten.module()
    calls = module.calls.clone()
    module(X)
    module(X)
    torch.testing.assert_close(module.calls, calls + 2)  # the buffer is still written, once per call
    assert_rewrite_sound(model, result, X)


def test_the_original_program_is_left_untouched(model, program):
    before = str(program.graph)
    result = fxrewrite.rewrite(program, RuleSet([SILU, NEG_NEG]))
    assert str(program.graph) == before
    assert_rewrite_sound(model, result, X)


def test_new_nodes_carry_fake_values_of_the_shape_and_dtype_they_compute(model, program):
    result = fxrewrite.rewrite(program, SILU)
    assert_rewrite_sound(model, result, X)
    rewritten = result.exported_program
    (silu,) = [n for n in rewritten.graph.nodes if n.target is torch.ops.aten.silu.default]
    assert isinstance(silu.meta["val"], FakeTensor)
    assert silu.meta["val"].shape == (3, 6) and silu.meta["val"].dtype == torch.float32
    assert "fxrewrite rule silu" in silu.meta["stack_trace"]


def test_result_module_is_the_programs_module(model, program):
    result = fxrewrite.rewrite(program, SILU)
    result.module.graph.lint()
    got, expected = run_fresh(result.exported_program, model, X)
    torch.testing.assert_close(got, expected)
    with torch.no_grad():
        torch.testing.assert_close(result.module(X), expected)


def test_an_output_computed_by_a_new_node_is_named_in_the_signature(model, program):
    result = fxrewrite.rewrite(program, NEG_NEG)
    assert_rewrite_sound(model, result, X)
    rewritten = result.exported_program
    output = next(n for n in rewritten.graph.nodes if n.op == "output")
    assert rewritten.graph_signature.user_outputs == tuple(v.name for v in output.args[0])
    assert "neg_1" not in rewritten.graph_signature.user_outputs  # the node that computed it is gone
    got, expected = run_fresh(rewritten, model, X)
    torch.testing.assert_close(got, expected)


@pytest.mark.slow
def test_rewritten_program_survives_run_decompositions(model, program):
    result = fxrewrite.rewrite(program, SILU)
    assert_rewrite_sound(model, result, X)
    rewritten = result.exported_program
    decomposed = rewritten.run_decompositions()  # the default table decomposes aten.silu again
    got, expected = run_fresh(decomposed, model, X)
    torch.testing.assert_close(got, expected)
    table = torch.export.default_decompositions()
    del table[torch.ops.aten.silu.default]
    kept = rewritten.run_decompositions(table)
    assert torch.ops.aten.silu.default in {n.target for n in kept.graph.nodes}
    got, expected = run_fresh(kept, model, X)
    torch.testing.assert_close(got, expected)


def test_rewritten_program_survives_save_and_load(model, program, tmp_path):
    result = fxrewrite.rewrite(program, RuleSet([SILU, NEG_NEG]))
    assert_rewrite_sound(model, result, X)
    rewritten = result.exported_program
    torch.export.save(rewritten, tmp_path / "block.pt2")
    loaded = torch.export.load(tmp_path / "block.pt2")
    assert specs(loaded) == specs(program)
    assert torch.ops.aten.silu.default in {n.target for n in loaded.graph.nodes}
    got, expected = run_fresh(loaded, model, X)
    torch.testing.assert_close(got, expected)


def test_a_tensor_made_by_a_replacement_becomes_a_lifted_constant(tmp_path):
    class Double(nn.Module):
        def forward(self, x):
            return torch.relu(x + x)

    program = torch.export.export(Double(), (X,))
    result = fxrewrite.rewrite(program, TWICE)
    assert_rewrite_sound(Double(), result, X)
    rewritten = result.exported_program
    (spec,) = [s for s in rewritten.graph_signature.input_specs if s.kind == InputKind.CONSTANT_TENSOR]
    torch.testing.assert_close(rewritten.constants[spec.target], torch.tensor(2.0))
    assert not [n for n in rewritten.graph.nodes if n.op == "get_attr"]
    torch.testing.assert_close(rewritten.module()(X), Double()(X))
    torch.export.save(rewritten, tmp_path / "double.pt2")
    torch.testing.assert_close(torch.export.load(tmp_path / "double.pt2").module()(X), Double()(X))


def test_dynamic_shapes_and_range_constraints_are_kept(model):
    program = torch.export.export(model, (X,), dynamic_shapes=({0: Dim("batch", min=2, max=64)},))
    result = fxrewrite.rewrite(program, SILU)
    rewritten = result.exported_program
    assert rewritten.range_constraints == program.range_constraints
    (silu,) = [n for n in rewritten.graph.nodes if n.target is torch.ops.aten.silu.default]
    assert isinstance(silu.meta["val"].shape[0], torch.SymInt)
    bigger = torch.randn(17, 6)
    got, expected = run_fresh(rewritten, model, bigger)
    torch.testing.assert_close(got, expected)
    assert_rewrite_sound(model, result, bigger)


def test_check_inputs_works_on_an_exported_program(model, program):
    result = fxrewrite.rewrite(program, SILU, check_inputs=[(X,)])
    assert result.exported_program is not None and result.report.applied == {"silu": 1}
    assert_rewrite_sound(model, result, X)


def test_a_replacement_calling_a_module_is_refused_for_an_exported_program(program):
    relu_module = Rule.from_functions(lambda x: torch.relu(torch.relu(x)), lambda x: nn.ReLU()(x), name="relu_mod")

    class Twice(nn.Module):
        def forward(self, x):
            return torch.relu(torch.relu(x))

    with pytest.raises(RewriteError, match="holds only calls of ATen ops"):
        fxrewrite.rewrite(torch.export.export(Twice(), (X,)), relu_module)


def test_inplace_and_example_inputs_are_refused_for_an_exported_program(program):
    with pytest.raises(ArgumentError, match="a program is immutable"):
        fxrewrite.rewrite(program, SILU, inplace=True)
    with pytest.raises(ArgumentError, match="example_inputs= is not needed"):
        fxrewrite.rewrite(program, SILU, example_inputs=(X,))


@pytest.mark.slow
def test_rewritten_program_compiles_with_aot_inductor(model, program, tmp_path):
    """About a minute on a busy 2-core CPU machine, hence slow."""
    result = fxrewrite.rewrite(program, RuleSet([SILU, NEG_NEG]))
    assert_rewrite_sound(model, result, X)
    rewritten = result.exported_program
    path = torch._inductor.aoti_compile_and_package(rewritten, package_path=str(tmp_path / "block.pt2"))
    runner = torch._inductor.aoti_load_package(path)
    expected_model = Block().eval()
    expected_model.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(runner(X), expected_model(X))


@pytest.mark.slow
def test_gpt2_eager_attention_becomes_sdpa_in_the_exported_program(tmp_path):
    gpt2 = tiny_eager_gpt2()

    class Logits(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gpt2 = gpt2

        def forward(self, ids):
            return self.gpt2(ids, use_cache=False).logits

    model, ids = Logits().eval(), torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    program = torch.export.export(model, (ids,))
    result = fxrewrite.rewrite(program, hf_attention_rule())
    assert result.report.applied == {"hf_attention": 2}
    rewritten = result.exported_program
    assert specs(rewritten) == specs(program)
    targets = [n.target for n in rewritten.graph.nodes if n.op == "call_function"]
    assert targets.count(torch.ops.aten.scaled_dot_product_attention.default) == 2
    assert torch.ops.aten.softmax.int not in targets and torch.ops.aten._softmax.default not in targets
    torch.export.save(rewritten, tmp_path / "gpt2.pt2")
    with torch.no_grad():
        expected = model(ids)
        torch.testing.assert_close(rewritten.module()(ids), expected, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(torch.export.load(tmp_path / "gpt2.pt2").module()(ids), expected,
                                   rtol=1e-4, atol=1e-5)
    assert_rewrite_sound(model, result, ids, rtol=1e-4, atol=1e-5)


class _Gate(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(x)


class _Gated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(6, 6)
        self.gate = _Gate()

    def forward(self, x):
        return torch.relu(-(-self.gate(self.proj(x))))  # noqa: B002 (two negations, on purpose)


def _preserved_gate_program() -> tuple[nn.Module, ExportedProgram]:
    torch.manual_seed(0)
    model = _Gated().eval()
    return model, torch.export.export(model, (X,), preserve_module_call_signature=("gate",))


def test_values_at_preserved_module_boundaries_are_renamed_and_never_swallowed(tmp_path):
    model, program = _preserved_gate_program()
    across = Rule.from_functions(lambda x: torch.neg(torch.neg(x * torch.sigmoid(x))), lambda x: F.silu(x),
                                 name="across")  # would swallow the gate's output
    result = fxrewrite.rewrite(program, RuleSet([across, SILU, NEG_NEG]))
    assert result.report.applied == {"across": 0, "silu": 1, "neg_neg": 1}
    rewritten = result.exported_program
    (gate,) = [e for e in rewritten.module_call_graph if e.fqn == "gate"]
    names = {n.name: n for n in rewritten.graph.nodes}
    (out,) = gate.signature.outputs
    assert names[out.name].target is torch.ops.aten.silu.default  # the node that computes the gate's output now
    torch.testing.assert_close(rewritten.module()(X), model(X))
    torch.export.save(rewritten, tmp_path / "gated.pt2")
    torch.testing.assert_close(torch.export.load(tmp_path / "gated.pt2").module()(X), model(X))
    assert_rewrite_sound(model, result, X)


def test_rewritten_program_with_a_preserved_module_unflattens():
    model, program = _preserved_gate_program()
    result = fxrewrite.rewrite(program, SILU)
    assert_rewrite_sound(model, result, X)
    rewritten = result.exported_program
    unflat = torch.export.unflatten(rewritten)
    torch.testing.assert_close(unflat(X), model(X))


@pytest.mark.slow
def test_an_inductor_pass_runs_inside_aot_inductor(model, program, tmp_path):
    """AOTInductor deep-copies its inductor_configs; the pass's report still counts."""
    rules = fxrewrite.inductor_pass(NEG_NEG, stage="post_grad")
    path = torch._inductor.aoti_compile_and_package(program.run_decompositions(), package_path=str(tmp_path / "b.pt2"),
                                                    inductor_configs=rules.options)
    runner = torch._inductor.aoti_load_package(path)
    expected_model = Block().eval()
    expected_model.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(runner(X), expected_model(X))
    assert rules.report.applied == {"neg_neg": 1}
