"""fxrewrite.canon.ops: Op keys and names: every spelling of an op is one op (traced and exported graphs, with
numbers), the commutative table is true, dtype conversions, the Tensor-API tables, ATen graphs."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from _helpers import assert_rewrite_sound
from hypothesis import given
from hypothesis import strategies as st

from fxrewrite import Rule, find_matches, rewrite
from fxrewrite.canon import (
    COMMUTATIVE,
    canonical_arguments,
    canonical_name,
    dtype_conversion,
    op_key_of,
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
