"""What the logs of a test's node and learner processes say went wrong unseen: a traceback, or an
asyncio task or future whose exception nobody retrieved.

A log is cut into records, each a line that starts with the processes' log format's timestamp and the
lines after it up to the next one (a logged traceback, or one a dying thread printed on stderr). A record
holding a traceback or an unretrieved exception is unexpected unless a pattern the test declares
(`@pytest.mark.expected_log("pattern", ...)`, searched in the whole record) or one of `BY_DESIGN` matches it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable

MARKERS = ("Traceback (most recent call last)", "Task exception was never retrieved",
           "Future exception was never retrieved")
LOG_FILES = ("node.log", "learner*.log")  # under a test's tmp_path: where the tests' processes write

# Tracebacks that every test may produce, each with the reason it is not a bug. Keep it short: a handled
# case that logs a traceback is better fixed where it is logged.
BY_DESIGN: tuple[str, ...] = (
    # grpc's aio server logs, from its own code, a call it cancelled itself: one still running when a node
    # stopping gracefully (a clean restart) reached the end of its grace (Node.stop fails what calls wait
    # on first; a call that arrived since is cut). No frame of ours: a raftkv frame would not match.
    r"(?s)^(?!.*/raftkv/).*Exception not handled by _handle_exceptions in servicer method.*"
    r"\nasyncio\.exceptions\.CancelledError\s*$",
)

_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")
_SHOWN_LINES = 40


def records(text: str) -> list[str]:
    """The log's records, each with its continuation lines; text before the first record is one too."""
    found: list[list[str]] = []
    for line in text.splitlines():
        if _RECORD.match(line) or not found:
            found.append([])
        found[-1].append(line)
    return ["\n".join(lines) for lines in found]


def unexpected(text: str, expected: Iterable[str] = ()) -> list[str]:
    """The records of `text` that hold a traceback or an unretrieved exception that no pattern of
    `expected` or `BY_DESIGN` matches."""
    allowed = [re.compile(p) for p in (*expected, *BY_DESIGN)]
    return [r for r in records(text)
            if any(m in r for m in MARKERS) and not any(p.search(r) for p in allowed)]


def report(root: Path, expected: Iterable[str] = ()) -> str:
    """'' when no process log under `root` has an unexpected record, else each one, by file."""
    expected = list(expected)
    parts = []
    for pattern in LOG_FILES:
        for path in sorted(root.glob(f"**/{pattern}")):
            for record in unexpected(path.read_text(errors="replace"), expected):
                lines = record.splitlines()
                shown = lines[:_SHOWN_LINES] + ([f"... ({len(lines) - _SHOWN_LINES} more lines)"]
                                                if len(lines) > _SHOWN_LINES else [])
                parts.append(f"{path.relative_to(root)}:\n" + "\n".join(f"    {line}" for line in shown))
    return "\n".join(parts)
