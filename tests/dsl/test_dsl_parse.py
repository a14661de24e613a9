"""fxrewrite.dsl.parse: rule-file text → frozen AST, and syntax errors that point at the problem."""

from __future__ import annotations

import attrs
import pytest

import fxrewrite
from fxrewrite.dsl import ast
from fxrewrite.dsl.parse import MAX_DEPTH, parse
from fxrewrite.errors import FxRewriteError, RuleSyntaxError


def only_rule(text: str) -> ast.RuleDef:
    (rule,) = parse(text).rules
    return rule


def pattern_of(expr_text: str) -> ast.Expr:
    return only_rule(f"rule r:\n    {expr_text} => y\n").rewrite.pattern


def shape(node: object) -> object:
    """The AST without spans, as nested tuples, for compact comparisons."""
    if isinstance(node, tuple):
        return tuple(shape(n) for n in node)
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Literal):
        return node.value
    if isinstance(node, ast.Wildcard):
        return "_"
    if isinstance(node, ast.Node):
        fields = {name: shape(getattr(node, name)) for name in ast.fields(type(node)) if "span" not in name}
        return (type(node).__name__, *fields.values())
    return node


# ---- structure -----------------------------------------------------------------------------------


def test_rule_header_gives_name_doc_and_priority():
    rule = only_rule('rule double_neg "Replaces -(-x) by x." priority 3:\n    torch.neg(torch.neg(x)) => x\n')
    assert (rule.name, rule.doc, rule.priority) == ("double_neg", "Replaces -(-x) by x.", 3)
    assert (rule.span.line, rule.span.column) == (1, 6)


def test_priority_may_be_negative_and_defaults_to_zero():
    assert only_rule("rule r priority -2:\n    torch.neg(x) => x\n").priority == -2
    assert only_rule("rule r:\n    torch.neg(x) => x\n").priority == 0


def test_comments_blank_lines_and_several_rules_per_file():
    text = (
        "# header comment\n\n"
        "rule a:  # trailing comment\n"
        "    torch.neg(x) => x\n"
        "\n"
        "    # comment between body lines\n"
        "# a comment at column 0 does not end the rule\n"
        "    where x.dim() == 2\n"
        "\n\n"
        "rule b:\n"
        "    torch.relu(x) => x"  # no newline at the end of the file
    )
    a, b = parse(text).rules
    assert (a.name, len(a.conditions), b.name) == ("a", 1, "b")


def test_use_lines_give_path_and_alias():
    (use,) = parse("use torch.ops.mylib as mylib\n").uses
    assert (use.path, use.alias) == (("torch", "ops", "mylib"), "mylib")


def test_replacement_may_continue_on_an_indented_line_starting_with_the_arrow():
    rule = only_rule("rule r:\n    torch.neg(x)\n        => x\n")
    assert shape(rule.rewrite) == ("Rewrite", ("Call", ("Attribute", "torch", "neg"), ("x",), ()), "x")


def test_expressions_may_span_indented_lines_inside_brackets():
    rule = only_rule("rule r:\n    torch.add(\n  x,\n\n        # comment\n y) => x\n")
    assert shape(rule.rewrite.pattern) == ("Call", ("Attribute", "torch", "add"), ("x", "y"), ())


def test_let_lines_come_before_the_rewrite_and_where_lines_after():
    rule = only_rule("rule r:\n    let t = x.mT\n    let u = t\n    (t, u) => (x, x)\n    where s: float\n"
                     "    where x.dim() > 1\n")
    assert [let.name for let in rule.lets] == ["t", "u"]
    assert [(c.name, c.type_path) for c in rule.captures] == [("s", ("float",))]
    assert [c.text for c in rule.conditions] == ["x.dim() > 1"]


def test_where_line_with_several_captures():
    rule = only_rule("rule r:\n    bn(conv(x)) => x\n    where conv: nn.Conv2d, bn: nn.BatchNorm2d\n")
    assert [(c.name, c.type_path) for c in rule.captures] == [("conv", ("nn", "Conv2d")), ("bn", ("nn", "BatchNorm2d"))]


def test_where_condition_keeps_its_source_text_on_one_line():
    rule = only_rule("rule r:\n    torch.neg(x) => x\n    where (x.dim() == 2 and\n           x.shape[0] > 1)  # why\n")
    assert rule.conditions[0].text == "(x.dim() == 2 and x.shape[0] > 1)"


# ---- expressions ---------------------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("a + b * c", ("BinOp", "+", "a", ("BinOp", "*", "b", "c"))),
    ("a - b - c", ("BinOp", "-", ("BinOp", "-", "a", "b"), "c")),
    ("-a ** 2", ("UnaryOp", "-", ("BinOp", "**", "a", 2))),
    ("a ** -b", ("BinOp", "**", "a", ("UnaryOp", "-", "b"))),
    ("a @ b / c // d % e", ("BinOp", "%", ("BinOp", "//", ("BinOp", "/", ("BinOp", "@", "a", "b"), "c"), "d"), "e")),
    ("+a", ("UnaryOp", "+", "a")),
    ("a.b.c(d, e=1)", ("Call", ("Attribute", ("Attribute", "a", "b"), "c"), ("d",), (("Keyword", "e", 1),))),
    ("f()(x)", ("Call", ("Call", "f", (), ()), ("x",), ())),
])
def test_operators_bind_like_python(text, expected):
    assert shape(pattern_of(text)) == expected


def test_comparisons_chain_and_boolean_operators_bind_like_python():
    rule = only_rule("rule r:\n    torch.neg(x) => x\n    where not a < b <= c or d in e and f is not None\n")
    assert shape(rule.conditions[0].expr) == (
        "BoolOp", "or", (
            ("Not", ("Compare", "a", ("<", "<="), ("b", "c"))),
            ("BoolOp", "and", (("Compare", "d", ("in",), ("e",)), ("Compare", "f", ("is not",), (None,)))),
        ),
    )


def test_and_or_flatten_into_one_node():
    rule = only_rule("rule r:\n    torch.neg(x) => x\n    where a and b and c\n")
    assert shape(rule.conditions[0].expr) == ("BoolOp", "and", ("a", "b", "c"))


@pytest.mark.parametrize("text, expected", [
    ("x[0]", ("Subscript", "x", 0)),
    ("x[0,]", ("Subscript", "x", ("TupleExpr", (0,)))),
    ("x[..., 1:2]", ("Subscript", "x", ("TupleExpr", (..., ("Slice", 1, 2, None))))),
    ("x[::2, :, 1:]", ("Subscript", "x", ("TupleExpr", (("Slice", None, None, 2), ("Slice", None, None, None),
                                                         ("Slice", 1, None, None))))),
    ("x[-1]", ("Subscript", "x", ("UnaryOp", "-", 1))),
])
def test_subscripts_slices_and_ellipsis(text, expected):
    assert shape(pattern_of(text)) == expected


@pytest.mark.parametrize("text, expected", [
    ("f(1, 2.5, 1e-3, .5, 'a', \"b\", True, False, None)", (1, 2.5, 1e-3, 0.5, "a", "b", True, False, None)),
    ("f('tab\\there', 'quote\\'s', \"\\\\\")", ("tab\there", "quote's", "\\")),
    ("f((), (a,), (a, b), (a, b,), [], [a, b,])",
     (("TupleExpr", ()), ("TupleExpr", ("a",)), ("TupleExpr", ("a", "b")), ("TupleExpr", ("a", "b")),
      ("ListExpr", ()), ("ListExpr", ("a", "b")))),
])
def test_literals_tuples_and_lists(text, expected):
    assert shape(pattern_of(text))[2] == expected


def test_underscore_is_a_wildcard_and_other_names_are_names():
    assert shape(pattern_of("f(_, x_1, _y)")) == ("Call", "f", ("_", "x_1", "_y"), ())
    assert isinstance(pattern_of("f(_)").args[0], ast.Wildcard)


def test_keywords_of_the_language_are_plain_attribute_names():
    assert shape(pattern_of("torch.where(c, x.where, y)")) == (
        "Call", ("Attribute", "torch", "where"), ("c", ("Attribute", "x", "where"), "y"), ())


def test_spans_point_at_each_node():
    call = pattern_of("torch.neg(xx)")
    assert (call.span.line, call.span.column) == (2, 5)
    assert (call.args[0].span.column, call.args[0].span.end_column) == (15, 17)
    assert call.func.attr_span.column == 11


def test_windows_line_endings_and_tab_indentation():
    (a, b) = parse("rule a:\r\n\ttorch.neg(x) => x\r\n\r\nrule b:\r\n\ttorch.relu(x) => x\r\n").rules
    assert (a.name, b.name) == ("a", "b")


def test_empty_text_and_only_comments_give_an_empty_file():
    assert parse("").rules == () and parse("# nothing\n\n   \n").rules == ()


def test_trailing_whitespace_and_comment_at_the_end_of_the_file():
    assert only_rule("rule a:\n    torch.neg(x) => x\n    ").name == "a"
    assert only_rule("rule a:\n    torch.neg(x) => x\n    # done").name == "a"


def test_ast_nodes_are_frozen_values():
    rule = only_rule("rule a:\n    torch.neg(x) => x\n")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        rule.name = "b"
    assert rule == only_rule("rule a:\n    torch.neg(x) => x\n")


# ---- syntax errors -------------------------------------------------------------------------------


def syntax_error(text: str) -> RuleSyntaxError:
    with pytest.raises(RuleSyntaxError) as info:
        parse(text, source="rules.fxr")
    return info.value


@pytest.mark.parametrize("text, position, sentence", [
    ("rule a\n    torch.neg(x) => x\n", (1, 7), "expected ':' to end the rule header"),
    ("rule a:\ntorch.neg(x) => x\n", (1, 8), "expected the rule body on the next line, indented"),
    ("rule a:\n    torch.relu(x) -> x\n", (2, 20), "the arrow between a pattern and its replacement is '=>', not '->'"),
    ("rule a:\n    torch.relu(x)\n", (2, 18), "expected '=>' followed by the replacement, found the end of the line"),
    ("rule a:\n    torch.relu(x) x\n", (2, 19), "expected '=>' followed by the replacement, found the name 'x'"),
    ("rule a:\n    torch.relu(x) =>\n", (2, 21), "expected an expression, found the end of the line"),
    ("rule a:\n    torch.neg(x) => x\n    torch.relu(x) => x\n", (3, 5),
     "expected a 'where' line or the end of the rule"),
    ("rule a:\n    torch.neg(x) => x\n    let t = x\n", (3, 5), "expected a 'where' line or the end of the rule"),
    ("use torch.ops.mylib\n", (1, 20), "expected 'as' and an alias"),
    ("  torch.neg(x) => x\n", (1, 3), "expected a 'rule' or 'use' line starting at column 0"),
    ("rule a:\n    torch.relu(x => x\n", (2, 19),
     "the '(' at line 2, column 15 is never closed: expected ')' before '=>'."),
    ("rule a:\n    torch.add(x y) => x\n", (2, 17),
     "expected an operator, ')', ',' or '=', found the name 'y'; is a ',' missing before it?"),
    ("rule a:\n    torch.neg(x + (y * 2) => x\n", (2, 27),
     "the '(' at line 2, column 14 is never closed: expected ')' before '=>'."),
    ("rule a:\n    let t = torch.neg(x\n    t => t\n", (3, 5),
     "the '(' at line 2, column 22 is never closed: expected ')' before the name 't'."),
    ("rule a:\n    torch.neg(x) => torch.cat([x, x), 0)\n", (2, 36),
     "the '[' at line 2, column 31 is closed with ')'; close it with ']'."),
    ("rule a:\n    torch.add(x, '(') => x\n    where x.dim() in (1, 2]\n", (3, 27),
     "the '(' at line 3, column 22 is closed with ']'; close it with ')'."),
    ("rule a:\n    torch.relu(x) => $x\n", (2, 22), "unexpected character '$'"),
    ("rule a:\n    torch.relu(x) => 'abc\n", (2, 22), "a string must end on the line it starts"),
    ("rule a priority:\n    torch.neg(x) => x\n", (1, 16), "expected '-' or an integer, found ':'"),
    ("rule 1a:\n    torch.neg(x) => x\n", (1, 6), "expected a name, found '1'"),
    ("rule a:\n    torch.relu(x) => x\n    where x.dim() ==\n", (3, 21), "expected an expression"),
    ("rule a:\n    torch.relu(x, y=1, y=2) => x\n", (2, 24), "keyword argument 'y' is given twice"),
    ("rule a:\n    torch.relu(y=1, x) => x\n", (2, 21), "a positional argument follows a keyword argument"),
    ("rule a:\n    torch.relu(x) => 'a\\q'\n", (2, 24), "unknown escape '\\q' in a string"),
    ("rule a:\n    torch.relu(x) => x * 1" + "0" * 200 + "\n", (2, 26), "integer literal with 201 digits"),
])
def test_syntax_errors_say_where_and_what_was_expected(text, position, sentence):
    error = syntax_error(text)
    line, column = position
    assert error.msg.startswith(f"rules.fxr:{line}:{column}: ")
    assert sentence in error.msg
    assert (error.lineno, error.offset) == position


def test_syntax_error_carries_the_line_a_caret_and_the_syntax_error_attributes():
    error = syntax_error("rule a:\n    torch.relu(x) x\n")
    assert isinstance(error, SyntaxError) and isinstance(error, FxRewriteError)
    assert (error.filename, error.lineno, error.offset, error.text) == ("rules.fxr", 2, 19, "    torch.relu(x) x")
    assert error.msg == (
        "rules.fxr:2:19: expected '=>' followed by the replacement, found the name 'x'.\n"
        "    torch.relu(x) x\n"
        "                  ^"
    )
    assert error.msg in str(error)


def test_unclosed_bracket_is_reported_where_it_opens():
    error = syntax_error("rule a:\n    torch.relu(x => x\n\nrule b:\n    torch.neg(x) => x\n")
    assert "the '(' at line 2, column 15 is never closed" in error.msg
    error = syntax_error("rule a:\n    torch.add(x,\n")
    assert error.msg.startswith("rules.fxr:2:14: '(' is never closed; add ')' where its expression ends.")
    error = syntax_error("rule a:\n    torch.add(x,\nrule b:\n")
    assert error.msg.startswith("rules.fxr:2:14: '(' is never closed; add ')'")


def test_expressions_nested_too_deeply_are_refused_without_exhausting_the_stack():
    deep = "x" + "+(x" * (MAX_DEPTH + 5) + ")" * (MAX_DEPTH + 5)
    error = syntax_error(f"rule a:\n    {deep} => x\n")
    assert f"nested more than {MAX_DEPTH} levels deep" in error.msg
    very_deep = "torch.neg(" * 5000 + "x" + ")" * 5000
    assert "nested more than" in syntax_error(f"rule a:\n    {very_deep} => x\n").msg


def test_redundant_parentheses_do_not_count_as_nesting():
    rule = only_rule("rule a:\n    " + "(" * 500 + "torch.neg(x)" + ")" * 500 + " => x\n")
    assert shape(rule.rewrite.pattern) == ("Call", ("Attribute", "torch", "neg"), ("x",), ())


def test_caret_is_placed_under_tabs_as_tabs():
    error = syntax_error("rule a:\n\ttorch.relu(x)\tx\n")
    assert error.msg.endswith("    torch.relu(x)\tx\n                 \t^")


# ---- malformed .fxr files, loaded from disk -------------------------------------------------------------
#
# The tests above cover headers, arrows, brackets, strings, escapes, keywords, numbers and nesting
# depth; tests/dsl/test_dsl_errors.py and test_dsl_trust.py cover names, variables, captures, let
# lines and the allow-list. These are the syntax categories they leave out, loaded from files
# through load_rules (so the message names the file).

MALFORMED = [
    ("rule a:\n", (1, 8), "expected the rule body on the next line, indented"),
    ("rule a:", (1, 8), "found the end of the file"),
    ("rule", (1, 5), "expected a name, found the end of the file"),
    ("rule :\n    torch.relu(x) => x\n", (1, 6), "expected a name, found ':'"),
    ("rule a:\n    torch.relu(x)) => x\n", (2, 18), "expected '=>' followed by the replacement, found ')'"),
    ("rule a:\n    where x: int\n    torch.relu(x) => x\n", (2, 11), "expected an operator, '=>' or an indented line"),
    ("rule a:\n    torch.relu(x) => x => x\n", (2, 24), "found '=>'"),
    ("rule a:\n    x = torch.relu(y)\n", (2, 7), "found '=', which assigns nothing here"),
    ("rule a:\n    torch.relu(x) => (lambda y: y)(x)\n", (2, 30), "found the name 'y'"),
    ("rule a:\n    (y := torch.relu(x)) => x\n", (2, 8), "found ':'"),
    ("rule a:\n    torch.relu(\u00e9) => \u00e9\n", (2, 16), "unexpected character '\u00e9'"),
    ('rule a """doc""":\n    torch.relu(x) => x\n', (1, 10), "expected ':' to end the rule header"),
    ("rule a:\n    torch.relu(x) \\\n => x\n", (2, 19), "unexpected character '\\\\'"),
    ("rule a:\n    torch.relu(x) => x; import os\n", (2, 23), "unexpected character ';'"),
    ("@rule\nrule a:\n    torch.relu(x) => x\n", (1, 1), "expected a 'rule' or 'use' line starting at column 0"),
    ("import os\n", (1, 1), "expected a 'rule' or 'use' line starting at column 0, found the name 'import'"),
    ("def a(x):\n    return x\n", (1, 1), "found the name 'def'"),
    ("rule a:\n    torch.cat(*x) => x\n", (2, 15), "found '*'"),
    ("rule a:\n    torch.relu(x) => {x: 1}\n", (2, 22), "unexpected character '{'"),
    ("rule a:\n    torch.relu(x) => f'{x}'\n", (2, 23), "found ''{x}''"),
    ("rule a:\n    torch.cat([y for y in x]) => x\n", (2, 18), "found the name 'for'"),
    ("rule a:\n    torch.neg(x\x00) => x\n", (2, 16), "unexpected character '\\x00'"),
]


@pytest.mark.parametrize("text, position, fragment", MALFORMED)
def test_malformed_rule_file_is_a_syntax_error_pointing_at_the_file(tmp_path, text, position, fragment):
    path = tmp_path / "bad.fxr"
    path.write_bytes(text.encode("utf-8"))
    with pytest.raises(RuleSyntaxError) as info:
        fxrewrite.load_rules(tmp_path)
    error = info.value
    assert isinstance(error, SyntaxError) and isinstance(error, FxRewriteError)
    assert (error.filename, error.lineno, error.offset) == (str(path), *position)
    assert str(error).startswith(f"{path}:{position[0]}:{position[1]}: ")
    assert fragment in str(error)
    assert str(error).splitlines()[-1].strip() == "^"


@pytest.mark.parametrize("newline", ["\r\n", "\r"], ids=["crlf", "cr"])
def test_rule_files_with_windows_or_classic_mac_line_endings_load(tmp_path, newline):
    text = "# comment\nrule a:\n    torch.neg(torch.neg(x)) => x\n".replace("\n", newline)
    (tmp_path / "eol.fxr").write_bytes(text.encode())
    assert fxrewrite.load_rules(tmp_path).names == ("a",)


def test_rule_file_saved_with_a_byte_order_mark_loads(tmp_path):
    (tmp_path / "bom.fxr").write_bytes("\ufeffrule a:\n    torch.neg(torch.neg(x)) => x\n".encode("utf-8"))
    assert fxrewrite.load_rules(tmp_path).names == ("a",)
