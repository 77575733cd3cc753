"""What the fuzzers (tests/test_fuzz_*.py) share: how many inputs to send, and the tally of what was sent.

`make test` runs them short (each test's own count, at least 10,000 inputs in all). `scripts/fuzz.py`
runs the same tests with RAFTKV_FUZZ_SCALE (say 10) and reads the tally they append, one JSON line
per target, to RAFTKV_FUZZ_REPORT. docs/security.md §7 says which inputs go where and why.
"""

from __future__ import annotations

import copy
import json
import math
import os
import signal
import time
from collections import Counter
from contextlib import contextmanager
from typing import Iterator

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SCALE = float(os.environ.get("RAFTKV_FUZZ_SCALE", "1"))
REPORT = os.environ.get("RAFTKV_FUZZ_REPORT")


def inputs(short: int) -> int:
    """How many inputs a target gets: `short` in `make test`, scaled in a long run."""
    return max(1, round(short * SCALE))


def hypothesis_settings(short: int) -> settings:
    """A hypothesis run of `inputs(short)` examples; no example database (a fresh clone has none)."""
    return settings(max_examples=inputs(short), deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


class Tally:
    """Inputs sent to one target, how they ended (optional), and the findings: what an input made fail
    that should not have."""

    def __init__(self, target: str):
        self.target = target
        self.sent = 0
        self.outcomes: Counter[str] = Counter()
        self.findings: list[str] = []

    def add(self, count: int = 1, outcome: str | None = None) -> None:
        self.sent += count
        if outcome is not None:
            self.outcomes[outcome] += count

    def finding(self, what: str) -> None:
        self.findings.append(what)


@contextmanager
def tally(target: str) -> Iterator[Tally]:
    """Count a target's inputs; on leaving, append the count (and the time it took) to the report."""
    counted = Tally(target)
    started = time.monotonic()
    try:
        yield counted
    finally:
        if REPORT:
            line = {"target": target, "inputs": counted.sent, "seconds": round(time.monotonic() - started, 1),
                    "outcomes": dict(counted.outcomes.most_common()), "findings": counted.findings}
            with open(REPORT, "a") as report:
                report.write(json.dumps(line) + "\n")


# -- what every target mutates with

HOSTILE_TEXTS = ["", " ", "x" * 100_000, "a\nb", "a\r\nb", "\x00", "\x1b[2J", "{id}", "üñï", "\u202e", "-", "--x",
                 "a=b", "=", "[/]", "[bold]b", "%s%n"]
HOSTILE_PATHS = ["../../etc", "/etc/passwd", "..", ".", "/", "a/../../b", "C:\\x", "..\\..\\x", "~root",
                 "x" * 5000, "n1/../n2", "a\x00b"]
HOSTILE_NUMBERS = [0, -1, 1, 2, 65535, 65536, 4096, 4097, 2**31, 2**63 - 1, -2**63, 10**30, -0.0, 0.5, 1e308,
                   math.inf, -math.inf, math.nan]


def _paths(doc, prefix: tuple = ()):
    """Every key path in a document of dicts and lists, tables and leaves alike."""
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        yield prefix + (key,)
        yield from _paths(value, prefix + (key,))


@st.composite
def mutated(draw, valid: dict, values, frozen=lambda path: False) -> dict:
    """`valid` with one to four values set to `values(path)`, deleted, or joined by an unknown key."""
    doc = copy.deepcopy(valid)
    for _ in range(draw(st.integers(1, 4))):
        paths = [path for path in _paths(doc) if not frozen(path)]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(["set", "set", "delete", "add"]))
        if action == "delete":
            del parent[path[-1]]
        elif action == "add" and isinstance(parent, dict):
            parent[draw(st.sampled_from(["x", "", "a\nb", "__class__", "problems"]) | st.text(max_size=8))] = \
                draw(values(path))
        else:
            parent[path[-1]] = draw(values(path))
    return doc


def containers(inner: st.SearchStrategy) -> st.SearchStrategy:
    return st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)


def is_one_line(error: Exception) -> bool:
    return str(error).splitlines() == [str(error)]


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """TimeoutError in this (the main) thread after `seconds` of the process's CPU time: a hang fails its
    input instead of the run. CPU time, not wall time: a loaded machine stretches the one, not the other."""
    def expired(signum, frame):
        raise TimeoutError(f"one input took over {seconds} s of CPU")

    previous = signal.signal(signal.SIGPROF, expired)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


def fuzz(target: str, short: int, strategy: st.SearchStrategy, check, always: list = (), seconds: float = 1) -> None:
    """`check` every value of `always`, then `inputs(short)` values of `strategy`, each within `seconds`;
    tallied under `target` by the outcome `check` names."""
    with tally(target) as sent:
        def counted(value) -> None:
            outcome = "failed"
            try:
                with time_limit(seconds):
                    outcome = check(value)
            finally:
                sent.add(outcome=outcome)

        for value in always:
            counted(value)
        given(strategy)(hypothesis_settings(short)(counted))()
