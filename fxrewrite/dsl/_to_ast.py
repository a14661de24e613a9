"""The lark parse tree of a rule file -> its frozen AST (:mod:`fxrewrite.dsl.ast`).

:class:`ToAst` is a bottom-up lark transformer, without recursion; it is assembled from
:class:`_Statements` (the file, its rules and their lines) and :class:`_Expressions` (operators,
calls, atoms), both reading literal values through :class:`_Literals`. Problems found here (a bad
escape, a keyword argument before a positional one, a setting given twice) raise
:class:`~fxrewrite.errors.RuleSyntaxError`. Imported by :mod:`fxrewrite.dsl._syntax` only, when a
text is parsed.

>>> from fxrewrite.dsl.parse import parse
>>> call = parse("rule r:\\n    torch.neg(x, dim=1) => x\\n").rules[0].rewrite.pattern
>>> [type(a).__name__ for a in call.args], [k.name for k in call.keywords]
(['Name'], ['dim'])
"""

from __future__ import annotations

from typing import Any

import lark
from lark import Token, v_args

from ..errors import RuleSyntaxError
from . import ast

__all__ = ["ToAst"]


def _span(meta: Any) -> ast.Span:
    return ast.Span(meta.line, meta.column, meta.end_line, meta.end_column)


def _token_span(token: Token) -> ast.Span:
    line, column = token.line or 1, token.column or 1
    return ast.Span(line, column, token.end_line or line, token.end_column or column)


_ESCAPES = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "t": "\t", "r": "\r", "0": "\0"}
_MAX_INT_DIGITS = 100


def _binop(op: str) -> Any:
    @v_args(inline=True, meta=True)
    def build(self: _Expressions, meta: Any, left: ast.Expr, *rest: Any) -> ast.BinOp:
        return ast.BinOp(op=op, left=left, right=rest[-1], span=_span(meta))

    return build


class _Literals:
    """Where the transformer reports problems, and the literal values it reads from tokens."""

    src: ast.SourceText

    def _error(self, span: ast.Span, sentence: str) -> RuleSyntaxError:
        return self.src.syntax_error(span.line, span.column, sentence)

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


class _Statements(_Literals):
    """The file, its ``use`` lines, its rules and their ``let``, ``where`` and declaration lines."""

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


class _Expressions(_Literals):
    """Expressions: operators, attribute access, calls, subscripts and atoms."""

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


class ToAst(_Statements, _Expressions, lark.visitors.Transformer_NonRecursive):
    """Bottom-up, without recursion: lark tree -> AST (see the module docstring)."""

    def __init__(self, src: ast.SourceText) -> None:
        super().__init__()
        self.src = src
