"""fxrewrite.testing.strategies: tensors, shapes, values and the inputs drawn for a rule."""

from __future__ import annotations

import math

import _helpers
import pytest
import torch
from hypothesis import Phase, find, given, settings
from torch import nn

from fxrewrite import Rule
from fxrewrite.errors import RuleDefinitionError
from fxrewrite.testing import DOMAIN_KEYS, Domain, _plan, elements, inputs_for, tensor_shapes, tensors
from fxrewrite.testing.strategies import (
    GuardRaised,
    default_module,
    fit_input_shape,
    match_for,
    plan_inputs,
)


def draws(strategy, n=100):
    """``n`` deterministic draws of ``strategy`` (:func:`_helpers.draws`; 100 by default here)."""
    return _helpers.draws(strategy, n)


def minimal(strategy, condition):
    """The simplest value of ``strategy`` that meets ``condition``, by a derandomized search
    without the example database: ``find``'s default settings search at random and replay the
    database, so the same call took 0.01 s (the database held the answer) to 1.4 s (a fresh search
    that met its first infinity late) of CPU, against the one-second rule."""
    return find(strategy, condition, settings=settings(database=None, derandomize=True))


def rule(pattern, replacement=None, **kw):
    return Rule.from_functions(pattern, replacement or pattern, name=kw.pop("name", "r"), **kw)


def has(tensor, predicate):
    return bool(predicate(tensor.double()).any())


# -- elements, shapes, tensors --------------------------------------------------------------------


def test_float_elements_include_every_special_value():
    values = draws(elements(torch.float32), 300)
    for special in (0.0, 1.0, -1.0, math.inf, -math.inf, torch.finfo(torch.float32).max,
                    torch.finfo(torch.float32).tiny):
        assert special in values, special
    assert any(math.isnan(v) for v in values)
    assert any(v == 0 and math.copysign(1, v) < 0 for v in values), "-0.0"
    assert any(0 < abs(v) < torch.finfo(torch.float32).tiny for v in values), "a subnormal"


def test_bounds_and_special_values_flag():
    values = draws(elements(torch.float64, min_value=-2.0, max_value=3.0, special_values=False), 200)
    assert all(-2.0 <= v <= 3.0 for v in values)
    assert -2.0 in values and 3.0 in values
    with_specials = draws(elements(torch.float64, min_value=0.0, max_value=1.0), 200)
    assert math.inf in with_specials and all(not v < 0 or math.isinf(v) for v in with_specials)


def test_integer_elements_include_the_dtype_extremes():
    values = draws(elements(torch.int32), 300)
    assert {0, 1, -1, 2**31 - 1, -(2**31)} <= set(values)
    assert set(draws(elements(torch.uint8), 100)) <= set(range(256))
    assert set(draws(elements(torch.bool), 20)) == {False, True}


def test_empty_bounds_are_an_error_that_says_so():
    with pytest.raises(ValueError, match="larger than max_value"):
        elements(torch.float32, min_value=2.0, max_value=1.0)
    with pytest.raises(ValueError, match=r"no torch\.int64 value"):
        elements(torch.int64, min_value=0.2, max_value=0.8)


def test_tensor_shapes_respect_bounds_and_shrink_to_ones():
    assert all(2 <= len(s) <= 3 and all(1 <= d <= 5 for d in s)
               for s in draws(tensor_shapes(min_rank=2, max_rank=3, max_side=5), 50))
    assert minimal(tensor_shapes(min_rank=3), lambda s: True) == (1, 1, 1)


def test_tensors_have_the_requested_dtypes_and_shapes():
    drawn = draws(tensors(dtypes=[torch.float64, torch.int8], shapes=(2, 3)), 60)
    assert {t.dtype for t in drawn} == {torch.float64, torch.int8}
    assert all(t.shape == (2, 3) and t.is_contiguous() for t in drawn)


def test_tensors_draw_special_values_unless_told_not_to():
    drawn = draws(tensors(dtypes=torch.float32), 100)
    assert any(has(t, torch.isnan) for t in drawn) and any(has(t, torch.isinf) for t in drawn)
    finite = draws(tensors(dtypes=torch.float32, special_values=False, min_value=-1, max_value=1), 100)
    assert all(torch.isfinite(t).all() and t.abs().max() <= 1 for t in finite)


def test_a_tensor_counterexample_shrinks_to_one_element():
    t = minimal(tensors(dtypes=torch.float32), lambda t: has(t, torch.isinf))
    assert t.numel() == 1 and math.isinf(t.item())


# -- inputs for a rule: shapes --------------------------------------------------------------------


def shapes_of(drawn, *names):
    return [tuple(tuple(d[n].shape) for n in names) for d in drawn]


ADD = rule(lambda x, y: x + y)


def test_inputs_for_draws_every_parameter_by_name():
    drawn = draws(inputs_for(ADD), 20)
    assert all(sorted(d) == ["x", "y"] and all(isinstance(v, torch.Tensor) for v in d.values()) for d in drawn)


@pytest.mark.slow  # about 3 s of CPU
def test_tensor_shapes_are_related_equal_broadcast_and_of_different_ranks():
    any_shapes = rule(lambda x, y: torch.neg(x).sum() + torch.neg(y).sum())
    # Same ranks with size-1 dimensions come in 1.5-3% of the draws: 150 drew none in one CI run
    # (which of the project's modules were loaded changes Hypothesis's constants, and so the draws).
    pairs = shapes_of(draws(inputs_for(any_shapes), 400), "x", "y")
    for x, y in pairs:
        torch.broadcast_shapes(x, y)  # raises unless the shapes broadcast together
    assert any(x == y and len(x) >= 2 for x, y in pairs), "equal shapes"
    assert any(len(x) != len(y) for x, y in pairs), "missing dimensions"
    assert any(len(x) == len(y) and x != y for x, y in pairs), "size-1 dimensions"


def test_shapes_equal_domain_gives_one_shape_to_all_tensors():
    pairs = shapes_of(draws(inputs_for(rule(lambda x, y: x + y, domain={"shapes": "equal"})), 60), "x", "y")
    assert all(x == y for x, y in pairs)


def test_ranks_and_sides_follow_the_domain():
    drawn = draws(inputs_for(rule(lambda x: torch.neg(x), domain={"ranks": (2, 3), "sides": (2, 4)})), 60)
    assert all(2 <= d["x"].dim() <= 3 and min(d["x"].shape) >= 2 and max(d["x"].shape) <= 4 for d in drawn)
    assert {d["x"].dim() for d in drawn} == {2, 3}


def test_only_ranks_the_pattern_accepts_are_drawn():
    drawn = draws(inputs_for(rule(lambda x: x.transpose(-2, -1).sum())), 60)
    assert all(d["x"].dim() >= 2 for d in drawn)


def test_non_contiguous_tensors_are_drawn_too():
    drawn = draws(inputs_for(rule(lambda x: torch.neg(x), domain={"ranks": (2, 2), "sides": (2, 3)})), 100)
    assert any(not d["x"].is_contiguous() for d in drawn) and any(d["x"].is_contiguous() for d in drawn)


# -- inputs for a rule: dtypes and values ---------------------------------------------------------


@pytest.mark.slow
def test_several_dtypes_are_drawn_and_mixed():
    drawn = draws(inputs_for(ADD), 200)
    dtypes = {d[name].dtype for d in drawn for name in "xy"}
    assert len(dtypes & {torch.float32, torch.float64, torch.int64, torch.int32, torch.uint8, torch.bool}) >= 5
    assert any(d["x"].dtype != d["y"].dtype for d in drawn)


def test_dtypes_the_pattern_rejects_are_left_out():
    plan = plan_inputs(rule(lambda x: torch.relu(torch.relu(x))))
    assert torch.bool not in plan.dtypes and torch.float32 in plan.dtypes
    assert plan.dtypes == plan_inputs(rule(lambda x: torch.relu(x))).dtypes


def test_domain_dtypes_and_mixed_dtypes_are_respected():
    r = rule(lambda x, y: x * y, domain={"dtypes": (torch.float64, torch.int32), "mixed_dtypes": False})
    drawn = draws(inputs_for(r), 60)
    assert {d["x"].dtype for d in drawn} == {torch.float64, torch.int32}
    assert all(d["x"].dtype == d["y"].dtype for d in drawn)


def test_per_input_domain_overrides():
    r = rule(lambda x, i: x[i], domain={"dtypes": (torch.float32,),
                                       "inputs": {"i": {"dtypes": (torch.int64,), "min_value": 0, "max_value": 0}}})
    drawn = draws(inputs_for(r), 40)
    assert drawn and all(d["i"].dtype == torch.int64 and (d["i"] == 0).all() for d in drawn)


def test_a_tensor_argument_can_have_a_fixed_shape():
    def pattern(x, d):
        return x / torch.sqrt(d)

    r = rule(pattern, domain={"inputs": {"d": {"shape": (), "dtypes": (torch.int64,), "min_value": 1}}})
    drawn = draws(inputs_for(r), 40)
    assert drawn and all(d["d"].shape == () and d["d"].dtype == torch.int64 and d["d"] >= 1 for d in drawn)
    assert any(d["x"].dim() > 0 for d in drawn)


@pytest.mark.slow
def test_square_shapes_make_matmul_patterns_easy_to_feed():
    plan = plan_inputs(rule(lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1), -1) @ v))
    drawn = draws(plan.strategy(), 40)
    assert len(drawn) >= 30 and any(d["q"].dim() >= 2 and d["q"].shape[-1] > 1 for d in drawn)


def test_special_values_appear_in_rule_inputs():
    drawn = draws(inputs_for(rule(lambda x: torch.neg(x))), 50)
    floats = [d["x"] for d in drawn if d["x"].dtype.is_floating_point]
    assert any(has(x, torch.isnan) for x in floats) and any(has(x, torch.isinf) for x in floats)
    assert any((x == 0).any() for x in floats) and any((x < 0).any() for x in floats)


@pytest.mark.slow
def test_draws_where_the_pattern_raises_are_rejected():
    def pattern(x, y):
        return torch.mm(x, y)

    drawn = draws(inputs_for(rule(pattern)), 60)
    assert drawn and all(d["x"].dim() == 2 and d["x"].shape[1] == d["y"].shape[0] for d in drawn)
    assert all(d["x"].dtype == d["y"].dtype for d in drawn)


# -- literal captures -----------------------------------------------------------------------------


def test_literal_captures_are_drawn_from_their_annotation():
    def pattern(x, n: int, s: float, flag: bool, dtype: torch.dtype):
        return (x.to(dtype) * s + n).sum(-1, keepdim=flag)

    drawn = draws(inputs_for(rule(pattern)), 100)
    assert all(type(d["n"]) is int and type(d["s"]) is float and type(d["flag"]) is bool for d in drawn)
    assert all(isinstance(d["dtype"], torch.dtype) for d in drawn)
    assert {d["flag"] for d in drawn} == {False, True} and len({d["dtype"] for d in drawn}) > 2
    assert any(not math.isfinite(d["s"]) for d in drawn) and any(d["n"] < 0 for d in drawn)


@pytest.mark.slow
def test_string_captures_keep_the_values_the_pattern_accepts():
    def pattern(x, mode: str):
        return torch.div(x, 2, rounding_mode=mode)

    drawn = draws(inputs_for(rule(pattern)), 40)
    assert {d["mode"] for d in drawn} == {"floor", "trunc"}


def test_literal_values_the_pattern_rejects_are_left_out():
    def pattern(x, d0: int, d1: int):
        return x.transpose(d0, d1)

    drawn = draws(inputs_for(rule(pattern)), 60)
    assert drawn and all(-max(1, d["x"].dim()) <= d["d0"] < max(1, d["x"].dim()) for d in drawn)
    assert any(d["d0"] != d["d1"] for d in drawn)


def test_declared_literal_values_are_used():
    def pattern(x, approximate: str):
        return torch.nn.functional.gelu(x, approximate=approximate)

    r = rule(pattern, domain={"literals": {"approximate": ["none", "tanh"]}})
    assert {d["approximate"] for d in draws(inputs_for(r), 40)} == {"none", "tanh"}


# -- module captures ------------------------------------------------------------------------------


def test_default_modules_are_small_and_in_eval_mode():
    bn = default_module(nn.BatchNorm2d, width=3, kernel=1, bias=True)
    assert not bn.training and bn.num_features == 3 and not torch.equal(bn.running_var, torch.ones(3))
    assert default_module(nn.Linear, width=2, kernel=1, bias=False).bias is None
    assert isinstance(default_module(nn.ReLU, width=2, kernel=1, bias=True), nn.ReLU)
    assert default_module(nn.Module, width=2, kernel=1, bias=True) is not None  # constructible, useless


def test_input_shapes_fit_the_module():
    assert fit_input_shape(nn.Linear(5, 2), (3, 1)) == (3, 5)
    assert fit_input_shape(nn.Conv1d(4, 2, 3), (2, 1, 1)) == (2, 4, 3)
    assert fit_input_shape(nn.BatchNorm2d(7), (1, 2, 3, 4)) == (1, 7, 3, 4)
    assert fit_input_shape(nn.LayerNorm((2, 3)), (4, 5, 6)) == (4, 2, 3)


def test_module_captures_get_modules_and_fitting_inputs():
    def pattern(x, conv: nn.Conv2d, bn: nn.BatchNorm2d):
        return bn(conv(x))

    drawn = draws(inputs_for(rule(pattern)), 40)
    assert len(drawn) >= 20
    for d in drawn:
        assert isinstance(d["conv"], nn.Conv2d) and not d["bn"].training
        assert d["x"].shape[-3] == d["conv"].in_channels and d["bn"].num_features == d["conv"].out_channels


def test_module_factories_from_the_domain_are_used():
    def pattern(x, lin: nn.Linear):
        return torch.relu(lin(x))

    r = rule(pattern, domain={"modules": {"lin": lambda: nn.Linear(6, 2)}, "dtypes": (torch.float32,)})
    drawn = draws(inputs_for(r), 30)
    assert drawn and all(d["lin"].in_features == 6 and d["x"].shape[-1] == 6 for d in drawn)
    assert len({float(d["lin"].weight.detach().sum()) for d in drawn}) > 1, "weights vary with the drawn seed"


def _linear_of_any_width() -> nn.Linear:
    return nn.Linear(2, 1 + int(torch.randint(4, ())))


def _two_linears(x, first: nn.Linear, second: nn.Linear):
    return second(first(x))


@pytest.mark.parametrize("order", ["in parameter order", "second named first"])
def test_a_module_factory_receives_the_module_drawn_for_the_capture_it_names(order):
    factories = {"first": _linear_of_any_width, "second": lambda first: nn.Linear(first.out_features, 3)}
    if order == "second named first":  # the factory of a capture named by an earlier one is drawn first
        factories = {"first": lambda second: nn.Linear(2, second.in_features),
                     "second": lambda: nn.Linear(1 + int(torch.randint(4, ())), 3)}
    r = rule(_two_linears, domain={"dtypes": (torch.float32,), "modules": factories})
    plan = plan_inputs(r)
    drawn = draws(plan.strategy(), 30)
    assert len(drawn) == 30
    assert all(d["second"].in_features == d["first"].out_features for d in drawn)
    assert len({d["first"].out_features for d in drawn}) > 1, "the widths vary with the drawn seed"
    assert [p.name for p in _plan._module_order(plan)] == (
        ["first", "second"] if order == "in parameter order" else ["second", "first"])


def test_modules_drawn_apart_fit_together_less_often_than_modules_drawn_for_each_other():
    def refused(factories) -> int:  # type: ignore[no-untyped-def]
        """Drawn modules the pattern refused (each input draws its modules again, up to 8 times)."""
        plan = plan_inputs(rule(_two_linears, domain={"dtypes": (torch.float32,), "modules": factories}))
        draws(plan.strategy(), 20)
        return plan.counts.layouts_refused + plan.counts.drawn - plan.counts.kept

    apart = {"first": _linear_of_any_width, "second": lambda: nn.Linear(1 + int(torch.randint(4, ())), 3)}
    fitted = {"first": _linear_of_any_width, "second": lambda first: nn.Linear(first.out_features, 3)}
    assert 5 * refused(fitted) < refused(apart)  # the only refusals left are the tensor's (a 0-dim x)


class Block(nn.Module):
    """A module class fxrewrite cannot build on its own."""

    def __init__(self, channels):
        super().__init__()
        self.channels = channels

    def forward(self, x):
        return x


def test_a_module_class_without_defaults_needs_a_factory():
    def pattern(x, block: Block):
        return torch.relu(block(x))

    with pytest.raises(RuleDefinitionError, match=r"declare a factory: domain=\{'modules': \{'block': lambda: Block"):
        inputs_for(rule(pattern))


# -- guards ---------------------------------------------------------------------------------------


def test_guards_see_shapes_and_dtypes_of_the_drawn_inputs():
    m = match_for(rule(lambda x, y: x + y), {"x": torch.zeros(2, 3), "y": torch.zeros(3, dtype=torch.int64)})
    assert m["x"].shape == (2, 3) and m["y"].dtype == torch.int64 and m["y"].dim() == 1
    assert m.anchor.meta["val"].shape == (2, 3)


def test_every_draw_satisfies_the_guards():
    wide_floats = rule(lambda x: torch.neg(x),
                       where=[lambda m: m["x"].dtype == torch.float64,
                              lambda m: m["x"].dim() >= 1 and m["x"].shape[-1] >= 2])
    drawn = draws(inputs_for(wide_floats), 60)
    assert drawn and all(d["x"].dtype == torch.float64 and d["x"].shape[-1] >= 2 for d in drawn)


def test_guards_get_literal_and_module_captures():
    def pattern(x, lin: nn.Linear, s: float):
        return lin(x) * s

    r = rule(pattern, where=lambda m: m["s"] > 0 and m["lin"].bias is not None and m.node("lin").op == "call_module")
    drawn = draws(inputs_for(r), 40)
    assert drawn and all(d["s"] > 0 and d["lin"].bias is not None for d in drawn)


def test_a_guard_that_raises_is_reported():
    r = rule(lambda x: torch.neg(x), where=lambda m: m["x"].shape[-1] > 1)

    @settings(max_examples=50, database=None, derandomize=True, phases=[Phase.generate])
    @given(inputs_for(r))
    def use(inputs):
        pass

    with pytest.raises(GuardRaised, match=r"guard .* raised IndexError"):
        use()


# -- the domain declaration -----------------------------------------------------------------------


def test_names_of_other_rules_parameters_are_ignored():
    shared = {"literals": {"n": [1], "other": [2]},
              "inputs": {"x": {"min_value": 0, "special_values": False}, "y": {"min_value": 1}}}

    def pattern(x, n: int):
        return x + n

    drawn = draws(inputs_for(rule(pattern, domain=shared)), 20)
    assert drawn and all(d["n"] == 1 and (d["x"] >= 0).all() for d in drawn)


def test_domain_keys_are_documented():
    assert set(DOMAIN_KEYS) == {"dtypes", "ranks", "sides", "shapes", "mixed_dtypes", "non_contiguous", "min_value",
                                "max_value", "special_values", "literals", "modules", "inputs"}


@pytest.mark.parametrize("domain, message", [
    ({"dtype": (torch.float32,)}, r"unknown domain key\(s\) \['dtype'\]"),
    ({"ranks": (3, 1)}, r"domain\['ranks'\] must be a \(min, max\) pair"),
    ({"sides": (0, 2)}, r"domain\['sides'\] must start at 1"),
    ({"shapes": "same"}, r"domain\['shapes'\] is 'broadcast' or 'equal'"),
    ({"dtypes": ("float32",)}, "sequence of torch dtypes"),
    ({"special_values": 1}, "must be True or False"),
    ({"inputs": {"x": {"rank": 2}}}, r"unknown domain\['inputs'\]\['x'\] key"),
    ({"modules": {"m": 3}}, "zero-argument factory"),
    ({"literals": {"x": [1]}}, r"domain\['literals'\] is for literal parameters, but 'x' is a tensor parameter; "
                              r"move it to domain\['inputs'\]"),
    ({"inputs": {"m": {}}}, r"but 'm' is a module parameter; move it to domain\['modules'\]"),
])
def test_malformed_domains_are_rule_definition_errors(domain, message):
    def pattern(x, m: nn.ReLU):
        return m(x)

    with pytest.raises(RuleDefinitionError, match=message):
        plan_inputs(rule(pattern, name="bad", domain=domain))


def test_domain_describe_shows_declaration_and_what_is_drawn():
    text = Domain.parse({"dtypes": (torch.float32,), "special_values": False}, where="r").describe()
    assert text.startswith("declared {'dtypes': (torch.float32,), 'special_values': False} -> dtypes float32")
    assert "(no nan or inf)" in text
    assert Domain.parse(None, where="r").describe().startswith("default -> dtypes float32, float64, int64")


# -- the checker's reach: values real rules break on, and minimal counterexamples -----------------


def _next(value, towards, dtype=torch.float32):
    return float(torch.nextafter(torch.tensor(value, dtype=dtype), torch.tensor(towards, dtype=dtype)))


def test_ulp_neighbours_lie_one_ulp_around_powers_of_two_and_zero():
    from fxrewrite.testing.strategies import ulp_neighbours

    values = ulp_neighbours(torch.float32)
    info = torch.finfo(torch.float32)
    smallest_subnormal = _next(0.0, 1.0)
    assert values[:2] == (smallest_subnormal, -smallest_subnormal)
    for expected in (_next(info.tiny, 0.0), _next(1.0, 0.0), _next(1.0, 2.0), _next(2.0**24, 0.0),
                     _next(2.0**24, math.inf), _next(info.max, 0.0), -_next(16.0, 0.0)):
        assert expected in values, expected
    assert all(math.isfinite(v) and abs(v) <= info.max for v in values)
    assert all(abs(v) <= info.max for v in ulp_neighbours(torch.float16))


def test_float_draws_reach_subnormals_ulp_neighbours_and_negative_zero():
    from fxrewrite.testing.strategies import ulp_neighbours

    values = draws(elements(torch.float32), 400)
    neighbours = set(ulp_neighbours(torch.float32))
    assert len(neighbours.intersection(values)) >= 5
    assert _next(0.0, 1.0) in values, "the smallest subnormal"
    assert any(v == 0 and math.copysign(1, v) < 0 for v in values), "-0.0"


def test_integer_tensors_are_often_masks_of_small_values():
    masks = [t for t in draws(tensors(dtypes=torch.int64, shapes=(4,)), 200)
             if bool(((t >= 0) & (t <= 3)).all())]
    assert len(masks) >= 40
    assert any(bool((t >= 2).any()) for t in masks), "masks hold values beyond 0 and 1"


def _minimal(pattern, replacement, domain, seeds=(None,), **kw):
    """The counterexample of the first check (one per seed, ``None``: derandomized) that finds the
    rule unsound."""
    from fxrewrite.testing import check_rule

    rule = Rule.from_functions(pattern, replacement, name="r", domain=domain, **kw)
    for seed in seeds:
        result = check_rule(rule, seed=seed, repair=False)
        if result.verdict == "unsound":
            return result.counterexample
    raise AssertionError(f"no check of seeds {seeds} found the rule unsound: {result.message}")


def test_a_subnormal_bug_shrinks_to_the_smallest_subnormal():
    # reciprocal overflows to inf only for subnormals below 1/max
    found = _minimal(lambda x: torch.isinf(torch.reciprocal(x)), lambda x: x == 0, {"dtypes": (torch.float32,)})
    assert found["x"].shape == () and abs(float(found["x"])) == _next(0.0, 1.0)  # either sign is minimal


def test_a_bug_one_ulp_below_a_power_of_two_shrinks_to_the_smallest_such_value():
    from fxrewrite.testing.equivalence import evaluate
    from fxrewrite.testing.strategies import ulp_neighbours

    def pattern(x):
        return torch.floor(torch.log2(x))

    def replacement(x):
        return (torch.frexp(x).exponent - 1).to(x.dtype)  # log2 rounds up to 2**k just below it

    domain = {"dtypes": (torch.float32,), "min_value": 1.0, "max_value": 1e6, "special_values": False}
    # the claim is the shrinking; finding the bug is the search's luck: 27 of seeds 0-29 find it in
    # 100 examples, the derandomized search does not (it did before the draws stopped throwing away
    # the small floats these bounds exclude, when 16 of 30 seeds found it)
    found = _minimal(pattern, replacement, domain, seeds=(1, 2))
    rule = Rule.from_functions(pattern, replacement, name="r")
    failing = [v for v in ulp_neighbours(torch.float32) if 1.0 <= v <= 1e6
               and evaluate(rule, {"x": torch.tensor(v)}) is not None]
    assert found["x"].shape == () and float(found["x"]) == failing[0] == _next(16.0, 0.0)


@pytest.mark.slow  # 1.2 s of CPU in a fresh clone
def test_a_sign_of_zero_bug_shrinks_to_negative_zero():
    found = _minimal(lambda x: 1 / torch.abs(x), lambda x: 1 / torch.where(x < 0, -x, x), {"dtypes": (torch.float32,)})
    value = float(found["x"])
    assert found["x"].shape == () and value == 0 and math.copysign(1, value) < 0


@pytest.mark.slow  # 1.8 s of CPU in a fresh clone
def test_an_overflow_bug_shrinks_to_the_largest_finite_value():
    found = _minimal(lambda x: torch.sqrt(x * x), lambda x: torch.abs(x), {"dtypes": (torch.float32,)})
    # +max or -max, both minimal (which one depends on the constants Hypothesis picked up in the session)
    assert found["x"].shape == () and abs(float(found["x"])) == torch.finfo(torch.float32).max


@pytest.mark.slow  # 1.0 s of CPU in a fresh clone
def test_a_mask_bug_shrinks_to_the_value_2():
    for dtype in (torch.uint8, torch.int64):
        found = _minimal(lambda x: (x != 0).to(x.dtype), lambda x: x, {"dtypes": (dtype,)})
        assert found["x"].shape == () and int(found["x"]) == 2 and found["x"].dtype == dtype


def _permute_twice(x, a: int, b: int, c: int):
    return x.permute(a, b, c).permute(a, b, c)


def _identity(x, a: int, b: int, c: int):
    return x


@pytest.mark.slow
def test_every_permutation_of_a_small_rank_is_drawn():
    import itertools

    r = rule(_permute_twice, _identity)
    seen = {tuple(v % 3 for v in (d["a"], d["b"], d["c"])) for d in draws(inputs_for(r), 150)}
    assert set(itertools.permutations(range(3))) <= seen


@pytest.mark.slow
def test_a_permutation_bug_shrinks_to_a_three_cycle_on_a_small_tensor():
    found = _minimal(_permute_twice, _identity, None)
    order = tuple(found[k] % 3 for k in "abc")
    assert order in ((1, 2, 0), (2, 0, 1))  # permuting twice is the identity for every other permutation
    assert found["x"].dim() == 3 and found["x"].numel() <= 8


_BROADCAST_SEARCH = """
import torch
from fxrewrite import Rule
from fxrewrite.testing import check_rule
rule = Rule.from_functions(lambda x, y: (x + y).sum(), lambda x, y: x.sum() + y.sum(), name="r",
                           domain={"dtypes": (torch.float64,)})
result = check_rule(rule, repair=False)
assert result.verdict == "unsound", result.message
small, large = sorted((result.counterexample["x"], result.counterexample["y"]), key=lambda t: t.numel())
print(small.numel(), large.numel(), float(small.flatten()[0]) != 0, bool(torch.isfinite(large).all()))
"""


@pytest.mark.slow
def test_a_broadcasting_bug_is_not_hidden_by_overflow_and_shrinks_to_two_elements():
    # most drawn float tensors hold a nan, an inf or a huge value, which makes both sums inf or nan;
    # a third of them hold small whole numbers only, where the broadcast shows. Run in a fresh
    # interpreter: Hypothesis also draws constants found in the loaded modules, so in a long test
    # session the search (and what it shrinks to) depends on what else was imported.
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _BROADCAST_SEARCH], capture_output=True, text=True, timeout=300,
                          check=False, env={**__import__("os").environ, "CI": "true"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "2", "True", "True"]


# ---- the module's layout: a public face over private modules, one job each ----------------------

#: The private modules behind fxrewrite.testing.strategies, in import order, then the face itself.
_LAYERS = ("_reproducible", "_values", "_domain", "_nn_modules", "_running", "_sizes", "_plan", "_probing", "_inputs",
           "strategies")


@pytest.mark.slow
def test_each_strategies_module_imports_only_the_ones_before_it():
    import ast
    from pathlib import Path

    import fxrewrite.testing

    home = Path(fxrewrite.testing.__file__).parent
    for index, name in enumerate(_LAYERS):
        tree = ast.parse((home / f"{name}.py").read_text())
        siblings = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 1}
        assert siblings <= set(_LAYERS[:index]), f"{name} imports {sorted(siblings - set(_LAYERS[:index]))}"


def test_the_strategies_module_offers_every_name_it_offered_before_the_split():
    from fxrewrite.testing import strategies

    assert strategies.__all__ == [
        "DEFAULT_DTYPES", "DOMAIN_KEYS", "Domain", "GuardHarness", "GuardRaised", "InputPlan",
        "call_rule_function", "elements", "inputs_for", "match_for", "plan_inputs", "tensor_shapes", "tensors",
    ]
    others = ("MAX_DISTINCT_VALUES", "ShapeMode", "TensorDomain", "accepts", "default_module", "fit_input_shape",
              "ulp_neighbours", "_INPUT_KEYS")
    assert [name for name in others if not hasattr(strategies, name)] == []


@pytest.mark.slow
def test_running_a_rule_and_building_modules_do_not_import_hypothesis():
    import subprocess
    import sys

    code = ("import sys, fxrewrite.testing._running, fxrewrite.testing._nn_modules; "
            "print('hypothesis' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False"]
