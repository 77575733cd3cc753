"""Default durability's once-a-second journal sync for every replica of a process, on a thread.

In the default mode each journal is synced about once a second (its fdatasync, and its meta file
rewritten and synced), which pysyncobj runs from the replica's tick, on the event loop. That is
two fsyncs per replica per second that the loop waits for: at 256 partitions a node spent half its
time there, and puts fell to a third of what they were without (docs/benchmarks.md). Here one
thread per process runs them for every journal, whether or not its group ticks (a resting group
does not), and the loop goes on meanwhile: fsync releases the GIL.

A process with a node log (`node_log.NodeLog`, every group of a node in one log) adds that log
instead: one sync per second for all its groups.

A journal's lock keeps its own writes and this sync apart (`RaftJournal.sync_in_background`), so
what reaches the disk is what a sync on the loop would have written. A failure is raised on the
replica's next tick, as before. fsync mode does not come here: it syncs before every message.
"""

from __future__ import annotations

import logging
import threading

from typing import Protocol

log = logging.getLogger(__name__)

PERIOD_SECONDS = 1.0


class Syncable(Protocol):
    """A RaftJournal or a NodeLog."""

    def sync_elsewhere(self) -> None: ...

    def sync_in_background(self) -> bool: ...


class JournalSyncer:
    def __init__(self, period: float = PERIOD_SECONDS):
        self._period = period
        self._journals: set[Syncable] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, journal: Syncable) -> None:
        journal.sync_elsewhere()
        with self._lock:
            self._journals.add(journal)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="journal-syncer", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        wait = threading.Event().wait
        while True:
            wait(self._period)
            with self._lock:
                journals = list(self._journals)
            for journal in journals:
                try:
                    open_still = journal.sync_in_background()
                except Exception:  # the thread must outlive any one journal's trouble
                    log.exception("the background sync of a Raft journal failed")
                    open_still = True
                if not open_still:
                    with self._lock:
                        self._journals.discard(journal)


SYNCER = JournalSyncer()
