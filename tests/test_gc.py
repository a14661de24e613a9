"""``fxrewrite._gc``: the cyclic collector is paused while rewrites run and comes back after."""

from __future__ import annotations

import gc
import threading

import torch

import fxrewrite
from fxrewrite._gc import collections_paused


def test_the_collector_is_off_inside_and_back_on_after_even_when_the_block_raises():
    assert gc.isenabled()
    try:
        with collections_paused():
            assert not gc.isenabled()
            raise KeyError("boom")
    except KeyError:
        pass
    assert gc.isenabled()


def test_a_collector_the_caller_disabled_stays_disabled():
    gc.disable()
    try:
        with collections_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_overlapping_pauses_in_threads_turn_the_collector_back_on_once_the_last_one_ends():
    first_inside, second_done = threading.Event(), threading.Event()
    seen: list[bool] = []

    def first() -> None:
        with collections_paused():
            first_inside.set()
            second_done.wait(10)
            seen.append(gc.isenabled())  # the second thread left, this one is still inside

    thread = threading.Thread(target=first)
    thread.start()
    first_inside.wait(10)
    with collections_paused():
        pass
    second_done.set()
    thread.join(10)
    assert seen == [False]
    assert gc.isenabled()


def test_rewrite_runs_without_collections_and_restores_the_collector():
    states: list[bool] = []

    def replacement(x):
        states.append(gc.isenabled())
        return torch.abs(x)

    rule = fxrewrite.Rule.from_functions(lambda x: torch.abs(torch.abs(x)), replacement, name="abs_abs")
    result = fxrewrite.rewrite(lambda a: torch.abs(torch.abs(a)) + 1, rule)
    x = torch.randn(4)
    result.module.graph.lint()
    torch.testing.assert_close(result.module(x), torch.abs(x) + 1)
    assert states == [False] and gc.isenabled()
