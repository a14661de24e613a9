"""fxrewrite.codegen: regenerated code, diffs, and rewritten modules written to a folder that
can be moved and imported from anywhere."""

from __future__ import annotations

import operator
import shutil
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch.fx as fx
from _helpers import assert_rewrite_sound, standard_rules
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fuzz_rewrite import random_graph  # tests/e2e is on sys.path (conftest)

from fxrewrite import Rule, TargetError, codegen, rewrite
from fxrewrite.codegen import annotated_code, code_diff, forward_code, pickled_submodules, write_module

NEG_NEG = Rule.from_functions(lambda x: torch.neg(torch.neg(x)), lambda x: x, name="neg_neg")


class Scale(torch.nn.Module):
    """Not a torch.nn class: to_folder pickles it whole."""

    def forward(self, x):
        return x * 3


class LeafTracer(fx.Tracer):
    """Keeps every submodule a call_module, as a user's own tracer may."""

    def is_leaf_module(self, m: torch.nn.Module, qualname: str) -> bool:
        return True


class Net(torch.nn.Module):
    def __init__(self, extra: bool = False):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("offset", torch.arange(4.0))
        self.extra = torch.nn.Sequential(torch.nn.ReLU()) if extra else None

    def forward(self, x):
        h = torch.neg(torch.neg(self.lin(x))) + self.offset
        return self.extra(h) if self.extra is not None else h


def rewritten(model: torch.nn.Module) -> fx.GraphModule:
    result = rewrite(fx.GraphModule(model, LeafTracer().trace(model)), NEG_NEG)
    result.module.graph.lint()
    x = torch.randn(2, 4)
    torch.testing.assert_close(result.module(x), model(x))
    return result.module


def import_and_run(parent, package: str, data) -> subprocess.CompletedProcess[str]:
    """Import ``package`` from ``parent`` in a fresh interpreter started elsewhere, run it on
    the saved input and compare with the saved output."""
    script = textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, sys.argv[1])
        from {package} import RewrittenModule
        data = torch.load(sys.argv[2])
        torch.testing.assert_close(RewrittenModule()(data["x"]), data["expected"])
        print("ok")
    """)
    return subprocess.run([sys.executable, "-c", script, str(parent), str(data)], cwd="/", capture_output=True,
                          text=True, timeout=300, check=False)


@pytest.mark.slow
def test_a_written_folder_can_be_moved_and_imported_from_its_new_place(tmp_path):
    model = Net(extra=True)
    folder = write_module(rewritten(model), tmp_path / "first" / "written")
    x = torch.randn(2, 4)
    torch.save({"x": x, "expected": model(x).detach()}, tmp_path / "io.pt")
    moved = tmp_path / "elsewhere" / "moved"
    moved.parent.mkdir()
    shutil.move(folder, moved)
    done = import_and_run(moved.parent, "moved", tmp_path / "io.pt")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
    assert str(folder) not in (moved / "module.py").read_text()


def test_pickled_submodules_load_relative_to_the_folder_too(tmp_path):
    model = Net()
    model.extra = Scale()
    gm = rewritten(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # to_folder's own warning about pickled modules is not shown
        folder = write_module(gm, tmp_path / "scaled")
    assert pickled_submodules(folder) == ["extra"]
    source = (folder / "module.py").read_text()
    assert "torch.load(_fxrewrite_folder / 'extra.pt'" in source and str(tmp_path) not in source
    sys.path.insert(0, str(tmp_path))
    try:
        shutil.move(folder, tmp_path / "scaled_moved")
        from scaled_moved import RewrittenModule
    finally:
        sys.path.remove(str(tmp_path))
    x = torch.randn(2, 4)
    torch.testing.assert_close(RewrittenModule()(x), model(x))


def test_nothing_is_pickled_when_every_submodule_is_a_torch_nn_class(tmp_path):
    folder = write_module(rewritten(Net()), tmp_path / "plain")
    assert pickled_submodules(folder) == []
    assert (folder / "state_dict.pt").is_file() and (folder / "__init__.py").is_file()


def test_the_folder_name_must_be_an_identifier_and_nothing_is_written(tmp_path):
    with pytest.raises(TargetError, match=r"its name must be an identifier; use e.g. 'my_model'"):
        write_module(rewritten(Net()), tmp_path / "new" / "my-model")
    assert not (tmp_path / "new").exists()


def test_a_failed_write_removes_the_folders_it_created(tmp_path):
    class Local(torch.nn.Module):  # defined in a function: cannot be pickled
        def forward(self, x):
            return x

    model = Net()
    model.extra = Local()
    with pytest.raises(TargetError, match="could not write the rewritten module") as info:
        write_module(rewritten(model), tmp_path / "deep" / "folder")
    assert "cannot be pickled" in str(info.value)
    assert not (tmp_path / "deep").exists()


def test_forward_code_and_the_diff():
    before = fx.symbolic_trace(lambda a: torch.neg(torch.neg(a)) * 2)
    after = rewritten_function(before)
    assert forward_code(after) == "def forward(self, a):\n    mul = a * 2;  a = None\n    return mul\n"
    diff = code_diff(before, after, fromfile="old", tofile="new")
    assert diff.splitlines()[:2] == ["--- old", "+++ new"]
    assert "-    neg = torch.neg(a);  a = None" in diff and "+    mul = a * 2;  a = None" in diff


def test_annotated_code_names_the_rule_above_the_lines_it_wrote():
    relu_relu = Rule.from_functions(lambda x: torch.relu(torch.relu(x)), lambda x: torch.relu(x), name="relu_relu")
    result = rewrite(lambda a: torch.relu(torch.relu(a)) + 1, relu_relu)
    assert_rewrite_sound(lambda a: torch.relu(torch.relu(a)) + 1, result, torch.randn(3))
    after = result.module
    code = annotated_code(after)
    lines = code.splitlines()
    rule_line = next(i for i, line in enumerate(lines) if "fxrewrite rule relu_relu" in line)
    assert "= torch.relu(a)" in lines[rule_line + 1]
    assert "No stacktrace found" not in code


def rewritten_function(gm: fx.GraphModule) -> fx.GraphModule:
    result = rewrite(gm, NEG_NEG)
    result.module.graph.lint()
    x = torch.randn(3)
    torch.testing.assert_close(result.module(x), gm(x))
    return result.module


# -- python_code: fx's code, generated cheaper (its slow twin is fx's Graph.python_code) ----------


def same_python_code(graph: fx.Graph) -> bool:
    """``codegen.python_code`` gives what fx's generator gives: source, globals, line map, prologue;
    True when it generated them itself (no fallback to fx's generator)."""
    expected = graph.python_code("self")
    calls = []
    original = codegen._Generator.python_code

    def counted(self):
        result = original(self)
        calls.append(1)
        return result

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(codegen._Generator, "python_code", counted)
        got = codegen.python_code(graph, "self")
    assert got.src == expected.src
    assert got.globals == expected.globals
    assert got._lineno_map == expected._lineno_map and got._prologue_start == expected._prologue_start
    return bool(calls)


@fx.wrap
def wrapped_helper(x, k):
    return x * k


class Odd(torch.nn.Module):
    """Arguments and targets of every kind fx prints: the generator re-spells or hands them to fx."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4)])
        self.register_buffer("scale", torch.ones(4))

    def forward(self, input: torch.Tensor, torch_: "int" = 3, *rest):  # noqa: UP037 - a string annotation
        x = self.layers[0](input) * self.scale
        y = torch.cat([x, x], dim=-1)[..., :4]
        z = torch.nn.functional.pad(x, (1, 1), mode="constant", value=float("inf"))
        x = x.to(dtype=torch.float64, device=torch.device("cpu")).float()
        x += torch_
        w = wrapped_helper(x, 2)
        return {"a": y, "b": (z, w.sum(dim=(0,), keepdim=True)), "shape": x.shape[0], "r": rest}


def test_python_code_is_fx_code_on_arguments_and_targets_of_every_kind():
    gm = fx.symbolic_trace(Odd())
    assert same_python_code(gm.graph)
    assert "wrapped_helper" in gm.code and "input_1 = input" in gm.code
    graph = fx.Graph()
    a = graph.placeholder("a", type_expr=torch.Tensor)
    b = graph.call_function(getattr, (a, "shape"))
    c = graph.call_function(getattr, (a, "not an identifier"))
    d = graph.call_function(torch.reshape, (a, torch.Size([2, 2])), {"extra": {"k": [b, (c,)], 1: None}})
    e = graph.call_function(operator.setitem, (d, slice(None, 1, None), 0.5))
    f = graph.call_method("add", (d, 1), {"alpha": 2})
    g = graph.call_function(torch.ops.aten.relu.default, (f,))
    getter = graph.get_attr("sub.weight")
    graph.output((e, g, getter))
    assert same_python_code(graph)


@pytest.mark.parametrize("annotated", ["generic", "empty", "body transformer"])
def test_python_code_hands_what_it_does_not_re_spell_to_fx(annotated):
    graph = fx.Graph()
    x = graph.placeholder("x", type_expr=list[int] if annotated == "generic" else None)
    graph.output(x)
    if annotated == "empty":
        graph = fx.Graph()
    if annotated == "body transformer":
        graph.on_generate_code(lambda _: lambda body: ["# hello\n", *body])
    assert not same_python_code(graph)


@pytest.mark.slow  # every shipped case, rewritten by the whole library: 7 s
def test_python_code_is_fx_code_on_every_shipped_case_before_and_after_the_library():
    from test_stdlib import CASES, LIBRARY  # tests/ is on sys.path, as for _helpers

    from fxrewrite.target import to_graph_module

    generated = 0
    for _, case in sorted(CASES.items()):
        gm = to_graph_module(case.model())
        generated += same_python_code(gm.graph)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = rewrite(gm, LIBRARY)
        generated += same_python_code(result.module.graph)
    patterns = sum(same_python_code(rule.compiled.graph) for rule in LIBRARY)
    assert generated == 2 * len(CASES) and patterns > len(LIBRARY) // 2  # it generated them itself


@settings(max_examples=6, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(st.data())
def test_python_code_is_fx_code_on_fuzzed_graphs_before_and_after_the_library(data):
    gm, _, _ = random_graph(data.draw)
    assert same_python_code(gm.graph)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = rewrite(gm, standard_rules())
    assert same_python_code(result.module.graph)


def test_recompile_and_its_slow_twin_give_the_same_module(monkeypatch):
    gm = fx.symbolic_trace(Odd())
    x = torch.randn(2, 4)
    codegen.recompile(gm)
    fast_code, fast_out = gm.code, gm(x)
    monkeypatch.setattr(codegen, "FAST_CODEGEN", False)
    codegen.recompile(gm)
    assert gm.code == fast_code
    torch.testing.assert_close(gm(x), fast_out)


@pytest.mark.parametrize("fast_names", [True, False])
def test_python_code_is_fx_code_when_node_names_clash_with_globals_and_suffixes(monkeypatch, fast_names):
    monkeypatch.setattr(codegen, "FAST_NAMES", fast_names)
    graph = fx.Graph()
    x = graph.placeholder("x")
    names = ["torch", "operator", "getattr", "add_1", "add", "add_01", "a__2", "_3", "Ω_2", "neg_1_", "neg"]
    value = x
    for name in names:
        value = graph.call_function(torch.neg, (value,))
        value._rename(name)
    value = graph.call_function(operator.add, (value, 1))
    graph.output(value)
    assert same_python_code(graph)
