"""The node's write-ahead log: one log for the Raft groups of every replica on the node (tikv/raft-engine).

A RaftJournal per replica pays a write and an fsync per group; here every group's entries, terms,
votes and commit indexes go to one log, so a loop turn that touched many groups costs one `write`
(`batch()` / `write_pending()`) and one `fdatasync` (`sync()`). `group(id)` gives a group's
`GroupLog`, a view with RaftJournal's interface that pysyncobj can use as its journal.

On disk (`node_log_format` has the bytes): segment files `<seq:016d>.log`, each rolled past
`segment_bytes` once the last is synced, and `meta`, the durable point (segment and offset the
last sync covered), rewritten atomically once a second in both modes. Each sync is also noted,
for free, at the head of the next write (a `synced` record), so the durable point read back at
start-up trails the real one by at most the last write (RaftJournal's trailed by up to a second,
in fsync mode too: damage to synced bytes in that second read as a torn tail). Recovery rules:
`node_log_recovery`.

Durability, as RaftJournal: a record is written with one `os.write` when its call returns (it
survives kill -9) unless the caller batched it; `setCurrentTerm` and `remove` are synced before
they return, in both modes; fsync mode syncs when the caller asks (`dirty`, `sync()`), the default
mode once a second (`onOneSecondTimer`, or `sync_in_background()` from the syncer thread). After
a failed fsync every later sync raises DiskFailed. A write the disk has no room for is cut back
(StorageFull) and `full` stays true until FULL_UNTIL_FREE_BYTES are free.

Space: the oldest segments holding no live record (every group's entries in it compacted,
truncated or rewritten, its state superseded, its group removed) are deleted after a sync that
makes what killed them durable. `purge()` rewrites the few groups that hold the oldest segment at
the head so it can go (raft-engine's purge). Segments go oldest first only: a later segment's
truncate or compact record may still matter to the older records before it.

Threads: one lock guards the state and every write; fsyncs run outside it (under their own
lock), so the event loop's writes never wait for the syncer's fdatasync.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from raftkv import failpoints
from raftkv.core.errors import CorruptData, StorageFull
from raftkv.raft.journal import RaftJournal
from raftkv.raft.node_log_format import (
    NO_GROUP, Entry, GrowingEntries, Kind, Point, bare_record, entries_record, state_record, synced_record,
)
from raftkv.raft.node_log_groups import PENDING, GroupState
from raftkv.raft.node_log_segments import SegmentFiles
from raftkv.raft.node_log_view import GroupLog
from raftkv.raft.record_file import FULL_UNTIL_FREE_BYTES

__all__ = ["FULL_UNTIL_FREE_BYTES", "GroupLog", "NodeLog", "Purged"]

SEGMENT_BYTES = 64 << 20
PURGE_BYTES = 8 << 20  # what one purge() rewrites at most (beyond its first group)
TIMER_SECONDS = 0.5  # the once-a-second work runs at most this often, however many groups tick
MAX_GROUP = NO_GROUP - 1


@dataclass(frozen=True)
class Purged:
    rewritten: tuple[int, ...]  # groups whose live entries and state were written again at the head
    holding: tuple[int, ...]  # groups that still hold the oldest segment (the next call's; or compact them)
    deleted: int  # segments deleted


class NodeLog:
    def __init__(self, folder: str | os.PathLike[str], fsync: bool, *, segment_bytes: int = SEGMENT_BYTES,
                 clock: Callable[[], float] = time.monotonic):
        self._fsync = fsync
        self._clock = clock
        self._lock = threading.RLock()  # the state, and every write
        self._sync_lock = threading.Lock()  # one sync at a time; taken before _lock, never while holding it
        self._closed = False
        self._error_count = 0  # failures of background syncs; each view raises the last once for each
        self._last_error: Exception | None = None
        self._synced_elsewhere = False
        self._last_timer = float("-inf")
        self._batching = 0
        self._on_pending: Callable[[], None] | None = None  # `defer_writes`
        self._pending: list[bytes | GrowingEntries] = []  # records batched, in order
        self._pending_groups: set[GroupState] = set()
        self._open: dict[GroupState, GrowingEntries] = {}  # a group's batched entries record, if its last
        self._unsaved: set[int] = set()  # groups whose commit index changed since their last state record
        self._views: dict[int, GroupLog] = {}
        self._writes = 0  # os.write calls so far
        self._synced_writes = 0  # ... that a sync covered
        self._collectable = 0  # segments below this were dead as of a completed sync
        self._files = SegmentFiles(Path(folder), fsync, segment_bytes)
        self._groups = self._files.recovered
        self._marked = self._files.durable  # the durable point the log itself last recorded

    # Groups

    def group(self, group: int) -> GroupLog:
        """The log of `group`, created (with a state record) if it has none."""
        if not 0 <= group <= MAX_GROUP:
            raise ValueError(f"group {group} is not a u32 below {NO_GROUP}")
        with self._lock:
            view = self._views.get(group)
            if view is not None and not view.closed:
                return view
            state = self._groups.get(group)
            if state is None:
                state = GroupState()
                self._record(state, state_record(group, state.term, state.commit, state.voted),
                             lambda seq: state.set_state(state.term, state.commit, state.voted, seq))
                self._groups[group] = state
            view = self._views[group] = GroupLog(self, group, state)
            return view

    def groups(self) -> list[int]:
        """Every group this log holds (created or recovered, not removed)."""
        return sorted(self._groups)

    def remove(self, group: int) -> None:
        """Drop `group` for good (its replica was deleted): a `remove` record, synced before this returns."""
        with self._lock:
            state = self._groups.get(group)
            if state is None:
                return
            self._record(state, bare_record(Kind.REMOVE, group), lambda seq: self._forget(group))
        self.sync()

    def convert(self, journal_dir: str | os.PathLike[str], group: int) -> GroupLog:
        """Import a replica's RaftJournal (entries, term, vote, commit index) as `group`, synced before this
        returns. Whatever the log held for `group` is replaced, so a conversion cut short by a crash is
        simply done again. The caller then marks the journal converted (a marker file, synced) and deletes
        it: restarted before the mark, the replica runs on its journal; after, on this log."""
        journal = RaftJournal(journal_dir, fsync=True)
        try:
            entries, voted = journal[:], journal.getVotedForNodeId()
            term, commit = journal.getCurrentTerm(), journal.getRaftCommitIndex()
        finally:
            journal._destroy()
        view = self.group(group)
        with self._lock:
            self._replace(group, view.state, entries, term, commit, voted)
        self.sync()
        return view

    def _replace(self, group: int, state: GroupState, entries: list[Entry], term: int, commit: int,
                 voted: str | None) -> None:
        """Write a group's whole log and state anew: a replace record (all or nothing), then a state record."""
        items = ((command, entry_term) for command, _, entry_term in entries)
        records = (entries_record(group, entries[0][1] if entries else 0, items, Kind.REPLACE)
                   + state_record(group, term, commit, voted))

        def apply(seq: int) -> None:
            state.replace(entries, seq)
            state.set_state(term, commit, voted, seq)

        self._record(state, records, apply)
        self._unsaved.discard(group)

    # Writing

    @contextmanager
    def batch(self) -> Iterator[NodeLog]:
        """Collect every record until the outermost batch ends, then write them with one os.write.
        Until then they are in memory only: nothing may be said of them (send none of the entries).
        If that write fails, they stay batched for the next write (the disk may be full)."""
        with self._lock:
            self._batching += 1
        body_failed = True
        try:
            yield self
            body_failed = False
        finally:
            with self._lock:
                self._batching -= 1
                if not self._batching and self._pending:
                    try:
                        self._write()
                    except (StorageFull, OSError):
                        if not body_failed:  # else the body's error is the one to raise
                            raise

    def defer_writes(self, on_pending: Callable[[], None]) -> None:
        """From now on every record waits in the batch until `write_pending()` (or a sync, flush, removal)
        writes it: a loop turn's records of every group in one write. `on_pending()` is called (on the loop,
        which makes records) when one joins an empty batch: the owner writes it by the turn's end (`log_turn`)."""
        with self._lock:
            self._batching += 1
            self._on_pending = on_pending

    def write_pending(self) -> int:
        """Write what is batched now, in one os.write; return how many writes this log has made."""
        with self._lock:
            if self._pending:
                self._write()
            return self._writes

    @property
    def written(self) -> int:
        """How many os.write calls this log has made; `synced` is how many of them a sync covered."""
        return self._writes

    @property
    def synced(self) -> int:
        return self._synced_writes

    @property
    def covering_write(self) -> int:
        """The number of the write that covers every record made so far: the next one if any is batched."""
        with self._lock:
            return self._writes + (1 if self._pending else 0)

    @property
    def durable_point(self) -> Point:
        """The segment and offset the last sync covered."""
        return self._files.durable

    @property
    def segments(self) -> list[int]:
        """The sequence numbers of the segment files, oldest first."""
        return list(self._files.seqs)

    def segment_path(self, seq: int) -> Path:
        return self._files.path(seq)

    @property
    def folder(self) -> Path:
        return self._files.folder

    @property
    def closed(self) -> bool:
        return self._closed

    def _record(self, state: GroupState, record: bytes, apply: Callable[[int], None]) -> None:
        """Write `record` of the group of `state` (or batch it) and `apply` it to memory with the segment it
        went to. Unbatched, a failed write changes nothing. Holds the lock."""
        self._open.pop(state, None)
        if self._batching:
            if not self._pending and self._on_pending is not None:
                self._on_pending()
            self._pending.append(record)
            self._pending_groups.add(state)
            state.pending = True
            apply(PENDING)
        else:
            seq = self._write(record)
            state.written = self._writes
            apply(seq)

    def _queue_entry(self, group: int, state: GroupState, command: bytes, idx: int, term: int) -> None:
        """GroupLog.add in a batch: the entry joins its group's last batched record if that is entries."""
        op = self._open.get(state)
        if op is None or op.next != idx:
            if not self._pending and self._on_pending is not None:
                self._on_pending()
            op = self._open[state] = GrowingEntries(group, idx)
            self._pending.append(op)
            self._pending_groups.add(state)
            state.pending = True
        op.items.append((command, term))
        op.next = idx + 1
        state.append_one((command, idx, term), PENDING)

    def _write(self, record: bytes = b"") -> int:
        """Write everything batched, then `record`, with one os.write; return the segment written to.
        Holds the lock. A failed write is cut back off the file; what was batched stays batched."""
        files = self._files
        marker = files.durable
        data = record
        if self._pending or marker > self._marked:
            parts = [synced_record(marker)] if marker > self._marked else []
            parts += [op if isinstance(op, bytes) else op.encode() for op in self._pending]
            parts.append(record)
            data = b"".join(parts)
        head = files.seq
        seq = files.write(data)
        if seq != head:  # rolled: the last segment was synced first
            self._synced_writes = self._writes
        self._writes += 1
        self._marked = marker
        if self._pending:
            for state in self._pending_groups:
                state.settle(seq, self._writes)
            self._pending.clear()
            self._pending_groups.clear()
            self._open.clear()
        return seq

    def _forget(self, group: int) -> None:
        del self._groups[group]
        self._unsaved.discard(group)
        view = self._views.pop(group, None)
        if view is not None:
            view.closed = True

    def _save_states(self) -> None:
        """A state record for each group whose commit index moved since its last one: one write."""
        with self._lock, self.batch():
            for group in self._unsaved:
                state = self._groups[group]
                self._record(state, state_record(group, state.term, state.commit, state.voted),
                             lambda seq, state=state: state.set_state(state.term, state.commit, state.voted, seq))
            self._unsaved.clear()

    # Durability

    @property
    def full(self) -> bool:
        """A write failed for want of space, and the disk has not had FULL_UNTIL_FREE_BYTES free since."""
        return self._files.space.full

    def sync(self) -> int:
        """Write what is batched and make every write so far durable with one fdatasync, for every group
        (none if nothing was written since the last sync). Returns how many writes are now durable.

        Raises DiskFailed if the fsync fails, and again on every later call: the kernel may have dropped
        the unsynced pages and would report the next fsync as a success."""
        with self._sync_lock:
            return self._settle()[0]

    def sync_written(self) -> int:
        """`sync()` of what is written, not of what is batched: for a thread other than the one that makes
        records (the loop's turn hands it its fdatasync and runs on, `log_turn`)."""
        with self._sync_lock:
            return self._settle(write=False)[0]

    def flush(self) -> None:
        """Every group's commit index written, everything synced, the meta file saved, dead segments deleted."""
        self._save_states()
        with self._sync_lock:
            self._settle(collect=True, save=True)

    def collect(self) -> int:
        """Sync, then delete the oldest segments that hold no live record; return how many went."""
        with self._sync_lock:
            return self._settle(collect=True)[1]

    def purge(self, max_bytes: int = PURGE_BYTES) -> Purged:
        """Rewrite the groups holding the oldest segment at the head (smallest first, at least one, then
        as many as fit in `max_bytes` of live entries), sync and delete the segments that died."""
        with self._lock:
            self._check_failed()
            oldest, head = self._files.seqs[0], self._files.seq
            holders = sorted((g for g, state in self._groups.items() if state.first_seq() == oldest),
                             key=lambda g: (self._groups[g].live_bytes, g))
            chosen: list[int] = []
            budget = 0
            for group in holders if oldest != head else ():
                budget += self._groups[group].live_bytes
                if chosen and budget > max_bytes:
                    break
                chosen.append(group)
            with self.batch():
                for group in chosen:
                    state = self._groups[group]
                    self._replace(group, state, list(state.entries), state.term, state.commit, state.voted)
        deleted = self.collect()
        with self._lock:
            oldest, head = self._files.seqs[0], self._files.seq
            still = tuple(g for g, state in self._groups.items() if state.first_seq() == oldest != head)
        return Purged(tuple(chosen), tuple(sorted(still)), deleted)

    def sync_elsewhere(self) -> None:
        """From now on another thread calls `sync_in_background` about once a second, and the groups'
        timers only write the commit indexes and report what that thread ran into."""
        self._synced_elsewhere = True

    def sync_in_background(self) -> bool:
        """The once-a-second sync, from the syncer's thread: what is written (not what is batched) synced,
        the meta file saved, dead segments deleted. A failure is raised by each group's next
        `onOneSecondTimer`. False once the log is closed."""
        with self._sync_lock:
            if self._closed:
                return False
            try:
                self._settle(write=False, collect=True, save=True)
            except (CorruptData, StorageFull, OSError) as error:
                self._error_count += 1
                self._last_error = error
            return True

    def on_timer(self) -> None:
        """A group's onOneSecondTimer: at most once per TIMER_SECONDS for all groups, write the moved commit
        indexes and (unless synced elsewhere) sync, save the meta file and delete dead segments."""
        self._check_failed()
        now = self._clock()
        if now - self._last_timer < TIMER_SECONDS:
            return
        self._last_timer = now
        self._save_states()
        if not self._synced_elsewhere:
            with self._sync_lock:
                self._settle(collect=True, save=True)

    def close(self) -> None:
        """Write and sync everything (unless the disk failed) and close the files; the views go with it."""
        with self._sync_lock:
            if self._closed:
                return
            try:
                if self._files.failed is None:
                    self._save_states()
                    self._settle(save=True)
            finally:
                with self._lock:  # no write may be under way on the fds it closes
                    self._closed = True
                    self._files.close()
                    for view in self._views.values():
                        view.closed = True

    def __enter__(self) -> NodeLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _check_failed(self) -> None:
        if self._files.failed is not None:
            raise self._files.failed

    def _settle(self, write: bool = True, collect: bool = False, save: bool = False) -> tuple[int, int]:
        """Holding _sync_lock: write what is batched (unless not to), sync, and with `collect` delete the
        segments that were dead as of that sync, with `save` save the meta file. Returns the writes now
        durable and how many segments were deleted."""
        if write:
            with self._lock:
                self._check_failed()
                if self._pending:
                    self._write()
        synced = self._sync_written(collect)
        if save:
            self._files.save_meta()
        return synced, self._delete_dead() if collect else 0

    def _sync_written(self, collect: bool) -> int:
        """fdatasync what is written; with `collect`, note the segments that were dead as of then.
        Holds _sync_lock, not _lock: the loop writes on meanwhile."""
        files = self._files
        with self._lock:
            self._check_failed()
            files.close_retired()  # no fsync runs on them: that takes _sync_lock
            writes, fd, point = self._writes, files.fd, (files.seq, files.end)
            # With nothing batched, memory shows exactly what is written, which this sync makes durable.
            floor = self._floor() if collect and not self._pending else None
        if writes != self._synced_writes:
            files.fsync(fd, point[0], "journal-fsync-before")  # retired by a roll meanwhile, it is still open
            with self._lock:
                self._synced_writes = max(self._synced_writes, writes)
                files.mark_durable(point)
            failpoints.hit("journal-fsync-after")
        if floor is not None:
            self._collectable = max(self._collectable, floor)
        return self._synced_writes

    def _floor(self) -> int:
        head = self._files.seq
        return min((seq for state in self._groups.values() if (seq := state.first_seq()) is not None), default=head)

    def _delete_dead(self) -> int:
        """Delete the oldest segments below the collectable floor; holds _sync_lock."""
        with self._lock:
            dead = self._files.dead_below(self._collectable)
        self._files.delete(dead)
        return len(dead)
