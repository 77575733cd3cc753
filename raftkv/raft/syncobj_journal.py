"""Our `RaftJournal` wired into pysyncobj: built by its `createJournal`, synced before any send.

In fsync mode the transport syncs the journal before any message leaves, so
an entry is durable before a follower acknowledges it or a leader counts
itself, at one fsync per group commit.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pysyncobj.syncobj
from pysyncobj.transport import TCPTransport

from raftkv.raft.journal import RaftJournal


@dataclass(frozen=True)
class JournalConfig:
    """Passed as SyncObjConf.journalFile; our createJournal hook builds a RaftJournal from it."""

    directory: Path
    fsync: bool


_upstream_create_journal = pysyncobj.syncobj.createJournal


def _create_journal(journal_file):
    if isinstance(journal_file, JournalConfig):
        return RaftJournal(journal_file.directory, fsync=journal_file.fsync)
    return _upstream_create_journal(journal_file)


pysyncobj.syncobj.createJournal = _create_journal


class SyncingTransport(TCPTransport):
    """Syncs a dirty journal before sending, so nothing is acknowledged before it is durable."""

    def send(self, node, message):
        self._syncObj.sync_journal()
        return super().send(node, message)
