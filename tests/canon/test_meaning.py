"""fxrewrite.canon.meaning: Matching by meaning: dims, respelled calls, in-place ops on fresh tensors,
tensor constants."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.fx as fx
from _canon import R4, exp_of, fires

from fxrewrite import Rule, rewrite
from fxrewrite.canon import (
    by_meaning,
    canonical_name,
    node_keys,
    respelled,
)

X = torch.randn(3, 4)
Y = torch.randn(3, 4)


# ---- matching by meaning: arguments and respelled calls -----------------------------------------


def test_transpose_dims_compare_against_the_known_rank_in_either_order():
    rule = exp_of(lambda x: x.transpose(-2, -1))
    assert fires(lambda a: torch.exp(a.transpose(2, 3)), rule, R4) == 1
    assert fires(lambda a: torch.exp(a.transpose(3, 2)), rule, R4) == 1
    assert fires(lambda a: torch.exp(a.transpose(-1, -2)), rule, R4, shapes=False) == 1


def test_positive_dims_do_not_match_negative_ones_without_the_rank():
    rule = exp_of(lambda x: x.transpose(-2, -1))
    assert fires(lambda a: torch.exp(a.transpose(2, 3)), rule, R4, shapes=False) == 0
    assert fires(lambda a: torch.exp(a.transpose(1, 3)), rule, R4) == 0


def test_a_permute_that_swaps_two_dims_is_a_transpose():
    rule = exp_of(lambda x: x.transpose(1, 2))
    assert fires(lambda a: torch.exp(a.permute(0, 2, 1, 3)), rule, R4) == 1
    assert fires(lambda a: torch.exp(a.permute(0, 2, 3, 1)), rule, R4) == 0  # a rotation, not a swap


@pytest.mark.parametrize("spelling", [lambda a: a[:, None], lambda a: a[..., None, :], lambda a: a.unsqueeze(1)],
                         ids=["[:, None]", "[..., None, :]", "unsqueeze(1)"])
def test_an_index_that_inserts_a_dim_is_unsqueeze(spelling):
    rule = exp_of(lambda x: x.unsqueeze(-2))
    assert fires(lambda a: torch.exp(spelling(a)), rule, X) == 1


def test_an_index_that_selects_is_not_unsqueeze():
    rule = exp_of(lambda x: x.unsqueeze(1))
    assert fires(lambda a: torch.exp(a[:, None, 0]), rule, X) == 0


def test_one_over_x_is_reciprocal_and_two_over_x_is_not():
    rule = exp_of(torch.reciprocal)
    positive = torch.rand(3, 4) + 0.5
    assert fires(lambda a: torch.exp(1 / a), rule, positive) == 1
    assert fires(lambda a: torch.exp(2 / a), rule, positive) == 0

    class M(torch.nn.Module):
        def forward(self, a):
            return torch.exp(1 / a)

    result = rewrite(torch.export.export(M(), (positive,)), rule)  # exported: reciprocal(a) * 1
    assert result.report.applied["exp_op"] == 1
    torch.testing.assert_close(result.module(positive), M()(positive))


def test_mT_is_a_transpose_of_the_last_two_dims_but_not_on_a_0d_tensor():
    rule = exp_of(lambda x: x.transpose(-2, -1))
    assert fires(lambda a: torch.exp(a.mT), rule, R4) == 1
    assert fires(lambda a: torch.exp(a.mT), rule, R4, shapes=False) == 1
    gm = fx.symbolic_trace(lambda a: torch.exp(a.mT))
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # mT of a 0-d tensor is deprecated
        assert rewrite(gm, rule, example_inputs=(torch.tensor(2.0),)).report.applied["exp_op"] == 0


def test_a_softmax_dtype_equal_to_its_input_is_no_argument():
    rule = exp_of(lambda x: torch.softmax(x, -1))
    assert fires(lambda a: torch.exp(torch.softmax(a, -1, dtype=torch.float32)), rule, X) == 1
    assert fires(lambda a: torch.exp(torch.softmax(a, -1, dtype=torch.float32)), rule, X.double()) == 0


def test_shape_index_is_size():
    rule = Rule.from_functions(lambda x: x * x.size(-1), lambda x: x.size(-1) * x, name="times_size")
    assert fires(lambda a: a * a.shape[-1], rule, X, shapes=False) == 1


def test_by_meaning_leaves_captured_dims_as_the_graph_writes_them():
    x = fx.Graph().placeholder("x")
    d = fx.Graph().placeholder("d")
    assert by_meaning("sum", ("self", "dim"), (x, [d]), (x, [1]), None) == ((x, [d]), (x, [1]))


def test_node_keys_of_a_swapping_permute_are_transpose_and_permute():
    gm = fx.symbolic_trace(lambda a: a.permute(1, 0))
    permute = next(n for n in gm.graph.nodes if n.op == "call_method")
    assert node_keys(permute) == (("aten", "transpose"), ("aten", "permute"))
    assert respelled(permute) == ("transpose", {"self": permute.args[0], "dim0": -2, "dim1": -1})


def test_the_values_of_a_reduction_result_are_its_element_0():
    rule = Rule.from_functions(lambda x: torch.exp(x.max(-1).values), lambda x: torch.exp(torch.amax(x, -1)),
                               name="exp_max")
    assert fires(lambda a: torch.exp(a.max(-1)[0]), rule, X) == 1
    assert fires(lambda a: torch.exp(a.max(-1).values), rule, X) == 1
    assert fires(lambda a: torch.exp(a.max(-1)[1].float()), rule, X) == 0  # the indices


def test_python_division_of_numbers_reads_1_and_1_0_alike_but_not_tensor_division():
    import math

    rule = Rule.from_functions(lambda x, t: x * (1 / math.sqrt(t.size(-1))), lambda x, t: x * t.size(-1) ** -0.5,
                               name="inverse_sqrt")
    assert fires(lambda a: a * (1.0 / math.sqrt(a.size(-1))), rule, X, shapes=False) == 1
    assert fires(lambda a: a * (1 / math.sqrt(a.size(-1))), rule, X, shapes=False) == 1
    assert fires(lambda a: a * (2 / math.sqrt(a.size(-1))), rule, X, shapes=False) == 0
    tensor_rule = Rule.from_functions(lambda x: torch.exp(1.0 / x), lambda x: torch.exp(1.0 / x), name="t")
    ints = torch.arange(1, 5)
    assert canonical_name("call_function", operator.truediv) == "div"
    assert fires(lambda a: torch.exp(1 / a), tensor_rule, ints) == 1  # both are reciprocal(a)


def test_an_in_place_op_on_a_fresh_tensor_nobody_else_reads_is_its_functional_op():
    class Scaled(torch.nn.Module):
        def forward(self, a, b):
            scores = a @ b
            scores /= 2.0  # Falcon's spelling; torch.export keeps aten.div_
            return torch.softmax(scores, -1)

    class Shared(torch.nn.Module):
        def forward(self, a, b):
            scores = a @ b
            kept = scores * 1.5
            scores /= 2.0  # kept read scores before the write: not a plain division
            return torch.softmax(scores, -1) + kept

    rule = Rule.from_functions(lambda x, y: torch.softmax(x @ y / 2.0, -1), lambda x, y: torch.softmax(x @ y * 0.5, -1),
                               name="softmax_half")
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    for model, count in ((Scaled(), 1), (Shared(), 0)):
        program = torch.export.export(model, (a, b))
        result = rewrite(program, rule)
        assert result.report.applied["softmax_half"] == count, type(model).__name__
        torch.testing.assert_close(result.module(a, b), model(a, b))


def test_a_literal_capture_binds_the_number_a_0d_tensor_constant_holds():
    """GPT-Neo's mask value is torch.tensor(finfo.min): exported, a lifted constant behind
    lift_fresh_copy and detach_."""
    def where_pattern(c, s, m: float):
        return torch.softmax(torch.where(c, s, m), -1)

    rule = Rule.from_functions(where_pattern, lambda c, s, m: torch.softmax(s.masked_fill(~c, m), -1), name="where_m")

    class Masked(torch.nn.Module):
        def forward(self, c, s):
            return torch.softmax(torch.where(c, s, torch.tensor(-1e9)), -1)

    class Vector(torch.nn.Module):
        def forward(self, c, s):
            return torch.softmax(torch.where(c, s, torch.tensor([-1e9, -1e9, -1e9, -1e9])), -1)

    c, s = torch.rand(3, 4) > 0.3, torch.randn(3, 4)
    for model, count in ((Masked(), 1), (Vector(), 0)):
        result = rewrite(torch.export.export(model, (c, s)), rule)
        assert result.report.applied["where_m"] == count, type(model).__name__
        torch.testing.assert_close(result.module(c, s), model(c, s))


def test_input_keys_look_through_up_to_four_identities_per_input():
    """``input_keys``: the keys of each input and of what stands behind the identities in front of
    it, four nodes deep per input at most; an input that cannot be an identity stops the walk."""
    import torch.nn.functional as F

    from fxrewrite.canon import input_keys, node_keys

    def program(x, y):
        behind = F.dropout(F.dropout(torch.neg(x), 0.5, False), 0.5, False)
        deep = torch.sin(y)
        for _ in range(5):
            deep = F.dropout(deep, 0.5, False)
        return torch.relu(behind) + torch.cos(torch.neg(torch.abs(x))), torch.relu(deep) * deep

    nodes = {n.name: n for n in fx.symbolic_trace(program).graph.nodes}
    key = {name: node_keys(n)[0] for name, n in nodes.items()}
    assert input_keys(nodes["relu"]) == {key["dropout_1"], key["neg"]}  # both dropouts, then neg, which stops it
    assert input_keys(nodes["cos"]) == {key["neg_1"]}  # neg is no identity: abs is not reached
    assert input_keys(nodes["relu_1"]) == {key["dropout_6"]}  # four dropouts deep, sin not reached
    assert input_keys(nodes["add"]) == {key["relu"], key["cos"]}
    assert input_keys(nodes["x"]) == frozenset()


def test_input_keys_read_from_the_table_of_plain_inputs_are_those_worked_out_anew(monkeypatch):
    """``input_keys`` with the inputs whose keys and identity test depend on their target alone
    read from ``_plain_inputs`` (:data:`FAST_KEYS`) gives what working them out at every call
    gives, at every node of programs with identities (dropout calls and modules, ``contiguous``),
    respelled inputs (``x[:, None]``, ``permute``, ``1 / x``), in-place ops, placeholders and
    attributes; and the table is read."""
    import torch.nn.functional as F

    from fxrewrite.canon import input_keys, meaning

    class Program(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.drop = torch.nn.Dropout(0.5).eval()
            self.register_buffer("scale", torch.ones(4))

        def forward(self, x):
            a = F.dropout(torch.neg(x), 0.5, False).contiguous()
            b = torch.relu(self.drop(torch.sin(a))) * self.scale
            c = (1 / b)[:, None].permute(1, 0, 2).clone().add_(1)
            return torch.relu(a) + torch.cos(b), torch.abs(c) + c.exp().neg()

    graphs = [fx.symbolic_trace(Program()).graph, fx.symbolic_trace(lambda x: torch.relu(torch.neg(x))).graph]
    found = []  # what the table gave
    monkeypatch.setattr(meaning, "_plain_inputs", type("Counted", (dict,), {
        "get": lambda self, key: found.append(dict.get(self, key)) or found[-1]})())  # (empty: filled here)
    for graph in graphs:
        for node in graph.nodes:
            monkeypatch.setattr(meaning, "FAST_KEYS", False)
            slow = input_keys(node)
            monkeypatch.setattr(meaning, "FAST_KEYS", True)
            assert [input_keys(node), input_keys(node)] == [slow, slow], node.format_node()  # filled, then read
    assert sum(keys is not None for keys in found) > 20


def test_the_one_input_target_that_decides_the_input_keys_gives_the_keys_worked_out_at_the_node():
    """``input_target``: where it names ``(op, target)`` of a node's one input, the node's input
    keys are that target's plain keys wherever it is read (identities, respelled calls and several
    inputs give ``None``), at every node of a program, once the inputs have been met."""
    import torch.nn.functional as F

    from fxrewrite.canon import input_keys, node_keys
    from fxrewrite.canon.meaning import input_target

    def program(x):
        a = F.dropout(torch.neg(x), 0.5, False).contiguous()
        b = torch.relu(torch.sin(a)) * 2.0
        c = (1 / b)[:, None].permute(1, 0, 2)
        return torch.relu(a) + torch.cos(b) + torch.neg(torch.relu(x)), torch.abs(c) + c.exp().neg()

    nodes = list(fx.symbolic_trace(program).graph.nodes)
    for node in nodes:
        input_keys(node)  # (files the plain inputs met)
    named = {}
    for node in nodes:
        target = input_target(node)
        if target is not None:
            (only,) = node.all_input_nodes
            assert (only.op, only.target) == target and input_keys(node) == frozenset(node_keys(only)), node.name
            named[node.name] = target
    assert {"dropout", "relu", "relu_2", "neg_1", "neg_2"} <= set(named), named  # neg, sin, x, relu_2, exp
    # contiguous, a scaling mul (identities), two inputs, permute and 1 / x (respelled), a getitem
    assert not {"sin", "relu_1", "cos", "add", "abs_1", "getitem", "permute"} & set(named), named
