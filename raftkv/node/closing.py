"""Closing a process's parts one after another, whatever fails (a node's, a learner's)."""

from __future__ import annotations

import logging
from typing import Callable

log = logging.getLogger(__name__)


def close_reporting(what: str, close: Callable[[], None]) -> None:
    """Close, and log in one line if that failed: after a disk failed, closing its files fails too,
    and must neither hide the reason for stopping nor keep the other parts from closing."""
    try:
        close()
    except Exception as exc:
        log.warning("closing %s failed: %s", what, exc)
