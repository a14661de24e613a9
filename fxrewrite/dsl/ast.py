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

import inspect
from collections.abc import Callable, Iterator
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, Union

from attrs.exceptions import FrozenInstanceError

from ..errors import RuleSyntaxError

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform
else:
    def dataclass_transform(**_: Any) -> Callable[[type], type]:
        return lambda cls: cls

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
    "fields",
    "walk",
]

_T = TypeVar("_T")


@dataclass_transform(kw_only_default=True, frozen_default=True, eq_default=True)
class Node:
    """The base of every class here: a frozen value with fields, equality, hash and repr.

    A subclass lists its fields as annotations (in order; a class attribute is a default) and is
    built with keywords only, or positionally too with ``kw_only=False`` in its class line. It
    behaves as the ``attrs.frozen`` class it replaces (same ``repr``, equality within one class,
    hash, :class:`attrs.exceptions.FrozenInstanceError` on assignment) but defines itself
    without generating and compiling code, which made this module a tenth of a warm library
    load. Its pickle is its ``__dict__`` (built without a Python ``__setstate__``), as the parse
    cache stores it.

    >>> Span(1, 2, 1, 3) == Span(line=1, column=2, end_line=1, end_column=3)
    True
    >>> Span(1, 2, 1, 3)
    Span(line=1, column=2, end_line=1, end_column=3)
    """

    _fields: ClassVar[tuple[str, ...]] = ()
    _defaults: ClassVar[dict[str, Any]] = {}
    _positional: ClassVar[int] = 0
    __match_args__: ClassVar[tuple[str, ...]] = ()
    _values: ClassVar[Callable[[Any], tuple[Any, ...]]] = staticmethod(lambda node: ())  # the fields' values
    _pick: ClassVar[Callable[[dict[str, Any]], tuple[Any, ...]]] = staticmethod(lambda kwargs: ())  # same, of kwargs

    def __init_subclass__(cls, *, kw_only: bool = True) -> None:
        super().__init_subclass__()
        names = tuple(inspect.get_annotations(cls))
        cls._fields = names
        cls._defaults = {name: cls.__dict__[name] for name in names if name in cls.__dict__}
        cls._positional = 0 if kw_only else len(names)
        cls.__match_args__ = () if kw_only else names  # type: ignore[misc]  # as attrs sets them: positional ones
        get, pick = (attrgetter(*names), itemgetter(*names)) if names else (lambda node: (), lambda kwargs: ())
        one = len(names) == 1  # a getter of one name returns the value, not a 1-tuple
        cls._values = staticmethod((lambda node: (get(node),)) if one else get)
        cls._pick = staticmethod((lambda kwargs: (pick(kwargs),)) if one else pick)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        cls = type(self)
        if not kwargs and len(args) == cls._positional != 0:
            self.__dict__.update(zip(cls._fields, args))
            return
        if not args and len(kwargs) == len(cls._fields):
            try:
                values = cls._pick(kwargs)
            except KeyError:
                pass
            else:
                self.__dict__.update(zip(cls._fields, values))
                return
        self.__dict__.update(cls._bind(args, kwargs))

    @classmethod
    def _bind(cls, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The fields' values, in field order, from arguments that do not name each field once
        by keyword (a default left out, or a mistake: ``TypeError`` as Python words it)."""
        if len(args) > cls._positional:
            raise TypeError(f"{cls.__name__}() takes {cls._positional} positional arguments but {len(args)} were given")
        values = dict(zip(cls._fields, args))
        for name, value in kwargs.items():
            if name not in cls._fields or name in values:
                problem = "got multiple values for" if name in values else "got an unexpected keyword"
                raise TypeError(f"{cls.__name__}() {problem} argument '{name}'")
            values[name] = value
        for name in cls._fields:
            if name not in values:
                if name not in cls._defaults:
                    raise TypeError(f"{cls.__name__}() missing required argument: '{name}'")
                values[name] = cls._defaults[name]
        return {name: values[name] for name in cls._fields}

    def __setattr__(self, name: str, value: Any) -> None:
        raise FrozenInstanceError()

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError()

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return type(self)._values(self) == type(self)._values(other)

    def __hash__(self) -> int:
        return hash((self.__class__.__qualname__, type(self)._values(self)))

    def __repr__(self) -> str:
        items = ", ".join(f"{name}={value!r}" for name, value in zip(self._fields, type(self)._values(self)))
        return f"{self.__class__.__qualname__}({items})"

    def replace(self: _T, **changes: Any) -> _T:
        """A copy with ``changes`` (field name to value), as ``attrs.evolve`` made one."""
        return type(self)(**{**self.__dict__, **changes})


def fields(cls: type[Node]) -> tuple[str, ...]:
    """The field names of an AST class, in order.

    >>> fields(Span)
    ('line', 'column', 'end_line', 'end_column')
    """
    return cls._fields


class Span(Node, kw_only=False):
    """Where a node is written: 1-based line and column of its first and last character + 1."""

    line: int
    column: int
    end_line: int
    end_column: int


class SourceText(Node, kw_only=False):
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


class Name(Node):
    """A bare name: a variable, a ``let`` name or a name in scope (see docs/dsl.md)."""

    id: str
    span: Span


class Wildcard(Node):
    """``_``: matches anything; each occurrence is a fresh variable."""

    span: Span


class Literal(Node):
    """An int, float, str, bool, ``None`` or ``...`` written in the rule."""

    value: Any
    span: Span


class Attribute(Node):
    """``value.attr``."""

    value: Expr
    attr: str
    span: Span
    attr_span: Span


class Keyword(Node):
    """``name=value`` in a call."""

    name: str
    value: Expr
    span: Span


class Call(Node):
    """``func(*args, **keywords)``; positional arguments come first."""

    func: Expr
    args: tuple[Expr, ...]
    keywords: tuple[Keyword, ...]
    span: Span


class Slice(Node):
    """``start:stop:step`` inside brackets; a missing part is ``None``."""

    start: Expr | None
    stop: Expr | None
    step: Expr | None
    span: Span


class Subscript(Node):
    """``value[index]``; several comma-separated items make ``index`` a :class:`TupleExpr`."""

    value: Expr
    index: Expr
    span: Span


class BinOp(Node):
    """``left op right`` for ``op`` in ``+ - * / // % ** @``."""

    op: str
    left: Expr
    right: Expr
    span: Span


class UnaryOp(Node):
    """``-operand`` or ``+operand``."""

    op: str
    operand: Expr
    span: Span


class Compare(Node):
    """``left op1 right1 op2 right2 ...`` (chained like Python) for ``== != < <= > >= in
    not in is is not``."""

    left: Expr
    ops: tuple[str, ...]
    comparators: tuple[Expr, ...]
    span: Span


class BoolOp(Node):
    """``a and b and ...`` or ``a or b or ...``."""

    op: str
    values: tuple[Expr, ...]
    span: Span


class Not(Node):
    """``not operand``."""

    operand: Expr
    span: Span


class TupleExpr(Node):
    """``(a, b)``; also the items of ``x[a, b]``."""

    elts: tuple[Expr, ...]
    span: Span


class ListExpr(Node):
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


class Let(Node):
    """``let name = value``: names a sub-expression shared by the pattern (and usable in the
    replacement)."""

    name: str
    value: Expr
    span: Span


class Rewrite(Node):
    """``pattern => replacement``."""

    pattern: Expr
    replacement: Expr
    span: Span


class Capture(Node):
    """``name: type`` in a ``where`` line; ``type`` is a dotted path such as ``nn.Conv2d``."""

    name: str
    type_path: tuple[str, ...]
    span: Span
    type_span: Span


class Condition(Node):
    """A ``where`` condition and its source text (shown when the guard rejects a match)."""

    expr: Expr
    text: str
    span: Span


class Setting(Node):
    """``name=value`` in a ``tolerance`` or ``domain`` line."""

    name: str
    value: Expr
    span: Span


class Declaration(Node):
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


class RuleDef(Node):
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


class Use(Node):
    """``use a.b.c as alias``."""

    path: tuple[str, ...]
    alias: str
    span: Span
    path_span: Span


class RuleFile(Node):
    """A parsed rule file: its ``use`` lines and rules, in source order."""

    source: SourceText
    uses: tuple[Use, ...]
    rules: tuple[RuleDef, ...]


#: The classes of this module by name: all a cached parse may be built from (:mod:`fxrewrite._cache`).
CLASSES: dict[str, type] = {name: value for name, value in list(globals().items())
                            if isinstance(value, type) and issubclass(value, Node) and value is not Node}
