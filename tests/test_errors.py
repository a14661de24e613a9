"""fxrewrite.errors: every error is an FxRewriteError and the builtin whose meaning fits, as the
module's docstring draws the tree, so ``except ValueError`` keeps working for callers who do not
know fxrewrite; a syntax error prints its own message once."""

from __future__ import annotations

import re

import pytest
import torch

import fxrewrite
from fxrewrite import errors

#: The tree the docstring of fxrewrite/errors.py draws: each error and the bases it must have.
TREE = {
    "RuleDefinitionError": (ValueError,),
    "RuleSyntaxError": (SyntaxError,),
    "RuleLoadError": (ImportError,),
    "RewriteError": (RuntimeError,),
    "DidNotConverge": (errors.RewriteError,),
    "ModuleWriteError": (errors.RewriteError,),
    "MetadataError": (LookupError,),
    "TargetError": (ValueError,),
    "ArgumentError": (TypeError, ValueError),
    "Refuse": (),
    "NotEquivalent": (AssertionError,),
}


@pytest.mark.parametrize(("name", "builtins"), sorted(TREE.items()))
def test_each_error_is_an_fxrewrite_error_and_the_builtin_that_fits(name, builtins):
    error = getattr(errors, name)
    assert issubclass(error, errors.FxRewriteError)
    for base in builtins:
        with pytest.raises(base):
            raise error("what happened, where, what to do")


def test_the_tree_in_the_docstring_is_the_tree_of_the_classes():
    drawn = dict(re.findall(r"[├└]── (\w+)\s+(\([\w, ]+\))?", errors.__doc__))
    assert set(drawn) == set(TREE)
    for name, bases in drawn.items():
        named = set(re.findall(r"\w+", bases))
        assert named == {b.__name__ for b in TREE[name] if b.__module__ == "builtins"}, name


def test_every_error_is_exported_and_the_warning_is_a_user_warning():
    assert set(errors.__all__) == {*TREE, "FxRewriteError", "RuleWarning"}
    assert issubclass(errors.RuleWarning, UserWarning) and not issubclass(errors.RuleWarning, errors.FxRewriteError)
    public = set(fxrewrite.__all__)
    assert {name for name in errors.__all__ if name != "ModuleWriteError"} <= public


def test_a_refusal_is_not_an_error_of_any_builtin_kind():
    assert errors.Refuse.__mro__[1:] == (errors.FxRewriteError, Exception, BaseException, object)


def test_a_syntax_error_prints_its_message_without_pythons_location_suffix():
    message = "rules.fxr:2:5: expected '=>'\n    x +\n        ^"
    error = errors.RuleSyntaxError(message)
    assert str(error) == message


def test_a_syntax_error_from_the_parser_carries_file_line_and_caret():
    with pytest.raises(errors.RuleSyntaxError) as caught:
        fxrewrite.parse_rules("rule broken:\n    torch.neg(x) =>\n", source="bad.fxr")
    text = str(caught.value)
    assert text.startswith("bad.fxr:2:") and "^" in text and "(bad.fxr, line" not in text


def test_a_replacement_that_raises_refuse_leaves_the_place_and_reports_the_reason():
    def replacement(x):
        if x.ndim >= 0:
            raise errors.Refuse("not today")
        return x

    rule = fxrewrite.Rule.from_functions(lambda x: torch.neg(torch.neg(x)), replacement, name="never")
    x = torch.randn(3)
    result = fxrewrite.rewrite(lambda a: torch.neg(torch.neg(a)), rule, example_inputs=(x,))
    assert result.report.applied["never"] == 0
    assert result.report.reasons["never"] == ("at 'neg_1': the replacement refused: not today",)
    torch.testing.assert_close(result.module(x), x)
    result.module.graph.lint()
