"""fxrewrite._logs.quieted: a logger silenced for a block, restored after, also on error."""

from __future__ import annotations

import logging

import pytest

from fxrewrite._logs import quieted

NAME = "fxrewrite.tests.quieted"


def test_records_below_the_level_are_dropped_inside_and_kept_after(caplog):
    log = logging.getLogger(NAME)
    with caplog.at_level(logging.INFO, logger=NAME):
        with quieted(NAME, logging.ERROR):
            log.warning("inside")
            log.error("loud enough")
        log.warning("after")
    assert [r.getMessage() for r in caplog.records] == ["loud enough", "after"]


def test_the_previous_level_comes_back_even_when_the_block_raises():
    log = logging.getLogger(NAME)
    log.setLevel(logging.DEBUG)
    try:
        with pytest.raises(RuntimeError), quieted(NAME):
            assert log.level == logging.CRITICAL
            raise RuntimeError("boom")
        assert log.level == logging.DEBUG
    finally:
        log.setLevel(logging.NOTSET)
