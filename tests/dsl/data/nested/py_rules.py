"""A Python rule file: a Rule, a RuleSet and a _pattern/_replacement pair (loader tests)."""

import torch

from fxrewrite import Rule, RuleSet


def _sub_self(x):
    return x - x


def _zeros(x):
    return torch.zeros_like(x)


sub_self = Rule.from_functions(_sub_self, _zeros, name="sub_self")


def exp_log_pattern(x):
    return torch.exp(torch.log(x))


def exp_log_replacement(x):
    return x


more = RuleSet([
    Rule.from_functions(lambda x: torch.sigmoid(x) * x, lambda x: torch.nn.functional.silu(x), name="silu"),
    sub_self,  # the same object again: loaded once
])
