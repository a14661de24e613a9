"""The standard library's helper module, ``rules/_fxrewrite_stdlib.py``: its docstring examples
run, and ``broadcast_shape`` (the attention guards' broadcast) answers as
``torch.broadcast_shapes`` does."""

from __future__ import annotations

import doctest
import importlib.util
import random
from pathlib import Path
from types import ModuleType

import pytest
import torch

STDLIB = Path(__file__).resolve().parents[2] / "rules" / "_fxrewrite_stdlib.py"


@pytest.fixture(scope="module")
def stdlib() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_fxrewrite_stdlib_under_test", STDLIB)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docstring_examples_run(stdlib: ModuleType) -> None:
    result = doctest.testmod(stdlib, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


def _torch_answer(shapes: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    try:
        return tuple(torch.broadcast_shapes(*shapes))
    except RuntimeError:
        return None


def _our_answer(stdlib: ModuleType, shapes: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    try:
        return stdlib.broadcast_shape(*shapes)  # type: ignore[no-any-return]
    except RuntimeError:
        return None


def test_broadcast_shape_answers_as_torch_on_random_shapes(stdlib: ModuleType) -> None:
    rng = random.Random(0)
    refused = 0
    for _ in range(3000):
        shapes = [tuple(rng.choice((0, 1, 1, 2, 3)) for _ in range(rng.randint(0, 4)))
                  for _ in range(rng.randint(0, 3))]
        expected = _torch_answer(shapes)
        assert _our_answer(stdlib, shapes) == expected, shapes
        refused += expected is None
    assert 200 < refused < 2800  # both answers were exercised


def test_broadcast_shape_takes_torch_sizes_and_refuses_what_torch_refuses(stdlib: ModuleType) -> None:
    assert stdlib.broadcast_shape(torch.Size([2, 1, 4]), torch.Size([3, 1])) == (2, 3, 4)
    with pytest.raises(RuntimeError, match="do not broadcast"):
        stdlib.broadcast_shape((2, 3), (4, 3))


def test_broadcast_shape_leaves_other_sizes_to_torch(stdlib: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    # a symbolic size (a SymInt) is not a plain int: torch, which knows how to compare it, answers
    asked = []
    original = torch.broadcast_shapes

    def spy(*shapes):  # type: ignore[no-untyped-def]
        asked.append(shapes)
        return original(*shapes)

    monkeypatch.setattr(torch, "broadcast_shapes", spy)
    assert stdlib.broadcast_shape((2, 1), (1, 3)) == (2, 3) and not asked
    class Size(int):  # a size whose type is not int itself
        pass

    odd = Size(3)
    assert stdlib.broadcast_shape((2, 1), (1, odd)) == (2, 3) and len(asked) == 1
