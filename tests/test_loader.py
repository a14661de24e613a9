"""fxrewrite.loader: rule files and directories of them, in a deterministic order, with origins
and clear errors."""

from __future__ import annotations

import contextlib
import io
import os
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from _helpers import assert_consistent, assert_rewrite_sound, traced_net, write_source

import fxrewrite
from fxrewrite import RuleDefinitionError, RuleLoadError, RuleSet, RuleSyntaxError, loader, rewrite
from fxrewrite.loader import load_rules, parse_rules

DATA = Path(__file__).parent / "dsl" / "data"

NEG = "rule {name}:\n    torch.neg(torch.neg(x)) => x\n"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


# ---- files and directories -----------------------------------------------------------------------


def test_a_fxr_file_gives_its_rules_in_source_order_with_origins():
    rules = load_rules(DATA / "algebra.fxr")
    assert isinstance(rules, RuleSet)
    assert rules.names == ("double_neg", "mul_one", "relu_relu")
    assert [r.origin for r in rules] == [f"{DATA / 'algebra.fxr'}:{line}" for line in (3, 6, 9)]
    assert rules["relu_relu"].priority == 1


def test_a_str_path_works_too():
    assert load_rules(str(DATA / "algebra.fxr")).names == ("double_neg", "mul_one", "relu_relu")


def test_a_directory_is_loaded_recursively_in_sorted_order():
    rules = load_rules(DATA)
    assert rules.names == ("double_neg", "mul_one", "relu_relu",      # algebra.fxr
                           "softmax_attention",                        # nested/attention.fxr
                           "sub_self", "exp_log", "silu")              # nested/py_rules.py
    assert rules["softmax_attention"].origin == f"{DATA / 'nested' / 'attention.fxr'}:3"


def test_directory_order_is_by_relative_path_not_by_walk_order(tmp_path):
    for relative in ["z.fxr", "b/c.fxr", "a.fxr", "b/a/d.fxr", "b.fxr"]:
        write(tmp_path / relative, NEG.format(name=Path(relative).stem + "_" + str(len(relative))))
    rules = load_rules(tmp_path)
    assert [Path(r.origin.rsplit(":", 1)[0]).relative_to(tmp_path).as_posix() for r in rules] == [
        "a.fxr", "b/a/d.fxr", "b/c.fxr", "b.fxr", "z.fxr"]


def test_private_hidden_init_conftest_and_other_files_are_skipped(tmp_path):
    write(tmp_path / "keep.fxr", NEG.format(name="keep"))
    write(tmp_path / "_private.fxr", NEG.format(name="private"))
    write(tmp_path / ".hidden" / "h.fxr", NEG.format(name="hidden"))
    write(tmp_path / "_helpers" / "h.fxr", NEG.format(name="helpers"))
    write(tmp_path / "__init__.py", "raise RuntimeError('not a rule file')\n")
    write(tmp_path / "conftest.py", "raise RuntimeError('not a rule file')\n")
    write(tmp_path / "notes.txt", "rule nope:\n")
    write(tmp_path / "__pycache__" / "x.py", "raise RuntimeError\n")
    assert load_rules(tmp_path).names == ("keep",)


def test_names_are_handed_to_every_fxr_file(tmp_path):
    write(tmp_path / "a.fxr", "rule a:\n    torch.neg(torch.neg(x)) => ident(x)\n")
    write(tmp_path / "sub" / "b.fxr", "rule b:\n    torch.relu(torch.relu(x)) => ident(torch.relu(x))\n")
    rules = load_rules(tmp_path, names={"ident": lambda t: t})
    result = rewrite(lambda a: torch.relu(torch.relu(torch.neg(torch.neg(a)))), rules)
    assert result.report.applied == {"a": 1, "b": 1}
    assert_rewrite_sound(lambda a: torch.relu(torch.relu(torch.neg(torch.neg(a)))), result, torch.randn(3))


def test_load_rules_without_a_path_loads_the_standard_library(monkeypatch):
    monkeypatch.setattr(loader, "standard_rules_dir", lambda: DATA / "nested")
    assert load_rules().names == ("softmax_attention", "sub_self", "exp_log", "silu")


def test_standard_library_is_found_in_the_package_then_in_the_checkout(tmp_path):
    package = tmp_path / "site" / "fxrewrite"
    (package / "_rules").mkdir(parents=True)
    assert loader.standard_rules_dir(package) == package / "_rules"
    checkout = tmp_path / "repo"
    (checkout / "fxrewrite").mkdir(parents=True)
    (checkout / "rules").mkdir()
    (checkout / "pyproject.toml").write_text("")
    assert loader.standard_rules_dir(checkout / "fxrewrite") == checkout / "rules"
    (tmp_path / "site" / "rules").mkdir()  # a stray rules/ next to an installed package is not ours
    with pytest.raises(RuleLoadError, match="the standard rule library is missing"):
        loader.standard_rules_dir(tmp_path / "site" / "other")


def test_parse_rules_is_reexported_from_the_loader():
    assert parse_rules(NEG.format(name="r")).names == ("r",)


# ---- Python rule files ---------------------------------------------------------------------------


def test_python_file_gives_rules_rule_sets_and_function_pairs_in_definition_order():
    rules = load_rules(DATA / "nested" / "py_rules.py")
    assert rules.names == ("sub_self", "exp_log", "silu")
    origin_file, line = rules["exp_log"].origin.rsplit(":", 1)
    source = (DATA / "nested" / "py_rules.py").read_text().splitlines()
    assert Path(origin_file) == DATA / "nested" / "py_rules.py"
    assert source[int(line) - 1] == "def exp_log_pattern(x):"
    x = torch.rand(3) + 0.5
    result = rewrite(lambda a: torch.exp(torch.log(a)) - torch.sigmoid(a) * a, rules)
    assert result.report.applied["exp_log"] == 1 and result.report.applied["silu"] == 1
    torch.testing.assert_close(result.module(x), x - torch.sigmoid(x) * x)
    result.module.graph.lint()


def test_python_file_only_contributes_functions_it_defines(tmp_path):
    write(tmp_path / "helpers.py", """
        import torch
        def imported_pattern(x):
            return torch.neg(torch.neg(x))
        def imported_replacement(x):
            return x
    """)
    write(tmp_path / "rules.py", """
        import torch
        from helpers import imported_pattern, imported_replacement   # a sibling module
        def lonely_pattern(x):                                        # no replacement: skipped
            return torch.relu(torch.relu(x))
        def own_pattern(x):
            return torch.relu(torch.relu(x))
        def own_replacement(x):
            return torch.relu(x)
    """)
    path_before = list(sys.path)
    rules = load_rules(tmp_path / "rules.py")
    assert rules.names == ("own",)
    assert sys.path == path_before


def test_python_files_load_under_unique_module_names(tmp_path):
    write(tmp_path / "a" / "rules.py", "import fxrewrite, torch\nr = fxrewrite.Rule.from_functions("
                                       "lambda x: torch.neg(torch.neg(x)), lambda x: x, name='a')\n")
    write(tmp_path / "b" / "rules.py", "import fxrewrite, torch\nr = fxrewrite.Rule.from_functions("
                                       "lambda x: torch.relu(torch.relu(x)), lambda x: torch.relu(x), name='b')\n")
    assert load_rules(tmp_path).names == ("a", "b")
    assert "rules" not in sys.modules or not hasattr(sys.modules["rules"], "r")


def test_a_rule_shared_by_two_files_is_loaded_once(tmp_path):
    write(tmp_path / "a.py", "from b import shared\n")
    write(tmp_path / "b.py", "import fxrewrite, torch\nshared = fxrewrite.Rule.from_functions("
                             "lambda x: torch.neg(torch.neg(x)), lambda x: x, name='shared')\n")
    assert load_rules(tmp_path).names == ("shared",)


def test_python_file_that_fails_to_import_is_a_load_error_with_the_cause(tmp_path):
    bad = write(tmp_path / "bad.py", "import torch\nraise ValueError('boom')\n")
    with pytest.raises(RuleLoadError) as info:
        load_rules(bad)
    assert "bad.py" in str(info.value) and "ValueError: boom" in str(info.value)
    assert isinstance(info.value.__cause__, ValueError)
    write(tmp_path / "syntax.py", "def broken(:\n")
    with pytest.raises(RuleLoadError, match="SyntaxError"):
        load_rules(tmp_path / "syntax.py")


def test_pattern_awaiting_its_replacement_is_reported(tmp_path):
    write(tmp_path / "half.py", """
        import torch, fxrewrite
        @fxrewrite.rule
        def half(x):
            return torch.neg(torch.neg(x))
    """)
    with pytest.raises(RuleDefinitionError, match="'half' is a pattern awaiting its replacement"):
        load_rules(tmp_path / "half.py")


# ---- errors --------------------------------------------------------------------------------------


def test_missing_path(tmp_path):
    with pytest.raises(RuleLoadError, match="no such rule file or directory"):
        load_rules(tmp_path / "nope.fxr")


def test_directory_without_rule_files(tmp_path):
    with pytest.raises(RuleLoadError, match="no rule files"):
        load_rules(tmp_path)
    write(tmp_path / "readme.md", "# not rules\n")
    with pytest.raises(RuleLoadError, match=r"no rule files \(\*.fxr, \*.py\) found under"):
        load_rules(tmp_path)


def test_a_file_that_is_not_a_rule_file(tmp_path):
    with pytest.raises(RuleLoadError, match="is not a rule file"):
        load_rules(write(tmp_path / "rules.txt", NEG.format(name="r")))


def test_unreadable_fxr_file(tmp_path):
    path = tmp_path / "latin1.fxr"
    path.write_bytes(b"rule caf\xe9:\n")
    with pytest.raises(RuleLoadError, match="cannot read rule file"):
        load_rules(path)


def test_duplicate_rule_names_across_files_name_both_places(tmp_path):
    first = write(tmp_path / "a.fxr", "\n" + NEG.format(name="twice"))
    second = write(tmp_path / "sub" / "b.fxr", "\n\n" + NEG.format(name="twice"))
    with pytest.raises(RuleDefinitionError) as info:
        load_rules(tmp_path)
    assert f"{first}:2" in str(info.value) and f"{second}:3" in str(info.value)


def test_duplicate_rule_names_in_one_file_name_both_lines(tmp_path):
    path = write(tmp_path / "a.fxr", NEG.format(name="twice") + NEG.format(name="twice"))
    with pytest.raises(RuleDefinitionError, match=r"rule 'twice' is defined twice: at .*a.fxr:1 and at .*a.fxr:3"):
        load_rules(path)


def test_syntax_errors_name_the_file(tmp_path):
    path = write(tmp_path / "broken.fxr", "rule r:\n    torch.neg(x) x\n")
    with pytest.raises(RuleSyntaxError) as info:
        load_rules(tmp_path)
    assert info.value.filename == str(path) and info.value.lineno == 2


def test_function_pair_used_by_a_module_level_rule_is_not_loaded_twice(tmp_path):
    (tmp_path / "guarded.py").write_text(
        "import torch, fxrewrite\n"
        "def neg_neg_pattern(x):\n    return torch.neg(torch.neg(x))\n"
        "def neg_neg_replacement(x):\n    return x\n"
        "neg_neg = fxrewrite.Rule.from_functions(neg_neg_pattern, neg_neg_replacement, name='neg_neg',\n"
        "                                        priority=5, where=lambda m: False)\n"
    )
    rules = load_rules(tmp_path / "guarded.py")
    assert len(rules) == 1
    assert rules["neg_neg"].priority == 5 and len(rules["neg_neg"].where) == 1


# ---- your rules added to the standard library ----------------------------------------------------------------


@pytest.mark.slow
def test_with_standard_adds_the_rules_of_a_path_after_the_standard_library(tmp_path):
    mine = write(tmp_path / "mine.fxr", "rule exp_log:\n    torch.exp(torch.log(x)) => x\n")
    standard = load_rules()
    both = load_rules(mine, with_standard=True)
    assert both.names == (*standard.names, "exp_log")
    result = rewrite(lambda a: torch.relu(torch.relu(torch.exp(torch.log(a)))), both)
    assert result.report.applied["exp_log"] == 1 and result.report.applied["relu_relu"] == 1
    result.module.graph.lint()
    x = torch.rand(5) + 0.5
    torch.testing.assert_close(result.module(x), torch.relu(x))


@pytest.mark.slow
def test_with_standard_without_a_path_is_the_standard_library():
    assert load_rules(with_standard=True).names == load_rules().names


@pytest.mark.slow
def test_with_standard_a_rule_named_like_a_standard_one_names_both_places(tmp_path):
    mine = write(tmp_path / "mine.fxr", "rule relu_relu:\n    torch.relu(torch.relu(x)) => torch.relu(x)\n")
    with pytest.raises(RuleDefinitionError, match="two rules are named 'relu_relu'") as info:
        load_rules(mine, with_standard=True)
    assert str(mine) in str(info.value) and "activations.fxr" in str(info.value)


# ---- import_file: the one way a .py file is imported by path (rule files and CLI targets) ------------------------


def test_import_file_names_modules_by_prefix_stem_and_path(tmp_path):
    a = write(tmp_path / "a" / "rules.py", "VALUE = 'a'\n")
    b = write(tmp_path / "b" / "rules.py", "VALUE = 'b'\n")
    first, second = loader.import_file(a, prefix="p_"), loader.import_file(b, prefix="p_")
    assert (first.VALUE, second.VALUE) == ("a", "b")
    assert first.__name__ != second.__name__ and first.__name__.startswith("p_rules_")
    assert sys.modules[first.__name__] is first  # pickling and dataclasses look modules up by name


def test_import_file_puts_the_files_directory_on_sys_path_only_while_it_runs(tmp_path):
    write(tmp_path / "helper_for_import_file.py", "ANSWER = 42\n")
    main = write(tmp_path / "main.py", "from helper_for_import_file import ANSWER\n")
    path_before = list(sys.path)
    assert loader.import_file(main, prefix="p_").ANSWER == 42
    assert sys.path == path_before


@pytest.mark.parametrize("body, error", [("raise KeyError('k')\n", KeyError),
                                         ("import sys\nsys.exit(3)\n", SystemExit)])
def test_import_file_lets_the_error_through_and_leaves_no_module(tmp_path, body, error):
    bad = write(tmp_path / "bad.py", body)
    modules_before = set(sys.modules)
    with pytest.raises(error):
        loader.import_file(bad, prefix="p_")
    assert set(sys.modules) - modules_before == set()


# ---- bad rule files: what the error names, and what it leaves behind ------------------------------------


def test_a_bad_file_among_good_ones_names_the_bad_file(tmp_path):
    write_source(tmp_path / "a_good.fxr", "rule good:\n    torch.neg(torch.neg(x)) => x\n")
    bad = write_source(tmp_path / "b_bad.fxr", "rule bad:\n    torch.neg(x) x\n")
    write_source(tmp_path / "c_good.py", "import torch, fxrewrite\nr = fxrewrite.Rule.from_functions("
                                         "lambda x: torch.abs(torch.abs(x)), lambda x: torch.abs(x), name='c')\n")
    with pytest.raises(RuleSyntaxError) as info:
        fxrewrite.load_rules(tmp_path)
    assert info.value.filename == str(bad)


def _import_state() -> tuple[list[str], set[str]]:
    return list(sys.path), {name for name in sys.modules if name.startswith("fxrewrite_rules_")}


@pytest.mark.parametrize("source, fragments, cause", [
    ("import torch\nraise ValueError('boom')\n", ["failed to import: ValueError: boom"], ValueError),
    ("def broken(:\n", ["failed to import: SyntaxError"], SyntaxError),
    ("import not_a_module_anywhere_xyz\n", ["ModuleNotFoundError: No module named 'not_a_module_anywhere_xyz'"],
     ModuleNotFoundError),
    ("from fxrewrite import no_such_name\n", ["ImportError: cannot import name 'no_such_name'"], ImportError),
    ("def f():\n    return f()\nf()\n", ["RecursionError"], RecursionError),
    ("x = 1 / 0\n", ["ZeroDivisionError: division by zero"], ZeroDivisionError),
])
def test_python_rule_file_that_fails_to_import_is_a_load_error_and_leaves_no_trace(tmp_path, source, fragments,
                                                                                    cause):
    path = write_source(tmp_path / "bad_rules.py", source)
    before = _import_state()
    with pytest.raises(RuleLoadError) as info:
        fxrewrite.load_rules(path)
    message = str(info.value)
    assert f"Python rule file '{path}' failed to import" in message and "Fix the file" in message
    for fragment in fragments:
        assert fragment in message
    assert isinstance(info.value.__cause__, cause) and isinstance(info.value, ImportError)
    assert _import_state() == before


def test_invalid_rule_built_in_a_python_file_names_the_rule_and_its_line(tmp_path):
    path = write_source(tmp_path / "ident.py", """
        import torch, fxrewrite

        identity = fxrewrite.Rule.from_functions(lambda x: x, lambda x: x, name="identity")
    """)
    with pytest.raises((RuleLoadError, RuleDefinitionError)) as info:
        fxrewrite.load_rules(path)
    message = str(info.value)
    assert f"rule 'identity' ({path}:3)" in message and "returns its parameter 'x' unchanged" in message


def test_python_rule_file_with_an_untraceable_function_pair_is_a_definition_error(tmp_path):
    path = write_source(tmp_path / "pairs.py", """
        import torch

        def branchy_pattern(x):
            return torch.relu(x) if x.sum() > 0 else x

        def branchy_replacement(x):
            return x
    """)
    with pytest.raises(RuleDefinitionError) as info:
        fxrewrite.load_rules(path)
    assert f"rule 'branchy' ({path}:3)" in str(info.value) and "cannot branch or loop" in str(info.value)


@pytest.mark.parametrize("source", [
    "import sys\nsys.exit(3)\n",
    "import argparse\nargparse.ArgumentParser(prog='rules').parse_args(['--verbose'])\n",
])
def test_python_rule_file_that_exits_is_a_load_error_and_leaves_no_trace(tmp_path, source):
    path = write_source(tmp_path / "script.py", source)
    before = _import_state()
    try:
        with (pytest.raises(RuleLoadError, match="failed to import: SystemExit"),
              contextlib.redirect_stderr(io.StringIO())):
            fxrewrite.load_rules(path)
    finally:
        leaked = _import_state()
        for name in leaked[1] - before[1]:
            sys.modules.pop(name, None)
    assert leaked == before


def test_duplicate_rule_names_across_a_fxr_and_a_py_file_name_both_places(tmp_path):
    fxr = write_source(tmp_path / "a.fxr", "rule twice:\n    torch.neg(torch.neg(x)) => x\n")
    py = write_source(tmp_path / "b.py", """
        import torch, fxrewrite

        twice = fxrewrite.Rule.from_functions(lambda x: torch.abs(torch.abs(x)), lambda x: torch.abs(x), name="twice")
    """)
    with pytest.raises(RuleDefinitionError) as info:
        fxrewrite.load_rules(tmp_path)
    message = str(info.value)
    assert "two rules are named 'twice'" in message and f"{fxr}:1" in message and f"{py}:3" in message
    assert "rename one of them" in message


# ---- paths ------------------------------------------------------------------------------------------------


def test_missing_path_is_a_load_error_saying_what_to_pass(tmp_path):
    with pytest.raises(RuleLoadError) as info:
        fxrewrite.load_rules(tmp_path / "nope")
    assert str(info.value) == (f"no such rule file or directory: '{tmp_path / 'nope'}'. Pass the path of a .fxr "
                               f"or .py file or of a directory containing them.")


def test_empty_directory_and_directory_of_skipped_files_are_load_errors(tmp_path):
    with pytest.raises(RuleLoadError, match=r"no rule files \(\*.fxr, \*.py\) found under"):
        fxrewrite.load_rules(tmp_path)
    write_source(tmp_path / "_private.fxr", "rule a:\n    torch.neg(torch.neg(x)) => x\n")
    write_source(tmp_path / ".hidden" / "b.fxr", "rule b:\n    torch.neg(torch.neg(x)) => x\n")
    write_source(tmp_path / "__init__.py", "")
    write_source(tmp_path / "notes.txt", "rule c:\n")
    with pytest.raises(RuleLoadError, match=r"put rules in .fxr or .py files there"):
        fxrewrite.load_rules(tmp_path)


def test_symlink_loops_and_dangling_links_in_a_rules_directory_are_harmless(tmp_path):
    write_source(tmp_path / "sub" / "a.fxr", "rule a:\n    torch.neg(torch.neg(x)) => x\n")
    (tmp_path / "sub" / "up").symlink_to(tmp_path)
    (tmp_path / "dangling.fxr").symlink_to(tmp_path / "nowhere.fxr")
    assert fxrewrite.load_rules(tmp_path).names == ("a",)


def test_a_file_of_another_kind_is_a_load_error(tmp_path):
    path = write_source(tmp_path / "rules.yaml", "rules: []\n")
    with pytest.raises(RuleLoadError, match=r"is not a rule file: rule files end in .fxr .* or .py"):
        fxrewrite.load_rules(path)


def test_an_empty_rule_file_gives_no_rules_and_rewrites_nothing(tmp_path):
    path = write_source(tmp_path / "empty.fxr", "# nothing here yet\n")
    rules = fxrewrite.load_rules(path)
    assert len(rules) == 0
    model, gm = traced_net()
    result = rewrite(gm, rules)
    assert result.report.rewrites == 0
    assert_consistent(result.module, model)


# ---- start-up ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_lark_is_imported_only_when_a_rule_file_is_parsed(tmp_path):
    """``import fxrewrite``, loading Python rule files and rewriting with them parse no rule text,
    so they never import lark (about 0.1 s); the first ``.fxr`` file parsed imports it."""
    import subprocess

    write(tmp_path / "neg.py", "import torch\n\ndef double_neg_pattern(x):\n    return torch.neg(torch.neg(x))\n\n"
                               "def double_neg_replacement(x):\n    return x\n")
    write(tmp_path / "later" / "neg.fxr", NEG.format(name="fxr_neg"))
    script = textwrap.dedent(f"""
        import sys, torch, fxrewrite
        rules = fxrewrite.load_rules({str(tmp_path / 'neg.py')!r})
        result = fxrewrite.rewrite(lambda a: torch.neg(torch.neg(a)) + 1, rules)
        print(len(rules), result.report.rewrites, 'lark' in sys.modules)
        fxrewrite.load_rules({str(tmp_path / 'later')!r})
        print('lark' in sys.modules)
    """)
    env = {**os.environ, "FXREWRITE_CACHE": "0"}  # the .fxr file is parsed, not taken from a cache
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.split() == ["1", "1", "False", "True"], out.stderr


def test_the_cyclic_garbage_collector_is_paused_while_rules_load_and_resumed_after(tmp_path):
    import gc

    write(tmp_path / "probe.py", "import gc\nCOLLECTING = gc.isenabled()\n")
    write(tmp_path / "neg.fxr", NEG.format(name="neg"))
    assert gc.isenabled()
    load_rules(tmp_path)
    probe = next(m for name, m in sys.modules.items() if name.startswith("fxrewrite_rules_probe_"))
    assert probe.COLLECTING is False and gc.isenabled()
    with pytest.raises(RuleLoadError):
        load_rules(tmp_path / "missing")
    assert gc.isenabled()
