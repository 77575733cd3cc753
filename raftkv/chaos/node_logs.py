"""What each node of a chaos run wrote to its log since a mark: since it last started, or since a
fault began. The fault injector reads it to check how a node handled a fault."""

from __future__ import annotations

from pathlib import Path
from typing import Callable


class NodeLogs:
    def __init__(self, log_path: Callable[[str], Path]):
        self._log_path = log_path
        self._offsets: dict[str, int] = {}  # where each node's log was at its mark

    def mark(self, node_id: str) -> None:
        """What the node writes from now on is what `lines` and `errors` read."""
        log = self._log_path(node_id)
        self._offsets[node_id] = log.stat().st_size if log.exists() else 0

    def lines(self, node_id: str, containing: str) -> list[str]:
        """The lines of the node's log since its mark that contain `containing`."""
        text = _read_from(self._log_path(node_id), self._offsets.get(node_id, 0))
        return [line for line in text.splitlines() if containing in line]

    def errors(self, node_id: str) -> list[str]:
        """The node's one-line errors (`error: ...`) since its mark."""
        return [line for line in self.lines(node_id, "error: ") if line.startswith("error: ")]


def _read_from(path: Path, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
