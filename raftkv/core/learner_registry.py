"""The learners a partition knows, as stored in its state machine's metadata. Pure.

Registrations and progress travel through the partition's Raft log
(RegisterLearner, RemoveLearner, LearnerProgress), so every voter holds the
same registry and progress survives leader changes. Stored under:

    learner/<name>   JSON {"sink": ..., "options": {...}}
    progress/<name>  u64: the highest index the learner reported as delivered
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

from raftkv.core.commands import LearnerProgress, RegisterLearner, RemoveLearner

_LEARNER = b"learner/"
_PROGRESS = b"progress/"
_U64 = struct.Struct("<Q")

MetaUpdates = dict[bytes, bytes | None]  # the metadata writes a learner command makes


@dataclass(frozen=True)
class LearnerInfo:
    name: str
    sink: str
    options: Mapping[str, str] = field(default_factory=dict)
    progress: int = 0


def only_progress(commands: Iterable[object]) -> bool:
    """An entry that only reports learners' progress (or none at all: a Raft no-op). Delivering one
    is no reason to report progress again: a report is itself such an entry, and a learner that
    reported each would never let its partition's log rest."""
    return all(isinstance(c, LearnerProgress) for c in commands)


def register_updates(command: RegisterLearner) -> MetaUpdates:
    doc = {"sink": command.sink, "options": dict(command.options)}
    return {_LEARNER + command.name.encode(): json.dumps(doc, sort_keys=True).encode()}


def remove_updates(command: RemoveLearner) -> MetaUpdates:
    return {_LEARNER + command.name.encode(): None, _PROGRESS + command.name.encode(): None}


def progress_updates(command: LearnerProgress, read_meta: Callable[[bytes], bytes | None]) -> MetaUpdates:
    learner_key, progress_key = _LEARNER + command.name.encode(), _PROGRESS + command.name.encode()
    if read_meta(learner_key) is None:
        return {}  # progress of a learner removed meanwhile
    current = read_meta(progress_key)
    if current is not None and _U64.unpack(current)[0] >= command.index:
        return {}
    return {progress_key: _U64.pack(command.index)}


def learner_names(meta: Iterable[tuple[bytes, bytes]]) -> set[str]:
    """The names of the learners registered, without decoding their records."""
    return {key[len(_LEARNER):].decode() for key, _ in meta if key.startswith(_LEARNER)}


def learners_from(meta: Iterable[tuple[bytes, bytes]]) -> dict[str, LearnerInfo]:
    docs, progress = {}, {}
    for key, value in meta:
        if key.startswith(_LEARNER):
            docs[key[len(_LEARNER):].decode()] = json.loads(value)
        elif key.startswith(_PROGRESS):
            progress[key[len(_PROGRESS):].decode()] = _U64.unpack(value)[0]
    return {
        name: LearnerInfo(name, doc["sink"], doc["options"], progress.get(name, 0))
        for name, doc in sorted(docs.items())
    }
