"""The lark side of :mod:`fxrewrite.dsl.parse`: the parser built from ``grammar.lark`` (LALR,
positions propagated), its postlexer, the nesting limit and the syntax-error messages.

This is the only module besides :mod:`fxrewrite.dsl._to_ast` (the tree-to-AST transformer)
that imports lark, and :mod:`~fxrewrite.dsl.parse` imports both only when a text is actually
parsed: loading rules from an up-to-date cache (:mod:`fxrewrite._cache`) or Python rule files
never imports lark. Lark trees and errors become AST nodes and
:class:`~fxrewrite.errors.RuleSyntaxError` here, and nothing of lark leaves.

>>> src = ast.SourceText("r.fxr", "rule r:\\n    torch.neg(x) => x\\n")
>>> rule_file(src, max_depth=100).rules[0].name
'r'
"""

from __future__ import annotations

import functools
import importlib.resources
from collections.abc import Iterator
from typing import Any

import lark
from lark import Token
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken, VisitError

from ..errors import RuleSyntaxError
from . import ast
from ._to_ast import ToAst

__all__ = ["rule_file"]

_OPEN = frozenset({"LPAR", "LSQB"})
_CLOSE = frozenset({"RPAR", "RSQB"})


def rule_file(src: ast.SourceText, *, max_depth: int) -> ast.RuleFile:
    """Parse ``src`` into its AST, refusing expressions nested more than ``max_depth`` levels;
    raises :class:`RuleSyntaxError` where it is not a rule file."""
    try:
        tree = _parser().parse(src.text.rstrip(" \t\f"))  # no indented empty line at the very end
    except UnexpectedInput as exc:
        raise _from_lark(src, exc) from None
    except _UnclosedBracket as exc:
        raise src.syntax_error(exc.line, exc.column, f"'{exc.bracket}' is never closed; add "
                                                     f"'{_CLOSING[exc.bracket]}' where its expression ends.") from None
    _check_depth(src, tree, max_depth)
    try:
        return ToAst(src).transform(tree)
    except VisitError as exc:
        raise exc.orig_exc from None  # RuleSyntaxError from a callback, or a bug of ours


@functools.cache
def _parser() -> lark.Lark:
    grammar = importlib.resources.files(__package__).joinpath("grammar.lark").read_text(encoding="utf-8")
    return lark.Lark(grammar, parser="lalr", propagate_positions=True, maybe_placeholders=True, postlex=_Lines())


# ---- line structure ----------------------------------------------------------------------------


class _UnclosedBracket(Exception):
    def __init__(self, token: Token) -> None:
        super().__init__(str(token))
        self.bracket, self.line, self.column = str(token), token.line or 1, token.column or 1


class _Lines:
    """Postlexer: each NEWLINE becomes ``_NL`` (next line at column 0) or ``_NL_INDENT`` (next
    line indented); line breaks inside brackets vanish; the file always ends with ``_NL``."""

    always_accept = ("NEWLINE",)

    def process(self, stream: Iterator[Token]) -> Iterator[Token]:
        brackets: list[Token] = []
        last: Token | None = None
        for token in stream:
            if token.type == "NEWLINE":
                if "\n" not in token:  # a comment on the last line of the file
                    continue
                indent = _next_line_indent(token)
                if brackets:
                    if not indent:
                        raise _UnclosedBracket(brackets[-1])
                    continue
                token = Token.new_borrow_pos("_NL_INDENT" if indent else "_NL", str(token), token)
            elif token.type in _OPEN:
                brackets.append(token)
            elif token.type in _CLOSE and brackets:
                brackets.pop()
            last = token
            yield token
        if brackets:
            raise _UnclosedBracket(brackets[-1])
        if last is not None and last.type != "_NL":
            yield Token("_NL", "", start_pos=last.end_pos, line=last.end_line, column=last.end_column,
                        end_line=last.end_line, end_column=last.end_column, end_pos=last.end_pos)


def _next_line_indent(newline: Token) -> str:
    """The indentation of the line after a NEWLINE token; ``""`` at the end of the file."""
    tail = str(newline).rpartition("\n")[2]
    return "" if "#" in tail else tail


# ---- nesting limit -----------------------------------------------------------------------------


def _check_depth(src: ast.SourceText, tree: lark.Tree, max_depth: int) -> None:
    """Refuse trees nested deeper than ``max_depth`` expression levels (iteratively, so a huge input
    cannot exhaust the stack here)."""
    stack: list[tuple[Any, int]] = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, lark.Tree):
            continue
        if depth > max_depth + 3:  # start, rule_def, rewrite sit above the expressions
            meta = node.meta
            raise src.syntax_error(getattr(meta, "line", 1), getattr(meta, "column", 1),
                                   f"expression nested more than {max_depth} levels deep; name parts of it "
                               f"with 'let' lines.")
        stack.extend((child, depth + 1) for child in node.children)


# ---- error messages ----------------------------------------------------------------------------

_WORDS = {
    "NAME": "a name",
    "INTEGER": "an integer",
    "FLOAT": "a number",
    "STRING": "a string",
    "_NL": "the end of the line",
    "_NL_INDENT": "an indented line",
    "NEWLINE": "the end of the line",
    "$END": "the end of the file",
}
_OPERAND_STARTS = frozenset({"(", "[", "-", "+", "True", "False", "None", "not", "..."})
_OPERAND_TERMINALS = frozenset({"NAME", "INTEGER", "FLOAT", "STRING"})
_OPERATORS = frozenset({"+", "-", "*", "/", "//", "%", "@", "**", "==", "!=", "<", "<=", ">", ">=", "in", "is",
                        "not", "and", "or", ".", "(", "["})


def _terminal_text(name: str) -> str | None:
    try:
        pattern = _parser().get_terminal(name).pattern
    except KeyError:
        return None
    return pattern.value if isinstance(pattern, lark.lexer.PatternStr) else None


def _describe_terminal(name: str) -> str:
    if name in _WORDS:
        return _WORDS[name]
    text = _terminal_text(name)
    return f"'{text}'" if text is not None else name.lower()


def _describe_found(token: Token) -> str:
    if token.type == "$END" or (token.type == "_NL" and not str(token)):
        return "the end of the file"
    if token.type in ("_NL", "_NL_INDENT", "NEWLINE"):
        return "the end of the line"
    if token.type == "NAME":
        return f"the name '{token}'"
    return f"'{token}'"


def _expected_phrase(expected: set[str]) -> str:
    """Human words for a set of terminal names: the ways to start an operand collapse into
    "an expression", binary operators into "an operator"."""
    texts = {name: _terminal_text(name) for name in expected}
    words: list[str] = []
    rest = set(expected)
    if "NAME" in expected and "INTEGER" in expected:
        words.append("an expression")
        rest = {n for n in rest if n not in _OPERAND_TERMINALS and texts[n] not in _OPERAND_STARTS}
    operators = {n for n in rest if texts.get(n) in _OPERATORS}
    if len(operators) > 3:
        words.append("an operator")
        rest -= operators
    words += sorted(_describe_terminal(n) for n in rest)
    if len(words) == 1:
        return words[0]
    return ", ".join(words[:-1]) + " or " + words[-1]


def _sentence(src: ast.SourceText, token: Token, expected: set[str]) -> str:
    """What the parser wanted, said as a person would say it."""
    if len(expected) > 1:
        expected = expected - {"NEWLINE"}  # the postlexer's input, accepted everywhere
    texts = {_terminal_text(n) for n in expected}
    start = token.start_pos if token.start_pos is not None else len(src.text)
    before = src.text[:start].rstrip()
    line = src.text[src.text.rfind("\n", 0, start) + 1:start].split()
    in_where_or_let = bool(line) and line[0] in ("where", "let")
    found = _describe_found(token)
    bracket = _innermost_open_bracket(src.text, start)
    if str(token) == ">" and before.endswith("-"):
        return "the arrow between a pattern and its replacement is '=>', not '->'."
    if str(token) == ">" and before.endswith("=") and bracket is not None:
        return _unclosed(bracket, "'=>'")
    if str(token) == ">" and before.endswith("="):
        return "found '=>' inside brackets; is a ')' or ']' missing before it?"
    if bracket is not None and str(token) in _CLOSING.values() and str(token) != _CLOSING[bracket[0]]:
        opening, at_line, at_column = bracket
        return (f"the '{opening}' at line {at_line}, column {at_column} is closed with '{token}'; close it with "
                f"'{_CLOSING[opening]}'.")
    if bracket is not None and _CLOSING[bracket[0]] in texts and (token.type in ("_NL", "_NL_INDENT", "$END")
                                                                    or str(token) in ("=>", "=")
                                                                    or token.line != bracket[1]):
        return _unclosed(bracket, found)
    if str(token) == "=" and not (line and line[0] == "let" and len(line) == 2):
        return "found '=', which assigns nothing here: compare with '==' (keyword arguments go inside a call)."
    if "=>" in texts and not in_where_or_let:
        return f"expected '=>' followed by the replacement, found {found}."
    if ":" in texts and expected <= {"COLON", "STRING", "PRIORITY", "MINUS", "INTEGER"}:
        return f"expected ':' to end the rule header (rule NAME [\"doc\"] [priority N]:), found {found}."
    if expected == {"_NL_INDENT"}:
        return f"expected the rule body on the next line, indented: 'pattern => replacement', found {found}."
    if "as" in texts:
        return f"expected 'as' and an alias (use torch.ops.mylib as mylib), found {found}."
    if "rule" in texts and "where" not in texts:
        return f"expected a 'rule' or 'use' line starting at column 0, found {found}."
    if "where" in texts:
        return (f"expected a 'where' line or the end of the rule (a rule has one 'pattern => replacement' line, "
                f"after its 'let' lines), found {found}.")
    if bracket is not None and "," in texts and token.type in _OPERAND_TERMINALS:
        return f"expected {_expected_phrase(expected)}, found {found}; is a ',' missing before it?"
    return f"expected {_expected_phrase(expected)}, found {found}."


_CLOSING = {"(": ")", "[": "]"}


def _innermost_open_bracket(text: str, end: int) -> tuple[str, int, int] | None:
    """The innermost bracket still open at offset ``end`` of ``text`` (strings and comments
    skipped), as ``(bracket, line, column)``; ``None`` when every bracket is closed.

    >>> _innermost_open_bracket("rule r:\\n    f(x, [1, '(']", 26)
    ('(', 2, 6)
    """
    stack: list[int] = []
    i, end = 0, min(end, len(text))
    while i < end:
        c = text[i]
        if c in "\"'":
            close = text.find(c, i + 1)
            while close != -1 and text[close - 1] == "\\" and text[close - 2] != "\\":
                close = text.find(c, close + 1)
            i = end if close == -1 else close
        elif c == "#":
            newline = text.find("\n", i)
            i = end if newline == -1 else newline
        elif c in "([":
            stack.append(i)
        elif c in ")]" and stack:
            stack.pop()
        i += 1
    if not stack:
        return None
    offset = stack[-1]
    line = text.count("\n", 0, offset) + 1
    return text[offset], line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def _unclosed(bracket: tuple[str, int, int], found: str) -> str:
    opening, line, column = bracket
    return (f"the '{opening}' at line {line}, column {column} is never closed: expected '{_CLOSING[opening]}' "
            f"before {found}.")


def _from_lark(src: ast.SourceText, exc: UnexpectedInput) -> RuleSyntaxError:
    line, column = exc.line if exc.line and exc.line > 0 else 1, exc.column if exc.column and exc.column > 0 else 1
    if isinstance(exc, UnexpectedToken):
        token = exc.token
        if (token.type == "_NL" and not str(token)) or token.type == "$END":
            line, column = _end_of_text(src)
        sentence = _sentence(src, token, _accepted(exc))
    elif isinstance(exc, UnexpectedCharacters):
        position = exc.pos_in_stream if exc.pos_in_stream is not None else -1
        char = src.text[position] if 0 <= position < len(src.text) else ""
        sentence = f"unexpected character {char!r}" + _character_hint(char, set(exc.allowed or ()))
    else:
        sentence = "unexpected end of the file."
    return src.syntax_error(line, column, sentence)


def _accepted(exc: UnexpectedToken) -> set[str]:
    """The terminals the parser would really accept here: lark's ``expected`` can include
    terminals that only lead to an error a step later (LALR states are shared)."""
    try:
        accepted = set(exc.interactive_parser.accepts()) if exc.interactive_parser is not None else set()
    except Exception:  # the interactive parser is a convenience; fall back to lark's set
        accepted = set()
    return accepted or set(exc.expected)


def _character_hint(char: str, allowed: set[str]) -> str:
    if char in "\"'":
        return "; a string must end on the line it starts."
    if char == "\r":
        return "; lines must end with '\\n' or '\\r\\n'."
    if char == "!":
        return "; for 'not equal' write '!=', for negation write 'not'."
    if len(allowed) > 1:
        allowed = allowed - {"NEWLINE"}
    if allowed:
        return f"; expected {_expected_phrase(allowed)}."
    return "."


def _end_of_text(src: ast.SourceText) -> tuple[int, int]:
    body = src.text.rstrip()
    line = body.count("\n") + 1
    return line, len(body.rpartition("\n")[2]) + 1


