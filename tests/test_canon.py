"""Canonical ops: every spelling of an op is one op, arguments compare by meaning, and the
commutative table is true. Checked op by op, on traced and on exported graphs, with numbers."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from _helpers import assert_rewrite_sound
from hypothesis import given
from hypothesis import strategies as st

from fxrewrite import Rule, explain, find_matches, rewrite
from fxrewrite.canon import (
    COMMUTATIVE,
    by_meaning,
    canonical_arguments,
    canonical_name,
    identity_refusal,
    identity_source,
    node_keys,
    op_key_of,
    respelled,
)

X = torch.randn(3, 4)
Y = torch.randn(3, 4)

# pattern spelling, graph spellings: each graph spelling must be matched by the pattern.
SPELLINGS = [
    ("add", lambda x, y: torch.add(x, y), [lambda a, b: a + b, lambda a, b: a.add(b), lambda a, b: torch.add(a, b)]),
    ("sub", lambda x, y: x - y,
     [lambda a, b: torch.sub(a, b), lambda a, b: torch.subtract(a, b), lambda a, b: a.sub(b)]),
    ("mul", lambda x, y: x * y,
     [lambda a, b: torch.mul(a, b), lambda a, b: torch.multiply(a, b), lambda a, b: a.mul(b)]),
    ("div", lambda x, y: x / y,
     [lambda a, b: torch.div(a, b), lambda a, b: torch.true_divide(a, b), lambda a, b: a.div(b)]),
    ("matmul", lambda x, y: x @ y.transpose(0, 1),
     [lambda a, b: torch.matmul(a, b.transpose(0, 1)), lambda a, b: a.matmul(torch.transpose(b, 0, 1))]),
    ("neg", lambda x, y: -x + y,
     [lambda a, b: torch.neg(a) + b, lambda a, b: torch.negative(a) + b, lambda a, b: b + a.neg()]),
    ("sigmoid", lambda x, y: torch.sigmoid(x) * y,
     [lambda a, b: torch.special.expit(a) * b, lambda a, b: a.sigmoid() * b]),
    ("relu", lambda x, y: torch.relu(x) + y, [lambda a, b: F.relu(a) + b, lambda a, b: a.relu() + b]),
    ("sum", lambda x, y: torch.sum(x, dim=1) + y.sum(1),
     [lambda a, b: torch.sum(a, 1) + torch.sum(b, dim=1), lambda a, b: a.sum(dim=1) + b.sum(1)]),
    ("softmax", lambda x, y: torch.softmax(x, dim=-1) * y,
     [lambda a, b: F.softmax(a, dim=-1) * b, lambda a, b: a.softmax(-1) * b, lambda a, b: torch.softmax(a, -1) * b]),
    ("transpose", lambda x, y: x.transpose(0, 1) @ y, [lambda a, b: torch.transpose(a, 0, 1) @ b]),
    ("permute", lambda x, y: x.permute(1, 0) @ y,
     [lambda a, b: a.permute([1, 0]) @ b, lambda a, b: torch.permute(a, (1, 0)) @ b]),
    ("reshape", lambda x, y: x.reshape(4, 3) @ y,
     [lambda a, b: torch.reshape(a, (4, 3)) @ b, lambda a, b: a.reshape([4, 3]) @ b]),
    ("clamp", lambda x, y: torch.clamp(x, min=0.0) + y,
     [lambda a, b: torch.clip(a, 0.0) + b, lambda a, b: a.clamp(0.0) + b]),
    ("gt", lambda x, y: torch.where(x > y, x, y),
     [lambda a, b: torch.where(torch.gt(a, b), a, b), lambda a, b: torch.where(torch.greater(a, b), a, b)]),
]


@pytest.mark.parametrize("name, pattern, graphs", SPELLINGS, ids=[s[0] for s in SPELLINGS])
def test_each_spelling_matches_in_traced_graphs(name, pattern, graphs):
    rule = Rule.from_functions(pattern, lambda x, y: pattern(x, y), name=name)
    for graph_fn in graphs:
        found = [m for _, m in find_matches(graph_fn, rule)]
        assert len(found) == 1, f"{name}: pattern did not match {graph_fn}"
        result = rewrite(graph_fn, Rule.from_functions(pattern, lambda x, y: pattern(x, y) + 0.0, name=name,
                                                       where=lambda m: "fxrewrite_rule" not in m.anchor.meta))
        result.module.graph.lint()
        torch.testing.assert_close(result.module(X, Y), graph_fn(X, Y))


class Wrap(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, a, b):
        return self.fn(a, b)


@pytest.mark.parametrize("name, pattern, graphs", SPELLINGS, ids=[s[0] for s in SPELLINGS])
def test_each_spelling_matches_in_exported_graphs(name, pattern, graphs):
    rule = Rule.from_functions(pattern, lambda x, y: pattern(x, y), name=name)
    for graph_fn in graphs:
        exported = torch.export.export(Wrap(graph_fn), (X, Y)).module()
        found = [m for _, m in find_matches(exported, rule)]
        assert len(found) == 1, f"{name}: pattern did not match the exported {graph_fn}:\n{exported.code}"


def test_keyword_positional_and_default_arguments_compare_by_meaning():
    sum_dim1 = Rule.from_functions(lambda x: torch.sum(x, dim=1), lambda x: torch.einsum("ij->i", x), name="sum1",
                                   where=lambda m: m["x"].dim() == 2)
    for f in (lambda a: torch.sum(a, 1), lambda a: a.sum(1), lambda a: a.sum(dim=1, keepdim=False),
              lambda a: torch.sum(a, (1,))):
        result = rewrite(f, sum_dim1, example_inputs=(X,))
        assert result.report.applied["sum1"] == 1, f
        assert_rewrite_sound(f, result, X)
    for f in (lambda a: a.sum(1, keepdim=True), lambda a: a.sum(0), lambda a: a.sum(),
              lambda a: a.sum(1, dtype=torch.float64)):
        assert rewrite(f, sum_dim1, example_inputs=(X,)).report.applied["sum1"] == 0, f


def test_non_default_alpha_is_not_plain_add():
    plus = Rule.from_functions(lambda x, y: x + y, lambda x, y: torch.sub(x, -y), name="plus")
    f = lambda a, b: torch.add(a, b, alpha=2)  # noqa: E731
    result = rewrite(f, plus)
    assert result.report.applied["plus"] == 0
    assert_rewrite_sound(f, result, X, Y)


def test_in_place_methods_are_not_canonicalised():
    assert op_key_of("call_method", "add_") == ("call_method", "add_")
    assert canonical_name("call_method", "relu_") is None


def test_functions_without_aten_counterpart_keep_their_own_key():
    def helper(x):
        return x

    assert op_key_of("call_function", helper) == ("call_function", helper)
    assert op_key_of("call_function", operator.getitem) == ("call_function", operator.getitem)


def test_varargs_methods_pack_their_list():
    x = fx.Graph().placeholder("x")
    assert canonical_arguments("call_method", "permute", (x, 0, 2, 1), {}) == {"self": x, "dims": [0, 2, 1]}
    assert canonical_arguments("call_method", "view", (x, 2, -1), {}) == {"self": x, "size": [2, -1]}


def test_inplace_functional_is_not_the_pure_op():
    assert canonical_arguments("call_function", F.relu, (fx.Graph().placeholder("x"),), {"inplace": True}) is None


_TENSOR_OPS = {
    "add": torch.add, "mul": torch.mul, "maximum": torch.maximum, "minimum": torch.minimum, "eq": torch.eq,
    "ne": torch.ne, "logical_and": torch.logical_and, "logical_or": torch.logical_or,
    "logical_xor": torch.logical_xor, "bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or,
    "bitwise_xor": torch.bitwise_xor,
}


def test_commutative_table_lists_only_ops_we_verify():
    assert set(_TENSOR_OPS) == set(COMMUTATIVE)


@pytest.mark.parametrize("name", sorted(COMMUTATIVE))
@given(data=st.data())
def test_commutative_table_entry_is_true(name, data):
    op = _TENSOR_OPS[name]
    integer = name.startswith("bitwise")
    values = st.integers(-100, 100) if integer else st.floats(allow_nan=True, allow_infinity=True, width=32)
    shape_a = data.draw(st.sampled_from([(3,), (2, 3), (1, 3)]))
    shape_b = data.draw(st.sampled_from([(3,), (2, 1), (1,)]))
    dtype = torch.int32 if integer else torch.float32
    a = torch.tensor(data.draw(st.lists(values, min_size=_numel(shape_a), max_size=_numel(shape_a))),
                     dtype=dtype).reshape(shape_a)
    b = torch.tensor(data.draw(st.lists(values, min_size=_numel(shape_b), max_size=_numel(shape_b))),
                     dtype=dtype).reshape(shape_b)
    torch.testing.assert_close(op(a, b), op(b, a), equal_nan=True)


def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


@pytest.mark.parametrize("functional", [F.relu6, F.hardswish, F.hardsigmoid, F.mish, F.elu, F.hardtanh, F.selu,
                                        lambda t: F.leaky_relu(t, 0.1)])
def test_python_functionals_match_their_exported_aten_op(functional):
    rule = Rule.from_functions(lambda x: functional(x) * 2.0, lambda x: functional(x) + functional(x), name="twice")
    exported = torch.export.export(Wrap(lambda a, b: functional(a) * 2.0 + b), (X, Y)).module()
    result = rewrite(exported, rule)
    assert result.report.applied["twice"] == 1
    result.module.graph.lint()
    torch.testing.assert_close(result.module(X, Y), functional(X) * 2.0 + Y)


def test_inplace_functional_keeps_its_own_key_and_never_matches_the_pure_op():
    rule = Rule.from_functions(lambda x: F.relu6(x) * 2.0, lambda x: F.relu6(x) + F.relu6(x), name="twice")
    result = rewrite(lambda a: F.relu6(a, inplace=True) * 2.0, rule)
    assert result.report.applied["twice"] == 0
    assert_rewrite_sound(lambda a: F.relu6(a, inplace=True) * 2.0, result, X)


# ---- what a node means: one row per op family ----------------------------------------------------------------------
#
# Each row builds one node in a small graph and states what canon answers about it. These answers
# drive matching (result kind), the driver's in-place check (mutation, aliasing) and recording on
# ATen graphs (spelling); every torch release may change them, so they are pinned here.

from fxrewrite.canon import (  # noqa: E402
    aliased_inputs,
    aten_spelling,
    dtype_conversion,
    is_check,
    is_written,
    mutation,
    result_kind,
    written_arguments,
)


def _node(build):
    """The last node ``build(graph, x, y)`` makes, in a graph with tensor placeholders x, y."""
    graph = fx.Graph()
    x, y = graph.placeholder("x"), graph.placeholder("y")
    node = build(graph, x, y)
    graph.output(node)
    return node, x, y


FAMILIES = {
    # name: (build, result kind, aliases x?, written argument or None)
    "pointwise op": (lambda g, x, y: g.call_function(torch.add, (x, y)), "tensor", False, None),
    "python operator on graph inputs": (lambda g, x, y: g.call_function(operator.mul, (x, y)), "unknown", False, None),
    "python operator on a tensor": (lambda g, x, y: g.call_function(operator.mul, (g.call_method("neg", (x,)), 2)),
                                    "tensor", False, None),
    "aten overload": (lambda g, x, y: g.call_function(torch.ops.aten.neg.default, (x,)), "tensor", False, None),
    "view method": (lambda g, x, y: g.call_method("transpose", (x, 0, 1)), "tensor", True, None),
    "view aten": (lambda g, x, y: g.call_function(torch.ops.aten.view.default, (x, [4])), "tensor", True, None),
    "contiguous may alias": (lambda g, x, y: g.call_method("contiguous", (x,)), "tensor", True, None),
    "float() may alias": (lambda g, x, y: g.call_method("float", (x,)), "tensor", True, None),
    "to(dtype) may alias": (lambda g, x, y: g.call_method("to", (x, torch.float32)), "tensor", True, None),
    "_to_copy copies": (lambda g, x, y: g.call_function(torch.ops.aten._to_copy.default, (x,),
                                                        {"dtype": torch.float16}),
                        "tensor", False, None),
    "swapaxes": (lambda g, x, y: g.call_method("swapaxes", (x, 0, 1)), "tensor", True, None),
    "moveaxis": (lambda g, x, y: g.call_function(torch.moveaxis, (x, 0, 1)), "tensor", True, None),
    "ravel": (lambda g, x, y: g.call_method("ravel", (x,)), "tensor", True, None),
    "unfold": (lambda g, x, y: g.call_method("unfold", (x, 0, 2, 1)), "tensor", True, None),
    "positive": (lambda g, x, y: g.call_function(torch.positive, (x,)), "tensor", True, None),
    ".real": (lambda g, x, y: g.call_function(getattr, (x, "real")), "tensor", True, None),
    ".mT": (lambda g, x, y: g.call_function(getattr, (x, "mT")), "tensor", True, None),
    "indexing": (lambda g, x, y: g.call_function(operator.getitem, (x, 0)), "unknown", True, None),
    "split tuple": (lambda g, x, y: g.call_method("split", (x, 2)), "sequence", True, None),
    "in-place method": (lambda g, x, y: g.call_method("add_", (x, y)), "unknown", True, "x"),
    "in-place aten": (lambda g, x, y: g.call_function(torch.ops.aten.mul_.Tensor, (x, y)), "tensor", True, "x"),
    "inplace=True keyword": (lambda g, x, y: g.call_function(F.relu, (x,), {"inplace": True}), "unknown", True, "x"),
    "inplace=True positional": (lambda g, x, y: g.call_function(F.relu, (x, True)), "unknown", True, "x"),
    "out= argument": (lambda g, x, y: g.call_function(torch.add, (x, 1), {"out": y}), "unknown", True, "y"),
    "setitem": (lambda g, x, y: g.call_function(operator.setitem, (x, 0, y)), "unknown", True, "x"),
    "size method": (lambda g, x, y: g.call_method("size", (x, -1)), "value", False, None),
    ".shape": (lambda g, x, y: g.call_function(getattr, (x, "shape")), "value", False, None),
    ".dtype": (lambda g, x, y: g.call_function(getattr, (x, "dtype")), "value", False, None),
    "dim method": (lambda g, x, y: g.call_method("dim", (x,)), "value", False, None),
    "sym_size": (lambda g, x, y: g.call_function(torch.ops.aten.sym_size.int, (x, 0)), "value", False, None),
    "size arithmetic": (lambda g, x, y: g.call_function(operator.mul, (g.call_method("size", (x, 0)),
                                                                         g.call_method("size", (x, 1)))),
                        "value", False, None),
    "math on sizes": (lambda g, x, y: g.call_function(__import__("math").sqrt, (g.call_method("size", (x, -1)),)),
                      "value", False, None),
    "max.dim tuple": (lambda g, x, y: g.call_function(torch.ops.aten.max.dim, (x, 0)), "sequence", False, None),
    "check node": (lambda g, x, y: g.call_function(torch.ops.aten._assert_tensor_metadata.default, (x,),
                                                   {"dtype": torch.float32}), "none", False, None),
    "unknown user function": (lambda g, x, y: g.call_function(lambda a, b: a, (x, y)), "unknown", True, None),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_what_a_node_computes_aliases_and_writes(family):
    build, kind, aliases_x, written = FAMILIES[family]
    node, x, y = _node(build)
    assert result_kind(node) == kind
    assert (x in aliased_inputs(node)) is aliases_x
    expected_written = {"x": (x,), "y": (y,), None: ()}[written]
    assert written_arguments(node) == expected_written
    assert (mutation(node) is not None) is (written is not None)


def test_writes_are_found_through_every_alias_and_base():
    gm = fx.symbolic_trace(lambda a: (a.contiguous().float().swapaxes(0, 1).add_(1), a.neg()))
    a = next(n for n in gm.graph.nodes if n.op == "placeholder")
    neg = next(n for n in gm.graph.nodes if n.target == "neg")
    assert is_written(a)  # written through a chain of (possible) views
    assert not is_written(neg)


def test_a_check_node_is_recognised_only_without_users():
    graph = fx.Graph()
    x = graph.placeholder("x")
    check = graph.call_function(torch.ops.aten._assert_scalar.default, (x, "msg"))
    relu = graph.call_function(torch.ops.aten.relu.default, (x,))
    graph.output(relu)
    assert is_check(check)
    assert not is_check(relu)


@pytest.mark.parametrize("op, target, args, kwargs", [
    ("call_method", "float", (), {}),
    ("call_method", "to", (torch.float32,), {}),
    ("call_method", "type", (torch.float32,), {}),
    ("call_function", torch.ops.aten.to.dtype, (torch.float32,), {}),
    ("call_function", torch.ops.aten._to_copy.default, (), {"dtype": torch.float32}),
    ("call_function", torch.ops.prims.convert_element_type.default, (torch.float32,), {}),
])
def test_every_spelling_of_a_dtype_conversion_is_one_op_with_its_dtype(op, target, args, kwargs):
    x = fx.Graph().placeholder("x")
    assert dtype_conversion(op, target, (x, *args), kwargs) == {"self": x, "dtype": torch.float32}
    assert op_key_of(op, target) == ("aten", "to")
    assert canonical_arguments(op, target, (x, *args), kwargs) == {"self": x, "dtype": torch.float32}


@pytest.mark.parametrize("op, target, args, kwargs", [
    ("call_method", "to", ("cpu",), {}),
    ("call_method", "to", (torch.float32,), {"copy": True}),
    ("call_function", torch.ops.aten._to_copy.default, (), {"dtype": torch.float32, "device": "meta"}),
    ("call_method", "float", (torch.contiguous_format,), {}),
])
def test_conversions_that_do_more_than_change_the_dtype_are_not_dtype_conversions(op, target, args, kwargs):
    x = fx.Graph().placeholder("x")
    assert dtype_conversion(op, target, (x, *args), kwargs) is None


@pytest.mark.parametrize("op, target, args, expected", [
    ("call_method", "sum", (1,), (torch.ops.aten.sum.dim_IntList, [1])),
    ("call_method", "half", (), (torch.ops.aten.to.dtype, torch.float16)),
    ("call_function", operator.mul, (2.0,), (torch.ops.aten.mul.Scalar, 2.0)),
    ("call_function", F.relu, (), (torch.ops.aten.relu.default, None)),
])
def test_torch_level_calls_are_spelled_as_torch_export_records_them(op, target, args, expected):
    x = fx.Graph().placeholder("x")
    kind, overload, new_args, _ = aten_spelling(op, target, (x, *args), {})
    assert (kind, overload) == ("call_function", expected[0])
    assert new_args[0] is x and (expected[1] is None or new_args[1] == expected[1])


# ---- matching by meaning: identities ------------------------------------------------------------
# Each identity is seen through where its condition holds, and only there: the second test of
# each pair fails if the condition is dropped.

EXP_TANH = Rule.from_functions(lambda x: torch.exp(torch.tanh(x)), lambda x: torch.tanh(x).exp(), name="exp_tanh")


def fires(program, rule, *inputs, shapes=True) -> int:
    """How often ``rule`` fires on ``program``; checks lint and numbers on ``inputs``."""
    result = rewrite(program, rule, example_inputs=inputs if shapes else None)
    torch.manual_seed(0)
    assert_rewrite_sound(program, result, *inputs)
    return result.report.applied[rule.name]


def test_a_cast_to_the_dtype_the_value_has_is_seen_through():
    assert fires(lambda a: torch.exp(torch.tanh(a).to(torch.float32)), EXP_TANH, X) == 1
    assert fires(lambda a: torch.exp(torch.tanh(a).float().type(torch.float32)), EXP_TANH, X) == 1


def test_a_cast_that_changes_the_dtype_is_not_seen_through():
    assert fires(lambda a: torch.exp(torch.tanh(a).to(torch.float64)), EXP_TANH, X) == 0


def test_a_cast_is_not_seen_through_without_metadata():
    assert fires(lambda a: torch.exp(torch.tanh(a).to(torch.float32)), EXP_TANH, X, shapes=False) == 0
    gm = fx.symbolic_trace(lambda a: torch.tanh(a).to(torch.float32))
    to = next(n for n in gm.graph.nodes if n.target == "to")
    assert identity_source(to) is None
    assert "needs metadata" in identity_refusal(to)


def test_a_cast_in_an_exported_graph_is_seen_through():
    class M(torch.nn.Module):
        def forward(self, a):
            return torch.exp(torch.tanh(a).to(torch.float32))

    program = torch.export.export(M(), (X,))
    result = rewrite(program, EXP_TANH)
    assert result.report.applied["exp_tanh"] == 1
    torch.testing.assert_close(result.module(X), M()(X))


@pytest.mark.parametrize("spelling", [
    lambda a: F.dropout(a, 0.3, training=False),
    lambda a: F.dropout(a, p=0.0, training=True),
    lambda a: torch.dropout(a, 0.5, False),
    lambda a: F.dropout2d(a, 0.5, training=False),
], ids=["eval", "p=0", "torch.dropout", "dropout2d"])
def test_inactive_dropout_is_seen_through(spelling):
    assert fires(lambda a: torch.exp(spelling(torch.tanh(a))), EXP_TANH, X) == 1


def test_active_dropout_is_not_seen_through():
    gm = fx.symbolic_trace(lambda a: torch.exp(F.dropout(torch.tanh(a), 0.3, training=True)))
    result = rewrite(gm, EXP_TANH)
    assert result.report.applied["exp_tanh"] == 0
    dropout = next(n for n in gm.graph.nodes if n.target is F.dropout)
    assert "active dropout" in identity_refusal(dropout)


def test_a_dropout_module_is_seen_through_in_eval_mode_only():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = torch.nn.Dropout(0.4)

        def forward(self, a):
            return torch.exp(self.drop(torch.tanh(a)))

    assert fires(M().eval(), EXP_TANH, X) == 1
    assert rewrite(M().train(), EXP_TANH).report.applied["exp_tanh"] == 0


def test_an_unwritten_copy_is_seen_through():
    assert fires(lambda a: torch.exp(torch.tanh(a).clone()), EXP_TANH, X) == 1
    assert fires(lambda a: torch.exp(torch.tanh(a).contiguous()), EXP_TANH, X) == 1
    assert fires(lambda a: torch.exp(torch.tanh(a).detach()), EXP_TANH, X) == 1


def test_a_copy_that_is_written_is_not_seen_through():
    def program(a):
        t = torch.tanh(a)
        c = t.clone()
        c.add_(1.0)
        return torch.exp(c)

    assert fires(program, EXP_TANH, X) == 0


def test_a_view_to_the_same_shape_is_seen_through_and_a_reshape_is_not():
    assert fires(lambda a: torch.exp(torch.tanh(a).view(3, 4)), EXP_TANH, X) == 1
    assert fires(lambda a: torch.exp(torch.tanh(a).reshape(4, 3)), EXP_TANH, X) == 0


def test_a_product_with_one_is_seen_through_unless_it_promotes():
    assert fires(lambda a: torch.exp(torch.tanh(a) * 1), EXP_TANH, X) == 1
    abs_exp = Rule.from_functions(lambda x: torch.exp(torch.abs(x)), lambda x: torch.abs(x).exp(), name="exp_abs")
    ints = torch.arange(-3, 3)
    assert fires(lambda a: torch.exp(torch.abs(a) * 1.0), abs_exp, ints) == 0  # int * 1.0 is a float


def test_an_identity_used_outside_the_match_keeps_the_match_from_firing():
    def program(a):
        t = torch.tanh(a).to(torch.float32)
        return torch.exp(t) + t

    assert fires(program, EXP_TANH, X) == 0


def test_a_repeated_variable_agrees_with_its_value_behind_a_noop_cast():
    silu = Rule.from_functions(lambda x: x * torch.sigmoid(x), lambda x: F.silu(x), name="silu")
    assert fires(lambda a: a.to(torch.float32) * torch.sigmoid(a), silu, X) == 1


# ---- matching by meaning: arguments and respelled calls -----------------------------------------

R4 = torch.randn(2, 3, 4, 5)


def exp_of(op):
    return Rule.from_functions(lambda x: torch.exp(op(x)), lambda x: op(x).exp(), name="exp_op")


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


def test_a_copy_whose_source_is_written_later_is_not_seen_through():
    """``c`` keeps the old value of ``a``; were the clone seen through, ``x`` would bind both ``c``
    and the written ``a`` and silu(c) would replace c * sigmoid(a)."""
    silu = Rule.from_functions(lambda x: x * torch.sigmoid(x), lambda x: F.silu(x), name="silu")

    def program(a):
        b = a * 2
        c = b.clone()
        b.add_(1.0)
        return c * torch.sigmoid(b)

    assert fires(program, silu, X) == 0


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


# ---- identities written in the pattern ----------------------------------------------------------

def _cast_and_dropout(q, k, v):
    w = torch.softmax(q @ k.transpose(-1, -2), dim=-1).to(v.dtype)
    return torch.matmul(F.dropout(w, p=0.1, training=False), v)


CAST_RULE = Rule.from_functions(_cast_and_dropout, lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=1.0),
                                name="cast_attention")
QKV = (torch.randn(2, 3, 4, 8), torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 8))


def plain_attention(q, k, v):
    return torch.softmax(q @ k.transpose(-2, -1), -1) @ v


def test_a_pattern_cast_and_dropout_the_graph_lacks_are_identities_where_the_dtype_fits():
    assert fires(plain_attention, CAST_RULE, *QKV) == 1
    assert fires(_cast_and_dropout, CAST_RULE, *QKV) == 1  # and where the graph has them


def test_a_pattern_cast_the_graph_lacks_needs_metadata_and_a_fitting_dtype():
    assert fires(plain_attention, CAST_RULE, *QKV, shapes=False) == 0
    (miss, *_) = explain(plain_attention, CAST_RULE)["cast_attention"].misses
    assert "needs metadata" in miss.reason
    to_double = Rule.from_functions(lambda x: torch.exp(torch.tanh(x).double()), lambda x: torch.tanh(x).double().exp(),
                                    name="exp_tanh_double")
    assert fires(lambda a: torch.exp(torch.tanh(a)), to_double, X) == 0  # float32: the cast is no no-op
    assert fires(lambda a: torch.exp(torch.tanh(a)), to_double, X.double()) == 1


def test_a_pattern_dropout_whose_p_is_captured_only_there_keeps_its_place():
    def pattern(x, p: float):
        return torch.exp(F.dropout(torch.tanh(x), p=p, training=False))

    rule = Rule.from_functions(pattern, lambda x, p: torch.exp(torch.tanh(x)), name="exp_drop_tanh")
    assert rule.compiled.identities == {}
    assert fires(lambda a: torch.exp(torch.tanh(a)), rule, X) == 0
    assert fires(lambda a: torch.exp(F.dropout(torch.tanh(a), 0.2, False)), rule, X) == 1


def test_contiguous_is_an_identity_only_of_a_value_that_is_contiguous_already():
    """A view after contiguous() works where a view of the transposed value raises: looking past
    it would make the rewritten program raise."""
    flatten = Rule.from_functions(lambda x: torch.exp(torch.tanh(x).view(-1)),
                                  lambda x: torch.tanh(x).view(-1).exp(), name="exp_tanh_view")
    assert fires(lambda a: torch.exp(torch.tanh(a).contiguous().view(-1)), flatten, X) == 1
    assert fires(lambda a: torch.exp(torch.tanh(a.t()).contiguous().view(-1)), flatten, X) == 0


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


def test_what_metadata_answers_is_a_value_attribute_or_method():
    from fxrewrite.canon import METADATA_ATTRIBUTES, METADATA_METHODS, VALUE_ATTRIBUTES, VALUE_METHODS

    assert METADATA_ATTRIBUTES < VALUE_ATTRIBUTES and METADATA_METHODS < VALUE_METHODS
    fake = torch._subclasses.FakeTensorMode().from_tensor(torch.ones(2, 3))
    for name in METADATA_ATTRIBUTES:
        getattr(fake, name)  # answered without data
    for name in METADATA_METHODS:
        getattr(fake, name)()


def test_an_aten_graph_is_one_that_calls_an_overload():
    from fxrewrite.canon import is_aten_graph

    traced = torch.fx.symbolic_trace(lambda x: x.relu() + 1).graph
    exported = torch.export.export(torch.nn.ReLU(), (torch.ones(2),)).graph
    assert (is_aten_graph(traced.nodes), is_aten_graph(exported.nodes)) == (False, True)
