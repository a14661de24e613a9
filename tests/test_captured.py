"""The guard that keeps a replacement from changing the modules its match captured
(``fxrewrite._captured``); end to end in tests/e2e/test_module_writes.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fxrewrite._captured as captured
from fxrewrite._captured import (
    DynamoWrappedModules,
    InterceptedModules,
    ModuleWrite,
    SnapshotModules,
    captured_modules,
    written_positions,
)


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


#: The guards, by the flags that pick them: the snapshot (the fast path), the dispatch mode
#: without Dynamo's wrapper (its slow twin, and the guard of large captures), and with it.
GUARDS = {"snapshot": (True, True, SnapshotModules), "intercepted": (False, True, InterceptedModules),
          "dynamo-wrapped": (False, False, DynamoWrappedModules)}


@pytest.fixture(autouse=True, params=list(GUARDS))
def kind(request, monkeypatch):
    """Every guard test runs with each guard (:data:`~fxrewrite._captured.SNAPSHOT`,
    :data:`~fxrewrite._captured.UNWRAPPED_DISPATCH`): they must refuse and undo alike."""
    snapshot, unwrapped, _ = GUARDS[request.param]
    monkeypatch.setattr(captured, "SNAPSHOT", snapshot)
    monkeypatch.setattr(captured, "UNWRAPPED_DISPATCH", unwrapped)
    return request.param


def _captured():
    torch.manual_seed(0)
    conv, bn = nn.Conv2d(2, 2, 1), nn.BatchNorm2d(2).eval()
    return conv, bn, captured_modules({"conv": conv, "bn": bn})


def test_the_flags_pick_the_guard(kind):
    guard = _captured()[2]
    assert type(guard) is GUARDS[kind][2]
    assert hasattr(vars(DynamoWrappedModules)["__torch_dispatch__"], "__wrapped__")  # torch's wrapper
    assert not hasattr(vars(InterceptedModules)["__torch_dispatch__"], "__wrapped__")


def test_a_capture_over_the_budget_is_intercepted(kind, monkeypatch):
    monkeypatch.setattr(captured, "SNAPSHOT_BUDGET", 8 * 4 - 1)  # the conv's 6 floats fit, with bn's 18 not
    conv, bn = nn.Conv2d(2, 2, 1), nn.BatchNorm2d(2)
    assert type(captured_modules({"conv": conv})) is GUARDS[kind][2]
    assert isinstance(captured_modules({"conv": conv, "bn": bn}), InterceptedModules)


class _Subclass(torch.Tensor):
    pass


def _with_buffer(value):
    module = nn.Module()
    module.register_buffer("b", value)
    return module


@pytest.mark.parametrize("make", [lambda: nn.Conv2d(2, 2, 1, device="meta"),
                                  lambda: _with_buffer(torch.ones(2).as_subclass(_Subclass)),
                                  lambda: _with_buffer(torch.ones(2, dtype=torch.complex64).conj())],
                         ids=["meta", "subclass", "conjugate view"])
def test_tensors_whose_bytes_cannot_be_copied_are_intercepted(make):
    assert isinstance(captured_modules({"m": make()}), InterceptedModules)


def test_a_tensor_seeing_part_of_its_storage_is_intercepted_and_a_write_into_the_rest_refused(kind):
    """The dispatch mode guards a captured tensor's whole storage; a copy of the tensor's bytes
    would guard only the part it sees, so such captures are never snapshot."""
    flat = torch.zeros(8)
    lin = nn.Linear(2, 2, bias=False)
    lin.weight = nn.Parameter(flat[:4].view(2, 2))
    guard = captured_modules({"lin": lin})
    assert isinstance(guard, InterceptedModules)
    with pytest.raises(ModuleWrite) as info, guard:
        flat[4:].add_(1)
    assert info.value.label == "lin.weight"
    assert torch.equal(flat, torch.zeros(8))


def test_a_snapshot_copies_dtypes_numpy_lacks_as_integers_of_their_size(kind):
    lin = nn.Linear(3, 3).to(torch.bfloat16)
    guard = captured_modules({"lin": lin})
    assert type(guard) is GUARDS[kind][2]
    before = _state(lin)
    with pytest.raises(ModuleWrite) as info, guard:
        lin.weight.data[0, 0] = 7.0
        guard.check()  # the snapshot finds it here, the dispatch mode at the write
    assert info.value.label == "lin.weight"
    guard.undo()
    assert _state(lin) == before


def test_writes_into_other_tensors_and_reads_pass_and_check_finds_nothing():
    conv, _bn, guard = _captured()
    with guard:
        fresh = conv.weight.detach().clone()
        fresh.mul_(2)
        _ = conv(torch.ones(1, 2, 1, 1))
    guard.check()


# -- the differential test: every guard refuses the same writes and leaves the model bit-identical --


class _Model(nn.Module):
    """A conv and a BatchNorm, and a linear layer whose weight ``tied`` shares; the bias holds
    ``-0.0`` and the weight a NaN with a payload (bit-identical means those too)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv, self.bn = nn.Conv2d(2, 2, 1), nn.BatchNorm2d(2).eval()
        self.lin, self.tied = nn.Linear(2, 2), nn.Linear(2, 2, bias=False)
        self.tied.weight = self.lin.weight
        with torch.no_grad():
            self.conv.bias[0] = -0.0
            self.conv.weight.view(-1).view(torch.int32)[1] = 0x7FC00123  # a NaN with a payload


def _state(model: nn.Module) -> dict[str, object]:
    """Everything the caller could tell apart: each tensor's bytes, object, version counter,
    address and geometry, and each module's class, public attributes, tables, hook tables and
    set of non-persistent buffers."""
    return {
        "tensors": {name: (t.detach().numpy().tobytes() if t.dtype != torch.bfloat16 else
                           t.detach().view(torch.int16).numpy().tobytes(),
                           id(t), t._version, t.data_ptr(), t.shape, t.stride(), t.dtype)
                    for name, t in (*model.named_parameters(remove_duplicate=False),
                                    *model.named_buffers(remove_duplicate=False))},
        "modules": {name: (type(m), {k: v for k, v in vars(m).items() if not k.startswith("_")},
                           dict(m._parameters), dict(m._buffers), dict(m._modules),
                           {k: (list(v.items()) if isinstance(v, dict) else sorted(v)) for k, v in vars(m).items()
                            if isinstance(v, (dict, set)) and ("hook" in k or k.endswith("_set"))})
                    for name, m in model.named_modules()},
    }


def _swap(m):
    m.conv.weight.data = torch.zeros(2, 2, 1, 1)


def _transpose(m):
    m.conv.weight.data = m.conv.weight.data.view(2, 2).t().reshape(2, 2, 1, 1)  # the same storage, seen transposed


def _set(m):
    with torch.no_grad():
        m.conv.weight.set_(torch.zeros(2, 2, 1, 1))


def _reassign(m):
    m.conv.weight = nn.Parameter(m.conv.weight.detach() * 2)


def _set_attribute(m):
    m.bn.eps = 1.0


def _drop_buffer(m):
    del m.bn._buffers["running_var"]


def _add_submodule(m):
    m.conv.extra = nn.ReLU()


def _no_grad(write):
    def run(m):
        with torch.no_grad():
            write(m)
    return run


#: (write, the label every guard reports, how the snapshot says it changed): in place, through
#: ``.data`` (a version counter of its own), a view, a tied weight written through the other
#: module, ``set_``, a ``.data`` swap, reassignments, buffers, ``-0.0`` and a NaN's payload.
WRITES = {
    "in place": (_no_grad(lambda m: m.conv.weight.mul_(2)), "conv.weight", "written in place"),
    "through .data": (lambda m: m.conv.weight.data.mul_(2), "conv.weight", "its values changed"),
    "a view": (lambda m: m.conv.weight.detach()[0].zero_(), "conv.weight", "written in place"),
    "tied weight": (_no_grad(lambda m: m.tied.weight.add_(1)), "lin.weight", "written in place"),
    "tied, through .data": (lambda m: m.tied.weight.data.add_(1), "lin.weight", "its values changed"),
    "set_": (_set, "conv.weight", "written in place"),
    ".data swapped": (_swap, "conv.weight", "its .data was replaced"),
    ".data transposed": (_transpose, "conv.weight", "its .data was replaced"),
    "parameter reassigned": (_reassign, "conv.weight", "reassigned"),
    "attribute": (_set_attribute, "bn.eps", "reassigned"),
    "buffer dropped": (_drop_buffer, "bn.running_var", "reassigned"),
    "submodule added": (_add_submodule, "conv.extra", "reassigned"),
    "buffer": (lambda m: m.bn.running_mean.add_(1), "bn.running_mean", "written in place"),
    "num_batches_tracked": (lambda m: m.bn.num_batches_tracked.add_(1), "bn.num_batches_tracked",
                            "written in place"),
    "-0.0 to 0.0": (lambda m: m.conv.bias.data.abs_(), "conv.bias", "its values changed"),
    "NaN payload": (lambda m: m.conv.weight.data.view(-1)[1:2].copy_(torch.tensor([float("nan")])), "conv.weight",
                    "its values changed"),
    "out=": (lambda m: torch.add(m.conv.bias.detach(), 1, out=m.conv.bias.detach()), "conv.bias",
             "written in place"),
}


@pytest.mark.parametrize("case", list(WRITES))
def test_every_guard_refuses_the_write_names_the_tensor_and_undo_leaves_the_model_bit_identical(kind, case):
    write, label, how = WRITES[case]
    model = _Model()
    before = _state(model)
    guard = captured_modules({"conv": model.conv, "bn": model.bn, "lin": model.lin})
    assert type(guard) is GUARDS[kind][2]
    with pytest.raises(ModuleWrite) as info:
        with guard:
            write(model)
        guard.check()
    guard.undo()
    guard.check()
    assert info.value.label == label
    if kind == "snapshot" or "reassigned" in how or "replaced" in how:
        assert how in info.value.how
    else:  # refused before it wrote, naming the op
        assert info.value.how.startswith("written in place by aten.")
    assert _state(model) == before


def test_batch_norm_run_in_training_is_refused_and_undone(kind):
    model = _Model()
    before = _state(model)
    guard = captured_modules({"bn": model.bn})
    with pytest.raises(ModuleWrite) as info:
        with guard:
            model.bn.train()(torch.ones(2, 2, 1, 1))
        guard.check()
    guard.undo()
    assert info.value.label in {"bn.running_mean", "bn.running_var", "bn.num_batches_tracked"}
    assert _state(model) == before


def test_a_write_the_dispatch_mode_cannot_see_is_found_by_the_snapshot(kind):
    """A write through numpy runs no ATen op: only the snapshot finds it (and undoes it)."""
    model = _Model()
    before = _state(model)
    guard = captured_modules({"conv": model.conv})
    with guard:
        model.conv.weight.detach().numpy()[0, 0, 0, 0] = 5.0
    if kind != "snapshot":
        guard.check()  # the limit of the slow twin: large captures are not copied
        return
    with pytest.raises(ModuleWrite, match="its values changed"):
        guard.check()
    guard.undo()
    assert _state(model) == before


def test_a_write_caught_by_the_replacement_is_still_found(kind):
    """The dispatch mode refuses before the write, so a replacement swallowing its error wrote
    nothing; the snapshot lets it write and ``check`` finds it: either way the model is intact."""
    model = _Model()
    before = _state(model)
    guard = captured_modules({"conv": model.conv})
    with guard:
        try:
            with torch.no_grad():
                model.conv.weight.mul_(2)
        except ModuleWrite:
            pass
    if kind == "snapshot":
        with pytest.raises(ModuleWrite):
            guard.check()
        guard.undo()
    guard.check()
    assert _state(model) == before


def test_a_write_into_the_original_storage_after_a_data_swap_is_refused():
    """The storages guarded are those the tensors had when the guard was built (the dispatch
    mode's map is built at the first writing op, from the aliases taken then; the snapshot
    compares the original storage): swapping ``.data`` first does not let a write through a
    kept alias into the program's own storage."""
    conv, _bn, guard = _captured()
    before = conv.weight.detach().clone()
    with pytest.raises(ModuleWrite) as info:
        with guard:
            kept = conv.weight.data
            conv.weight.data = torch.zeros(2, 2, 1, 1)
            kept.mul_(2)
        guard.check()
    assert info.value.label == "conv.weight"
    guard.undo()
    torch.testing.assert_close(conv.weight.detach(), before, rtol=0, atol=0)
    guard.check()


def test_inference_tensors_have_no_version_counter_and_a_write_into_them_is_still_refused_and_undone(kind):
    """A model built under ``torch.inference_mode`` (its tensors keep no version counter, and
    asking for one raises): the guard is built, and a write made in inference mode is found by
    its values (snapshot) or refused (dispatch mode), and undone."""
    with torch.inference_mode():
        conv = nn.Conv2d(2, 2, 1)
    before = conv.weight.detach().clone()
    guard = captured_modules({"conv": conv})
    assert type(guard) is GUARDS[kind][2]
    guard.check()
    with pytest.raises(ModuleWrite) as info:
        with guard, torch.inference_mode():
            conv.weight.mul_(2)
        guard.check()
    guard.undo()
    guard.check()
    assert info.value.label == "conv.weight"
    assert torch.equal(conv.weight.detach(), before)


# -- module attributes compared all at once first (ATTRIBUTES_AT_ONCE) and one by one: the same reports --


def _delete_and_restore_eps(m):
    eps = m.bn.eps
    del m.bn.eps
    m.bn.eps = eps  # the same object, the dict's order changed


def _rename_eps_in_place(m):
    own = vars(m.bn)
    items = list(own.items())
    own.clear()
    own.update((key if key != "eps" else "eps_renamed", value) for key, value in items)  # the same values, in order


def _reassign_private(m):
    object.__setattr__(m.bn, "_forward_hooks", type(m.bn._forward_hooks)())


def _delete_eps(m):
    del m.bn.eps


def _same_eps(m):
    m.bn.eps = m.bn.eps


def _add_attribute(m):
    m.bn.note = "new"


def _shadow_forward(m):
    m.conv.forward = lambda x: x * 0  # an instance attribute: every call of the program's conv now returns zeros


def _register_forward_hook(m):
    m.conv.register_forward_hook(lambda module, args, out: out * 0)


def _register_pre_hook(m):
    m.bn.register_forward_pre_hook(lambda module, args: (args[0] * 0,))


def _register_state_dict_hook(m):
    m.bn._register_state_dict_hook(lambda *args: None)


def _remove_hook(m):
    m.handle.remove()  # a hook the module held when it was captured


def _remove_hook_and_register_backward_hook(m):
    m.handle.remove()  # _forward_hooks: held a hook when captured
    m.bn.register_full_backward_hook(lambda *args: None)  # _backward_hooks: empty then, and first in bn's dict


_remove_hook.needs_hook = _remove_hook_and_register_backward_hook.needs_hook = True  # bn holds one when captured


def _make_buffer_non_persistent(m):
    m.bn._non_persistent_buffers_set.add("running_mean")  # the caller's state_dict() would lose it


class _OtherConv(nn.Conv2d):
    def forward(self, x):
        return x * 0


def _reassign_class(m):
    m.conv.__class__ = _OtherConv


def _add_private(m):
    object.__setattr__(m.bn, "_cache_of_mine", 1)  # torch's business (caches it may keep): not reported


def _nothing(m):
    pass


#: A change to a captured module's attributes, and the label reported for it (``None``: none).
ATTRIBUTE_CHANGES = {
    "public reassigned": (_set_attribute, "bn.eps"),
    "public deleted": (_delete_eps, "bn.eps"),
    "training flipped": (lambda m: m.bn.train(), "bn.training"),
    "renamed where it was": (_rename_eps_in_place, "bn.eps"),
    "deleted and set again to the same object": (_delete_and_restore_eps, None),
    "set to the same object": (_same_eps, None),
    "private reassigned": (_reassign_private, None),
    "public added": (_add_attribute, "bn.note"),
    "forward shadowed by an instance attribute": (_shadow_forward, "conv.forward"),
    "forward hook registered": (_register_forward_hook, "conv._forward_hooks"),
    "pre-hook registered": (_register_pre_hook, "bn._forward_pre_hooks"),
    "state-dict hook registered": (_register_state_dict_hook, "bn._state_dict_hooks"),
    "a hook it held removed": (_remove_hook, "bn._forward_hooks"),
    "two hook tables changed: the first in the module's order is named":
        (_remove_hook_and_register_backward_hook, "bn._backward_hooks"),
    "buffer made non-persistent": (_make_buffer_non_persistent, "bn._non_persistent_buffers_set"),
    "class reassigned": (_reassign_class, "conv.__class__"),
    "private added": (_add_private, None),
    "submodule added": (_add_submodule, "conv.extra"),
    "nothing": (_nothing, None),
}


def _report_and_undo(change):
    """What the guard reports of ``change``, and whether undoing it left the model as it was."""
    model = _Model()
    if getattr(change, "needs_hook", False):
        model.handle = model.bn.register_forward_hook(lambda module, args, out: None)
    before = _state(model)
    guard = captured_modules({"conv": model.conv, "bn": model.bn})
    with guard:
        change(model)
    try:
        guard.check()
        reported = None
    except ModuleWrite as exc:
        reported = (exc.label, exc.how)
    guard.undo()
    return reported, _state(model) == before


@pytest.mark.parametrize("case", list(ATTRIBUTE_CHANGES))
def test_attributes_compared_at_once_report_and_undo_what_one_by_one_does(case, monkeypatch):
    change, label = ATTRIBUTE_CHANGES[case]
    results = {}
    for at_once in (True, False):
        monkeypatch.setattr(captured, "ATTRIBUTES_AT_ONCE", at_once)
        results[at_once] = _report_and_undo(change)
    assert results[True] == results[False]
    reported, undone = results[True]
    assert (reported and reported[0]) == label
    assert undone
