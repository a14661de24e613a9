"""The modules a match captured stay as they were while its replacement runs.

A module capture hands the replacement the program's own module (and unless ``rewrite`` works
on a copy, the caller's). The guard :func:`captured_modules` builds for a match snapshots those
modules before the replacement runs; afterwards :meth:`~CapturedModules.check` finds any change
the replacement made and :meth:`~CapturedModules.undo` puts everything back, bit for bit and
version counters included. Two ways to guard, picked per match:

* :class:`SnapshotModules` (captures whose tensors hold at most :data:`SNAPSHOT_BUDGET` bytes in all,
  the usual conv, linear and norm layers): copies the tensors' bytes; ``check`` compares them.
  Nothing intercepts the ops the replacement runs (a dispatch mode costs a conv-bn fold ~100 µs:
  Python dispatch of each of its ~17 ops); a write happens and is found and undone afterwards.
* :class:`InterceptedModules` (larger captures, tensors it cannot copy as bytes, and
  :data:`SNAPSHOT` off: its slow twin): a ``TorchDispatchMode`` refusing an in-place write into
  a captured storage before it writes, with the op's name; no copy of a large model's weights.

The splicer (:mod:`fxrewrite.replace`) turns :class:`ModuleWrite` into a ``ModuleWriteError``
naming the rule.
"""

from __future__ import annotations

import collections
import operator
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["SNAPSHOT", "SNAPSHOT_BUDGET", "CapturedModules", "DynamoWrappedModules", "InterceptedModules",
           "ModuleWrite", "SnapshotModules", "captured_modules", "written_positions"]

#: Guard captures whose tensors hold at most :data:`SNAPSHOT_BUDGET` bytes with
#: :class:`SnapshotModules`; ``False``: every capture with :class:`InterceptedModules`, the slow
#: twin (``tests/test_captured.py`` checks both refuse the same writes and undo them alike).
SNAPSHOT = True
#: The bytes a capture's parameters and buffers may hold, all together, to be snapshot (copied
#: twice per replacement: on entry and by ``check``) rather than intercepted. Where the two cost
#: the same around a conv-bn fold (measured: snapshot +235 µs, dispatch +299 µs at 519 KiB;
#: +479 and +310 µs at 775 KiB).
SNAPSHOT_BUDGET = 1 << 19

#: Sets tensors' version counters (the ones a write moved are put back); ``None`` in a torch without it.
_SET_VERSION = getattr(torch._C._autograd, "_unsafe_set_version_counter", None)

_UNKNOWN = object()
_SWAPPED = "its .data was replaced"
_BUMPED = "written in place (its version counter changed)"
_VALUES = "its values changed (written through an alias with a version counter of its own: .data, a storage, numpy)"


class ModuleWrite(Exception):
    """A replacement changed a module its match captured: ``label`` (``conv.weight``) and how."""

    def __init__(self, label: str, how: str) -> None:
        super().__init__(f"{label}: {how}")
        self.label, self.how = label, how


class _TensorState:
    """A captured parameter or buffer as it was: its :func:`_tensor_key` (version counter,
    address of its first element, shape, strides, dtype), an alias of its data (no copy) that
    puts back a swapped ``.data``, and once :meth:`copy` ran, a copy of its bytes. Its label
    (``conv.weight``) is written only when a change is reported."""

    __slots__ = ("array", "bits", "data", "key", "name", "owner", "tensor")

    def __init__(self, owner: str, name: str, tensor: torch.Tensor) -> None:
        self.owner, self.name, self.tensor = owner, name, tensor
        self.key = _tensor_key(tensor)
        self.data = tensor.data
        self.bits: bytes | None = None
        self.array: Any = None

    @property
    def label(self) -> str:
        return f"{self.owner}.{self.name}"

    @property
    def version(self) -> int | None:
        return self.key[0]

    @property
    def address(self) -> int:
        return self.key[1]

    def copy(self) -> None:
        """Copy its bytes (:func:`_bits_view`), keeping the numpy view of its storage they were read
        from: reading it again costs a tenth of a new view."""
        self.array = _bits_view(self.data)
        self.bits = self.array.tobytes()

    def moved(self) -> bool:
        """Does the tensor show other data than it did? A swapped ``.data`` shows in the address
        of its first element, its shape, strides or dtype (also an alias of the same storage seen
        another way, which the storage's address alone would not show)."""
        return _tensor_key(self.tensor)[1:] != self.key[1:]

    def changed(self) -> str | None:
        """How the tensor changed since, or ``None``: written in place (its version counter moved;
        an inference tensor has none, ``None`` both times), its ``.data`` swapped, or its bytes
        changed (when they were copied)."""
        now = _tensor_key(self.tensor)
        if now != self.key:
            return _BUMPED if now[0] != self.key[0] else _SWAPPED
        if self.bits is not None and self._bits_now() != self.bits:
            return _VALUES
        return None

    def _bits_now(self) -> bytes:
        """The bytes of its original storage now: through the view :meth:`copy` kept while the
        storage's memory is where it was (a storage resized meanwhile moved: a new view)."""
        if self.data.data_ptr() == self.address:
            return self.array.tobytes()
        return _bits_view(self.data).tobytes()

    def undo(self) -> None:
        """Put back its data, its values (from the bytes copied, when they were) and its version
        counter."""
        t = self.tensor
        if self.moved():
            with torch.no_grad():
                t.data = self.data
        if self.bits is not None:
            now = _bits_view(self.data)
            if now.tobytes() != self.bits:
                now[...] = np.frombuffer(self.bits, dtype=now.dtype).reshape(now.shape)
        version = self.version
        if version is not None and _version(t) != version and _SET_VERSION is not None:
            _SET_VERSION((t,), (version,))


class _ModuleState:
    """A captured module (or one of its submodules) as it was: its class, its attributes, its
    parameter, buffer and submodule tables (copies of the tables, references to the values) and
    the contents of its other private containers (the hook tables: a hook registered on it
    changes what the module computes wherever the program calls it).

    Its instance dict is kept as its keys and values (two tuples, copied at C speed);
    :meth:`changed` first asks whether every attribute, private ones too, is still the very same
    object under the same key (:data:`ATTRIBUTES_AT_ONCE`), and compares them one by one only
    when not: a public attribute reassigned or added (``conv.forward = ...`` shadows the method)
    is a change; a private one reassigned or added is torch's business (caches it may keep)."""

    __slots__ = ("_public", "cls", "empty", "empty_keys", "filled", "keys", "label", "module", "tables", "values")

    def __init__(self, label: str, module: torch.nn.Module) -> None:
        self.label, self.module, self.cls = label, module, type(module)
        own = vars(module)
        keys, values = self.keys, self.values = tuple(own), tuple(own.values())
        self.tables: tuple[dict[str, Any], ...] = (dict(module._parameters), dict(module._buffers),
                                                   dict(module._modules))
        # the private dicts and sets besides the three tables (most are empty hook tables): those
        # empty now in one tuple, compared all at once by any(); the others with copies of their contents
        empty: list[Any] = []
        empty_keys: list[str] = []
        filled: list[tuple[str, Any, Any]] = []
        for i in _private_positions(keys):
            value = values[i]
            if type(value) in _CONTAINERS:
                if value:
                    filled.append((keys[i], value, _contents(value)))
                else:
                    empty.append(value)
                    empty_keys.append(keys[i])
        self.empty, self.empty_keys, self.filled = tuple(empty), tuple(empty_keys), tuple(filled)
        self._public: dict[str, Any] | None = None

    @property
    def containers(self) -> list[tuple[str, Any, Any]]:
        """(name, the container, a copy of its contents or ``None`` when it was empty), per private
        dict or set of the module besides the three tables, in the order of its instance dict."""
        order = {key: i for i, key in enumerate(self.keys)}
        return sorted([*((k, c, None) for k, c in zip(self.empty_keys, self.empty)), *self.filled],
                      key=lambda item: order[item[0]])

    @property
    def attributes(self) -> dict[str, Any]:
        """Its public attributes as they were (name -> value), made when first asked."""
        if self._public is None:
            self._public = {k: v for k, v in zip(self.keys, self.values) if k[:1] != "_"}
        return self._public

    def _untouched(self, own: dict[str, Any]) -> bool:
        """Every attribute is the very object it was, under the same key, in the same order."""
        return len(own) == len(self.keys) and tuple(own) == self.keys and all(map(_is, own.values(), self.values))

    def changed(self) -> tuple[str, str] | None:
        """The first attribute, table entry or container that changed since (label, how), or ``None``."""
        module = self.module
        if type(module) is not self.cls:
            return f"{self.label}.__class__", "reassigned"
        own = vars(module)
        if not (ATTRIBUTES_AT_ONCE and self._untouched(own)):
            found = self._attribute_changed(own)
            if found is not None:
                return found
        for table, before in zip(_tables(module), self.tables):
            if _same_table(table, before):
                continue
            changed = sorted(k for k in {*table, *before} if table.get(k, _UNKNOWN) is not before.get(k, _UNKNOWN))
            return f"{self.label}.{changed[0]}", "reassigned"
        if any(self.empty) or not all(_same_contents(c, contents) for _, c, contents in self.filled):
            for key, container, contents in self.containers:
                if not _same_contents(container, contents):
                    how = "a hook was registered or removed" if "hook" in key else "changed in place"
                    return f"{self.label}.{key}", how
        return None

    def _attribute_changed(self, own: dict[str, Any]) -> tuple[str, str] | None:
        attributes = self.attributes
        for key, value in attributes.items():
            if own.get(key, _UNKNOWN) is not value:
                return f"{self.label}.{key}", "reassigned"
        for key in own:
            if key[:1] != "_" and key not in attributes:
                return f"{self.label}.{key}", "added (an instance attribute the module did not have)"
        return None

    def undo(self) -> None:
        module = self.module
        if type(module) is not self.cls:
            object.__setattr__(module, "__class__", self.cls)
        for table, before in zip(_tables(module), self.tables):
            if not _same_table(table, before):
                table.clear()
                table.update(before)
        own = vars(module)
        attributes = self.attributes
        for key, value in attributes.items():
            if own.get(key, _UNKNOWN) is not value:
                object.__setattr__(module, key, value)
        for key in [k for k in own if k[:1] != "_" and k not in attributes]:
            del own[key]
        for _, container, contents in self.containers:
            if not _same_contents(container, contents):
                container.clear()
                container.update(contents or ())


#: The private containers of a module whose contents the guard compares (hook tables are
#: ``OrderedDict``s; ``_non_persistent_buffers_set`` is a set); the three tables are compared apart.
_CONTAINERS = (dict, collections.OrderedDict, set)
_TABLE_NAMES = frozenset({"_parameters", "_buffers", "_modules"})
#: Per instance-dict layout (its keys in order): the positions of its private keys besides the three tables.
_POSITIONS: dict[tuple[str, ...], tuple[int, ...]] = {}


def _private_positions(keys: tuple[str, ...]) -> tuple[int, ...]:
    """The positions in ``keys`` of the private attributes besides the three tables (the
    candidates for private containers), worked out once per layout (modules of a class mostly
    share one)."""
    found = _POSITIONS.get(keys)
    if found is None:
        if len(_POSITIONS) >= 4096:  # layouts made on the fly: never grow without bound
            _POSITIONS.clear()
        found = _POSITIONS[keys] = tuple(i for i, key in enumerate(keys)
                                         if key[:1] == "_" and key not in _TABLE_NAMES)
    return found


def _contents(container: Any) -> Any:
    """A copy of a dict (its items in order) or of a set, to compare with and to put back."""
    return dict(container) if isinstance(container, dict) else set(container)


def _same_contents(container: Any, contents: Any) -> bool:
    """Does ``container`` hold what ``contents`` (:func:`_contents`, ``None``: it was empty) copied:
    the same keys in the same order, each with the very same value (never compared with ``==``:
    a tensor's is elementwise), or the same set members?"""
    if contents is None:
        return not container
    if len(container) != len(contents):
        return False
    if isinstance(contents, dict):
        return all(k1 == k2 and v1 is v2 for (k1, v1), (k2, v2) in zip(container.items(), contents.items()))
    return all(member in contents for member in container)


#: :meth:`_ModuleState.changed` asks first whether a module's instance dict holds the very same
#: objects under the same keys (a C-speed comparison of the whole dict, private attributes too),
#: and compares public attributes one by one only when not; ``False`` (the slow twin): always one
#: by one (``tests/test_captured.py`` checks both report and undo alike).
ATTRIBUTES_AT_ONCE = True
_is = operator.is_


def _same_table(table: dict[str, Any], before: dict[str, Any]) -> bool:
    if len(table) != len(before):
        return False
    for k, v in before.items():  # noqa: SIM110 - a loop, not all() of a generator: most tables hold 0-3 entries
        if table.get(k, _UNKNOWN) is not v:
            return False
    return True


def _tables(module: torch.nn.Module) -> tuple[dict[str, Any], ...]:
    return (module._parameters, module._buffers, module._modules)


def _states(modules: dict[str, torch.nn.Module]) -> tuple[list[_ModuleState], list[_TensorState]]:
    """The states of ``modules`` (by label), their submodules, and their parameters and buffers."""
    module_states: list[_ModuleState] = []
    tensor_states: list[_TensorState] = []
    for label, module in modules.items():
        # (a module without submodules is all named_modules() yields: skip its generator)
        named = module.named_modules(prefix=label) if module._modules else ((label, module),)
        for sub_label, sub in named:
            module_states.append(_ModuleState(sub_label, sub))
            for table in (sub._parameters, sub._buffers):
                for name, t in table.items():
                    if isinstance(t, torch.Tensor):
                        tensor_states.append(_TensorState(sub_label, name, t))
    return module_states, tensor_states


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


class CapturedModules:
    """Keeps a replacement from changing the modules its match captured (they belong to the
    program, and unless ``rewrite`` works on a copy, to the caller's model).

    The replacement runs inside ``with guard:``; afterwards :meth:`check` compares what was
    snapshot (tensor version counters, ``.data``, attributes, parameter tables, and in
    :class:`SnapshotModules` the tensors' bytes) and :meth:`undo` puts back anything changed.
    ``modules`` maps the label to report (the module's path) to the module. This class does
    nothing while the replacement runs; its subclasses are the guards :func:`captured_modules`
    builds."""

    def __init__(self, modules: dict[str, torch.nn.Module],
                 states: tuple[list[_ModuleState], list[_TensorState]] | None = None) -> None:
        self.modules, self.tensors = states if states is not None else _states(modules)

    def __enter__(self) -> CapturedModules:
        return self

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        return None

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
        """Put back every attribute, table entry, ``.data``, value and version counter the
        replacement changed."""
        for m in self.modules:
            m.undo()
        for state in self.tensors:
            state.undo()


class SnapshotModules(CapturedModules):
    """The guard of small captures: the bytes of every captured tensor are copied when it is
    built, and :meth:`check` compares them (bit for bit: NaN payloads and ``-0.0`` too), which
    finds a write through ``.data``, a storage or numpy that the tensor's version counter does
    not show; :meth:`undo` copies them back and puts the version counters back. The write itself
    is not stopped: it is in the caller's model until :meth:`undo` (a thread running that model
    meanwhile would see it; :class:`InterceptedModules` refuses it before it writes)."""

    def __init__(self, modules: dict[str, torch.nn.Module],
                 states: tuple[list[_ModuleState], list[_TensorState]] | None = None) -> None:
        super().__init__(modules, states)
        for state in self.tensors:
            if state.bits is None:  # captured_modules copied them when it chose this guard
                state.copy()


class InterceptedModules(TorchDispatchMode, CapturedModules):
    """The guard of large captures (and every capture with :data:`SNAPSHOT` off): while the
    replacement runs, an in-place op on one of the captured storages is refused before it
    writes (:class:`ModuleWrite` naming the op); :meth:`check` and :meth:`undo` as in
    :class:`CapturedModules`, with references only, never copies of the tensors."""

    def __init__(self, modules: dict[str, torch.nn.Module],
                 states: tuple[list[_ModuleState], list[_TensorState]] | None = None) -> None:
        TorchDispatchMode.__init__(self)
        CapturedModules.__init__(self, modules, states)
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


class DynamoWrappedModules(InterceptedModules):
    """:class:`InterceptedModules` with torch's ``torch._disable_dynamo`` wrapper around
    ``__torch_dispatch__`` (the slow twin of :data:`UNWRAPPED_DISPATCH`)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return True

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return InterceptedModules.__torch_dispatch__(self, func, types, args, kwargs)


#: Intercept with :class:`InterceptedModules` (no Dynamo wrapper around its dispatch); ``False``:
#: with :class:`DynamoWrappedModules` (``tests/test_captured.py`` checks both refuse and undo alike).
UNWRAPPED_DISPATCH = True


def captured_modules(modules: dict[str, torch.nn.Module]) -> CapturedModules:
    """The guard for ``modules``: :class:`SnapshotModules` when :data:`SNAPSHOT` is on and their
    tensors can be copied as bytes within :data:`SNAPSHOT_BUDGET`, else :class:`InterceptedModules`
    (see :data:`UNWRAPPED_DISPATCH`)."""
    states = _states(modules)
    if SNAPSHOT and _copied(states[1]):
        return SnapshotModules(modules, states)
    return (InterceptedModules if UNWRAPPED_DISPATCH else DynamoWrappedModules)(modules, states)


#: Dtypes whose tensors ``numpy()`` reads as they are; the others are read as integers of their size.
_NUMPY_DTYPES = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                           torch.float32, torch.float64, torch.complex64, torch.complex128})
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _copied(tensors: list[_TensorState]) -> bool:
    """Could every tensor's bytes be copied (:meth:`_TensorState.copy`), all within
    :data:`SNAPSHOT_BUDGET`? Only dense CPU tensors of their own values are (no subclass but
    ``Parameter``: a fake, lazy or wrapper tensor is intercepted); numpy refuses the others
    (quantized, sparse, conjugate or negative views). A tensor that sees part of its storage
    (a view into a flat buffer) is intercepted too: the dispatch mode guards the whole storage,
    the copy would guard the part."""
    total = 0
    for state in tensors:
        t = state.tensor
        if type(t) not in _PLAIN or not t.is_cpu:
            return False
        nbytes = t.nbytes
        if t.untyped_storage().nbytes() != nbytes:
            return False
        total += nbytes
    if total > SNAPSHOT_BUDGET:
        return False
    try:
        for state in tensors:
            state.copy()
    except (RuntimeError, TypeError, KeyError):
        return False
    return True


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _bits_view(t: torch.Tensor) -> Any:
    """A numpy view of the elements of ``t`` (a ``.data`` alias, which needs no ``detach``), read
    as integers of their size where numpy has no such dtype: its ``tobytes()`` are the elements
    in row-major order, so equal bytes are bit-identical values (NaN payloads, ``-0.0``)."""
    if t.dtype not in _NUMPY_DTYPES:
        t = t.view(_BITS[t.element_size()])
    return t.numpy()


def _version(t: torch.Tensor) -> int | None:
    """The tensor's version counter; ``None`` for an inference tensor, which has none (a model
    built under ``torch.inference_mode``): a write into it shows in its values (snapshot) or is
    refused by the dispatch mode."""
    try:
        return t._version
    except RuntimeError:
        return None


def _tensor_key(t: torch.Tensor) -> tuple[Any, ...]:
    """What :meth:`_TensorState.changed` compares before the bytes: the version counter
    (:func:`_version`), the address of the first element (:func:`_address`), the shape, the
    strides and the dtype, read in one call (the common case: no exception)."""
    try:
        return (t._version, t.data_ptr(), t.shape, t.stride(), t.dtype)
    except Exception:  # an inference tensor (no version counter), or a tensor without data
        return (_version(t), _address(t), t.shape, t.stride(), t.dtype)


def _address(t: torch.Tensor) -> int:
    """The address of a tensor's first element (0 when it has none: fake and meta tensors)."""
    try:
        return t.data_ptr()
    except Exception:
        return 0


def _storage(t: Any) -> int:
    """The address of a tensor's storage (0 when it has none: fake and meta tensors)."""
    try:
        return int(t.untyped_storage().data_ptr())
    except Exception:
        return 0
