"""fxrewrite.testing._probing: which (dtype, rank) configurations a rule's pattern runs on, found
before any search by calling it on simple inputs and modules."""

from __future__ import annotations

import itertools

import torch
from torch import nn

from fxrewrite import Rule
from fxrewrite.testing._inputs import plan_inputs


def conv_bn(x, conv: nn.Conv2d, bn: nn.BatchNorm2d):
    return bn(conv(x))


def test_a_factory_naming_another_capture_is_probed_with_the_module_probed_for_it():
    channels = itertools.count(3)  # every conv built has other output channels than the last

    def make_conv():
        return nn.Conv2d(2, next(channels), 1)

    rule = Rule.from_functions(conv_bn, conv_bn, name="conv_bn", domain={
        "dtypes": (torch.float32,), "ranks": (4, 4),
        "modules": {"conv": make_conv, "bn": lambda conv: nn.BatchNorm2d(conv.out_channels).eval()}})
    plan = plan_inputs(rule)
    # a BatchNorm fitted to a conv of its own would not fit the probed conv: the pattern would raise
    assert plan.probe_failure is None and [(c.dtype, c.rank) for c in plan.configs] == [(torch.float32, 4)]


def test_a_pattern_that_runs_on_no_probe_says_why():
    rule = Rule.from_functions(lambda x: torch.linalg.inv(x), lambda x: torch.linalg.inv(x), name="inv",
                               domain={"dtypes": (torch.int64,), "ranks": (2, 2)})
    plan = plan_inputs(rule)
    assert plan.probe_failure is not None and "RuntimeError" in plan.probe_failure


def test_only_the_dtypes_and_ranks_a_pattern_runs_on_are_kept():
    rule = Rule.from_functions(lambda x: torch.matmul(x, x), lambda x: x @ x, name="matmul",
                               domain={"dtypes": (torch.float32, torch.bool), "ranks": (0, 2)})
    configs = {(c.dtype, c.rank) for c in plan_inputs(rule).configs}
    assert configs == {(torch.float32, 1), (torch.float32, 2)}  # no 0-d matmul, no bool matmul on CPU
