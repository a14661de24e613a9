"""One rule, two levels: rules written at torch level match the same computation in a graph from
``torch.fx.symbolic_trace`` (torch functions, methods, modules) and in a graph from
``torch.export.export`` (ATen overloads, modules inlined), checked by numbers.

The centre piece rewrites ``nn.TransformerEncoder`` traced both ways with one rule set; see
:class:`EncoderTracer` for how to trace it symbolically at all.
"""

from __future__ import annotations

import operator
from unittest import mock

import pytest
import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
from _helpers import assert_rewrite_sound
from torch._subclasses.fake_tensor import FakeTensor
from torch.export.graph_signature import InputKind
from torch.nn.modules import transformer

from fxrewrite import Rule, RuleSet, find_matches, rewrite
from fxrewrite.canon import op_key_of

LEVELS = ("symbolic_trace", "export.module", "export.graph_module")


# -- helpers ------------------------------------------------------------------------------------


class Wrap(nn.Module):
    """A function of tensors as a module, so torch.export can take it. The function itself is the
    module's ``forward``, so exported placeholders keep its parameter names."""

    def __init__(self, fn):
        super().__init__()
        self.forward = fn


_programs: dict[tuple[int, ...], tuple[nn.Module, tuple, torch.export.ExportedProgram]] = {}


def exported(model: nn.Module, inputs: tuple) -> torch.export.ExportedProgram:
    """``torch.export.export(model, inputs)``, once per model and inputs (the cache keeps them
    alive, so their ids are not reused)."""
    key = (id(model), *map(id, inputs))
    if key not in _programs:
        _programs[key] = (model, inputs, torch.export.export(model, inputs))
    return _programs[key][2]


def graph_at(level: str, model: nn.Module, inputs: tuple) -> fx.GraphModule:
    """The graph of ``model`` at ``level``."""
    if level == "symbolic_trace":  # symbolic_trace calls the class's forward; trace a Wrap's function
        return fx.symbolic_trace(model.forward if isinstance(model, Wrap) else model)
    program = exported(model, inputs)
    return program.module() if level == "export.module" else program.graph_module


def call(level: str, gm: fx.GraphModule, model: nn.Module, inputs: tuple) -> torch.Tensor:
    """Run ``gm`` as a user of ``level`` would: an ExportedProgram's ``graph_module`` takes the
    lifted parameters and buffers first and returns a tuple."""
    if level != "export.graph_module":
        return gm(*inputs)
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    program = exported(model, inputs)
    user = iter(inputs)
    args = [state[spec.target] if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER) else next(user)
            for spec in program.graph_signature.input_specs]
    (out,) = gm(*args)
    return out


def assert_rewritten(level: str, result, model: nn.Module, inputs: tuple, **tolerance) -> None:
    """The rewritten graph lints and computes what the original model computes."""
    result.module.graph.lint()
    with torch.no_grad():
        torch.testing.assert_close(call(level, result.module, model, inputs), model(*inputs), **tolerance)


def real_values(gm: fx.GraphModule, *inputs) -> dict[fx.Node, object]:
    """The value every node of ``gm`` computes on ``inputs``."""
    seen: dict[fx.Node, object] = {}

    class Record(fx.Interpreter):
        def run_node(self, n):
            seen[n] = value = super().run_node(n)
            return value

    with torch.no_grad():
        Record(gm).run(*inputs)
    return seen


def made_by(gm: fx.GraphModule, rule_name: str) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.meta.get("fxrewrite_rule") == rule_name]


def assert_aten_nodes_with_fake_values(gm: fx.GraphModule, nodes: list[fx.Node], *inputs) -> None:
    """Replacement nodes in an exported graph are ATen overload calls whose ``meta["val"]`` is a
    fake tensor of the shape and dtype the node really computes."""
    assert nodes, "the rule created no node"
    values = real_values(gm, *inputs)
    for n in nodes:
        assert isinstance(n.target, torch._ops.OpOverload), n.format_node()
        fake = n.meta.get("val")
        assert isinstance(fake, FakeTensor), f"{n.format_node()} has meta['val'] = {fake!r}"
        assert (fake.shape, fake.dtype) == (values[n].shape, values[n].dtype), n.format_node()


# -- one rule at every level --------------------------------------------------------------------


SILU = Rule.from_functions(lambda x: torch.sigmoid(x) * x, lambda x: F.silu(x), name="silu")


def gated(a, b):
    return torch.sigmoid(a) * a + b


@pytest.mark.parametrize("level", LEVELS)
def test_torch_level_rule_rewrites_every_level(level):
    model, inputs = Wrap(gated), (torch.randn(3, 4), torch.randn(3, 4))
    result = rewrite(graph_at(level, model, inputs), SILU)
    assert result.report.applied == {"silu": 1}
    assert_rewritten(level, result, model, inputs)
    (silu,) = made_by(result.module, "silu")
    assert silu.target is (F.silu if level == "symbolic_trace" else torch.ops.aten.silu.default)


@pytest.mark.parametrize("level", LEVELS)
def test_keyword_and_default_arguments_match_at_every_level(level):
    rule = Rule.from_functions(lambda x: torch.sum(x, dim=1) * 2.0, lambda x: torch.sum(x + x, 1), name="sum2")
    model, inputs = Wrap(lambda a: a.sum(1) * 2.0), (torch.randn(3, 4),)
    result = rewrite(graph_at(level, model, inputs), rule)
    assert result.report.applied == {"sum2": 1}
    assert_rewritten(level, result, model, inputs)


def test_exported_graph_spells_ops_as_aten_overloads_the_rule_never_mentions():
    model, inputs = Wrap(gated), (torch.randn(3, 4), torch.randn(3, 4))
    gm = graph_at("export.module", model, inputs)
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert {torch.ops.aten.sigmoid.default, torch.ops.aten.mul.Tensor} <= targets
    ((_, match),) = find_matches(gm, SILU)
    assert match.anchor.target is torch.ops.aten.mul.Tensor and match.node("x").name == "a"


def test_operator_spellings_are_one_op_for_exported_and_traced_graphs():
    # The same rule's anchor key indexes operator.mul, torch.mul, Tensor.mul and aten.mul.Tensor.
    keys = {op_key_of("call_function", operator.mul), op_key_of("call_function", torch.mul),
            op_key_of("call_method", "mul"), op_key_of("call_function", torch.ops.aten.mul.Tensor)}
    assert keys == {SILU.anchor_key}


# -- replacements in exported graphs ------------------------------------------------------------


def dot_last(x, y):
    return torch.sum(x * y, dim=-1)


def dot_as_matmul(x, y):
    return torch.matmul(x.unsqueeze(-2), y.unsqueeze(-1)).squeeze(-1).squeeze(-1)


DOT = Rule.from_functions(dot_last, dot_as_matmul, name="dot")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_replacement_nodes_in_exported_graphs_are_aten_overloads_with_fake_values(dtype):
    model = Wrap(lambda a, b: torch.relu((a * b).sum(-1)))
    inputs = (torch.randn(2, 3, 5, dtype=dtype), torch.randn(2, 3, 5, dtype=dtype))
    result = rewrite(graph_at("export.module", model, inputs), DOT)
    assert result.report.applied == {"dot": 1}
    assert_rewritten("export.module", result, model, inputs)
    nodes = made_by(result.module, "dot")
    assert [n.target for n in nodes] == [torch.ops.aten.unsqueeze.default, torch.ops.aten.unsqueeze.default,
                                         torch.ops.aten.matmul.default, torch.ops.aten.squeeze.dim,
                                         torch.ops.aten.squeeze.dim]
    assert_aten_nodes_with_fake_values(result.module, nodes, *inputs)
    assert nodes[-1].meta["val"].shape == (2, 3) and nodes[-1].meta["val"].dtype == dtype


def test_replacement_nodes_carry_the_rule_as_provenance():
    model, inputs = Wrap(gated), (torch.randn(3, 4), torch.randn(3, 4))
    result = rewrite(graph_at("export.module", model, inputs), SILU)
    (silu,) = made_by(result.module, "silu")
    assert "fxrewrite rule silu" in silu.meta["stack_trace"]
    assert_rewrite_sound(model, result, *inputs)


def test_replacement_in_a_traced_graph_stays_at_torch_level():
    model, inputs = Wrap(lambda a, b: torch.relu((a * b).sum(-1))), (torch.randn(2, 5), torch.randn(2, 5))
    result = rewrite(graph_at("symbolic_trace", model, inputs), DOT)
    nodes = made_by(result.module, "dot")
    assert nodes and not any(isinstance(n.target, torch._ops.OpOverload) for n in nodes)
    assert "torch.matmul" in result.code
    assert_rewritten("symbolic_trace", result, model, inputs)


def test_rewritten_exported_module_runs_and_exports_again():
    model = Wrap(lambda a, b, c: torch.relu((a * b).sum(-1)) + torch.sigmoid(c) * c)
    inputs = (torch.randn(4, 6), torch.randn(4, 6), torch.randn(4))
    result = rewrite(graph_at("export.module", model, inputs), RuleSet([DOT, SILU]))
    assert result.report.applied == {"dot": 1, "silu": 1}
    assert_rewritten("export.module", result, model, inputs)
    again = torch.export.export(result.module, inputs)
    targets = {n.target for n in again.graph.nodes if n.op == "call_function"}
    assert torch.ops.aten.silu.default in targets and torch.ops.aten.matmul.default in targets
    torch.testing.assert_close(again.module()(*inputs), model(*inputs))


def test_rewriting_an_exported_module_leaves_it_untouched():
    model, inputs = Wrap(gated), (torch.randn(3, 4), torch.randn(3, 4))
    gm = graph_at("export.module", model, inputs)
    before = gm.code
    result = rewrite(gm, SILU)
    assert gm.code == before
    assert_rewrite_sound(model, result, *inputs)


# -- guards read metadata -----------------------------------------------------------------------


def relu_relu(where):
    return Rule.from_functions(lambda x: torch.relu(torch.relu(x)), lambda x: torch.relu(x), name="relu_relu",
                               where=where)


def twice_relu(a):
    return torch.relu(torch.relu(a)) * 2


def view_of(m):
    view = m["x"]
    return view.shape, view.dtype, view.dim(), view.ndim, view.device, view.size(-1)


EXPECTED_VIEW = (torch.Size([3, 5]), torch.float64, 2, 2, torch.device("cpu"), 5)


def test_guard_reads_shape_dtype_dim_device_from_an_exported_graph():
    seen = []
    guard = relu_relu(where=lambda m: seen.append(view_of(m)) or True)
    inputs = (torch.randn(3, 5, dtype=torch.float64),)
    result = rewrite(graph_at("export.module", Wrap(twice_relu), inputs), guard)  # no example_inputs needed
    assert result.report.applied == {"relu_relu": 1}
    assert seen == [EXPECTED_VIEW]
    assert_rewrite_sound(twice_relu, result, *inputs)


def test_guard_reads_shape_dtype_dim_device_from_a_traced_graph_given_example_inputs():
    seen = []
    guard = relu_relu(where=lambda m: seen.append(view_of(m)) or True)
    inputs = (torch.randn(3, 5, dtype=torch.float64),)
    result = rewrite(graph_at("symbolic_trace", Wrap(twice_relu), inputs), guard, example_inputs=inputs)
    assert result.report.applied == {"relu_relu": 1}
    assert seen == [EXPECTED_VIEW]
    assert_rewrite_sound(twice_relu, result, *inputs)


@pytest.mark.parametrize("level", ["symbolic_trace", "export.module"])
def test_guard_on_shape_decides_at_both_levels(level):
    wide = relu_relu(where=lambda m: m["x"].shape[-1] >= 8)
    for width, fires in ((16, 1), (4, 0)):
        inputs = (torch.randn(2, width),)
        gm = graph_at(level, Wrap(twice_relu), inputs)
        result = rewrite(gm, wide, example_inputs=inputs if level == "symbolic_trace" else None)
        assert result.report.applied["relu_relu"] == fires
        assert result.report.rejected["relu_relu"] == 1 - fires
        assert_rewritten(level, result, Wrap(twice_relu), inputs)


def test_guard_on_a_traced_graph_without_metadata_refuses_and_says_to_pass_example_inputs():
    gm = graph_at("symbolic_trace", Wrap(twice_relu), (torch.randn(2, 3),))
    result = rewrite(gm, relu_relu(where=lambda m: m["x"].dtype == torch.float32))
    assert result.report.applied["relu_relu"] == 0
    assert "example_inputs=" in result.report.reasons["relu_relu"][0]
    assert_rewrite_sound(twice_relu, result, torch.randn(2, 3))


def test_replacement_outputs_keep_metadata_so_later_guards_can_read_it():
    # relu_relu fires three times in a row on relu^4: each time its guard reads the shape of a
    # value the previous rewrite created.
    shapes = []
    guard = relu_relu(where=lambda m: shapes.append(m["x"].shape) or True)
    model = Wrap(lambda a: torch.relu(torch.relu(torch.relu(torch.relu(a)))))
    inputs = (torch.randn(2, 7),)
    for level in ("symbolic_trace", "export.module"):
        shapes.clear()
        gm = graph_at(level, model, inputs)
        result = rewrite(gm, guard, example_inputs=inputs if level == "symbolic_trace" else None)
        assert result.report.applied["relu_relu"] == 3
        assert shapes == [torch.Size([2, 7])] * 3
        assert_rewritten(level, result, model, inputs)


# -- commutativity on exported graphs -------------------------------------------------------------


RELU_PLUS = Rule.from_functions(lambda x, y: torch.relu(x) + y, lambda x, y: y - torch.neg(torch.relu(x)),
                                name="relu_plus")


@pytest.mark.parametrize("level", ["symbolic_trace", "export.module"])
def test_commuted_add_matches(level):
    model, inputs = Wrap(lambda a, b: b + torch.relu(a)), (torch.randn(4), torch.randn(4))
    gm = graph_at(level, model, inputs)
    add = next(n for n in gm.graph.nodes if n.op == "call_function" and "add" in str(n.target))
    assert add.args[0].name == "b"  # the graph has y + relu(x)
    ((_, match),) = find_matches(gm, RELU_PLUS)
    assert (match.node("x").name, match.node("y").name) == ("a", "b")
    result = rewrite(gm, RELU_PLUS)
    assert result.report.applied == {"relu_plus": 1}
    assert_rewritten(level, result, model, inputs)


@pytest.mark.parametrize("level", ["symbolic_trace", "export.module"])
def test_non_commutative_sub_does_not_match_swapped(level):
    rule = Rule.from_functions(lambda x, y: torch.relu(x) - y, lambda x, y: torch.relu(x) + torch.neg(y),
                               name="relu_minus")
    model, inputs = Wrap(lambda a, b: b - torch.relu(a)), (torch.randn(4), torch.randn(4))
    assert list(find_matches(graph_at(level, model, inputs), rule)) == []


def distribute(a, b, c):
    return (a + b) * c


def distributed(a, b, c):
    return a * c + b * c


@pytest.mark.parametrize("level", ["symbolic_trace", "export.module"])
@pytest.mark.parametrize("spelling", [lambda p, q, r: (p + q) * r, lambda p, q, r: r * (q + p),
                                      lambda p, q, r: r * (p + q), lambda p, q, r: torch.mul(torch.add(q, p), r)],
                         ids=["(p+q)*r", "r*(q+p)", "r*(p+q)", "mul(add(q,p),r)"])
def test_nested_commutativity(level, spelling):
    rule = Rule.from_functions(distribute, distributed, name="distribute")
    model, inputs = Wrap(spelling), (torch.randn(5), torch.randn(5), torch.randn(5))
    gm = graph_at(level, model, inputs)
    ((_, match),) = find_matches(gm, rule)
    assert match.node("c").name == "r"
    assert {match.node("a").name, match.node("b").name} == {"p", "q"}
    result = rewrite(gm, rule)
    assert result.report.applied == {"distribute": 1}
    assert_rewritten(level, result, model, inputs)


def test_nested_commutativity_backtracks_into_the_inner_operands():
    # (a + relu(b)) * c against c * (relu(q) + p): the outer mul must swap, then the inner add.
    rule = Rule.from_functions(lambda a, b, c: (a + torch.relu(b)) * c,
                               lambda a, b, c: a * c + torch.relu(b) * c, name="inner")
    model = Wrap(lambda p, q, r: r * (torch.relu(q) + p))
    inputs = (torch.randn(5), torch.randn(5), torch.randn(5))
    for level in ("symbolic_trace", "export.module"):
        ((_, match),) = find_matches(graph_at(level, model, inputs), rule)
        assert [match.node(v).name for v in "abc"] == ["p", "q", "r"]


# -- module captures and functional rules ---------------------------------------------------------


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.drop = nn.Dropout(0.25)

    def forward(self, x):
        return self.drop(torch.relu(self.lin(x)))


def test_module_captures_match_traced_graphs_and_functional_rules_match_exported_ones():
    def module_pattern(x, lin: nn.Linear):
        return torch.relu(lin(x))

    def functional_pattern(x, w, b):
        return torch.relu(F.linear(x, w, b))

    by_module = Rule.from_functions(module_pattern, lambda x, lin: torch.clamp_min(lin(x), 0), name="by_module")
    by_function = Rule.from_functions(functional_pattern, lambda x, w, b: torch.relu(x @ w.t() + b), name="by_function")
    model, inputs = Block().eval(), (torch.randn(2, 6),)
    traced = graph_at("symbolic_trace", model, inputs)
    exported = graph_at("export.module", model, inputs)
    assert [r.name for r, _ in find_matches(traced, RuleSet([by_module, by_function]))] == ["by_module"]
    assert [r.name for r, _ in find_matches(exported, RuleSet([by_module, by_function]))] == ["by_function"]


# -- nn.TransformerEncoder, traced both ways ------------------------------------------------------


_get_seq_len = transformer._get_seq_len


def _seq_len_leaf(src, batch_first):
    """``transformer._get_seq_len`` as an fx leaf function: one ``call_function`` node instead of
    ``if src.is_nested`` and ``len(src.size())`` on a Proxy."""
    if isinstance(src, fx.Proxy):
        return src.tracer.create_proxy("call_function", _get_seq_len, (src, batch_first), {})
    return _get_seq_len(src, batch_first)


class EncoderTracer(fx.Tracer):
    """Symbolically traces ``nn.TransformerEncoder`` (``torch.fx.symbolic_trace`` cannot).

    Why plain tracing fails, and what each step of the recipe fixes:

    1. ``mask``/``src_key_padding_mask``/``is_causal`` become Proxies, and
       ``F._none_or_dtype(mask)`` raises "input to _none_or_dtype() must be None or
       torch.Tensor". Fix: ``concrete_args`` sets them to ``None`` (torch.fx then guards the
       specialisation with ``_assert_is_none``). With ``mask=None``, ``_detect_is_causal_mask``
       never looks at its ``size`` argument and returns ``False``.
    2. ``_get_seq_len(src, ...)`` branches on ``src.is_nested`` and calls ``len`` on
       ``src.size()``. ``fx.Tracer(autowrap_functions=(_get_seq_len, ...))`` does not help: the
       tracer's autowrap patches only *public* names of a module's globals (``_autowrap_check``
       skips names starting with ``_``), so the two private helpers are never wrapped; and
       ``torch.fx.wrap("_get_seq_len")`` registers the name in the *caller's* module, not in
       ``torch.nn.modules.transformer``. Fix: while tracing, patch the module global with a leaf
       wrapper (what autowrap would do for a public name) -- :func:`_seq_len_leaf`.
    3. ``TransformerEncoderLayer`` lives in ``torch.nn`` so it is a leaf module by default: the
       trace would show two opaque ``call_module`` nodes. Fix: ``is_leaf_module`` traces through
       it (its ``Linear``, ``LayerNorm``, ``Dropout`` and ``MultiheadAttention`` stay leaves).
    4. Traced through, the layer's fast-path check branches on ``src.dim() != 3``. Fix: disable
       the fast path while tracing (``torch.backends.mha.set_fastpath_enabled(False)``), so the
       ``elif`` chain stops at its first, Proxy-free test and the reference (slow) path is traced.
       The traced graph computes what eager eval mode computes (fast path or not).
    """

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if isinstance(m, (nn.TransformerEncoder, nn.TransformerEncoderLayer)):
            return False
        return super().is_leaf_module(m, module_qualified_name)

    def trace(self, root, concrete_args=None):
        fastpath = torch.backends.mha.get_fastpath_enabled()
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            with mock.patch.object(transformer, "_get_seq_len", _seq_len_leaf):
                return super().trace(root, concrete_args)
        finally:
            torch.backends.mha.set_fastpath_enabled(fastpath)


def trace_encoder(encoder: nn.TransformerEncoder) -> fx.GraphModule:
    graph = EncoderTracer().trace(encoder, concrete_args={"mask": None, "src_key_padding_mask": None,
                                                          "is_causal": None})
    return fx.GraphModule(encoder, graph, class_name="TracedTransformerEncoder")


def make_encoder() -> nn.TransformerEncoder:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, batch_first=True)
    return nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval()


SRC = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(1))


# The rule set. Priorities: dropout removal first, then modules lowered to functionals, then the
# functional rules (which then fire on the lowered traced graph and on the exported graph alike).

def eval_dropout_module_pattern(x, drop: nn.Dropout):
    "A Dropout module in eval mode is the identity (traced graphs: Dropout is a call_module)."
    return drop(x)


def eval_dropout_module_replacement(x, drop):
    return x


def eval_dropout_pattern(x, p: float):
    "Functional dropout with training=False is the identity (exported: aten.dropout(x, p, False))."
    return F.dropout(x, p, False)


def eval_dropout_replacement(x, p):
    return x


def linear_module_pattern(x, lin: nn.Linear):
    "A Linear module call is F.linear on its parameters."
    return lin(x)


def linear_module_replacement(x, lin):
    return F.linear(x, lin.weight, lin.bias)


def layer_norm_module_pattern(x, norm: nn.LayerNorm):
    "A LayerNorm module call is F.layer_norm on its parameters."
    return norm(x)


def layer_norm_module_replacement(x, norm):
    return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)


def feed_forward_pattern(x, w1, b1, w2, b2):
    "The position-wise feed-forward block, linear -> relu -> linear."
    return F.linear(torch.relu(F.linear(x, w1, b1)), w2, b2)


def feed_forward_replacement(x, w1, b1, w2, b2):
    return torch.relu(x @ w1.t() + b1) @ w2.t() + b2


def residual_layer_norm_pattern(x, y, w, b, eps: float, cudnn: bool):
    """Post-norm residual: layer_norm(x + y), written out. ``cudnn`` captures the backend flag,
    which F.layer_norm sets to True and torch.export records as False."""
    return torch.layer_norm(x + y, [16], w, b, eps, cudnn)


def residual_layer_norm_replacement(x, y, w, b, eps, cudnn):
    h = x + y
    centred = h - h.mean(-1, keepdim=True)
    variance = (centred * centred).mean(-1, keepdim=True)
    return centred * torch.rsqrt(variance + eps) * w + b


ENCODER_RULES = RuleSet([
    Rule.from_functions(eval_dropout_module_pattern, eval_dropout_module_replacement, name="eval_dropout_module",
                        priority=2, where=lambda m: not m["drop"].training),
    Rule.from_functions(eval_dropout_pattern, eval_dropout_replacement, name="eval_dropout", priority=2),
    Rule.from_functions(linear_module_pattern, linear_module_replacement, name="linear_module", priority=1),
    Rule.from_functions(layer_norm_module_pattern, layer_norm_module_replacement, name="layer_norm_module",
                        priority=1),
    Rule.from_functions(feed_forward_pattern, feed_forward_replacement, name="feed_forward"),
    Rule.from_functions(residual_layer_norm_pattern, residual_layer_norm_replacement, name="residual_layer_norm",
                        where=lambda m: m["x"].shape == m["y"].shape),
])

# Which rule fires how often at which level (two layers: three dropouts, two linears and two
# layer norms in each; the attention's own projections stay inside the MultiheadAttention leaf in
# the traced graph and are not followed by relu in the exported one).
FIRED = {
    "symbolic_trace": {"eval_dropout_module": 6, "eval_dropout": 0, "linear_module": 4, "layer_norm_module": 4,
                       "feed_forward": 2, "residual_layer_norm": 4},
    "export": {"eval_dropout_module": 0, "eval_dropout": 6, "linear_module": 0, "layer_norm_module": 0,
               "feed_forward": 2, "residual_layer_norm": 4},
}


@pytest.fixture(scope="module")
def encoder():
    return make_encoder()


@pytest.fixture(scope="module")
def encoder_program(encoder):
    return torch.export.export(encoder, (SRC,))


def test_symbolic_trace_of_transformer_encoder_fails_out_of_the_box(encoder):
    with pytest.raises(Exception, match="_none_or_dtype"):
        fx.symbolic_trace(encoder)
    autowrap = fx.Tracer(autowrap_functions=(transformer._get_seq_len, transformer._detect_is_causal_mask))
    with pytest.raises(fx.proxy.TraceError, match="control flow"):  # private helpers are never autowrapped
        autowrap.trace(encoder, concrete_args={"mask": None, "src_key_padding_mask": None, "is_causal": None})


def test_encoder_tracer_traces_through_the_layers(encoder):
    fastpath = torch.backends.mha.get_fastpath_enabled()
    gm = trace_encoder(encoder)
    gm.graph.lint()
    modules = [n.target for n in gm.graph.nodes if n.op == "call_module"]
    assert "layers.0.self_attn" in modules and "layers.1.linear2" in modules and "layers.0" not in modules
    assert torch.backends.mha.get_fastpath_enabled() == fastpath  # restored after tracing
    assert transformer._get_seq_len is _get_seq_len  # unpatched after tracing
    with torch.no_grad():
        torch.testing.assert_close(gm(SRC), encoder(SRC), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("level", LEVELS)
def test_one_rule_set_rewrites_transformer_encoder_traced_both_ways(level, encoder, encoder_program):
    if level == "symbolic_trace":
        gm = trace_encoder(encoder)
        result = rewrite(gm, ENCODER_RULES, example_inputs=(SRC,))  # the guard reads shapes
    else:
        gm = encoder_program.module() if level == "export.module" else encoder_program.graph_module
        result = rewrite(gm, ENCODER_RULES)  # exported graphs carry meta["val"]
    assert result.report.applied == FIRED["symbolic_trace" if level == "symbolic_trace" else "export"]
    assert_rewritten(level, result, encoder, (SRC,), rtol=1e-4, atol=1e-5)
    remaining = {_what(n, result.module) for n in result.module.graph.nodes}
    assert remaining.isdisjoint({"dropout", "Dropout", "Linear", "LayerNorm", "layer_norm"})
    if level == "symbolic_trace":
        assert "MultiheadAttention" in remaining  # a leaf: its insides are not the rules' business


def _what(n: fx.Node, gm: fx.GraphModule) -> str | None:
    if n.op == "call_module":
        return type(gm.get_submodule(n.target)).__name__
    if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload):
        return n.target.overloadpacket.__name__
    if n.op == "call_function":
        return getattr(n.target, "__name__", None)
    return None


@pytest.mark.slow
def test_rewritten_exported_encoder_has_fake_values_and_exports_again(encoder, encoder_program):
    result = rewrite(encoder_program.module(), ENCODER_RULES)
    created = [n for n in result.module.graph.nodes if "fxrewrite_rule" in n.meta]
    assert {n.meta["fxrewrite_rule"] for n in created} == {"feed_forward", "residual_layer_norm"}
    assert_aten_nodes_with_fake_values(result.module, created, SRC)
    again = torch.export.export(result.module, (SRC,))
    with torch.no_grad():
        torch.testing.assert_close(again.module()(SRC), encoder(SRC), rtol=1e-4, atol=1e-5)
    assert_rewrite_sound(encoder, result, SRC, rtol=1e-4, atol=1e-5)


def test_dropout_rules_leave_a_training_encoder_alone_at_both_levels():
    encoder = make_encoder().train()
    dropout_rules = RuleSet([ENCODER_RULES["eval_dropout_module"], ENCODER_RULES["eval_dropout"]])
    traced = rewrite(trace_encoder(encoder), dropout_rules)
    assert traced.report.applied == {"eval_dropout_module": 0, "eval_dropout": 0}
    assert traced.report.rejected["eval_dropout_module"] == 6  # the guard saw module.training
    exported = rewrite(torch.export.export(encoder, (SRC,)).module(), dropout_rules)
    assert exported.report.applied == {"eval_dropout_module": 0, "eval_dropout": 0}  # aten.dropout(x, 0.1, True)
    dropouts = [n for n in exported.module.graph.nodes if n.target is torch.ops.aten.dropout.default]
    assert len(dropouts) == 6 and all(n.args[2] is True for n in dropouts)


# -- gaps found while writing these tests, now fixed ---------------------------------------------


def test_functional_layer_norm_rule_matches_exported_graph():
    class Norm(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(4)

        def forward(self, x):
            return self.norm(x)

    def pattern(x, w, b):
        return F.layer_norm(x, [4], w, b, 1e-5)

    rule = Rule.from_functions(pattern, lambda x, w, b: F.layer_norm(x, [4], w, b, 1e-5) * 1.0, name="ln")
    assert len(list(find_matches(graph_at("export.module", Norm(), (torch.randn(2, 4),)), rule))) == 1


def test_scalar_argument_in_exported_replacement_picks_the_scalar_overload():
    rule = Rule.from_functions(lambda x: x * x, lambda x: x.pow(2), name="square")
    model, inputs = Wrap(lambda a: torch.relu(a * a)), (torch.randn(3),)
    result = rewrite(graph_at("export.module", model, inputs), rule)
    assert_rewritten("export.module", result, model, inputs)


def test_reshape_to_a_shape_in_exported_replacement():
    rule = Rule.from_functions(lambda x, y: x + y.flatten(), lambda x, y: x + y.reshape(x.shape), name="reshape")
    model, inputs = Wrap(lambda a, b: torch.relu(a + b.flatten())), (torch.randn(6), torch.randn(2, 3))
    result = rewrite(graph_at("export.module", model, inputs), rule)
    assert_rewritten("export.module", result, model, inputs)


def test_rewrite_accepts_an_exported_program():
    model, inputs = Wrap(gated), (torch.randn(3, 4), torch.randn(3, 4))
    result = rewrite(torch.export.export(model, inputs), SILU)
    assert result.report.applied == {"silu": 1}
    assert_rewrite_sound(model, result, *inputs)
