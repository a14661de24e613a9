"""fxrewrite.testing.repair: the weakest restriction under which an unsound rule passes; restrictions as values."""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx

import fxrewrite
from fxrewrite import Rule
from fxrewrite.testing import check_rule
from fxrewrite.testing.repair import candidates, repair_rule, restrictions_for

R = Rule.from_functions


def guards_accept(rule: Rule, **inputs) -> bool:
    from fxrewrite.testing.strategies import match_for

    match = match_for(rule, inputs)
    return all(guard(match) for guard in rule.where)


def rule_from_code(rule: Rule, code: str) -> Rule:
    """The rule rebuilt from the pasted ``where=...``/``domain=...`` arguments of a report."""
    arguments = eval(f"dict({code})", {"torch": torch})
    return R(rule.pattern, rule.replacement, name=rule.name, **arguments)


@pytest.mark.slow
def test_mul_one_over_all_dtypes_is_repaired_by_a_dtype_guard():
    rule = R(lambda x: x * 1, lambda x: x, name="mul_one")  # bool * 1 promotes to int64
    result = check_rule(rule)
    assert result.verdict == "unsound" and result.counterexample["x"].dtype == torch.bool
    repaired = result.repair
    assert repaired is not None and check_rule(repaired, repair=False).ok
    assert not guards_accept(repaired, x=torch.tensor([True]))
    assert guards_accept(repaired, x=torch.tensor([1.5]))
    assert guards_accept(repaired, x=torch.tensor([1.5], dtype=torch.float64))
    # the weakest restriction: integers are fine (an int tensor times the int 1 keeps its dtype)
    assert guards_accept(repaired, x=torch.tensor([3]))
    assert "where=lambda m: all(m[n].dtype != torch.bool" in result.repair_code
    assert "repair:      restricted to no bool tensors" in result.message
    assert "enforced at rewrite time" in result.message and "where x.dtype != torch.bool" in result.message


@pytest.mark.slow
def test_the_repair_guard_is_enforced_at_rewrite_time():
    result = check_rule(R(lambda x: x * 1, lambda x: x, name="mul_one"))

    def model(a):
        return a * 1 + a

    for value, rewritten in ((torch.tensor([1.0, 2.0]), True), (torch.tensor([True, False]), False)):
        out = fxrewrite.rewrite(model, result.repair, example_inputs=(value,))
        out.module.graph.lint()
        assert (out.report.rewrites == 1) is rewritten
        torch.testing.assert_close(out.module(value), model(value))


@pytest.mark.slow
def test_sqrt_of_a_square_on_float32_is_repaired_by_a_value_bound():
    rule = R(lambda x: torch.sqrt(x * x), lambda x: torch.abs(x), name="sqrt_square",
             domain={"dtypes": (torch.float32,)})  # x * x overflows beyond 1.8e19
    result = check_rule(rule)
    assert result.verdict == "unsound"
    domain = result.repair.domain
    assert domain["dtypes"] == (torch.float32,)
    assert 0 < domain["max_value"] <= 1.8e19 and domain["min_value"] == -domain["max_value"]
    assert "declared as a domain, which only the checker sees" in result.message
    assert result.repair_code == 'domain={"dtypes": (torch.float32,), "min_value": -1e+15, "max_value": 1e+15},'
    assert check_rule(rule_from_code(rule, result.repair_code), repair=False).ok


@pytest.mark.slow
def test_relu_difference_over_all_dtypes_is_repaired_by_excluding_integers():
    rule = R(lambda x: torch.relu(x) - torch.relu(-x), lambda x: x, name="relu_diff")  # -INT_MIN overflows
    result = check_rule(rule)
    assert result.verdict == "unsound"
    repaired = result.repair
    for dtype in (torch.int64, torch.int32, torch.uint8):
        assert not guards_accept(repaired, x=torch.ones(2, dtype=dtype))
    assert guards_accept(repaired, x=torch.ones(2)) and guards_accept(repaired, x=torch.ones(2, dtype=torch.float64))
    assert "no integer tensors" in result.message
    pasted = rule_from_code(rule, result.repair_code)
    assert check_rule(pasted, repair=False).ok


@pytest.mark.slow
def test_broadcasting_arguments_are_repaired_by_requiring_one_shape():
    rule = R(lambda x, y: x + y, lambda x, y: x + y.reshape(x.shape), name="reshape_add")
    result = check_rule(rule)
    assert "all tensor arguments of one shape" in result.message and "where x.shape == y.shape" in result.message
    assert not guards_accept(result.repair, x=torch.ones(2, 3), y=torch.ones(3))
    assert guards_accept(result.repair, x=torch.ones(2, 3), y=torch.ones(2, 3))


@pytest.mark.slow
def test_a_rank_restriction_repairs_a_rule_that_needs_matrices():
    rule = R(lambda x: x.t(), lambda x: x.transpose(0, 1), name="t_transpose")  # transpose(0, 1) fails on vectors
    result = check_rule(rule)
    assert "at least 2 dimensions" in result.message
    assert guards_accept(result.repair, x=torch.ones(2, 3)) and not guards_accept(result.repair, x=torch.ones(3))


@pytest.mark.slow
def test_when_nothing_helps_repair_is_none_and_the_report_says_so():
    result = check_rule(R(lambda x: x * x, lambda x: x + x, name="square_is_double"))
    assert result.verdict == "unsound" and result.repair is None and result.repair_code is None
    assert "repair:      none found" in result.message and "fix the replacement" in result.message


def test_a_sound_rule_has_no_repair():
    result = check_rule(R(lambda x: torch.neg(torch.neg(x)), lambda x: x, name="double_neg"))
    assert result.ok and result.repair is None and "repair:" not in result.message


@pytest.mark.slow
def test_repair_can_be_turned_off():
    result = check_rule(R(lambda x: x * 1, lambda x: x, name="mul_one"), repair=False)
    assert result.verdict == "unsound" and result.repair is None and "repair:" not in result.message


def test_candidates_are_tried_weakest_first_and_known_counterexamples_prune_them():
    rule = R(lambda x: x * 1, lambda x: x, name="mul_one")
    first = next(candidates(rule))
    assert [r.label for r in first] == ["no bool tensors"]
    families = restrictions_for(rule)
    assert "shape" not in families  # one tensor argument: nothing to broadcast
    assert [r.label for r in families["dtype"]] == ["no bool tensors", "no integer tensors", "floating dtypes only"]
    # with every candidate search forbidden, only pruning runs: no repair, no search
    assert repair_rule(rule, [{"x": torch.tensor(True)}], check=check_rule, max_searches=0) is None


def test_restrictions_admit_exactly_what_their_guards_accept():
    rule = R(lambda x, y: x + y, lambda x, y: y + x, name="add")
    for chain in restrictions_for(rule).values():
        for restriction in chain:
            if restriction.python() is None:
                continue
            guard = eval(restriction.python(), {"torch": torch})
            for inputs in ({"x": torch.ones(2, 3), "y": torch.ones(3)}, {"x": torch.ones(2, dtype=torch.int32),
                                                                         "y": torch.ones(2, dtype=torch.bool)},
                           {"x": torch.ones(()), "y": torch.ones(())}):
                from fxrewrite.testing.strategies import match_for

                assert guard(match_for(rule, inputs)) == restriction.admits(inputs), restriction.label


def test_a_repaired_rule_does_not_fire_where_the_graph_cannot_show_its_guard_holds():
    result = check_rule(R(lambda x: x * 1, lambda x: x, name="mul_one"))
    gm = fx.symbolic_trace(lambda a: a * 1)  # no dtypes in the graph
    out = fxrewrite.rewrite(gm, result.repair)
    out.module.graph.lint()
    assert out.report.rewrites == 0
    value = torch.tensor([True, False])
    torch.testing.assert_close(out.module(value), value * 1)


@pytest.mark.slow
def test_a_repair_keeps_the_rules_own_guards_and_says_so():
    def at_least_a_vector(m):
        return m["x"].dim() >= 1

    rule = R(lambda x: x * 1, lambda x: x, name="mul_one", where=at_least_a_vector)
    result = check_rule(rule)
    assert result.repair.where[0] is at_least_a_vector and len(result.repair.where) == 2
    assert result.repair_code.endswith("# in addition to the rule's own guards")


@pytest.mark.slow
def test_the_fxr_lines_of_a_repair_paste_into_a_rule_file():
    source = 'rule sqrt_square:\n    torch.sqrt(x * x) => torch.abs(x)\n    domain dtypes=(torch.float32,)\n'
    (rule,) = fxrewrite.parse_rules(source)
    result = check_rule(rule)
    fxr = result.message.split("or, in a .fxr file:")[1].split("  fix:")[0]
    lines = [line.strip() for line in fxr.strip().splitlines()]
    assert lines == ["domain dtypes=(torch.float32,), min_value=-1e+15, max_value=1e+15"]
    repaired_source = source.rsplit("    domain", 1)[0] + "".join(f"    {line}\n" for line in lines)
    (repaired,) = fxrewrite.parse_rules(repaired_source)
    assert check_rule(repaired, repair=False).ok


# -- the module's shape ------------------------------------------------------------------------


def test_no_text_is_evaluated_in_the_testing_package():
    import ast
    from pathlib import Path

    package = Path(fxrewrite.__file__).parent / "testing"
    calls = [f"{path.name}:{node.lineno}" for path in sorted(package.glob("*.py"))
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("eval", "exec")]
    assert calls == []


def test_repair_does_not_import_the_checker_it_is_handed():
    import ast
    from pathlib import Path

    from fxrewrite.testing import repair

    tree = ast.parse(Path(repair.__file__).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert "equivalence" not in imported and "_search" not in imported, imported
