"""fxrewrite.canon.lining: Two calls of one op lined up: keyword, positional and default arguments
compare by meaning."""

from __future__ import annotations

import torch
from _helpers import assert_rewrite_sound

from fxrewrite import Rule, rewrite

X = torch.randn(3, 4)
Y = torch.randn(3, 4)


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
