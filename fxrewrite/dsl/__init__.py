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

__all__ = ["DEFAULT_NAMES", "RESERVED_WORDS", "compile_rules", "parse", "parse_rules"]


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
    return compile_rules(parse(text, source=source, cached=cached), names=names)
