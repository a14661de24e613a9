"""fxrewrite.testing._restrictions: a restriction is a value, evaluated directly and rendered as the text
a report shows; the two agree on every kind of restriction."""

from __future__ import annotations

import pytest
import torch

import fxrewrite
from fxrewrite import Rule
from fxrewrite.testing.repair import restrictions_for

R = Rule.from_functions


ADD = R(lambda x, y: x + y, lambda x, y: y + x, name="add")
#: Inputs that tell every restriction apart: broadcasting, integer and bool, 0-dim, non-contiguous,
#: negative, huge, tiny, nan and inf.
PROBES = (
    {"x": torch.ones(2, 3), "y": torch.ones(3)},
    {"x": torch.ones(2, dtype=torch.int32), "y": torch.ones(2, dtype=torch.bool)},
    {"x": torch.ones(2, dtype=torch.bool), "y": torch.ones(2)},
    {"x": torch.ones(()), "y": torch.ones(())},
    {"x": torch.ones(3, 2).t(), "y": torch.ones(2, 3)},
    {"x": torch.tensor([-2.0, 0.5]), "y": torch.tensor([3.0, 1e20])},
    {"x": torch.tensor([0.0, 1e-3]), "y": torch.tensor([5.0, 7.0])},
    {"x": torch.tensor([float("nan"), 1.0]), "y": torch.tensor([float("inf"), 1.0])},
    {"x": torch.tensor([1.0, 2.0], dtype=torch.float64), "y": torch.tensor([3.0, 4.0], dtype=torch.float64)},
)


def every_restriction(rule: Rule):
    return [r for chain in restrictions_for(rule).values() for r in chain]


def test_every_restriction_kind_is_in_the_lattice():
    kinds = {(r.family, type(r).__name__) for r in every_restriction(ADD)}
    assert kinds == {("dtype", "DtypeRestriction"), ("shape", "ShapeRestriction"), ("rank", "RankRestriction"),
                     ("layout", "LayoutRestriction"), ("values", "ValueRestriction")}


def test_an_enforced_restriction_evaluates_as_its_python_and_dsl_text_do():
    from fxrewrite.testing.strategies import match_for

    enforced = [r for r in every_restriction(ADD) if r.enforced]
    assert {r.family for r in enforced} == {"dtype", "shape", "rank"}
    for restriction in enforced:
        from_python = eval(restriction.python(), {"torch": torch})  # the text a user pastes
        (from_dsl,) = fxrewrite.parse_rules(f"rule add:\n    x + y => y + x\n    where {restriction.dsl()}\n")
        assert len(from_dsl.where) == 1, restriction.label
        for inputs in PROBES:
            match = match_for(ADD, inputs)
            direct = restriction.holds(match)
            assert direct == restriction.guard()(match) == restriction.admits(inputs), (restriction.label, inputs)
            assert from_python(match) == direct, (restriction.label, restriction.python(), inputs)
            assert from_dsl.where[0](match_for(from_dsl, inputs)) == direct, (restriction.label, restriction.dsl())


def test_the_probes_tell_each_enforced_restriction_apart():
    for restriction in (r for r in every_restriction(ADD) if r.enforced):
        assert {restriction.admits(inputs) for inputs in PROBES} == {True, False}, restriction.label


def domain_restrictions() -> list[tuple[object, Rule]]:
    """Each restriction the graph cannot tell, with ADD restricted by it (float32 to begin with)."""
    out = []
    for restriction in (r for r in every_restriction(ADD) if not r.enforced):
        domain = restriction.narrow({"dtypes": (torch.float32,)})
        out.append((restriction, R(ADD.pattern, ADD.replacement, name="add", domain=domain)))
    return out


def test_a_domain_restriction_is_shown_as_the_domain_it_narrows_to():
    from fxrewrite.testing.repair import Repair

    assert {r.family for r, _ in domain_restrictions()} == {"layout", "values"}
    for restriction, restricted in domain_restrictions():
        assert restriction.python() is None and restriction.dsl() is None and restriction.guard() is None
        assert {restriction.admits(inputs) for inputs in PROBES} == {True, False}, restriction.label
        code = Repair(restricted, (restriction,), 1, restricted.domain).code()
        assert eval(f"dict({code})", {"torch": torch}) == {"domain": dict(restricted.domain)}, restriction.label


def assert_drawn_inputs_admitted(restriction, restricted: Rule) -> None:
    from hypothesis import HealthCheck, given, settings

    from fxrewrite.testing import inputs_for

    @settings(max_examples=25, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(inputs_for(restricted))
    def drawn_inputs_are_admitted(inputs):
        assert restriction.admits(inputs), (restriction.label, inputs)

    drawn_inputs_are_admitted()


@pytest.mark.slow
def test_a_domain_restriction_admits_every_input_drawn_from_the_domain_it_narrows_to():
    kinds = {}  # one restriction per kind: layout; values by sign, bounded or not, finite or not
    for restriction, restricted in domain_restrictions():
        kind = (restriction.family, getattr(restriction, "sign", None), getattr(restriction, "bound", None) is None,
                getattr(restriction, "finite", None))
        kinds.setdefault(kind, (restriction, restricted))
    assert len(kinds) == 9
    for restriction, restricted in kinds.values():
        assert_drawn_inputs_admitted(restriction, restricted)


def test_a_value_restriction_cannot_be_read_from_a_match():
    from fxrewrite.testing._restrictions import ValueRestriction
    from fxrewrite.testing.strategies import match_for

    bounded = ValueRestriction(("x", "y"), bound=1.0, finite=True)
    assert bounded.label == "finite, |x| <= 1"
    with pytest.raises(TypeError, match=r"'finite, \|x\| <= 1' cannot be read from a match .* declared as a domain"):
        bounded.holds(match_for(ADD, PROBES[0]))


def test_a_restriction_guard_is_named_by_its_dsl_text():
    from fxrewrite.testing._restrictions import RankRestriction

    guard = RankRestriction(("x", "y"), at_least=2).guard()
    assert guard.__name__ == "'where x.dim() >= 2 and y.dim() >= 2' (repair)"
    assert repr(guard) == "<guard 'where x.dim() >= 2 and y.dim() >= 2' (repair)>"
