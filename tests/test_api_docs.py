"""docs/api.md is checked against the package: every public name is documented, and every
signature it shows is the function's own (parameter names, order, keyword-only marker and
defaults)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import fxrewrite

API = (Path(__file__).resolve().parent.parent / "docs" / "api.md").read_text()
#: A definition line: it starts with the signature, e.g. `explain(target, rules, *, misses=3) -> Explanation`
SIGNATURE = re.compile(r"^`(@?[A-Za-z_][\w.]*)\(([^`]*)\)(?: -> [^`]*)?`", re.MULTILINE)


def documented_signatures() -> dict[str, str]:
    found = {}
    for name, params in SIGNATURE.findall(API):
        if "..." in params or name.startswith("@"):
            continue  # prose like `@rule(name=..., ...)` or a call in an example
        found.setdefault(name, params)
    return found


def resolve(dotted: str):
    obj = fxrewrite
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def shown(signature: inspect.Signature) -> str:
    parts, star = [], False
    for p in signature.parameters.values():
        if p.name.startswith("_") or p.name == "self":
            continue  # private parameters are not part of the documented API
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        parts.append(p.name if p.default is p.empty else f"{p.name}={p.default!r}".replace("'", '"'))
    return ", ".join(parts)


@pytest.mark.parametrize("name", sorted(n for n in fxrewrite.__all__ if n != "__version__"))
def test_every_public_name_is_documented(name):
    assert re.search(rf"\b{name}\b", API), f"docs/api.md does not mention {name}"


@pytest.mark.parametrize("name", sorted(documented_signatures()))
def test_documented_signatures_are_the_real_ones(name):
    obj = resolve(name)
    target = obj.__init__ if inspect.isclass(obj) and not hasattr(obj, "__attrs_attrs__") else obj
    real = shown(inspect.signature(target))
    assert documented_signatures()[name].replace(" ", "") == real.replace(" ", ""), f"{name}: docs say " \
        f"({documented_signatures()[name]}), the code has ({real})"
