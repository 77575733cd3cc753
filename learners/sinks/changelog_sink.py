"""The `changelog` sink: events kept in a local RocksDB, for readers that want the feed without Kafka.

Spark's streaming source reads it through the learner's `--api-port`
(learners/changelog_service.py); offsets are Raft indices per partition.

    raftkv learner add changes --sink changelog --sink-option path=/data/changes \
        --sink-option retain_entries=1000000

Layout (raw keys, big-endian so RocksDB's order is (partition, index, seq)):

    e | partition u32 | index u64 | seq u32  ->  a serialized `Change`
    p | partition u32                        ->  delivered up to index (u64)
    t | partition u32                        ->  trimmed through index (u64): the earliest offset
    s | partition u32 | index u64            ->  a re-sync from a snapshot at index: its base (u64)

Events and positions go in one synced WriteBatch per flush, so a crash loses
nothing delivered and a restart never writes an event twice. Retention keeps
the last `retain_entries` Raft indices of each partition; a reader asking for
trimmed history gets an error, never a silent gap. A re-sync (the learner
installed a snapshot: entries base+1..index are one diff at index, not one by
one) is kept while its index is retained, and `offsets` lists it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping

from rocksdict import Rdict, WriteBatch, WriteOptions

from learners.sinks.base import DeliveryBatch
from learners.sinks.change_messages import change_messages
from learners.sinks.options import OptionReader
from raftkv.api import kv_pb2 as pb
from raftkv.core.errors import InvalidRequest
from raftkv.storage import rocks_memory

_EVENT = struct.Struct(">cIQI")
_RESYNC = struct.Struct(">cIQ")
_PARTITION = struct.Struct(">cI")
_INDEX = struct.Struct(">Q")
DEFAULT_RETAIN_ENTRIES = 1_000_000


def _event_key(partition: int, index: int, seq: int = 0) -> bytes:
    return _EVENT.pack(b"e", partition, index, seq)


def plan_ends(pending: Mapping[int, list[tuple[int, int]]], max_rows: int) -> dict[int, int]:
    """The end offset per partition that keeps the total within `max_rows`. Pure.

    `pending` gives each partition's (index, events) pairs after its start,
    in index order. Partitions take whole entries in turns, so one busy
    partition cannot starve the others; every partition with news moves by
    at least one entry, so an entry larger than the budget cannot stall a stream.
    """
    ends = {p: entries[0][0] for p, entries in pending.items() if entries}
    budget = max_rows - sum(pending[p][0][1] for p in ends)
    taken = dict.fromkeys(ends, 1)
    while taken:
        for p in list(taken):
            entries = pending[p]
            if taken[p] == len(entries) or entries[taken[p]][1] > budget:
                del taken[p]  # its next entry does not fit: it waits for the next trigger
                continue
            index, events = entries[taken[p]]
            ends[p] = index
            budget -= events
            taken[p] += 1
    return ends


@dataclass(frozen=True)
class Flushed:
    """What one synced flush added: per partition it moved, the position before (`after`) and after
    (`through`) it, and the serialized `Change`s in between, in order (ChangeLog.Follow serves them)."""

    after: dict[int, int]
    through: dict[int, int]
    changes: dict[int, list[bytes]]


@dataclass(frozen=True)
class ChangelogOptions:
    path: Path
    retain_entries: int = DEFAULT_RETAIN_ENTRIES

    @classmethod
    def parse(cls, config: Mapping[str, str]) -> ChangelogOptions:
        read = OptionReader(config, "changelog sink", {"path", "retain_entries"})
        path = read.text("path", required="path=DIR, where the events are kept")
        retain = read.integer("retain_entries", DEFAULT_RETAIN_ENTRIES, 1)
        read.done()
        return cls(Path(path), retain)


class ChangelogSink:
    def open(self, config: Mapping[str, str]) -> None:
        self.options = ChangelogOptions.parse(config)
        self.retain_entries = self.options.retain_entries
        path = self.options.path
        path.mkdir(parents=True, exist_ok=True)
        options = rocks_memory.options()  # within the learner's budgets, as its copies are
        options.create_if_missing(True)
        self._db = Rdict(str(path), options)
        self._synced = WriteOptions()
        self._synced.sync = True
        self._batch = WriteBatch(raw_mode=True)
        self._positions: dict[int, int] = {}
        self._flushed: dict[int, int] = {}  # the positions as of the last synced flush
        self._unflushed: dict[int, dict[bytes, bytes]] = {}  # the changes delivered since, per partition
        self._trimmed: dict[int, int] = {}
        self._flush_listeners: list[Callable[[Flushed], None]] = []

    # -- the Sink protocol ------------------------------------------------

    def recover(self) -> dict[int, int]:
        self._batch = WriteBatch(raw_mode=True)
        self._positions = self._stored(b"p")
        self._flushed, self._unflushed = dict(self._positions), {}
        self._trimmed = self._stored(b"t")  # only flush() moves it
        return dict(self._positions)

    def deliver(self, batch: DeliveryBatch) -> None:
        put = self._batch.put
        for entry in batch.entries():
            unflushed = self._unflushed.setdefault(entry.partition, {})
            for seq, change in enumerate(change_messages(entry), entry.first_seq):
                key = _event_key(entry.partition, entry.index, seq)
                put(key, change)
                unflushed[key] = change  # by key: a delivery retried after a failed flush adds nothing twice
        for partition, base in batch.resyncs.items():
            put(_RESYNC.pack(b"s", partition, batch.positions[partition]), _INDEX.pack(base))
        self._positions.update(batch.positions)

    def flush(self) -> None:
        trimmed = dict(self._trimmed)
        for partition, index in self._positions.items():
            self._batch.put(_PARTITION.pack(b"p", partition), _INDEX.pack(index))
            trim_through = index - self.retain_entries
            if trim_through > trimmed.get(partition, 0):
                self._batch.delete_range(_event_key(partition, 0), _event_key(partition, trim_through + 1))
                self._batch.delete_range(_RESYNC.pack(b"s", partition, 0),
                                         _RESYNC.pack(b"s", partition, trim_through + 1))
                self._batch.put(_PARTITION.pack(b"t", partition), _INDEX.pack(trim_through))
                trimmed[partition] = trim_through
        self._db.write(self._batch, self._synced)
        self._batch = WriteBatch(raw_mode=True)
        self._trimmed = trimmed
        moved = {p: index for p, index in self._positions.items() if index != self._flushed.get(p)}
        changes = {p: [change for _, change in sorted(by_key.items())] for p, by_key in self._unflushed.items()}
        flushed = Flushed({p: self._flushed.get(p, 0) for p in moved}, moved, changes)
        self._flushed.update(moved)
        self._unflushed = {}
        for listener in self._flush_listeners:
            listener(flushed)

    def close(self) -> None:
        self._db.close()

    # -- reading (from the learner's API threads) ---------------------------

    def on_flush(self, listener: Callable[[Flushed], None]) -> None:
        self._flush_listeners.append(listener)

    def offsets(self, after: Mapping[int, int], max_rows: int) -> list[pb.PartitionOffsets]:
        delivered, trimmed, resyncs = self._stored(b"p"), self._stored(b"t"), self._resyncs()
        starts = {p: after.get(p, trimmed.get(p, 0)) for p in delivered}
        ends = dict(delivered)
        if max_rows:
            pending = {p: self._entry_sizes(p, starts[p], delivered[p], max_rows) for p in delivered}
            planned = plan_ends(pending, max_rows)
            ends = {p: planned.get(p, starts[p]) for p in delivered}
        return [pb.PartitionOffsets(partition=p, earliest=trimmed.get(p, 0), latest=delivered[p],
                                    end=max(ends[p], starts[p]), resyncs=resyncs.get(p, []))
                for p in sorted(delivered)]

    def changes(self, partition: int, after: int, until: int) -> Iterator[pb.Change]:
        trimmed = self._stored(b"t").get(partition, 0)
        if after < trimmed:
            raise InvalidRequest(
                f"partition {partition}: changes after index {after} are no longer retained (the changelog "
                f"keeps index > {trimmed}); restart the stream from a newer offset or raise retain_entries"
            )
        delivered = self._stored(b"p").get(partition, 0)
        if until > delivered:
            raise InvalidRequest(f"partition {partition}: offset {until} is beyond the delivered index {delivered}")
        for index, raw in self._events(partition, after, until):
            yield pb.Change.FromString(raw)

    def _entry_sizes(self, partition: int, after: int, until: int, cap: int) -> list[tuple[int, int]]:
        """(index, events) of each entry with events in (after, until], then (until, 0).

        Counting stops past `cap` events: no plan takes more.
        """
        sizes: list[tuple[int, int]] = []
        for n, (index, _) in enumerate(self._events(partition, after, until)):
            if n > cap:
                return sizes
            if sizes and sizes[-1][0] == index:
                sizes[-1] = (index, sizes[-1][1] + 1)
            else:
                sizes.append((index, 1))
        if not sizes or sizes[-1][0] < until:
            sizes.append((until, 0))  # entries without events still move the offset
        return sizes

    def _events(self, partition: int, after: int, until: int) -> Iterator[tuple[int, bytes]]:
        if after >= until:  # also keeps after + 1 within the key's 64 bits
            return
        for key, raw in self._db.items(from_key=_event_key(partition, after + 1)):
            tag, p, index, _ = _EVENT.unpack(key) if len(key) == _EVENT.size else (b"", 0, 0, 0)
            if tag != b"e" or p != partition or index > until:
                return
            yield index, raw

    def _resyncs(self) -> dict[int, list[pb.Resync]]:
        found: dict[int, list[pb.Resync]] = {}
        for key, value in self._db.items(from_key=b"s"):
            if not key.startswith(b"s"):
                break
            _, partition, index = _RESYNC.unpack(key)
            found.setdefault(partition, []).append(pb.Resync(base=_INDEX.unpack(value)[0], index=index))
        return found

    def _stored(self, tag: bytes) -> dict[int, int]:
        found: dict[int, int] = {}
        for key, value in self._db.items(from_key=tag):
            if not key.startswith(tag):
                break
            found[_PARTITION.unpack(key)[1]] = _INDEX.unpack(value)[0]
        return found
