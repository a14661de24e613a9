"""Parse rule-file text into the frozen syntax tree of :mod:`fxrewrite.dsl.ast`.

The grammar is ``grammar.lark`` next to this module (LALR, positions propagated). This is the
only module that touches lark: lark trees and errors are turned into AST nodes and
:class:`~fxrewrite.errors.RuleSyntaxError` here, and nothing of lark leaves it.

>>> f = parse("rule double_neg:\\n    torch.neg(torch.neg(x)) => x\\n", source="algebra.fxr")
>>> f.rules[0].name, type(f.rules[0].rewrite.pattern).__name__
('double_neg', 'Call')

A syntax error says where, shows the line with a caret and says what was expected:

>>> try:
...     parse("rule r:\\n    torch.neg(x) x\\n", source="r.fxr")
... except RuleSyntaxError as error:
...     print(error.msg)
...     print(error.filename, error.lineno, error.offset, repr(error.text))
r.fxr:2:18: expected '=>' followed by the replacement, found the name 'x'.
    torch.neg(x) x
                 ^
r.fxr 2 18 '    torch.neg(x) x'
"""

from __future__ import annotations

import functools
import importlib.resources
from collections.abc import Iterator
from typing import Any

import lark
from lark import Token, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken, VisitError

from ..errors import RuleSyntaxError
from . import ast

__all__ = ["MAX_DEPTH", "parse", "syntax_error"]

#: How deeply expressions may nest (brackets, operators, calls); deeper text is refused.
MAX_DEPTH = 100

_OPEN = frozenset({"LPAR", "LSQB"})
_CLOSE = frozenset({"RPAR", "RSQB"})


def parse(text: str, *, source: str = "<string>") -> ast.RuleFile:
    """Parse the text of a rule file. ``source`` names it in messages and rule origins.

    Raises :class:`RuleSyntaxError` (with ``filename``, ``lineno``, ``offset`` and ``text``
    set) when ``text`` is not a rule file.
    """
    src = ast.SourceText(source, text)
    try:
        tree = _parser().parse(text.rstrip(" \t\f"))  # no indented empty line at the very end
    except UnexpectedInput as exc:
        raise _from_lark(src, exc) from None
    except _UnclosedBracket as exc:
        raise syntax_error(src, exc.line, exc.column, f"'{exc.bracket}' is never closed; add "
                                                      f"'{_CLOSING[exc.bracket]}' where its expression ends.") from None
    _check_depth(src, tree)
    try:
        return _ToAst(src).transform(tree)
    except VisitError as exc:
        raise exc.orig_exc from None  # RuleSyntaxError from a callback, or a bug of ours


def syntax_error(src: ast.SourceText, line: int, column: int, sentence: str) -> RuleSyntaxError:
    """A :class:`RuleSyntaxError` at ``line``:``column`` of ``src``: ``file:line:col: sentence``,
    then the line and a caret under the column."""
    span = ast.Span(line, column, line, column)
    error = RuleSyntaxError(f"{src.where(span)}: {sentence}\n{src.excerpt(span)}")
    error.filename = src.name
    error.lineno = line
    error.offset = column
    error.text = src.line_text(line)
    return error


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


def _check_depth(src: ast.SourceText, tree: lark.Tree) -> None:
    """Refuse trees nested deeper than MAX_DEPTH expression levels (iteratively, so a huge input
    cannot exhaust the stack here)."""
    stack: list[tuple[Any, int]] = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, lark.Tree):
            continue
        if depth > MAX_DEPTH + 3:  # start, rule_def, rewrite sit above the expressions
            meta = node.meta
            raise syntax_error(src, getattr(meta, "line", 1), getattr(meta, "column", 1),
                               f"expression nested more than {MAX_DEPTH} levels deep; name parts of it "
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
    return syntax_error(src, line, column, sentence)


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


# ---- parse tree -> AST -------------------------------------------------------------------------


def _span(meta: Any) -> ast.Span:
    return ast.Span(meta.line, meta.column, meta.end_line, meta.end_column)


def _token_span(token: Token) -> ast.Span:
    line, column = token.line or 1, token.column or 1
    return ast.Span(line, column, token.end_line or line, token.end_column or column)


_ESCAPES = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "t": "\t", "r": "\r", "0": "\0"}
_MAX_INT_DIGITS = 100


def _binop(op: str) -> Any:
    @v_args(inline=True, meta=True)
    def build(self: _ToAst, meta: Any, left: ast.Expr, *rest: Any) -> ast.BinOp:
        return ast.BinOp(op=op, left=left, right=rest[-1], span=_span(meta))

    return build


class _ToAst(lark.visitors.Transformer_NonRecursive):
    """Bottom-up, without recursion: lark tree -> AST. Problems found here (a bad escape, a
    keyword argument before a positional one) raise RuleSyntaxError."""

    def __init__(self, src: ast.SourceText) -> None:
        super().__init__()
        self.src = src

    def _error(self, span: ast.Span, sentence: str) -> RuleSyntaxError:
        return syntax_error(self.src, span.line, span.column, sentence)

    # -- file level --------------------------------------------------------------------------
    @v_args(inline=True)
    def start(self, *items: Any) -> ast.RuleFile:
        uses = tuple(i for i in items if isinstance(i, ast.Use))
        rules = tuple(i for i in items if isinstance(i, ast.RuleDef))
        return ast.RuleFile(source=self.src, uses=uses, rules=rules)

    @v_args(inline=True, meta=True)
    def use_line(self, meta: Any, dotted: tuple[tuple[str, ...], ast.Span], alias: Token) -> ast.Use:
        return ast.Use(path=dotted[0], alias=str(alias), span=_span(meta), path_span=dotted[1])

    @v_args(inline=True, meta=True)
    def dotted_name(self, meta: Any, *names: Token) -> tuple[tuple[str, ...], ast.Span]:
        return tuple(str(n) for n in names), _span(meta)

    @v_args(inline=True, meta=True)
    def rule_def(self, meta: Any, name: Token, doc: Token | None, priority: int | None, *body: Any) -> ast.RuleDef:
        lets = tuple(b for b in body if isinstance(b, ast.Let))
        rewrite = next(b for b in body if isinstance(b, ast.Rewrite))
        captures = tuple(c for b in body if isinstance(b, tuple) for c in b)
        conditions = tuple(b for b in body if isinstance(b, ast.Condition))
        declarations = tuple(b for b in body if isinstance(b, ast.Declaration))
        return ast.RuleDef(name=str(name), doc=self._string(doc) if doc is not None else None,
                           priority=priority or 0, lets=lets, rewrite=rewrite, captures=captures,
                           conditions=conditions, declarations=declarations, span=_token_span(name))

    @v_args(inline=True)
    def priority(self, minus: Token | None, value: Token) -> int:
        number = self._int(value)
        return -number if minus is not None else number

    @v_args(inline=True, meta=True)
    def let_line(self, meta: Any, name: Token, value: ast.Expr) -> ast.Let:
        return ast.Let(name=str(name), value=value, span=_token_span(name))

    @v_args(inline=True, meta=True)
    def rewrite(self, meta: Any, pattern: ast.Expr, replacement: ast.Expr) -> ast.Rewrite:
        return ast.Rewrite(pattern=pattern, replacement=replacement, span=_span(meta))

    @v_args(inline=True, meta=True)
    def where_condition(self, meta: Any, expr: ast.Expr) -> ast.Condition:
        text = self.src.text[meta.start_pos:meta.end_pos].strip()
        text = " ".join(text.removeprefix("where").split())
        return ast.Condition(expr=expr, text=text, span=expr.span)

    @v_args(inline=True)
    def where_captures(self, *captures: ast.Capture) -> tuple[ast.Capture, ...]:
        return captures

    # -- declarations ------------------------------------------------------------------------
    @v_args(inline=True, meta=True)
    def tolerance_line(self, meta: Any, settings: tuple[ast.Setting, ...]) -> ast.Declaration:
        return ast.Declaration(kind="tolerance", target=None, settings=settings, values=None, span=_span(meta))

    @v_args(inline=True, meta=True)
    def domain_line(self, meta: Any, settings: tuple[ast.Setting, ...]) -> ast.Declaration:
        return ast.Declaration(kind="domain", target=None, settings=settings, values=None, span=_span(meta))

    @v_args(inline=True, meta=True)
    def domain_input_line(self, meta: Any, name: Token, settings: tuple[ast.Setting, ...]) -> ast.Declaration:
        return ast.Declaration(kind="domain", target=str(name), settings=settings, values=None, span=_span(meta))

    @v_args(inline=True, meta=True)
    def domain_values_line(self, meta: Any, name: Token, values: ast.Expr) -> ast.Declaration:
        return ast.Declaration(kind="domain", target=str(name), settings=(), values=values, span=_span(meta))

    @v_args(inline=True, meta=True)
    def numerics_line(self, meta: Any, name: Token, k: Token | None) -> ast.Declaration:
        """``numerics bitwise``, ``numerics ulp 2``, ``numerics as_precise``: the contract's
        spelling is checked when the rule is compiled."""
        contract = str(name) if k is None else f"{name}:{k}"
        return ast.Declaration(kind="numerics", target=contract, settings=(), values=None, span=_span(meta))

    @v_args(inline=True)
    def settings(self, *items: ast.Setting) -> tuple[ast.Setting, ...]:
        seen: set[str] = set()
        for item in items:
            if item.name in seen:
                raise self._error(item.span, f"'{item.name}' is set twice on this line; set it once.")
            seen.add(item.name)
        return items

    @v_args(inline=True)
    def setting(self, name: Token, value: ast.Expr) -> ast.Setting:
        return ast.Setting(name=str(name), value=value, span=_token_span(name))

    @v_args(inline=True)
    def capture(self, name: Token, dotted: tuple[tuple[str, ...], ast.Span]) -> ast.Capture:
        return ast.Capture(name=str(name), type_path=dotted[0], span=_token_span(name), type_span=dotted[1])

    # -- operators ---------------------------------------------------------------------------
    @v_args(inline=True, meta=True)
    def or_(self, meta: Any, left: ast.Expr, right: ast.Expr) -> ast.BoolOp:
        return self._boolop("or", meta, left, right)

    @v_args(inline=True, meta=True)
    def and_(self, meta: Any, left: ast.Expr, right: ast.Expr) -> ast.BoolOp:
        return self._boolop("and", meta, left, right)

    def _boolop(self, op: str, meta: Any, left: ast.Expr, right: ast.Expr) -> ast.BoolOp:
        values = (*left.values, right) if isinstance(left, ast.BoolOp) and left.op == op else (left, right)
        return ast.BoolOp(op=op, values=values, span=_span(meta))

    @v_args(inline=True, meta=True)
    def not_(self, meta: Any, operand: ast.Expr) -> ast.Not:
        return ast.Not(operand=operand, span=_span(meta))

    @v_args(inline=True, meta=True)
    def compare(self, meta: Any, left: ast.Expr, *rest: Any) -> ast.Compare:
        return ast.Compare(left=left, ops=tuple(rest[0::2]), comparators=tuple(rest[1::2]), span=_span(meta))

    @v_args(inline=True)
    def comp_op(self, *tokens: Token) -> str:
        return " ".join(str(t) for t in tokens)

    add = _binop("+")
    sub = _binop("-")
    mul = _binop("*")
    truediv = _binop("/")
    floordiv = _binop("//")
    mod = _binop("%")
    matmul = _binop("@")
    pow = _binop("**")

    @v_args(inline=True, meta=True)
    def neg(self, meta: Any, minus: Token, operand: ast.Expr) -> ast.UnaryOp:
        return ast.UnaryOp(op="-", operand=operand, span=_span(meta))

    @v_args(inline=True, meta=True)
    def pos(self, meta: Any, operand: ast.Expr) -> ast.UnaryOp:
        return ast.UnaryOp(op="+", operand=operand, span=_span(meta))

    # -- postfix -----------------------------------------------------------------------------
    @v_args(inline=True, meta=True)
    def attribute(self, meta: Any, value: ast.Expr, name: Token) -> ast.Attribute:
        return ast.Attribute(value=value, attr=str(name), span=_span(meta), attr_span=_token_span(name))

    @v_args(inline=True, meta=True)
    def call(self, meta: Any, func: ast.Expr, arguments: list[Any] | None) -> ast.Call:
        args, keywords = self._split_arguments(arguments or [])
        return ast.Call(func=func, args=args, keywords=keywords, span=_span(meta))

    def _split_arguments(self, arguments: list[Any]) -> tuple[tuple[ast.Expr, ...], tuple[ast.Keyword, ...]]:
        args: list[ast.Expr] = []
        keywords: dict[str, ast.Keyword] = {}
        for a in arguments:
            if isinstance(a, ast.Keyword):
                if a.name in keywords:
                    raise self._error(a.span, f"keyword argument '{a.name}' is given twice.")
                keywords[a.name] = a
            elif keywords:
                raise self._error(a.span, "a positional argument follows a keyword argument; put positional "
                                          "arguments first.")
            else:
                args.append(a)
        return tuple(args), tuple(keywords.values())

    @v_args(inline=True)
    def arguments(self, *items: Any) -> list[Any]:
        return list(items)

    @v_args(inline=True, meta=True)
    def keyword(self, meta: Any, name: Token, value: ast.Expr) -> ast.Keyword:
        return ast.Keyword(name=str(name), value=value, span=_token_span(name))

    @v_args(inline=True, meta=True)
    def subscript(self, meta: Any, value: ast.Expr, index: ast.Expr) -> ast.Subscript:
        return ast.Subscript(value=value, index=index, span=_span(meta))

    @v_args(inline=True)
    def index(self, item: ast.Expr) -> ast.Expr:
        return item

    @v_args(inline=True, meta=True)
    def index_tuple(self, meta: Any, *items: ast.Expr) -> ast.TupleExpr:
        return ast.TupleExpr(elts=items, span=_span(meta))

    @v_args(inline=True, meta=True)
    def slice(self, meta: Any, start: Any = None, stop: Any = None, step: Any = None) -> ast.Slice:
        return ast.Slice(start=start, stop=stop, step=step, span=_span(meta))

    # -- atoms -------------------------------------------------------------------------------
    @v_args(inline=True, meta=True)
    def name(self, meta: Any, token: Token) -> ast.Expr:
        if str(token) == "_":
            return ast.Wildcard(span=_token_span(token))
        return ast.Name(id=str(token), span=_token_span(token))

    @v_args(inline=True, meta=True)
    def integer(self, meta: Any, token: Token) -> ast.Literal:
        return ast.Literal(value=self._int(token), span=_token_span(token))

    @v_args(inline=True, meta=True)
    def float(self, meta: Any, token: Token) -> ast.Literal:
        return ast.Literal(value=float(str(token)), span=_token_span(token))

    @v_args(inline=True, meta=True)
    def string(self, meta: Any, token: Token) -> ast.Literal:
        return ast.Literal(value=self._string(token), span=_token_span(token))

    @v_args(meta=True)
    def true(self, meta: Any, _: Any) -> ast.Literal:
        return ast.Literal(value=True, span=_span(meta))

    @v_args(meta=True)
    def false(self, meta: Any, _: Any) -> ast.Literal:
        return ast.Literal(value=False, span=_span(meta))

    @v_args(meta=True)
    def none(self, meta: Any, _: Any) -> ast.Literal:
        return ast.Literal(value=None, span=_span(meta))

    @v_args(meta=True)
    def ellipsis(self, meta: Any, _: Any) -> ast.Literal:
        return ast.Literal(value=Ellipsis, span=_span(meta))

    @v_args(inline=True, meta=True)
    def tuple(self, meta: Any, *elts: Any) -> ast.TupleExpr:
        return ast.TupleExpr(elts=tuple(e for e in elts if e is not None), span=_span(meta))

    @v_args(inline=True, meta=True)
    def list(self, meta: Any, *elts: Any) -> ast.ListExpr:
        return ast.ListExpr(elts=tuple(e for e in elts if e is not None), span=_span(meta))

    # -- literal values ----------------------------------------------------------------------
    def _int(self, token: Token) -> int:
        text = str(token)
        if len(text) > _MAX_INT_DIGITS:
            raise self._error(_token_span(token), f"integer literal with {len(text)} digits; at most "
                                                  f"{_MAX_INT_DIGITS} digits are allowed.")
        return int(text)

    def _string(self, token: Token) -> str:
        body, out, i = str(token)[1:-1], [], 0
        while i < len(body):
            c = body[i]
            if c == "\\":
                escaped = body[i + 1] if i + 1 < len(body) else ""
                if escaped not in _ESCAPES:
                    at = _token_span(token)
                    span = ast.Span(at.line, at.column + i + 1, at.line, at.column + i + 3)
                    raise self._error(span, f"unknown escape '\\{escaped}' in a string; the escapes are "
                                            f"\\\\ \\' \\\" \\n \\t \\r \\0.")
                out.append(_ESCAPES[escaped])
                i += 2
            else:
                out.append(c)
                i += 1
        return "".join(out)
