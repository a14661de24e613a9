"""The fxrewrite rule language (``.fxr`` files): text → AST (:mod:`.parse`) → rules (:mod:`.compile`).

>>> rules = parse_rules('''
... rule double_neg "Replaces -(-x) by x.":
...     torch.neg(torch.neg(x)) => x
... ''', source="algebra.fxr")
>>> [(r.name, r.doc, r.origin) for r in rules]
[('double_neg', 'Replaces -(-x) by x.', 'algebra.fxr:2')]

Loading rule text runs no code from it: names resolve through an allow-list (see
:data:`~fxrewrite.dsl.scope.DEFAULT_NAMES` and docs/dsl.md, "Trust model").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..rule import RuleSet
from .compile import compile_rules
from .parse import parse
from .scope import DEFAULT_NAMES, RESERVED_WORDS

__all__ = ["CACHED_TRACES", "DEFAULT_NAMES", "RESERVED_WORDS", "compile_rules", "parse", "parse_rules"]


def parse_rules(text: str, *, source: str = "<string>", names: Mapping[str, Any] | None = None,
                cached: bool = False) -> RuleSet:
    """The :class:`~fxrewrite.rule.RuleSet` written in ``text``, in the fxrewrite rule language.

    ``source`` names the text in messages and in each rule's ``origin`` (``source:line``);
    ``names`` adds the caller's own objects to the names a rule may use (e.g. a function the
    replacements call). Raises :class:`~fxrewrite.errors.RuleSyntaxError` when the text does
    not parse and :class:`~fxrewrite.errors.RuleDefinitionError` when a rule is invalid.
    ``cached=True`` lets the parse come from the user's cache (see :func:`.parse.parse`); every
    rule is built and checked all the same.
    """
    if not isinstance(text, str):
        from ..errors import RuleDefinitionError

        raise RuleDefinitionError(f"parse_rules takes the text of a rule file (a str), got {type(text).__name__}.")
    text = text.removeprefix("\ufeff")  # a byte-order mark left by some editors
    parsed = parse(text, source=source, cached=cached)
    if not (cached and names is None and CACHED_TRACES):
        return compile_rules(parsed, names=names)
    return _compile_with_cached_traces(parsed, text, source)


#: ``parse_rules(..., cached=True)`` without ``names`` also takes the traces of the patterns from
#: the cache (:func:`fxrewrite._cache.load_traces`). Its slow twin, ``False``, traces every
#: pattern; ``tests/test_cache.py`` checks that both give the same graphs for the library.
CACHED_TRACES = True


def _compile_with_cached_traces(parsed: Any, text: str, source: str) -> RuleSet:
    """Compile ``parsed`` with the patterns' graphs replayed from the cache where it has them,
    and cache the traces when it had none (every rule was built, so every trace succeeded)."""
    from .. import _cache
    from ..pattern import recorded_traces

    known = _cache.load_traces(text, source)
    with recorded_traces(known) as traced:
        rules = compile_rules(parsed)
    if known is None:
        _cache.store_traces(text, traced)
    return rules
