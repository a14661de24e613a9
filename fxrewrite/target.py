"""Load the model a command line names: ``path/to/file.py:NAME`` or ``package.module:NAME``.

``NAME`` is an ``nn.Module`` instance, an ``nn.Module`` class (built with no arguments) or a
factory function returning a module. The same file may define ``example_inputs()`` returning
the tuple of inputs to call the model with (used by ``--check`` and ``--export``).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs
import torch

from .errors import TargetError

__all__ = ["Target", "load_target"]


@attrs.frozen
class Target:
    """A model ready to rewrite, with its example inputs when the file provides them."""

    spec: str
    model: torch.nn.Module
    example_inputs: tuple[Any, ...] | None


def load_target(spec: str) -> Target:
    """Import and build the model named by ``spec``."""
    location, sep, name = spec.rpartition(":")
    if not sep or not location or not name:
        raise TargetError(
            f"cannot read the target '{spec}': write it as path/to/file.py:NAME or package.module:NAME, "
            f"where NAME is an nn.Module instance, class or factory."
        )
    module = _import(location, spec)
    if not hasattr(module, name):
        public = sorted(n for n in vars(module) if not n.startswith("_"))
        raise TargetError(f"'{location}' defines no '{name}' (it defines: {', '.join(public) or 'nothing'}).")
    model = _build(getattr(module, name), spec)
    return Target(spec, model, _example_inputs(module, spec))


def _import(location: str, spec: str) -> ModuleType:
    try:
        if location.endswith(".py") or "/" in location or "\\" in location:
            return _import_file(Path(location))
        return importlib.import_module(location)
    except TargetError:
        raise
    except (Exception, SystemExit) as exc:  # SystemExit: a script that runs argparse when imported
        raise TargetError(
            f"cannot import '{location}' for target '{spec}': {type(exc).__name__}: {exc}. Check the path "
            f"(relative to the current directory) or that the package is installed."
        ) from exc


def _import_file(path: Path) -> ModuleType:
    if not path.is_file():
        raise TargetError(f"no such file: '{path}' (the current directory is {Path.cwd()}).")
    name = f"fxrewrite_target_{abs(hash(str(path.resolve())))}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # dataclasses and pickling look modules up by name
    module_spec.loader.exec_module(module)
    return module


def _build(obj: Any, spec: str) -> torch.nn.Module:
    if isinstance(obj, torch.nn.Module):
        return obj
    if not callable(obj):
        raise TargetError(f"'{spec}' is a {type(obj).__name__}; it must be an nn.Module, a module class or a factory.")
    what = "class" if inspect.isclass(obj) else "factory"
    try:
        model = obj()
    except Exception as exc:
        raise TargetError(
            f"calling the {what} '{spec}' with no arguments failed: {type(exc).__name__}: {exc}. Point the target "
            f"at a module instance or a factory that takes no arguments."
        ) from exc
    if not isinstance(model, torch.nn.Module):
        raise TargetError(f"the {what} '{spec}' returned a {type(model).__name__}, not an nn.Module.")
    return model


def _example_inputs(module: ModuleType, spec: str) -> tuple[Any, ...] | None:
    factory = getattr(module, "example_inputs", None)
    if factory is None:
        return None
    try:
        inputs = factory() if callable(factory) else factory
    except Exception as exc:
        raise TargetError(f"example_inputs() next to '{spec}' failed: {type(exc).__name__}: {exc}") from exc
    return tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
