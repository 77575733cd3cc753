"""A learner's replica of one partition: a pysyncobj readonly node (it never votes).

It shares the voters' replica machinery (journal, loop driver, truncation fix)
but applies nothing by itself: the feed pump reads committed entries from
the journal and writes the copy only after the sink has them (docs/learners.md).
So here:
- the replicated `_apply` is a no-op: pysyncobj's lastApplied just marks
  what is committed;
- a snapshot from the leader is not installed but stashed: the pump turns
  the difference into `r` events first, then installs it;
- the learner's own log compaction happens only when the pump asks for it,
  once it has caught up (voters decide through `maybe_compact`, which a
  learner never runs), so undelivered entries are never dropped.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pysyncobj.pickle

from pysyncobj import replicated

from raftkv.raft import snapshot_file
from raftkv.core.commands import Command, decode_proposal
from raftkv.storage.engine import Position
from raftkv.core.spec import Tuning
from raftkv.raft.syncobj_replica import PartitionReplica

_REGULAR = 0  # pysyncobj's _COMMAND_TYPE.REGULAR: a call of a @replicated method


class LearnerReplica(PartitionReplica):
    def __init__(self, *, partition: int, voter_addresses: list[str], folder: Path, tuning: Tuning,
                 loop: asyncio.AbstractEventLoop):
        self.pending_snapshot: snapshot_file.Meta | None = None
        super().__init__(
            partition=partition,
            self_address=None,
            peer_addresses=voter_addresses,
            folder=folder,
            fsync=False,  # a learner can always fetch again from the voters
            tuning=tuning,
            loop=loop,
        )

    @replicated
    def _apply(self, payload: bytes):
        return None

    @property
    def applied_index(self) -> int:
        """What reads from this learner reflect: the copy, which waits for the sink."""
        return self.engine.position.index

    def committed_entries(self, after: int, limit: int) -> list[tuple[int, int, list[Command]]]:
        """(index, term, commands) of committed entries after `after`, at most `limit` of them.

        Entries that are not our proposals (pysyncobj no-ops, membership) come
        with no commands: they still advance the position.
        """
        journal = self._SyncObj__raftLog
        first = journal[0][1]
        last = min(self.raftLastApplied, journal[-1][1])
        if after + 1 < first:
            raise LookupError(f"partition {self.partition}: entries after {after} were compacted away")
        out = []
        for command, index, term in journal[after + 1 - first: min(last, after + limit) + 1 - first]:
            out.append((index, term, _commands_of(command)))
        return out

    def _start_snapshot(self, tmp_filename: str, data):
        last_index = data[0][1]
        if self.engine.position.index < last_index:
            # pysyncobj would drop journal entries the pump has not delivered yet
            raise RuntimeError(f"the feed is behind index {last_index}; compaction waits")
        return super()._start_snapshot(tmp_filename, data)

    def _read_snapshot(self, filename: str):
        meta = snapshot_file.read_meta(filename)
        if meta.position.index > self.engine.position.index or meta.last_entry[1] > self.engine.position.index:
            self.pending_snapshot = meta
        return meta.last_entry, meta.prev_entry, meta.cluster

    def snapshot_path(self) -> str:
        return self.conf.fullDumpFile

    def mark_snapshot_installed(self, meta: snapshot_file.Meta) -> None:
        """After the pump installed the stashed snapshot: the copy stands at the snapshot's index."""
        last_index, last_term = meta.last_entry[1], meta.last_entry[2]
        if self.engine.position.index < last_index:
            self.engine.write([], Position(last_index, last_term))
        self.pending_snapshot = None

    def compact_when_longer_than(self, entries: int) -> None:
        """The pump calls this once it has delivered what the journal holds."""
        if len(self._SyncObj__raftLog) > entries:
            self.forceLogCompaction()


def _commands_of(command: bytes) -> list[Command]:
    if not command or command[0] != _REGULAR:
        return []
    call = pysyncobj.pickle.loads(command[1:])  # pysyncobj's (method id, args): args == (payload,)
    return decode_proposal(call[1][0])
