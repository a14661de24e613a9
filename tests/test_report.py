"""fxrewrite.report: the report of a rewrite and its one table (API, CLI and docs)."""

from __future__ import annotations

import torch

import fxrewrite
from fxrewrite import Rule, RuleSet, rewrite
from fxrewrite.report import COLUMNS, NO_METADATA, Report, RuleStats, format_table

NEG_NEG = Rule.from_functions(lambda x: torch.neg(torch.neg(x)), lambda x: x, name="neg_neg")
RELU_RELU = Rule.from_functions(lambda x: torch.relu(torch.relu(x)), lambda x: torch.relu(x), name="relu_relu")
EXP_LOG = Rule.from_functions(lambda x: torch.exp(torch.log(x)), lambda x: x, name="exp_log")
WIDE = Rule.from_functions(lambda x: torch.abs(torch.abs(x)), lambda x: torch.abs(x), name="wide",
                           where=lambda m: m["x"].shape[-1] >= 8)


def model(a):
    return torch.neg(torch.neg(a)) + torch.relu(a) + torch.abs(torch.abs(a))


def rewritten(rules, **kw):
    result = rewrite(model, RuleSet(rules), **kw)
    result.module.graph.lint()
    x = torch.randn(2, 8)
    torch.testing.assert_close(result.module(x), model(x))
    return result


def table_rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines()]


def test_the_table_shows_rules_that_fired_or_were_refused_and_one_line_for_the_rest():
    report = rewritten([NEG_NEG, RELU_RELU, EXP_LOG, WIDE]).report
    rows = table_rows(str(report))
    assert rows[0] == list(COLUMNS)
    assert [r[0] for r in rows[1:3]] == ["neg_neg", "wide"]
    assert rows[1][1:4] == ["1", "0", "2"]   # fired, guarded, tried (at both negs)
    assert rows[2][1:3] == ["0", "1"]        # wide: refused, the graph has no shapes
    summary = str(report).splitlines()[3]
    assert summary.startswith("1 rewrite(s) in ") and summary.endswith(
        "; 2 other rule(s) did not match (1 of them was tried)")


def test_all_rows_shows_every_rule_in_rule_order():
    report = rewritten([NEG_NEG, RELU_RELU, EXP_LOG]).report
    rows = table_rows(format_table(report, all_rows=True))
    assert [r[0] for r in rows[1:4]] == ["neg_neg", "relu_relu", "exp_log"]
    assert rows[2][1:4] == ["0", "0", "1"] and rows[3][1:4] == ["0", "0", "0"]
    assert "did not match" not in rows[4]


def test_columns_are_aligned_under_their_headers():
    report = rewritten([NEG_NEG, RELU_RELU]).report
    header, first = format_table(report, all_rows=True).splitlines()[:2]
    for column in COLUMNS[1:]:
        end = header.index(column) + len(column)
        assert first[end - 1] != " " and (end == len(first) or first[end] == " ")


def test_a_report_where_nothing_matched_is_one_line():
    report = rewritten([EXP_LOG]).report
    assert str(report).splitlines()[0].startswith("0 rewrite(s) in ")
    assert str(report).endswith("1 rule(s) did not match (0 of them were tried)")


def test_guards_refusing_for_lack_of_shapes_get_a_hint_line():
    report = rewritten([WIDE]).report
    assert report.without_metadata == ("wide",)
    assert NO_METADATA in report.reasons["wide"][0]
    assert str(report).splitlines()[-1] == (
        f"guards of wide refused matches and {NO_METADATA}: if they need them, pass example_inputs= "
        f"(or rewrite a torch.export graph)")
    assert format_table(report, metadata_hint="add --shapes").endswith("if they need them, add --shapes")


def test_with_shapes_the_guard_decides_and_there_is_no_hint():
    report = rewritten([WIDE], example_inputs=(torch.randn(2, 8),)).report
    assert report.applied["wide"] == 1 and report.without_metadata == ()
    assert NO_METADATA not in str(report)


def test_more_says_how_to_see_the_hidden_rows():
    report = rewritten([NEG_NEG, EXP_LOG]).report
    assert format_table(report, more="--all lists them").endswith("(0 of them were tried; --all lists them)")


def test_format_table_reads_only_the_counts():
    stats = {"a_long_rule_name": RuleStats(attempts=12, applied=3, rejected=1, seconds=0.25)}
    text = format_table(Report(stats, rewrites=3, seconds=0.5))
    assert text.splitlines() == [
        "rule              fired  guarded  tried      ms",
        "a_long_rule_name      3        1     12  250.00",
        "3 rewrite(s) in 500.0 ms",
    ]


def test_report_names_are_exported():
    assert fxrewrite.Report is Report and fxrewrite.RuleStats is RuleStats


def test_two_reports_add_up_rule_by_rule_keeping_a_few_reasons_and_the_last_rewrite():
    one = Report({"neg_neg": RuleStats(2, 1, 1, 0.5, ("a", "b"))}, 1, 0.5, "neg_neg at 'neg_1'")
    two = Report({"neg_neg": RuleStats(1, 0, 2, 0.25, ("c", "d")), "wide": RuleStats(3)}, 0, 0.25, None)
    total = one + two
    assert total.stats["neg_neg"] == RuleStats(3, 1, 3, 0.75, ("a", "b", "c"))
    assert total.stats["wide"] == RuleStats(3)
    assert (total.rewrites, total.seconds, total.last_rewrite) == (1, 0.75, "neg_neg at 'neg_1'")
    assert list(total.stats) == ["neg_neg", "wide"]


def test_the_reports_of_two_rewrites_sum_to_what_one_rewrite_of_both_reports():
    ruleset = RuleSet([NEG_NEG, RELU_RELU])
    first = rewrite(lambda a: torch.neg(torch.neg(a)), ruleset).report
    second = rewrite(lambda a: torch.relu(torch.relu(torch.neg(torch.neg(a)))), ruleset).report
    assert (first + second).applied == {"neg_neg": 2, "relu_relu": 1}
    assert (first + second).rewrites == 3
