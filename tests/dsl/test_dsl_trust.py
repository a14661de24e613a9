"""The trust model: loading a .fxr file runs no code from it. Names resolve only through the
allow-list; private attributes, unknown callees and the parts of torch that load files, import
or run code are refused at load time, before anything is evaluated."""

from __future__ import annotations

import math
import operator
import types

import pytest
import torch
import torch.nn.functional as F
from _helpers import assert_rewrite_sound

from fxrewrite import RuleDefinitionError, rewrite
from fxrewrite.dsl import compile as dsl_compile
from fxrewrite.dsl import parse_rules
from fxrewrite.dsl import scope as dsl_scope


def refused(text: str, **kwargs) -> str:
    with pytest.raises(RuleDefinitionError) as info:
        parse_rules(text, source="evil.fxr", **kwargs)
    return str(info.value)


def in_every_position(expr: str) -> list[str]:
    """``expr`` in a pattern, a replacement and a where condition of otherwise valid rules."""
    return [
        f"rule r:\n    torch.neg({expr}(x)) => x\n",
        f"rule r:\n    torch.neg(x) => {expr}(x)\n",
        f"rule r:\n    torch.neg(x) => x\n    where {expr}(x.dim())\n",
    ]


@pytest.mark.parametrize("text", [
    *in_every_position("x.__class__"),
    *in_every_position("torch.__dict__.get"),
    *in_every_position("F.__builtins__.get"),
    *in_every_position("torch._C._nn.relu"),
    "rule r:\n    torch.neg(x) => x\n    where x.shape.__class__ == x\n",
    "use torch.__loader__ as loader\n",
    "rule r:\n    conv(x) => x\n    where conv: nn.__class__\n",
])
def test_private_and_special_attributes_are_refused(text):
    assert "starts with '_'" in refused(text)


@pytest.mark.parametrize("callee", ["eval", "exec", "open", "compile", "getattr", "globals", "breakpoint", "input",
                                    "print", "exit", "help"])
def test_builtins_are_not_in_scope(callee):
    for text in in_every_position(callee):
        assert f"unknown function '{callee}'" in refused(text)


@pytest.mark.parametrize("callee", ["__import__", "__builtins__"])
def test_dunder_names_are_reserved(callee):
    for text in in_every_position(callee):
        assert f"'{callee}' starts with '_'" in refused(text)


@pytest.mark.parametrize("path", ["os.system", "subprocess.run", "sys.exit", "shutil.rmtree", "pickle.loads"])
def test_modules_outside_the_allow_list_are_unknown(path):
    message = refused(f"rule r:\n    torch.neg(x) => {path}(x)\n")
    root, attr = path.split(".")
    assert f"'{root}' is a tensor variable and torch.Tensor has no attribute '{attr}'" in message
    assert "not in scope" in message


@pytest.mark.parametrize("path", [
    "torch.os.system", "torch.sys.exit", "torch.builtins.eval", "torch.importlib.import_module",
    "torch.ctypes.CDLL", "torch.inspect.getsource", "torch.load", "torch.save", "torch.hub.load",
    "torch.jit.load", "torch.ops.load_library", "torch.ops.import_module", "torch.classes.load_library",
    "torch.utils.cpp_extension.load", "torch.serialization.load", "torch.package.PackageImporter",
    "torch.fx.symbolic_trace", "torch.from_file", "torch.manual_seed", "torch.compile",
    "torch.storage.UntypedStorage.from_file", "torch.multiprocessing.spawn", "torch.distributed.launch",
    "F.importlib.import_module", "F.warnings.warn", "F.np", "operator.attrgetter", "operator.methodcaller",
    "torch.math.os", "nn.modules.module.torch.os",
])
def test_parts_of_torch_that_load_import_or_run_code_are_out_of_bounds(path):
    for text in in_every_position(path):
        assert "is out of bounds for rule files" in refused(text), text


def test_use_lines_cannot_escape_the_allow_list():
    assert "is out of bounds" in refused("use torch.os as o\n")
    assert "is out of bounds" in refused("use torch as t\n\nrule r:\n    torch.neg(x) => t.os.system(x)\n")
    assert "'os' is not a name in scope" in refused("use os.path as p\n")


def test_values_whose_origin_is_outside_torch_are_refused_even_under_an_innocent_name():
    assert "'F.Callable' is out of bounds" in refused("rule r:\n    torch.neg(x) => F.Callable(x)\n")
    reachable = dsl_scope.reachable
    assert not reachable(torch.load) and not reachable(torch.os) and not reachable(F.Callable)
    assert all(reachable(v) for v in (torch.relu, F, F.scaled_dot_product_attention, math.sqrt, operator.add,
                                      torch.float32, torch.nn.Conv2d, torch.ops.aten.add, math.pi, torch.linalg))


def test_a_refused_call_is_not_executed(tmp_path):
    target = tmp_path / "written.pt"
    refused(f"rule r:\n    torch.neg(x) => x\n    where torch.save(x, '{target}')\n")
    refused(f"rule r:\n    torch.save(x, '{target}') => x\n")
    assert not target.exists()


def test_loading_evaluates_neither_replacements_nor_conditions():
    calls = []

    def spy(*args):
        calls.append(args)
        return True

    (rule,) = parse_rules("rule r:\n    torch.neg(torch.neg(x)) => spy(x)\n    where spy(x.dim())\n",
                          names={"spy": spy})
    assert calls == []
    assert rule.name == "r"


def test_a_pattern_cannot_call_anything_on_constants_alone():
    assert "this call uses none" in refused("rule r:\n    x * math.factorial(99999) => x\n")
    assert "this call uses none" in refused("rule r:\n    x + torch.ones(99999, 99999) => x\n")


@pytest.mark.parametrize("expr", ["9 ** 9 ** 9", "2 ** 100000", "'a' * 10 ** 9", "(1,) * 10 ** 9",
                                  "(10 ** 9000) * (10 ** 9000) * (10 ** 9000)", "'%999999999s' % 1"])
def test_constant_arithmetic_that_would_not_finish_is_refused(expr):
    message = refused(f"rule r:\n    x * ({expr}) => x\n")
    assert message.startswith("evil.fxr:2:") and "rule 'r' (evil.fxr:1): evil.fxr" not in message


def test_huge_constants_in_guards_fail_the_rewrite_instead_of_hanging():
    from fxrewrite import RewriteError

    (rule,) = parse_rules("rule r:\n    torch.neg(torch.neg(x)) => x\n    where x.dim() ** 999999 > 1\n")
    with pytest.raises(RewriteError, match="at most 65536 are allowed"):
        rewrite(lambda a: torch.neg(torch.neg(a)), rule, example_inputs=(torch.ones(2, 2),))


def test_names_given_by_the_caller_are_trusted_except_for_private_attributes():
    lib = types.SimpleNamespace(load=lambda t: t * 1.0, _hidden=None)
    (rule,) = parse_rules("rule r:\n    torch.neg(torch.neg(x)) => lib.load(x)\n", names={"lib": lib})
    result = rewrite(lambda a: torch.neg(torch.neg(a)), rule)
    assert result.report.applied["r"] == 1
    assert_rewrite_sound(lambda a: torch.neg(torch.neg(a)), result, torch.randn(3))
    assert "starts with '_'" in refused("rule r:\n    torch.neg(x) => lib._hidden(x)\n", names={"lib": lib})


@pytest.mark.parametrize("params", [["x); import os; (y"], ["lambda"], ["_evaluate"], ["x y"], [""]])
def test_generated_functions_take_only_plain_identifiers(params):
    with pytest.raises(RuleDefinitionError, match="cannot be a parameter name"):
        dsl_compile._function("f", params, lambda frame: None, {}, "evil.fxr:1")
