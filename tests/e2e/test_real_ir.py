"""Rules written once at the torch level, on the graphs PyTorch actually rewrites: torch.export
graphs (check nodes, sizes folded to constants, dtype casts as ``aten.to``/``_to_copy``), what
``torch.compile`` lowers to (``prims.convert_element_type``), and symbolic traces given example
inputs; and replacements that read the matched values' dtypes and shapes (issue 10, parts 1-2).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
from _helpers import assert_rewrite_sound

from fxrewrite import RewriteError, Rule, explain, rewrite


class Wrap(nn.Module):
    """A function of tensors as a module torch.export can take (its forward is the function)."""

    def __init__(self, fn):
        super().__init__()
        self.forward = fn


def at_level(level: str, fn, inputs: tuple):
    """``fn`` as the rewrite target of ``level``: traced, exported (the program), or exported then
    unlifted (``.module()``)."""
    if level == "traced":
        return fx.symbolic_trace(fn)
    program = torch.export.export(Wrap(fn), inputs)
    return program if level == "exported" else program.module()


def assert_same(result, fn, inputs, **tolerance) -> None:
    """The rewrite of ``fn`` (at any level) lints and computes every output ``fn`` computes."""
    assert_rewrite_sound(fn, result, *inputs, **tolerance)


LEVELS = ("traced", "exported", "unlifted")


# ---- 1. matching through export noise -------------------------------------------------------------------------------

def relu_then_to(x):
    return torch.relu(x).to(torch.float64)


TO_FIRST = Rule.from_functions(lambda x: torch.relu(x).to(torch.float64), lambda x: torch.relu(x.to(torch.float64)),
                               name="to_first")


@pytest.mark.parametrize("level", LEVELS)
def test_a_match_absorbs_the_checks_export_adds_on_its_inner_values(level):
    inputs = (torch.randn(3, 4),)
    target = at_level(level, relu_then_to, inputs)
    result = rewrite(target, TO_FIRST)
    assert result.report.applied["to_first"] == 1
    assert_same(result, relu_then_to, inputs)
    remaining = [n for n in result.module.graph.nodes if n.target is torch.ops.aten._assert_tensor_metadata.default]
    assert all(a.op == "placeholder" for n in remaining for a in n.all_input_nodes)  # only checks of the inputs stay


def attention(q, k, v):
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), -1) @ v


SDPA = Rule.from_functions(attention, lambda q, k, v: F.scaled_dot_product_attention(q, k, v), name="sdpa")


@pytest.mark.parametrize("level", LEVELS)
def test_a_pattern_reading_sizes_matches_where_export_folded_them_to_constants(level):
    inputs = tuple(torch.randn(2, 3, 5, 8) for _ in range(3))
    result = rewrite(at_level(level, attention, inputs), SDPA)
    assert result.report.applied["sdpa"] == 1
    assert "scaled_dot_product_attention" in result.code
    assert_same(result, attention, inputs)


def test_a_folded_size_that_differs_from_the_pattern_is_a_miss_naming_both_values():
    def other_scale(q, k, v):  # scales by sqrt(16) where the head dimension is 8
        return torch.softmax(q @ k.transpose(-2, -1) / 4.0, -1) @ v

    inputs = tuple(torch.randn(2, 3, 5, 8) for _ in range(3))
    program = torch.export.export(Wrap(other_scale), inputs)
    result = rewrite(program, SDPA)
    assert result.report.applied["sdpa"] == 0
    assert_rewrite_sound(other_scale, result, *inputs)
    text = str(explain(program, SDPA))
    assert "4.0" in text and "2.828" in text


def test_a_folded_size_in_a_graph_without_metadata_is_a_miss_saying_what_is_needed():
    inputs = tuple(torch.randn(2, 3, 5, 8) for _ in range(3))
    gm = at_level("exported", attention, inputs).module()
    for node in gm.graph.nodes:
        node.meta.pop("val", None)
        node.meta.pop("tensor_meta", None)
    result = rewrite(gm, SDPA)
    assert result.report.applied["sdpa"] == 0
    assert_rewrite_sound(attention, result, *inputs)
    assert "example_inputs=" in str(explain(gm, SDPA))


def test_a_variable_only_inside_a_folded_size_binds_a_matched_tensor_with_that_size():
    def pattern(q, k, v, t):
        return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(t.size(-1)), -1) @ v

    def replacement(q, k, v, t):
        return F.scaled_dot_product_attention(q, k, v, scale=1.0 / math.sqrt(t.size(-1)))

    rule = Rule.from_functions(pattern, replacement, name="sdpa_t")
    inputs = tuple(torch.randn(2, 3, 5, 8) for _ in range(3))
    result = rewrite(torch.export.export(Wrap(attention), inputs), rule)
    assert result.report.applied["sdpa_t"] == 1
    assert_same(result, attention, inputs)


CONVERSIONS = {
    ".float()": lambda x: torch.relu(x.half().float()),
    ".to(dtype)": lambda x: torch.relu(x.half().to(torch.float32)),
    ".type(dtype)": lambda x: torch.relu(x.half().type(torch.float32)),
    ".to(other.dtype)": lambda x: torch.relu(x.half().to(x.dtype)),
    ".type(other.dtype)": lambda x: torch.relu(x.half().type(x.dtype)),
}


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("spelling", sorted(CONVERSIONS))
def test_every_spelling_of_a_dtype_conversion_binds_a_dtype_capture(spelling, level):
    def pattern(x, d: torch.dtype):
        return torch.relu(x.to(d))

    def replacement(x, d: torch.dtype):
        return torch.clamp_min(x, 0).to(d)

    fn = CONVERSIONS[spelling]
    inputs = (torch.randn(4, 3),)
    # a traced graph computes other.dtype at run time: the capture binds it when the graph knows it
    example_inputs = inputs if level == "traced" and "other" in spelling else None
    result = rewrite(at_level(level, fn, inputs), Rule.from_functions(pattern, replacement, name="r"),
                     example_inputs=example_inputs)
    assert result.report.applied["r"] == 1
    assert_same(result, fn, inputs)


def test_a_dtype_that_differs_is_a_miss_naming_the_argument_and_both_values():
    rule = Rule.from_functions(lambda x: torch.relu(x.to(torch.float16)), lambda x: torch.relu(x).half(), name="r")
    program = torch.export.export(Wrap(lambda x: torch.relu(x.to(torch.float64))), (torch.randn(3),))
    text = str(explain(program, rule))
    assert "argument 'dtype' differs: pattern has torch.float16, graph has torch.float64" in text


def test_conversions_lowered_by_torch_compile_are_the_same_op():
    graph = fx.Graph()
    x = graph.placeholder("x")
    converted = graph.call_function(torch.ops.prims.convert_element_type.default, (x, torch.float64))
    graph.output(graph.call_function(torch.ops.aten.relu.default, (converted,)))
    gm = fx.GraphModule(nn.Module(), graph)
    rule = Rule.from_functions(lambda x: torch.relu(x.double()), lambda x: torch.relu(x).double(), name="r")
    result = rewrite(gm, rule)
    assert result.report.applied["r"] == 1
    assert_rewrite_sound(lambda x: torch.relu(x.double()), result, torch.randn(5))


# ---- 2. replacements see the match ---------------------------------------------------------------------------------

def branching_replacement(x):
    if x.dtype == torch.float32 and x.shape[-1] % 8 == 0:
        return torch.relu(x) * 2
    return torch.relu(x) + torch.relu(x)


BRANCHING = Rule.from_functions(lambda x: torch.relu(x) + torch.relu(x), branching_replacement, name="branching")


def doubled_relu(x):
    return torch.relu(x) + torch.relu(x)


@pytest.mark.parametrize("width, mul", [(16, True), (5, False)])
@pytest.mark.parametrize("level", ("exported", "unlifted", "traced+example_inputs"))
def test_a_replacement_branches_on_the_matched_dtype_and_shape(level, width, mul):
    inputs = (torch.randn(3, width),)
    if level == "traced+example_inputs":
        result = rewrite(at_level("traced", doubled_relu, inputs), BRANCHING, example_inputs=inputs)
    else:
        result = rewrite(at_level(level, doubled_relu, inputs), BRANCHING)
    assert result.report.applied["branching"] == 1
    assert ("mul" in result.code) is mul
    assert_same(result, doubled_relu, inputs)


def test_without_metadata_a_branching_replacement_says_to_pass_example_inputs():
    with pytest.raises(RewriteError, match="example_inputs=") as info:
        rewrite(doubled_relu, BRANCHING)
    assert "rule 'branching'" in str(info.value) and "The graph was left as it was" in str(info.value)


def test_a_replacement_reads_every_promised_property_concretely():
    seen = {}

    def replacement(x):
        seen.update(dtype=x.dtype, shape=x.shape, size=x.size(), size1=x.size(1), dim=x.dim(), device=x.device,
                    floating=x.is_floating_point(), numel=x.numel())
        return torch.relu(x) * 2

    rule = Rule.from_functions(lambda x: torch.relu(x) + torch.relu(x), replacement, name="r")
    inputs = (torch.randn(3, 5),)
    result = rewrite(torch.export.export(Wrap(doubled_relu), inputs), rule)
    assert seen == dict(dtype=torch.float32, shape=torch.Size([3, 5]), size=torch.Size([3, 5]), size1=5, dim=2,
                        device=torch.device("cpu"), floating=True, numel=15)
    assert_rewrite_sound(doubled_relu, result, *inputs)


def test_a_shape_read_in_a_replacement_on_an_exported_graph_leaves_no_python_nodes():
    def pattern(x, w, b):
        return F.layer_norm(x, (x.shape[-1],), w, b)

    def replacement(x, w, b):
        return F.layer_norm(x, x.shape[-1:], w, b, eps=1e-5)

    rule = Rule.from_functions(pattern, replacement, name="ln")
    inputs = (torch.randn(2, 6), torch.randn(6), torch.randn(6))
    program = torch.export.export(Wrap(lambda x, w, b: F.layer_norm(x, (6,), w, b)), inputs)
    result = rewrite(program, rule)
    assert result.report.applied["ln"] == 1
    assert all(isinstance(n.target, torch._ops.OpOverload) for n in result.module.graph.nodes
               if n.op == "call_function" and n.meta.get("fxrewrite_rule") == "ln")
    assert_same(result, lambda x, w, b: F.layer_norm(x, (6,), w, b), inputs)


@pytest.mark.parametrize("level", LEVELS)
def test_a_multi_output_pattern_is_replaced_by_one_call_returning_several_tensors(level):
    def pattern(x):
        return x.select(0, 0), x.select(0, 1)

    def replacement(x):  # one call, a tuple of results: indexed for the pattern's outputs
        return x.unbind(0)

    def fn(x):
        return x.select(0, 0) + x.select(0, 1) * 2

    inputs = (torch.randn(2, 4),)
    result = rewrite(at_level(level, fn, inputs), Rule.from_functions(pattern, replacement, name="r"))
    assert result.report.applied["r"] == 1
    assert_same(result, fn, inputs)


def test_a_tuple_result_of_the_wrong_length_is_refused_with_the_counts():
    def pattern(x):
        return x.select(0, 0), x.select(0, 1)

    rule = Rule.from_functions(pattern, lambda x: x.unbind(0), name="r")
    inputs = (torch.randn(3, 4),)  # unbind gives three tensors here
    with pytest.raises(RewriteError, match="the pattern has 2 outputs but the replacement returned one call with 3"):
        rewrite(torch.export.export(Wrap(lambda x: x.select(0, 0) - x.select(0, 1)), inputs), rule)


def test_values_and_indices_are_replaced_by_one_topk_call():
    def pattern(x):
        top = torch.max(x, -1, True)
        return top[0], top[1]

    def replacement(x):
        return torch.topk(x, 1, -1)

    def fn(x):
        top = torch.max(x, -1, True)
        return top[0] * top[1]

    inputs = (torch.randn(3, 5),)
    result = rewrite(torch.export.export(Wrap(fn), inputs), Rule.from_functions(pattern, replacement, name="r"))
    assert result.report.applied["r"] == 1
    assert "topk" in result.code
    assert_same(result, fn, inputs)


# ---- the shipped library on exported graphs ------------------------------------------------------------------------

@pytest.mark.slow
def test_most_shipped_rules_match_the_export_of_their_own_case():
    """Each shipped rule's test case (tests/e2e/test_stdlib.py), exported, is rewritten by that rule.
    Rules whose pattern calls a module (conv_bn_fold, ...) cannot match an exported graph, where
    modules are inlined, and a few patterns are already rewritten by torch.export itself."""
    from test_stdlib import CASES, LIBRARY  # tests/e2e is on sys.path (tests/conftest.py)

    fired = []
    for name, case in sorted(CASES.items()):
        model = case.model()
        model = model if isinstance(model, nn.Module) else Wrap(model)
        inputs = case.inputs()
        program = torch.export.export(model.eval(), inputs)
        result = rewrite(program, LIBRARY[name])
        if result.report.applied[name]:
            assert_rewrite_sound(program.module(), result, *inputs, **(LIBRARY[name].tolerance or {}))
            fired.append(name)
    assert len(fired) >= 120, f"{len(fired)} of {len(CASES)}: {sorted(set(CASES) - set(fired))}"


# ---- one rule, three IRs: Hugging Face spellings under trace, export and torch.compile --------------


def hf_style_attention(q, k, v, mask):
    """How transformers models spell attention: positive transpose dims, an index that inserts the
    query dim into the mask, a float32 softmax and a cast back, both no-ops in float32."""
    scores = torch.matmul(q, k.transpose(2, 3)) * 0.25 + mask[:, :, None]
    weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(weights, v)


def _plain_attention(q, k, v, mask, s: float):
    return torch.softmax(q @ k.transpose(-2, -1) * s + mask.unsqueeze(-2), -1) @ v


def _sdpa(q, k, v, mask, s: float):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.unsqueeze(-2), scale=s)


PLAIN_ATTENTION = Rule.from_functions(_plain_attention, _sdpa, name="plain_attention")
HF_INPUTS = (torch.randn(2, 4, 5, 8), torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8), torch.randn(2, 1, 6))


@pytest.mark.parametrize("level", ["traced", "exported"])
def test_a_plainly_written_rule_fires_on_hf_spellings(level):
    if level == "traced":
        result = rewrite(hf_style_attention, PLAIN_ATTENTION, example_inputs=HF_INPUTS)
    else:
        result = rewrite(torch.export.export(Wrap(hf_style_attention), HF_INPUTS), PLAIN_ATTENTION)
    assert result.report.applied["plain_attention"] == 1, result.report.reasons["plain_attention"]
    assert "scaled_dot_product_attention" in result.code and "softmax" not in result.code
    assert_same(result, hf_style_attention, HF_INPUTS)


@pytest.mark.slow
def test_a_plainly_written_rule_fires_on_hf_spellings_in_torch_compiles_pre_grad_graph():
    from fxrewrite import inductor_pass
    from fxrewrite.inductor import compile_options

    pass_ = inductor_pass(PLAIN_ATTENTION, stage="pre_grad")
    torch._dynamo.reset()
    try:
        compiled = torch.compile(hf_style_attention, options={**compile_options(pass_), "fx_graph_cache": False})
        torch.testing.assert_close(compiled(*HF_INPUTS), hf_style_attention(*HF_INPUTS))
    finally:
        torch._dynamo.reset()
    assert pass_.report.applied == {"plain_attention": 1}
