"""Any string given to parse_rules yields a RuleSet or raises a FxRewriteError, never another
exception: fuzzed with grammar-generated text, mutations of valid rule files and arbitrary text."""

from __future__ import annotations

import importlib.resources
import re
from pathlib import Path

import lark
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.lark import from_lark

from fxrewrite import FxRewriteError, RuleSet, RuleSyntaxError
from fxrewrite.dsl import parse_rules

FUZZ = settings(
    max_examples=max(settings.default.max_examples, 100),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)

DATA = Path(__file__).parent / "data"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "dsl.md"

#: Names that reach deep into the compiler: scope names, attributes, variables, captures.
VOCABULARY = ["x", "y", "t", "s", "conv", "bn", "torch", "F", "nn", "math", "operator", "float", "int", "relu",
              "neg", "shape", "dtype", "dim", "float32", "transpose", "softmax", "Conv2d", "mT", "sum", "os",
              "eval", "where", "_", "__class__", "Foo", "lambda", "load", "ops", "aten", "add"]


def must_parse_or_fail_cleanly(text: str) -> None:
    try:
        result = parse_rules(text, source="fuzz.fxr")
    except RuleSyntaxError as error:
        assert error.filename == "fuzz.fxr" and error.lineno >= 1 and error.offset >= 1
        assert error.msg.startswith(f"fuzz.fxr:{error.lineno}:{error.offset}: ")
    except FxRewriteError:
        pass
    else:
        assert isinstance(result, RuleSet)


def grammar() -> lark.Lark:
    """The DSL grammar, for generating text. Comments are left out of what hypothesis may put
    between any two tokens (one would swallow the rest of its line); _NL draws some instead."""
    text = importlib.resources.files("fxrewrite.dsl").joinpath("grammar.lark").read_text(encoding="utf-8")
    assert "%ignore COMMENT\n" in text
    return lark.Lark(text.replace("%ignore COMMENT\n", ""), parser="lalr", start=["start", "rule_def"])


def spaced(word: str) -> st.SearchStrategy[str]:
    return st.just(f" {word} ")


#: Strategies for the terminals that hypothesis cannot draw well by itself: the line breaks the
#: postlexer would make (declared in the grammar), names from a vocabulary that reaches deep
#: into the compiler, and keywords with spaces around them (hypothesis joins tokens directly).
EXPLICIT = {
    "_NL": st.sampled_from(["\n", "\n\n", "\n# comment\n"]),
    "_NL_INDENT": st.sampled_from(["\n    ", "\n        ", "\n\t", "\n\n    "]),
    "NAME": st.sampled_from(VOCABULARY).map(" {} ".format)
    | st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True).map(" {} ".format),
    "INTEGER": st.sampled_from(["0", "1", "2", "10", "999999999999"]).map(" {} ".format),
    "RULE": st.just("rule "),
    "USE": st.just("use "),
    **{name: spaced(name.lower()) for name in ("AS", "LET", "WHERE", "PRIORITY", "AND", "OR", "NOT", "IN", "IS")},
    **{name: spaced(name.title()) for name in ("TRUE", "FALSE", "NONE")},
}



def texts_from(start: str) -> st.SearchStrategy[str]:
    """Text the grammar derives from ``start`` (a whole file, or one rule)."""
    g = grammar()
    _, rules, _ = g.grammar.compile([start], ())
    terminals = {s.name for r in rules for s in r.expansion if s.is_term}
    return from_lark(g, start=start, explicit={k: v for k, v in EXPLICIT.items() if k in terminals})


GRAMMAR_TEXT = st.one_of(texts_from("start"), texts_from("rule_def"))


@FUZZ
@given(GRAMMAR_TEXT)
def test_grammar_generated_text(text):
    must_parse_or_fail_cleanly(text)


def corpus() -> list[str]:
    files = [p.read_text() for p in sorted(DATA.rglob("*.fxr"))]
    blocks = re.findall(r"^```fxr\n(.*?)^```", DOCS.read_text(), re.MULTILINE | re.DOTALL) if DOCS.exists() else []
    return files + blocks


TOKENS = ["=>", "(", ")", "[", "]", ":", ",", ".", "\n", "\n    ", "    ", "where ", "let ", "rule ", "use ", "_",
          "__class__", "x", "torch.", "-", "**", "'", '"', "#", "\\", "priority ", "as ", "not ", "1e309", "=", "@"]


@st.composite
def mutations(draw) -> str:
    text = draw(st.sampled_from(corpus()))
    for _ in range(draw(st.integers(1, 4))):
        n = len(text)
        i = draw(st.integers(0, n))
        j = draw(st.integers(i, min(n, i + 12)))
        kind = draw(st.sampled_from(["delete", "duplicate", "swap", "insert", "replace"]))
        if kind == "delete":
            text = text[:i] + text[j:]
        elif kind == "duplicate":
            text = text[:j] + text[i:j] + text[j:]
        elif kind == "swap" and j < n and i < j:
            text = text[:i] + text[j] + text[i + 1:j] + text[i] + text[j + 1:]
        elif kind == "insert":
            text = text[:i] + draw(st.sampled_from(TOKENS)) + text[i:]
        else:
            text = text[:i] + draw(st.characters(codec="utf-8")) + text[i + 1:]
    return text


@FUZZ
@given(mutations())
def test_mutated_rule_files(text):
    must_parse_or_fail_cleanly(text)


@FUZZ
@given(st.text())
def test_arbitrary_text(text):
    must_parse_or_fail_cleanly(text)


PIECES = [*"rule x_y:=>()[],.'\"#\n\t -+*/@%<>!0123456789", "rule ", "where ", "let ", "use ", "torch.", "    ",
          "\n    ", "=>", "priority ", "as "]


@FUZZ
@given(st.lists(st.sampled_from(PIECES), max_size=60).map("".join))
def test_text_made_of_the_languages_pieces(text):
    must_parse_or_fail_cleanly(text)
