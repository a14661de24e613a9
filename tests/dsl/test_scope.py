"""fxrewrite.dsl.scope, the DSL's security boundary, asked directly: what a path from a rule file
reaches, what it is refused and why, and the names a file may define.

``test_dsl_trust.py`` checks the same boundary end to end, through whole rule files."""

from __future__ import annotations

import math
import operator

import pytest
import torch

from fxrewrite import RuleDefinitionError
from fxrewrite.dsl import ast, parse
from fxrewrite.dsl import scope as dsl_scope
from fxrewrite.dsl.scope import (
    DEFAULT_NAMES,
    DEFERRED,
    RESERVED_WORDS,
    PathError,
    Scope,
    check_attribute_name,
    check_new_name,
    located_error,
    reachable,
    state_change,
)

SRC = ast.SourceText("rules.fxr", "rule a:\n    torch.neg(x) => x\n")
SPAN = ast.Span(2, 5, 2, 14)


def refused(scope: Scope, path: tuple[str, ...]) -> PathError:
    with pytest.raises(PathError) as info:
        scope.lookup(path)
    return info.value


# ---- lookup: what a path reaches -------------------------------------------------------------------


def test_the_default_names_are_in_every_scope():
    scope = Scope.build(None, None)
    for name, value in DEFAULT_NAMES.items():
        assert name in scope and scope.lookup((name,)) is value
    assert scope.lookup(("F", "relu")) is torch.nn.functional.relu
    assert scope.lookup(("operator", "add")) is operator.add and scope.lookup(("math", "pi")) == math.pi


def test_the_default_names_cannot_be_changed_in_place():
    with pytest.raises(TypeError):
        DEFAULT_NAMES["os"] = object()  # type: ignore[index]


@pytest.mark.parametrize("path, step", [
    (("torch", "load"), 1),  # loads files (pickle)
    (("torch", "os"), 1),  # a module that is not torch's own
    (("torch", "jit", "script"), 1),  # compiles code
    (("torch", "nn", "utils"), 2),
    (("torch", "hub"), 1),
])
def test_a_path_to_what_loads_imports_or_runs_code_is_refused_at_its_step(path, step):
    error = refused(Scope.build(None, None), path)
    assert error.index == step and not error.missing
    assert f"'{'.'.join(path[:step + 1])}' is out of bounds for rule files" in str(error)
    assert "names=" in str(error)  # what to do


@pytest.mark.parametrize("path, why", [
    (("torch", "manual_seed"), "reseeds the random number generator"),
    (("torch", "set_default_dtype"), "set_* functions set process-wide state"),
    (("torch", "cuda"), "manages CUDA devices"),
    (("torch", "nn", "modules", "module", "register_module_forward_hook"), "install hooks"),
])
def test_a_path_to_what_changes_global_state_is_refused_with_the_reason(path, why):
    message = str(refused(Scope.build(None, None), path))
    assert "changes torch's global state" in message and why in message


def test_a_refused_function_is_refused_under_any_name_it_is_reached_by():
    # torch.random.manual_seed re-exported under an innocent attribute name of a module
    alias = "innocent"
    module = type(torch)("torch.fake_alias_module")
    setattr(module, alias, torch.manual_seed)
    with pytest.raises(PathError) as info:
        dsl_scope.step(module, alias, ("m",), False, 1)
    assert "(that is 'manual_seed')" in str(info.value)


def test_a_missing_attribute_is_missing_and_spelled_out_with_close_names():
    error = refused(Scope.build(None, None), ("torch", "relux"))
    assert error.missing and error.index == 1
    assert "'torch.relux' does not exist" in str(error) and "'relu'" in str(error)


def test_names_the_caller_passes_are_trusted_and_reach_what_files_cannot():
    def fold(x):
        return x

    scope = Scope.build(None, {"fold": fold, "t": torch})
    assert scope.lookup(("fold",)) is fold and scope.spelled("fold") == "names['fold']"
    assert scope.lookup(("t", "load")) is torch.load  # trusted: the caller chose to pass torch
    assert refused(scope, ("torch", "load"))  # the default name is still untrusted


@pytest.mark.parametrize("names, fragment", [
    ([("fold", print)], "names= must be a mapping"),
    ({"_private": print}, "keys must be identifiers that do not start with '_'"),
    ({"rule": print}, "are not words of the language"),
    ({"not an identifier": print}, "rename the key"),
    ({3: print}, "rename the key"),
])
def test_bad_names_are_refused_with_what_to_do(names, fragment):
    with pytest.raises(RuleDefinitionError, match=fragment):
        Scope.build(None, names)


# ---- check: load-time lookups, custom op namespaces ---------------------------------------------------


def test_a_missing_op_of_a_custom_namespace_is_deferred_at_load_time_but_not_at_apply_time():
    scope = Scope.build(None, None)
    path = ("torch", "ops", "fxrewrite_test_scope_ns", "defined_later")
    assert scope.check(path) is DEFERRED
    with pytest.raises(PathError) as info:
        scope.check(path, defer_ops=False)
    assert info.value.missing


def test_a_missing_aten_op_is_never_deferred():
    with pytest.raises(PathError) as info:
        Scope.build(None, None).check(("torch", "ops", "aten", "no_such_op_anywhere"))
    assert info.value.missing


# ---- use lines --------------------------------------------------------------------------------------


def test_a_use_alias_is_checked_like_any_path_and_keeps_its_root_untrusted():
    scope = Scope.build(parse("use torch.nn.functional as G\nrule a:\n    G.relu(x) => x\n"), None)
    assert scope.lookup(("G", "relu")) is torch.nn.functional.relu
    assert scope.spelled("G") == "torch.nn.functional"
    assert refused(scope, ("G", "torch", "load")).index == 2  # the alias does not make what follows trusted


@pytest.mark.parametrize("text, fragments", [
    ("use torch.load as L\n", ["1:5", "'torch.load' is out of bounds"]),
    ("use numpy.linalg as la\n", ["1:5", "'numpy' is not a name in scope", "one of F, bool"]),
    ("use torch.relux as r\n", ["'torch.relux' does not exist", "'relu'"]),
    ("use torch._C as C\n", ["the attribute '_C' starts with '_'"]),
    ("use torch.ops.fxrewrite_test_scope_ns.later as op\n", ["register the op before loading the file"]),
    ("use torch.relu as torch\n", ["'torch' is already a name in scope"]),
])
def test_a_bad_use_line_is_refused_where_it_is_written(text, fragments):
    with pytest.raises(RuleDefinitionError) as info:
        Scope.build(parse(text, source="uses.fxr"), None)
    message = str(info.value)
    assert message.startswith("uses.fxr:1:")
    for fragment in fragments:
        assert fragment in message


# ---- the predicates -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name, changes", [
    ("set_grad_enabled", True), ("manual_seed", True), ("seed", True), ("get_rng_state", False),
    ("set_rng_state", True), ("initial_seed", False), ("register_forward_hook", True),
    ("enable_grad", True), ("no_grad", False), ("neg", False), ("is_grad_enabled", False),
    ("SomeGuard", True), ("cuda", True),
])
def test_state_change_names_what_changes_process_state(name, changes):
    assert (state_change(name) is not None) is changes


@pytest.mark.parametrize("name", [
    "register_buffer", "register_forward_hook", "register_module", "register_hook", "_register_pytree_node",
    "register", "registerOp", "_RegisterFn", "REGISTER_HOOK", "register2_hook", "registered_hop_fake_fns",
    "is_registered", "unregister_callback", "deregister_fake_class", "_cleanup_and_reregister_graph",
    "gds_register_buffer", "pytree_register_structseq", "torch.nn.Module.register_buffer", "preregister_op",
])
def test_every_form_of_register_in_a_name_part_is_a_state_change(name):
    assert state_change(name) is not None


@pytest.mark.parametrize("name", ["preregistered_gemm", "mylib.preregistered_gemm", "registry_lookup"])
def test_a_name_that_only_contains_register_inside_a_word_is_no_state_change(name):
    assert state_change(name) is None


def test_every_name_holding_register_in_torchs_main_modules_is_still_refused():
    # the rule by name parts refuses all that the old substring rule did, in the modules rule files reach
    objects = (torch, torch.nn, torch.nn.Module, torch.nn.modules.module, torch.Tensor, torch.autograd,
               torch.autograd.graph, torch.optim.Optimizer, torch.library, torch.fx.Graph, torch.utils.hooks)
    names = {name for obj in objects for name in dir(obj) if "register" in name}
    assert len(names) > 20 and "register_forward_hook" in names
    assert sorted(name for name in names if state_change(name) is None) == []


def test_a_custom_op_named_preregistered_is_reached_from_a_rule_file():
    scope = Scope.build(None, None)
    assert scope.check(("torch", "ops", "fxrewrite_test_scope_ns", "preregistered_gemm")) is DEFERRED
    library = torch.library.Library("fxrewrite_test_scope_reg", "DEF")
    library.define("preregistered_gemm(Tensor a, Tensor b) -> Tensor")
    library.define("register_gemm(Tensor a, Tensor b) -> Tensor")
    assert str(scope.lookup(("torch", "ops", "fxrewrite_test_scope_reg", "preregistered_gemm"))) == \
        "fxrewrite_test_scope_reg.preregistered_gemm"
    error = refused(scope, ("torch", "ops", "fxrewrite_test_scope_reg", "register_gemm"))
    assert "changes torch's global state" in str(error)


def test_reachable_allows_torch_math_and_operator_and_plain_data_only():
    assert all(reachable(v) for v in (torch.relu, torch.nn.Linear, math.sqrt, operator.add, 3, "s", None, torch))
    assert not any(reachable(v) for v in (torch.load, torch.jit, torch.cuda, print, pytest, torch.utils))


# ---- names a file defines -----------------------------------------------------------------------------


@pytest.mark.parametrize("name, fragment", [
    ("where", "is a word of the language"),
    ("_x", "starts with '_'"),
    ("lambda", "is a Python keyword"),
    ("torch", "is already a name in scope (torch)"),
])
def test_a_new_name_that_cannot_be_defined_is_refused_where_it_is_written(name, fragment):
    with pytest.raises(RuleDefinitionError) as info:
        check_new_name(SRC, SPAN, name, what="a variable", scope=Scope.build(None, None), context="rule 'a'")
    message = str(info.value)
    assert message.startswith("rules.fxr:2:5: rule 'a': ") and fragment in message
    assert message.endswith("    torch.neg(x) => x\n    ^")


def test_every_reserved_word_is_refused_and_a_plain_name_is_accepted():
    for word in RESERVED_WORDS:
        with pytest.raises(RuleDefinitionError):
            check_new_name(SRC, SPAN, word, what="a variable", scope=None, context="rule 'a'")
    check_new_name(SRC, SPAN, "x", what="a variable", scope=Scope.build(None, None), context="rule 'a'")


def test_private_attributes_are_refused_by_name():
    with pytest.raises(RuleDefinitionError, match="the attribute '__class__' starts with '_'"):
        check_attribute_name(SRC, SPAN, "__class__", "rule 'a'")
    check_attribute_name(SRC, SPAN, "relu", "rule 'a'")


def test_located_error_points_at_the_column():
    error = located_error(SRC, ast.Span(2, 15, 2, 16), "here")
    assert str(error) == "rules.fxr:2:15: here\n    torch.neg(x) => x\n              ^"
