"""The checker's fast draws and their slow twins (issue 24):

* ``_plan.REUSED_STRATEGIES``: strategies made once per plan and arguments draw exactly what
  strategies made anew at every draw draw;
* ``_plan.DECLARED_COLUMNS``: literals the domain lists per position are drawn as columns of
  those lists half the time (valid permutation pairs), independently otherwise;
* ``_plan.RELATIONS_WITH_LITERALS``: shape relations are found for rules whose literals are all
  listed in the domain;
* ``_plan.ONES_AS_BITS``: the size-1 dimensions of a broadcast shape drawn as one integer;
* ``_plan.RELATIONS_BY_RANK``: shape relations drawn among those accepted at the drawn rank;
* ``_plan.FITTED_SIZES``: the sizes of a view or reshape drawn among those that fit its input;
* ``_plan.LAYOUTS_FIRST_WHEN_REFUSED``: rules without guards whose patterns refuse most layouts
  draw layouts first, with the shape relations they accept;
* ``_running.FAST_GUARD_VALUES``: the guard harness records the same values as fx's interpreter;
* ``_plan.ADMITTED_BY_RELATIONS``: a focus an accepted relation admits is admitted by the search too;
* ``_values.CAPPED_VALUE_LISTS``: a tensor drawn after its layout draws no more values than it holds;
* ``_values.FLAT_ELEMENTS``: a value drawn without the one-of's spans is the one-of's value for the same choices;
* ``_plan.SMALLER_AT_ITS_RANKS``: a smaller focus draws the ranks where a relation drops that tensor;
* ``_plan.REPEATED_REFUSAL_REJECTS``: an input whose try repeats its refused previous try is rejected at once;
* ``_plan.TRANSPOSED_AS_BITS``: which tensors of a layout are transposed, drawn as one integer.
"""

from __future__ import annotations

import attrs
import pytest
import torch
from _helpers import replayed
from hypothesis import HealthCheck, given, settings

from fxrewrite import Rule
from fxrewrite.testing import _plan, _running, _sizes, _values
from fxrewrite.testing.strategies import plan_inputs

DRAWS = settings(max_examples=40, database=None, derandomize=True, deadline=None,
                 suppress_health_check=list(HealthCheck))


def _drawn(strategy) -> list:  # type: ignore[no-untyped-def]
    out = []

    @DRAWS
    @given(strategy)
    def collect(value):  # type: ignore[no-untyped-def]
        out.append(value)

    collect()
    return out


def _same(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    for name in a:
        x, y = a[name], b[name]
        if isinstance(x, torch.Tensor):
            if not (x.dtype == y.dtype and x.shape == y.shape and x.stride() == y.stride()
                    and torch.equal(x.isnan(), y.isnan()) and torch.equal(x.nan_to_num(), y.nan_to_num())):
                return False
        elif repr(x) != repr(y):
            return False
    return True


def _guarded(x, y, k: int):  # type: ignore[no-untyped-def]
    return torch.sum(x + y, k)


GUARDED = Rule.from_functions(_guarded, _guarded, name="guarded", where=lambda m: m["k"] >= 0,
                              domain={"dtypes": (torch.float32, torch.int64)})
PLAIN = Rule.from_functions(lambda x, y: x * y, lambda x, y: y * x, name="plain")


@pytest.mark.slow  # two plans probed, 80 draws
@pytest.mark.parametrize("rule", [PLAIN, GUARDED], ids=lambda r: r.name)
def test_reused_strategies_draw_what_strategies_made_anew_draw(rule, monkeypatch):
    plan = plan_inputs(rule)
    fast = _drawn(plan.strategy())
    monkeypatch.setattr(_plan, "REUSED_STRATEGIES", False)
    slow = _drawn(plan.strategy())
    assert len(fast) == len(slow) and all(_same(a, b) for a, b in zip(fast, slow))


def _permute_twice(x, p0: int, p1: int, p2: int, q0: int, q1: int, q2: int):  # type: ignore[no-untyped-def]
    return x.permute(p0, p1, p2).permute(q0, q1, q2)


def _valid(dims) -> bool:  # type: ignore[no-untyped-def]
    return sorted(d % len(dims) for d in dims) == list(range(len(dims)))


PERMUTE = Rule.from_functions(
    _permute_twice, _permute_twice, name="permute", where=lambda m: _valid([m[f"p{i}"] for i in range(3)])
    and _valid([m[f"q{i}"] for i in range(3)]),
    domain={"ranks": (3, 3), "literals": {"p0": (0, -1), "p1": (2, -2), "p2": (1, -3),
                                          "q0": (2, -3), "q1": (1, -2), "q2": (0, -1)}})


@pytest.mark.slow  # a plan probed twice
def test_listed_literals_are_drawn_as_columns_by_the_op_that_takes_them(monkeypatch):
    plan = plan_inputs(PERMUTE)
    assert _plan._declared_columns(plan) == ((("p0", "p1", "p2"), 2), (("q0", "q1", "q2"), 2))
    drawn = _drawn(_plan._literal_values(plan, (2, 2, 2)))
    columns = {(tuple(d[f"p{i}"] for i in range(3)), tuple(d[f"q{i}"] for i in range(3))) for d in drawn}
    assert ((0, 2, 1), (2, 1, 0)) in columns and ((-1, -2, -3), (-3, -2, -1)) in columns
    monkeypatch.setattr(_plan, "DECLARED_COLUMNS", False)
    assert _plan._literal_values.uncached(plan, (2, 2, 2)) is not None  # the slow twin still draws
    slow = _drawn(_plan._literal_values.uncached(plan, (2, 2, 2)))
    valid = sum(_valid([d[f"p{i}"] for i in range(3)]) and _valid([d[f"q{i}"] for i in range(3)]) for d in slow)
    valid_fast = sum(_valid([d[f"p{i}"] for i in range(3)]) and _valid([d[f"q{i}"] for i in range(3)]) for d in drawn)
    assert valid_fast > valid


def _scaled_bias(x, b, s: float):  # type: ignore[no-untyped-def]
    return x * s + b


def _bias_is_a_vector(m) -> bool:  # type: ignore[no-untyped-def]
    return m["b"].dim() == 1


@pytest.mark.slow  # a plan probed twice
def test_relations_are_found_for_rules_whose_literals_the_domain_lists(monkeypatch):
    rule = Rule.from_functions(_scaled_bias, _scaled_bias, name="r", where=_bias_is_a_vector,
                               domain={"dtypes": (torch.float32,), "ranks": (1, 3), "literals": {"s": (0.5, 2.0)}})
    relations = plan_inputs(rule).relations
    assert relations, "relations tried with s=0.5"
    monkeypatch.setattr(_plan, "RELATIONS_WITH_LITERALS", False)
    assert plan_inputs(rule).relations == ()


def test_ones_as_bits_and_as_a_list_both_give_shapes_that_broadcast(monkeypatch):
    for bits in (True, False):
        monkeypatch.setattr(_plan, "ONES_AS_BITS", bits)
        shapes = _drawn(_plan._related_shape.uncached((2, 3, 2), 4, False))
        for shape in shapes:
            assert torch.broadcast_shapes(shape, (2, 3, 2)) == (2, 3, 2)
        assert any(len(s) == 3 and s != (2, 3, 2) for s in shapes)


def _add(x, y):  # type: ignore[no-untyped-def]
    return x + y


def _both_matrices(m) -> bool:  # type: ignore[no-untyped-def]
    return m["x"].dim() >= 2 and m["y"].dim() >= 2


def _matrix_rule() -> Rule:
    return Rule.from_functions(_add, _add, name="matrices", where=_both_matrices,
                               domain={"dtypes": (torch.float32,), "ranks": (2, 4)})


def test_relations_by_rank_are_the_relations_split_by_the_rank_that_accepts_them():
    plan = plan_inputs(_matrix_rule())
    assert _plan.relations_of_every_rank(plan.ranked_relations) == plan.relations
    assert plan.ranked_relations[2] == ({"x": 0, "y": 0},)  # at rank 2 no dimension can go
    for rank, relations in plan.ranked_relations.items():
        for relation in relations:
            assert all(rank - drop >= 2 for drop in relation.values())


def _accepted_draws(monkeypatch, flag: str, on: bool, rule, focus=None, drawn=None):  # type: ignore[no-untyped-def]
    """The draw counts of a search with ``_plan.<flag>`` set to ``on`` (of the plan ``focus``
    makes of the rule's, when given); every input it draws is one the rule's pattern and guards
    accept. The inputs are appended to ``drawn`` when given."""
    monkeypatch.setattr(_plan, flag, on)
    _plan.reset_draw_counts(rule)
    plan = plan_inputs(rule) if focus is None else focus(plan_inputs(rule))
    inputs_drawn = _drawn(plan.strategy())
    for inputs in inputs_drawn:
        assert _plan.accepts(plan, inputs)
    if drawn is not None:
        drawn.extend(inputs_drawn)
    return _plan.draw_counts(rule)


@pytest.mark.slow  # two searches of 40 inputs
def test_relations_by_rank_and_of_every_rank_keep_the_same_inputs_and_refuse_fewer(monkeypatch):
    rule = _matrix_rule()
    refused = {by_rank: _accepted_draws(monkeypatch, "RELATIONS_BY_RANK", by_rank, rule).layouts_refused
               for by_rank in (True, False)}
    assert refused[True] < refused[False], refused


# -- sizes of views and reshapes ------------------------------------------------------------------


def _reshapes(x: torch.Tensor, sizes: tuple[int, ...]) -> bool:
    try:
        x.reshape(sizes)
    except RuntimeError:
        return False
    return True


def test_fitting_sizes_are_the_sizes_torch_can_reshape_to():
    import itertools

    candidates = (-2, -1, 0, 1, 2, 3)
    for numel in (0, 1, 2, 4, 6):  # 0: an empty tensor views to (-1, 2) and (2, -1), not to (-1, 0)
        x = torch.zeros(numel)
        for count in (1, 2, 3):
            expected = tuple(t for t in itertools.product(candidates, repeat=count) if _reshapes(x, t))
            assert _sizes.fitting_sizes((candidates,) * count, numel) == expected, (numel, count)


def _view_chain(x, y, a: int, b: int, c: int, d: int):  # type: ignore[no-untyped-def]
    return x.view(a, b).reshape((c,)).sum(d) + y


def _view_twice(x, a: int, b: int, c: int, e: int, f: int):  # type: ignore[no-untyped-def]
    return x.view(a, b, c).view(e, f)


def test_the_sized_ops_of_a_pattern_are_its_views_and_reshapes_by_literal_sizes():
    rule = Rule.from_functions(_view_chain, _view_chain, name="chain")
    ops = _sizes.sized_ops(rule, ["a", "b", "c", "d"], ["x", "y"])
    assert ops == (_sizes.SizedOp(("a", "b"), "x"), _sizes.SizedOp(("c",), "x"))  # sum's d is no size
    assert _sizes.sized_ops(rule, ["a", "c", "d"], ["x", "y"]) == (_sizes.SizedOp(("c",), "x"),)  # b: not an int


VIEW_TWICE = Rule.from_functions(_view_twice, _view_twice, name="view_twice",
                                 domain={"ranks": (0, 3), "sides": (1, 2),
                                         "literals": {n: (-1, 1, 2) for n in "abcef"}})


@pytest.mark.slow  # two searches of 40 inputs
def test_fitted_sizes_keep_the_inputs_accepted_and_refuse_fewer_layouts(monkeypatch):
    refused, fitted = {}, {}
    for fit in (True, False):
        monkeypatch.setattr(_plan, "FITTED_SIZES", fit)
        _plan.reset_draw_counts(VIEW_TWICE)
        plan = plan_inputs(VIEW_TWICE)
        drawn = _drawn(plan.strategy())
        for inputs in drawn:
            assert _plan.accepts(plan, inputs)
        refused[fit] = _plan.draw_counts(VIEW_TWICE).layouts_refused
        fitted[fit] = {tuple(d[n] for n in "abc") for d in drawn}
    assert refused[True] < refused[False] / 2, refused
    assert any(-1 in sizes for sizes in fitted[True]) and any(-1 not in sizes for sizes in fitted[True])


# -- rules whose patterns refuse most layouts -----------------------------------------------------


def _matmul(x, y):  # type: ignore[no-untyped-def]
    return x @ y


def _view_as_twice(x, y, z):  # type: ignore[no-untyped-def]
    return x.view_as(y).view_as(z)


VIEW_AS_TWICE = Rule.from_functions(_view_as_twice, _view_as_twice, name="view_as_twice")
MATMUL = Rule.from_functions(_matmul, _matmul, name="matmul", domain={"dtypes": (torch.float32, torch.float64)})


def test_a_pattern_that_refuses_most_layouts_draws_them_first(monkeypatch):
    plan = plan_inputs(MATMUL)
    assert plan.refusing and _plan._draws_layouts_first(plan) and plan.ranked_relations
    assert not plan_inputs(PLAIN).refusing  # x * y broadcasts anything: the plain draw
    assert plan_inputs(VIEW_AS_TWICE).refusing  # 45% of the grid: numbers of elements differ
    monkeypatch.setattr(_plan, "LAYOUTS_FIRST_WHEN_REFUSED", False)
    slow = plan_inputs(MATMUL)
    assert not slow.refusing and not _plan._draws_layouts_first(slow) and not slow.ranked_relations


@pytest.mark.slow  # two searches of 40 inputs
def test_layouts_first_when_refused_keeps_the_inputs_accepted_and_draws_fewer(monkeypatch):
    drawn_per_kept = {}
    for first in (True, False):
        counts = _accepted_draws(monkeypatch, "LAYOUTS_FIRST_WHEN_REFUSED", first, MATMUL)
        drawn_per_kept[first] = counts.drawn / counts.kept
    assert drawn_per_kept[True] < drawn_per_kept[False], drawn_per_kept


# -- the guard harness's values -------------------------------------------------------------------


def _recorded(harness: _running.GuardHarness, inputs: dict) -> list:  # type: ignore[type-arg]
    try:
        harness.match(inputs)
    except Exception as exc:  # what the pattern raises is part of the answer
        return [type(exc).__name__, str(exc).splitlines()[0]]
    return [node.meta["val"] for node in harness.gm.graph.nodes]


def _same_values(a: list, b: list) -> bool:  # type: ignore[type-arg]
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.dtype == y.dtype
                    and x.shape == y.shape and torch.equal(x.nan_to_num(), y.nan_to_num())):
                return False
        elif repr(x) != repr(y):
            return False
    return True


def _guarded_rules(names: tuple[str, ...] | None = None, *, modules: bool = False) -> list[Rule]:
    """The library's guarded rules, with module captures (``modules``) or without."""
    from fxrewrite.loader import load_rules

    rules = [r for r in load_rules() if r.where and any(p.kind == "module" for p in r.compiled.params) == modules]
    return [r for r in rules if names is None or r.name in names]


def _check_guard_values(rules: list[Rule], monkeypatch) -> int:  # type: ignore[no-untyped-def]
    compared = 0
    for rule in rules:
        plan = plan_inputs(rule)
        harness = _running.GuardHarness(rule)
        for inputs in [*_drawn(plan.strategy())[:5], _broken(plan)]:
            monkeypatch.setattr(_running, "FAST_GUARD_VALUES", True)
            fast = _recorded(harness, inputs)
            monkeypatch.setattr(_running, "FAST_GUARD_VALUES", False)
            slow = _recorded(harness, inputs)
            assert _same_values(fast, slow), (rule.name, fast, slow)
            compared += 1
    return compared


def _broken(plan) -> dict:  # type: ignore[no-untyped-def,type-arg]
    """Inputs the pattern raises on: every tensor 0-dim beside a 3-dim one."""
    inputs = _drawn(plan.strategy())[0]
    first = plan.tensors[0].name
    return {k: (torch.ones(2, 3, 4, dtype=v.dtype) if k == first else v.reshape(-1)[:1].reshape(()))
            if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


@pytest.mark.slow  # three rules, 41 inputs drawn each
def test_fast_guard_values_are_the_interpreters(monkeypatch):
    rules = _guarded_rules(("attention_masked", "linear_add_bias", "flatten_from_twice"))
    assert len(rules) == 3 and _check_guard_values(rules, monkeypatch) == 18


@pytest.mark.slow  # every guarded rule of the library
def test_fast_guard_values_are_the_interpreters_on_the_library(monkeypatch):
    rules = _guarded_rules()
    assert _check_guard_values(rules, monkeypatch) == 6 * len(rules)


@pytest.mark.slow  # the four rules of the library with module captures, 41 inputs drawn each
def test_fast_guard_values_are_the_interpreters_with_module_captures(monkeypatch):
    rules = _guarded_rules(modules=True)
    assert len(rules) >= 4 and _check_guard_values(rules, monkeypatch) == 6 * len(rules)


def _linear_then_relu(x, lin: torch.nn.Linear):  # type: ignore[no-untyped-def]
    return torch.relu(lin(x))


def test_the_fast_guard_values_of_a_pattern_with_a_module_capture():
    rule = Rule.from_functions(_linear_then_relu, lambda x, lin: torch.relu(lin(x)), name="linear_relu",
                               where=lambda m: m["x"].dim() == 2)
    harness = _running.GuardHarness(rule)
    lin = torch.nn.Linear(3, 2)
    with torch.no_grad():
        lin.weight.fill_(1.0)
        lin.bias.fill_(-1.0)
    for inputs, expected in (({"x": torch.ones(4, 3), "lin": lin}, 2.0), ({"x": torch.ones(4, 5), "lin": lin}, None)):
        fast = _recorded(harness, inputs)
        slow_harness = _running.GuardHarness(rule)
        slow_harness.values = None  # the interpreter
        assert _same_values(fast, _recorded(slow_harness, inputs))
        assert (float(fast[2][0, 0]) == expected) if expected is not None else fast[0] == "RuntimeError"
    assert harness.gm.lin is not lin and torch.equal(harness.gm.lin.weight, lin.weight)  # a copy, run as drawn


def test_the_fast_guard_values_of_a_small_pattern():
    rule = _matrix_rule()
    harness = _running.GuardHarness(rule)
    inputs = {"x": torch.ones(2, 3), "y": torch.full((3,), 2.0)}
    fast = _recorded(harness, inputs)
    slow_harness = _running.GuardHarness(rule)
    slow_harness.values = None  # the interpreter
    assert _same_values(fast, _recorded(slow_harness, inputs)) and float(fast[2][0, 0]) == 3.0


# -- focused searches admitted by relations -------------------------------------------------------


@pytest.mark.slow  # every rule of the library probed
def test_a_focus_admitted_by_a_relation_is_admitted_by_the_search(monkeypatch):
    from fxrewrite.loader import load_rules

    shortcuts = 0
    for rule in load_rules():
        plan = plan_inputs(rule)
        for name in plan.broadcastable:
            focus = plan.with_smaller(name)
            if _plan._admitted_by_relations(focus):
                shortcuts += 1
                monkeypatch.setattr(_plan, "ADMITTED_BY_RELATIONS", False)
                assert _plan.admits_inputs(focus), (rule.name, name)
                monkeypatch.setattr(_plan, "ADMITTED_BY_RELATIONS", True)
    assert shortcuts >= 50


def test_only_a_smaller_focus_with_a_relation_that_drops_it_is_admitted_without_a_search():
    plan = plan_inputs(_matrix_rule())  # rank 2 keeps both; at ranks 3 and 4 x or y may lose one
    assert _plan._admitted_by_relations(plan.with_smaller("x"))
    assert not _plan._admitted_by_relations(plan)
    assert not _plan._admitted_by_relations(attrs.evolve(plan.with_smaller("x"), ranked_relations={2: ({"x": 0},)}))


def test_a_smaller_focus_draws_the_ranks_where_a_relation_drops_that_tensor(monkeypatch):
    plan = plan_inputs(_matrix_rule())  # rank 2 keeps both; at ranks 3 and 4 x or y may lose one
    assert plan.with_smaller("x").ranks(torch.float32) == (3, 4)
    assert attrs.evolve(plan, ranked_relations={}).with_smaller("x").ranks(torch.float32) == (2, 3, 4)  # none known
    monkeypatch.setattr(_plan, "SMALLER_AT_ITS_RANKS", False)
    assert plan.with_smaller("x").ranks(torch.float32) == (2, 3, 4)


@pytest.mark.slow  # two searches of 40 inputs
def test_a_smaller_focus_at_its_ranks_keeps_the_inputs_accepted_and_refuses_fewer(monkeypatch):
    rule, refused = _matrix_rule(), {}
    for on in (True, False):
        drawn: list = []
        refused[on] = _accepted_draws(monkeypatch, "SMALLER_AT_ITS_RANKS", on, rule,
                                      focus=lambda plan: plan.with_smaller("x"), drawn=drawn).layouts_refused
        assert any(inputs["x"].dim() < inputs["y"].dim() for inputs in drawn)
    assert refused[True] < refused[False], refused


def test_transposed_as_bits_and_as_booleans_both_lay_out_each_tensor_either_way(monkeypatch):
    plan = plan_inputs(_matrix_rule())
    config = plan.config(torch.float32, 2)
    for bits in (True, False):
        monkeypatch.setattr(_plan, "TRANSPOSED_AS_BITS", bits)
        drawn = _drawn(_plan._tensor_layouts.uncached(plan, config, (2, 3)))
        kinds = {(layouts["x"].transposed, layouts["y"].transposed) for layouts in drawn}
        assert kinds == {(False, False), (False, True), (True, False), (True, True)}, (bits, kinds)
    contiguous = attrs.evolve(plan, domain=attrs.evolve(plan.domain, non_contiguous=False))
    monkeypatch.setattr(_plan, "TRANSPOSED_AS_BITS", True)
    assert not any(layout.transposed for layouts in _drawn(_plan._tensor_layouts.uncached(contiguous, config, (2, 3)))
                   for layout in layouts.values())


# -- an input that draws its refused try again ----------------------------------------------------


def _view_to(x, a: int, b: int):  # type: ignore[no-untyped-def]
    return x.view(a, b)


#: Its simplest draw (a 0-dim tensor viewed as (-1, -1)) is refused: Hypothesis starts each search
#: with inputs of such draws.
VIEW_TO = Rule.from_functions(_view_to, _view_to, name="view_to",
                              domain={"ranks": (0, 2), "sides": (1, 3), "literals": {"a": (-1, 1, 2), "b": (-1, 1, 2)}})


@pytest.mark.slow  # two searches of 40 inputs
def test_an_input_repeating_its_refused_try_is_rejected_and_the_inputs_stay_accepted(monkeypatch):
    refused: dict[bool, int] = {}
    drawn: dict[bool, list] = {True: [], False: []}
    for on in (True, False):
        counts = _accepted_draws(monkeypatch, "REPEATED_REFUSAL_REJECTS", on, VIEW_TO, drawn=drawn[on])
        refused[on] = counts.layouts_refused
    assert refused[True] < refused[False], refused
    assert len({(d["a"], d["b"]) for d in drawn[True]}) >= 3  # still varied


# -- value lists capped at the tensor's size ------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool], ids=str)
def test_a_capped_value_list_draws_at_most_the_tensors_size(dtype, monkeypatch):
    def lists(capped: bool) -> str:
        _values._value_lists.cache_clear()
        return repr(_values._value_lists(dtype, 3, None, None, True, True, False, capped))

    assert "max_size=3" in lists(True) and "max_size=32" not in lists(True)
    assert "max_size=32" in lists(False) and "max_size=3)" not in lists(False)  # the plain draw
    monkeypatch.setattr(_values, "CAPPED_VALUE_LISTS", False)
    assert "max_size=32" in lists(True)  # the slow twin
    _values._value_lists.cache_clear()


@pytest.mark.slow  # two searches of 40 inputs
def test_capped_and_uncapped_value_lists_keep_the_inputs_accepted_and_varied(monkeypatch):
    for capped in (True, False):
        monkeypatch.setattr(_values, "CAPPED_VALUE_LISTS", capped)
        _values._value_lists.cache_clear()
        plan = plan_inputs(GUARDED)
        drawn = _drawn(plan.strategy())
        assert all(_plan.accepts(plan, inputs) for inputs in drawn)
        assert any(len(set(d["x"].flatten().tolist())) > 1 for d in drawn)  # tensors of several values
    _values._value_lists.cache_clear()


# -- flattened value draws ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.uint8], ids=str)
@pytest.mark.parametrize("bounds", [(None, None, True), (-4.0, 4.0, False)], ids=["any", "bounded"])
def test_a_flattened_element_draws_what_the_one_of_draws_for_the_same_choices(dtype, bounds):
    lo, hi, special = bounds
    plain = _values.elements(dtype, min_value=lo, max_value=hi, special_values=special)
    flat = _values._flat(plain)
    assert isinstance(flat, _values._FlatOneOf)  # this Hypothesis exposes what the flattening needs
    seen = set()
    for seed in range(150):
        for first, second in ((plain, flat), (flat, plain)):
            a, b = replayed(first, second, seed)
            assert repr(a) == repr(b), (seed, a, b)  # repr: nan is nan, -0.0 is not 0.0
            seen.add(repr(a))
    assert len(seen) > (30 if dtype.is_floating_point else 4)  # every group drawn: simple, extreme, moderate...


def test_flat_elements_off_is_the_one_of_itself(monkeypatch):
    plain = _values.elements(torch.float32)
    assert _values._flat(plain) is not plain
    monkeypatch.setattr(_values, "FLAT_ELEMENTS", False)
    assert _values._flat(plain) is plain
    assert _values._flat(_values.elements(torch.bool)) is not None  # booleans: not a one-of, left as they are
