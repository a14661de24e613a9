"""`let` graphs load in time linear in their size, or fail with an error naming the let and its
line: no let can use itself or a later let, chains of any length neither recurse nor repeat work,
and constants built through lets stay bounded. Cost is measured in steps (nodes visited by the
compiler), not in seconds."""

from __future__ import annotations

import signal
from contextlib import contextmanager

import pytest
import torch
from _helpers import assert_rewrite_sound

from fxrewrite import RuleDefinitionError, rewrite
from fxrewrite.dsl import ast, parse_rules


class StepBudgetExceeded(Exception):
    pass


@contextmanager
def counted_steps(monkeypatch, budget: int):
    """Count the expression nodes the compiler visits (every walk asks ``ast.children``); fail
    fast once ``budget`` is exceeded, so an exponential walk fails instead of hanging."""
    steps = [0]
    original = ast.children

    def counting(node):
        steps[0] += 1
        if steps[0] > budget:
            raise StepBudgetExceeded(f"more than {budget} steps")
        return original(node)

    monkeypatch.setattr(ast, "children", counting)
    yield steps


@contextmanager
def hang_guard(seconds: int = 60):
    """Turn a hang (a loop that never ends) into a failure; not a timing assertion."""
    def alarm(signum, frame):
        raise TimeoutError(f"still running after {seconds} s: a hang")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def doubling_chain(n: int, base: str = "x + 1", use: str = "torch.neg({last}) => {last}") -> str:
    """``let a0 = base``, ``let a{i} = a{i-1} + a{i-1}``: each let uses the one above twice."""
    lines = ["rule chain:", f"    let a0 = {base}"]
    lines += [f"    let a{i} = a{i - 1} + a{i - 1}" for i in range(1, n)]
    lines.append("    " + use.format(last=f"a{n - 1}"))
    return "\n".join(lines) + "\n"


def refused(text: str) -> str:
    with hang_guard(), pytest.raises(RuleDefinitionError) as info:
        parse_rules(text, source="lets.fxr")
    return str(info.value)


# ---- references that cannot be followed -------------------------------------------------------------


def test_a_let_that_uses_itself_is_refused_naming_the_let_and_its_line():
    message = refused("rule r:\n    torch.neg(x) => x\n" "\nrule s:\n    let a = a + 1\n    torch.neg(a) => a\n")
    assert message.startswith("lets.fxr:5:13: rule 's': let 'a' (line 5) uses itself")
    assert "a let can only use the lets above it" in message


def test_a_let_that_uses_a_later_let_is_refused():
    message = refused("rule r:\n    let a = b + 1\n    let b = a * 2\n    torch.neg(b) => b\n")
    assert message.startswith("lets.fxr:2:13: rule 'r': let 'a' (line 2) uses 'b', which is defined by a later let "
                              "(line 3)")
    assert "move 'let b' above this line" in message


def test_a_cycle_through_three_lets_is_refused_at_its_first_forward_use():
    text = "rule r:\n    let a = torch.relu(c)\n    let b = a + x\n    let c = b * 2\n    torch.neg(c) => x\n"
    assert "let 'a' (line 2) uses 'c', which is defined by a later let (line 4)" in refused(text)


def test_a_self_reference_inside_a_call_of_the_pattern_is_refused():
    # the pattern checks that a call mentions a variable: that check must not follow the loop
    assert "let 'a' (line 2) uses itself" in refused("rule r:\n    let a = torch.relu(a)\n    torch.neg(a, 1) => x\n")


# ---- long chains -------------------------------------------------------------------------------------


def test_chained_lets_over_a_constant_cost_steps_linear_in_their_number(monkeypatch):
    """Twenty lets over a constant, each using the one above twice, took 2**20 steps."""
    counts = {}
    for n in (20, 40, 80):
        # torch.neg takes one tensor: refused when traced
        with counted_steps(monkeypatch, budget=200 * n) as steps, pytest.raises(RuleDefinitionError):
            parse_rules(doubling_chain(n, base="1", use="torch.neg(x, {last}) => x"))
        counts[n] = steps[0]
    assert counts[40] <= 2.5 * counts[20] and counts[80] <= 2.5 * counts[40], counts


def test_chained_lets_over_a_variable_cost_steps_linear_in_their_number(monkeypatch):
    counts = {}
    for n in (50, 100, 200):
        with counted_steps(monkeypatch, budget=200 * n) as steps:
            parse_rules(doubling_chain(n))
        counts[n] = steps[0]
    assert counts[100] <= 2.5 * counts[50] and counts[200] <= 2.5 * counts[100], counts


def test_a_thousand_chained_lets_load_without_recursion():
    (rule,) = parse_rules(doubling_chain(1000))
    adds = [n for n in rule.compiled.graph.nodes if n.op == "call_function" and "add" in str(n.target)]
    assert len(adds) == 1000  # x + 1, then one add per let: every let traced once


def test_a_chain_of_lets_in_the_replacement_is_spliced_without_recursion():
    n = 300
    lets = ["    let r0 = x * 1"] + [f"    let r{i} = r{i - 1} * 1" for i in range(1, n)]
    text = "rule long_identity:\n" + "\n".join(lets) + f"\n    torch.neg(torch.neg(x)) => r{n - 1}\n"
    (rule,) = parse_rules(text)

    def model(t):
        return torch.neg(torch.neg(t)) + 1

    result = rewrite(model, rule)
    result.module.graph.lint()
    assert result.report.applied == {"long_identity": 1}
    t = torch.randn(3)
    torch.testing.assert_close(result.module(t), model(t))
    muls = [node for node in result.module.graph.nodes if "mul" in str(node.target)]
    assert len(muls) == n


def test_a_long_chain_in_the_pattern_matches_the_same_chain_in_a_model():
    n = 60
    (rule,) = parse_rules(doubling_chain(n, use="torch.neg({last}) => {last} * -1"))

    def model(t):
        a = t + 1
        for _ in range(n - 1):
            a = a + a
        return torch.neg(a)

    result = rewrite(model, rule)
    result.module.graph.lint()
    assert result.report.applied == {"chain": 1}
    t = torch.randn(4) / 2 ** n
    torch.testing.assert_close(result.module(t), model(t))


# ---- what lets evaluate ------------------------------------------------------------------------------


def test_the_pattern_takes_its_variables_in_the_order_of_their_first_use_through_lets():
    (rule,) = parse_rules("rule r:\n    let a = y * 2\n    let b = x + 1\n    torch.neg(b + a) => b - a\n")
    assert [p.name for p in rule.compiled.params] == ["x", "y"]


def test_each_let_is_one_value_in_the_pattern_however_often_it_is_used():
    (rule,) = parse_rules("rule r:\n    let t = torch.relu(x)\n    let u = t * t\n    u + t => u\n")
    relus = [n for n in rule.compiled.graph.nodes if n.target is torch.relu]
    assert len(relus) == 1 and len(relus[0].users) == 2


def test_lets_used_only_by_the_pattern_are_not_evaluated_in_the_replacement():
    calls = []

    def spy(t):
        calls.append(t)
        return t

    text = "rule r:\n    let p = torch.neg(x)\n    let q = spy(x)\n    torch.neg(p) => q\n"
    (rule,) = parse_rules(text, names={"spy": spy})
    assert calls == []
    result = rewrite(lambda t: torch.neg(torch.neg(t)), rule)
    assert len(calls) == 1
    assert_rewrite_sound(lambda t: torch.neg(torch.neg(t)), result, torch.randn(3))


@pytest.mark.parametrize("let, expected", [
    ("[a0, a0]", "would hold"),  # 2**n elements counting nested ones
    ("(a0, a0, a0)", "would hold"),
    ("[a0]", "nested"),  # 200 levels deep
])
def test_containers_nested_through_lets_stay_bounded(let, expected, monkeypatch):
    n = 200 if let == "[a0]" else 40
    lines = ["rule r:", "    let a0 = [1]"] + [f"    let a{i} = {let.replace('a0', f'a{i - 1}')}" for i in range(1, n)]
    text = "\n".join(lines) + f"\n    x + a{n - 1} => x\n"
    with counted_steps(monkeypatch, budget=10_000):
        message = refused(text)
    assert expected in message and "lets.fxr:" in message


def test_use_lines_are_added_to_one_scope_not_copied_per_line(monkeypatch):
    """Each use line used to copy the whole scope (quadratic in the number of use lines)."""
    from fxrewrite.dsl import scope as dsl_scope

    built = []
    original = dsl_scope.Scope.__init__

    def counting(self, *args, **kwargs):
        built.append(1)
        original(self, *args, **kwargs)

    monkeypatch.setattr(dsl_scope.Scope, "__init__", counting)
    text = "".join(f"use torch.neg as n{i}\n" for i in range(300)) + "rule r:\n    n299(x) + 1 => x\n"
    (rule,) = parse_rules(text)
    assert rule.compiled.anchor.target is not None and len(built) <= 2


@pytest.mark.parametrize("call", ["math.comb(10000000, 5000000)", "math.factorial(100000)", "math.perm(10**6, 10**5)"])
def test_a_huge_integer_function_in_a_replacement_is_refused_before_it_is_computed(call):
    import torch

    import fxrewrite

    rules = fxrewrite.parse_rules(f"rule r:\n    torch.neg(torch.neg(x)) => x * {call}\n")
    with pytest.raises(fxrewrite.RewriteError, match=r"would have about \d+ bits; at most 65536 are allowed"):
        fxrewrite.rewrite(lambda a: torch.neg(torch.neg(a)), rules)
