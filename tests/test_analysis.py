"""fxrewrite.analyze and `fxrewrite lint`: self-loops, cycles, shadowed rules, before running."""

from __future__ import annotations

import io
import textwrap
from pathlib import Path

import attrs
import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F

import fxrewrite
from fxrewrite import Finding, Rule, RuleSet, analyze
from fxrewrite.analysis import canonical_form
from fxrewrite.cli import main

R = Rule.from_functions


def kinds(findings):
    return [(f.severity, f.kind, f.rules) for f in findings]


# -- self-loops ------------------------------------------------------------------------------------


def test_two_spellings_of_one_op_are_a_self_loop_that_the_driver_stops():
    rule = R(lambda x: F.relu(x, inplace=False), lambda x: torch.relu(x), name="relu_spelling", origin="r.py:3")
    [finding] = analyze([rule])
    # the driver applies a rewrite that changes nothing once per match: useless, but no failure
    assert (finding.severity, finding.kind, finding.rules) == ("warning", "self-loop", ("relu_spelling",))
    assert "r.py:3" in finding.message and "torch.relu(x)" in finding.message
    assert "does nothing useful: remove it" in finding.message
    result = fxrewrite.rewrite(lambda a: F.relu(a) + 1, rule)
    result.module.graph.lint()
    x = torch.randn(4)
    torch.testing.assert_close(result.module(x), F.relu(x) + 1)


def test_swapping_operands_of_a_commutative_op_is_a_self_loop():
    rule = R(lambda x, y: x + y, lambda x, y: y + x, name="add_comm")
    assert kinds(analyze([rule])) == [("warning", "self-loop", ("add_comm",))]


def test_a_replacement_containing_its_pattern_is_a_self_loop():
    rule = R(lambda x: torch.neg(x), lambda x: torch.neg(torch.neg(torch.neg(x))), name="neg3")
    [finding] = analyze([rule])
    assert finding.kind == "self-loop" and finding.severity == "error"
    assert "matches its own replacement" in finding.message


def test_a_guard_that_refuses_the_rewritten_graph_breaks_the_loop():
    # relu(x) -> relu(x.float()): the new relu reads a float32 value, which the guard refuses
    rule = R(lambda x: torch.relu(x), lambda x: torch.relu(x.to(torch.float32)), name="relu_float",
             where=lambda m: m["x"].dtype != torch.float32)
    assert analyze([rule]) == []


def test_a_guard_that_holds_on_the_rewritten_graph_keeps_the_loop():
    rule = R(lambda x: torch.exp(x), lambda x: torch.exp(x) * 1, name="exp_times_one",
             where=lambda m: m["x"].dtype == torch.float32)
    assert kinds(analyze([rule])) == [("error", "self-loop", ("exp_times_one",))]


def test_a_loop_behind_an_undecidable_guard_is_a_warning():
    rule = R(lambda x: torch.exp(x), lambda x: torch.exp(x) * 1, name="exp_odd", where=lambda m: m["x"].shape[0] == 99)
    [finding] = analyze([rule])
    assert (finding.severity, finding.kind) == ("warning", "self-loop")
    assert "could not decide" in finding.message


def test_a_multi_output_rule_that_respells_its_outputs_is_a_self_loop():
    def pattern(x, y):
        return x + y, x - y

    def replacement(x, y):
        return torch.add(x, y), torch.sub(x, y)

    [finding] = analyze([R(pattern, replacement, name="add_sub_pair")])
    assert (finding.kind, finding.rules) == ("self-loop", ("add_sub_pair",))


def test_rules_that_shrink_their_pattern_are_not_loops():
    rules = [R(lambda x: torch.relu(torch.relu(x)), lambda x: torch.relu(x), name="relu_relu"),
             R(lambda x: torch.neg(torch.neg(x)), lambda x: x, name="double_neg")]
    assert analyze(rules) == []


# -- cycles ----------------------------------------------------------------------------------------


def test_two_rules_that_undo_each_other_are_a_cycle():
    rules = [R(lambda x: x * 2, lambda x: x + x, name="mul_two", origin="a.py:1"),
             R(lambda x: x + x, lambda x: x * 2, name="add_self", origin="a.py:2")]
    [finding] = analyze(rules)
    assert (finding.severity, finding.kind, finding.rules) == ("error", "cycle", ("add_self", "mul_two"))
    assert "a.py:1" in finding.message and "a.py:2" in finding.message


def test_three_rules_in_a_ring_are_a_cycle():
    rules = [R(lambda x: torch.exp(x), lambda x: torch.sigmoid(x), name="e2s"),
             R(lambda x: torch.sigmoid(x), lambda x: torch.tanh(x), name="s2t"),
             R(lambda x: torch.tanh(x), lambda x: torch.exp(x), name="t2e")]
    assert kinds(analyze(rules)) == [("error", "cycle", ("e2s", "s2t", "t2e"))]


def test_a_chain_that_ends_is_not_a_cycle():
    rules = [R(lambda x: torch.exp(x), lambda x: torch.sigmoid(x), name="e2s"),
             R(lambda x: torch.sigmoid(x), lambda x: torch.tanh(x), name="s2t")]
    assert analyze(rules) == []


def test_a_guard_can_break_a_cycle():
    # only int64 additions become multiplications; the multiplication of a float stays
    rules = [R(lambda x: x * 2, lambda x: x + x, name="mul_two", where=lambda m: m["x"].dtype.is_floating_point),
             R(lambda x: x + x, lambda x: x * 2, name="add_self", where=lambda m: not m["x"].dtype.is_floating_point)]
    assert analyze(rules) == []


# -- shadowing -------------------------------------------------------------------------------------


def test_a_higher_priority_rule_shadows_a_rule_it_always_preempts():
    high = R(lambda x: torch.relu(x), lambda x: torch.clamp(x, min=0), name="relu_clamp", priority=5, origin="h.py:1")
    low = R(lambda x: torch.relu(torch.relu(x)), lambda x: torch.relu(x), name="relu_relu", origin="l.py:2")
    [finding] = analyze([high, low])
    assert (finding.severity, finding.kind, finding.rules) == ("warning", "shadowed", ("relu_relu", "relu_clamp"))
    assert "h.py:1" in finding.message and "l.py:2" in finding.message and "priority 5 > 0" in finding.message


def test_a_guarded_higher_rule_does_not_shadow():
    high = R(lambda x: torch.relu(x), lambda x: torch.clamp(x, min=0), name="relu_clamp", priority=5,
             where=lambda m: m["x"].dim() == 4)
    low = R(lambda x: torch.relu(torch.relu(x)), lambda x: torch.relu(x), name="relu_relu")
    assert analyze([high, low]) == []


def test_a_lower_priority_rule_does_not_shadow():
    high = R(lambda x: torch.relu(x), lambda x: torch.clamp(x, min=0), name="relu_clamp", priority=-1)
    low = R(lambda x: torch.relu(torch.relu(x)), lambda x: torch.relu(x), name="relu_relu")
    assert analyze([high, low]) == []


def test_a_rule_for_one_constant_does_not_shadow_a_rule_for_every_constant():
    def mul_any(x, c: float):
        return x * c

    def mul_any_replacement(x, c: float):
        return torch.mul(x, c) + 0

    one = R(lambda x: x * 2.0, lambda x: x + x, name="mul_two", priority=1)
    every = R(mul_any, mul_any_replacement, name="mul_any", domain={"literals": {"c": [2.0]}})  # probed with 2.0
    assert [f for f in analyze([one, every]) if f.kind == "shadowed"] == []


def test_an_earlier_rule_with_the_same_pattern_shadows_a_later_one():
    first = R(lambda x: torch.abs(torch.abs(x)), lambda x: torch.abs(x), name="abs_abs")
    second = R(lambda x: torch.abs(torch.abs(x)), lambda x: x.abs(), name="abs_abs_again")
    assert kinds(analyze([first, second])) == [("warning", "shadowed", ("abs_abs_again", "abs_abs"))]


# -- what cannot be analysed -----------------------------------------------------------------------


def test_a_replacement_that_cannot_be_applied_is_a_note():
    rule = R(lambda x: torch.exp(x), lambda x: torch.exp(x) if x.sum() > 0 else x, name="branches")
    [finding] = analyze([rule])
    assert (finding.severity, finding.kind, finding.rules) == ("note", "not-analysed", ("branches",))
    assert "not analysed" in finding.message


# -- the shipped library ---------------------------------------------------------------------------


@pytest.mark.slow
def test_the_shipped_library_has_no_loops():
    findings = analyze(fxrewrite.load_rules())
    loops = [str(f) for f in findings if f.kind in ("self-loop", "cycle")]
    assert loops == []
    assert not [f for f in findings if f.severity == "error"]


# -- value types and canonical form ----------------------------------------------------------------


def test_findings_are_frozen_and_sorted_errors_first():
    rules = [R(lambda x: torch.relu(x), lambda x: torch.clamp(x, min=0), name="relu_clamp", priority=5),
             R(lambda x: torch.relu(torch.relu(x)), lambda x: torch.relu(x), name="relu_relu"),
             R(lambda x: torch.exp(x), lambda x: torch.exp(x) * 1, name="exp_times_one")]
    findings = analyze(rules)
    assert [f.severity for f in findings] == ["error", "warning"]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        findings[0].kind = "other"
    assert str(findings[0]).startswith("error: self-loop: rule 'exp_times_one'")


def test_canonical_form_identifies_spellings_and_operand_orders():
    a = fx.symbolic_trace(lambda x, y: F.relu(x + y, inplace=False)).graph
    b = fx.symbolic_trace(lambda x, y: torch.relu(torch.add(y, x))).graph
    c = fx.symbolic_trace(lambda x, y: torch.relu(x - y)).graph
    d = fx.symbolic_trace(lambda x, y: torch.relu(y - x)).graph
    assert canonical_form(a) == canonical_form(b)
    assert canonical_form(c) != canonical_form(d)
    assert canonical_form(fx.symbolic_trace(lambda x: x.sum(1)).graph) == \
        canonical_form(fx.symbolic_trace(lambda x: torch.sum(x, dim=1)).graph)


def test_analyze_takes_a_single_rule_or_a_ruleset():
    rule = R(lambda x, y: x + y, lambda x, y: y + x, name="add_comm")
    assert analyze(rule) == analyze(fxrewrite.RuleSet([rule]))
    assert isinstance(analyze(rule)[0], Finding)


def test_analyze_rejects_what_is_not_rules():
    with pytest.raises(fxrewrite.RuleDefinitionError, match="expected a Rule"):
        analyze(42)


# -- fxrewrite lint --------------------------------------------------------------------------------


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_lint_exits_1_on_a_loop_and_names_the_rule_file(tmp_path):
    path = write(tmp_path, "loop.fxr", """\
        rule neg_thrice:
            torch.neg(x) => torch.neg(torch.neg(torch.neg(x)))
        """)
    out = io.StringIO()
    assert main(["lint", str(path)], out=out) == 1
    text = out.getvalue()
    assert "error: self-loop: rule 'neg_thrice'" in text and f"{path}:1" in text
    assert "1 rule(s): 1 error(s), 0 warning(s), 0 note(s)" in text


def test_lint_exits_0_on_a_rule_that_rewrites_to_itself(tmp_path):
    path = write(tmp_path, "noop.fxr", """\
        rule relu_spelling:
            F.relu(x, inplace=False) => torch.relu(x)
        """)
    out = io.StringIO()
    assert main(["lint", str(path)], out=out) == 0
    assert "warning: self-loop: rule 'relu_spelling'" in out.getvalue()


def test_lint_exits_0_on_warnings_only(tmp_path):
    path = write(tmp_path, "shadow.fxr", """\
        rule relu_clamp priority 5:
            torch.relu(x) => torch.clamp(x, min=0)

        rule relu_relu:
            torch.relu(torch.relu(x)) => torch.relu(x)
        """)
    out = io.StringIO()
    assert main(["lint", str(path)], out=out) == 0
    assert "warning: shadowed: rule 'relu_relu'" in out.getvalue()


def test_lint_finds_a_cycle_across_files(tmp_path):
    one = write(tmp_path, "one.fxr", "rule mul_two:\n    x * 2 => x + x\n")
    two = write(tmp_path, "two.fxr", "rule add_self:\n    x + x => x * 2\n")
    out = io.StringIO()
    assert main(["lint", str(one), str(two)], out=out) == 1
    text = out.getvalue()
    assert "error: cycle: rules" in text and "undo each other" in text
    assert f"{one}:1" in text and f"{two}:1" in text


@pytest.mark.slow
def test_the_shipped_library_with_the_examples_rules_shadows_no_rule():
    """Rules compose: no rule of the library or of examples/*_rules is hidden by another (the
    library once re-spelled k.transpose(-1, -2) under example 07's Hugging Face rule)."""
    examples = Path(__file__).resolve().parent.parent / "examples"
    rules = fxrewrite.load_rules()
    for folder in sorted(examples.glob("*_rules")):  # 08_rules restates two library rules under their names
        rules = rules + fxrewrite.RuleSet([r for r in fxrewrite.load_rules(folder) if r.name not in rules.names])
    findings = analyze(rules)
    assert [str(f) for f in findings if f.kind == "shadowed"] == []
    assert not [f for f in findings if f.severity == "error"]


@pytest.mark.slow
def test_lint_of_the_shipped_library_exits_0():
    out = io.StringIO()
    assert main(["lint"], out=out) == 0
    assert " 0 error(s)" in out.getvalue()


def test_lint_of_a_missing_path_is_an_error(tmp_path, capsys):
    assert main(["lint", str(tmp_path / "nope.fxr")]) == 2
    assert "fxrewrite lint: error:" in capsys.readouterr().err


# -- order independence ----------------------------------------------------------------------------


def test_rules_whose_order_changes_the_graph_are_order_dependent():
    from fxrewrite.analysis import order_dependence

    to_add = R(lambda x: x * 2, lambda x: x + x, name="to_add", origin="o.py:1")
    to_float = R(lambda x: x * 2, lambda x: x * 2.0, name="to_float", origin="o.py:2")
    [finding] = order_dependence(lambda a: torch.relu(a * 2), [to_add, to_float], orders=6)
    assert (finding.kind, finding.rules, finding.severity) == ("order-dependent", ("to_add", "to_float"), "warning")
    assert "ends in a different graph" in finding.message and "o.py:1" in finding.message


def test_rules_whose_order_changes_the_numbers_are_an_error():
    from fxrewrite.analysis import order_dependence

    exact = R(lambda x: x / 4, lambda x: x * 0.25, name="div_exact")
    rough = R(lambda x: x / 4, lambda x: x * 0.3, name="div_rough")
    x = torch.tensor([1.0, 2.0, 8.0])
    [finding] = order_dependence(lambda a: a / 4 + 1, [exact, rough], orders=6, check_inputs=(x,))
    assert (finding.rules, finding.severity) == (("div_exact", "div_rough"), "error")
    assert "computes different outputs" in finding.message


def test_independent_rules_and_rules_of_different_priorities_are_not_order_dependent():
    from fxrewrite.analysis import order_dependence

    def model(a):
        return torch.relu(torch.relu(a)) + torch.neg(torch.neg(a)) * 2

    independent = [R(lambda x: torch.relu(torch.relu(x)), lambda x: torch.relu(x), name="relu_relu"),
                   R(lambda x: torch.neg(torch.neg(x)), lambda x: x, name="double_neg")]
    assert order_dependence(model, independent, orders=6, check_inputs=(torch.randn(3),)) == []
    ranked = [R(lambda x: x * 2, lambda x: x + x, name="to_add", priority=1),
              R(lambda x: x * 2, lambda x: x * 2.0, name="to_float")]
    assert order_dependence(model, ranked, orders=6) == []


def test_a_replacement_that_raises_on_its_own_pattern_is_an_error_saying_what_it_raised():
    from fxrewrite.analysis import replacement_raises

    bad = Rule.from_functions(lambda x: torch.relu(x), lambda x: torch.ops.aten.add.Tensor(x), name="short_add")
    rules = RuleSet([bad])
    notes = [f for f in analyze(rules) if f.kind == "not-analysed"]
    assert [f.rules for f in notes] == [("short_add",)]
    found = replacement_raises(notes[0], rules)
    assert (found.kind, found.severity) == ("replacement-raises", "error")
    assert "rule 'short_add'" in found.message and "its replacement raises" in found.message
    unrelated = Finding("loop", ("short_add",), "a message", "warning")
    assert replacement_raises(unrelated, rules) is unrelated


def test_a_module_factory_naming_another_capture_receives_the_module_built_for_it():
    built, received = [], []

    def make_conv():
        built.append(torch.nn.Conv2d(2, 3, 1))
        return built[-1]

    def make_bn(conv):
        received.append(conv)
        return torch.nn.BatchNorm2d(conv.out_channels).eval()

    def conv_bn(x, conv: torch.nn.Conv2d, bn: torch.nn.BatchNorm2d):
        return bn(conv(x))

    rule = R(conv_bn, conv_bn, name="conv_bn_again", domain={"modules": {"bn": make_bn, "conv": make_conv}})
    [finding] = analyze([rule])
    assert (finding.kind, finding.rules) == ("self-loop", ("conv_bn_again",))
    # each BatchNorm fitted to the conv the analysis built for `conv`, none to a conv of its own
    assert received and len(built) == len(received)
    assert all(r is b for r, b in zip(received, built))
