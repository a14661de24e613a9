"""Any string given to parse_rules yields a RuleSet or raises a FxRewriteError, never another
exception: fuzzed with grammar-generated text, mutations of valid rule files and arbitrary text."""

from __future__ import annotations

import importlib.resources
import re
from pathlib import Path

import lark
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.lark import from_lark

from fxrewrite import FxRewriteError, RuleSet, RuleSyntaxError, isolation
from fxrewrite.dsl import ast, parse_rules

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
              "eval", "where", "_", "__class__", "Foo", "lambda", "load", "ops", "aten", "add",
              # names that change torch's global state, and the modules that lead to them
              "set_default_device", "set_grad_enabled", "set_printoptions", "manual_seed", "modules", "module",
              "register_module_forward_hook", "autograd", "random", "default_generator", "cuda"]


def global_state() -> list:
    """Everything fxrewrite.isolation knows how to read of torch's global state."""
    return [(item, item.get()) for item in isolation._items()]


def must_parse_or_fail_cleanly(text: str) -> None:
    """Parse ``text``: a RuleSet or an FxRewriteError, never another exception, and torch's
    global state exactly as before (a hostile file may try to change it)."""
    before = global_state()
    try:
        _parse_or_fail_cleanly(text)
    finally:
        changed = [item.name for item, value in before if not item.same(item.get(), value)]
        assert not changed, f"parsing changed global torch state: {changed}"


def _parse_or_fail_cleanly(text: str) -> None:
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
    **{name: spaced(name.lower()) for name in ("AS", "LET", "WHERE", "PRIORITY", "AND", "OR", "NOT", "IN", "IS",
                                              "TOLERANCE", "DOMAIN")},
    **{name: spaced(name.title()) for name in ("TRUE", "FALSE", "NONE")},
}



def texts_from(start: str) -> st.SearchStrategy[str]:
    """Text the grammar derives from ``start`` (a whole file, or one rule)."""
    g = grammar()
    _, rules, _ = g.grammar.compile([start], ())
    terminals = {s.name for r in rules for s in r.expansion if s.is_term}
    return from_lark(g, start=start, explicit={k: v for k, v in EXPLICIT.items() if k in terminals})


GRAMMAR_TEXT = st.one_of(texts_from("start"), texts_from("rule_def"))


@pytest.mark.slow
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
@pytest.mark.slow
def test_mutated_rule_files(text):
    must_parse_or_fail_cleanly(text)


@FUZZ
@given(st.text())
@pytest.mark.slow
def test_arbitrary_text(text):
    must_parse_or_fail_cleanly(text)


PIECES = [*"rule x_y:=>()[],.'\"#\n\t -+*/@%<>!0123456789", "rule ", "where ", "let ", "use ", "torch.", "    ",
          "\n    ", "=>", "priority ", "as "]


@FUZZ
@given(st.lists(st.sampled_from(PIECES), max_size=60).map("".join))
def test_text_made_of_the_languages_pieces(text):
    must_parse_or_fail_cleanly(text)


# ---- let graphs and state-changing calls -------------------------------------------------------------

#: Calls that change torch's global state if they ever ran while a rule file loads.
STATE_CHANGING = ["torch.set_default_device('meta')", "torch.set_grad_enabled(False)",
                  "torch.set_printoptions(precision=12)", "torch.manual_seed(3)",
                  "torch.set_default_dtype(torch.float64)", "nn.modules.module.register_module_forward_hook(torch.neg)",
                  "torch.use_deterministic_algorithms(True)",
                  "torch.set_num_threads(1)", "torch.random.fork_rng()", "torch.autograd.set_detect_anomaly(True)"]


@st.composite
def let_expressions(draw, n_lets: int) -> str:
    """An expression over x, y, constants, any let of the rule (itself and later ones included)
    and, now and then, a state-changing call."""
    leaves = st.sampled_from(["x", "y", "1", "2.0", "[1, 2]", "(x, y)", *(f"v{i}" for i in range(n_lets))])
    parts = draw(st.lists(leaves, min_size=1, max_size=4))
    expr = parts[0]
    for part in parts[1:]:
        op = draw(st.sampled_from([" + ", " * ", " - ", " @ ", ", "]))
        expr = f"torch.add({expr}{op}{part})" if op == ", " else f"{expr}{op}{part}"
    if draw(st.integers(0, 4)) == 0:
        expr = f"{expr} + {draw(st.sampled_from(STATE_CHANGING))}"
    if draw(st.booleans()):
        expr = f"{draw(st.sampled_from(['torch.neg', 'torch.relu', 'F.gelu']))}({expr})"
    return expr


@st.composite
def let_graphs(draw) -> str:
    """A rule whose lets use each other in any order: chains, diamonds, self and forward references."""
    n = draw(st.integers(0, 12))
    lines = ["rule lets:"] + [f"    let v{i} = {draw(let_expressions(n))}" for i in range(n)]
    lines.append(f"    {draw(let_expressions(n))} => {draw(let_expressions(n))}")
    if draw(st.booleans()):
        lines.append(f"    where {draw(st.sampled_from(['x.dim() == 2', 'v0 is None', 'torch.is_grad_enabled()']))}")
    return "\n".join(lines) + "\n"


class _StepCounter:
    """Counts the expression nodes the compiler visits (every walk asks ``ast.children``)."""

    def __init__(self) -> None:
        self.steps = 0
        self._original = ast.children

    def __enter__(self) -> _StepCounter:
        def counting(node):
            self.steps += 1
            return self._original(node)

        ast.children = counting
        return self

    def __exit__(self, *exc) -> None:
        ast.children = self._original


@FUZZ
@given(let_graphs())
@pytest.mark.slow
def test_let_graphs_load_or_fail_cleanly_in_steps_linear_in_their_size(text):
    with _StepCounter() as counter:
        must_parse_or_fail_cleanly(text)
    assert counter.steps <= 40 * len(text), (counter.steps, len(text))


@FUZZ
@given(st.sampled_from(STATE_CHANGING), st.sampled_from(["pattern", "replacement", "where", "let"]))
def test_state_changing_calls_never_change_global_state(call, position):
    text = {
        "pattern": f"rule r:\n    torch.neg(x) + {call} => x\n",
        "replacement": f"rule r:\n    torch.neg(x) => x + {call}\n",
        "where": f"rule r:\n    torch.neg(x) => x\n    where {call}\n",
        "let": f"rule r:\n    let s = {call}\n    torch.neg(x) + s => x\n",
    }[position]
    before = global_state()
    try:
        parse_rules(text, source="fuzz.fxr")
    except FxRewriteError as error:
        assert "changes torch's global state" in str(error)
    else:
        raise AssertionError(f"loaded a rule calling {call}")
    assert all(item.same(item.get(), value) for item, value in before)
