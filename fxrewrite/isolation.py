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

Process-wide state (hooks, dtype, threads, print options, seed, ...) is put back as it was when
the block began, so a change another thread makes to it *during* the block is undone as well:
keep blocks short (tracing one pattern takes milliseconds). Thread-local state (grad,
inference and autocast modes, the torch-function mode stack, the default device) is only ever
this thread's.

Not preserved (torch offers no way to read it back): ``torch.set_flush_denormal`` and the
number of inter-op threads (settable once per process). The DSL refuses those calls at load
time instead (:mod:`fxrewrite.dsl.scope`).

Private torch APIs used here (the mode stack, the default-device slot, the hook dictionaries,
the inference-mode guard, print options) live in this module only.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import torch
import torch.nn.modules.module as _module_globals

__all__ = ["PRESERVED", "StateChanges", "torch_state_preserved"]

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

    return _Item(f"nn.Module global hooks ({name})", get, put,
                 same=lambda a, b: list(a.items()) == list(b.items()))


def _global_value_item(name: str) -> _Item:
    """A global of ``torch.nn.modules.module`` that is a plain value (``_global_is_full_backward_hook``)."""
    return _Item(f"nn.Module global hooks ({name})", lambda: getattr(_module_globals, name),
                 lambda value: setattr(_module_globals, name, value), same=lambda a, b: a is b or a == b)


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


def _items() -> tuple[_Item, ...]:
    """Everything preserved, in the order it is restored (modes and inference mode before grad
    mode, which leaving inference mode may change). Private torch functions are looked up
    when called, so a torch release that moves one loses that item only (logged), not the rest."""
    return (
        _Item("torch function modes (default device)", _function_modes, _set_function_modes, same=_same_modes),
        _Item("default device", _default_device_slot, _set_default_device_slot, same=lambda a, b: a is b),
        _Item("default device of device modes", _current_device_of_modes, _set_current_device_of_modes),
        _Item("inference mode", torch.is_inference_mode_enabled, _set_inference_mode),
        _Item("default dtype", torch.get_default_dtype, torch.set_default_dtype),
        _Item("grad mode", torch.is_grad_enabled, torch.set_grad_enabled),
        _Item("anomaly mode", _anomaly, _set_anomaly),
        _Item("print options", _print_options, _set_print_options),
        _Item("deterministic algorithms", _deterministic, _set_deterministic),
        _Item("deterministic debug mode", torch.get_deterministic_debug_mode, torch.set_deterministic_debug_mode),
        _Item("number of threads", torch.get_num_threads, torch.set_num_threads),
        _Item("float32 matmul precision", torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
        _Item("warn_always", torch.is_warn_always_enabled, torch.set_warn_always),
        _Item("CPU autocast", _autocast_cpu, _set_autocast_cpu),
        _Item("autograd multithreading", lambda: torch._C._is_multithreading_enabled(),
              lambda enabled: torch._C._set_multithreading_enabled(enabled)),
        _Item("random seed", _seed_and_state, _reseed, same=lambda a, b: a[0] == b[0]),
        *(_hook_item(name) for name in _hook_dict_names()),
        _global_value_item("_global_is_full_backward_hook"),
    )


#: The names of the pieces of state :func:`torch_state_preserved` puts back.
PRESERVED: tuple[str, ...] = tuple(item.name for item in _items())


# ---- the context manager -------------------------------------------------------------------------


@attrs.define
class StateChanges:
    """What a :func:`torch_state_preserved` block changed and had put back (``restored``), and
    what could not be put back (``failed``: name and the error's text). Filled when the block ends."""

    restored: tuple[str, ...] = ()
    failed: tuple[tuple[str, str], ...] = ()


def _snapshot() -> list[tuple[_Item, Any]]:
    saved = []
    for item in _items():
        try:
            saved.append((item, item.get()))
        except Exception as exc:  # a reader torch removed: preserve the rest
            _log.debug("cannot read %s: %s", item.name, exc)
    return saved


def _restore(saved: list[tuple[_Item, Any]], changes: StateChanges) -> None:
    restored: list[str] = []
    failed: list[tuple[str, str]] = []
    for item, value in saved:
        try:
            if item.same(item.get(), value):
                continue
            item.set(value)
            restored.append(item.name)
        except Exception as exc:
            failed.append((item.name, f"{type(exc).__name__}: {exc}"))
    changes.restored, changes.failed = tuple(restored), tuple(failed)
    if restored:
        _log.info("restored global torch state changed by traced code: %s", ", ".join(restored))
    for name, error in failed:
        _log.warning("could not restore %s after traced code changed it: %s", name, error)


@contextlib.contextmanager
def torch_state_preserved() -> Iterator[StateChanges]:
    """Run the block, then put back every piece of global torch state in :data:`PRESERVED`
    that it changed. Never raises by itself (a state that cannot be put back is logged and
    listed in ``StateChanges.failed``); an exception from the block propagates unchanged.

    >>> import torch
    >>> with torch_state_preserved():
    ...     torch.set_default_device("meta")
    >>> torch.ones(2).device
    device(type='cpu')
    """
    saved = _snapshot()
    changes = StateChanges()
    try:
        yield changes
    finally:
        _restore(saved, changes)
