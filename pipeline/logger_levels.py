"""Quieting named loggers for the length of a block: their own levels, not `logging.disable` (which would silence
every logger of the process, other threads' included, for that time)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager


@contextmanager
def logger_levels(names: Iterable[str], level: int) -> Iterator[None]:
    """Set the named loggers to `level` inside the block and give each its own level back after it."""
    loggers = [logging.getLogger(name) for name in names]
    saved = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(level)
    try:
        yield
    finally:
        for logger, previous in zip(loggers, saved, strict=True):
            logger.setLevel(previous)
