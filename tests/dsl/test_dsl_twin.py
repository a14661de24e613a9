"""A rule written in the DSL and its twin written in Python compile to identical patterns: the
same fx graph, node by node, and the same parameters.

No ``from __future__ import annotations`` here: the twins' annotations must be the classes
themselves, as the DSL sets them (fx prints a placeholder's annotation in the graph).
"""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from fxrewrite import Rule
from fxrewrite.dsl import parse_rules


def double_neg(x):
    return torch.neg(torch.neg(x))


def mul_one(x):
    return x * 1


def add_relu(x, y):
    return torch.relu(x + y)


def softmax_attention(q, k, s: float, v):
    return torch.softmax(q @ k.transpose(-2, -1) * s, dim=-1) @ v


def conv_bn(bn: nn.BatchNorm2d, conv: nn.Conv2d, x):
    return bn(conv(x))


def split_shared(x):
    t = x.transpose(-2, -1)
    return (t.contiguous(), t * 2)


def wildcard(_1, x):
    return torch.where(_1, x, x)


def indexing(x):
    return x[..., 1:3][:, ::2, None][0]


def literals(x, d: torch.dtype, n: int):
    return F.gelu(x.to(d), approximate="tanh").sum(dim=(0, -1), keepdim=True) ** 2 / n - -x.mT.mean([1])


def reflected(x):
    return 1 - 2 * x


TWINS = [
    ("rule double_neg:\n    torch.neg(torch.neg(x)) => x\n", double_neg),
    ("rule mul_one:\n    x * 1 => x\n", mul_one),
    ("rule add_relu:\n    torch.relu(x + y) => torch.ops.mylib.add_relu(x, y)\n"
     "    where x.shape == y.shape and x.dtype == torch.float32\n", add_relu),
    ("rule softmax_attention:\n    torch.softmax(q @ k.transpose(-2, -1) * s, dim=-1) @ v\n"
     "        => F.scaled_dot_product_attention(q, k, v, scale=s)\n    where s: float\n", softmax_attention),
    ("rule conv_bn:\n    bn(conv(x)) => conv(x)\n    where conv: nn.Conv2d, bn: nn.BatchNorm2d\n", conv_bn),
    ("rule split_shared:\n    let t = x.transpose(-2, -1)\n"
     "    (t.contiguous(), t * 2) => (x.mT.contiguous(), x.mT * 2)\n", split_shared),
    ("rule wildcard:\n    torch.where(_, x, x) => x\n", wildcard),
    ("rule indexing:\n    x[..., 1:3][:, ::2, None][0] => x\n", indexing),
    ("rule literals:\n"
     "    F.gelu(x.to(d), approximate='tanh').sum(dim=(0, -1), keepdim=True) ** 2 / n - -x.mT.mean([1]) => x\n"
     "    where d: torch.dtype, n: int\n", literals),
    ("rule reflected:\n    1 - 2 * x => x\n", reflected),
]


def node_summary(graph):
    return [(n.op, n.target, str(n.args), str(n.kwargs), n.type) for n in graph.nodes]


@pytest.mark.parametrize("text, twin", TWINS, ids=[twin.__name__ for _, twin in TWINS])
def test_dsl_rule_and_python_twin_have_identical_pattern_graphs(text, twin):
    (dsl,) = parse_rules(text, source="twins.fxr")
    python = Rule.from_functions(twin, lambda **kw: None, name=twin.__name__)
    assert str(dsl.compiled.graph) == str(python.compiled.graph)
    assert node_summary(dsl.compiled.graph) == node_summary(python.compiled.graph)
    assert dsl.compiled.params == python.compiled.params
    assert dsl.anchor_key == python.anchor_key
