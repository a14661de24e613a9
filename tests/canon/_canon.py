"""What the tests of fxrewrite.canon share: a rule that fires through identities, and counting
how often a rule fires on a program (checked for lint and numbers)."""

from __future__ import annotations

import torch
from _helpers import assert_rewrite_sound

from fxrewrite import Rule, rewrite

EXP_TANH = Rule.from_functions(lambda x: torch.exp(torch.tanh(x)), lambda x: torch.tanh(x).exp(), name="exp_tanh")


def fires(program, rule, *inputs, shapes=True) -> int:
    """How often ``rule`` fires on ``program``; checks lint and numbers on ``inputs``."""
    result = rewrite(program, rule, example_inputs=inputs if shapes else None)
    torch.manual_seed(0)
    assert_rewrite_sound(program, result, *inputs)
    return result.report.applied[rule.name]


R4 = torch.randn(2, 3, 4, 5)


def exp_of(op):
    return Rule.from_functions(lambda x: torch.exp(op(x)), lambda x: op(x).exp(), name="exp_op")
