"""Every script in examples/ runs, and the ones that demonstrate a result are checked here:
examples 01-02, 03-06 (attention, activations, quantised linear, a user's rules directory) and 07,
their use as ``fxrewrite apply`` targets, and importing the ``-o`` folder.

Every rewrite test checks the numbers with ``torch.testing.assert_close``, lints the graph and
says which rules fired. (tests/test_benchmarks.py runs benchmarks/bench_models.py on them.)
"""

from __future__ import annotations

import functools
import io
import math
import runpy
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from _helpers import assert_rewrite_sound
from torch import fx, nn

import fxrewrite
from fxrewrite import cli
from fxrewrite.loader import import_file

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def load(name: str):
    return import_file(EXAMPLES / name, prefix="tests_examples_")


@pytest.mark.slow
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
    assert_rewrite_sound(model, result, x, rtol=1e-4, atol=1e-5)


def test_conv_bn_folding_is_refused_in_training_mode():
    example = load("02_conv_bn_folding.py")
    model = example.trained_model().train()
    result = example.fxrewrite.rewrite(model, example.conv_bn)
    assert result.report.applied["conv_bn"] == 0 and result.report.rejected["conv_bn"] == 5
    assert_rewrite_sound(model, result, torch.randn(2, 3, 8, 8))  # batch statistics, as in training


def test_conv_bn_folding_leaves_the_callers_model_intact():
    example = load("02_conv_bn_folding.py")
    model = example.trained_model(seed=2)
    before = ([name for name, _ in model.named_modules()], {k: v.clone() for k, v in model.state_dict().items()})
    x = torch.randn(1, 3, 8, 8)
    expected = model(x)
    result = example.fxrewrite.rewrite(model, example.conv_bn)
    assert [name for name, _ in model.named_modules()] == before[0]
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, before[1][k])
    torch.testing.assert_close(model(x), expected)
    assert_rewrite_sound(model, result, x, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_gpt2_eager_attention_becomes_sdpa_through_export_in_every_layer():
    pytest.importorskip("transformers")
    result = load("07_gpt2_attention_export.py").main()
    assert result.report.applied == {"hf_eager_attention": 2}
    program = result.exported_program
    assert sum("scaled_dot_product_attention" in str(n.target) for n in program.graph.nodes) == 2
    assert not any("softmax" in str(n.target) for n in program.graph.nodes)
    program.graph_module.graph.lint()


@pytest.mark.slow
def test_gpt2_eager_attention_becomes_sdpa_from_the_command_line(capsys):
    pytest.importorskip("transformers")
    from fxrewrite.cli import main

    target = f"{EXAMPLES / '07_gpt2_attention_export.py'}:model"
    code = main(["apply", target, "--export", "--rules", str(EXAMPLES / "07_rules"), "--check"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "hf_eager_attention" in out and "check: ok" in out


# ---- examples 03-06: shared helpers --------------------------------------------------------------------------


@functools.cache
def load_once(filename: str):
    """Import ``examples/<filename>`` once per test session (the module-scoped fixtures share it)."""
    return import_file(EXAMPLES / filename, prefix="tests_examples_once_")


def fired(result: fxrewrite.RewriteResult) -> dict[str, int]:
    return {name: n for name, n in result.report.applied.items() if n}


def calls(gm: fx.GraphModule, name: str) -> list[fx.Node]:
    """The nodes calling a function, method or ATen op called ``name``."""
    def called(n: fx.Node) -> str:
        if isinstance(n.target, torch._ops.OpOverload):
            return n.target.overloadpacket.__name__
        return n.target if isinstance(n.target, str) else getattr(n.target, "__name__", "")

    return [n for n in gm.graph.nodes if n.op in ("call_function", "call_method") and called(n) == name]


@pytest.fixture(scope="module")
def library() -> fxrewrite.RuleSet:
    return fxrewrite.load_rules()


# ---- 03: attention to scaled_dot_product_attention ---------------------------------------------


@pytest.fixture(scope="module")
def ex03():
    return load_once("03_attention_to_sdpa.py")


def is_causal(sdpa: fx.Node) -> bool:
    """``is_causal`` of a scaled_dot_product_attention call (keyword, or 6th positional in ATen)."""
    return sdpa.kwargs.get("is_causal", sdpa.args[5] if len(sdpa.args) > 5 else False) is True


def assert_gpt_rewritten(example, model, result, rule: str) -> None:
    result.module.graph.lint()
    layers = len(model.blocks)
    assert fired(result)[rule] == layers
    assert not calls(result.module, "softmax")
    sdpa = calls(result.module, "scaled_dot_product_attention")
    assert len(sdpa) == layers and all(is_causal(n) for n in sdpa)
    tokens = example.tokens_for(model, seed=5)  # exported graphs are specialised to batch 2
    assert_rewrite_sound(model, result, tokens, rtol=1e-4, atol=1e-5)


def test_gpt_additive_causal_attention_becomes_sdpa_is_causal(ex03, library):
    model = ex03.gpt(layers=2, seq=16)
    result = ex03.rewrite_gpt(model, library + ex03.CAUSAL_RULES)
    assert_gpt_rewritten(ex03, model, result, "causal_attention")
    expected = {"causal_attention": 2, "gelu_tanh": 2, "dropout_layer_inactive": 2}
    assert {name: fired(result).get(name) for name in expected} == expected
    assert not calls(result.module, "tanh") and not any(isinstance(m, nn.Dropout) for m in result.module.modules())


def test_gpt_masked_fill_spelling_becomes_sdpa_with_the_examples_rule(ex03, library):
    model = ex03.gpt("masked_fill", layers=2, seq=16)
    shipped = fired(ex03.rewrite_gpt(model, library))  # the fill becomes an additive mask, then attn_mask
    assert {"attention_masked_fill_to_additive", "attention_masked"} <= set(shipped), shipped
    result = ex03.rewrite_gpt(model, library + ex03.CAUSAL_RULES)
    assert_gpt_rewritten(ex03, model, result, "causal_attention_masked_fill")


def test_gpt_exported_graph_gets_aten_sdpa(ex03, library):
    model = ex03.gpt(layers=2, seq=16)
    result = ex03.rewrite_gpt(model, library + ex03.CAUSAL_RULES, export=True)
    assert_gpt_rewritten(ex03, model, result, "causal_attention")
    assert all(n.target is torch.ops.aten.scaled_dot_product_attention.default
               for n in calls(result.module, "scaled_dot_product_attention"))


def test_shipped_rules_alone_pass_the_additive_mask_as_attn_mask(ex03, library):
    model = ex03.gpt(layers=2, seq=16)
    result = ex03.rewrite_gpt(model, library)
    result.module.graph.lint()
    assert fired(result)["attention_masked"] == 2
    (first, _) = calls(result.module, "scaled_dot_product_attention")
    assert first.kwargs.get("attn_mask") is not None or len(first.args) > 3
    tokens = ex03.tokens_for(model)
    assert_rewrite_sound(model, result, tokens, rtol=1e-4, atol=1e-5)


def test_causal_rule_refuses_a_mask_that_is_not_causal(ex03, library):
    model = ex03.gpt(layers=1, seq=16)
    with torch.no_grad():
        model.blocks[0].attn.mask[3, 1] = float("-inf")  # one more masked position: not the causal mask
    result = ex03.rewrite_gpt(model, library + ex03.CAUSAL_RULES)
    result.module.graph.lint()
    assert fired(result).get("causal_attention", 0) == 0 and result.report.rejected["causal_attention"] >= 1
    assert fired(result)["attention_masked"] == 1  # the general rule still applies, with attn_mask
    tokens = ex03.tokens_for(model)
    assert_rewrite_sound(model, result, tokens, rtol=1e-4, atol=1e-5)


def test_causal_rule_needs_shapes(ex03):
    model = ex03.gpt(layers=1, seq=16)
    result = fxrewrite.rewrite(model, ex03.CAUSAL_RULES)  # no example_inputs: the guard cannot see q's shape
    assert fired(result) == {} and result.report.rejected["causal_attention"] == 1
    assert_rewrite_sound(model, result, ex03.tokens_for(model))


@pytest.mark.slow  # 0.8-1.0 s of CPU: over the one-second rule on a loaded machine
def test_transformer_encoder_default_rules_remove_dropout_and_leave_attention(ex03, library):
    results = ex03.rewrite_transformer_encoder(library)  # checks lint and numbers itself
    traced, exported = fired(results["symbolic_trace"]), fired(results["torch.export"])
    assert traced["dropout_layer_inactive"] == 6 and exported["dropout_inactive"] == 6
    assert not any("attention" in name for name in (*traced, *exported))
    traced_modules = {type(m).__name__ for m in results["symbolic_trace"].module.modules()}
    assert "MultiheadAttention" in traced_modules and "Dropout" not in traced_modules
    assert len(calls(results["torch.export"].module, "scaled_dot_product_attention")) == 2  # already there
    assert not calls(results["torch.export"].module, "dropout")


# ---- 04: activation fusions --------------------------------------------------------------------


@pytest.fixture(scope="module")
def ex04():
    return load_once("04_activation_fusions.py")


@pytest.mark.slow
def test_activation_fusions_on_the_traced_mobilenet(ex04):
    model = ex04.mobile_net()
    (x,) = ex04.example_inputs()
    result = fxrewrite.rewrite(model, ex04.all_rules(), example_inputs=(x,))
    result.module.graph.lint()
    assert {name: fired(result).get(name) for name in ex04.EXPECTED_TRACED} == ex04.EXPECTED_TRACED
    for spelled_out in ("sigmoid", "erf", "tanh", "exp", "clamp", "where", "softplus"):
        assert not calls(result.module, spelled_out), spelled_out
    assert not any(isinstance(m, nn.BatchNorm2d) for m in result.module.modules())
    assert_rewrite_sound(model, result, x, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_activation_fusions_on_the_exported_mobilenet(ex04):
    model = ex04.mobile_net()
    (x,) = ex04.example_inputs()
    result = fxrewrite.rewrite(torch.export.export(model, (x,)).module(), ex04.all_rules())
    result.module.graph.lint()
    expected = {"silu_from_sigmoid": 2, "gelu_erf": 1, "mish_from_softplus": 1, "relu6_from_clamp": 1,
                "leaky_relu_from_where": 1, "silu_from_exp": 1}
    assert {name: fired(result).get(name) for name in expected} == expected
    assert "conv_bn_fold" not in fired(result)  # BatchNorm modules are inlined by torch.export
    assert_rewrite_sound(model, result, x, rtol=1e-4, atol=1e-5)


def test_silu_from_exp_is_sound_and_fires_on_either_operand_order(ex04):
    from fxrewrite.testing import check_rule

    assert check_rule(ex04.silu_from_exp, max_examples=50).verdict == "sound"
    result = fxrewrite.rewrite(lambda a: a / (torch.exp(-a) + 1), ex04.silu_from_exp)
    result.module.graph.lint()
    assert fired(result) == {"silu_from_exp": 1}
    a = torch.randn(7)
    assert_rewrite_sound(F.silu, result, a)


# ---- 05: quantised linear ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def ex05():
    return load_once("05_quantized_linear.py")


def test_every_linear_becomes_a_quantized_linear(ex05):
    model = ex05.mlp()
    (x,) = ex05.example_inputs()
    result = fxrewrite.rewrite(model, ex05.RULES)
    result.module.graph.lint()
    assert fired(result) == {"quantize_linear": 3}
    assert ex05.linear_layers(result.module) == []
    quantized = [m for m in result.module.modules() if isinstance(m, ex05.QuantizedLinear)]
    assert [(q.in_features, q.out_features, q.bias is not None) for q in quantized] == \
        [(64, 256, True), (256, 256, True), (256, 10, False)]
    assert all(q.qweight.dtype == torch.int8 and q.qweight.abs().max() <= 127 for q in quantized)
    assert ex05.check_layer_bounds(model, result.module, x) <= 1.0
    with torch.no_grad():
        relative = ex05.assert_end_to_end(result.module(x), model(x), model)
    assert 0 < relative < 3 * ex05.predicted_error(model)
    assert ex05.linear_layers(model) == ["fc1", "fc2", "head"]  # the caller's model is untouched


def test_quantized_weights_are_within_half_a_step(ex05):
    weight = torch.randn(16, 32)
    layer = ex05.QuantizedLinear.from_float(weight)
    step = layer.scale[:, None]
    assert bool(((layer.dequantized_weight() - weight).abs() <= step / 2 + 1e-7).all())
    assert torch.equal(layer.qweight.abs().amax(dim=1), torch.full((16,), 127, dtype=torch.int8))


def test_quantization_tolerance_catches_a_lost_bias(ex05):
    model = ex05.mlp()
    (x,) = ex05.example_inputs()
    result = fxrewrite.rewrite(model, ex05.RULES)
    broken = next(m for m in result.module.modules() if isinstance(m, ex05.QuantizedLinear))
    broken.bias = None
    with torch.no_grad(), pytest.raises(AssertionError):
        ex05.assert_end_to_end(result.module(x), model(x), model)


def test_quantized_linear_on_the_exported_graph(ex05):
    model = ex05.mlp()
    (x,) = ex05.example_inputs()
    result = fxrewrite.rewrite(torch.export.export(model, (x,)).module(), ex05.RULES)
    result.module.graph.lint()
    assert fired(result) == {"quantize_linear_functional": 2, "quantize_linear_functional_no_bias": 1}
    assert not calls(result.module, "linear")
    with torch.no_grad():
        ex05.assert_end_to_end(result.module(x), model(x), model)


# ---- 06: a user's rules directory --------------------------------------------------------------


@pytest.fixture(scope="module")
def ex06():
    return load_once("06_user_rules_dir.py")


@pytest.fixture(scope="module")
def user_rules(ex06):
    return fxrewrite.load_rules("examples/06_my_rules") if Path.cwd() == ROOT else ex06.load()


def test_user_rules_dir_loads_fxr_and_py_files_in_order(user_rules):
    assert user_rules.names == ("square_self", "normalize_last", "softplus_from_log1p_exp", "residual_axpy",
                                "clamp_both")
    assert [Path(r.origin.rpartition(":")[0]).name for r in user_rules] == ["cleanup.fxr"] * 2 + ["smooth.py"] * 3


def test_user_rules_dir_loads_from_a_relative_path(monkeypatch):
    monkeypatch.chdir(ROOT)
    assert len(fxrewrite.load_rules("examples/06_my_rules")) == 5


@pytest.mark.slow
def test_user_rules_property_verdicts(user_rules):
    from fxrewrite.testing import check_rule, evaluate

    verdicts = {name: check_rule(user_rules[name], max_examples=50).verdict
                for name in ("square_self", "normalize_last", "softplus_from_log1p_exp", "clamp_both")}
    assert verdicts == {"square_self": "sound", "normalize_last": "unsound", "softplus_from_log1p_exp": "sound",
                        "clamp_both": "sound"}
    # residual_axpy: y * s overflows before the addition in the pattern, not in torch.add(alpha=s)
    overflow = {"x": torch.tensor(-math.inf), "y": torch.tensor(-3e38), "s": -2.0}
    assert evaluate(user_rules["residual_axpy"], overflow) is not None
    assert evaluate(user_rules["residual_axpy"], {"x": torch.ones(3), "y": torch.ones(3), "s": 0.5}) is None


@pytest.mark.slow
def test_user_rules_example_applies_only_the_rules_that_pass(ex06):
    outcome = ex06.main()
    assert outcome["checks"]["normalize_last"].verdict == "unsound"
    assert [len(found) for found in outcome["edges"].values()] == [0, 0, 0, 1, 0]  # residual_axpy's overflow
    assert outcome["applied"] == ("square_self", "softplus_from_log1p_exp", "clamp_both")
    result = outcome["result"]
    result.module.graph.lint()
    assert fired(result) == {"square_self": 1, "softplus_from_log1p_exp": 1, "clamp_both": 1}
    (x,) = ex06.example_inputs()
    net = ex06.model()
    assert_rewrite_sound(net, result, x)


@pytest.mark.parametrize("filename, expected", [
    ("03_attention_to_sdpa.py", {"causal_attention": 11, "causal_attention_masked_fill": 11}),
    ("04_activation_fusions.py", {"silu_from_exp": 0}),
    ("05_quantized_linear.py", {"quantize_linear": 0, "quantize_linear_functional": 0,
                                "quantize_linear_functional_no_bias": 0}),
])
def test_example_files_loaded_as_rule_files_keep_guards_and_priorities(filename, expected):
    rules = fxrewrite.load_rules(EXAMPLES / filename)
    assert {r.name: r.priority for r in rules} == expected
    assert all(len(r.where) == 1 for r in rules)


# ---- the examples as `fxrewrite apply` targets ---------------------------------------------------


def run_cli(argv: list[str], monkeypatch) -> tuple[int, str]:
    monkeypatch.chdir(ROOT)
    buf = io.StringIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = cli.main(argv, out=buf)
    return code, buf.getvalue()


@pytest.mark.slow
@pytest.mark.parametrize("target", [
    "examples/03_attention_to_sdpa.py:gpt",
    "examples/03_attention_to_sdpa.py:gpt_masked_fill",
    "examples/04_activation_fusions.py:mobile_net",
    "examples/05_quantized_linear.py:mlp",
    "examples/06_user_rules_dir.py:model",
])
@pytest.mark.parametrize("export", [False, True], ids=["traced", "export"])
def test_example_is_an_apply_target_that_checks(target, export, monkeypatch):
    code, out = run_cli(["apply", target, "--check", *(["--export"] if export else [])], monkeypatch)
    assert code == 0, out
    assert "check: ok" in out


@pytest.mark.parametrize("argv, fires", [
    (["apply", "examples/03_attention_to_sdpa.py:gpt_masked_fill", "--rules", "examples/03_attention_to_sdpa.py",
      "--export"], "causal_attention_masked_fill"),
    (["apply", "examples/06_user_rules_dir.py:model", "--rules", "examples/06_my_rules", "--export"], "square_self"),
])
def test_example_rules_on_the_command_line(argv, fires, monkeypatch):
    code, out = run_cli([*argv, "--check"], monkeypatch)
    assert code == 0, out
    row = next(line for line in out.splitlines() if line.startswith(fires + " "))
    assert int(row.split()[1]) >= 1


def test_quantized_check_on_the_command_line_exits_1(monkeypatch):
    """--check compares with rtol=1e-4: approximate rewrites such as quantisation fail it, by design."""
    code, out = run_cli(["apply", "examples/05_quantized_linear.py:mlp", "--rules", "examples/05_quantized_linear.py",
                         "--check"], monkeypatch)
    assert code == 1
    assert "check: FAILED" in out


@pytest.mark.slow
def test_output_folder_imports_and_runs_in_a_fresh_interpreter(tmp_path, monkeypatch):
    folder = tmp_path / "folded"
    code, out = run_cli(["apply", "examples/02_conv_bn_folding.py:trained_model", "-o", str(folder)], monkeypatch)
    assert code == 0, out
    assert "from folded import RewrittenModule" in out
    assert {p.name for p in folder.iterdir()} >= {"__init__.py", "module.py", "state_dict.pt"}
    example = load_once("02_conv_bn_folding.py")
    x = torch.randn(2, 3, 16, 16)
    torch.save({"x": x, "expected": example.trained_model()(x).detach()}, tmp_path / "io.pt")
    script = textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {str(tmp_path)!r})
        from folded import RewrittenModule
        model = RewrittenModule()
        data = torch.load({str(tmp_path / 'io.pt')!r})
        torch.testing.assert_close(model(data["x"]), data["expected"], rtol=1e-4, atol=1e-5)
        assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], check=False, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("ok")
