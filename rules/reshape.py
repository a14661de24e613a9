"""Chains of reshapes (or of views) with constant shapes: only the last shape matters.

``x.reshape(s).reshape(t)`` and ``x.reshape(t)`` hold the same values in the same order,
whatever ``s`` is (reshape keeps the row-major order of the elements). The same holds for
``view``, and if ``x.view(s)`` succeeded then ``x.view(t)`` succeeds too: a view never moves
memory, so whether ``t`` can be a view depends on ``x``'s memory only.

A pattern has a fixed number of arguments, so there is one rule per pair of ranks (1 to 4
dimensions on each side), built below from one template. The matcher lines up
``x.view(2, 3)``, ``x.view((2, 3))`` and ``torch.reshape(x, [2, 3])``. The shapes are constants,
as in a module traced with static sizes or an exported graph: a shape mixing constants and
graph values (``x.view(x.size(0), -1)``) is not matched, because a literal capture binds a
constant and a variable binds a graph value, and nothing binds "either".
"""

from __future__ import annotations

import inspect

import fxrewrite

_INNER = "abcd"
_OUTER = "efgh"
_ORIGIN = f"{__file__}:{inspect.currentframe().f_lineno}"

#: Shapes drawn by the property checker: small sizes, -1 and 1, so that they often fit.
_DOMAIN_LITERALS = (-1, 1, 2)


def _function(name: str, params: list[str], body: str):
    """A function ``name(x, *params)`` (params annotated int) returning ``body``. torch.fx reads
    a pattern's parameters from its code object, so the function is compiled from a template;
    only the names above and the two op names go into the text."""
    namespace: dict = {}
    exec(f"def {name}(x, {', '.join(params)}):\n    return {body}\n", namespace)
    fn = namespace[name]
    fn.__annotations__ = {p: int for p in params}
    return fn


def _chain(op: str, inner: int, outer: int) -> fxrewrite.Rule:
    first, second = list(_INNER[:inner]), list(_OUTER[:outer])
    outer_call = f"x.{op}({', '.join(second)})"
    pattern = _function("pattern", first + second, f"x.{op}({', '.join(first)}).{op}({', '.join(second)})")
    replacement = _function("replacement", first + second, outer_call)
    return fxrewrite.Rule.from_functions(
        pattern, replacement, name=f"{op}{inner}_{op}{outer}", origin=_ORIGIN,
        doc=f"Replaces x.{op}({', '.join(first)}).{op}({', '.join(second)}) by {outer_call}.",
        domain={"ranks": (0, 4), "sides": (1, 2), "literals": {p: _DOMAIN_LITERALS for p in first + second}},
    )


RESHAPE_CHAINS = fxrewrite.RuleSet(
    _chain(op, inner, outer) for op in ("reshape", "view") for inner in range(1, 5) for outer in range(1, 5)
)
