"""Commands that print what happened themselves keep the loggers that would say it again
(on stderr, with the exception's class) quiet below a level while they run; `-v 2` shows
everything. The levels are put back after, since a test calls a command in its own process."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def loggers_quiet_below(level: int, names: tuple[str, ...]) -> Iterator[None]:
    """Drop the named loggers' records under `level` while the block runs, then restore their
    levels."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(max(logger.getEffectiveLevel(), level))
    try:
        yield
    finally:
        for logger, previous in zip(loggers, levels, strict=True):
            logger.setLevel(previous)
