"""Parse rule-file text into the frozen syntax tree of :mod:`fxrewrite.dsl.ast`.

The grammar is ``grammar.lark`` next to this module (LALR, positions propagated). lark is
imported only when a text is parsed: its parser and messages live in :mod:`._syntax`, the
tree-to-AST transformer in :mod:`._to_ast`, and nothing of lark leaves them (``import
fxrewrite`` and loading Python rule files never import it).

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

from ..errors import RuleSyntaxError
from . import ast

__all__ = ["MAX_DEPTH", "parse", "syntax_error"]

#: How deeply expressions may nest (brackets, operators, calls); deeper text is refused.
MAX_DEPTH = 100


def parse(text: str, *, source: str = "<string>", cached: bool = False) -> ast.RuleFile:
    """Parse the text of a rule file. ``source`` names it in messages and rule origins.

    ``cached=True`` (the loader's choice for rule files) takes the parse of the same text from
    the user's cache when an entry there can be trusted (:mod:`fxrewrite._cache`), and caches a
    fresh parse; the result is the same either way. Raises :class:`RuleSyntaxError` (with
    ``filename``, ``lineno``, ``offset`` and ``text`` set) when ``text`` is not a rule file.
    """
    from .. import _cache

    if cached and (hit := _cache.load_rule_file(text, source)) is not None:
        return hit
    from ._syntax import rule_file  # imports lark: only when a text is parsed

    parsed = rule_file(ast.SourceText(source, text), max_depth=MAX_DEPTH)
    if cached:
        _cache.store_rule_file(parsed)
    return parsed


def syntax_error(src: ast.SourceText, line: int, column: int, sentence: str) -> RuleSyntaxError:
    """A :class:`RuleSyntaxError` at ``line``:``column`` of ``src``: ``file:line:col: sentence``,
    then the line and a caret under the column (:meth:`~fxrewrite.dsl.ast.SourceText.syntax_error`)."""
    return src.syntax_error(line, column, sentence)
