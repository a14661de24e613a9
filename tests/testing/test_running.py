"""fxrewrite.testing._running, asked directly: a rule's functions called as a rewrite would call
them (fresh copies, a seeded generator, no autograd), the match its guards see on concrete values,
and the guard harness's generated values against its slow twin, fx's interpreter."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fxrewrite import Rule
from fxrewrite.errors import FxRewriteError
from fxrewrite.testing import _running
from fxrewrite.testing._running import GuardHarness, GuardRaised, call_rule_function, match_for


def rule(pattern, name="r"):
    return Rule.from_functions(pattern, pattern, name=name)


# -- call_rule_function ------------------------------------------------------------------------------


def test_an_in_place_change_stays_in_the_copies_it_returns():
    def scale(x):
        return x.mul_(2)

    x = torch.ones(3)
    result, copies = call_rule_function(scale, {"x": x})
    assert torch.equal(x, torch.ones(3))  # the caller's tensor is untouched
    assert torch.equal(result, torch.full((3,), 2.0)) and copies["x"] is result


def test_a_module_the_call_trains_is_a_copy():
    def normalize(x, bn):
        return bn(x)

    bn = nn.BatchNorm1d(2).train()
    _, copies = call_rule_function(normalize, {"x": torch.randn(4, 2), "bn": bn})
    assert int(bn.num_batches_tracked) == 0 and int(copies["bn"].num_batches_tracked) == 1


def test_random_ops_are_seeded_alike_per_seed_and_the_global_generator_is_left_as_it_was():
    def noisy(x):
        return x + torch.rand_like(x)

    x = torch.zeros(5)
    state = torch.get_rng_state()
    first, again, other = (call_rule_function(noisy, {"x": x}, rng_seed=s)[0] for s in (0, 0, 1))
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert torch.equal(torch.get_rng_state(), state)


def test_the_generator_is_restored_when_the_call_raises():
    def broken(x):
        torch.rand(3)
        raise KeyError("inside the pattern")

    state = torch.get_rng_state()
    with pytest.raises(KeyError, match="inside the pattern"):
        call_rule_function(broken, {"x": torch.zeros(1)})
    assert torch.equal(torch.get_rng_state(), state)


def test_the_call_runs_without_autograd():
    result, _ = call_rule_function(lambda x: x * 3, {"x": torch.ones(2, requires_grad=True)})
    assert not result.requires_grad and result.grad_fn is None


# -- the match the guards see ----------------------------------------------------------------------------


def test_a_match_shows_the_values_shapes_dtypes_and_captures():
    def pattern(x, lin: nn.Linear, s: float):
        return lin(x) * s

    lin = nn.Linear(3, 2)
    m = match_for(rule(pattern), {"x": torch.ones(4, 3, dtype=torch.float32), "lin": lin, "s": 0.5})
    assert m["x"].shape == (4, 3) and m["x"].dtype == torch.float32 and m["x"].dim() == 2
    assert m["s"] == 0.5 and m["lin"] is lin and m.node("lin").op == "call_module"


def test_a_match_for_a_0_dim_and_an_empty_input():
    m = match_for(rule(lambda x, y: x + y), {"x": torch.tensor(2.0), "y": torch.zeros(0, 3)})
    assert m["x"].shape == () and m["y"].shape == (0, 3)


def test_the_match_raises_what_the_pattern_raises():
    with pytest.raises(RuntimeError, match="size of tensor"):
        match_for(rule(lambda x, y: x + y), {"x": torch.ones(2), "y": torch.ones(3)})


def test_a_harness_used_again_shows_the_latest_inputs_only():
    harness = GuardHarness(rule(lambda x: torch.relu(x)))
    harness.match({"x": torch.ones(2, 2)})
    m = harness.match({"x": torch.ones(5, dtype=torch.float64)})
    assert m["x"].shape == (5,) and m["x"].dtype == torch.float64


def test_the_harness_leaves_the_callers_inputs_as_they_were():
    def pattern(x, bn: nn.BatchNorm1d):
        return torch.relu(bn(x))

    bn = nn.BatchNorm1d(2).train()  # a call in training mode updates its running statistics
    m = GuardHarness(rule(pattern)).match({"x": torch.randn(4, 2), "bn": bn})
    assert int(bn.num_batches_tracked) == 0 and bool((bn.running_mean == 0).all()) and m["bn"] is bn


def _recorded(harness: GuardHarness, inputs) -> list:
    harness.match(inputs)
    return [node.meta["val"] for node in harness.gm.graph.nodes]


@pytest.mark.parametrize("pattern, inputs", [
    (lambda x: torch.relu(x) * 2, {"x": torch.tensor([-1.0, float("nan"), 3.0])}),
    (lambda x, y: (torch.matmul(x, y), x.sum(-1)), {"x": torch.ones(2, 3), "y": torch.ones(3, 4)}),
    (lambda x: x.transpose(0, 1).contiguous(), {"x": torch.arange(6).reshape(2, 3)}),
], ids=["elementwise", "two-outputs", "layout"])
def test_the_fast_guard_values_are_the_interpreters(pattern, inputs, monkeypatch):
    harness = GuardHarness(rule(pattern))
    fast = _recorded(harness, inputs)
    monkeypatch.setattr(_running, "FAST_GUARD_VALUES", False)
    slow = _recorded(harness, inputs)
    assert len(fast) == len(slow) > 2
    for a, b in zip(fast, slow):
        torch.testing.assert_close(a, b, equal_nan=True, rtol=0, atol=0)


def test_a_raised_guard_carries_its_inputs_and_error():
    error = KeyError("shape")
    raised = GuardRaised("guard 'g' raised KeyError", {"x": 1}, error)
    assert isinstance(raised, FxRewriteError) and isinstance(raised, RuntimeError)
    assert raised.inputs == {"x": 1} and raised.error is error and str(raised) == "guard 'g' raised KeyError"
