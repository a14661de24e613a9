"""Every script in examples/ runs, and the ones that demonstrate a result are checked here."""

from __future__ import annotations

import importlib.util
import runpy
import sys
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name.replace(".py", ""), EXAMPLES / name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("script", sorted(p.name for p in EXAMPLES.glob("[0-9]*.py")))
def test_example_script_runs(script, capsys):
    if script.startswith("07_"):
        pytest.importorskip("transformers")
    runpy.run_path(str(EXAMPLES / script), run_name="__main__")
    out = capsys.readouterr().out
    assert "before:" in out and "after:" in out


def test_function_pairs_example_rewrites_each_rule_once():
    result = load("01_function_pairs.py").main()
    assert result.report.applied == {"double_neg": 1, "relu_relu": 1, "mul_add": 1}
    result.module.graph.lint()


def test_conv_bn_folding_removes_every_batchnorm_and_keeps_outputs():
    example = load("02_conv_bn_folding.py")
    model = example.trained_model(seed=1)
    result = example.fxrewrite.rewrite(model, example.conv_bn)
    result.module.graph.lint()
    modules = [type(m) for m in result.module.modules()]
    assert torch.nn.BatchNorm2d not in modules
    assert result.report.applied["conv_bn"] == 5
    x = torch.randn(3, 3, 12, 12)
    torch.testing.assert_close(result.module(x), model(x), rtol=1e-4, atol=1e-5)


def test_conv_bn_folding_is_refused_in_training_mode():
    example = load("02_conv_bn_folding.py")
    model = example.trained_model().train()
    result = example.fxrewrite.rewrite(model, example.conv_bn)
    assert result.report.applied["conv_bn"] == 0 and result.report.rejected["conv_bn"] == 5


def test_conv_bn_folding_leaves_the_callers_model_intact():
    example = load("02_conv_bn_folding.py")
    model = example.trained_model(seed=2)
    before = ([name for name, _ in model.named_modules()], {k: v.clone() for k, v in model.state_dict().items()})
    x = torch.randn(1, 3, 8, 8)
    expected = model(x)
    example.fxrewrite.rewrite(model, example.conv_bn)
    assert [name for name, _ in model.named_modules()] == before[0]
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, before[1][k])
    torch.testing.assert_close(model(x), expected)


def test_gpt2_eager_attention_becomes_sdpa_through_export_in_every_layer():
    pytest.importorskip("transformers")
    result = load("07_gpt2_attention_export.py").main()
    assert result.report.applied == {"hf_eager_attention": 2}
    program = result.exported_program
    assert sum("scaled_dot_product_attention" in str(n.target) for n in program.graph.nodes) == 2
    assert not any("softmax" in str(n.target) for n in program.graph.nodes)
    program.graph_module.graph.lint()


def test_gpt2_eager_attention_becomes_sdpa_from_the_command_line(capsys):
    pytest.importorskip("transformers")
    from fxrewrite.cli import main

    target = f"{EXAMPLES / '07_gpt2_attention_export.py'}:model"
    code = main(["apply", target, "--export", "--rules", str(EXAMPLES / "07_rules"), "--check"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "hf_eager_attention" in out and "check: ok" in out
