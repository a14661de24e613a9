"""fxrewrite.codegen: regenerated code, diffs, and rewritten modules written to a folder that
can be moved and imported from anywhere."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch.fx as fx
from _helpers import assert_rewrite_sound

from fxrewrite import Rule, TargetError, rewrite
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
