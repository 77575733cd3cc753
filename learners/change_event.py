"""The ChangeEvent envelope (v1) and its JSON encoding. Pure.

    {"v": 1, "op": "c|u|d|r", "key": <b64>, "before": <b64|null>, "after": <b64|null>,
     "source": {"cluster": ..., "partition": p, "index": i, "term": t, "seq": k, "snapshot": bool},
     "ts_ms": ...}

(partition, index, seq) identifies an event exactly: one Raft entry carries a
whole group commit, so `seq` numbers the events of one entry (docs/learners.md).
The JSON Schema is learners/schema/change_event.v1.json.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path

VERSION = 1
OPS = ("c", "u", "d", "r")
SCHEMA_PATH = Path(__file__).parent / "schema" / "change_event.v1.json"


@dataclass(frozen=True, slots=True)
class ChangeEvent:
    op: str
    key: bytes
    before: bytes | None
    after: bytes | None
    cluster: str
    partition: int
    index: int
    term: int
    seq: int
    snapshot: bool
    ts_ms: int

    @property
    def event_id(self) -> tuple[int, int, int]:
        """What consumers deduplicate by."""
        return (self.partition, self.index, self.seq)

    def to_dict(self) -> dict:
        return {
            "v": VERSION,
            "op": self.op,
            "key": _b64(self.key),
            "before": _b64(self.before),
            "after": _b64(self.after),
            "source": {
                "cluster": self.cluster,
                "partition": self.partition,
                "index": self.index,
                "term": self.term,
                "seq": self.seq,
                "snapshot": self.snapshot,
            },
            "ts_ms": self.ts_ms,
        }

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), separators=(",", ":")).encode()

    @classmethod
    def from_dict(cls, doc: dict) -> ChangeEvent:
        if doc.get("v") != VERSION:
            raise ValueError(f"unsupported ChangeEvent version {doc.get('v')!r}")
        source = doc["source"]
        return cls(
            op=doc["op"],
            key=_unb64(doc["key"]),
            before=_unb64(doc["before"]),
            after=_unb64(doc["after"]),
            cluster=source["cluster"],
            partition=source["partition"],
            index=source["index"],
            term=source["term"],
            seq=source["seq"],
            snapshot=source["snapshot"],
            ts_ms=doc["ts_ms"],
        )

    @classmethod
    def from_json(cls, data: bytes | str) -> ChangeEvent:
        return cls.from_dict(json.loads(data))


def max_json_bytes(cluster: str, max_key_bytes: int, max_value_bytes: int) -> int:
    """The longest `to_json()` of any event of a cluster with these key and value limits: an update
    carries the value twice, before and after, base64 (4 bytes for every 3)."""
    frame = ChangeEvent("u", b"", b"", b"", cluster, _LARGEST, _LARGEST, _LARGEST, _LARGEST, False,
                        _LARGEST).to_json()
    return len(frame) + _b64_bytes(max_key_bytes) + 2 * _b64_bytes(max_value_bytes)


_LARGEST = 2 ** 63 - 1  # no index, term, seq or time is wider


def _b64_bytes(length: int) -> int:
    return 4 * -(-length // 3)


def _b64(value: bytes | None) -> str | None:
    return None if value is None else base64.b64encode(value).decode()


def _unb64(value: str | None) -> bytes | None:
    return None if value is None else base64.b64decode(value, validate=True)
