"""What a simulation did, step by step: every message delivered (or lost) and every event, kept as
tuples and turned into text only when a run fails."""

from __future__ import annotations

import zlib
from collections import Counter

from raftkv.raft.engine import items
from tests.engine_sim.clock import Scheduler

_SHORT = {"append_entries": "append", "next_node_idx": "ack", "request_vote": "vote?", "response_vote": "vote!",
          "apply_command": "forward", "apply_command_response": "forwarded", "timeout_now": "timeout_now"}


class Trace:
    def __init__(self, scheduler: Scheduler):
        self._scheduler = scheduler
        self.lines: list[tuple] = []
        self.counts: Counter[str] = Counter()  # events by kind

    def add(self, kind: str, text: str) -> None:
        self.counts[kind] += 1
        self.lines.append((self._scheduler.steps, self._scheduler.now, kind, text))

    def message(self, kind: str, a: str, b: str, group: int, message: object) -> None:
        self.counts[kind] += 1
        self.lines.append((self._scheduler.steps, self._scheduler.now, kind, (a, b, group, message)))

    def digest(self) -> int:
        """Of the whole trace: equal for two runs of one seed, in any process. Within a step, the order of
        its lines follows pysyncobj's walk over a set of nodes, which differs between processes, so the
        lines are taken in sorted order."""
        return zlib.crc32("\n".join(sorted(_render(line) for line in self.lines)).encode())

    def render(self, last: int | None = None) -> str:
        lines = self.lines if last is None else self.lines[-last:]
        return "\n".join(_render(line) for line in lines)


def _render(line: tuple) -> str:
    step, when, kind, body = line
    if isinstance(body, tuple):
        a, b, group, message = body
        body = f"g{group} {a}->{b} {describe(message)}"
    return f"{step:>8} {when:9.4f} {kind:<8} {body}"


def describe(message: object) -> str:
    """A pysyncobj message, or an engine frame, in one short line."""
    if isinstance(message, list):
        return "engine [" + "; ".join(items.describe(item) for item in message) + "]"
    if not isinstance(message, dict):
        return repr(message)
    kind = message.get("type")
    short = _SHORT.get(kind, kind)
    if kind == "append_entries":
        entries = message.get("entries", ())
        span = f" {entries[0][1]}..{entries[-1][1]}" if entries else ""
        terms = "/".join(str(t) for t in sorted({e[2] for e in entries}))
        prev = f" prev {message.get('prevLogIdx')}:{message.get('prevLogTerm')}" if "prevLogIdx" in message else " snapshot"
        return f"{short} t{message['term']}{prev} commit {message['commit_index']}{span}{' t' + terms if terms else ''}"
    if kind == "next_node_idx":
        flags = ("ok" if message["success"] else "no") + (" reset" if message["reset"] else "")
        return f"{short} next {message['next_node_idx']} {flags}"
    if kind == "request_vote":
        return f"{short} t{message['term']} last {message['last_log_index']}:{message['last_log_term']}"
    rest = " ".join(f"{k}={v}" for k, v in message.items() if k not in ("type", "command"))
    return f"{short} {rest}"
