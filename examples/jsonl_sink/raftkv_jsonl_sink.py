"""An example raftkv sink in one file: ChangeEvents as JSON lines in a local file.

Install it (`pip install ./examples/jsonl_sink`) and run a learner with
`--sink jsonl --sink-option path=feed.jsonl`. It shows the whole contract:
events are appended and fsynced, then the positions (and the file size they
cover) are written to `<path>.positions` atomically. On recover, anything
after the recorded size, written before a crash but never committed, is cut off.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping

from learners.sinks.base import DeliveryBatch
from raftkv.core.errors import ConfigError


class JsonlSink:
    def open(self, config: Mapping[str, str]) -> None:
        if not config.get("path"):
            raise ConfigError("the jsonl sink needs path=FILE", source="--sink-option")
        self.path = Path(config["path"])
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.positions_path = Path(f"{self.path}.positions")
        self.positions: dict[int, int] = {}
        self.file = open(self.path, "ab")

    def recover(self) -> dict[int, int]:
        if self.positions_path.exists():
            state = json.loads(self.positions_path.read_text())
            self.positions = {int(p): i for p, i in state["positions"].items()}
            self.file.truncate(state["size"])
        else:
            self.file.truncate(0)
        self.file.seek(0, os.SEEK_END)
        return dict(self.positions)

    def deliver(self, batch: DeliveryBatch) -> None:
        self.file.write(b"".join(event.to_json() + b"\n" for event in batch.events))
        self.positions.update(batch.positions)

    def flush(self) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())
        tmp = Path(f"{self.positions_path}.tmp")
        with open(tmp, "w") as f:
            json.dump({"positions": self.positions, "size": self.file.tell()}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.positions_path)

    def close(self) -> None:
        self.file.close()
