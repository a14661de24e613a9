"""The driver's requeue is complete: what ``rewrite`` returns is a fixed point of its rules.

After each rewrite the driver queues again only the nodes the change event says may have
become matchable (:mod:`fxrewrite.driver`). If it missed one, a rule would still match in the
result, and a second ``rewrite`` with the same rules would change it. The property: on random
programs (values with many users among them) and random rule sets (deletions that move users to
such a value, patterns that read one value twice, rules on several priority levels), the second
rewrite makes no rewrite; and the result computes what the program computes.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.fx as fx
from _helpers import assert_rewrite_sound
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fxrewrite.driver as driver
from fxrewrite import Rule, RuleSet, rewrite

with warnings.catch_warnings():  # plus_zeros ignores its 'a' (the programs' values all have one shape)
    warnings.simplefilter("ignore")
    POOL = {
        "neg_neg": (lambda x: torch.neg(torch.neg(x)), lambda x: x),
        "relu_relu": (lambda x: torch.relu(torch.relu(x)), lambda x: torch.relu(x)),
        "abs_neg": (lambda x: torch.abs(torch.neg(x)), lambda x: torch.abs(x)),
        "neg_sin": (lambda x: torch.neg(torch.sin(x)), lambda x: torch.sin(torch.neg(x))),
        "add_self": (lambda a: a + a, lambda a: a * 2),
        "neg_double": (lambda a: torch.neg(a + a), lambda a: a * -2),
        "sub_self": (lambda a: a - a, lambda a: torch.zeros_like(a)),
        "plus_zeros": (lambda a, b: b + torch.zeros_like(a), lambda a, b: b),
    }
    RULES = {(name, p): Rule.from_functions(*POOL[name], name=name, priority=p) for name in POOL for p in (0, 1)}

X = torch.linspace(-2.0, 2.0, 12).reshape(3, 4)
UNARY = ("neg", "relu", "abs", "sin", "zeros_like")


def _program(plan: list[tuple[str, int, int]]) -> fx.GraphModule:
    """A program of ``plan``'s steps: each reads one or two earlier values (by index, from the
    end when negative), so that the first few values, read by many steps, have many users."""

    def program(x):
        values = [torch.relu(x)]
        for op, i, j in plan:
            a, b = values[i % len(values)], values[j % len(values)]
            if op.startswith("nn"):  # a deletion's match, planted (and what reads its result with its input)
                a, b = torch.neg(torch.neg(a)), a
                op = op[2:] or "id"
            binary = {"add": a + b, "sub": a - b} if op in ("add", "sub") else {}
            values.append(binary[op] if binary else a if op == "id" else getattr(torch, op)(a))
        return sum(values[1:], values[0])

    return fx.symbolic_trace(program)


def _step(draw) -> tuple[str, int, int]:
    index = st.one_of(st.integers(0, 2), st.integers(-4, -1))  # a busy value, or a recent one
    ops = [*UNARY, "neg", "neg", "add", "add", "sub", "nn", "nnadd", "nnsub", "nnneg"]
    return draw(st.sampled_from(ops)), draw(index), draw(index)


@st.composite
def cases(draw) -> tuple[list[tuple[str, int, int]], RuleSet]:
    plan = [_step(draw) for _ in range(draw(st.integers(4, 24)))]
    names = draw(st.lists(st.sampled_from(sorted(POOL)), min_size=1, max_size=len(POOL), unique=True))
    return plan, RuleSet([RULES[name, draw(st.sampled_from((0, 0, 1)))] for name in names])


def assert_fixpoint(gm: fx.GraphModule, rules: RuleSet) -> int:
    """``rewrite`` is sound on ``gm`` and its result is a fixed point of ``rules``; the rewrites made."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first = assert_rewrite_sound(gm, rewrite(gm, rules), X)
        second = rewrite(first.module, rules)
    assert second.report.rewrites == 0, (dict(first.report.applied), dict(second.report.applied), first.code)
    return first.report.rewrites


#: Bounded; derandomized under the ``ci`` profile (tests/conftest.py), fresh examples elsewhere. 40
#: derandomized examples find the busy-value counterexamples below on the driver before the fix.
FIXPOINT = settings(max_examples=60, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.slow
@pytest.mark.parametrize("flag", ["", "PRUNED_REQUEUE", "PLAIN_RULES", "SORTED_FILL"])
@FIXPOINT
@given(case=cases())
def test_the_result_of_rewrite_is_a_fixed_point(flag, case):
    """A second rewrite of the result with the same rules changes nothing; with the driver's fast
    paths, and with each turned off (its slow twin)."""
    plan, rules = case
    with pytest.MonkeyPatch.context() as patch:
        if flag:
            patch.setattr(driver, flag, not getattr(driver, flag))
        assert_fixpoint(_program(plan), rules)


# -- the counterexamples found (the driver before it queued the users a deletion moved, and an input
# -- of the match reading another input) ----------------------------------------------------------

NEG_NEG, NEG_DOUBLE, PLUS_ZEROS, ADD_SELF = (RULES["neg_neg", 0], RULES["neg_double", 0], RULES["plus_zeros", 0],
                                             RULES["add_self", 1])


def _busy(y):
    """Four users of ``y``: more than the largest pattern's nodes."""
    return torch.sin(y) + torch.cos(y) + torch.tanh(y) + torch.exp(y)


def _late_deletion(x):
    """``neg(neg(y))`` matches only once the late ``zeros_like`` reading its inner neg is gone;
    by then ``neg(w)`` was visited, and the deletion makes ``w = y + y`` (``y`` busy): a
    match of ``neg(a + a)`` three users away from the inner neg (the reach is two)."""
    y = torch.relu(x)
    b = torch.neg(y)
    w = torch.neg(b) + y
    return (torch.neg(w) + _busy(y)) + torch.zeros_like(b)


def _higher_level_first(x):
    """``add_self`` (priority 1) visits ``neg(neg(y)) + y`` before ``neg_neg`` (priority 0) makes it ``y + y``."""
    y = torch.relu(x)
    return torch.neg(torch.neg(y)) + y + _busy(y)


def _input_reads_input(x):
    """``plus_zeros`` at the last add frees ``z`` of its other reader: ``neg(y) + z``, an input of
    that match, is also the user of another (``z``), and matches now."""
    y = torch.relu(x)
    z = torch.zeros_like(y)
    return (torch.neg(y) + z) + torch.zeros_like(z)


@pytest.mark.parametrize("flag", ["", "PRUNED_REQUEUE", "PLAIN_RULES", "SORTED_FILL"])
@pytest.mark.parametrize(("program", "rules", "fired"), [
    (_input_reads_input, [PLUS_ZEROS], {"plus_zeros": 2}),
    (_late_deletion, [NEG_NEG, NEG_DOUBLE, PLUS_ZEROS], {"neg_neg": 1, "neg_double": 1, "plus_zeros": 1}),
    (_higher_level_first, [NEG_NEG, ADD_SELF], {"neg_neg": 1, "add_self": 1})])
def test_the_requeue_reaches_what_a_deletion_made_matchable(monkeypatch, flag, program, rules, fired):
    """The counterexamples the property found (the first two: a deletion moving users onto a value
    with many users; the third: an input of the match that reads another input, freed)."""
    if flag:
        monkeypatch.setattr(driver, flag, not getattr(driver, flag))
    gm = fx.symbolic_trace(program)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = assert_rewrite_sound(program, rewrite(gm, RuleSet(rules)), X)
        assert {k: v for k, v in result.report.applied.items() if v} == fired
    assert_fixpoint(gm, RuleSet(rules))


def _sibling_output(x):
    """A deletion moves ``cos`` onto ``y`` (busy); the match of ``(cos(x), sin(x))`` is anchored
    at the ``sin``, another user of ``y``, visited before."""
    y = torch.relu(x)
    return torch.sin(y) + torch.cos(torch.neg(torch.neg(y))) + torch.tanh(y) + torch.exp(y) + torch.abs(y)


def test_a_multi_output_match_anchored_at_another_user_of_the_busy_value_is_found():
    cos_sin = Rule.from_functions(lambda x: (torch.cos(x), torch.sin(x)),
                                  lambda x: (torch.sin(x + torch.pi / 2), torch.sin(x)), name="cos_sin")
    rules = RuleSet([NEG_NEG, cos_sin])
    assert rules["cos_sin"].compiled.is_multi_output
    gm = fx.symbolic_trace(_sibling_output)
    result = assert_rewrite_sound(_sibling_output, rewrite(gm, rules), X)
    assert dict(result.report.applied) == {"neg_neg": 1, "cos_sin": 1}
    assert_fixpoint(gm, rules)


@pytest.mark.xfail(strict=True, reason="known hole: a disconnected multi-output pattern's anchor, visited before, is "
                   "not queued when a rewrite elsewhere creates its other output")
def test_a_disconnected_multi_output_match_made_by_a_rewrite_elsewhere_is_found():
    """``(cos(w), sin(x))`` shares no value between its outputs: it is anchored at the ``sin``
    (the last output), found through the op index. ``tanh(b) => cos(b)`` (a stand-in, unsound)
    creates the ``cos`` after the ``sin`` was visited; nothing queues the ``sin`` again."""
    disconnected = Rule.from_functions(lambda x, w: (torch.cos(w), torch.sin(x)),
                                       lambda x, w: (torch.cosh(w), torch.sinh(x)), name="disconnected")
    tanh_cos = Rule.from_functions(lambda b: torch.tanh(b), lambda b: torch.cos(b), name="tanh_cos")
    gm = fx.symbolic_trace(lambda a, b: torch.sin(a) + torch.tanh(b))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first = rewrite(gm, RuleSet([disconnected, tanh_cos]))
        assert rewrite(first.module, RuleSet([disconnected, tanh_cos])).report.rewrites == 0
