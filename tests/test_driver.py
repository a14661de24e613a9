"""The driver: its worklist's order, and a worklist fed by the splicer's change events."""

from __future__ import annotations

import copy
import operator

import pytest
import torch
import torch.fx as fx
from _helpers import X

from fxrewrite import Rule, RuleSet
from fxrewrite.canon import node_keys
from fxrewrite.driver import Driver, Worklist
from fxrewrite.replace import Change


def calls(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function"]


def key(node: fx.Node):
    return node_keys(node)[0]


def test_the_worklist_serves_the_highest_level_first_and_each_level_in_graph_order():
    gm = fx.symbolic_trace(lambda a: torch.sigmoid(torch.relu(torch.neg(a))))
    neg, relu, sigmoid = calls(gm)
    work = Worklist({5: {key(sigmoid)}, 0: {key(neg), key(relu), key(sigmoid)}, -3: {key(relu)}})
    for node in (sigmoid, relu, neg):  # pushed against graph order
        work.push(node)
    assert [(n.name, level) for n, level in iter(work.pop, None)] == [
        ("sigmoid", 5), ("neg", 0), ("relu", 0), ("sigmoid", 0), ("relu", -3)]


def test_pushing_nodes_all_at_once_queues_what_pushing_them_one_by_one_queues():
    gm = fx.symbolic_trace(lambda a: torch.sigmoid(torch.relu(torch.neg(a))))
    neg, relu, sigmoid = calls(gm)
    anchors = {5: {key(sigmoid)}, 0: {key(neg), key(relu), key(sigmoid)}, -3: {key(relu)}}
    one_by_one, at_once = Worklist(anchors), Worklist(anchors)
    for node in (sigmoid, relu, neg, relu):
        one_by_one.push(node)
    at_once.push_all([sigmoid, relu, neg, relu])
    assert len(at_once) == len(one_by_one) == 5
    assert list(iter(at_once.pop, None)) == list(iter(one_by_one.pop, None))


def test_the_worklist_queues_a_node_once_per_level_and_only_where_a_rule_anchors_at_it():
    gm = fx.symbolic_trace(lambda a: torch.relu(torch.neg(a)))
    neg, relu = calls(gm)
    work = Worklist({0: {key(relu)}})
    work.fill(0, [relu, relu])
    work.push(relu)
    work.push(neg)  # no rule of any level anchors at neg
    assert len(work) == 1
    assert work.pop() == (relu, 0) and work.pop() is None
    work.push(relu)  # popped: it may be queued again
    assert work.pop() == (relu, 0)


def test_the_worklist_drops_nodes_erased_while_they_waited():
    gm = fx.symbolic_trace(lambda a: torch.relu(torch.neg(a)) + 1)
    neg, relu, _ = calls(gm)
    work = Worklist({0: {key(neg), key(relu)}})
    work.fill(0, [neg, relu])
    relu.replace_all_uses_with(neg)
    gm.graph.erase_node(relu)
    assert work.pop() == (neg, 0) and work.pop() is None


NEG_NEG_AS_RELUS = Rule.from_functions(lambda x: torch.neg(torch.neg(x)),
                                      lambda x: torch.relu(x) - torch.relu(torch.neg(x)), name="neg_neg_as_relus")
RELUS_TO_X = Rule.from_functions(lambda x: torch.relu(x) - torch.relu(torch.neg(x)), lambda x: x, name="relus_to_x")


def f(a):
    return torch.neg(torch.neg(a)) * 2


def test_nodes_a_rewrite_creates_are_visited_because_its_change_event_queues_them():
    """The graph has no relu and no subtraction: only the change event of the first rewrite
    brings the nodes it made to the worklist, where the second rule finds them."""
    gm = fx.symbolic_trace(f)
    driver = Driver(gm, RuleSet([NEG_NEG_AS_RELUS, RELUS_TO_X]), budget=10, debug=False)
    events: list[Change] = []
    driver.splicer.listen(events.append)
    driver.run()
    assert driver.rewrites == 2 and len(events) == 2 and len(driver.worklist) == 0
    assert [n.target for n in calls(gm)] == [operator.mul]
    gm.graph.lint()
    gm.recompile()
    torch.testing.assert_close(gm(X), f(X))

    deaf = fx.symbolic_trace(f)
    driver = Driver(deaf, RuleSet([NEG_NEG_AS_RELUS, RELUS_TO_X]), budget=10, debug=False)
    driver.splicer._listeners.clear()  # a driver that does not hear the splicer never sees the new nodes
    driver.run()
    assert driver.rewrites == 1 and torch.relu in [n.target for n in calls(deaf)]


def test_a_change_event_says_what_the_splice_created_erased_replaced_and_read():
    gm = fx.symbolic_trace(f)
    placeholder = next(n for n in gm.graph.nodes if n.op == "placeholder")
    inner, outer = calls(gm)[:2]
    driver = Driver(gm, RuleSet([NEG_NEG_AS_RELUS]), budget=10, debug=False)
    events: list[Change] = []
    driver.splicer.listen(events.append)
    driver.run()
    (change,) = events
    assert [n.target for n in change.created] == [torch.relu, torch.neg, torch.relu, operator.sub]
    assert set(change.erased) == {inner, outer} and all(n._erased for n in change.erased)
    assert change.replaced == ((outer, change.created[-1]),) and change.inputs == (placeholder,)
    gm.graph.lint()
    gm.recompile()
    torch.testing.assert_close(gm(X), f(X))


# -- the rule index, against its slow twin -----------------------------------------------------------


def _attention(q, k, v, mask):
    """Attention as the library's patterns spell it, with the spellings around them a model has."""
    scores = torch.matmul(q, k.transpose(-1, -2)) / 8.0 + mask
    h = torch.matmul(torch.nn.functional.dropout(torch.softmax(scores, dim=-1), p=0.0, training=False), v)
    h = h * torch.sigmoid(h) + torch.neg(torch.neg(q))
    return torch.relu(torch.relu(h)).transpose(1, 2).contiguous().reshape(2, 4, 8)


class _ConvBn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4).eval()

    def forward(self, x):
        y = self.bn(self.conv(x))
        return torch.relu(torch.relu(y * 1.0 + 0.0)) - torch.neg(y)


def _shifted(i: int) -> Rule:
    c, d = 0.5 + i, 2.0 + i
    return Rule.from_functions(lambda x: (x + c) * d, lambda x: x * d + c * d, name=f"shift_scale_{i}")


def _shifts(a):
    for i in (3, 0, 7, 3):
        a = torch.tanh((a + (0.5 + i)) * (2.0 + i)) * 3.0 + 1.0  # reassociated: tanh keeps the rounding small
    return a


def _programs():
    from _helpers import standard_rules

    library = standard_rules()
    q = torch.randn(2, 2, 4, 4)
    yield "attention", library, fx.symbolic_trace(_attention), (q, q.clone(), q.clone(), torch.zeros(4, 4))
    yield "conv_bn", library, fx.symbolic_trace(_ConvBn()), (torch.randn(2, 3, 5, 5),)
    yield "shifts", RuleSet([_shifted(i) for i in range(12)]), fx.symbolic_trace(_shifts), (X,)


def test_the_rule_index_makes_the_graph_and_the_report_its_slow_twin_makes(monkeypatch):
    """With the rule index (the default) and without it (``PLAIN_RULES``: every rule of a node's op
    keys tried), the same code comes out and the report says the same: applied, attempts
    (the index's left-out rules counted as the plain search counts them), rejected and why."""
    from _helpers import assert_rewrite_sound

    import fxrewrite.driver as driver
    from fxrewrite import rewrite

    monkeypatch.setattr(driver, "_INDEXED_FROM", 1)  # the index asked at every node, not only at crowded keys
    saved = []
    for name, rules, gm, inputs in _programs():
        results = {}
        for plain in (True, False):
            monkeypatch.setattr(driver, "PLAIN_RULES", plain)
            results[plain] = rewrite(gm, rules)
            assert_rewrite_sound(gm, results[plain], *inputs, rtol=1e-4, atol=1e-5)
        fast, slow = results[False], results[True]
        assert fast.code == slow.code, name
        for what in ("applied", "attempts", "rejected", "reasons"):
            assert dict(getattr(fast.report, what)) == dict(getattr(slow.report, what)), (name, what)
        assert sum(fast.report.applied.values()) >= 2, name  # the library fires there: not vacuous
        monkeypatch.setattr(driver, "PLAIN_RULES", False)
        probe = Driver(copy.deepcopy(gm), rules, budget=1000, debug=True)
        probe.run()
        saved.append(sum(probe.rules.left_out().values()))
    assert saved[-1] > 0  # the literal-differing rules: the index left rules out and the report still agrees


def _relu_neg_chain(a):
    """Twelve calls in a chain: a neg, then two relus, four times (the worklist tests' program)."""
    for i in range(12):
        a = torch.relu(a) if i % 3 else torch.neg(a)
    return a


def test_a_sorted_fill_pops_what_the_one_heap_pops(monkeypatch):
    """``SORTED_FILL`` (the fill served from a sorted list ahead of the heap of later pushes)
    pops the nodes the one heap (its slow twin) pops, in the same order, through pushes before
    and after the fill's front, erased nodes and nodes created where an erased one stood."""
    import fxrewrite.driver as driver

    popped = {}
    for sorted_fill in (False, True):
        monkeypatch.setattr(driver, "SORTED_FILL", sorted_fill)
        gm = fx.symbolic_trace(_relu_neg_chain)
        nodes = calls(gm)
        work = Worklist({1: {key(nodes[0])}, 0: {key(nodes[0]), key(nodes[1])}})
        for level in (1, 0):
            work.fill(level, reversed(nodes))  # against graph order: the fill sorts
        order = [work.pop(), work.pop()]
        work.push(nodes[0])  # popped already: queued again, ahead of the rest
        work.push_all([nodes[5], nodes[9]])  # still waiting: not queued twice
        nodes[4].replace_all_uses_with(nodes[3])
        gm.graph.erase_node(nodes[4])
        with gm.graph.inserting_after(nodes[3]):
            fresh = gm.graph.call_function(torch.relu, (nodes[3],))
        work.push(fresh)
        waiting = len(work)  # the erased node counts until a pop drops it
        order += list(iter(work.pop, None))
        popped[sorted_fill] = [waiting] + [(n.name, level) for n, level in order]
    assert popped[True] == popped[False]
    assert popped[True][0] == 24 and ("relu_8", 0) in popped[True] and ("neg", 1) in popped[True]


@pytest.mark.parametrize("flag", ["SORTED_FILL", "ORDERED_FILL", "FAST_MODULE_ANCHOR", "PRUNED_REQUEUE", "SCREENED",
                                  "SCREENS_BY_INPUT", "FAST_MODULE_INPUTS"])
def test_the_drivers_fast_paths_make_the_graph_and_the_report_their_slow_twins_make(monkeypatch, flag):
    """Each fast path of the driver against its slow twin (the flag off): the same code and the
    same report (applied, attempts, rejected and why) on the library's programs."""
    from _helpers import assert_rewrite_sound

    import fxrewrite.driver as driver
    from fxrewrite import rewrite

    monkeypatch.setattr(driver, "SHORT_DELETION_REQUEUE", False)  # (it saves visits: attempts differ, see its test)
    for name, rules, gm, inputs in _programs():
        results = {}
        for fast in (False, True):
            monkeypatch.setattr(driver, flag, fast)
            results[fast] = rewrite(gm, rules)
            assert_rewrite_sound(gm, results[fast], *inputs, rtol=1e-4, atol=1e-5)
        assert results[True].code == results[False].code, name
        for what in ("applied", "attempts", "rejected", "reasons"):
            assert dict(getattr(results[True].report, what)) == dict(getattr(results[False].report, what)), (name, what)


def test_a_rule_anchored_at_a_module_capture_skips_modules_of_another_class_without_the_search(monkeypatch):
    """``FAST_MODULE_ANCHOR``: a conv fed by a conv is no BatchNorm, so the folding rule is
    counted as tried there but not searched (its slow twin searches it); the bn is folded."""
    from _helpers import standard_rules

    import fxrewrite.driver as driver
    from fxrewrite.match import anchor_module_class

    class ConvConvBn(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1, self.conv2 = torch.nn.Conv2d(3, 4, 1), torch.nn.Conv2d(4, 4, 1)
            self.bn = torch.nn.BatchNorm2d(4)

        def forward(self, x):
            return self.bn(self.conv2(self.conv1(x)))

    rules = RuleSet([standard_rules()["conv_bn_fold"]])
    assert anchor_module_class(rules["conv_bn_fold"].compiled) is torch.nn.modules.batchnorm._BatchNorm
    for fast in (True, False):
        searched: list[str] = []
        _spy_on_searches(monkeypatch, searched, lambda node: node.target)
        monkeypatch.setattr(driver, "FAST_MODULE_ANCHOR", fast)
        probe = Driver(fx.symbolic_trace(ConvConvBn().eval()), rules, budget=10, debug=True)
        probe.run()
        assert probe.rewrites == 1 and "bn" in searched and ("conv2" in searched) is not fast
        assert probe.report(0.0).attempts["conv_bn_fold"] == 4  # conv1, conv2, bn and the folded conv


def _spy_on_searches(monkeypatch, log: list, label) -> None:
    """From now on, the drive's matchers append ``label(node)`` to ``log`` at each node they search."""
    import fxrewrite.driver as driver

    real = getattr(driver.matcher, "real", driver.matcher)  # (a spy set before: its matcher)

    def spy(pattern, *args, **kwargs):
        matches = real(pattern, *args, **kwargs)
        return lambda node: log.append(label(node)) or matches(node)

    spy.real = real
    monkeypatch.setattr(driver, "matcher", spy)


class _LayersAndSums(torch.nn.Module):
    """Sums reading a module call: a bias-free Linear (its rule fires), a BatchNorm (no Linear
    there), a Linear behind an eval dropout (looked through), a Linear and a BatchNorm summed
    (no bias: refused)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin1, self.lin2, self.lin3 = (torch.nn.Linear(4, 4, bias=False) for _ in range(3))
        self.bn, self.bn2, self.drop = torch.nn.BatchNorm1d(4), torch.nn.BatchNorm1d(4), torch.nn.Dropout(0.5)

    def forward(self, x, b):
        y = self.lin1(x) + b
        z = self.bn(y) + b
        w = self.drop(self.lin2(z)) + b
        return self.lin3(w) + self.bn2(w), torch.relu(z) + w


def test_a_rule_reading_a_module_capture_skips_sums_of_no_module_of_its_class_without_the_search(monkeypatch):
    """``FAST_MODULE_INPUTS``: ``lin(x) + b`` is not searched at a sum reading no Linear and no
    value that may be an identity (its slow twin searches it there); it still fires at a Linear,
    behind an eval dropout, and where a Linear and a BatchNorm are summed; same code, same report."""
    from _helpers import assert_rewrite_sound, standard_rules

    import fxrewrite.driver as driver
    from fxrewrite import rewrite

    rules = RuleSet([standard_rules()["linear_layer_add_bias"]])
    inputs = (torch.randn(3, 4), torch.randn(4))
    results, searched = {}, {}
    for fast in (True, False):
        seen: list[str] = []
        _spy_on_searches(monkeypatch, seen, lambda node: node.name)
        monkeypatch.setattr(driver, "FAST_MODULE_INPUTS", fast)
        model = _LayersAndSums().eval()
        results[fast] = rewrite(model, rules, example_inputs=inputs)
        assert_rewrite_sound(model, results[fast], *inputs)
        searched[fast] = seen
    assert results[True].code == results[False].code
    for what in ("applied", "attempts", "rejected", "reasons"):
        assert dict(getattr(results[True].report, what)) == dict(getattr(results[False].report, what)), what
    assert dict(results[True].report.applied) == {"linear_layer_add_bias": 2}  # lin1(x) + b, drop(lin2(z)) + b
    assert dict(results[True].report.rejected) == {"linear_layer_add_bias": 1}  # lin3(w) + bn2(w): b is no vector
    assert "add_1" in searched[False] and "add_1" not in searched[True]  # bn(y) + b: no Linear, no identity
    assert {"add_2", "add_3"} <= set(searched[True])  # a dropout looked through; a Linear beside a BatchNorm


# -- the requeue left short of the furthest node popped, against its slow twin --------------------------

_ODD_THEN_EVEN = [Rule.from_functions(lambda x: torch.neg(torch.neg(x)), lambda x: x, name="neg_neg"),
                  Rule.from_functions(lambda x: torch.neg(torch.sin(x)), lambda x: torch.sin(torch.neg(x)),
                                      name="neg_inward"),
                  Rule.from_functions(lambda x: torch.relu(torch.relu(x)), lambda x: torch.relu(x), name="relu_relu"),
                  Rule.from_functions(lambda x: torch.abs(torch.neg(x)), lambda x: torch.abs(x), name="abs_neg"),
                  Rule.from_functions(lambda x: torch.relu(torch.abs(torch.sin(x))),
                                      lambda x: torch.abs(torch.sin(x)), name="relu_abs_sin")]


def _dag(seed: int, size: int = 60) -> fx.GraphModule:
    """A random program over the ops of :data:`_ODD_THEN_EVEN`: each op reads one or two of the
    last four values, mostly the last (a chain with branches: some values have several users)."""
    import random

    rng = random.Random(seed)
    plan = [(rng.choice(["neg", "neg", "sin", "relu", "abs", "add"]), rng.choice([0, 0, 0, 1, 3]), rng.randrange(4))
            for _ in range(size)]

    def program(x):
        values = [x]
        for op, i, j in plan:
            a, b = values[-1 - min(i, len(values) - 1)], values[-1 - min(j, len(values) - 1)]
            values.append(a + b if op == "add" else getattr(torch, op)(a))
        return values[-1] + values[-2]

    return fx.symbolic_trace(program)


def test_a_requeue_left_short_of_the_furthest_node_popped_makes_what_the_whole_requeue_makes(monkeypatch):
    """``PRUNED_REQUEUE``: nodes beyond the worklist's mark still wait, so leaving them (and what
    follows them) out of a change event's requeue changes nothing: the same code, the same report
    (attempts counted per visit), on random programs where rewrites cascade; and it leaves out nodes."""
    from _helpers import assert_rewrite_sound

    import fxrewrite.driver as driver
    from fxrewrite import rewrite

    pushed = {True: 0, False: 0}
    real = Worklist.push_all

    def counting(self, nodes, *, fast):
        nodes = list(nodes)
        pushed[fast] += len(nodes)
        return real(self, nodes)

    applied = {}
    monkeypatch.setattr(driver, "SHORT_DELETION_REQUEUE", False)  # (it saves visits: attempts differ, see its test)
    for seed in range(12):
        gm = _dag(seed)
        results = {}
        for fast in (False, True):
            monkeypatch.setattr(driver, "PRUNED_REQUEUE", fast)
            monkeypatch.setattr(Worklist, "push_all", lambda self, nodes, fast=fast: counting(self, nodes, fast=fast))
            results[fast] = rewrite(gm, RuleSet(_ODD_THEN_EVEN))
            assert_rewrite_sound(gm, results[fast], X)
        assert results[True].code == results[False].code, seed
        for what in ("applied", "attempts", "rejected", "reasons"):
            assert dict(getattr(results[True].report, what)) == dict(getattr(results[False].report, what)), seed
        applied[seed] = sum(results[True].report.applied.values())
    assert sum(applied.values()) >= 50 and min(applied.values()) >= 2, applied
    assert pushed[True] < pushed[False] * 0.8, pushed


def test_the_requeue_is_whole_where_a_waiting_node_may_gain_an_anchor_key():
    """In a graph writing in place (``a.relu_()`` becomes ``relu`` once nothing else reads
    ``a``), or with rules anchored at a key a respelled node gains (``x.max(d).values`` is a
    ``getitem``), nothing is left out of the requeue."""
    rules = RuleSet(_ODD_THEN_EVEN)
    assert Driver(_dag(0), rules, budget=100, debug=False).pruned
    writes = fx.symbolic_trace(lambda a: torch.neg(torch.neg(a)).relu_())
    assert not Driver(writes, rules, budget=100, debug=False).pruned
    first = Rule.from_functions(lambda x: torch.max(x, 0).values, lambda x: torch.amax(x, 0), name="max_values")
    assert not Driver(_dag(0), RuleSet([*_ODD_THEN_EVEN, first]), budget=100, debug=False).pruned


def test_the_keys_a_respelled_node_gains_are_those_the_driver_knows():
    """Every spelling :func:`~fxrewrite.canon.respelled` knows gives a key of the driver's
    ``_RESPELLED_KEYS``, or is an in-place write (which ends the pruning)."""
    from fxrewrite.canon import mutation
    from fxrewrite.driver import _RESPELLED_KEYS

    def spellings(x):
        return (x[:, None], x.mT, x.permute(1, 0), 1 / x, x.shape[0], x.max(0).values, x.exp().div_(2.0))

    gm = fx.symbolic_trace(spellings)
    respelled = [n for n in gm.graph.nodes if len(node_keys(n)) == 2]
    assert len(respelled) >= 6
    for node in respelled:
        assert node_keys(node)[0] in _RESPELLED_KEYS or mutation(node) is not None, node.format_node()


def test_rules_screened_by_their_anchors_input_keys_make_what_the_pre_check_per_rule_makes(monkeypatch):
    """``SCREENED``: the anchor-input pre-check run once per op key and set of input keys, the
    rules it refuses counted in bulk, makes the code and the report (attempts included) that
    pre-checking each rule at each visit makes: with rules screened out before the one that fires
    (``neg_neg`` before ``neg_inward``) and after it, visits where none fires, and a rule that
    settles the nodes it produces (the screens stand aside from then on)."""
    from _helpers import assert_rewrite_sound

    import fxrewrite.driver as driver
    from fxrewrite import rewrite

    swap = Rule.from_functions(lambda x, y: torch.sin(x) + y, lambda x, y: y + torch.sin(x), name="add_swap")
    screened = {"misses": 0, "fired": 0}
    real_fired = driver._Screen.fired

    def fired(self, rule, tallies):
        screened["fired"] += any(i < self._places[rule.name] for i, _ in self.screened_out)
        return real_fired(self, rule, tallies)

    monkeypatch.setattr(driver._Screen, "fired", fired)
    for rules in (RuleSet(_ODD_THEN_EVEN), RuleSet([*_ODD_THEN_EVEN, swap])):
        for seed in range(8):
            gm = _dag(seed)
            results = {}
            for fast in (False, True):
                monkeypatch.setattr(driver, "SCREENED", fast)
                results[fast] = rewrite(gm, rules)
                assert_rewrite_sound(gm, results[fast], X)
            assert results[True].code == results[False].code, seed
            for what in ("applied", "attempts", "rejected", "reasons"):
                assert dict(getattr(results[True].report, what)) == dict(getattr(results[False].report, what)), seed
            probe = Driver(copy.deepcopy(gm), rules, budget=1000, debug=True)
            probe.run()
            screened["misses"] += sum(probe.rules.screened_out().values())
    assert screened["misses"] > 0 and screened["fired"] > 0, screened


def _scaled_dag(seed: int, size: int = 40) -> fx.GraphModule:
    """A random program of ``neg, sin, relu, abs`` and ``* 1.0`` (an identity, given metadata, that
    the input keys look through), each op reading the last value or one of the three before."""
    import random

    rng = random.Random(seed)
    plan = [(rng.choice(["neg", "neg", "sin", "relu", "abs", "scale"]), rng.choice([0, 0, 1, 3])) for _ in range(size)]

    def program(x):
        values = [x]
        for op, i in plan:
            a = values[-1 - min(i, len(values) - 1)]
            values.append(a * 1.0 if op == "scale" else getattr(torch, op)(a))
        return values[-1] + values[-2] + values[-5]

    return fx.symbolic_trace(program)


def test_screens_kept_by_the_target_of_a_nodes_one_input_make_what_screens_by_input_keys_make(monkeypatch):
    """``SCREENS_BY_INPUT``: a screen taken by the op key of the node and the target of its one input
    (and a visit passing no rule counted without a try) makes the code and the report (attempts
    included) that working the input keys out at each visit makes, on random programs where nodes
    of several op keys read the same targets, some read a ``* 1.0`` (an identity the input keys
    look through, so its target alone does not decide them) and rewrites change what a waiting
    node reads."""
    from _helpers import assert_rewrite_sound

    import fxrewrite.driver as driver
    from fxrewrite import rewrite

    real_input_keys = driver.input_keys
    worked_out: list[fx.Node] = []  # the nodes whose input keys a visit worked out
    monkeypatch.setattr(driver, "input_keys", lambda node: worked_out.append(node) or real_input_keys(node))
    calls, behind_a_scale = {False: 0, True: 0}, 0
    def scales(a):  # the same op key over the same target, with another op behind it: a screen each
        return (torch.neg(torch.relu(a) * 1.0) + torch.neg(torch.neg(a) * 1.0) + torch.abs(torch.sin(a) * 1.0)
                + torch.abs(torch.neg(a) * 1.0))

    for seed in range(-1, 4):
        gm = _scaled_dag(seed) if seed >= 0 else fx.symbolic_trace(scales)
        results = {}
        for fast in (False, True):
            monkeypatch.setattr(driver, "SCREENS_BY_INPUT", fast)
            worked_out.clear()
            results[fast] = rewrite(gm, RuleSet(_ODD_THEN_EVEN), example_inputs=(X,))
            assert_rewrite_sound(gm, results[fast], X)
            calls[fast] += len(worked_out)
        assert results[True].code == results[False].code, seed
        for what in ("applied", "attempts", "rejected", "reasons"):
            assert dict(getattr(results[True].report, what)) == dict(getattr(results[False].report, what)), seed
        behind_a_scale += sum(any(a.target is operator.mul for a in n.all_input_nodes) for n in worked_out)
    assert calls[False] - calls[True] > 40 and behind_a_scale > 10, (calls, behind_a_scale)


def test_a_screened_out_rule_is_not_counted_at_a_node_it_settled(monkeypatch):
    """A rule that reproduced its own match (``F.relu(neg(x)) => torch.relu(neg(x))``) is not
    tried, nor counted, at the node it produced, also once that node's input changed (a
    deletion below it) so that the rule's pre-check would screen it out: the screens stand aside
    while some rule has settled a node, and the report is the one of the pre-check per rule."""
    import fxrewrite.driver as driver
    from fxrewrite import rewrite

    respell = Rule.from_functions(lambda x: torch.nn.functional.relu(torch.neg(x)), lambda x: torch.relu(torch.neg(x)),
                                  name="respell", priority=10)
    rules = RuleSet([respell, _ODD_THEN_EVEN[0]])
    gm = fx.symbolic_trace(lambda a: torch.relu(torch.neg(torch.neg(torch.sin(a)))))
    reports = {}
    for fast in (False, True):
        monkeypatch.setattr(driver, "SCREENED", fast)
        result = rewrite(gm, rules)
        torch.testing.assert_close(result.module(X), gm(X))
        result.module.graph.lint()
        reports[fast] = result.report
    assert reports[True].applied == reports[False].applied == {"respell": 1, "neg_neg": 1}
    assert reports[True].attempts == reports[False].attempts


def test_a_deletion_that_gave_its_value_a_user_beyond_the_mark_is_not_walked_from_it(monkeypatch):
    """``SHORT_DELETION_REQUEUE``: after ``neg(neg(x)) => x`` whose result's users lie beyond the
    furthest node popped, only those users are walked, not ``x``'s others: the same code and the
    same rewrites as walking all of ``x``'s users, on random programs where rewrites cascade, with
    fewer attempts (visits saved) and none more."""
    from _helpers import assert_rewrite_sound

    import fxrewrite.driver as driver
    from fxrewrite import rewrite

    saved = 0
    for seed in range(16):
        gm = _dag(seed, size=80)
        results = {}
        for short in (False, True):
            monkeypatch.setattr(driver, "SHORT_DELETION_REQUEUE", short)
            results[short] = rewrite(gm, RuleSet(_ODD_THEN_EVEN))
            assert_rewrite_sound(gm, results[short], X)
        assert results[True].code == results[False].code, seed
        assert results[True].report.applied == results[False].report.applied, seed
        attempts = {short: results[short].report.attempts for short in (False, True)}
        assert all(attempts[True][name] <= attempts[False][name] for name in attempts[True]), seed
        saved += sum(attempts[False].values()) - sum(attempts[True].values())
    assert saved > 0


def test_a_deletion_that_moved_users_beyond_the_mark_only_to_a_check_node_is_walked_from_its_value(monkeypatch):
    """A check node (``torch._assert``) a match may take along is no user that keeps the value out
    of matches: after ``neg(neg(s))`` is deleted, ``s``'s users are walked again and
    ``relu(sigmoid(y))`` (visited before, when ``s`` had the first ``neg`` as a user too) fires."""
    import fxrewrite.driver as driver
    from fxrewrite import rewrite

    relu_sigmoid = Rule.from_functions(lambda x: torch.relu(torch.sigmoid(x)), lambda x: torch.sigmoid(x),
                                       name="relu_sigmoid")
    graph = fx.Graph()
    y = graph.placeholder("y")
    s = graph.call_function(torch.sigmoid, (y,))
    r = graph.call_function(torch.relu, (s,))
    twice = graph.call_function(torch.neg, (graph.call_function(torch.neg, (s,)),))
    graph.call_function(torch._assert, (twice, "checked"))
    graph.output(r)
    gm = fx.GraphModule(torch.nn.Module(), graph)
    for short in (False, True):
        monkeypatch.setattr(driver, "SHORT_DELETION_REQUEUE", short)
        result = rewrite(gm, RuleSet([_ODD_THEN_EVEN[0], relu_sigmoid]))
        result.module.graph.lint()
        one = torch.tensor([0.5])  # (the check asks a one-element tensor for its truth)
        torch.testing.assert_close(result.module(one), gm(one))
        assert result.report.applied == {"neg_neg": 1, "relu_sigmoid": 1}, short


def test_each_rewrite_is_logged_at_debug_level_when_the_drive_starts_with_it_on(caplog):
    """The driver asks the logger once per drive whether it takes debug messages; then each
    rewrite is logged, naming the rule (and nothing is logged when the level is higher)."""
    import logging

    from fxrewrite import rewrite

    gm = fx.symbolic_trace(lambda a: torch.neg(torch.neg(torch.relu(torch.relu(a)))))
    with caplog.at_level(logging.INFO, logger="fxrewrite.driver"):
        quiet = rewrite(gm, RuleSet(_ODD_THEN_EVEN))
    assert quiet.report.rewrites == 2 and "rewrote" not in caplog.text
    with caplog.at_level(logging.DEBUG, logger="fxrewrite.driver"):
        logged = rewrite(gm, RuleSet(_ODD_THEN_EVEN))
    torch.testing.assert_close(logged.module(X), gm(X))
    logged.module.graph.lint()
    assert caplog.text.count("rewrote") == 2 and "rule neg_neg rewrote" in caplog.text


def test_a_fill_handed_over_in_graph_order_pops_what_the_sorted_fill_pops(monkeypatch):
    """``ORDERED_FILL``: the op index's group of a level, taken as it is, pops the nodes the sorted
    fill (its slow twin) pops, in the same order, with pushes and an erased node on the way; a
    second fill at a level where nodes wait is sorted in with them."""
    import fxrewrite.driver as driver
    from fxrewrite.index import OpIndex

    popped = {}
    for ordered in (False, True):
        monkeypatch.setattr(driver, "ORDERED_FILL", ordered)
        gm = fx.symbolic_trace(_relu_neg_chain)
        nodes = calls(gm)
        anchors = {1: {key(nodes[0])}, 0: {key(nodes[0]), key(nodes[1])}}
        index = OpIndex(gm.graph, groups=anchors)
        work = Worklist(anchors)
        for level in (1, 0):
            work.fill(level, index.grouped[level], in_graph_order=True)
        work.fill(0, [nodes[7], nodes[2]], in_graph_order=True)  # waiting already: nothing changes
        order = [work.pop(), work.pop()]
        work.push(nodes[0])
        nodes[4].replace_all_uses_with(nodes[3])
        gm.graph.erase_node(nodes[4])
        order += list(iter(work.pop, None))
        popped[ordered] = [(n.name, level) for n, level in order]
    assert popped[True] == popped[False]
    assert len(popped[True]) == 4 + 11 + 1 and ("neg", 1) in popped[True]


def test_an_aten_graph_is_told_by_its_side_table_as_by_a_pass_over_its_nodes(monkeypatch):
    """``ATEN_BY_TARGETS``: the side table's ``call_function`` targets tell an ATen graph as
    ``is_aten_graph`` over the nodes does: a traced graph (no), an exported one (yes), one whose
    only ATen call was erased (its empty bucket stays: no), one with an ATen call added (yes)."""
    import fxrewrite.driver as driver
    from fxrewrite.canon import is_aten_graph

    traced = fx.symbolic_trace(lambda x: torch.relu(x) + 1).graph
    exported = torch.export.export(_ReluModule(), (X,)).graph_module.graph
    erased = fx.symbolic_trace(lambda x: torch.relu(x) + 1).graph
    relu = next(n for n in erased.nodes if n.target is torch.relu)
    with erased.inserting_after(relu):
        aten = erased.call_function(torch.ops.aten.neg.default, (relu,))
    added = copy.deepcopy(erased)  # (a copy holding the ATen call)
    erased.erase_node(aten)
    graphs = {"traced": (traced, False), "exported": (exported, True), "erased": (erased, False),
              "added": (added, True)}
    for name, (graph, expected) in graphs.items():
        assert is_aten_graph(graph.nodes) is expected, name
        for fast in (False, True):
            monkeypatch.setattr(driver, "ATEN_BY_TARGETS", fast)
            assert driver._is_aten(graph) is expected, (name, fast)


class _ReluModule(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) + 1
