"""docs/api.md is checked against the package: every public name is documented, and every
signature it shows is the function's own (parameter names, order, keyword-only marker and
defaults)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import fxrewrite

API = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
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


#: A code span of the page, e.g. `Report`, `@rule`, `load_rules(path=None, ...) -> RuleSet`.
CODE_SPAN = re.compile(r"`([^`\n]+)`")


def _defined(spans: list[str]) -> set[str]:
    """The names leading ``spans`` (`@rule`, `Rule.from_functions(...)`) and the declared results
    of the signatures among them (`explain(...) -> Explanation`)."""
    names = set()
    for span in spans:
        names.update(re.findall(r"^@?([A-Za-z_]\w*)", span))
        names.update(re.findall(r"\) -> (?:\w+\[)?([A-Za-z_]\w*)", span))
    return names


def documented_names(page: str) -> set[str]:
    """The names ``page`` documents: the terms of its definition entries (a line of code spans
    followed by a ``: description`` line) and the results their signatures declare, a name
    described in parentheses right after it (`TensorView` (`shape`, `dtype`, ...)), and the errors
    of its "Errors and warnings" section, each named with the builtin it derives from. A name met
    only in prose, in a description or in an example is not documented by it."""
    lines = page.splitlines()
    names = set(re.findall(r"`([A-Za-z_]\w*)` \(", page))
    for line, following in zip(lines, [*lines[1:], ""]):
        if line.startswith("`") and following.startswith(": "):
            names |= _defined(CODE_SPAN.findall(line))
    errors = page.partition("\n## Errors and warnings\n")[2].partition("\n## ")[0]
    return names | _defined(CODE_SPAN.findall(errors))


#: Public names docs/api.md does not document yet (the test XPASSes, and fails, once it does).
UNDOCUMENTED: dict[str, str] = {}


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.xfail(reason=UNDOCUMENTED[n], strict=True)) if n in UNDOCUMENTED else n
    for n in sorted(n for n in fxrewrite.__all__ if n != "__version__")
])
def test_every_public_name_is_documented(name):
    assert name in documented_names(API), (f"docs/api.md has no entry for {name}: add a line with its signature "
                                            f"(or its name) in backticks, followed by a ': what it does' line")


def test_a_name_met_only_in_prose_a_description_or_an_argument_list_is_not_documented():
    page = ("A Report.\n\n`explain(target, rules, *, misses=3) -> Explanation`, `find(Match)`\n"
            ": Columns `rule` and `Rule`; a `View` (`shape`).\n\n`lone`\n\n## Errors and warnings\n\n"
            "`Boom` (`ValueError`), its subclass `Bang`.\n")
    assert documented_names(page) == {"explain", "Explanation", "find", "View", "Boom", "ValueError", "Bang"}


@pytest.mark.parametrize("name", sorted(documented_signatures()))
def test_documented_signatures_are_the_real_ones(name):
    obj = resolve(name)
    target = obj.__init__ if inspect.isclass(obj) and not hasattr(obj, "__attrs_attrs__") else obj
    real = shown(inspect.signature(target))
    assert documented_signatures()[name].replace(" ", "") == real.replace(" ", ""), f"{name}: docs say " \
        f"({documented_signatures()[name]}), the code has ({real})"
