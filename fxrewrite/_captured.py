"""The modules a match captured stay as they were while its replacement runs.

A module capture hands the replacement the program's own module (and unless ``rewrite`` works
on a copy, the caller's): :class:`CapturedModules` refuses an in-place write into one of its
tensors before it happens, and after the replacement finds (:meth:`~CapturedModules.check`)
and puts back (:meth:`~CapturedModules.undo`) any other change. The splicer
(:mod:`fxrewrite.replace`) turns :class:`ModuleWrite` into a ``ModuleWriteError`` naming the rule.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["CapturedModules", "DynamoWrappedModules", "ModuleWrite", "captured_modules", "written_positions"]

_UNKNOWN = object()
_SWAPPED = "its .data was replaced"


class ModuleWrite(Exception):
    """A replacement changed a module its match captured: ``label`` (``conv.weight``) and how."""

    def __init__(self, label: str, how: str) -> None:
        super().__init__(f"{label}: {how}")
        self.label, self.how = label, how


class _TensorState:
    """A captured parameter or buffer as it was: its version counter, and an alias of its data
    (no copy) that puts back a swapped ``.data``, with the address of its first element, its
    shape, strides and dtype."""

    __slots__ = ("address", "data", "dtype", "label", "shape", "stride", "tensor", "version")

    def __init__(self, label: str, tensor: torch.Tensor) -> None:
        self.label, self.tensor, self.version = label, tensor, tensor._version
        self.data = tensor.data
        self.address = _address(tensor)
        self.shape, self.stride, self.dtype = tensor.shape, tensor.stride(), tensor.dtype

    def changed(self) -> str | None:
        """How the tensor changed since, or ``None``. A swapped ``.data`` shows in the address
        of its first element, its shape, strides or dtype (also an alias of the same storage
        seen another way, which the storage's address alone would not show)."""
        t = self.tensor
        if t._version != self.version:
            return "written in place (its version counter changed)"
        if _address(t) != self.address or t.shape != self.shape or t.stride() != self.stride or t.dtype != self.dtype:
            return _SWAPPED
        return None


class _ModuleState:
    """A captured module (or one of its submodules) as it was: its public attributes and its
    parameter, buffer and submodule tables (copies of the tables, references to the values)."""

    __slots__ = ("attributes", "label", "module", "tables")

    def __init__(self, label: str, module: torch.nn.Module) -> None:
        self.label, self.module = label, module
        self.attributes = {k: v for k, v in vars(module).items() if not k.startswith("_")}
        self.tables: tuple[dict[str, Any], ...] = tuple(dict(table) for table in _tables(module))

    def changed(self) -> tuple[str, str] | None:
        """The first attribute or table entry that changed since (label, how), or ``None``."""
        own = vars(self.module)
        for key, value in self.attributes.items():
            if own.get(key, _UNKNOWN) is not value:
                return f"{self.label}.{key}", "reassigned"
        for table, before in zip(_tables(self.module), self.tables):
            if _same_table(table, before):
                continue
            changed = sorted(k for k in {*table, *before} if table.get(k, _UNKNOWN) is not before.get(k, _UNKNOWN))
            return f"{self.label}.{changed[0]}", "reassigned"
        return None

    def undo(self) -> None:
        for table, before in zip(_tables(self.module), self.tables):
            if not _same_table(table, before):
                table.clear()
                table.update(before)
        own = vars(self.module)
        for key, value in self.attributes.items():
            if own.get(key, _UNKNOWN) is not value:
                object.__setattr__(self.module, key, value)


def _same_table(table: dict[str, Any], before: dict[str, Any]) -> bool:
    return len(table) == len(before) and all(table.get(k, _UNKNOWN) is v for k, v in before.items())


def _tables(module: torch.nn.Module) -> tuple[dict[str, Any], ...]:
    return (module._parameters, module._buffers, module._modules)


#: Per op: the positions and names of the arguments it writes into (see :func:`written_positions`).
_WRITTEN: dict[Any, tuple[tuple[int, str], ...]] = {}


def written_positions(func: Any) -> tuple[tuple[int, str], ...]:
    """The arguments ``func`` (an ATen op overload) writes into, by position and name, from its
    schema (empty for an op that writes nothing); read once per op."""
    found = _WRITTEN.get(func)
    if found is None:
        schema = func._schema
        found = () if not schema.is_mutable else tuple(
            (i, argument.name) for i, argument in enumerate(schema.arguments)
            if argument.alias_info is not None and argument.alias_info.is_write)
        _WRITTEN[func] = found
    return found


class CapturedModules(TorchDispatchMode):
    """Keeps a replacement from changing the modules its match captured (they belong to the
    program, and unless ``rewrite`` works on a copy, to the caller's model).

    While the replacement runs (``with guard:``), an in-place op on one of their parameters or
    buffers is refused before it writes (:class:`ModuleWrite`); afterwards :meth:`check` compares
    what it snapshot (tensor version counters, ``.data``, attributes, parameter tables) and
    :meth:`undo` puts back anything changed. Snapshots hold references, never copies of the
    tensors. ``modules`` maps the label to report (the module's path) to the module."""

    def __init__(self, modules: dict[str, torch.nn.Module]) -> None:
        super().__init__()
        self.modules: list[_ModuleState] = []
        self.tensors: list[_TensorState] = []
        for label, module in modules.items():
            for sub_label, sub in module.named_modules(prefix=label):
                self.modules.append(_ModuleState(sub_label, sub))
                for table in (sub._parameters, sub._buffers):
                    for name, t in table.items():
                        if isinstance(t, torch.Tensor):
                            self.tensors.append(_TensorState(f"{sub_label}.{name}", t))
        self._storages: dict[int, str] | None = None

    @property
    def storages(self) -> dict[int, str]:
        """The storages of the captured tensors as they were (read from the aliases taken then, so
        a ``.data`` swapped meanwhile changes nothing), by address: asked at the first op that
        writes into an argument, which most replacements never run."""
        if self._storages is None:
            self._storages = {_storage(s.data): s.label for s in self.tensors}
            self._storages.pop(0, None)
        return self._storages

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """No ``torch._disable_dynamo`` wrapper around ``__torch_dispatch__`` (torch adds one to
        every mode class that does not say so): the guard runs while a replacement runs at rewrite
        time, where Dynamo traces nothing, and the wrapper cost ~1.5 us of each of the ~17 ops a
        conv-bn fold dispatches. :class:`DynamoWrappedModules` keeps it (the slow twin, see
        :data:`UNWRAPPED_DISPATCH`)."""
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        for i, name in written_positions(func):
            value = args[i] if i < len(args) else kwargs.get(name)
            label = self.storages.get(_storage(value)) if isinstance(value, torch.Tensor) else None
            if label is not None:
                raise ModuleWrite(label, f"written in place by {func}")
        return func(*args, **kwargs)

    def check(self) -> None:
        """Raises :class:`ModuleWrite` for the first change the replacement made."""
        for state in self.tensors:
            how = state.changed()
            if how is not None:
                raise ModuleWrite(state.label, how)
        for m in self.modules:
            found = m.changed()
            if found is not None:
                raise ModuleWrite(*found)

    def undo(self) -> None:
        """Put back every attribute, table entry and ``.data`` the replacement changed."""
        for m in self.modules:
            m.undo()
        for state in self.tensors:
            if state.changed() == _SWAPPED:
                with torch.no_grad():
                    state.tensor.data = state.data


class DynamoWrappedModules(CapturedModules):
    """:class:`CapturedModules` with torch's ``torch._disable_dynamo`` wrapper around
    ``__torch_dispatch__`` (the slow twin of :data:`UNWRAPPED_DISPATCH`)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return True

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return CapturedModules.__torch_dispatch__(self, func, types, args, kwargs)


#: Guard with :class:`CapturedModules` (no Dynamo wrapper around its dispatch); ``False``: with
#: :class:`DynamoWrappedModules` (``tests/test_captured.py`` checks both refuse and undo alike).
UNWRAPPED_DISPATCH = True


def captured_modules(modules: dict[str, torch.nn.Module]) -> CapturedModules:
    """The guard for ``modules`` (see :class:`CapturedModules` and :data:`UNWRAPPED_DISPATCH`)."""
    return (CapturedModules if UNWRAPPED_DISPATCH else DynamoWrappedModules)(modules)


def _address(t: torch.Tensor) -> int:
    """The address of a tensor's first element (0 when it has none: fake and meta tensors)."""
    try:
        return int(t.data_ptr())
    except Exception:
        return 0


def _storage(t: Any) -> int:
    """The address of a tensor's storage (0 when it has none: fake and meta tensors)."""
    try:
        return int(t.untyped_storage().data_ptr())
    except Exception:
        return 0
