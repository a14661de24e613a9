"""rewrite(): semantics of matching, replacing and the fixed-point driver, checked by numbers."""

from __future__ import annotations

import copy
import importlib
import itertools
import math
import operator
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.fx as fx
from _helpers import (
    StatefulNet,
    assert_consistent,
    assert_rewrite_sound,
    assert_same_state,
    counting_calls,
    dangling_attribute_rule,
    graph_state,
    module_state,
    neg_neg,
    reordering_rule,
    standard_rules,
    traced_net,
)

from fxrewrite import DidNotConverge, FxRewriteError, NotEquivalent, RewriteError, Rule, RuleSet, rewrite


def assert_rewritten(original, result, *inputs):
    """The rewritten module lints and computes what the original computes."""
    result.module.graph.lint()
    torch.testing.assert_close(result.module(*inputs), original(*inputs))


def count(gm: fx.GraphModule, target) -> int:
    return sum(1 for n in gm.graph.nodes if n.target is target or n.target == target)


def rule(pattern, replacement, **kw):
    return Rule.from_functions(pattern, replacement, **kw)


RELU_RELU = rule(lambda x: torch.relu(torch.relu(x)), lambda x: torch.relu(x), name="relu_relu")
NEG_NEG = rule(lambda x: torch.neg(torch.neg(x)), lambda x: x, name="neg_neg")


class StackedRelu(torch.nn.Module):
    def forward(self, x):
        for _ in range(5):
            x = torch.relu(x)
        return x


def test_five_stacked_relu_become_one_in_one_call():
    model, x = StackedRelu(), torch.randn(8)
    result = rewrite(model, RELU_RELU)
    assert count(result.module, torch.relu) == 1
    assert result.report.applied["relu_relu"] == 4
    assert_rewritten(model, result, x)


def test_result_code_is_the_regenerated_forward_of_the_rewritten_graph():
    result = rewrite(StackedRelu(), RELU_RELU)
    assert result.code.count("torch.relu") == 1
    regenerated = fx.GraphModule(result.module, result.module.graph).code  # from the graph itself
    assert result.code == regenerated
    assert_rewrite_sound(StackedRelu(), result, torch.randn(3))


def test_variables_bind_non_injectively():
    double = rule(lambda a, b: torch.relu(a + b), lambda a, b: torch.sigmoid(a - b), name="marker")
    f = lambda x: torch.relu(x + x)  # noqa: E731
    result = rewrite(f, double)
    assert result.report.applied["marker"] == 1
    result.module.graph.lint()
    x = torch.randn(5)
    torch.testing.assert_close(result.module(x), torch.sigmoid(x - x))


def test_same_variable_must_bind_the_same_value():
    square = rule(lambda x: x * x, lambda x: torch.square(x), name="square")
    result = rewrite(lambda a, b: a * b + a * a, square)
    assert result.report.applied["square"] == 1
    a, b = torch.randn(4), torch.randn(4)
    assert_rewrite_sound(lambda a, b: a * b + a * a, result, a, b)
    assert "torch.square(a)" in result.code


def test_inner_node_used_outside_the_match_blocks_the_rewrite():
    def f(x):
        inner = torch.neg(x)
        return torch.neg(inner) + inner

    result = rewrite(f, NEG_NEG)
    assert result.report.applied["neg_neg"] == 0
    assert_rewritten(f, result, torch.randn(3))


def test_variable_may_not_bind_a_node_the_match_erases():
    # relu(a) + b matched on r + r with r = relu(x) would bind b to r, which the rewrite erases.
    fused = rule(lambda a, b: torch.relu(a) + b, lambda a, b: torch.add(torch.relu(a), b), name="fused")
    f = lambda x: (lambda r: r + r)(torch.relu(x))  # noqa: E731
    result = rewrite(f, fused)
    assert result.report.applied["fused"] == 0
    assert_rewritten(f, result, torch.randn(3))


def test_unannotated_variable_never_binds_a_python_literal():
    addcmul = rule(lambda x, y, z: x * y + z, lambda x, y, z: torch.addcmul(z, x, y), name="addcmul")
    f = lambda a, c: a * 0.25 + c  # noqa: E731
    result = rewrite(f, addcmul)
    assert result.report.applied["addcmul"] == 0
    g = lambda a, b, c: a * b + c  # noqa: E731
    result = rewrite(g, addcmul)
    assert result.report.applied["addcmul"] == 1
    a, b, c = torch.randn(3), torch.randn(3), torch.randn(3)
    assert_rewritten(g, result, a, b, c)


def test_typed_literal_capture_hands_the_value_to_the_replacement():
    seen = []

    def replacement(x, s: float):
        seen.append(s)
        return torch.mul(x, s * 2) / 2

    scale = rule(lambda x, s: x * s, replacement, name="scale")
    typed = rule(lambda x, s: torch.sigmoid(x * s), lambda x, s: torch.sigmoid(torch.mul(x, s)), name="typed")
    assert scale.compiled.params[1].kind == "tensor"

    def typed_pattern(x, s: float):
        return torch.sigmoid(x * s)

    def typed_replacement(x, s: float):
        seen.append(s)
        return torch.sigmoid(torch.div(x, 1 / s))

    typed = rule(typed_pattern, typed_replacement, name="typed")
    f = lambda a: torch.sigmoid(a * 0.5)  # noqa: E731
    result = rewrite(f, typed)
    assert result.report.applied["typed"] == 1 and seen == [0.5]
    assert "torch.div(a, 2.0)" in result.code
    assert_rewritten(f, result, torch.randn(4))


def test_typed_literal_capture_checks_the_type():
    def pattern(x, dim: int):
        return torch.softmax(x, dim)

    soft = rule(pattern, lambda x, dim: torch.exp(torch.log_softmax(x, dim)), name="soft")
    result = rewrite(lambda a: torch.softmax(a, -1), soft)
    assert result.report.applied["soft"] == 1
    assert_rewrite_sound(lambda a: torch.softmax(a, -1), result, torch.randn(2, 3))


class MyLinear(torch.nn.Linear):
    pass


class TwoLinears(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(4, 4)
        self.second = MyLinear(4, 4)
        self.other = torch.nn.Conv1d(1, 1, 1)

    def forward(self, x):
        return torch.relu(self.first(x)) + torch.relu(self.second(x))


class LinearLeafTracer(fx.Tracer):
    """symbolic_trace inlines modules defined outside torch.nn; keep every Linear a leaf."""

    def is_leaf_module(self, m, qualname):
        return isinstance(m, torch.nn.Linear) or super().is_leaf_module(m, qualname)


def test_module_capture_matches_by_isinstance_and_hands_over_the_module():
    captured = []

    def pattern(x, lin: torch.nn.Linear):
        return torch.relu(lin(x))

    def replacement(x, lin: torch.nn.Linear):
        captured.append(lin)
        return torch.clamp_min(torch.nn.functional.linear(x, lin.weight, lin.bias), 0)

    model = TwoLinears()
    gm = fx.GraphModule(model, LinearLeafTracer().trace(model))
    result = rewrite(gm, rule(pattern, replacement, name="linear_relu"))
    assert result.report.applied["linear_relu"] == 2
    assert captured == [model.first, model.second]
    assert "clamp_min" in result.code
    assert_rewritten(model, result, torch.randn(2, 4))


def test_module_capture_does_not_match_other_module_classes():
    def pattern(x, conv: torch.nn.Conv2d):
        return torch.relu(conv(x))

    model = TwoLinears()
    result = rewrite(model, rule(pattern, lambda x, conv: conv(x), name="conv_relu"))
    assert result.report.applied["conv_relu"] == 0
    assert_rewrite_sound(model, result, torch.randn(2, 4))


def test_module_built_in_replacement_is_registered_under_a_fresh_name():
    def pattern(x, lin: torch.nn.Linear):
        return torch.relu(lin(x))

    def replacement(x, lin: torch.nn.Linear):
        fused = torch.nn.Sequential(copy.deepcopy(lin), torch.nn.ReLU())
        return fused(x)

    model = TwoLinears()
    gm = fx.GraphModule(model, LinearLeafTracer().trace(model))
    result = rewrite(gm, rule(pattern, replacement, name="seq"))
    names = [n.target for n in result.module.graph.nodes if n.op == "call_module"]
    assert names == ["seq_sequential_0", "seq_sequential_1"]
    assert isinstance(result.module.seq_sequential_0, torch.nn.Sequential)
    assert_rewritten(model, result, torch.randn(2, 4))


def test_tensor_built_in_replacement_becomes_a_buffer():
    def replacement(x):
        return x + torch.zeros(3)

    result = rewrite(lambda a: torch.neg(torch.neg(a)), rule(lambda x: torch.neg(torch.neg(x)), replacement,
                                                              name="plus_zero"))
    buffers = dict(result.module.named_buffers())
    assert list(buffers) == ["plus_zero_const_0"]
    assert_rewrite_sound(lambda a: a, result, torch.randn(3))


def test_existing_module_keeps_its_path_when_called_in_the_replacement():
    def pattern(x, lin: torch.nn.Linear):
        return torch.relu(torch.relu(lin(x)))

    def replacement(x, lin: torch.nn.Linear):
        return torch.relu(lin(x))

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)

        def forward(self, x):
            return torch.relu(torch.relu(self.lin(x)))

    model = M()
    result = rewrite(model, rule(pattern, replacement, name="keep"))
    assert [n.target for n in result.module.graph.nodes if n.op == "call_module"] == ["lin"]
    assert_rewritten(model, result, torch.randn(2, 3))


def test_multi_output_pattern_rewrites_both_outputs():
    def pattern(x):
        return torch.sin(x), torch.cos(x)

    def replacement(x):
        both = torch.sin(torch.stack([x, x + math.pi / 2]))
        return both[0], both[1]

    def f(a, b):
        s, c = torch.sin(a), torch.cos(a)
        return s * b + c

    result = rewrite(f, rule(pattern, replacement, name="sincos"))
    assert result.report.applied["sincos"] == 1
    assert "torch.stack" in result.code
    assert_rewritten(f, result, torch.randn(3), torch.randn(3))


def test_multi_output_match_that_would_create_a_cycle_is_refused():
    def pattern(x):
        return torch.sin(x), torch.cos(x)

    def f(a):
        s = torch.sin(a)
        c = torch.cos(a)
        return s, c

    def g(a):
        s = torch.sin(a)
        # cos of the same input, but computed after a value that depends on sin: fusing both
        # into one block is fine; what must never happen is an input depending on an output.
        return s, torch.cos(a)

    fused = rule(pattern, lambda x: (torch.sin(x) * 1, torch.sin(x + math.pi / 2)), name="fused")
    for fn in (f, g):
        result = rewrite(fn, fused)
        assert_rewritten(fn, result, torch.randn(3))

    # a genuine cycle: pattern (relu(x), y + relu(x))? the second output's input y depends on
    # the first output through the graph.
    def pattern2(x, y):
        r = torch.relu(x)
        return r, torch.add(y, torch.sigmoid(x))

    def h(a):
        r = torch.relu(a)
        y = torch.tanh(r)  # input y of the match depends on output r of the match
        return r, torch.add(y, torch.sigmoid(a))

    cyc = rule(pattern2, lambda x, y: (torch.relu(x), torch.add(y, torch.sigmoid(x))), name="cyc")
    result = rewrite(h, cyc)
    assert result.report.applied["cyc"] == 0
    assert_rewritten(h, result, torch.randn(3))


def test_commutative_operands_match_in_either_order():
    fused = rule(lambda x, y: torch.relu(x) + y, lambda x, y: torch.sub(y, -torch.relu(x)), name="relu_add")
    f = lambda a, b: b + torch.relu(a)  # noqa: E731
    result = rewrite(f, fused)
    assert result.report.applied["relu_add"] == 1
    assert_rewritten(f, result, torch.randn(3), torch.randn(3))


def test_nested_commutative_operands_match():
    pattern = lambda a, b, c: (a + b) * c  # noqa: E731
    r = rule(pattern, lambda a, b, c: torch.addcmul(a * c, b, c), name="nested")
    f = lambda x, y, z: z * (torch.relu(y) + x)  # noqa: E731
    result = rewrite(f, r)
    assert result.report.applied["nested"] == 1
    assert_rewritten(f, result, torch.randn(3), torch.randn(3), torch.randn(3))


def test_non_commutative_operands_do_not_swap():
    r = rule(lambda x, y: torch.relu(x) - y, lambda x, y: torch.sub(torch.relu(x), y), name="sub")
    f = lambda a, b: b - torch.relu(a)  # noqa: E731
    result = rewrite(f, r)
    assert result.report.applied["sub"] == 0
    assert_rewrite_sound(f, result, torch.randn(3), torch.randn(3))


def test_higher_priority_rule_wins_where_both_could_fire():
    small = rule(lambda x: torch.relu(torch.relu(x)), lambda x: torch.relu(x), name="small")
    big = rule(lambda x: torch.sigmoid(torch.relu(torch.relu(x))), lambda x: torch.tanh(x), name="big", priority=5)
    f = lambda a: torch.sigmoid(torch.relu(torch.relu(a)))  # noqa: E731
    result = rewrite(f, [small, big])
    assert result.report.applied == {"small": 0, "big": 1}
    assert_rewrite_sound(torch.tanh, result, torch.randn(4))  # what the (inexact) rule big computes
    # with equal priority the earlier anchor in graph order fires first
    result = rewrite(f, [small, rule(big.pattern, big.replacement, name="big0")])
    assert result.report.applied == {"small": 1, "big0": 0}


def test_rule_after_rewrite_fires_on_the_new_nodes():
    to_neg = rule(lambda x: -torch.abs(torch.abs(x)), lambda x: torch.neg(torch.neg(torch.neg(torch.abs(x)))),
                  name="expand")
    f = lambda a: -torch.abs(torch.abs(a))  # noqa: E731
    result = rewrite(f, [to_neg, NEG_NEG])
    assert result.report.applied == {"expand": 1, "neg_neg": 1}
    assert_rewritten(f, result, torch.randn(4))


def test_rule_and_its_inverse_raise_did_not_converge_naming_both():
    forward = rule(lambda x: torch.neg(x), lambda x: x * -1.0, name="neg_to_mul")
    backward = rule(lambda x: x * -1.0, lambda x: torch.neg(x), name="mul_to_neg")
    with pytest.raises(DidNotConverge) as info:
        rewrite(lambda a: torch.neg(a), [forward, backward])
    message = str(info.value)
    assert "'neg_to_mul'" in message and "'mul_to_neg'" in message and "max_rewrites" in message


def test_max_rewrites_bounds_the_number_of_rewrites():
    with pytest.raises(DidNotConverge, match="within 2 rewrites"):
        rewrite(StackedRelu(), RELU_RELU, max_rewrites=2)
    result = rewrite(StackedRelu(), RELU_RELU, max_rewrites=4)
    assert result.report.applied["relu_relu"] == 4
    assert_rewrite_sound(StackedRelu(), result, torch.randn(3))


def test_caller_graph_module_is_not_modified():
    gm = fx.symbolic_trace(StackedRelu())
    code, nodes = gm.code, len(gm.graph.nodes)
    result = rewrite(gm, RELU_RELU)
    assert gm.code == code and len(gm.graph.nodes) == nodes
    assert result.module is not gm and count(result.module, torch.relu) == 1
    assert_rewrite_sound(gm, result, torch.randn(3))


def test_inplace_rewrites_the_graph_module_itself():
    gm = fx.symbolic_trace(StackedRelu())
    result = rewrite(gm, RELU_RELU, inplace=True)
    assert result.module is gm and count(gm, torch.relu) == 1 and gm.code.count("torch.relu(") == 1
    assert_rewrite_sound(StackedRelu(), result, torch.randn(3))


def test_caller_module_parameters_are_untouched_by_folding_replacements():
    model = TwoLinears()
    gm = fx.GraphModule(model, LinearLeafTracer().trace(model))
    before = {k: v.clone() for k, v in model.state_dict().items()}

    def pattern(x, lin: torch.nn.Linear):
        return torch.relu(lin(x))

    def replacement(x, lin: torch.nn.Linear):
        doubled = copy.deepcopy(lin)
        with torch.no_grad():
            doubled.weight.mul_(2)
        return torch.relu(torch.nn.functional.linear(x / 2, doubled.weight, doubled.bias))

    result = rewrite(gm, rule(pattern, replacement, name="fold"))
    assert result.report.applied["fold"] == 2
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, before[k])
    assert_rewritten(model, result, torch.randn(2, 4))


def test_function_target_is_traced():
    result = rewrite(lambda a: torch.neg(torch.neg(a)) * 2, NEG_NEG)
    assert_rewrite_sound(lambda a: a * 2, result, torch.randn(2))


def test_new_nodes_carry_provenance_shown_by_print_readable():
    result = rewrite(StackedRelu(), RELU_RELU)
    new = [n for n in result.module.graph.nodes if n.meta.get("fxrewrite_rule")]
    assert new and all("relu_relu" in n.meta["stack_trace"] for n in new)
    assert "test_rewrite.py" in new[0].meta["stack_trace"]
    readable = result.module.print_readable(print_output=False)
    assert "in relu_relu, code: fxrewrite rule relu_relu" in readable
    assert_rewrite_sound(StackedRelu(), result, torch.randn(3))


def test_report_counts_attempts_and_applications():
    result = rewrite(StackedRelu(), [RELU_RELU, NEG_NEG])
    assert result.report.applied == {"relu_relu": 4, "neg_neg": 0}
    assert result.report.attempts["relu_relu"] >= 4 and result.report.attempts["neg_neg"] == 0
    text = str(result.report)
    assert "relu_relu" in text and "4 rewrite(s)" in text
    assert_rewrite_sound(StackedRelu(), result, torch.randn(3))


def test_rules_anchor_only_at_nodes_of_their_op():
    result = rewrite(lambda a: torch.relu(a) + torch.sin(a), NEG_NEG)
    assert result.report.attempts["neg_neg"] == 0
    assert_rewrite_sound(lambda a: torch.relu(a) + torch.sin(a), result, torch.randn(3))


def test_ruleset_object_is_reusable_across_rewrites():
    rs = RuleSet([RELU_RELU, NEG_NEG])
    for _ in range(2):
        result = rewrite(StackedRelu(), rs)
        assert result.report.applied["relu_relu"] == 4
        assert_rewrite_sound(StackedRelu(), result, torch.randn(3))


def test_operator_and_torch_function_spellings_are_one_op():
    r = rule(lambda x, y: torch.sub(x, y), lambda x, y: x + (-y), name="sub")
    result = rewrite(lambda a, b: operator.sub(a, b) * torch.subtract(b, a), r)
    assert result.report.applied["sub"] == 2
    assert_rewritten(lambda a, b: (a - b) * (b - a), result, torch.randn(3), torch.randn(3))


def test_tensor_variable_does_not_bind_a_python_int_node_when_metadata_says_so():
    plus = rule(lambda x, y: x + y, lambda x, y: torch.sub(x, -y), name="plus")

    def f(a):
        n = a.size(0) + a.size(1)  # int arithmetic on symbolic sizes: not a tensor add
        return a * n

    result = rewrite(f, plus, example_inputs=(torch.randn(2, 3),))
    assert result.report.applied["plus"] == 0
    assert_rewritten(f, result, torch.randn(2, 3))


def test_progress_callback_reports_rewrites_and_ends_with_nothing_queued():
    calls = []
    result = rewrite(StackedRelu(), RELU_RELU, on_progress=lambda done, queued: calls.append((done, queued)))
    assert calls[-1] == (4, 0)
    assert_rewrite_sound(StackedRelu(), result, torch.randn(3))


def _calls_to_rewrite_pairs_sharing_one_input(pairs: int) -> int:
    g = fx.Graph()
    x = g.placeholder("x")
    outs = [g.call_function(torch.neg, (g.call_function(torch.neg, (x,)),)) for _ in range(pairs)]
    total = outs[0]
    for o in outs[1:]:
        total = g.call_function(operator.add, (total, o))
    g.output(total)
    gm = fx.GraphModule(torch.nn.Module(), g)
    result, calls = counting_calls(lambda: rewrite(gm, NEG_NEG, inplace=True))
    assert result.report.applied["neg_neg"] == pairs
    torch.testing.assert_close(result.module(torch.ones(2)), torch.full((2,), float(pairs)))
    return calls


def test_many_rewrites_around_one_widely_used_value_stay_linear():
    # neg(neg(x)) pairs all reading one x: a rewrite must not revisit all of x's users. Work is
    # counted in function calls (deterministic), not seconds: 4x the pairs, about 4x the calls.
    small, large = _calls_to_rewrite_pairs_sharing_one_input(300), _calls_to_rewrite_pairs_sharing_one_input(1200)
    assert large / small < 6, (small, large)


def _calls_to_rewrite_a_chain_into_created_nodes(blocks: int) -> tuple[int, int]:
    """Function calls made by rewriting a chain of ``blocks`` ``abs(neg(.))`` blocks, each into
    three new nodes, and how often the replacement function itself ran."""
    ran = []

    def replacement(x):
        ran.append(1)
        return torch.clamp(x * 0.5 + 0.25, -4.0, 4.0)

    graph = fx.Graph()
    value = graph.placeholder("x")
    for _ in range(blocks):
        value = graph.call_function(torch.abs, (graph.call_function(torch.neg, (value,)),))
        value = graph.call_function(torch.relu, (value,))
    graph.output(value)
    gm = fx.GraphModule(torch.nn.Module(), graph)
    created = rule(lambda x: torch.abs(torch.neg(x)), replacement, name="abs_neg_created")
    result, calls = counting_calls(lambda: rewrite(gm, created))
    assert result.report.applied["abs_neg_created"] == blocks
    assert_rewrite_sound(lambda a: _created_chain(a, blocks), result, torch.randn(4) * 9)
    return calls, len(ran)


def _created_chain(a: torch.Tensor, blocks: int) -> torch.Tensor:
    for _ in range(blocks):
        a = torch.relu(torch.clamp(a * 0.5 + 0.25, -4.0, 4.0))
    return a


def test_replacements_creating_nodes_cost_linear_work_and_run_twice_however_many_matches():
    # The replacement runs twice (recorded, then confirmed); every other match replays its graph.
    # Work is counted in function calls: 4x the blocks, about 4x the calls (a per-rewrite scan of
    # the graph would make it 16x).
    _calls_to_rewrite_a_chain_into_created_nodes(20)  # warm caches and lazy imports
    (small, ran_small), (large, ran_large) = (_calls_to_rewrite_a_chain_into_created_nodes(150),
                                              _calls_to_rewrite_a_chain_into_created_nodes(600))
    assert ran_small == ran_large == 2
    assert large / small < 4.5, (small, large)


@pytest.mark.filterwarnings("ignore::fxrewrite.RuleWarning")
def test_attributes_a_rewrite_made_unused_are_dropped_from_the_copy():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("offset", torch.zeros(3))

        def forward(self, x):
            return torch.relu(x + self.offset)

    forget_zero_buffer = rule(lambda x, y: torch.relu(x + y), lambda x, y: torch.relu(x), name="forget",
                              where=lambda m: m.node("y").op == "get_attr")
    model = M()
    gm = fx.symbolic_trace(model)
    result = rewrite(gm, forget_zero_buffer)
    assert result.report.applied["forget"] == 1
    assert "offset" not in dict(result.module.named_buffers()) and "self.offset" not in result.code
    assert "offset" in dict(model.named_buffers()) and "offset" in dict(gm.named_buffers())
    assert_rewritten(model, result, torch.randn(3))


def test_check_inputs_names_the_first_rewrite_that_changes_the_result():
    wrong = rule(lambda x: torch.sigmoid(x), lambda x: torch.tanh(x), name="wrong_sigmoid")
    f = lambda a: torch.sigmoid(torch.relu(torch.relu(a)))  # noqa: E731
    with pytest.raises(NotEquivalent) as info:
        rewrite(f, [RELU_RELU, wrong], check_inputs=(torch.randn(5),))
    message = str(info.value)
    assert "rule 'wrong_sigmoid'" in message and "at graph node 'sigmoid'" in message
    assert "#2 of 2" in message  # relu_relu fired first and is innocent


def test_check_inputs_passes_sound_rewrites_and_accepts_several_calls():
    result = rewrite(StackedRelu(), RELU_RELU, check_inputs=[(torch.randn(3),), (torch.randn(2, 2),)])
    assert result.report.applied["relu_relu"] == 4
    assert_rewrite_sound(StackedRelu(), result, torch.randn(3))


@pytest.mark.parametrize("name, value, fragment", [
    ("check_inputs", ("str",), "check_inputs= takes a tuple of forward() arguments"),
    ("check_inputs", torch.ones(2), "check_inputs= takes"),
    ("max_rewrites", -1, "max_rewrites= takes a number of rewrites >= 0"),
    ("max_rewrites", 2.5, "max_rewrites= takes"),
    ("inplace", "yes", "inplace= takes True or False"),
    ("example_inputs", torch.ones(2), "example_inputs= takes a tuple"),
    ("on_progress", 3, "on_progress= takes a function"),
    ("debug", "on", "debug= takes True, False or None"),
])
def test_a_bad_argument_is_an_argument_error_naming_it(name, value, fragment):
    from fxrewrite import ArgumentError

    rule = Rule.from_functions(lambda x: torch.neg(torch.neg(x)), lambda x: x, name="neg_neg")
    with pytest.raises(ArgumentError, match=re.escape(fragment)) as info:
        rewrite(lambda a: torch.neg(torch.neg(a)), rule, **{name: value})
    assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)


# ---- failing rewrites: the right error, and nothing lost ----------------------------------------------------
#
# Each scenario builds a rule set that fails at the k-th rewrite (k = 1 or 2) on StatefulNet, with the
# error type and message fragments it must produce. After the error the caller's module (and any
# GraphModule passed in) is exactly as it was; with inplace=True the module keeps the last consistent
# graph and the error says so.


def fails_at(k: int, fail: Callable[..., Any], ok: Callable[..., Any]) -> Callable[..., Any]:
    """A replacement that behaves like ``ok`` except on its k-th call, where it does ``fail``."""
    calls = itertools.count(1)

    def replacement(x):
        return fail(x) if next(calls) == k else ok(x)

    return replacement


def guard_failing_at(k: int, exc: Exception) -> Callable[..., bool]:
    calls = itertools.count(1)

    def guard(m):
        if next(calls) == k:
            raise exc
        return True

    return guard


def _raise(exc: Exception) -> Any:
    raise exc


def _register_then_raise(x):
    torch.nn.Linear(4, 4)(x)  # registers a submodule ...
    torch.sigmoid(x) * torch.ones(4)  # ... records nodes and a new buffer ...
    raise ValueError("changed my mind")

Scenario = Callable[[int], tuple[Any, dict[str, Any]]]


def _replacement_raises(k):
    return neg_neg(fails_at(k, lambda x: _raise(ValueError("boom")), lambda x: x)), {}


def _replacement_registers_module_then_raises(k):
    return neg_neg(fails_at(k, _register_then_raise, lambda x: x)), {}


def _replacement_returns_none(k):
    return neg_neg(fails_at(k, lambda x: None, lambda x: x)), {}


def _replacement_returns_a_float(k):
    return neg_neg(fails_at(k, lambda x: 1.5, lambda x: x)), {}


def _replacement_returns_a_tuple(k):
    return neg_neg(fails_at(k, lambda x: (x, x), lambda x: x)), {}


def _replacement_returns_too_few_values(k):
    def pattern(x):
        return torch.sin(x), torch.cos(x)

    calls = itertools.count(1)

    def replacement(x):
        return torch.sin(x) if next(calls) == k else (torch.sin(x), torch.cos(x))

    return Rule.from_functions(pattern, replacement, name="sincos"), {}


def _guard_raises(k):
    return neg_neg(lambda x: x, where=guard_failing_at(k, ZeroDivisionError("guard blew up"))), {}



def _rules_never_converge(k):
    to_sub = Rule.from_functions(lambda x, y: x + y, lambda x, y: x - torch.neg(y), name="add_to_sub")
    to_add = Rule.from_functions(lambda x, y: x - torch.neg(y), lambda x, y: x + y, name="sub_to_add")
    return [neg_neg(lambda x: x), to_sub, to_add], {"max_rewrites": (k - 1) * 9}


SCENARIOS: dict[str, tuple[Scenario, type[BaseException], list[str]]] = {
    "replacement raises": (_replacement_raises, RewriteError,
                           ["rule 'neg_neg'", "_helpers.py:", "graph node", "ValueError: boom",
                            "left as it was before this rewrite"]),
    "replacement registers a module then raises": (_replacement_registers_module_then_raises, RewriteError,
                                                   ["ValueError: changed my mind", "left as it was"]),
    "replacement returns None": (_replacement_returns_none, RewriteError,
                                 ["output 0 of the replacement is None (NoneType)",
                                  "but the pattern matched a tensor there"]),
    "replacement returns a float": (_replacement_returns_a_float, RewriteError,
                                    ["output 0 of the replacement is 1.5 (float)"]),
    "replacement returns a tuple for one output": (_replacement_returns_a_tuple, RewriteError,
                                                   ["output 0 of the replacement is (Proxy(", "(tuple)"]),
    "replacement returns too few values": (_replacement_returns_too_few_values, RewriteError,
                                           ["rule 'sincos'",
                                            "the pattern has 2 outputs but the replacement returned a single Proxy",
                                            "return a tuple with one value per pattern output"]),
    "guard raises": (_guard_raises, RewriteError,
                     ["rule 'neg_neg'", "guard guard", "raised ZeroDivisionError: guard blew up", "at graph node",
                      "Fix the guard; no rewrite was applied here"]),
    "rules never converge": (_rules_never_converge, DidNotConverge,
                             ["did not reach a fixed point within", "Rules that undo each other", "max_rewrites"]),
}


@pytest.mark.parametrize("scenario", SCENARIOS, ids=str)
def test_failing_rewrite_raises_its_error_with_a_useful_message(scenario):
    make, error, fragments = SCENARIOS[scenario]
    rules, kwargs = make(1)
    _, gm = traced_net()
    with pytest.raises(error) as info:
        rewrite(gm, rules, **kwargs)
    assert isinstance(info.value, FxRewriteError)
    for fragment in fragments:
        assert fragment in str(info.value), f"{fragment!r} not in {str(info.value)!r}"


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("scenario", SCENARIOS, ids=str)
def test_failing_rewrite_leaves_the_callers_graph_module_exactly_as_it_was(scenario, k):
    make, error, _ = SCENARIOS[scenario]
    rules, kwargs = make(k)
    model, gm = traced_net()
    before = graph_state(gm)
    with pytest.raises(error):
        rewrite(gm, rules, **kwargs)
    assert_same_state(before, graph_state(gm))
    assert_same_state(module_state(StatefulNet().eval()), module_state(model))


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("scenario", SCENARIOS, ids=str)
def test_failing_rewrite_leaves_the_callers_nn_module_exactly_as_it_was(scenario, k):
    make, error, _ = SCENARIOS[scenario]
    rules, kwargs = make(k)
    model = StatefulNet().eval()
    before = module_state(model)
    forward = type(model).forward
    with pytest.raises(error):
        rewrite(model, rules, **kwargs)
    assert_same_state(before, module_state(model))
    assert type(model).forward is forward and not isinstance(model, fx.GraphModule)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=str)
def test_failing_first_inplace_rewrite_leaves_the_graph_module_exactly_as_it_was(scenario):
    make, error, _ = SCENARIOS[scenario]
    rules, kwargs = make(1)
    model, gm = traced_net()
    before = graph_state(gm)
    with pytest.raises(error) as info:
        rewrite(gm, rules, inplace=True, **kwargs)
    assert_same_state(before, graph_state(gm))
    assert_consistent(gm, model)
    assert not any("keeps" in note for note in getattr(info.value, "__notes__", []))


@pytest.mark.parametrize("scenario", SCENARIOS, ids=str)
def test_failing_later_inplace_rewrite_keeps_the_last_consistent_graph_and_says_so(scenario):
    make, error, _ = SCENARIOS[scenario]
    rules, kwargs = make(2)
    model, gm = traced_net()
    with pytest.raises(error) as info:
        rewrite(gm, rules, inplace=True, **kwargs)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "inplace=True: the module keeps the" in notes and "rewrite(s) applied before this error" in notes
    assert_consistent(gm, model)
    assert gm.code != fx.symbolic_trace(model).code  # the first rewrite is kept
    assert_same_state(module_state(StatefulNet().eval()), module_state(model))


# ---- successful rewrites lose nothing either --------------------------------------------------------------


class ConvReadTwice(torch.nn.Module):
    """A conv both called and read (``self.conv.weight``): after folding, its call is gone but
    the get_attr keeps the (caller's) conv module in the rewritten copy."""

    def __init__(self) -> None:
        super().__init__()
        with torch.random.fork_rng():
            torch.manual_seed(0)
            self.conv = torch.nn.Conv2d(4, 4, 1)
            self.bn = torch.nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn(self.conv(x)) + self.conv.weight.sum()


def _inline_conv() -> Rule:
    def pattern(x, conv: torch.nn.Conv2d):
        return conv(x)

    def replacement(x, conv: torch.nn.Conv2d):
        return torch.nn.functional.conv2d(x, conv.weight.detach().clone(), conv.bias.detach().clone())

    return Rule.from_functions(pattern, replacement, name="inline_conv")


@pytest.mark.parametrize("kind", ["nn.Module", "GraphModule"])
def test_successful_rewrite_leaves_the_callers_module_exactly_as_it_was(kind):
    model = StatefulNet().eval()
    before = module_state(model)
    target = model if kind == "nn.Module" else fx.symbolic_trace(model)
    result = rewrite(target, standard_rules())
    assert result.report.rewrites >= 2  # double_neg twice (linear_bn_fold needs shapes since its guard is strict)
    assert_same_state(before, module_state(model))
    assert_consistent(result.module, model)


@pytest.mark.parametrize("rules", [standard_rules, _inline_conv], ids=["conv_bn_fold", "inline_conv"])
@pytest.mark.parametrize("kind", ["nn.Module", "GraphModule"])
def test_successful_rewrite_keeps_the_parameters_of_a_submodule_it_still_reads(kind, rules):
    model = ConvReadTwice().eval()
    x = torch.randn(1, 4, 3, 3, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(x)
    parameters = [name for name, _ in model.named_parameters()]
    result = rewrite(model if kind == "nn.Module" else fx.symbolic_trace(model), rules())
    assert result.report.rewrites == 1
    assert [name for name, _ in model.named_parameters()] == parameters
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected)
    assert_rewrite_sound(model, result, x)


def test_a_rule_that_keeps_growing_the_graph_is_stopped_by_the_budget_naming_it():
    grow = Rule.from_functions(lambda x: torch.relu(x), lambda x: torch.relu(torch.relu(x)), name="grow")
    _, gm = traced_net()
    with pytest.raises(DidNotConverge) as info:
        rewrite(gm, grow)
    message = str(info.value)
    assert "'grow' (64x)" in message and "test_rewrite.py:" in message
    assert f"within {8 * len(gm.graph.nodes) + 64} rewrites" in message
    assert isinstance(info.value, RewriteError) and isinstance(info.value, RuntimeError)


# ---- debug mode ---------------------------------------------------------------------------------------------
#
# The rules that break a graph are in tests/_helpers.py (memoizing_rule, reordering_rule,
# dangling_attribute_rule).


def _neg_neg_program() -> fx.GraphModule:
    return fx.symbolic_trace(lambda a: torch.neg(torch.neg(a)) + torch.relu(a))


def test_debug_mode_lints_after_each_rewrite(monkeypatch):
    lints = []
    original = fx.Graph.lint
    monkeypatch.setattr(fx.Graph, "lint", lambda self: lints.append(1) or original(self))
    monkeypatch.setenv("FXREWRITE_DEBUG", "1")
    result = rewrite(_neg_neg_program(), NEG_NEG)
    assert result.report.applied["neg_neg"] == 1
    with_debug = len(lints)
    lints.clear()
    monkeypatch.setenv("FXREWRITE_DEBUG", "0")
    rewrite(_neg_neg_program(), NEG_NEG)
    assert with_debug == len(lints) + 1  # one lint after the rewrite, besides the final one


def test_debug_mode_names_the_rule_after_which_lint_failed():
    _, gm = traced_net()
    before = graph_state(gm)
    with pytest.raises(RewriteError) as info:
        rewrite(gm, dangling_attribute_rule(), debug=True)
    message = str(info.value)
    assert message.startswith("debug check: the graph fails lint after rule 'dangling' (")
    assert "_helpers.py:" in message and "no_such_attribute" in message
    assert isinstance(info.value.__cause__, RuntimeError)
    assert_same_state(before, graph_state(gm))



def test_debug_mode_is_switched_on_by_the_environment(monkeypatch):
    monkeypatch.setenv("FXREWRITE_DEBUG", "1")
    _, gm = traced_net()
    with pytest.raises(RewriteError, match="debug check: the graph fails lint after rule 'dangling'"):
        rewrite(gm, dangling_attribute_rule())
    monkeypatch.setenv("FXREWRITE_DEBUG", "0")
    with pytest.raises(RewriteError, match="the rewritten graph is invalid") as info:  # caught at the end only
        rewrite(gm, dangling_attribute_rule())
    assert "debug check" not in str(info.value)


def test_debug_mode_checks_every_rewrite_of_a_clean_run():
    model, gm = traced_net()
    result = rewrite(gm, standard_rules(), debug=True)
    assert result.report.applied["double_neg"] == 2
    assert_consistent(result.module, model)


def test_graph_broken_by_a_rule_is_an_fxrewrite_error_even_without_debug_mode():
    r = dangling_attribute_rule()
    _, gm = traced_net()
    with pytest.raises(RewriteError, match=f"(?s)rewritten graph is invalid .*debug=True.*Rules applied: {r.name} "):
        rewrite(gm, r, debug=False)


@pytest.mark.parametrize("debug", [True, False], ids=["debug", "no debug"])
def test_inplace_rewrite_that_breaks_the_graph_leaves_the_last_consistent_graph(debug):
    model, gm = traced_net()
    with pytest.raises(FxRewriteError):
        rewrite(gm, reordering_rule(), inplace=True, debug=debug)
    assert_consistent(gm, model)


def test_a_detach_in_place_writes_no_value_and_refuses_nothing():
    def program(a):
        c = a * 2.0
        c.detach_()  # autograd only: the values stay
        return torch.neg(torch.neg(c)) + 1

    x = torch.randn(4)
    result = rewrite(program, neg_neg(lambda x: x))
    assert result.report.applied["neg_neg"] == 1
    assert_rewrite_sound(program, result, x)


# -- the sweep of unused submodules and its slow twin (fx's delete_all_unused_submodules) ---------

rewrite_module = importlib.import_module("fxrewrite.rewrite")  # the package's ``rewrite`` is the function


def _sweep_graph_module() -> fx.GraphModule:
    """Submodules used every way fx counts (called, read through, above and below a called one),
    unused ones at every depth, and modules listed under two names (added after the GraphModule
    is built: it copies only what its graph names)."""
    root = torch.nn.Module()
    root.used = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.ReLU()))
    root.holder = torch.nn.Module()
    root.holder.read = torch.nn.Linear(2, 2)
    graph = fx.Graph()
    x = graph.placeholder("x")
    y = graph.call_module("used", (x,))
    w = graph.get_attr("holder.read.weight")
    z = graph.call_function(torch.matmul, (y, w))
    out = graph.output(z)
    gm = fx.GraphModule(root, graph)
    gm.unused = torch.nn.Sequential(torch.nn.Linear(2, 2))
    gm.holder.dead = torch.nn.ReLU()
    gm.holder.deeper = torch.nn.Module()
    gm.holder.deeper.dead_too = torch.nn.Tanh()
    gm.holder.deeper.alias = gm.holder.dead  # listed under its first name only
    gm.alias = gm.used[0]  # listed under its first name only, which is used
    gm.later = torch.nn.Module()
    gm.later.alias = gm.unused  # unused under both names
    with gm.graph.inserting_before(out):  # a call of a module that does not exist (fx skips it)
        out.args = (gm.graph.create_node("call_module", "missing.module", (z,)),)
    return gm


@pytest.mark.parametrize("make", [_sweep_graph_module, lambda: fx.symbolic_trace(
    torch.nn.Sequential(torch.nn.Conv2d(2, 2, 1), torch.nn.BatchNorm2d(2), torch.nn.Sequential(torch.nn.ReLU())))])
def test_the_unused_submodule_sweep_deletes_what_fx_s_deletes(make):
    fast, slow = make(), make()
    rewrite_module._delete_unused_submodules(fast)
    slow.delete_all_unused_submodules()
    assert [name for name, _ in fast.named_modules()] == [name for name, _ in slow.named_modules()]
    assert [name for name, _ in fast.named_modules(remove_duplicate=False)] == [
        name for name, _ in slow.named_modules(remove_duplicate=False)]
    if make is _sweep_graph_module:
        assert {name for name, _ in fast.named_modules()} == {"", "used", "used.0", "used.1", "used.1.0", "holder",
                                                             "holder.read"}


def test_a_rewrite_leaves_the_same_module_with_either_sweep(monkeypatch):
    model = torch.nn.Sequential(torch.nn.Conv2d(2, 2, 1), torch.nn.BatchNorm2d(2), torch.nn.ReLU()).eval()
    fast = rewrite(model, standard_rules()).module
    monkeypatch.setattr(rewrite_module, "FAST_SUBMODULE_SWEEP", False)
    slow = rewrite(model, standard_rules()).module
    assert [n for n, _ in fast.named_modules()] == [n for n, _ in slow.named_modules()] and fast.code == slow.code
    x = torch.randn(1, 2, 3, 3)
    torch.testing.assert_close(fast(x), model(x))


# -- the fast lint and its slow twin (fx's Graph.lint) ----------------------------------------------


def _broken_graphs() -> dict[str, fx.GraphModule]:
    """One graph module per check of fx's lint, each failing it."""
    def fresh() -> tuple[fx.GraphModule, list[fx.Node]]:
        root = torch.nn.Module()
        root.lin = torch.nn.Linear(2, 2)
        gm = fx.symbolic_trace(lambda x: torch.relu(x) + 1)
        gm.lin = root.lin
        return gm, list(gm.graph.nodes)

    broken = {}
    gm, (x, relu, add, out) = fresh()
    relu.op = "call_nothing"
    broken["opcode"] = gm
    gm, (x, relu, add, out) = fresh()
    gm.graph._find_nodes_lookup_table.remove(relu)
    broken["side table"] = gm
    gm, (x, relu, add, out) = fresh()
    object.__setattr__(relu, "target", torch.sigmoid)  # filed under relu's key, called sigmoid now
    broken["side table key"] = gm
    gm, (x, relu, add, out) = fresh()
    other = fx.Graph().placeholder("y")
    relu.args = (other,)
    broken["foreign argument"] = gm
    gm, (x, relu, add, out) = fresh()
    add.append(relu)  # relu now after its user
    broken["order"] = gm
    gm, (x, relu, add, out) = fresh()
    add.name = "relu"
    broken["name"] = gm
    gm, (x, relu, add, out) = fresh()
    object.__setattr__(relu, "target", "not callable")
    broken["call_function target"] = gm
    gm, (x, relu, add, out) = fresh()
    with gm.graph.inserting_before(out):
        gm.graph.create_node("get_attr", "lin.nothing")
    broken["get_attr path"] = gm
    gm, (x, relu, add, out) = fresh()
    with gm.graph.inserting_before(out):
        gm.graph.create_node("call_module", "lin.weight", (x,))
    broken["call_module of a tensor"] = gm
    gm, (x, relu, add, out) = fresh()
    object.__setattr__(x, "target", 3)
    broken["placeholder target"] = gm
    gm, (x, relu, add, out) = fresh()
    with gm.graph.inserting_before(out):
        gm.graph.create_node("call_module", "lin.nothing", (x,))
    broken["call_module path"] = gm
    gm, (x, relu, add, out) = fresh()
    with gm.graph.inserting_before(out):
        gm.graph.create_node("call_module", "", (x,))
    broken["call_module of the root"] = gm
    return broken


@pytest.mark.parametrize("what", sorted(_broken_graphs()))
def test_every_graph_fx_lint_rejects_fails_the_fast_check(what):
    gm = _broken_graphs()[what]
    with pytest.raises(Exception):  # noqa: B017 - fx's own error, whatever its type
        gm.graph.lint()
    assert not rewrite_module._lint_passes(gm.graph)


def test_the_fast_check_passes_what_fx_lint_passes_on_the_shipped_cases():
    from test_stdlib import CASES, LIBRARY  # tests/ is on sys.path

    for _, case in sorted(CASES.items())[:6]:
        gm = rewrite(case.model(), LIBRARY).module
        gm.graph.lint()
        assert rewrite_module._lint_passes(gm.graph)
