"""fxrewrite.canon.identities: Identities: each is seen through where its condition holds, and only
there; identities written in a pattern."""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from _canon import EXP_TANH, fires

from fxrewrite import Rule, explain, rewrite
from fxrewrite.canon import (
    identity_refusal,
    identity_source,
)

X = torch.randn(3, 4)
Y = torch.randn(3, 4)


# ---- matching by meaning: identities ------------------------------------------------------------
# Each identity is seen through where its condition holds, and only there: the second test of
# each pair fails if the condition is dropped.


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
