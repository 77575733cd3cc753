"""Our `RaftJournal` wired into pysyncobj: built by its `createJournal` (synced before any send by
`syncobj_transport.GroupTransport`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pysyncobj.syncobj

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
