"""The guard that keeps a replacement from changing the modules its match captured
(``fxrewrite._captured``); end to end in tests/e2e/test_module_writes.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fxrewrite._captured as captured
from fxrewrite._captured import CapturedModules, DynamoWrappedModules, ModuleWrite, captured_modules, written_positions


def _schema_scan(func):
    """The slow twin of ``written_positions``: the schema read at every call."""
    if not func._schema.is_mutable:
        return ()
    return tuple((i, a.name) for i, a in enumerate(func._schema.arguments)
                 if a.alias_info is not None and a.alias_info.is_write)


@pytest.mark.parametrize("func", [torch.ops.aten.add.Tensor, torch.ops.aten.add_.Tensor, torch.ops.aten.add.out,
                                  torch.ops.aten.copy_.default, torch.ops.aten.native_batch_norm.default,
                                  torch.ops.aten._native_batch_norm_legit.default, torch.ops.aten.clone.default])
def test_written_positions_are_what_the_schema_says_and_asked_twice_the_same(func):
    assert written_positions(func) == _schema_scan(func) == written_positions(func)


def test_written_positions_of_the_ops_that_write():
    assert written_positions(torch.ops.aten.add_.Tensor) == ((0, "self"),)
    assert written_positions(torch.ops.aten.add.out) == ((3, "out"),)
    assert written_positions(torch.ops.aten.add.Tensor) == ()


@pytest.fixture(autouse=True, params=[True, False], ids=["unwrapped", "dynamo-wrapped"])
def _dispatch(request, monkeypatch):
    """Every guard test runs with the guard ``rewrite`` uses and with its slow twin (torch's
    Dynamo wrapper around ``__torch_dispatch__``, :data:`~fxrewrite._captured.UNWRAPPED_DISPATCH`)."""
    monkeypatch.setattr(captured, "UNWRAPPED_DISPATCH", request.param)
    return request.param


def _captured():
    torch.manual_seed(0)
    conv, bn = nn.Conv2d(2, 2, 1), nn.BatchNorm2d(2).eval()
    return conv, bn, captured_modules({"conv": conv, "bn": bn})


def test_the_guard_is_the_unwrapped_class_and_its_slow_twin_the_wrapped_one(_dispatch):
    guard = _captured()[2]
    assert type(guard) is (CapturedModules if _dispatch else DynamoWrappedModules)
    assert hasattr(vars(DynamoWrappedModules)["__torch_dispatch__"], "__wrapped__")  # torch's wrapper
    assert not hasattr(vars(CapturedModules)["__torch_dispatch__"], "__wrapped__")


@pytest.mark.parametrize("write", [lambda conv, bn: conv.weight.data.mul_(2),
                                   lambda conv, bn: conv.weight.detach()[0].zero_(),
                                   lambda conv, bn: bn.running_mean.add_(1),
                                   lambda conv, bn: torch.add(conv.bias.detach(), 1, out=conv.bias.detach()),
                                   lambda conv, bn: nn.BatchNorm2d.train(bn)(torch.ones(2, 2, 1, 1))],
                         ids=["weight", "a view of it", "a buffer", "out=", "batch norm in training"])
def test_an_in_place_write_into_a_captured_tensor_is_refused_before_it_writes(write):
    conv, bn, guard = _captured()
    before = [t.clone() for t in (*conv.parameters(), *bn.buffers())]
    with pytest.raises(ModuleWrite), guard:
        write(conv, bn)
    for old, new in zip(before, (*conv.parameters(), *bn.buffers())):
        torch.testing.assert_close(old, new, rtol=0, atol=0)


def test_writes_into_other_tensors_and_reads_pass_and_check_finds_nothing():
    conv, _bn, guard = _captured()
    with guard:
        fresh = conv.weight.detach().clone()
        fresh.mul_(2)
        _ = conv(torch.ones(1, 2, 1, 1))
    guard.check()


def _reassign_weight(conv, bn):
    conv.weight = nn.Parameter(conv.weight.detach() * 2)


def _swap_data(conv, bn):
    conv.weight.data = torch.zeros(2, 2, 1, 1)


def _transpose_data(conv, bn):
    conv.weight.data = conv.weight.data.view(2, 2).t().reshape(2, 2, 1, 1)  # the same storage, seen transposed


def _set_attribute(conv, bn):
    bn.eps = 1.0


def _drop_buffer(conv, bn):
    del bn._buffers["running_var"]


def _add_submodule(conv, bn):
    conv.extra = nn.ReLU()


@pytest.mark.parametrize(("change", "label", "how"), [
    (_reassign_weight, "conv.weight", "reassigned"),
    (_swap_data, "conv.weight", "its .data was replaced"),
    (_transpose_data, "conv.weight", "its .data was replaced"),
    (_set_attribute, "bn.eps", "reassigned"),
    (_drop_buffer, "bn.running_var", "reassigned"),
    (_add_submodule, "conv.extra", "reassigned"),
])
def test_check_names_the_change_and_undo_puts_the_module_back(change, label, how):
    conv, bn, guard = _captured()
    state = (dict(conv._parameters), dict(bn._buffers), dict(conv._modules), bn.eps, _geometry(conv.weight),
             _geometry(bn.running_mean))
    change(conv, bn)
    with pytest.raises(ModuleWrite) as info:
        guard.check()
    assert (info.value.label, info.value.how) == (label, how)
    guard.undo()
    guard.check()
    assert state == (dict(conv._parameters), dict(bn._buffers), dict(conv._modules), bn.eps, _geometry(conv.weight),
                     _geometry(bn.running_mean))


def _geometry(t):
    return t.data_ptr(), t.untyped_storage().data_ptr(), t.shape, t.stride()


def test_a_write_into_the_original_storage_after_a_data_swap_is_refused():
    """The storages refused are those the tensors had at the snapshot (the map is built at the
    first writing op, from the aliases taken then): swapping ``.data`` first does not let a write
    through a kept alias into the program's own storage."""
    conv, _bn, guard = _captured()
    before = conv.weight.detach().clone()
    with pytest.raises(ModuleWrite) as info, guard:
        kept = conv.weight.data
        conv.weight.data = torch.zeros(2, 2, 1, 1)
        kept.mul_(2)
    assert info.value.label == "conv.weight"
    guard.undo()
    torch.testing.assert_close(conv.weight.detach(), before, rtol=0, atol=0)
