"""fxrewrite.dispatch.RuleIndex: the rules that can match at a node, against its slow twin
(every rule filed under the node's op key), counted in matches, never in seconds."""

from __future__ import annotations

import collections
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from _helpers import standard_rules, tiny_eager_gpt2
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fuzz_rewrite import random_graph

from fxrewrite import Rule, RuleSet
from fxrewrite.dispatch import RuleIndex
from fxrewrite.index import OpIndex
from fxrewrite.match import match_at
from fxrewrite.meta import propagate_inputs

Found = collections.Counter[tuple[str, str]]


def matches(gm: fx.GraphModule, rules_at: Callable[[fx.Node], Sequence[Rule]]) -> Found:
    """How many matches each (rule, anchor) pair has when the rules tried at a node are
    ``rules_at(node)``: the driver's search, without rewriting."""
    ops = OpIndex(gm.graph)
    modules = dict(gm.named_modules())
    found: Found = collections.Counter()
    for node in gm.graph.nodes:
        for rule in rules_at(node):
            count = sum(1 for _ in match_at(rule.compiled, node, gm, modules=modules, candidates=ops.nodes))
            if count:
                found[(rule.name, node.name)] += count
    return found


def assert_same_matches(gm: fx.GraphModule, index: RuleIndex) -> Found:
    """The index's candidates find exactly the plain search's matches, and are a sub-list of
    the plain rules in the same order."""
    for node in gm.graph.nodes:
        plain, candidates = list(index.plain(node)), list(index.candidates(node))
        it = iter(plain)
        assert all(any(r is p for p in it) for r in candidates), (node.name, candidates, plain)
    plain_found, indexed_found = matches(gm, index.plain), matches(gm, index.candidates)
    assert indexed_found == plain_found
    return plain_found


# -- the index leaves out rules -------------------------------------------------------------------


def _shift_scale(i: int, c: float, d: float) -> Rule:
    """``(x + c) * d => x * d + c * d``."""
    return Rule.from_functions(lambda x: (x + c) * d, lambda x: x * d + c * d, name=f"shift_scale_{i}")


LITERAL_RULES = [_shift_scale(i, 0.5 + i, 2.0 + 0.25 * (i % 4)) for i in range(40)]


def _candidates_at(fn: Callable[..., Any], rules: Sequence[Rule], name: str) -> list[str]:
    gm = fx.symbolic_trace(fn)
    node = next(n for n in gm.graph.nodes if n.name == name)
    return [r.name for r in RuleIndex(rules).candidates(node)]


def test_rules_differing_in_a_literal_of_an_inner_operation_are_told_apart():
    assert _candidates_at(lambda x: (x + 3.5) * 2.75, LITERAL_RULES, "mul") == ["shift_scale_3"]


def test_commuted_operands_and_another_spelling_are_still_found():
    assert _candidates_at(lambda x: torch.mul(2.75, torch.add(3.5, x)), LITERAL_RULES, "mul") == ["shift_scale_3"]
    assert _candidates_at(lambda x: x.add(3.5).mul(2.75), LITERAL_RULES, "mul") == ["shift_scale_3"]


def test_an_identity_between_the_anchor_and_the_inner_operation_is_looked_through():
    def f(x):
        return F.dropout(x + 3.5, 0.5, training=False).clone() * 2.75

    assert _candidates_at(f, LITERAL_RULES, "mul") == ["shift_scale_3"]
    gm = fx.symbolic_trace(f)
    assert set(assert_same_matches(gm, RuleIndex(LITERAL_RULES))) == {("shift_scale_3", "mul")}


def test_a_value_the_graph_computes_where_a_literal_is_written_leaves_no_literal_rule():
    assert _candidates_at(lambda x, y: (x + y) * 2.75, LITERAL_RULES, "mul") == []


def test_a_literal_of_another_type_is_another_literal():
    rules = [_times(i, c) for i, c in enumerate((2, 3, 4))]
    assert _candidates_at(lambda x: x * 3, rules, "mul") == ["m1"]
    assert _candidates_at(lambda x: x * 3.0, rules, "mul") == []


def _times(i: int, c: Any) -> Rule:
    return Rule.from_functions(lambda x: x * c, lambda x: x + x * (c - 1), name=f"m{i}")


def _after(op: Callable[..., Any], i: int) -> Rule:
    return Rule.from_functions(lambda x: torch.relu(op(x)), lambda x: op(x), name=f"relu_after_{i}")


def test_rules_differing_in_the_op_feeding_the_anchor_are_told_apart():
    rules = [_after(op, i) for i, op in enumerate((torch.neg, torch.sin, torch.cos, torch.exp))]
    assert _candidates_at(lambda x: torch.relu(torch.cos(x)), rules, "relu") == ["relu_after_2"]


def test_a_node_no_rule_is_anchored_at_has_no_candidates():
    assert _candidates_at(lambda x: torch.sigmoid(x), LITERAL_RULES, "sigmoid") == []


# -- the differential tests: exactly the plain search's matches -----------------------------------


def _attention(q, k, v, mask):
    """Attention as the library's patterns spell it, with the spellings around them a model has."""
    scores = torch.matmul(q, k.transpose(-1, -2)) / 8.0 + mask
    h = torch.matmul(F.dropout(torch.softmax(scores, dim=-1), p=0.0, training=False), v)
    h = h * torch.sigmoid(h) + torch.neg(torch.neg(q))
    return torch.relu(torch.relu(h)).transpose(1, 2).contiguous().reshape(2, 4, 8)


def test_the_shipped_library_finds_the_same_matches_on_an_attention_block():
    gm = fx.symbolic_trace(_attention)
    found = assert_same_matches(gm, _LIBRARY_INDEX())
    assert len(found) >= 3  # the library matches there: the comparison is not vacuous


@pytest.mark.slow
def test_the_shipped_library_finds_the_same_matches_on_the_whole_gpt2_and_its_export():
    gpt2 = tiny_eager_gpt2()

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gpt2 = gpt2

        def forward(self, ids):
            return self.gpt2(ids, use_cache=False).logits

    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported = torch.export.export(Logits().eval(), (ids,)).graph_module
    assert assert_same_matches(exported, _LIBRARY_INDEX())


@pytest.mark.slow
@settings(max_examples=80, deadline=None, derandomize=True)
@given(st.data())
def test_the_shipped_library_finds_the_same_matches_on_random_graphs(data):
    gm, _, _ = random_graph(data.draw)
    assert_same_matches(gm, _LIBRARY_INDEX())


_LIBRARY_CACHE: dict[str, RuleIndex] = {}


def _LIBRARY_INDEX() -> RuleIndex:
    if "index" not in _LIBRARY_CACHE:
        _LIBRARY_CACHE["index"] = RuleIndex(standard_rules())
    return _LIBRARY_CACHE["index"]


# random rule sets over a small vocabulary, on graphs spelt with the same ops and literals

LITERALS = (0.5, 1.0, 2.0, 2, 3, -1.0, True)
BINARY: dict[str, tuple[str, ...]] = {
    "add": ("{a} + {b}", "torch.add({a}, {b})", "{a}.add({b})"),
    "mul": ("{a} * {b}", "torch.mul({a}, {b})", "{a}.mul({b})"),
    "sub": ("{a} - {b}", "torch.sub({a}, {b})"),
    "max": ("torch.maximum({a}, {b})",),
}
UNARY: dict[str, tuple[str, ...]] = {
    "relu": ("torch.relu({a})", "{a}.relu()"),
    "neg": ("-{a}", "torch.neg({a})"),
    "sin": ("torch.sin({a})",),
    "clamp": ("torch.clamp({a}, {c}, 4.0)", "{a}.clamp(min={c})"),
    "addc": ("torch.add({a}, {c}, alpha=2)",),
}
HOLE = "__v__"  # a pattern's variable in generated source, filled in by a rule's parameter or a program's value
#: Identities the matcher looks through without metadata (graph side only).
IDENTITIES = ("{a}.clone()", "F.dropout({a}, 0.5, training=False)", "{a}", "{a}.float()", "{a}.contiguous()",
              "{a}.to(torch.float32)")


def expressions(leaves: st.SearchStrategy[str], depth: int) -> st.SearchStrategy[str]:
    """Python source of an expression over ``leaves`` and literals, at most ``depth`` ops deep."""
    literal = st.sampled_from(LITERALS).map(repr)
    if depth == 0:
        return leaves
    inner = expressions(leaves, depth - 1)

    @st.composite
    def build(draw: Any) -> str:
        if draw(st.booleans()):
            spelling = draw(st.sampled_from(UNARY[draw(st.sampled_from(sorted(UNARY)))]))
            return "(" + spelling.format(a=draw(inner), c=draw(literal)) + ")"
        spelling = draw(st.sampled_from(BINARY[draw(st.sampled_from(sorted(BINARY)))]))
        a, b = draw(inner), draw(st.one_of(inner, literal) if spelling != "torch.maximum({a}, {b})" else inner)
        if draw(st.booleans()) and not spelling.startswith("{a}."):
            a, b = b, a
        if a in map(repr, LITERALS):  # a method call on a literal, or two literals: put the value first
            a, b = b, a
        return "(" + spelling.format(a=a, b=b) + ")"

    return build()


def _function(params: Sequence[str], body: str) -> Callable[..., Any]:
    namespace: dict[str, Any] = {"torch": torch, "F": F}
    exec(f"def f({', '.join(params)}):\n    return {body}\n", namespace)
    return namespace["f"]  # type: ignore[no-any-return]


@st.composite
def rules_and_program(draw: Any, metadata: bool = True) -> tuple[RuleSet, fx.GraphModule]:
    bodies = draw(st.lists(expressions(st.just(HOLE), 2), min_size=1, max_size=10))
    variants = draw(st.lists(st.sampled_from(LITERALS), min_size=0, max_size=6))
    rules, sources = [], []
    for i, body in enumerate(bodies):
        # each drawn pattern also comes with copies that differ only in one literal
        copies = [body] + [_other_literal(body, v) for v in variants]
        for j, text in enumerate(dict.fromkeys(copies)):
            rule = _rule_or_none(text, f"r{i}_{j}")
            if rule is not None:
                rules.append(rule)
                sources.append(text)
    ruleset = RuleSet(rules)
    lines, names = [], ["x0", "x1"]
    for i in range(draw(st.integers(1, 10))):
        leaves = st.sampled_from(names)
        if sources and draw(st.booleans()):
            body = draw(st.sampled_from(sources)).replace(HOLE, draw(leaves))
        else:
            body = draw(expressions(leaves, 2))
        lines.append(f"v{i} = {draw(st.sampled_from(IDENTITIES)).format(a=body)}")
        names.append(f"v{i}")
    gm = fx.symbolic_trace(_program(lines, names))
    if metadata and draw(st.booleans()):  # metadata: casts to the dtype a value has and contiguous() become identities
        propagate_inputs(gm, (torch.randn(2, 3), torch.randn(2, 3)))
    return ruleset, gm


def _program(lines: list[str], names: list[str]) -> Callable[..., Any]:
    source = "def f(x0, x1):\n    " + "\n    ".join(lines) + f"\n    return ({', '.join(names[2:])},)\n"
    namespace: dict[str, Any] = {"torch": torch, "F": F}
    exec(source, namespace)
    return namespace["f"]  # type: ignore[no-any-return]


def _other_literal(body: str, value: Any) -> str:
    for literal in map(repr, LITERALS):
        if literal in body:
            return body.replace(literal, repr(value), 1)
    return body


def _rule_or_none(body: str, name: str) -> Rule | None:
    if HOLE not in body:
        return None
    fn = _function(["x"], body.replace(HOLE, "x"))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return Rule.from_functions(fn, fn, name=name)
    except Exception:  # a pattern fxrewrite refuses (a literal-only operation, ...): not this test's business
        return None


def _same_matches_and_pruned(case: tuple[RuleSet, fx.GraphModule]) -> None:
    ruleset, gm = case
    index = RuleIndex(ruleset)
    assert_same_matches(gm, index)
    PRUNED["tries"] += sum(len(index.plain(n)) for n in gm.graph.nodes)
    PRUNED["left out"] += sum(len(index.plain(n)) - len(index.candidates(n)) for n in gm.graph.nodes)


PRUNED: collections.Counter[str] = collections.Counter()


@settings(max_examples=8, deadline=None, derandomize=True)
@given(rules_and_program(metadata=False))  # fake-tensor propagation costs a second: the slow twin below has it
def test_random_rule_sets_find_the_same_matches_on_random_programs(case):
    _same_matches_and_pruned(case)


@pytest.mark.slow
@settings(max_examples=200, deadline=None, derandomize=True)
@given(rules_and_program())
def test_many_random_rule_sets_find_the_same_matches_on_random_programs(case):
    _same_matches_and_pruned(case)


def test_cases_like_the_random_ones_exercise_the_index():
    # the differential tests above are not vacuous: on such a case the index leaves rules out
    bodies = ["(__v__ * 2.0)", "(torch.relu(__v__) + 1.0)", "(torch.add(__v__, 3, alpha=2))", "(-(__v__ - 0.5))"]
    rules = [_rule_or_none(_other_literal(b, v), f"r{i}_{j}") for i, b in enumerate(bodies)
             for j, v in enumerate(LITERALS)]
    lines = [f"v{i} = {b.replace(HOLE, 'x0')}" for i, b in enumerate(bodies)]
    case = (RuleSet(dict.fromkeys(r for r in rules if r is not None)),
            fx.symbolic_trace(_program(lines, ["x0", "x1", *(f"v{i}" for i in range(len(bodies)))])))
    PRUNED.clear()
    _same_matches_and_pruned(case)
    assert PRUNED["left out"] > PRUNED["tries"] // 4, PRUNED


def test_the_rules_offered_per_set_of_input_keys_are_those_worked_out_at_every_node(monkeypatch):
    """``MEMO_BY_INPUTS`` (a bucket without literal groups answers once per set of input keys)
    offers, at every node, the rules its slow twin works out anew there; and its memo is used."""
    import fxrewrite.dispatch as dispatch

    rules = [*(_after(op, i) for i, op in enumerate((torch.neg, torch.sin, torch.cos, torch.exp))),
             Rule.from_functions(lambda x, y: torch.relu(torch.sin(x) + y), lambda x, y: torch.relu(y + torch.sin(x)),
                                 name="relu_sin_add")]

    def f(x):
        for _ in range(3):
            x = torch.relu(torch.sin(x)) + torch.relu(torch.cos(x)) + torch.relu(torch.sin(x) + x) + torch.relu(x)
        return x

    programs = [(RuleSet(rules), fx.symbolic_trace(f)),
                (lambda: RuleIndex(standard_rules()), fx.symbolic_trace(_attention))]
    for rules_or_index, gm in programs:
        offered = {}
        for memo in (False, True):
            monkeypatch.setattr(dispatch, "MEMO_BY_INPUTS", memo)
            index = rules_or_index() if callable(rules_or_index) else RuleIndex(rules_or_index)
            offered[memo] = [(n.name, [r.name for r in index.candidates(n)]) for n in gm.graph.nodes]
        assert offered[True] == offered[False]
    memos = [b._memo for b in RuleIndex(rules)._buckets.values()]
    assert sum(len(m) for m in memos) == 0
    index = RuleIndex(rules)
    relus = [n for n in fx.symbolic_trace(f).graph.nodes if n.target is torch.relu]
    for node in relus:
        index.candidates(node)
    assert 0 < sum(len(b._memo) for b in index._buckets.values()) < len(relus)


# -- cost, counted in candidates (deterministic), not seconds -------------------------------------


def _literal_family(count: int) -> list[Rule]:
    return [_shift_scale(i, 0.5 + i / 8, 1.5 + (i % 97) / 16) for i in range(count)]


def _bounded_candidates(count: int, planted: int) -> None:
    """``count`` literal-differing rules on a program holding ``planted`` of their patterns and
    as many multiplications no rule matches: at most one candidate rule per node, and the
    matches of the plain search."""
    rules = _literal_family(count)
    index = RuleIndex(rules)
    step = count // planted

    def f(x):
        for i in range(0, count, step):
            x = torch.relu((x + (0.5 + i / 8)) * (1.5 + (i % 97) / 16)) + (x * 3.0)
        return x

    gm = fx.symbolic_trace(f)
    tries = [len(index.candidates(n)) for n in gm.graph.nodes]
    plain = [len(index.plain(n)) for n in gm.graph.nodes]
    assert sum(plain) == count * 2 * planted and max(tries) <= 1, (max(tries), sum(tries))
    assert sum(tries) == planted  # the one rule each planted block is, nothing at the other products
    assert len(assert_same_matches(gm, index)) == planted


def test_many_literal_differing_rules_leave_a_bounded_number_of_candidates_per_node():
    _bounded_candidates(100, 10)


@pytest.mark.slow
def test_a_thousand_literal_differing_rules_leave_a_bounded_number_of_candidates_per_node():
    _bounded_candidates(1000, 20)


# -- the plain search's attempt counts, kept without trying the rules left out --------------------


def _drive_once(gm: fx.GraphModule, rules_at: Callable[[fx.Node], Sequence[Rule]],
                visited: Callable[[fx.Node, Rule | None], None] | None = None) -> collections.Counter[str]:
    """The driver's loop at every node, without rewriting: rules tried in order until one matches."""
    attempts: collections.Counter[str] = collections.Counter()
    for node in gm.graph.nodes:
        applied = None
        for rule in rules_at(node):
            attempts[rule.name] += 1
            if next(iter(match_at(rule.compiled, node, gm)), None) is not None:
                applied = rule
                break
        if visited is not None:
            visited(node, applied)
    return attempts


def test_the_index_tells_how_many_attempts_the_plain_search_would_have_counted():
    rules = [*LITERAL_RULES[:12], _times(0, 2), _times(1, 3),
             *(_after(op, i) for i, op in enumerate((torch.neg, torch.sin)))]
    rules.insert(3, Rule.from_functions(lambda x: x * 2.75, lambda x: x + x * 1.75, name="times_late"))

    def f(x):
        y = (x + 3.5) * 2.75 + torch.relu(torch.sin(x)) * 3
        return torch.relu(y * 2.75) * 2 + (y + 4.5) * 2.5

    gm = fx.symbolic_trace(f)
    index = RuleIndex(rules)
    plain = _drive_once(gm, index.plain)
    tried = _drive_once(gm, index.candidates, index.visited)
    assert sum(tried.values()) < sum(plain.values()) / 2
    left_out = index.left_out()
    assert {r.name: tried[r.name] + left_out[r.name] for r in rules} == {r.name: plain[r.name] for r in rules}


def test_the_index_says_where_it_tells_rules_apart_by_a_literal():
    from fxrewrite import Rule
    from fxrewrite.canon import op_key_of

    def add_then_double(c):
        return Rule.from_functions(lambda x: (x + c) * 2, lambda x: x * 2 + c * 2, name=f"add_{c}")

    alike = [add_then_double(float(c)) for c in range(4)]
    different = [Rule.from_functions(lambda x: torch.relu(x) * 2, lambda x: 2 * torch.relu(x), name="relu_mul")]
    key = op_key_of("call_function", torch.mul)
    assert RuleIndex(alike).discriminates(key)
    assert not RuleIndex(different).discriminates(key)
    assert not RuleIndex(alike).discriminates(op_key_of("call_function", torch.neg))
