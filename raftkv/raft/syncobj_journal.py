"""Our `RaftJournal` wired into pysyncobj: built by its `createJournal` (in fsync mode synced before
any send by `syncobj_transport.GroupTransport`, in the default mode once a second by the process's
`journal_syncer`); and what pysyncobj's own entries in it say."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pysyncobj.pickle
import pysyncobj.syncobj

from raftkv.raft.journal import RaftJournal
from raftkv.raft.journal_syncer import SYNCER


MEMBERSHIP = bytes([2])  # pysyncobj's _COMMAND_TYPE.MEMBERSHIP: the first byte of an add or remove entry


def membership_change(command: bytes) -> tuple[str, str] | None:
    """("add" or "rem", address) for a membership entry; None for any other."""
    if command[:1] != MEMBERSHIP:
        return None
    kind, address = pysyncobj.pickle.loads(command[1:])[:2]
    return kind, address


@dataclass(frozen=True)
class JournalConfig:
    """Passed as SyncObjConf.journalFile; our createJournal hook builds a RaftJournal from it."""

    directory: Path
    fsync: bool


_upstream_create_journal = pysyncobj.syncobj.createJournal


def _create_journal(journal_file):
    if isinstance(journal_file, JournalConfig):
        journal = RaftJournal(journal_file.directory, fsync=journal_file.fsync)
        if not journal_file.fsync:
            SYNCER.add(journal)
        return journal
    return _upstream_create_journal(journal_file)


pysyncobj.syncobj.createJournal = _create_journal
