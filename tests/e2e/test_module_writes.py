"""A replacement never writes into the modules its match captured (replace.py's guard).

The case that found the hole: a Conv+BN fold whose replacement folds into the captured conv's
own weight (``conv.weight.mul_(...)``), on a model that calls one ``Conv2d`` at two places, each
followed by its own BatchNorm. Before the guard the rewrite was wrong (max diff ~0.7) and the
caller's model was changed too. Now such a write is an error naming the rule, the module and
the tensor, it is undone, and the caller's model is bit-identical afterwards, in copying mode
and with ``inplace=True``. A fold that does not write but captures a conv called at several
places is refused (with the reason in the report).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Annotated, Any

import pytest
import torch
import torch.fx as fx
from _helpers import assert_rewrite_sound
from torch import nn

import fxrewrite
import fxrewrite._captured as captured
from fxrewrite.errors import ModuleWriteError, RewriteError
from fxrewrite.testing.strategies import default_module


def _randomized_bn(channels: int) -> nn.Module:
    """An eval-mode BatchNorm2d with random statistics and affine parameters."""
    bn = default_module(nn.BatchNorm2d, width=channels, kernel=1, bias=True)
    assert bn is not None
    return bn


class SharedConv(nn.Module):
    """One Conv2d called at two places, each call followed by its own BatchNorm."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn1, self.bn2 = _randomized_bn(4), _randomized_bn(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn1(self.conv(x)) + self.bn2(self.conv(x * 2))


class SingleConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = _randomized_bn(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


def pattern(x, conv: nn.Conv2d, bn: nn.BatchNorm2d):
    return bn(conv(x))


def _scale(bn: nn.BatchNorm2d) -> torch.Tensor:
    return (bn.weight / torch.sqrt(bn.running_var + bn.eps)).detach()


def fold_in_place(x, conv: nn.Conv2d, bn: nn.BatchNorm2d):
    """The buggy fold: writes the folded weights into the captured conv itself."""
    scale = _scale(bn)
    with torch.no_grad():
        conv.weight.mul_(scale.reshape(-1, 1, 1, 1))
        conv.bias.copy_((conv.bias - bn.running_mean) * scale + bn.bias)
    return conv(x)


def swap_data(x, conv: nn.Conv2d, bn: nn.BatchNorm2d):
    conv.weight.data = conv.weight.data * _scale(bn).reshape(-1, 1, 1, 1)
    return conv(x)


def reassign_parameter(x, conv: nn.Conv2d, bn: nn.BatchNorm2d):
    conv.weight = nn.Parameter(conv.weight.detach() * _scale(bn).reshape(-1, 1, 1, 1))
    return conv(x)


def reassign_attribute(x, conv: nn.Conv2d, bn: nn.BatchNorm2d):
    conv.padding = (0, 0)
    return conv(x)


def write_through_data(x, conv: nn.Conv2d, bn: nn.BatchNorm2d):
    conv.weight.data.mul_(2.0)  # .data has its own version counter: the storage still tells
    return conv(x)


def write_bn_buffer(x, conv: nn.Conv2d, bn: nn.BatchNorm2d):
    bn.running_mean.zero_()
    return bn(conv(x))


def shadow_forward(x, conv: nn.Conv2d, bn: nn.BatchNorm2d):
    """An instance attribute ``forward``: every call of the caller's conv would return zeros."""
    conv.forward = lambda t: t * 0
    return conv(x)


def hook_the_conv(x, conv: nn.Conv2d, bn: nn.BatchNorm2d):
    """A hook left on the caller's conv: every call of it would be scaled."""
    conv.register_forward_hook(lambda module, args, out: out * _scale(bn).reshape(-1, 1, 1))
    return bn(conv(x))


def fold_into_copy(x, conv: nn.Conv2d, bn: nn.BatchNorm2d):
    """The right fold: a new conv with the folded weights."""
    fused = copy.deepcopy(conv)
    scale = _scale(bn)
    with torch.no_grad():
        fused.weight.mul_(scale.reshape(-1, 1, 1, 1))
        fused.bias.copy_((conv.bias - bn.running_mean) * scale + bn.bias)
    return fused(x)


def _rule(replacement: Callable[..., Any]) -> fxrewrite.Rule:
    return fxrewrite.Rule.from_functions(pattern, replacement, name=replacement.__name__)


def _snapshot(model: nn.Module) -> dict[str, Any]:
    return {
        "state": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "objects": {k: id(v) for k, v in (*model.named_parameters(), *model.named_buffers())},
        "versions": {k: v._version for k, v in (*model.named_parameters(), *model.named_buffers())},
        "attributes": {name: {k: v for k, v in vars(m).items() if not k.startswith("_")}
                       for name, m in model.named_modules()},
        "hooks": {name: [list(hooks) for hooks in (m._forward_hooks, m._forward_pre_hooks)]
                  for name, m in model.named_modules()},
    }


def _assert_bit_identical(model: nn.Module, before: dict[str, Any]) -> None:
    after = _snapshot(model)
    assert after["objects"] == before["objects"]
    assert after["versions"] == before["versions"]
    for name, tensor in after["state"].items():
        assert torch.equal(tensor, before["state"][name]), f"{name} changed"
        assert tensor.dtype == before["state"][name].dtype
    assert after["attributes"] == before["attributes"]
    assert after["hooks"] == before["hooks"]


X = torch.randn(2, 3, 5, 5)


@pytest.fixture(autouse=True, params=[True, False], ids=["snapshot", "intercepted"])
def snapshot(request, monkeypatch):
    """Every scenario runs with the guard ``rewrite`` picks for these small modules (the
    snapshot) and with its slow twin (the dispatch mode, :data:`fxrewrite._captured.SNAPSHOT`)."""
    monkeypatch.setattr(captured, "SNAPSHOT", request.param)
    return request.param


def test_fold_into_a_shared_conv_is_an_error_and_the_callers_model_is_bit_identical(snapshot):
    model = SharedConv().eval()
    before = _snapshot(model)
    with torch.no_grad():
        expected = model(X)
    with pytest.raises(ModuleWriteError) as info:
        fxrewrite.rewrite(model, _rule(fold_in_place))
    message = str(info.value)
    assert "rule 'fold_in_place'" in message
    assert "'conv.weight'" in message and "written in place" in message
    assert snapshot or "aten.mul_" in message  # the dispatch mode refuses the op before it writes
    assert "copy.deepcopy(conv)" in message
    _assert_bit_identical(model, before)
    with torch.no_grad():
        torch.testing.assert_close(model(X), expected, rtol=0, atol=0)


def test_module_write_error_is_a_rewrite_error():
    assert issubclass(ModuleWriteError, RewriteError) and issubclass(ModuleWriteError, RuntimeError)


@pytest.mark.parametrize(("replacement", "label", "how"), [
    (fold_in_place, "'conv.weight'", "written in place"),
    (swap_data, "'conv.weight'", "its .data was replaced"),
    (reassign_parameter, "'conv.weight'", "reassigned"),
    (reassign_attribute, "'conv.padding'", "reassigned"),
    (write_through_data, "'conv.weight'", "written"),
    (write_bn_buffer, "'bn.running_mean'", "written in place"),
    (shadow_forward, "'conv.forward'", "added"),
    (hook_the_conv, "'conv._forward_hooks'", "a hook was registered"),
])
def test_every_kind_of_write_is_refused_named_and_undone(replacement, label, how):
    model = SingleConv().eval()
    before = _snapshot(model)
    with pytest.raises(ModuleWriteError, match=f"rule '{replacement.__name__}'") as info:
        fxrewrite.rewrite(model, _rule(replacement))
    assert label in str(info.value) and how in str(info.value)
    _assert_bit_identical(model, before)


def test_inplace_rewrite_of_a_graph_module_leaves_graph_and_modules_as_they_were():
    gm = fx.symbolic_trace(SharedConv().eval())
    code, before = gm.code, _snapshot(gm)
    with pytest.raises(ModuleWriteError):
        fxrewrite.rewrite(gm, _rule(fold_in_place), inplace=True)
    gm.graph.lint()
    _assert_bit_identical(gm, before)
    assert gm.code == code
    assert [n.target for n in gm.graph.nodes if n.op == "call_module"] == ["conv", "bn1", "conv", "bn2"]


def test_a_fold_into_a_new_module_is_applied_and_computes_the_same():
    model = SingleConv().eval()
    before = _snapshot(model)
    result = fxrewrite.rewrite(model, _rule(fold_into_copy))
    assert result.report.applied["fold_into_copy"] == 1
    assert_rewrite_sound(model, result, X, rtol=1e-5, atol=1e-5)
    _assert_bit_identical(model, before)


def test_a_conv_called_at_two_places_is_not_handed_to_a_fold():
    model = SharedConv().eval()
    result = fxrewrite.rewrite(model, _rule(fold_into_copy))
    assert result.report.applied["fold_into_copy"] == 0
    reason = result.report.reasons["fold_into_copy"][0]
    assert "'conv'" in reason and "2 places" in reason and "Accept(shared=True)" in reason
    assert_rewrite_sound(model, result, X)


def test_reading_a_captured_module_in_a_replacement_is_not_a_write():
    def read_only(x, conv: nn.Conv2d, bn: nn.BatchNorm2d):
        _ = conv.weight.sum() + bn.running_var.max()  # computing from the module's tensors is fine
        return torch.nn.functional.batch_norm(conv(x), bn.running_mean, bn.running_var, bn.weight, bn.bias,
                                              False, 0.0, bn.eps)

    model = SingleConv().eval()
    result = fxrewrite.rewrite(model, _rule(read_only))
    assert result.report.applied["read_only"] == 1
    assert_rewrite_sound(model, result, X)


def test_a_capture_that_accepts_a_shared_module_is_handed_it_at_each_place():
    def shared_pattern(x, conv: Annotated[nn.Conv2d, fxrewrite.Accept(shared=True)], bn: nn.BatchNorm2d):
        return bn(conv(x))

    def shared_fold(x, conv: Annotated[nn.Conv2d, fxrewrite.Accept(shared=True)], bn: nn.BatchNorm2d):
        return fold_into_copy(x, conv, bn)

    model = SharedConv().eval()
    before = _snapshot(model)
    rule = fxrewrite.Rule.from_functions(shared_pattern, shared_fold, name="shared_fold")
    result = fxrewrite.rewrite(model, rule)
    assert result.report.applied["shared_fold"] == 2  # each call gets its own folded copy
    assert_rewrite_sound(model, result, X, rtol=1e-5, atol=1e-5)
    _assert_bit_identical(model, before)


def test_rewrite_guards_small_captures_with_the_snapshot_and_its_twin_with_the_dispatch_mode(snapshot, monkeypatch):
    built: list[str] = []
    for cls in (captured.SnapshotModules, captured.InterceptedModules):
        monkeypatch.setattr(cls, "__init__", _counting(cls.__init__, cls.__name__, built))
    result = fxrewrite.rewrite(SingleConv().eval(), _rule(fold_into_copy))
    assert result.report.applied["fold_into_copy"] == 1
    assert built == ["SnapshotModules" if snapshot else "InterceptedModules"]


def _counting(init: Callable[..., None], name: str, built: list[str]) -> Callable[..., None]:
    def counted(self: Any, *args: Any, **kwargs: Any) -> None:
        if type(self).__name__ == name:
            built.append(name)
        init(self, *args, **kwargs)
    return counted


def test_a_model_built_in_inference_mode_is_folded_and_a_write_into_it_refused():
    """Inference tensors keep no version counter: the guard does without it."""
    with torch.inference_mode():
        model = SingleConv().eval()
    result = fxrewrite.rewrite(model, _rule(fold_into_copy))
    assert result.report.applied["fold_into_copy"] == 1
    with torch.inference_mode():
        assert_rewrite_sound(model, result, X, rtol=1e-5, atol=1e-5)

    def fold_in_inference_mode(x, conv: nn.Conv2d, bn: nn.BatchNorm2d):
        with torch.inference_mode():
            conv.weight.mul_(2)
        return conv(x)

    before = model.conv.weight.detach().clone()
    with pytest.raises(ModuleWriteError, match=r"'conv\.weight'"):
        fxrewrite.rewrite(model, _rule(fold_in_inference_mode))
    assert torch.equal(model.conv.weight.detach(), before)
