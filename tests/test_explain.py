"""explain() and find_matches(): why a rule did (not) fire, without rewriting; and the
``fxrewrite explain`` command line."""

from __future__ import annotations

import io

import pytest
import torch
import torch.fx as fx
import torch.nn as nn

import fxrewrite
from fxrewrite import Rule, RuleSet, explain, find_matches
from fxrewrite.cli import main
from fxrewrite.explain import Explanation, Miss, RuleExplanation


def rule(pattern, replacement, name, **kw):
    return Rule.from_functions(pattern, replacement, name=name, **kw)


NEG_NEG = rule(lambda x: torch.neg(torch.neg(x)), lambda x: x, "neg_neg")
RELU_RELU = rule(lambda x: torch.relu(torch.relu(x)), lambda x: torch.relu(x), "relu_relu")


def only_miss(explanation: Explanation, name: str) -> Miss:
    (miss,) = explanation[name].misses
    return miss


# -- each reason, where it is expected --------------------------------------------------------------


def test_op_differs_names_both_ops_and_the_pattern_node():
    r = rule(lambda x: torch.neg(torch.sigmoid(x)), lambda x: -torch.sigmoid(x), "neg_sigmoid")
    miss = only_miss(explain(lambda a: torch.neg(torch.relu(a)), r), "neg_sigmoid")
    assert (miss.graph_node, miss.pattern_node) == ("neg", "sigmoid")
    assert miss.reason == "op differs: pattern has sigmoid, graph has relu"
    assert str(miss) == ("miss at 'neg' (neg = torch.neg(relu)): at pattern node 'sigmoid': "
                         "op differs: pattern has sigmoid, graph has relu")


def test_arguments_that_cannot_be_lined_up_differ_in_arity():
    r = rule(lambda x: torch.relu(torch.sum(x, 1)), lambda x: torch.relu(x.sum(1)), "relu_sum1")
    miss = only_miss(explain(lambda a: torch.relu(a.sum()), r), "relu_sum1")
    assert miss.pattern_node == "sum_1"
    assert miss.reason == "arguments differ: pattern 2 positional, keywords [], graph 1 positional, keywords []"


def test_variable_already_bound_to_another_value():
    square = rule(lambda x: torch.relu(x * x), lambda x: torch.relu(torch.square(x)), "relu_square")
    miss = only_miss(explain(lambda a, b: torch.relu(a * b), square), "relu_square")
    # mul commutes, so both operand orders were tried; each binds x twice, to a and to b
    assert miss.reason in ("'x' is already bound to 'a', here it would be 'b'",
                           "'x' is already bound to 'b', here it would be 'a'")


def test_inner_node_with_a_user_outside_the_match():
    def f(a):
        inner = torch.neg(a)
        return torch.neg(inner) + inner

    explanation = explain(f, NEG_NEG)
    assert explanation["neg_neg"].matches == ()
    first = explanation["neg_neg"].misses[0]
    assert first.graph_node == "neg_1"
    assert first.reason == "'neg' is also used by 'add' outside the match"
    assert str(first) == "miss at 'neg_1' (neg_1 = torch.neg(neg)): 'neg' is also used by 'add' outside the match"


def test_variable_would_bind_a_node_the_match_computes():
    fused = rule(lambda a, b: torch.relu(a) + b, lambda a, b: torch.relu(a) - torch.neg(b), "relu_add")

    def f(x):
        r = torch.relu(x)
        return r + r  # b would bind r, which the match erases

    miss = only_miss(explain(f, fused), "relu_add")
    assert miss.reason == "variable 'b' would bind 'relu', which the match itself computes"


def test_multi_output_match_that_would_create_a_cycle():
    def pattern(x, y):
        a = torch.relu(x)
        return a, a + y

    def replacement(x, y):
        a = torch.relu(x)
        return a, torch.sub(a, torch.neg(y))

    def f(v):
        r = torch.relu(v)
        t = torch.neg(r)  # y binds t, which depends on the match's own output r
        return r + t

    miss = only_miss(explain(f, rule(pattern, replacement, "relu_and_add")), "relu_and_add")
    assert miss.graph_node == "add"
    assert miss.reason == "replacing the match would create a cycle through the graph"


def test_guard_returning_false_is_reported_with_its_source_line():
    wide = rule(lambda x: torch.relu(torch.relu(x)), lambda x: torch.relu(x), "wide",
                where=lambda m: m["x"].shape[-1] >= 8)
    explanation = explain(lambda a: torch.relu(torch.relu(a)), wide, example_inputs=(torch.randn(2, 4),))
    first = explanation["wide"].misses[0]
    assert first.graph_node == "relu_1"
    assert first.reason.startswith(f"guard <lambda> ({__file__}:")
    assert 'where=lambda m: m["x"].shape[-1] >= 8)' in first.reason
    assert first.reason.endswith("returned False")
    assert explain(lambda a: torch.relu(torch.relu(a)), wide, example_inputs=(torch.randn(2, 8),))["wide"].matches \
        == ("relu_1",)


def test_named_guard_is_reported_by_name_and_place():
    def at_least_two_dims(m):
        return m["x"].dim() >= 2

    r = rule(lambda x: torch.relu(torch.relu(x)), lambda x: torch.relu(x), "two_dims", where=at_least_two_dims)
    first = explain(lambda a: torch.relu(torch.relu(a)), r, example_inputs=(torch.randn(4),))["two_dims"].misses[0]
    assert first.reason == (f"guard at_least_two_dims ({__file__}:{at_least_two_dims.__code__.co_firstlineno}) "
                            f"returned False")


class LinearRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        return torch.relu(self.lin(x))


def test_module_class_differs():
    def pattern(x, conv: nn.Conv2d):
        return torch.relu(conv(x))

    miss = only_miss(explain(LinearRelu(), rule(pattern, lambda x, conv: torch.relu(conv(x)), "conv_relu")),
                     "conv_relu")
    assert miss.pattern_node == "conv_1"
    assert miss.reason == "module 'lin' is a Linear, not a Conv2d"


def test_no_candidate_at_all():
    explanation = explain(lambda a: torch.relu(a),
                          rule(lambda x: torch.tanh(x) * 2, lambda x: torch.tanh(x) + torch.tanh(x), "tanh2"))
    tanh2 = explanation["tanh2"]
    assert (tanh2.candidates, tanh2.matches, tanh2.misses) == (0, (), ())
    assert str(tanh2).endswith("no node of the graph computes aten.mul, the op the pattern ends with")


def test_literal_capture_cannot_bind_a_graph_value():
    def pattern(x, s: float):
        return torch.relu(x * s)

    miss = only_miss(explain(lambda a, b: torch.relu(a * b), rule(pattern, lambda x, s: torch.relu(x * s), "scaled")),
                     "scaled")
    assert miss.reason == "'s' is a literal capture and cannot bind node 'b'"  # operands as written: s vs b


def test_variable_cannot_bind_a_constant_and_the_reason_says_how_to_capture_it():
    r = rule(lambda x, y: torch.relu(x * y), lambda x, y: torch.relu(torch.mul(y, x)), "relu_mul")
    miss = only_miss(explain(lambda a: torch.relu(a * 2.0), r), "relu_mul")
    assert miss.pattern_node == "y"
    assert miss.reason == "'y' cannot bind the constant 2.0 (annotate it, e.g. 'y: float')"


@pytest.mark.parametrize("pattern, graph", [
    (lambda x: torch.relu(x * 2.0), lambda a: torch.relu(a * 3.0)),
    (lambda x: torch.relu(torch.sum(x, [0, 1])), lambda a: torch.relu(torch.sum(a, [1]))),
], ids=["literal differs", "sequence length differs"])
def test_literal_differs(pattern, graph):
    explanation = explain(graph, rule(pattern, lambda x: pattern(x) + 0.0, "lit"))
    assert "differs" in explanation["lit"].misses[0].reason or "sequence" in explanation["lit"].misses[0].reason


def test_misses_on_an_exported_graph_name_aten_ops():
    class M(nn.Module):
        def forward(self, a):
            return torch.neg(torch.relu(a))

    gm = torch.export.export(M(), (torch.randn(3),)).module()
    r = rule(lambda x: torch.neg(torch.sigmoid(x)), lambda x: -torch.sigmoid(x), "neg_sigmoid")
    miss = only_miss(explain(gm, r), "neg_sigmoid")
    assert miss.code == "neg = aten.neg.default(relu)"
    assert miss.reason == "op differs: pattern has sigmoid, graph has relu.default"


# -- closest misses ---------------------------------------------------------------------------------


NEG_SIGMOID_RELU = rule(lambda x: torch.neg(torch.sigmoid(torch.relu(x))), lambda x: torch.neg(torch.sigmoid(x.relu())),
                        "nsr")


def three_near_misses(a):
    far = torch.neg(torch.tanh(a))  # fails at the 2nd pattern node
    near = torch.neg(torch.sigmoid(torch.tanh(a)))  # fails at the 3rd
    r = torch.relu(a)
    nearest = torch.neg(torch.sigmoid(r))  # matches, but r is also used outside
    hit = torch.neg(torch.sigmoid(torch.relu(a * 2)))
    return far + near + nearest + r + hit


def test_closest_misses_come_first():
    nsr = explain(three_near_misses, NEG_SIGMOID_RELU)["nsr"]
    assert nsr.candidates == 4 and nsr.matches == ("neg_3",)
    assert [m.graph_node for m in nsr.misses] == ["neg_2", "neg_1", "neg"]
    assert [m.progress for m in nsr.misses][1:] == [2, 1]
    assert nsr.misses[0].progress > nsr.misses[1].progress
    assert nsr.misses[0].reason == "'relu' is also used by 'add_2' outside the match"
    assert nsr.misses[1].reason == "op differs: pattern has relu, graph has tanh"


def test_misses_limits_the_number_shown():
    nsr = explain(three_near_misses, NEG_SIGMOID_RELU, misses=1)["nsr"]
    assert [m.graph_node for m in nsr.misses] == ["neg_2"]
    assert nsr.matches == ("neg_3",)


def test_explanation_reads_as_a_report():
    explanation = explain(three_near_misses, RuleSet([NEG_SIGMOID_RELU, NEG_NEG]), misses=2)
    text = str(explanation)
    assert text.splitlines()[0].startswith("rule nsr (")
    assert text.splitlines()[0].endswith("): 1 match(es) among 4 candidate(s) computing aten.neg")
    assert "  match at 'neg_3'" in text.splitlines()
    assert "rule neg_neg" in text
    assert [r.rule for r in explanation.rules] == ["nsr", "neg_neg"]
    assert isinstance(explanation["nsr"], RuleExplanation)
    with pytest.raises(KeyError, match="no rule named 'other'"):
        explanation["other"]


def test_explain_is_exported_at_top_level():
    assert fxrewrite.explain is explain and fxrewrite.find_matches is find_matches
    assert "Explanation" in fxrewrite.__all__


# -- find_matches -----------------------------------------------------------------------------------


def stacked(a):
    return torch.relu(torch.relu(torch.relu(a))) + torch.neg(torch.neg(a))


def test_find_matches_yields_rule_and_match_in_rule_then_graph_order():
    found = list(find_matches(stacked, RuleSet([NEG_NEG, RELU_RELU])))
    assert [(r.name, m.anchor.name) for r, m in found] == [("neg_neg", "neg_1"), ("relu_relu", "relu_1"),
                                                           ("relu_relu", "relu_2")]
    _, match = found[0]
    assert match.node("x").name == "a" and [n.name for n in match.nodes] == ["neg", "neg_1"]


def test_find_matches_may_overlap():
    # relu(relu(relu(a))) holds two overlapping matches; rewrite() would apply them one after the other.
    anchors = [m.anchor.name for _, m in find_matches(stacked, RELU_RELU)]
    assert anchors == ["relu_1", "relu_2"]


def test_find_matches_does_not_modify_the_target():
    gm = fx.symbolic_trace(stacked)
    code, nodes = gm.code, [n.format_node() for n in gm.graph.nodes]
    found = list(find_matches(gm, RuleSet([NEG_NEG, RELU_RELU]), example_inputs=(torch.randn(2, 3),)))
    assert len(found) == 3
    assert gm.code == code and [n.format_node() for n in gm.graph.nodes] == nodes
    assert not any("val" in n.meta for n in gm.graph.nodes)  # shapes were propagated on a copy
    explain(gm, RuleSet([NEG_NEG, RELU_RELU]), example_inputs=(torch.randn(2, 3),))
    assert gm.code == code and not any("val" in n.meta for n in gm.graph.nodes)


def test_find_matches_skips_matches_a_guard_refuses():
    narrow = rule(lambda x: torch.relu(torch.relu(x)), lambda x: torch.relu(x), "narrow",
                  where=lambda m: m.anchor.name == "relu_2")
    assert [m.anchor.name for _, m in find_matches(stacked, narrow)] == ["relu_2"]


def test_find_matches_reads_shapes_from_an_exported_graph():
    class M(nn.Module):
        def forward(self, a):
            return torch.relu(torch.relu(a))

    gm = torch.export.export(M(), (torch.randn(2, 8),)).module()
    wide = rule(lambda x: torch.relu(torch.relu(x)), lambda x: torch.relu(x), "wide",
                where=lambda m: m["x"].shape[-1] >= 8)
    ((_, match),) = find_matches(gm, wide)
    assert match.anchor.target is torch.ops.aten.relu.default
    assert match["x"].shape == (2, 8)


# -- the command line --------------------------------------------------------------------------------


MODEL_FILE = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        h = torch.relu(torch.relu(self.lin(x)))
        return torch.neg(torch.neg(h)) + torch.neg(h)


def example_inputs():
    return (torch.randn(2, 8),)
'''

RULES_FILE = '''
import torch
from fxrewrite import Rule

relu_relu = Rule.from_functions(lambda x: torch.relu(torch.relu(x)), lambda x: torch.relu(x), name="relu_relu",
                                where=lambda m: m["x"].shape[-1] % 16 == 0)
neg_neg = Rule.from_functions(lambda x: torch.neg(torch.neg(x)), lambda x: x, name="neg_neg")
'''


@pytest.fixture
def files(tmp_path):
    (tmp_path / "model.py").write_text(MODEL_FILE.lstrip())
    (tmp_path / "myrules.py").write_text(RULES_FILE.lstrip())
    return tmp_path


def run_cli(*argv):
    out = io.StringIO()
    code = main(list(argv), out=out)
    return code, out.getvalue()


def test_cli_explain_prints_matches_and_reasons(files):
    code, text = run_cli("explain", f"{files / 'model.py'}:Net", "--rules", str(files / "myrules.py"), "--shapes")
    assert code == 0
    rules_file = files / "myrules.py"
    assert text.splitlines() == [
        f"rule relu_relu ({rules_file}:4): 0 match(es) among 2 candidate(s) computing aten.relu",
        f"  miss at 'relu_1' (relu_1 = torch.relu(relu)): guard <lambda> ({rules_file}:5): "
        f"""where=lambda m: m["x"].shape[-1] % 16 == 0) returned False""",
        "  miss at 'relu' (relu = torch.relu(lin)): at pattern node 'relu': op differs: pattern has relu, "
        "graph has call_module lin",
        f"rule neg_neg ({rules_file}:6): 1 match(es) among 3 candidate(s) computing aten.neg",
        "  match at 'neg_1'",
        "  miss at 'neg' (neg = torch.neg(relu_1)): at pattern node 'neg': op differs: pattern has neg, graph has relu",
        "  miss at 'neg_2' (neg_2 = torch.neg(relu_1)): at pattern node 'neg': op differs: pattern has neg, "
        "graph has relu",
    ]


def test_cli_explain_one_rule_with_fewer_misses(files):
    code, text = run_cli("explain", f"{files / 'model.py'}:Net", "--rules", str(files / "myrules.py"),
                         "--rule", "neg_neg", "--misses", "1")
    assert code == 0
    assert "relu_relu" not in text
    assert text.count("  miss at") == 1 and "  match at 'neg_1'" in text


def test_cli_explain_on_the_exported_graph(files):
    code, text = run_cli("explain", f"{files / 'model.py'}:Net", "--rules", str(files / "myrules.py"), "--export")
    assert code == 0
    assert "rule neg_neg" in text and "  match at 'neg_1'" in text
    assert "(relu_1 = aten.relu.default(relu)): guard <lambda>" in text  # exported graphs carry shapes
    assert "graph has linear.default" in text


def test_cli_explain_loads_a_rules_directory_with_python_and_dsl_files(files):
    rules = files / "rules"
    rules.mkdir()
    (rules / "myrules.py").write_text(RULES_FILE.lstrip())
    (rules / "extra.fxr").write_text("rule neg_relu:\n    torch.neg(torch.relu(x)) => torch.clamp_max(-x, 0.0)\n")
    code, text = run_cli("explain", f"{files / 'model.py'}:Net", "--rules", str(rules), "--shapes")
    assert code == 0
    heads = [line.split(" (")[0] for line in text.splitlines() if line.startswith("rule ")]
    assert heads == ["rule neg_relu", "rule relu_relu", "rule neg_neg"]
    assert "'relu_1' is also used by 'neg_2' outside the match" in text


def test_cli_explain_unknown_rule_is_an_error(files, capsys):
    code, text = run_cli("explain", f"{files / 'model.py'}:Net", "--rules", str(files / "myrules.py"),
                         "--rule", "nope")
    assert code == 2 and text == ""
    assert "no rule named nope" in capsys.readouterr().err


def test_cli_explain_guard_needing_shapes_without_shapes_refuses_and_says_how_to_get_them(files, capsys):
    code, text = run_cli("explain", f"{files / 'model.py'}:Net", "--rules", str(files / "myrules.py"))
    assert code == 0 and capsys.readouterr().err == ""
    rules_file = files / "myrules.py"
    assert (f"  miss at 'relu_1' (relu_1 = torch.relu(relu)): guard <lambda> ({rules_file}:5): "
            f"""where=lambda m: m["x"].shape[-1] % 16 == 0) needs shapes/dtypes and the graph carries no """
            f"shapes/dtypes: pass example_inputs= (command line: --shapes) or rewrite a torch.export graph "
            f"(--export)") in text.splitlines()
    assert text.splitlines()[-1] == ("Guards refused on a graph without shapes/dtypes: add --shapes (shapes from "
                                     "example_inputs() next to the target) or --export.")


# -- explaining against the graph the rest of the rule set leaves ---------------------------------------------------


def relu_dropout_relu(a):
    # an active dropout (training=True): the matcher does not look through it (an inactive one
    # it would), so relu_relu matches only once another rule has removed it
    return torch.relu(torch.nn.functional.dropout(torch.relu(a), 0.5, True)) + torch.neg(torch.neg(a))


NO_DROPOUT = rule(lambda x: torch.nn.functional.dropout(x, 0.5, True), lambda x: x, "no_dropout")


def test_after_explains_the_graph_the_other_rules_leave():
    before = explain(relu_dropout_relu, RELU_RELU)["relu_relu"]
    assert before.matches == ()
    assert any(m.graph_node == "relu_1" and m.reason.endswith("graph has dropout") for m in before.misses)
    after = explain(relu_dropout_relu, RELU_RELU, after=[NO_DROPOUT])["relu_relu"]
    assert after.matches == ("relu_1",)


def test_after_leaves_out_the_rules_being_explained():
    """neg_neg is in `after` too: were it applied first, its match would be gone."""
    explanation = explain(relu_dropout_relu, RuleSet([RELU_RELU, NEG_NEG]), after=[NO_DROPOUT, RELU_RELU, NEG_NEG])
    assert explanation["relu_relu"].matches == ("relu_1",)
    assert explanation["neg_neg"].matches == ("neg_1",)


def test_after_does_not_modify_the_target():
    gm = fx.symbolic_trace(relu_dropout_relu)
    code = gm.code
    explain(gm, RELU_RELU, after=[NO_DROPOUT])
    assert gm.code == code
    x = torch.randn(3)
    torch.manual_seed(0)  # the same dropout mask on both sides
    ours = gm(x)
    torch.manual_seed(0)
    torch.testing.assert_close(ours, relu_dropout_relu(x))
    gm.graph.lint()


def test_after_with_example_inputs_lets_guards_read_shapes():
    wide = rule(lambda x: torch.relu(torch.relu(x)), lambda x: torch.relu(x), "wide",
                where=lambda m: m["x"].shape[-1] >= 8)
    explanation = explain(relu_dropout_relu, wide, after=[NO_DROPOUT], example_inputs=(torch.randn(2, 8),))
    assert explanation["wide"].matches == ("relu_1",)


def test_a_guard_needing_shapes_on_a_graph_without_them_is_a_miss_that_says_how_to_get_them():
    wide = rule(lambda x: torch.relu(torch.relu(x)), lambda x: torch.relu(x), "wide",
                where=lambda m: m["x"].shape[-1] >= 8)
    miss = explain(lambda a: torch.relu(torch.relu(a)), wide)["wide"].misses[0]
    assert miss.graph_node == "relu_1"
    assert "needs shapes/dtypes and the graph carries no shapes/dtypes" in miss.reason
    assert "example_inputs=" in miss.reason and "--shapes" in miss.reason


def test_a_guard_returning_false_on_a_graph_without_shapes_mentions_them():
    def positive_slope(m):
        return False

    r = rule(lambda x: torch.relu(torch.relu(x)), lambda x: torch.relu(x), "r", where=positive_slope)
    bare = explain(lambda a: torch.relu(torch.relu(a)), r)["r"].misses[0].reason
    assert bare.startswith("guard positive_slope (") and "returned False (the graph carries no shapes/dtypes" in bare
    with_shapes = explain(lambda a: torch.relu(torch.relu(a)), r, example_inputs=(torch.randn(3),))
    assert with_shapes["r"].misses[0].reason.endswith("returned False")


def test_the_target_comes_first_and_the_old_order_says_so():
    from fxrewrite import ArgumentError

    rule = Rule.from_functions(lambda x: torch.neg(torch.neg(x)), lambda x: x, name="neg_neg")

    def f(a):
        return torch.neg(torch.neg(a))

    assert explain(target=f, rules=rule)["neg_neg"].matches == explain(f, rule)["neg_neg"].matches == ("neg_1",)
    assert [r.name for r, _ in find_matches(target=f, rules=rule)] == ["neg_neg"]
    for call in (explain, find_matches):
        with pytest.raises(ArgumentError, match=r"the target comes first .*Swap the arguments"):
            result = call(rule, f)
            list(result) if call is find_matches else result


def test_explain_and_rewrite_agree_on_a_match_refused_for_an_in_place_write():
    def program(a):
        x = a * 3.0
        y = torch.neg(x)
        x.mul_(-2)
        return torch.neg(y) + x

    explanation = explain(program, NEG_NEG)["neg_neg"]
    assert explanation.matches == ()
    assert any("written in place by 'mul_'" in m.reason for m in explanation.misses)
    report = fxrewrite.rewrite(program, NEG_NEG).report
    assert report.applied["neg_neg"] == 0 and report.rejected["neg_neg"] == 1
    assert "written in place by 'mul_'" in report.reasons["neg_neg"][0]
