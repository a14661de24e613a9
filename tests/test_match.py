"""The matcher (``fxrewrite.match``), called directly: what a match binds, why a candidate is
missed, and the soundness checks (containment, variables bound to the match's own values,
cycles), without the driver around it."""

from __future__ import annotations

import operator
from typing import Annotated

import pytest
import torch
import torch.fx as fx

import fxrewrite
from fxrewrite.match import Match, MatchOptions, Rejection, match_at
from fxrewrite.pattern import trace_pattern


def pattern_of(fn, name="p"):
    return trace_pattern(fn, rule_name=name, origin="<test>:1")


def node(gm: fx.GraphModule, name: str) -> fx.Node:
    return next(n for n in gm.graph.nodes if n.name == name)


def matches(pattern, gm, anchor_name, **kwargs) -> tuple[list[Match], list[Rejection]]:
    rejections: list[Rejection] = []
    found = list(match_at(pattern, node(gm, anchor_name), gm, on_reject=rejections.append, **kwargs))
    return found, rejections


def test_a_match_binds_variables_nodes_and_outputs():
    pattern = pattern_of(lambda x, y: torch.relu(x + y))
    gm = fx.symbolic_trace(lambda a, b: torch.relu(a + b) * 2)
    found, _ = matches(pattern, gm, "relu")
    assert [(m.node("x").name, m.node("y").name) for m in found] == [("a", "b"), ("b", "a")]  # + commutes
    m = found[0]
    assert [n.name for n in m.nodes] == ["add", "relu"]
    assert [n.name for n in m.outputs] == ["relu"] and m.anchor.name == "relu"


def test_commutative_operands_match_in_either_order_and_can_be_switched_off():
    pattern = pattern_of(lambda x, y: torch.relu(x) + y)
    gm = fx.symbolic_trace(lambda a, b: b + torch.relu(a))
    assert len(matches(pattern, gm, "add")[0]) == 1
    assert matches(pattern, gm, "add", options=MatchOptions(commutative=False))[0] == []


def test_an_inner_value_used_outside_is_a_rejection_naming_the_user():
    pattern = pattern_of(lambda x: torch.neg(torch.neg(x)))
    gm = fx.symbolic_trace(lambda a: (lambda inner: torch.neg(inner) + inner)(torch.neg(a)))
    found, rejections = matches(pattern, gm, "neg_1")
    assert found == []
    assert any("is also used by 'add' outside the match" in r.reason for r in rejections)


def test_a_variable_never_binds_a_value_the_match_computes():
    pattern = pattern_of(lambda a, b: torch.relu(a) + b)
    gm = fx.symbolic_trace(lambda t: (lambda r: r + r)(torch.relu(t)))
    found, rejections = matches(pattern, gm, "add")
    assert found == []
    assert any("which the match itself computes" in r.reason for r in rejections)


def test_a_literal_binds_only_a_typed_capture_of_its_type():
    untyped = pattern_of(lambda x, s: x * s)
    gm = fx.symbolic_trace(lambda a: a * 0.5)
    found, rejections = matches(untyped, gm, "mul")
    assert found == [] and any("cannot bind the constant 0.5" in r.reason for r in rejections)

    def scaled(x, s: float):
        return x * s

    (m,), _ = matches(pattern_of(scaled), gm, "mul")
    assert m["s"] == 0.5


def test_the_closest_miss_names_the_argument_and_both_values():
    pattern = pattern_of(lambda x: torch.sum(x, dim=1))
    gm = fx.symbolic_trace(lambda a: torch.sum(a, dim=0))
    found, rejections = matches(pattern, gm, "sum_1")
    assert found == []
    assert any("argument 'dim' differs: pattern has 1, graph has 0" in r.reason for r in rejections)


def test_a_multi_output_match_that_would_feed_itself_is_refused():
    def pattern(x, y):
        r = torch.relu(x)
        return r, r + y

    def feeds_itself(v):
        r = torch.relu(v)
        return r + torch.neg(r)

    gm = fx.symbolic_trace(feeds_itself)
    found, rejections = matches(pattern_of(pattern), gm, "add")
    assert found == []
    assert any("would create a cycle" in r.reason for r in rejections)


def test_checks_export_adds_go_with_the_match():
    class Net(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x).to(torch.float64)

    program = torch.export.export(Net(), (torch.randn(3),))
    gm = program.graph_module
    pattern = pattern_of(lambda x: torch.relu(x).to(torch.float64))
    anchor = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.to.dtype and n.args[1] == torch.float64)
    (m,) = match_at(pattern, anchor, gm)
    checks = [n for n in m.nodes if n.target is torch.ops.aten._assert_tensor_metadata.default]
    assert checks and all(c.args[0] in m.nodes for c in checks)


def _every_match(pattern, gm, *, searched: bool):
    """Every match of ``pattern`` in ``gm``: by the backtracking search (asking for rejections
    forces it) or as the driver asks (choice-free patterns take the straight walk)."""
    on_reject = (lambda rejection: None) if searched else None
    found = []
    for node in gm.graph.nodes:
        for m in match_at(pattern, node, gm, on_reject=on_reject):
            found.append((node.name, sorted((k, str(v)) for k, v in m.bindings.items()),
                          [n.name for n in m.nodes], [n.name for n in m.outputs]))
    return found


@pytest.mark.slow  # every shipped rule on every shipped case: 3 s
def test_the_straight_walk_finds_what_the_search_finds_for_every_shipped_rule_on_every_shipped_case():
    from test_stdlib import CASES, LIBRARY  # tests/ is on sys.path, as for _helpers

    from fxrewrite.meta import propagate_inputs
    from fxrewrite.target import to_graph_module

    straight = 0
    for case_name, case in sorted(CASES.items()):
        program = case.model()
        gm = to_graph_module(program, inplace=False)
        propagate_inputs(gm, case.inputs())
        for rule in LIBRARY:
            expected = _every_match(rule.compiled, gm, searched=True)
            assert _every_match(rule.compiled, gm, searched=False) == expected, (case_name, rule.name)
            straight += rule.compiled.choice_free and bool(expected)
    assert straight > 40  # the walk was taken, and found matches, for many rules


def test_a_pattern_with_alternatives_is_not_walked_straight():
    assert pattern_of(lambda x: torch.relu(torch.neg(x))).choice_free
    assert not pattern_of(lambda x, y: torch.relu(x + y)).choice_free  # two operand orders
    assert not pattern_of(lambda x: (torch.relu(x), torch.neg(x))).choice_free  # two outputs
    assert not pattern_of(lambda q: q / q.size(-1)).choice_free  # the size may be folded


def _scaled(x, s: float):
    return torch.relu(x) * s


def test_a_commutative_call_whose_graph_operands_decide_the_order_is_walked_straight():
    pattern = pattern_of(_scaled)
    assert pattern.choice_free  # relu(x) matches only a node, s only a constant
    assert not pattern_of(lambda x, y: torch.relu(x) * y).choice_free  # both operands may be nodes
    cases = [(lambda a: torch.relu(a) * 2.0, 1), (lambda a: 2.0 * torch.relu(a), 1),
             (lambda a: torch.relu(a) * torch.relu(a), 0), (lambda a: torch.relu(a) * torch.relu(a + 1), 0)]
    for written, count in cases:
        gm = fx.symbolic_trace(written)
        walked = _every_match(pattern, gm, searched=False)
        assert walked == _every_match(pattern, gm, searched=True)
        assert len(walked) == count, gm.code
        assert all(dict(bindings)["s"] == "2.0" for _, bindings, _, _ in walked)


def test_when_variables_may_bind_constants_the_search_tries_both_orders_of_a_walkable_call():
    def scaled(x, s: float):
        return x * s

    pattern = pattern_of(scaled)
    assert pattern.choice_free
    graph = fx.Graph()
    mul = graph.call_function(operator.mul, (2.0, 3.0))  # two constants: x may bind either of them
    graph.output(mul)
    gm = fx.GraphModule(torch.nn.Module(), graph)
    options = MatchOptions(variables_bind_literals=True)
    walked = [dict(m.bindings) for m in match_at(pattern, mul, gm, options=options)]
    searched = [dict(m.bindings) for m in match_at(pattern, mul, gm, options=options, on_reject=lambda r: None)]
    assert walked == searched == [{"x": 2.0, "s": 3.0}, {"x": 3.0, "s": 2.0}]


def test_a_match_on_a_copy_of_the_pattern_binds_the_copies_and_the_literal_values():
    from fxrewrite import Rule

    def pattern_fn(x, s: float):
        return torch.relu(x) * s

    def replacement(x, s: float):
        return torch.relu(x * s)

    rule = Rule.from_functions(pattern_fn, replacement, name="scale")
    pattern = rule.compiled
    copy = fx.Graph()
    copies: dict = {}
    copy.graph_copy(pattern.graph, copies)
    m = Match.on_copy(pattern, copies, {"s": 2.0})
    assert m.bindings["x"] is copies[pattern.placeholders["x"]] and m["s"] == 2.0
    assert m.anchor is copies[pattern.anchor] and [n.target for n in m.nodes] == [torch.relu, operator.mul]


def test_a_tensor_view_without_metadata_raises_a_metadata_error_that_says_what_to_do():
    import pickle

    from fxrewrite.errors import MetadataError
    from fxrewrite.match import TensorView

    gm = fx.symbolic_trace(lambda a: torch.relu(a))
    relu = node(gm, "relu")
    with pytest.raises(MetadataError, match=r"node 'relu' \(%relu .*\) carries no shape/dtype metadata. Pass "
                                            r"example_inputs="):
        _ = TensorView(relu).dtype
    with pytest.raises(MetadataError) as raised:
        _ = TensorView(relu).shape
    copy = pickle.loads(pickle.dumps(raised.value))  # written when read, pickled as the plain error
    assert type(copy) is MetadataError and str(copy) == str(raised.value) and "relu" in repr(raised.value)


# -- tree-shaped patterns matched by closures, against the compiled walk ---------------------------


def _tree_rules():
    from _helpers import standard_rules

    from fxrewrite import Rule

    extra = [Rule.from_functions(lambda x: torch.neg(torch.neg(x)), lambda x: x, name="neg_neg"),
             Rule.from_functions(lambda x: torch.relu(torch.abs(torch.sin(x))), lambda x: torch.abs(torch.sin(x)),
                                 name="relu_abs_sin"),
             Rule.from_functions(lambda x, y: torch.sub(torch.neg(x), y), lambda x, y: torch.neg(x + y),
                                 name="sub_neg"),
             Rule.from_functions(lambda x: torch.clamp(torch.neg(x), -1.0, 1.0),
                                 lambda x: torch.neg(x).clamp(-1.0, 1.0), name="clamp_neg")]
    return [*standard_rules(), *extra]


def _every_tree_match(gm: fx.GraphModule, rules, *, trees: bool, via_matcher: bool = False) -> list[tuple]:
    import fxrewrite.match as match
    from fxrewrite.canon import node_keys
    from fxrewrite.index import OpIndex

    saved, match.FAST_TREES = match.FAST_TREES, trees
    try:
        index, modules, found = OpIndex(gm.graph), dict(gm.named_modules()), []
        matchers = {id(r): match.matcher(r.compiled, gm, modules=modules, candidates=index.nodes) for r in rules}
        for node in gm.graph.nodes:
            for rule in (r for r in rules if r.anchor_key in node_keys(node)):
                matches = (matchers[id(rule)](node) if via_matcher else
                           match_at(rule.compiled, node, gm, modules=modules, candidates=index.nodes))
                for m in matches:
                    found.append((rule.name, node.name, sorted((k, str(v)) for k, v in m.bindings.items()),
                                  [n.name for n in m.nodes], [n.name for n in m.outputs],
                                  [(p.name, str(g)) for p, g in m.node_map.items()]))
        return found
    finally:
        match.FAST_TREES = saved


def _count_tree_decisions(monkeypatch) -> dict[str, int]:
    """Counts, from now on, the tries the tree closures decide and those they hand over to the
    slow path (programs compiled afresh, with the counting closures)."""
    import fxrewrite.match as match

    decided = {"closures": 0, "handed over": 0}
    real = match._tree_matcher

    def counting(pattern, program):
        tree = real(pattern, program)
        if tree is None:
            return None

        def spy(anchor, modules):
            found = tree(anchor, modules)
            decided["handed over" if found is match._FALLBACK else "closures"] += 1
            return found
        return spy

    monkeypatch.setattr(match, "_tree_matcher", counting)
    monkeypatch.setattr(match, "_programs", type(match._programs)())  # programs built with the spy
    return decided


def test_tree_patterns_matched_by_closures_are_the_matches_of_the_compiled_walk(monkeypatch):
    """``FAST_TREES``: the same matches (bindings, nodes, outputs, and the node map in its order)
    as the compiled walk, on a program where the closures decide (plain chains) and where they
    must hand over (an identity looked through, a keyword call, a shared inner node, a user
    outside the match, a respelled call, a literal that differs)."""

    def program(x, y):
        a = torch.neg(torch.neg(x)) + torch.relu(torch.abs(torch.sin(y)))
        b = torch.neg(torch.nn.functional.dropout(torch.neg(a), p=0.0, training=False))  # an identity between
        c = torch.neg(x.float())  # a no-op cast looked through by the variable
        shared = torch.neg(b)
        d = torch.neg(shared) * torch.sin(shared)  # the inner neg has a user outside the match
        e = torch.sub(torch.neg(d), c, alpha=1) + torch.sub(torch.neg(d), y)  # keywords, then as written
        f = torch.clamp(torch.neg(e), -1.0, 1.0) + torch.clamp(torch.neg(e), -1.0, 2.0)  # the literal differs
        return f + torch.relu(torch.abs(torch.sin(f[:, None].squeeze(1)))), torch.neg(torch.neg(2 * x))

    import fxrewrite.match as match

    monkeypatch.setattr(match, "FAST_CHAINS", False)  # the closures themselves (chains: the test below)
    rules = _tree_rules()
    gm = fx.symbolic_trace(program)
    decided = _count_tree_decisions(monkeypatch)
    fast = _every_tree_match(gm, rules, trees=True)
    assert fast == _every_tree_match(gm, rules, trees=False)
    assert len(fast) >= 5 and decided["closures"] >= 20 and decided["handed over"] >= 3, (len(fast), decided)
    assert {"neg_neg", "relu_abs_sin", "sub_neg", "clamp_neg"} <= {m[0] for m in fast}


def test_a_matcher_kept_per_pattern_finds_the_matches_of_match_at(monkeypatch):
    """``match.matcher`` (what the driver keeps per rule: the closures called directly, the compiled
    walk where they hand over, match_at for the other patterns) finds what ``match_at`` finds, with
    the closures and without them (its flags read when it is made), on the program above, where
    the closures decide and where they hand over, with the library's rules (module captures, choices)."""
    import fxrewrite.match as match

    def program(x, y):
        a = torch.neg(torch.neg(x)) + torch.relu(torch.abs(torch.sin(y)))
        b = torch.neg(torch.nn.functional.dropout(torch.neg(a), p=0.0, training=False))
        shared = torch.neg(b)
        d = torch.neg(shared) * torch.sin(shared)
        e = torch.sub(torch.neg(d), x, alpha=1) + torch.sub(torch.neg(d), y)
        return torch.clamp(torch.neg(e), -1.0, 1.0) + torch.relu(torch.abs(torch.sin(e[:, None].squeeze(1))))

    rules = _tree_rules()
    gm = fx.symbolic_trace(program)
    handed = []
    real = match._matches
    monkeypatch.setattr(match, "_matches", lambda *a, **k: handed.append(k["trees"]) or real(*a, **k))
    for trees in (True, False):
        handed.clear()
        found = _every_tree_match(gm, rules, trees=trees, via_matcher=True)
        assert found == _every_tree_match(gm, rules, trees=trees)
        assert len(found) >= 4 and {"neg_neg", "relu_abs_sin", "sub_neg", "clamp_neg"} <= {m[0] for m in found}
        if trees:  # the matcher handed over without trying the closures again, and match_at tried them
            assert handed.count(False) >= 3 and handed.count(True) >= 3, handed


# -- chains of one-argument calls matched by one loop, against the tree closures ---------------------


def _chain_program(x, y):
    a = torch.neg(torch.neg(x)) + torch.relu(torch.abs(torch.sin(y)))  # chains the loop decides
    b = torch.neg(torch.nn.functional.dropout(torch.neg(a), p=0.0, training=False))  # an identity between
    c = torch.neg(torch.neg(x.float())) + torch.neg(torch.neg(y * 1))  # variables behind identities
    shared = torch.neg(b)
    d = torch.neg(shared) * torch.sin(shared)  # the inner neg read outside the match
    e = d.neg().neg() + torch.neg(d.neg()) + torch.neg(torch.neg(d, out=None))  # spelt as methods, a keyword
    f = torch.neg(torch.neg(x.size(0))) + torch.relu(torch.abs(torch.sin(torch.neg(torch.neg(e)))))  # a size; overlaps
    return c + f, torch.neg(torch.neg(torch.neg(c)))


def _decision(found) -> object:
    """What a tree matcher decided, comparable: the match's fields, ``None``, or handed over."""
    import fxrewrite.match as match

    if found is match._FALLBACK:
        return "handed over"
    if found is None:
        return None
    return (found.pattern, dict(found.bindings), found.nodes, found.outputs, found.anchor, dict(found.module_paths),
            list(found.node_map.items()))


def test_chains_matched_by_one_loop_decide_as_the_tree_closures():
    """``FAST_CHAINS``: at every node of a program, a chain pattern's loop gives what its tree
    closures give (the same match: bindings, nodes in order, outputs, node map in its order; no
    match; or the try handed over to the compiled walk), deciding plain chains itself and handing
    the tree closures the rest (an identity between, calls spelt as methods or with a keyword)."""
    import collections

    import fxrewrite.match as match
    from fxrewrite.canon import node_keys

    rules = [r for r in _tree_rules() if r.compiled.choice_free and match._program(r.compiled).chain is not None]
    assert {"neg_neg", "relu_abs_sin"} <= {r.name for r in rules}
    assert match._program(_tree_rules()[-1].compiled).chain is None  # clamp(neg(x), -1.0, 1.0): literals
    gm = fx.symbolic_trace(_chain_program)
    counts: collections.Counter[object] = collections.Counter()
    for node in gm.graph.nodes:
        for rule in (r for r in rules if r.anchor_key in node_keys(node)):
            program = match._program(rule.compiled)
            handed = []

            def tree(anchor, modules, program=program, handed=handed):
                handed.append(anchor)
                return program.tree(anchor, modules)

            found = match._chain_matcher(rule.compiled, program, tree)(node, {})
            assert _decision(found) == _decision(program.tree(node, {})), (rule.name, node.name)
            counts["handed over to the closures" if handed else type(_decision(found)).__name__] += 1
    assert counts["tuple"] >= 6 and counts["NoneType"] >= 2 and counts["str"] >= 2, counts
    assert counts["handed over to the closures"] >= 5, counts


def test_chains_matched_by_one_loop_find_the_matches_of_the_tree_closures(monkeypatch):
    """``FAST_CHAINS`` on and off, ``match_at`` and a kept ``matcher`` find the same matches."""
    import fxrewrite.match as match

    gm, rules = fx.symbolic_trace(_chain_program), _tree_rules()
    monkeypatch.setattr(match, "FAST_CHAINS", False)
    slow = _every_tree_match(gm, rules, trees=True)
    monkeypatch.setattr(match, "FAST_CHAINS", True)
    assert _every_tree_match(gm, rules, trees=True) == slow
    assert _every_tree_match(gm, rules, trees=True, via_matcher=True) == slow
    assert len(slow) >= 8 and {"neg_neg", "relu_abs_sin"} <= {m[0] for m in slow}


# ---- module captures: the closures and their slow twin, the search ----------------------------------------------

class _ScaledConv(torch.nn.Conv2d):
    """Overrides ``forward``: a capture of ``nn.Conv2d`` must not bind it unless it accepts subclasses."""

    def forward(self, x):
        return super().forward(x) * 0.5


class _NamedConv(torch.nn.Conv2d):
    """Overrides nothing that computes: bound like an ``nn.Conv2d``."""

    def extra_repr(self) -> str:
        return "named " + super().extra_repr()


class _Leaves(fx.Tracer):
    """Keeps every module a call_module (the default tracer inlines subclasses defined here)."""

    def is_leaf_module(self, m: torch.nn.Module, qualified_name: str) -> bool:
        return True


class _Blocks(torch.nn.Module):
    """conv -> bn blocks, each made the way a module capture must or must not bind it."""

    def __init__(self) -> None:
        super().__init__()
        nn = torch.nn
        self.c_plain, self.b_plain = nn.Conv2d(2, 2, 1), nn.BatchNorm2d(2)
        self.c_hooked, self.b_hooked = nn.Conv2d(2, 2, 1), nn.BatchNorm2d(2)  # a forward hook on the conv
        self.c_pre, self.b_pre = nn.Conv2d(2, 2, 1), nn.BatchNorm2d(2)  # a forward pre-hook on the conv
        self.c_bnhook, self.b_bnhook = nn.Conv2d(2, 2, 1), nn.BatchNorm2d(2)  # a hook on the BatchNorm
        self.c_param, self.b_param = nn.Conv2d(2, 2, 1), nn.BatchNorm2d(2)  # a parametrized conv weight
        self.c_scaled, self.b_scaled = _ScaledConv(2, 2, 1), nn.BatchNorm2d(2)  # a subclass overriding forward
        self.c_named, self.b_named = _NamedConv(2, 2, 1), nn.BatchNorm2d(2)  # a subclass overriding no computation
        self.c_1d, self.b_1d = nn.Conv1d(2, 2, 1), nn.BatchNorm1d(2)  # other classes, still captures' classes
        self.lin, self.b_lin = nn.Linear(2, 2), nn.BatchNorm1d(2)
        self.c_gone, self.b_gone = nn.Conv2d(2, 2, 1), nn.BatchNorm2d(2)  # the conv deleted after tracing
        self.c_drop, self.drop, self.b_drop = nn.Conv2d(2, 2, 1), nn.Dropout(0.5), nn.BatchNorm2d(2)  # identity between
        self.c_kw, self.b_kw = nn.Conv2d(2, 2, 1), nn.BatchNorm2d(2)  # the conv called with a keyword
        self.c_shared, self.b_shared1, self.b_shared2 = nn.Conv2d(2, 2, 1), nn.BatchNorm2d(2), nn.BatchNorm2d(2)
        self.c_used, self.b_used = nn.Conv2d(2, 2, 1), nn.BatchNorm2d(2)  # the conv's value also used outside
        self.relu = nn.ReLU()

    def forward(self, x, v):
        out = [self.b_plain(self.c_plain(x)), self.b_hooked(self.c_hooked(x)), self.b_pre(self.c_pre(x)),
               self.b_bnhook(self.c_bnhook(x)), self.b_param(self.c_param(x)), self.b_scaled(self.c_scaled(x)),
               self.b_named(self.c_named(x)), self.b_gone(self.c_gone(x)), self.b_drop(self.drop(self.c_drop(x))),
               self.b_kw(self.c_kw(input=x)), self.b_shared1(self.c_shared(x)), self.b_shared2(self.c_shared(x))]
        used = self.c_used(x)
        out += [self.b_used(used), used, torch.neg(self.c_plain(torch.relu(x))), self.relu(self.c_named(x)),
                torch.relu(self.c_hooked(x))]
        return (*out, self.b_1d(self.c_1d(v)), self.b_lin(self.lin(v[..., 0])), self.b_lin(self.c_1d(v)))


def relu_conv(x, conv: Annotated[torch.nn.Conv2d, fxrewrite.Accept(hooks=True)]):
    return torch.relu(conv(x))


def neg_conv_relu(x, conv: Annotated[torch.nn.Conv2d, fxrewrite.Accept(subclasses=True)]):
    return torch.neg(conv(torch.relu(x)))


def relu_module_conv(x, conv: torch.nn.Conv2d, relu: torch.nn.ReLU):
    return relu(conv(x))


def hooked_bn_conv(x, conv: Annotated[torch.nn.Conv2d, fxrewrite.Accept(hooks=True)],
                   bn: Annotated[torch.nn.BatchNorm2d, fxrewrite.Accept(hooks=True)]):
    return bn(conv(x))


def _module_rules():
    """The library's module rules and rules whose captures accept hooks or subclasses, or whose
    module calls sit inside plain calls (and plain calls inside module calls)."""
    from fxrewrite import Rule
    from fxrewrite.loader import load_rules

    extra = [Rule.from_functions(p, p, name=p.__name__) for p in (relu_conv, neg_conv_relu, relu_module_conv,
                                                                   hooked_bn_conv)]
    library = [r for r in load_rules() if r.compiled.module_captures]
    assert {"conv_bn_fold", "linear_bn_fold"} <= {r.name for r in library}
    return [*library, *extra]


def _every_module_match(gm: fx.GraphModule, rules, *, trees: bool, via_matcher: bool) -> list[tuple]:
    import fxrewrite.match as match

    saved, match.FAST_MODULE_TREES = match.FAST_MODULE_TREES, trees
    try:
        return _every_tree_match(gm, rules, trees=True, via_matcher=via_matcher)
    finally:
        match.FAST_MODULE_TREES = saved


def _blocks_graph() -> fx.GraphModule:
    from torch.nn.utils import parametrize

    model = _Blocks().eval()
    gm = fx.GraphModule(model, _Leaves().trace(model))
    gm.c_hooked.register_forward_hook(lambda m, a, out: out * 2)
    gm.c_pre.register_forward_pre_hook(lambda m, args: (args[0] * 2,))
    gm.b_bnhook.register_forward_hook(lambda m, a, out: out * 2)
    parametrize.register_parametrization(gm.c_param, "weight", torch.nn.Identity())
    gm.delete_submodule("c_gone")
    return gm


def test_module_patterns_matched_by_closures_are_the_matches_of_the_search(monkeypatch):
    """``FAST_MODULE_TREES``: the closures bind and refuse modules exactly as the search does (same
    matches, bindings, nodes and node map in its order, and no match where the search has none):
    a module of the capture's class, of another class, with hooks or a parametrization (refused,
    or bound by a capture accepting hooks), a subclass overriding ``forward`` or nothing, a
    submodule deleted after tracing, a module called twice, a conv whose value is used outside
    the match, a keyword call and an identity module between the calls (both handed over)."""

    gm, rules = _blocks_graph(), _module_rules()
    decided = _count_tree_decisions(monkeypatch)
    searched = _every_module_match(gm, rules, trees=False, via_matcher=False)
    assert _every_module_match(gm, rules, trees=True, via_matcher=False) == searched
    assert _every_module_match(gm, rules, trees=True, via_matcher=True) == searched
    anchors = {(m[0], m[1]) for m in searched}
    assert {("conv_bn_fold", "b_plain"), ("conv_bn_fold", "b_named"), ("conv_bn_fold", "b_drop"),
            ("conv_bn_fold", "b_shared1"), ("conv_bn_fold", "b_shared2"), ("conv_bn_fold", "b_1d"),
            ("linear_bn_fold", "b_lin"), ("relu_conv", "relu_2"), ("hooked_bn_conv", "b_hooked"),
            ("hooked_bn_conv", "b_bnhook"), ("hooked_bn_conv", "b_pre"), ("hooked_bn_conv", "b_param"),
            ("neg_conv_relu", "neg"), ("relu_module_conv", "relu_1")} <= anchors, sorted(anchors)
    refused = {"b_hooked", "b_pre", "b_bnhook", "b_param", "b_scaled", "b_gone", "b_used", "b_kw"}
    assert not {a for r, a in anchors if r == "conv_bn_fold"} & refused
    assert ("linear_bn_fold", "b_lin_1") not in anchors  # a Conv1d where the capture wants a Linear
    assert decided["closures"] >= 20 and decided["handed over"] >= 4, decided


def test_a_global_module_hook_refuses_module_captures_in_the_closures_as_in_the_search():
    """A global forward hook stops every capture that does not accept hooks, in both walks."""
    gm, rules = _blocks_graph(), _module_rules()
    handle = torch.nn.modules.module.register_module_forward_hook(lambda m, a, out: out)
    try:
        searched = _every_module_match(gm, rules, trees=False, via_matcher=False)
        assert _every_module_match(gm, rules, trees=True, via_matcher=True) == searched
    finally:
        handle.remove()
    assert {m[0] for m in searched} == {"relu_conv", "hooked_bn_conv"}, searched
