"""Rules and rule sets: construction, validation and the errors a bad rule gets."""

from __future__ import annotations

import re

import pytest
import torch
from _helpers import assert_consistent, assert_rewrite_sound, traced_net
from _helpers import neg_neg as neg_neg_rule

import fxrewrite
from fxrewrite import Rule, RuleDefinitionError, RuleSet, RuleWarning, rewrite


def neg_neg(x):
    """Replaces neg(neg(x)) by x."""
    return torch.neg(torch.neg(x))


def identity(x):
    return x


def test_from_functions_records_name_doc_and_origin():
    r = Rule.from_functions(neg_neg, identity)
    assert r.name == "neg_neg"
    assert r.doc == "Replaces neg(neg(x)) by x."
    assert re.fullmatch(r".*test_rule\.py:\d+", r.origin)
    assert r.priority == 0 and r.where == ()


def test_explicit_name_doc_priority_override_defaults():
    r = Rule.from_functions(neg_neg, identity, name="nn", doc="Replaces it.", priority=3)
    assert (r.name, r.doc, r.priority) == ("nn", "Replaces it.", 3)


def test_decorator_form_builds_a_rule_named_after_the_pattern():
    @fxrewrite.rule
    def double_neg(x):
        return torch.neg(torch.neg(x))

    @double_neg.replacement
    def double_neg(x):  # the decorator form rebinds the name to the Rule
        return x

    assert isinstance(double_neg, Rule) and double_neg.name == "double_neg"


def test_decorator_with_options_passes_them_to_the_rule():
    @fxrewrite.rule(priority=5, where=lambda m: True, doc="Replaces relu(relu(x)) by relu(x).")
    def relu_relu(x):
        return torch.relu(torch.relu(x))

    @relu_relu.replacement
    def relu_relu(x):
        return torch.relu(x)

    assert relu_relu.priority == 5 and len(relu_relu.where) == 1
    assert relu_relu.doc.startswith("Replaces")


def test_replacement_missing_a_pattern_parameter_is_an_error():
    def pattern(x, y):
        return torch.add(x, y)

    with pytest.raises(RuleDefinitionError, match=r"rule 'pattern' .*does not accept the pattern parameter\(s\) y"):
        Rule.from_functions(pattern, lambda x: x)


def test_replacement_with_a_parameter_the_pattern_lacks_is_an_error():
    with pytest.raises(RuleDefinitionError, match=r"replacement parameter 'z' is not a pattern parameter"):
        Rule.from_functions(neg_neg, lambda x, z: x)


def test_replacement_taking_kwargs_accepts_every_pattern_parameter():
    r = Rule.from_functions(neg_neg, lambda **kw: kw["x"])
    assert r.name == "neg_neg"


def test_pattern_with_control_flow_names_rule_origin_and_fix():
    def branchy(x):
        if x.sum() > 0:
            return torch.relu(x)
        return x

    with pytest.raises(RuleDefinitionError) as info:
        Rule.from_functions(branchy, lambda x: x)
    message = str(info.value)
    assert "rule 'branchy'" in message and "test_rule.py:" in message
    assert "cannot be traced" in message and "where=" in message and "torch.fx.wrap" in message


def test_pattern_with_unsupported_builtin_is_an_error():
    def uses_len(x):
        return x.view(len(x), -1)

    with pytest.raises(RuleDefinitionError, match="cannot be traced"):
        Rule.from_functions(uses_len, lambda x: x)


def test_pattern_returning_a_parameter_is_an_error():
    with pytest.raises(RuleDefinitionError, match="returns its parameter 'x' unchanged"):
        Rule.from_functions(identity, identity)


def test_pattern_with_unused_parameter_is_an_error():
    def pattern(x, y):
        return torch.relu(x)

    with pytest.raises(RuleDefinitionError, match="parameter 'y' is never used"):
        Rule.from_functions(pattern, lambda x, y: x)


def test_pattern_with_dead_computation_is_an_error():
    def pattern(x):
        torch.sin(x)
        return torch.relu(x)

    with pytest.raises(RuleDefinitionError, match="never uses the result"):
        Rule.from_functions(pattern, lambda x: x)


def test_unsupported_annotation_is_an_error():
    def pattern(x: list):
        return torch.relu(x)

    with pytest.raises(RuleDefinitionError, match="annotated <class 'list'>"):
        Rule.from_functions(pattern, lambda x: x)


def test_unused_module_capture_is_an_error():
    def pattern(x, lin: torch.nn.Linear):
        return torch.relu(x)

    with pytest.raises(RuleDefinitionError, match="module capture 'lin' is never called"):
        Rule.from_functions(pattern, lambda x, lin: x)


def test_module_capture_attribute_read_in_pattern_is_an_error():
    def pattern(x, lin: torch.nn.Linear):
        return lin(x) + lin.bias

    with pytest.raises(RuleDefinitionError, match=r"reads 'lin.bias'"):
        Rule.from_functions(pattern, lambda x, lin: x)


def test_pattern_with_star_args_is_an_error():
    def pattern(*xs):
        return torch.relu(xs[0])

    with pytest.raises(RuleDefinitionError, match="plain named parameters"):
        Rule.from_functions(pattern, lambda *xs: xs[0])


def test_priority_must_be_an_int():
    with pytest.raises(RuleDefinitionError, match="priority must be an int"):
        Rule.from_functions(neg_neg, identity, priority="high")


def test_where_must_be_callable():
    with pytest.raises(RuleDefinitionError, match="where= must be a callable"):
        Rule.from_functions(neg_neg, identity, where=("x > 0",))


def test_ruleset_rejects_duplicate_names_naming_both_origins():
    a = Rule.from_functions(neg_neg, identity, origin="a.py:1")
    b = Rule.from_functions(neg_neg, identity, origin="b.py:7")
    with pytest.raises(RuleDefinitionError, match=r"two rules are named 'neg_neg': one at a.py:1, one at b.py:7"):
        RuleSet([a, b])


def test_ruleset_keeps_the_given_order_whatever_the_priorities():
    low = Rule.from_functions(neg_neg, identity, name="low")
    high = Rule.from_functions(neg_neg, identity, name="high", priority=2)
    relu = Rule.from_functions(lambda x: torch.relu(torch.relu(x)), lambda x: torch.relu(x), name="relu")
    rs = RuleSet([low, high, relu])
    assert [r.name for r in rs] == ["low", "high", "relu"]
    assert rs.names == ("low", "high", "relu") and "relu" in rs and rs["relu"] is relu
    assert [r.anchor_key for r in rs] == [("aten", "neg"), ("aten", "neg"), ("aten", "relu")]


def test_ruleset_lookup_of_missing_rule_lists_the_names():
    rs = RuleSet([Rule.from_functions(neg_neg, identity)])
    with pytest.raises(KeyError, match="no rule named 'nope'"):
        rs["nope"]


def test_ruleset_rejects_non_rules():
    with pytest.raises(RuleDefinitionError, match="RuleSet takes Rule objects"):
        RuleSet(["neg_neg"])


def test_rules_are_accepted_as_rule_ruleset_or_iterable():
    r = Rule.from_functions(neg_neg, identity)
    for rules in (r, RuleSet([r]), [r], (r for r in [r])):
        result = fxrewrite.rewrite(lambda a: torch.neg(torch.neg(a)), rules)
        assert result.report.applied == {"neg_neg": 1}
        assert_rewrite_sound(lambda a: torch.neg(torch.neg(a)), result, torch.randn(3))


def test_pattern_without_replacement_is_a_clear_error():
    @fxrewrite.rule
    def unfinished(x):
        return torch.relu(x)

    with pytest.raises(RuleDefinitionError,
                       match=r"awaiting its replacement: decorate the replacement function with "
                             r"@unfinished.replacement"):
        fxrewrite.rewrite(lambda a: torch.relu(a), unfinished)


def test_error_types_are_importable_from_the_package_and_subclass_builtins():
    assert issubclass(fxrewrite.RuleDefinitionError, ValueError)
    assert issubclass(fxrewrite.RuleSyntaxError, SyntaxError)
    assert issubclass(fxrewrite.RewriteError, RuntimeError)
    assert issubclass(fxrewrite.DidNotConverge, fxrewrite.RewriteError)
    assert issubclass(fxrewrite.NotEquivalent, AssertionError)
    for name in ("RuleDefinitionError", "RuleSyntaxError", "RuleLoadError", "RewriteError", "DidNotConverge",
                 "MetadataError", "NotEquivalent"):
        assert issubclass(getattr(fxrewrite, name), fxrewrite.FxRewriteError)


def test_replacement_ignoring_a_bound_tensor_warns_with_origin():
    def pattern(x, y):
        return x + y * 0

    with pytest.warns(fxrewrite.RuleWarning,
                      match=r"rule 'pattern' \(.*test_rule.py:\d+\): the replacement ignores 'y'"):
        Rule.from_functions(pattern, lambda x, y: x)


def test_replacement_reading_every_tensor_does_not_warn(recwarn):
    Rule.from_functions(lambda x, y: x + y * 0, lambda x, y: x + torch.zeros_like(y))
    assert not [w for w in recwarn if issubclass(w.category, fxrewrite.RuleWarning)]


@pytest.mark.parametrize("pattern, problem", [
    (lambda x: x.relu_(), "in-place method '.relu_()'"),
    (lambda x, y: torch.add(x, y, out=x), "out= argument"),
    (lambda x: torch.nn.functional.relu(x, inplace=True), "inplace=True"),
    (lambda x: torch.relu_(x), "in-place function relu_"),
    (lambda x: torch.ops.aten.relu_.default(x), "mutating op aten.relu_.default"),
])
def test_impure_patterns_are_refused(pattern, problem):
    with pytest.raises(RuleDefinitionError, match="patterns must be pure computations") as info:
        Rule.from_functions(pattern, lambda **kw: None)
    assert problem in str(info.value)


# ---- bad rule definitions: replacements, rule sets ----------------------------------------------------------


def test_duplicate_rule_names_in_a_rule_set_name_both_places():
    first = neg_neg_rule(lambda x: x, name="same")
    second = Rule.from_functions(lambda x: torch.abs(torch.abs(x)), lambda x: torch.abs(x), name="same")
    with pytest.raises(RuleDefinitionError, match=r"two rules are named 'same': one at .*_helpers.py:\d+, "
                                                  r"one at .*test_rule.py:\d+; rename one of them"):
        fxrewrite.RuleSet([first, second])
    with pytest.raises(RuleDefinitionError, match="two rules are named 'same'"):
        rewrite(lambda a: a, [first, second])


@pytest.mark.parametrize("replacement, fragment", [
    (lambda y: y, "replacement parameter 'y' is not a pattern parameter (the pattern has x)"),
    (lambda: None, "the replacement does not accept the pattern parameter(s) x"),
    (lambda *xs: xs[0], "replacement parameter 'xs' cannot be passed by name"),
    (lambda x, y: x, "replacement parameter 'y' is not a pattern parameter"),
    (pow, "replacement parameter 'base' is not a pattern parameter"),
    (42, "pattern and replacement must be functions"),
])
def test_replacement_with_the_wrong_signature_is_refused_when_the_rule_is_built(replacement, fragment):
    with pytest.raises(RuleDefinitionError) as info:
        neg_neg_rule(replacement)
    assert str(info.value).startswith("rule 'neg_neg' (") and fragment in str(info.value)


def test_replacement_with_extra_parameters_that_have_defaults_is_accepted():
    r = neg_neg_rule(lambda x, scale=1.0: x * scale)
    model, gm = traced_net()
    assert_consistent(rewrite(gm, r).module, model)


def test_replacement_ignoring_a_bound_tensor_is_a_rule_warning():
    with pytest.warns(RuleWarning, match=r"the replacement ignores 'y', which the pattern binds to a tensor"):
        Rule.from_functions(lambda x, y: x * y, lambda x, y: x, name="drop_y")


def test_pattern_without_replacement_and_non_rules_are_refused():
    @fxrewrite.rule
    def half(x):
        return torch.neg(torch.neg(x))

    with pytest.raises(RuleDefinitionError,
                       match=r"awaiting its replacement: decorate the replacement function with @half.replacement"):
        rewrite(lambda a: a, half)
    with pytest.raises(RuleDefinitionError, match="RuleSet takes Rule objects, got 'neg_neg' \\(str\\)"):
        rewrite(lambda a: a, ["neg_neg"])
    with pytest.raises(RuleDefinitionError, match="expected a Rule, a RuleSet or an iterable of rules, got 3"):
        rewrite(lambda a: a, 3)


def _closure_reader(x, y):
    scale = 2.0

    def inner(z):
        return z * scale + y

    return inner(x)


def test_names_read_from_raw_bytecode_are_those_dis_reads():
    """The quick bytecode reader against its slow twin (dis) on every rule of the library, its
    patterns too, and on closures (cells, free variables)."""
    import importlib

    from _helpers import standard_rules

    rule_module = importlib.import_module("fxrewrite.rule")
    functions = [f for r in standard_rules() for f in (r.pattern, r.replacement)] + [_closure_reader]
    for fn in functions:
        code = fn.__code__
        expected = rule_module._names_read_by_dis(code)
        if rule_module._QUICK_BYTECODE:
            assert rule_module._names_read_quickly(code) == expected, fn
        assert rule_module._names_read(fn) == expected
    assert rule_module._names_read(_closure_reader) == {"x", "y", "inner", "scale"}
