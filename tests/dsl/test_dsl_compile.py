"""fxrewrite.dsl.compile: every construct of the language compiles to a Rule that rewrites a real
module, and the rewritten module computes what the original did."""

from __future__ import annotations

import inspect
import math
import operator

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from _helpers import assert_rewrite_sound
from torch.nn.utils.fusion import fuse_conv_bn_eval

from fxrewrite import RewriteError, Rule, RuleSet, rewrite
from fxrewrite.dsl import parse_rules


def apply(text, fn, inputs, *, names=None, expect=None, **kwargs):
    """Rewrite ``fn`` with the rules of ``text``; check the graph lints and the numbers agree."""
    rules = parse_rules(text, source="t.fxr", names=names)
    result = rewrite(fn, rules, **kwargs)
    result.module.graph.lint()
    torch.testing.assert_close(result.module(*inputs), fn(*inputs))
    if expect is not None:
        assert dict(result.report.applied) == expect, result.code
    return result


def targets(result):
    return [n.target for n in result.module.graph.nodes if n.op.startswith("call")]


x4 = torch.randn(4, 5)


# ---- the rules of the issue ----------------------------------------------------------------------


def test_call_of_a_torch_function():
    result = apply('rule double_neg "Replaces -(-x) by x.":\n    torch.neg(torch.neg(x)) => x\n',
                   lambda a: torch.neg(torch.neg(a)) + 1, (x4,), expect={"double_neg": 1})
    assert targets(result) == [operator.add]


def test_operator_with_a_literal():
    result = apply("rule mul_one:\n    x * 1 => x\n", lambda a: torch.relu(a * 1), (x4,), expect={"mul_one": 1})
    assert targets(result) == [torch.relu]


def test_literal_in_the_pattern_must_be_equal():
    apply("rule mul_one:\n    x * 1 => x\n", lambda a: a * 2, (x4,), expect={"mul_one": 0})


def test_where_condition_on_shape_and_dtype_accepts_and_rejects():
    text = ("rule add_relu priority 2:\n"
            "    torch.relu(x + y) => torch.clamp(x + y, min=0)\n"
            "    where x.shape == y.shape and x.dtype == torch.float32\n")
    same = apply(text, lambda a, b: torch.relu(a + b), (x4, x4), example_inputs=(x4, x4), expect={"add_relu": 1})
    assert torch.clamp in targets(same)
    row = torch.randn(1, 5)
    other = apply(text, lambda a, b: torch.relu(a + b), (x4, row), example_inputs=(x4, row), expect={"add_relu": 0})
    reason = other.report.reasons["add_relu"][0]  # one per operand order of the commutative '+'
    assert "'where x.shape == y.shape and x.dtype == torch.float32' (t.fxr:3) returned False" in reason


def test_literal_capture_with_a_keyword_argument_and_a_continuation_line():
    text = ("rule softmax_attention priority 10:\n"
            "    torch.softmax(q @ k.transpose(-2, -1) * s, dim=-1) @ v\n"
            "        => F.scaled_dot_product_attention(q, k, v, scale=s)\n"
            "    where s: float\n")

    def attention(q, k, v):
        return torch.softmax(q @ k.transpose(-2, -1) * 0.125, dim=-1) @ v

    q, k, v = (torch.randn(2, 3, 8) for _ in range(3))
    result = apply(text, attention, (q, k, v), expect={"softmax_attention": 1})
    (node,) = [n for n in result.module.graph.nodes if n.op == "call_function"]
    assert node.kwargs == {"scale": 0.125}


def test_module_captures_and_a_function_given_with_names():
    class ConvBN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)

        def forward(self, x):
            return torch.relu(self.bn(self.conv(x)))

    model = ConvBN().eval()
    model.bn.running_mean.uniform_(-1, 1)
    text = ("rule conv_bn_fold:\n"
            "    bn(conv(x)) => fold(conv, bn)(x)\n"
            "    where conv: nn.Conv2d, bn: nn.BatchNorm2d\n")
    result = apply(text, model, (torch.randn(2, 3, 8, 8),), names={"fold": fuse_conv_bn_eval},
                   expect={"conv_bn_fold": 1})
    assert [n.op for n in result.module.graph.nodes].count("call_module") == 1


def test_let_and_a_tuple_of_results_make_a_multi_output_rule():
    text = ("rule split_shared:\n"
            "    let t = x.transpose(-2, -1)\n"
            "    (t.contiguous(), t * 2) => (x.mT.contiguous(), x.mT * 2)\n")

    def f(a):
        t = a.transpose(-2, -1)
        return t.contiguous() + 1, t * 2

    result = apply(text, f, (x4,), expect={"split_shared": 1})
    assert "transpose" not in targets(result)


# ---- each construct ------------------------------------------------------------------------------


@pytest.mark.parametrize("text, fn", [
    ("rule r:\n    -(-x) => x\n", lambda a: -(-a) + 1),  # noqa: B002 (two negations, on purpose)
    ("rule r:\n    +x * 1 => x\n", lambda a: (+a) * 1),
    ("rule r:\n    x ** 2 => x * x\n", lambda a: a ** 2),
    ("rule r:\n    x - x * 0 => x\n", lambda a: a - a * 0),
    ("rule r:\n    x / 2 // 1 % 3 => torch.remainder(torch.floor(x / 2), 3)\n", lambda a: a / 2 // 1 % 3),
    ("rule r:\n    x @ y.T => torch.mm(x, y.t())\n", lambda a, b: a @ b.T),
    ("rule r:\n    x.sum(dim=1, keepdim=True) => x.sum(1).unsqueeze(1)\n", lambda a: a.sum(dim=1, keepdim=True)),
    ("rule r:\n    x.mT.mT => x.clone()\n", lambda a: a.mT.mT),
    ("rule r:\n    x[..., 0:2][:, ::2] => x[:, 0:2:2]\n", lambda a: a[..., 0:2][:, ::2]),
    ("rule r:\n    x[-1] => x.flip(0)[0]\n", lambda a: a[-1]),
    ("rule r:\n    torch.cat([x, y], dim=0) => torch.vstack((x, y))\n", lambda a, b: torch.cat([a, b], dim=0)),
    ("rule r:\n    F.gelu(x, approximate='tanh')\n"
     "        => 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))\n",
     lambda a: F.gelu(a, approximate="tanh")),
    ("rule r:\n    torch.clamp(x, min=0.0, max=None) => torch.relu(x)\n", lambda a: torch.clamp(a, min=0.0, max=None)),
    ("rule r:\n    torch.where(x > 0, x, x * 0.0) => torch.relu(x)\n", lambda a: torch.where(a > 0, a, a * 0.0)),
    ("rule r:\n    x.view(-1).view(x.shape) => x.clone()\n", lambda a: a.view(-1).view(a.shape)),
    ("rule r:\n    torch.sum(x, dim=(0, 1)) => x.sum()\n", lambda a: torch.sum(a, dim=(0, 1))),
])
def test_each_construct_compiles_and_rewrites(text, fn):
    apply(text, fn, (x4,) * fn.__code__.co_argcount, expect={"r": 1})


def test_wildcard_matches_anything_and_each_underscore_is_its_own_variable():
    (rule,) = parse_rules("rule r:\n    torch.where(_, x, x) + _ * 0 => x + torch.zeros(())\n")
    assert [p.name for p in rule.compiled.params] == ["_1", "x", "_2"]
    apply("rule r:\n    torch.where(_, x, x) => x\n", lambda c, a: torch.where(c > 0, a, a), (x4, x4), expect={"r": 1})


def test_int_and_dtype_captures_hand_their_values_to_the_replacement():
    text = ("rule transpose_twice:\n"
            "    x.transpose(a, b).transpose(a, b) => x\n"
            "    where a: int, b: int\n"
            "rule cast_twice:\n"
            "    x.to(d).to(d) => x.to(d)\n"
            "    where d: torch.dtype\n")
    apply(text, lambda t: t.transpose(0, 1).transpose(0, 1) + 1, (x4,), expect={"transpose_twice": 1, "cast_twice": 0})
    result = apply(text, lambda t: t.to(torch.float64).to(torch.float64), (x4,), expect={"transpose_twice": 0,
                                                                                      "cast_twice": 1})
    assert targets(result) == ["to"]


def test_replacement_computes_with_captured_values_at_rewrite_time():
    text = "rule fold_scales:\n    x * s * t => x * (s * t)\n    where s: float, t: float\n"
    result = apply(text, lambda a: a * 2.0 * 3.0, (x4,), expect={"fold_scales": 1})
    (node,) = [n for n in result.module.graph.nodes if n.op == "call_function"]
    assert node.args[1] == 6.0


def test_math_and_operator_in_the_replacement():
    text = "rule r:\n    x / n => operator.mul(x, 1 / math.sqrt(n * n))\n    where n: int\n"
    apply(text, lambda a: a / 4, (x4,), expect={"r": 1})


@pytest.mark.parametrize("condition, applied", [
    ("x.dim() == 2", 1),
    ("x.ndim == 3", 0),
    ("0 < x.dim() <= 2", 1),
    ("0 < x.dim() < 2", 0),
    ("x.dtype in (torch.float16, torch.float32)", 1),
    ("x.dtype not in (torch.float16, torch.float32)", 0),
    ("not x.shape[-1] > 4", 0),
    ("x.size(0) == 4 and x.shape[1:] == (5,)", 1),
    ("x.shape[0] == 3 or x.device == x.device", 1),
    ("x.dtype is torch.float32", 1),
    ("x.dtype is not torch.float32", 0),
    ("len(x.shape) == 2" if False else "x.dim() + 1 == 3", 1),
])
def test_where_conditions(condition, applied):
    text = f"rule r:\n    torch.neg(torch.neg(x)) => x\n    where {condition}\n"
    apply(text, lambda a: torch.neg(torch.neg(a)), (x4,), example_inputs=(x4,), expect={"r": applied})


def test_several_where_lines_are_separate_guards_and_all_must_pass():
    text = "rule r:\n    torch.neg(torch.neg(x)) => x\n    where x.dim() == 2\n    where x.shape[0] == 3\n"
    (rule,) = parse_rules(text, source="t.fxr")
    assert len(rule.where) == 2
    result = apply(text, lambda a: torch.neg(torch.neg(a)), (x4,), example_inputs=(x4,), expect={"r": 0})
    assert "'where x.shape[0] == 3' (t.fxr:4)" in result.report.reasons["r"][0]


def test_where_conditions_read_module_and_literal_captures():
    text = ("rule r:\n    lin(x) * s => lin(x) * (s / 2) * 2\n    where lin: nn.Linear, s: float\n"
            "    where lin.bias is not None and lin.out_features == 3 and s > 1\n")

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(5, 3)

        def forward(self, x):
            return self.lin(x) * 2.0

    (rule,) = parse_rules(text)
    model = M()
    result = rewrite(model, rule)
    assert result.report.applied["r"] == 1
    assert_rewrite_sound(model, result, torch.randn(4, 5))


def test_use_line_makes_an_alias_of_an_allowed_path():
    text = "use torch.nn.functional as nnf\n\nrule r:\n    nnf.relu(nnf.relu(x)) => nnf.relu(x)\n"
    result = apply(text, lambda a: F.relu(F.relu(a)), (x4,), expect={"r": 1})
    assert targets(result) == [F.relu]


def test_use_line_for_an_op_namespace_reaches_aten_ops():
    text = "use torch.ops.aten as aten\n\nrule r:\n    torch.relu(torch.relu(x)) => aten.relu.default(x)\n"
    result = apply(text, lambda a: torch.relu(torch.relu(a)), (x4,), expect={"r": 1})
    assert targets(result) == [torch.ops.aten.relu.default]


def test_names_given_by_the_caller_are_in_scope():
    def scaled_relu(t):
        return torch.relu(t) * 1.0

    text = "rule r:\n    torch.relu(x) * 2 => helper(x) * 2\n"
    apply(text, lambda a: torch.relu(a) * 2, (x4,), names={"helper": scaled_relu}, expect={"r": 1})


def test_let_may_be_used_in_the_replacement_and_by_later_lets():
    text = "rule r:\n    let t = torch.relu(x)\n    let u = t * 2\n    u + u => torch.relu(x) * 4\n"
    apply(text, lambda a: torch.relu(a) * 2 + torch.relu(a) * 2, (x4,), expect={"r": 0})
    apply(text, lambda a: (lambda u: u + u)(torch.relu(a) * 2), (x4,), expect={"r": 1})


def test_custom_op_namespace_in_a_replacement_resolves_when_the_rule_fires():
    text = "rule r:\n    torch.neg(torch.neg(x)) => torch.ops.fxrewrite_no_such_lib.op(x)\n"
    (rule,) = parse_rules(text, source="t.fxr")  # loads: the op may be registered later
    with pytest.raises(RewriteError, match=r"'torch.ops.fxrewrite_no_such_lib.op' does not exist"):
        rewrite(lambda a: torch.neg(torch.neg(a)), rule)


# ---- the compiled Rule ---------------------------------------------------------------------------


def test_rule_remembers_name_doc_priority_origin_and_is_a_rule():
    rules = parse_rules('\n\nrule r "Doc." priority 4:\n    torch.neg(torch.neg(x)) => x\n', source="dir/t.fxr")
    (rule,) = rules
    assert isinstance(rules, RuleSet) and isinstance(rule, Rule)
    assert (rule.name, rule.doc, rule.priority, rule.origin) == ("r", "Doc.", 4, "dir/t.fxr:3")


def test_parameters_are_the_variables_in_first_appearance_order_with_annotations():
    text = "rule r:\n    bn(conv(x)) * s + y => x\n    where conv: nn.Conv2d, bn: nn.BatchNorm2d, s: float\n"
    (rule,) = parse_rules(text)
    for fn in (rule.pattern, rule.replacement):
        sig = inspect.signature(fn)
        assert list(sig.parameters) == ["bn", "conv", "x", "s", "y"]
    annotations = {n: p.annotation for n, p in inspect.signature(rule.pattern).parameters.items()}
    assert annotations["conv"] is nn.Conv2d and annotations["s"] is float
    assert annotations["x"] is inspect.Parameter.empty
    assert [(p.name, p.kind) for p in rule.compiled.params] == [
        ("bn", "module"), ("conv", "module"), ("x", "tensor"), ("s", "literal"), ("y", "tensor")]


def test_generated_functions_compute_on_real_tensors():
    (rule,) = parse_rules("rule r:\n    let t = x * 2\n    t + torch.neg(t) => torch.zeros_like(x)\n")
    torch.testing.assert_close(rule.pattern(x4), x4 * 2 + torch.neg(x4 * 2))
    torch.testing.assert_close(rule.replacement(x=x4), torch.zeros_like(x4))


def test_new_nodes_carry_the_rule_file_as_provenance():
    result = apply("rule r:\n    torch.neg(torch.neg(x)) => x.clone()\n", lambda a: torch.neg(torch.neg(a)),
                   (x4,), expect={"r": 1})
    (node,) = [n for n in result.module.graph.nodes if n.target == "clone"]
    assert 't.fxr", line 1' in node.meta["stack_trace"]


def test_where_guard_is_named_by_its_text_and_location():
    (rule,) = parse_rules("rule r:\n    torch.neg(x) * 2 => x\n    where x.dim() == 2\n", source="g.fxr")
    (guard,) = rule.where
    assert guard.__name__ == guard.__qualname__ == "'where x.dim() == 2' (g.fxr:3)"
    assert "where x.dim() == 2" in repr(guard)


def test_math_constants_and_types_resolve():
    text = "rule r:\n    x * math.pi => x * 3.0 + x * (math.pi - 3.0)\n"
    apply(text, lambda a: a * math.pi, (x4,), expect={"r": 1})


# ---- layering ------------------------------------------------------------------------------------


def _imports_of(module) -> set[str]:
    import ast as python_ast
    import inspect

    tree = python_ast.parse(inspect.getsource(module))
    return {("." * node.level) + (node.module or "") for node in python_ast.walk(tree)
            if isinstance(node, python_ast.ImportFrom)}


def test_dsl_compile_does_not_reach_back_into_the_matcher():
    from fxrewrite.dsl import compile as dsl_compile

    assert "..match" not in _imports_of(dsl_compile)


def test_what_where_conditions_may_read_of_a_tensor_is_what_the_match_shows():
    from fxrewrite.dsl.compile import GUARD_TENSOR_ATTRIBUTES
    from fxrewrite.match import TensorView

    assert {n for n in dir(TensorView) if not n.startswith("_")} >= GUARD_TENSOR_ATTRIBUTES


def test_the_allow_list_lives_in_its_own_module():
    from fxrewrite.dsl import compile as dsl_compile
    from fxrewrite.dsl import scope

    assert dsl_compile.Scope is scope.Scope and dsl_compile.DEFAULT_NAMES is scope.DEFAULT_NAMES
    assert ".scope" in _imports_of(dsl_compile)
    assert not {"..match", "..rule", "..pattern", ".compile"} & _imports_of(scope)


_CODE_FIELDS = ("co_argcount", "co_posonlyargcount", "co_kwonlyargcount", "co_nlocals", "co_flags", "co_code",
                "co_consts", "co_names", "co_varnames", "co_freevars", "co_cellvars", "co_filename", "co_name",
                "co_qualname", "co_firstlineno", "co_linetable", "co_exceptiontable", "co_stacksize")


def _function_facts(fn):
    code = fn.__code__
    return ([getattr(code, f) for f in _CODE_FIELDS],
            (fn.__name__, fn.__qualname__, fn.__module__, fn.__defaults__, fn.__kwdefaults__, fn.__annotations__,
             sorted(fn.__globals__), fn.__globals__["__builtins__"]))


@pytest.mark.parametrize("params", [(), ("x",), ("x", "y", "n"), ("a_long_name", "b", "c", "d", "e")])
def test_shared_template_code_builds_the_function_compiling_anew_builds(params, monkeypatch):
    """SHARED_TEMPLATE_CODE (one compiled template per parameter list, renamed per rule) against
    its slow twin (compile and exec the template for every function)."""
    from fxrewrite.dsl import compile as dsl_compile

    made = {}
    for shared in (True, False):
        monkeypatch.setattr(dsl_compile, "SHARED_TEMPLATE_CODE", shared)
        fn = dsl_compile._function("r_pattern", params, lambda frame: sorted(frame.values.items()),
                                   {"x": int} if "x" in params else {}, f"rules_{len(params)}.fxr:3")
        made[shared] = (_function_facts(fn), fn(*range(len(params))))
    assert made[True] == made[False]
    assert made[True][0][0][_CODE_FIELDS.index("co_filename")] == f"<fxrewrite rule rules_{len(params)}.fxr:3>"


def test_the_library_compiles_to_the_same_functions_with_shared_template_code_or_not(monkeypatch):
    from pathlib import Path

    from fxrewrite.dsl import compile as dsl_compile

    files = sorted((Path(__file__).resolve().parents[2] / "rules").glob("*.fxr"))
    assert files
    for path in files:
        built = {}
        for shared in (True, False):
            monkeypatch.setattr(dsl_compile, "SHARED_TEMPLATE_CODE", shared)
            rules = parse_rules(path.read_text(), source=str(path))
            built[shared] = [(r.name, _function_facts(r.pattern), _function_facts(r.replacement),
                              r.compiled.graph.python_code("self").src) for r in rules]
        assert built[True] == built[False], path.name
