"""fxrewrite.canon.schema: Calls read through the ATen schema: spelled as torch.export records them."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F

from fxrewrite.canon import (
    aten_spelling,
)

X = torch.randn(3, 4)
Y = torch.randn(3, 4)


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
