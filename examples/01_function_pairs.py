"""Algebraic rules written as pairs of Python functions, applied to a small model.

Run:  python examples/01_function_pairs.py
It prints the model's code before and after, and the per-rule report.
"""

from __future__ import annotations

import torch

import fxrewrite


@fxrewrite.rule
def double_neg(x):
    "Replaces neg(neg(x)) by x."
    return torch.neg(torch.neg(x))


@double_neg.replacement
def double_neg(x):
    return x


@fxrewrite.rule
def relu_relu(x):
    "Replaces relu(relu(x)) by relu(x)."
    return torch.relu(torch.relu(x))


@relu_relu.replacement
def relu_relu(x):
    return torch.relu(x)


def mul_add_pattern(x, y, z):
    return x * y + z


def mul_add_replacement(x, y, z):
    return torch.addcmul(z, x, y)


#: Replaces x * y + z by addcmul(z, x, y) (tensors only: y never binds a Python number).
mul_add = fxrewrite.Rule.from_functions(mul_add_pattern, mul_add_replacement, name="mul_add")

RULES = fxrewrite.RuleSet([double_neg, relu_relu, mul_add])


class Model(torch.nn.Module):
    def forward(self, x, y, bias):
        h = torch.relu(torch.relu(torch.neg(torch.neg(x))))
        scaled = h * 0.5 + bias  # a literal: mul_add must not fire here
        return y * h + scaled  # commutative: matches x * y + z with x=h, y=y


def main() -> fxrewrite.RewriteResult:
    model = Model()
    inputs = (torch.randn(4, 8), torch.randn(4, 8), torch.randn(8))
    result = fxrewrite.rewrite(model, RULES)
    print("before:", torch.fx.symbolic_trace(model).code)
    print("after:", result.code)
    print(result.report)
    torch.testing.assert_close(result.module(*inputs), model(*inputs))
    print("outputs match")
    return result


if __name__ == "__main__":
    main()
