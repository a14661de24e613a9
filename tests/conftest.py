"""Shared test configuration: Hypothesis profiles, and the one-second rule.

``ci`` (selected when CI=true, or with --hypothesis-profile=ci) is deterministic and bounded;
``dev`` is the everyday profile; ``slow`` searches long and is meant for ``-m slow`` runs.

The one-second rule (CONTRIBUTING.md): a test that is not marked ``@pytest.mark.slow`` fails when
its call takes :data:`SLOW_SECONDS` of CPU time or more. CPU time (this process's and that of the
child processes it waited for), not wall time, so a machine loaded by other work does not make the
check flaky; fixtures' set-up is not counted (a module-scoped fixture is shared by its tests).
A call that imported modules is not judged: it paid the process's one-time cost of importing
torch's parts (``torch.export``, Inductor), which falls on whichever test comes first in a file
run alone or in an xdist worker, and on no test of a full run's later files.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Generator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    deadline=None,
    max_examples=60,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", deadline=None, max_examples=100)
settings.register_profile("slow", deadline=None, max_examples=2000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

# The scenario suites' data is imported by name, as tests/_helpers is (pytest puts tests/ on
# sys.path for this conftest): test_match and test_replace run every shipped rule's case of
# e2e/test_stdlib.py, test_dispatch the random programs of e2e/test_fuzz_rewrite.py.
sys.path.insert(1, str(Path(__file__).resolve().parent / "e2e"))

#: CPU seconds from which a test's call must be marked ``slow``.
SLOW_SECONDS = 1.0

#: Tests that took a second or more of CPU when the rule came in, in files other people were
#: editing (and moving tests between) at the time, by function name: marked ``slow`` here, at
#: collection, until their owners move the marker onto the test (then delete the line). Do not
#: add to this list: mark the test itself.
MARKED_HERE = frozenset({
    "test_a_declared_domain_restricts_the_inputs",
    "test_a_declared_tolerance_makes_an_approximation_sound",
    "test_a_permutation_bug_shrinks_to_a_three_cycle_on_a_small_tensor",
    "test_a_rank_restriction_repairs_a_rule_that_needs_matrices",
    "test_a_replacement_that_raises_is_a_counterexample",
    "test_a_rule_file_that_does_not_load_is_a_collection_error",
    "test_a_rule_whose_pattern_never_runs_is_untestable",
    "test_a_terminal_gets_a_status_line_that_is_cleared_before_each_row",
    "test_an_unsound_rule_gets_a_counterexample_shrunk_to_one_element",
    "test_bf16_then_f16_is_unsound_bitwise_and_under_the_default_tolerance",
    "test_broadcasting_arguments_are_repaired_by_requiring_one_shape",
    "test_conv_bn_folding_that_drops_the_conv_bias_is_caught",
    "test_draws_where_the_pattern_raises_are_rejected",
    "test_each_strategies_module_imports_only_the_ones_before_it",
    "test_every_permutation_of_a_small_rank_is_drawn",
    "test_examples_and_seed_options_reach_the_search",
    "test_guards_on_shapes_are_respected",
    "test_hypothesis_is_imported_on_first_use_only",
    "test_k_selects_by_rule_and_file_name_like_pytest",
    "test_lint_of_the_shipped_library_exits_0",
    "test_mul_one_over_all_dtypes_is_repaired_by_a_dtype_guard",
    "test_one_counterexample_per_kind_of_difference",
    "test_relu_difference_over_all_dtypes_is_repaired_by_excluding_integers",
    "test_repair_can_be_turned_off",
    "test_report_shows_inputs_outputs_difference_and_where_the_rule_is",
    "test_report_shows_module_parameters",
    "test_report_shows_the_declared_tolerance_and_domain",
    "test_running_a_rule_and_building_modules_do_not_import_hypothesis",
    "test_several_dtypes_are_drawn_and_mixed",
    "test_several_paths_and_the_seed",
    "test_sound_rules_pass_and_an_unsound_rule_fails_with_its_counterexample",
    "test_special_values_are_found",
    "test_sqrt_of_a_square_on_float32_is_repaired_by_a_value_bound",
    "test_square_shapes_make_matmul_patterns_easy_to_feed",
    "test_string_captures_keep_the_values_the_pattern_accepts",
    "test_the_checker_draws_none_for_an_optional_capture",
    "test_the_repair_guard_is_enforced_at_rewrite_time",
    "test_the_shipped_library_has_no_loops",
    "test_verify_imports_neither_hypothesis_nor_pytest",
    "test_when_nothing_helps_repair_is_none_and_the_report_says_so",
    "test_without_paths_the_shipped_library_is_checked",
})

#: Tests of the same files that build a rule ignoring a tensor its pattern binds, on purpose
#: (fxrewrite's RuleWarning, an error otherwise): allowed to warn here until their owners say so at
#: the test (then delete the line).
WARNS_HERE = frozenset({
    "test_a_template_recorded_where_two_variables_bound_one_value_is_not_replayed_where_they_differ",
    "test_guards_on_shapes_are_respected",
})


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks the tests of :data:`MARKED_HERE` ``slow`` before ``-m`` selects, and lets the tests
    of :data:`WARNS_HERE` warn."""
    for item in items:
        name = getattr(item, "originalname", item.name)
        if name in MARKED_HERE:
            item.add_marker(pytest.mark.slow)
        if name in WARNS_HERE:
            item.add_marker(pytest.mark.filterwarnings("ignore::fxrewrite.RuleWarning"))


def cpu_seconds() -> float:
    """CPU time of this process and of the child processes it has waited for (subprocess tests)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """Fails a test that is not marked ``slow`` and whose call took :data:`SLOW_SECONDS` of CPU
    time or more (a test that failed on its own keeps its own failure)."""
    start, modules = cpu_seconds(), len(sys.modules)
    result = yield
    spent = cpu_seconds() - start
    first_use = len(sys.modules) > modules  # it imported what the process had not needed yet
    if spent >= SLOW_SECONDS and item.get_closest_marker("slow") is None and not first_use:
        pytest.fail(f"{item.nodeid} took {spent:.2f} s of CPU time (the limit for an unmarked test is "
                    f"{SLOW_SECONDS:g} s): mark it @pytest.mark.slow or make it faster", pytrace=False)
    return result
