"""The syntax tree of a rule file: frozen values, built by :mod:`fxrewrite.dsl.parse` and
turned into :class:`~fxrewrite.rule.Rule` objects by :mod:`fxrewrite.dsl.compile`.

Every node carries the :class:`Span` it was written at, so later stages can point at it:

>>> src = SourceText("rules.fxr", "rule r:\\n    torch.neg(y) => y\\n")
>>> node = Name(id="y", span=Span(2, 15, 2, 16))
>>> print(src.excerpt(node.span))
    torch.neg(y) => y
              ^
>>> src.where(node.span)
'rules.fxr:2:15'

Expressions mirror the Python expressions they stand for (``BinOp("+", ...)`` is ``a + b``);
a rule's body keeps its parts in source order.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Union

import attrs

from ..errors import RuleSyntaxError

__all__ = [
    "Attribute",
    "BinOp",
    "BoolOp",
    "CLASSES",
    "Call",
    "Capture",
    "Compare",
    "Condition",
    "Declaration",
    "Expr",
    "Keyword",
    "Let",
    "ListExpr",
    "Literal",
    "Name",
    "Not",
    "Rewrite",
    "RuleDef",
    "RuleFile",
    "Slice",
    "Setting",
    "SourceText",
    "Span",
    "Subscript",
    "TupleExpr",
    "UnaryOp",
    "Use",
    "Wildcard",
    "children",
    "walk",
]


@attrs.frozen
class Span:
    """Where a node is written: 1-based line and column of its first and last character + 1."""

    line: int
    column: int
    end_line: int
    end_column: int


@attrs.frozen
class SourceText:
    """A rule file's name (used in messages and rule origins) and text."""

    name: str
    text: str

    def line_text(self, line: int) -> str:
        """Line ``line`` (1-based) without its line break; ``""`` past the end."""
        lines = self.text.split("\n")
        return lines[line - 1].rstrip("\r") if 1 <= line <= len(lines) else ""

    def excerpt(self, span: Span) -> str:
        """The line of ``span`` (without its indentation) and a caret under the first column of
        ``span``, both indented four spaces, as Python shows a line in a traceback."""
        line = self.line_text(span.line)
        text = line.lstrip(" \t\f")
        before = text[: max(span.column - 1 - (len(line) - len(text)), 0)]
        pad = "".join("\t" if c == "\t" else " " for c in before)
        return f"    {text}\n    {pad}^"

    def where(self, span: Span) -> str:
        """``name:line:column``, the prefix of every message about ``span``."""
        return f"{self.name}:{span.line}:{span.column}"

    def syntax_error(self, line: int, column: int, sentence: str) -> RuleSyntaxError:
        """A :class:`RuleSyntaxError` at ``line``:``column``: ``file:line:col: sentence``, then
        the line and a caret under the column (``filename``, ``lineno``, ``offset``, ``text`` set)."""
        span = Span(line, column, line, column)
        error = RuleSyntaxError(f"{self.where(span)}: {sentence}\n{self.excerpt(span)}")
        error.filename = self.name
        error.lineno = line
        error.offset = column
        error.text = self.line_text(line)
        return error


# ---- expressions ------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Name:
    """A bare name: a variable, a ``let`` name or a name in scope (see docs/dsl.md)."""

    id: str
    span: Span


@attrs.frozen(kw_only=True)
class Wildcard:
    """``_``: matches anything; each occurrence is a fresh variable."""

    span: Span


@attrs.frozen(kw_only=True)
class Literal:
    """An int, float, str, bool, ``None`` or ``...`` written in the rule."""

    value: Any
    span: Span


@attrs.frozen(kw_only=True)
class Attribute:
    """``value.attr``."""

    value: Expr
    attr: str
    span: Span
    attr_span: Span


@attrs.frozen(kw_only=True)
class Keyword:
    """``name=value`` in a call."""

    name: str
    value: Expr
    span: Span


@attrs.frozen(kw_only=True)
class Call:
    """``func(*args, **keywords)``; positional arguments come first."""

    func: Expr
    args: tuple[Expr, ...]
    keywords: tuple[Keyword, ...]
    span: Span


@attrs.frozen(kw_only=True)
class Slice:
    """``start:stop:step`` inside brackets; a missing part is ``None``."""

    start: Expr | None
    stop: Expr | None
    step: Expr | None
    span: Span


@attrs.frozen(kw_only=True)
class Subscript:
    """``value[index]``; several comma-separated items make ``index`` a :class:`TupleExpr`."""

    value: Expr
    index: Expr
    span: Span


@attrs.frozen(kw_only=True)
class BinOp:
    """``left op right`` for ``op`` in ``+ - * / // % ** @``."""

    op: str
    left: Expr
    right: Expr
    span: Span


@attrs.frozen(kw_only=True)
class UnaryOp:
    """``-operand`` or ``+operand``."""

    op: str
    operand: Expr
    span: Span


@attrs.frozen(kw_only=True)
class Compare:
    """``left op1 right1 op2 right2 ...`` (chained like Python) for ``== != < <= > >= in
    not in is is not``."""

    left: Expr
    ops: tuple[str, ...]
    comparators: tuple[Expr, ...]
    span: Span


@attrs.frozen(kw_only=True)
class BoolOp:
    """``a and b and ...`` or ``a or b or ...``."""

    op: str
    values: tuple[Expr, ...]
    span: Span


@attrs.frozen(kw_only=True)
class Not:
    """``not operand``."""

    operand: Expr
    span: Span


@attrs.frozen(kw_only=True)
class TupleExpr:
    """``(a, b)``; also the items of ``x[a, b]``."""

    elts: tuple[Expr, ...]
    span: Span


@attrs.frozen(kw_only=True)
class ListExpr:
    """``[a, b]``."""

    elts: tuple[Expr, ...]
    span: Span


Expr = Union[  # noqa: UP007 - a runtime alias of many classes reads best as Union[...]
    Name, Wildcard, Literal, Attribute, Call, Slice, Subscript, BinOp, UnaryOp, Compare, BoolOp, Not,
    TupleExpr, ListExpr,
]


def children(node: Expr) -> tuple[Expr, ...]:
    """The sub-expressions of ``node``, in evaluation order (a callee before its arguments).

    >>> s = Span(1, 1, 1, 2)
    >>> [c.id for c in children(BinOp(op="+", left=Name(id="a", span=s), right=Name(id="b", span=s), span=s))]
    ['a', 'b']
    """
    if isinstance(node, Attribute):
        return (node.value,)
    if isinstance(node, Call):
        return (node.func, *node.args, *(k.value for k in node.keywords))
    if isinstance(node, Slice):
        return tuple(p for p in (node.start, node.stop, node.step) if p is not None)
    if isinstance(node, Subscript):
        return (node.value, node.index)
    if isinstance(node, BinOp):
        return (node.left, node.right)
    if isinstance(node, UnaryOp):
        return (node.operand,)
    if isinstance(node, Compare):
        return (node.left, *node.comparators)
    if isinstance(node, BoolOp):
        return node.values
    if isinstance(node, Not):
        return (node.operand,)
    if isinstance(node, (TupleExpr, ListExpr)):
        return node.elts
    return ()


def walk(node: Expr) -> Iterator[Expr]:
    """``node`` and every expression below it, each before its children and children in
    evaluation order; iterative, so a deep tree cannot exhaust the stack.

    >>> s = Span(1, 1, 1, 2)
    >>> minus_b = UnaryOp(op="-", operand=Name(id="b", span=s), span=s)
    >>> tree = BinOp(op="+", left=Name(id="a", span=s), right=minus_b, span=s)
    >>> [type(n).__name__ for n in walk(tree)]
    ['BinOp', 'Name', 'UnaryOp', 'Name']
    """
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(children(current)))


# ---- rules and files ---------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Let:
    """``let name = value``: names a sub-expression shared by the pattern (and usable in the
    replacement)."""

    name: str
    value: Expr
    span: Span


@attrs.frozen(kw_only=True)
class Rewrite:
    """``pattern => replacement``."""

    pattern: Expr
    replacement: Expr
    span: Span


@attrs.frozen(kw_only=True)
class Capture:
    """``name: type`` in a ``where`` line; ``type`` is a dotted path such as ``nn.Conv2d``."""

    name: str
    type_path: tuple[str, ...]
    span: Span
    type_span: Span


@attrs.frozen(kw_only=True)
class Condition:
    """A ``where`` condition and its source text (shown when the guard rejects a match)."""

    expr: Expr
    text: str
    span: Span


@attrs.frozen(kw_only=True)
class Setting:
    """``name=value`` in a ``tolerance`` or ``domain`` line."""

    name: str
    value: Expr
    span: Span


@attrs.frozen(kw_only=True)
class Declaration:
    """A ``tolerance``, ``domain`` or ``numerics`` line: what the rule's property test may assume.

    ``tolerance rtol=1e-4, atol=1e-6`` and ``domain dtypes=(torch.float32,)`` have settings only;
    ``domain x: min_value=0.0`` sets them for the input ``x`` (``target``); ``domain n in (1, 2)``
    lists the values of a literal capture (``target`` and ``values``).
    """

    kind: str
    target: str | None
    settings: tuple[Setting, ...]
    values: Expr | None
    span: Span


@attrs.frozen(kw_only=True)
class RuleDef:
    """One ``rule`` block."""

    name: str
    doc: str | None
    priority: int
    lets: tuple[Let, ...]
    rewrite: Rewrite
    captures: tuple[Capture, ...]
    conditions: tuple[Condition, ...]
    span: Span
    declarations: tuple[Declaration, ...] = ()


@attrs.frozen(kw_only=True)
class Use:
    """``use a.b.c as alias``."""

    path: tuple[str, ...]
    alias: str
    span: Span
    path_span: Span


@attrs.frozen(kw_only=True)
class RuleFile:
    """A parsed rule file: its ``use`` lines and rules, in source order."""

    source: SourceText
    uses: tuple[Use, ...]
    rules: tuple[RuleDef, ...]


#: The classes of this module by name: all a cached parse may be built from (:mod:`fxrewrite._cache`).
CLASSES: dict[str, type] = {name: value for name, value in list(globals().items())
                            if isinstance(value, type) and value.__module__ == __name__}
