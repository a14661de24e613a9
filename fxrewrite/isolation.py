"""Run code that must not change torch's global state: :func:`torch_state_preserved`.

Tracing a rule's pattern *executes* the pattern function. A pattern that calls
``torch.set_default_device("meta")``, ``torch.set_grad_enabled(False)`` or
``torch.nn.modules.module.register_module_forward_hook(...)`` would otherwise leave the whole
process changed: every later ``torch.ones(2)`` on the meta device, every model with a stray
hook. The context manager snapshots the process-wide (and thread-local) state such a call can
change and puts it back when the block ends, whatever happened inside:

>>> import torch
>>> with torch_state_preserved() as changes:
...     torch.set_default_dtype(torch.float64)
...     _ = torch.set_grad_enabled(False)
>>> torch.get_default_dtype(), torch.is_grad_enabled()
(torch.float32, True)
>>> changes.restored
('default dtype', 'grad mode')

What is preserved (:data:`PRESERVED`): the torch-function mode stack (``set_default_device``
pushes a ``DeviceContext`` mode; ``with torch.device(...)`` entered and never left too) and the
global default-device slot; default dtype; grad mode; inference mode; anomaly mode; print
options; deterministic algorithms (mode, warn-only, debug mode); the number of intra-op
threads; float32 matmul precision; ``warn_always``; CPU autocast (enabled, dtype); autograd
multithreading; the random seed (a reseed is undone, with the generator's state; numbers
merely drawn are not rewound); the global ``nn.Module`` hook dictionaries of
``torch.nn.modules.module`` (forward, forward-pre, backward, backward-pre, and
module/parameter/buffer registration hooks), restored in place so hook handles stay valid.

Only what the block's own thread changed is put back. Each item is one of two kinds:

* **Thread-local** (torch keeps one per thread, so another thread's change is never seen here):
  the torch-function mode stack, the default-device slot, inference mode, grad mode, CPU autocast,
  autograd multithreading.
* **Process-wide** (one slot for the whole process, with no record of which thread wrote it): the
  default device of device modes, default dtype, anomaly mode, print options, deterministic
  algorithms and their debug mode, the number of threads (per thread under OpenMP, per process
  with torch's native pool), float32 matmul precision, ``warn_always``, the random seed, the
  global hook dictionaries. When no other Python thread is alive as the block begins, every change
  is the block's own (no other thread exists to make one) and is put back. Otherwise the block's
  calls are watched on its thread alone (``sys.setprofile`` is per thread; the watch makes a
  pattern's trace about three times as slow, so it is only paid when other threads exist) and a changed
  item is put back only if this thread called one of its setters (:attr:`_Item.setters`, e.g.
  ``torch._C._set_default_dtype`` for the default dtype); a hook dictionary loses only the hooks
  this thread registered (the handles its ``register_module_*`` calls returned) and gets back
  only those it removed (its calls of a handle's ``remove``). What cannot be attributed, for
  want of any record of the writer: a change the block made *without* a known setter while other
  threads are alive (assigning ``torch._tensor_str.PRINT_OPTS.precision``, writing a hook
  dictionary directly) looks like another thread's, so it is left as it is and named in
  ``StateChanges.kept`` and in a warning; and a thread that already has a profiler (``cProfile``)
  is not watched, so its blocks count as alone.

Not preserved (torch offers no way to read it back): ``torch.set_flush_denormal`` and the
number of inter-op threads (settable once per process). The DSL refuses those calls at load
time instead (:mod:`fxrewrite.dsl.scope`).

Private torch APIs used here (the mode stack, the default-device slot, the hook dictionaries,
the inference-mode guard, print options) live in this module only.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import torch
import torch.nn.modules.module as _module_globals

__all__ = ["PRESERVED", "StateChanges", "function_modes_active", "torch_state_preserved"]

_log = logging.getLogger(__name__)

#: Inference-mode guards entered to undo a leaked ``inference_mode``; see :func:`_set_inference_mode`.
_HELD_GUARDS: list[Any] = []


@attrs.frozen
class _Item:
    """One piece of global state: how to read it and how to put a read value back."""

    name: str
    get: Callable[[], Any]
    set: Callable[[Any], object]
    same: Callable[[Any, Any], bool] = attrs.field(default=lambda a, b: bool(a == b))
    #: For process-wide state: the functions whose call changes it (looked up when needed). The
    #: item is put back after a block with other threads alive only if the block's thread called
    #: one. ``None``: the state is thread-local, always the block's own.
    setters: Callable[[], tuple[Any, ...]] | None = None
    #: For state shared key by key (the hook dictionaries): put back only the keys the block's
    #: thread added or removed, from the saved value and the watched calls; True if it changed any.
    put_back_own: Callable[[Any, _Calls], bool] | None = None


# ---- readers and writers -------------------------------------------------------------------------


def _function_modes() -> tuple[Any, ...]:
    return tuple(torch._C._get_function_stack_at(i) for i in range(torch._C._len_torch_function_stack()))


def _set_function_modes(modes: tuple[Any, ...]) -> None:
    while torch._C._len_torch_function_stack():
        torch._C._pop_torch_function_stack()
    for mode in modes:
        torch._C._push_on_torch_function_stack(mode)


_NO_CONTEXT = object()


def _default_device_slot() -> Any:
    return getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", _NO_CONTEXT)


def _set_default_device_slot(context: Any) -> None:
    if context is _NO_CONTEXT:
        if hasattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context"):
            del torch._GLOBAL_DEVICE_CONTEXT.device_context
    else:
        torch._GLOBAL_DEVICE_CONTEXT.device_context = context


def _current_device_of_modes() -> Any:
    import torch.utils._device as device_module

    return device_module.CURRENT_DEVICE


def _set_current_device_of_modes(device: Any) -> None:
    import torch.utils._device as device_module

    device_module.CURRENT_DEVICE = device


def _set_inference_mode(enabled: bool) -> None:
    """Inference mode can only be changed by entering a guard; a leaked guard (entered, never
    exited) is countered by entering the opposite one and holding it for the process's life."""
    guard = torch._C._InferenceMode(enabled)
    guard.__enter__()
    _HELD_GUARDS.append(guard)


def _print_options() -> dict[str, Any]:
    return dict(vars(torch._tensor_str.PRINT_OPTS))


def _set_print_options(options: dict[str, Any]) -> None:
    for key, value in options.items():
        setattr(torch._tensor_str.PRINT_OPTS, key, value)


def _deterministic() -> tuple[bool, bool]:
    return torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()


def _set_deterministic(state: tuple[bool, bool]) -> None:
    torch.use_deterministic_algorithms(state[0], warn_only=state[1])


def _anomaly() -> tuple[bool, bool]:
    return torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()


def _set_anomaly(state: tuple[bool, bool]) -> None:
    torch.set_anomaly_enabled(state[0], state[1])


def _hook_dict_names() -> tuple[str, ...]:
    names = (n for n, v in vars(_module_globals).items() if n.startswith("_global_") and isinstance(v, dict))
    return tuple(sorted(names))


def _hook_item(name: str) -> _Item:
    """A global hook dictionary, snapshotted as a copy and restored *in place* (hook handles
    and ``nn.Module.__call__`` hold the dictionary object itself)."""

    def get() -> dict[Any, Any]:
        return dict(getattr(_module_globals, name))

    def put(saved: dict[Any, Any]) -> None:
        current = getattr(_module_globals, name)
        current.clear()
        current.update(saved)

    def put_back_own(saved: dict[Any, Any], calls: _Calls) -> bool:
        current = getattr(_module_globals, name)
        added = {k for k in current if k in calls.added_hooks and k not in saved}
        removed = {k for k in saved if k in calls.removed_hooks and k not in current}
        if not added and not removed:
            return False
        rebuilt = {k: current.get(k, v) for k, v in saved.items() if k in current or k in removed}
        rebuilt.update((k, v) for k, v in current.items() if k not in saved and k not in added)  # other threads'
        current.clear()
        current.update(rebuilt)
        return True

    return _Item(f"nn.Module global hooks ({name})", get, put,
                 same=lambda a, b: list(a.items()) == list(b.items()), setters=_hook_setters,
                 put_back_own=put_back_own)


def _global_value_item(name: str) -> _Item:
    """A global of ``torch.nn.modules.module`` that is a plain value (``_global_is_full_backward_hook``)."""
    return _Item(f"nn.Module global hooks ({name})", lambda: getattr(_module_globals, name),
                 lambda value: setattr(_module_globals, name, value), same=lambda a, b: a is b or a == b,
                 setters=_hook_setters)


def _hook_registers() -> tuple[Any, ...]:
    """``register_module_forward_hook`` and the other ``register_module_*`` functions."""
    return tuple(f for n, f in vars(_module_globals).items() if n.startswith("register_module_") and callable(f))


def _hook_setters() -> tuple[Any, ...]:
    """``register_module_*`` and a hook handle's ``remove``."""
    import torch.utils.hooks

    return (*_hook_registers(), torch.utils.hooks.RemovableHandle.remove)


def _device_mode_setters() -> tuple[Any, ...]:
    import torch.utils._device as device_module

    return (device_module.DeviceContext.__enter__, device_module.DeviceContext.__exit__, torch.set_default_device)


def _seed_setters() -> tuple[Any, ...]:
    generator = torch.default_generator
    return (generator.manual_seed, generator.seed, torch.manual_seed, torch.seed)


def _seed_and_state() -> tuple[int, torch.Tensor]:
    return torch.initial_seed(), torch.get_rng_state()


def _reseed(saved: tuple[int, torch.Tensor]) -> None:
    """Undo a reseed (``manual_seed``, ``seed``): the seed and the generator's state as they were.
    Only a changed seed counts as a change: random numbers drawn meanwhile (perhaps by another
    thread) advance the generator without reseeding it, and are not rewound."""
    torch.manual_seed(saved[0])
    torch.set_rng_state(saved[1])


def _same_modes(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def _autocast_cpu() -> tuple[bool, torch.dtype]:
    return torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")


def _set_autocast_cpu(state: tuple[bool, torch.dtype]) -> None:
    torch.set_autocast_enabled("cpu", state[0])
    torch.set_autocast_dtype("cpu", state[1])


def _build_items() -> tuple[_Item, ...]:
    """Everything preserved, in the order it is restored (modes and inference mode before grad
    mode, which leaving inference mode may change). Private torch functions are looked up
    when called, so a torch release that moves one loses that item only (logged), not the rest.
    :func:`_items` is this, built once."""
    c = torch._C
    return (
        _Item("torch function modes (default device)", _function_modes, _set_function_modes, same=_same_modes),
        _Item("default device", _default_device_slot, _set_default_device_slot, same=lambda a, b: a is b),
        _Item("default device of device modes", _current_device_of_modes, _set_current_device_of_modes,
              setters=_device_mode_setters),
        _Item("inference mode", torch.is_inference_mode_enabled, _set_inference_mode),
        _Item("default dtype", torch.get_default_dtype, torch.set_default_dtype,
              setters=lambda: (c._set_default_dtype, c._set_default_tensor_type)),
        _Item("grad mode", torch.is_grad_enabled, torch.set_grad_enabled),
        _Item("anomaly mode", _anomaly, _set_anomaly, setters=lambda: (torch.set_anomaly_enabled,)),
        _Item("print options", _print_options, _set_print_options,
              setters=lambda: (torch._tensor_str.set_printoptions,)),
        _Item("deterministic algorithms", _deterministic, _set_deterministic,
              setters=lambda: (c._set_deterministic_algorithms,)),
        _Item("deterministic debug mode", torch.get_deterministic_debug_mode, torch.set_deterministic_debug_mode,
              setters=lambda: (c._set_deterministic_algorithms,)),
        _Item("number of threads", torch.get_num_threads, torch.set_num_threads,
              setters=lambda: (torch.set_num_threads,)),
        _Item("float32 matmul precision", torch.get_float32_matmul_precision, torch.set_float32_matmul_precision,
              setters=lambda: (c._set_float32_matmul_precision,)),
        _Item("warn_always", torch.is_warn_always_enabled, torch.set_warn_always,
              setters=lambda: (c._set_warnAlways,)),
        _Item("CPU autocast", _autocast_cpu, _set_autocast_cpu),
        _Item("autograd multithreading", lambda: torch._C._is_multithreading_enabled(),
              lambda enabled: torch._C._set_multithreading_enabled(enabled)),
        _Item("random seed", _seed_and_state, _reseed, same=lambda a, b: a[0] == b[0], setters=_seed_setters),
        *(_hook_item(name) for name in _hook_dict_names()),
        _global_value_item("_global_is_full_backward_hook"),
    )


_ITEMS: tuple[_Item, ...] = _build_items()


def _items() -> tuple[_Item, ...]:
    """:func:`_build_items`, built once, at import: building it costs about three times what
    reading the state does, and every pattern trace reads it. Its items look up what may move
    (private torch functions, the hook dictionaries) when they run, not when they are built;
    ``tests/test_isolation.py`` checks it equals a fresh build."""
    return _ITEMS


def function_modes_active() -> bool:
    """Is a torch function mode active on this thread (``torch.device(...)`` entered,
    ``torch.set_default_device``, a ``TorchFunctionMode``)? A trace made under one may differ."""
    return bool(torch._C._len_torch_function_stack())


#: The names of the pieces of state :func:`torch_state_preserved` puts back.
PRESERVED: tuple[str, ...] = tuple(item.name for item in _items())


# ---- the context manager -------------------------------------------------------------------------


@attrs.define
class StateChanges:
    """What a :func:`torch_state_preserved` block changed and had put back (``restored``), and
    what could not be put back (``failed``: name and the error's text). Filled when the block ends."""

    restored: tuple[str, ...] = ()
    failed: tuple[tuple[str, str], ...] = ()
    #: Process-wide state that changed during the block, which its thread did not change with a
    #: known setter while other threads were alive: left as it is (another thread's change, or
    #: one fxrewrite cannot attribute; see the module's docstring).
    kept: tuple[str, ...] = ()


def _snapshot() -> list[tuple[_Item, Any]]:
    saved = []
    for item in _items():
        try:
            saved.append((item, item.get()))
        except Exception as exc:  # a reader torch removed: preserve the rest
            _log.debug("cannot read %s: %s", item.name, exc)
    return saved


class _Calls:
    """The functions one thread calls while it is watched (its ``sys.setprofile`` hook: profile
    hooks are per thread, so other threads' calls are never seen), and the ids of the global
    hooks it registered and removed."""

    def __init__(self) -> None:
        import torch.utils.hooks

        self.seen: set[Any] = set()
        self.added_hooks: set[int | None] = set()
        self.removed_hooks: set[int | None] = set()
        self._registers = {f.__code__ for f in _hook_registers() if hasattr(f, "__code__")}
        self._remove = torch.utils.hooks.RemovableHandle.remove.__code__

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            self.seen.add(code)
            if code is self._remove:
                self.removed_hooks.add(getattr(frame.f_locals.get("self"), "id", None))
        elif event == "return":
            if frame.f_code in self._registers:
                self.added_hooks.add(getattr(arg, "id", None))
        elif event == "c_call":
            with contextlib.suppress(TypeError):  # an unhashable callable is no setter of ours
                self.seen.add(arg)

    def called_any(self, functions: tuple[Any, ...]) -> bool:
        return any(getattr(f, "__code__", f) in self.seen for f in functions)


#: Watch the block's calls even when no other thread is alive (the differential tests: the watched
#: path must put back everything the unwatched one does).
_ALWAYS_WATCH = False


def _watch() -> tuple[_Calls | None, bool]:
    """Start watching this thread's calls when another Python thread is alive (and this thread
    has no profiler of its own): the watch (``None`` when every change during the block is this
    thread's) and whether this block installed it (a nested block shares its outer block's)."""
    current = sys.getprofile()
    if isinstance(current, _Calls):
        return current, False
    if (threading.active_count() == 1 and not _ALWAYS_WATCH) or current is not None:
        return None, False
    calls = _Calls()
    sys.setprofile(calls)
    return calls, True


def _own(item: _Item, calls: _Calls | None) -> bool:
    """Did the block's thread change ``item`` (which changed during the block)?"""
    if calls is None or item.setters is None:
        return True  # alone in the process, or thread-local state
    try:
        return calls.called_any(item.setters())
    except Exception as exc:  # a setter torch moved: this item cannot be attributed
        _log.debug("cannot look up the setters of %s: %s", item.name, exc)
        return False


def _restore(saved: list[tuple[_Item, Any]], changes: StateChanges, calls: _Calls | None = None) -> None:
    restored: list[str] = []
    failed: list[tuple[str, str]] = []
    kept: list[str] = []
    for item, value in saved:
        try:
            if item.same(item.get(), value):
                continue
            if calls is not None and item.put_back_own is not None:
                if item.put_back_own(value, calls):
                    restored.append(item.name)
                if not item.same(item.get(), value):
                    kept.append(item.name)
            elif _own(item, calls):
                item.set(value)
                restored.append(item.name)
            else:
                kept.append(item.name)
        except Exception as exc:
            failed.append((item.name, f"{type(exc).__name__}: {exc}"))
    changes.restored, changes.failed, changes.kept = tuple(restored), tuple(failed), tuple(kept)
    if restored:
        _log.info("restored global torch state changed by traced code: %s", ", ".join(restored))
    for name, error in failed:
        _log.warning("could not restore %s after traced code changed it: %s", name, error)
    if kept:
        _log.warning("left %s as it is: it changed while code was traced, but not by a call fxrewrite knows on the "
                     "tracing thread, and other threads are running (their change, or a direct assignment by the "
                     "traced code)", ", ".join(kept))


@contextlib.contextmanager
def torch_state_preserved() -> Iterator[StateChanges]:
    """Run the block, then put back every piece of global torch state in :data:`PRESERVED`
    that it changed (on its own thread: see the module's docstring). Never raises by itself (a
    state that cannot be put back is logged and listed in ``StateChanges.failed``, one changed by
    another thread in ``StateChanges.kept``); an exception from the block propagates unchanged.

    >>> import torch
    >>> with torch_state_preserved():
    ...     torch.set_default_device("meta")
    >>> torch.ones(2).device
    device(type='cpu')
    """
    saved = _snapshot()
    changes = StateChanges()
    calls, installed = _watch()
    try:
        yield changes
    finally:
        if installed:
            sys.setprofile(None)
        _restore(saved, changes, calls)
