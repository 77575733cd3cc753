"""RaftJournal against a list model under random edits and reopens, and pysyncobj replaying it."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pysyncobj.syncobj
import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test
from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.journal import MemoryJournal

from raftkv.dev.local_cluster import free_port_block
from raftkv.raft.journal import RaftJournal
from tests.test_journal import wait_until


# Model-based test


class JournalMachine(RuleBasedStateMachine):
    """Compares RaftJournal with a list under random edits and reopens."""

    def __init__(self, make_directory: Callable[[], Path]):
        super().__init__()
        self.directory = make_directory()
        self.model: list[tuple[bytes, int, int]] = []
        self.term_vote: tuple[int, str | None] = (0, None)
        self.commit = 1

    @initialize(fsync=st.booleans())
    def open(self, fsync: bool) -> None:
        self.fsync = fsync
        self.journal = RaftJournal(self.directory, fsync=fsync)

    @rule(command=st.binary(max_size=40), term_step=st.integers(0, 2), first_idx=st.integers(1, 2**40))
    def add(self, command: bytes, term_step: int, first_idx: int) -> None:
        idx, term = (self.model[-1][1] + 1, self.model[-1][2] + term_step) if self.model else (first_idx, term_step)
        self.journal.add(command, idx, term)
        self.model.append((command, idx, term))

    @rule(position=st.integers(-8, 40))
    def delete_entries_from(self, position: int) -> None:
        self.journal.deleteEntriesFrom(position)
        del self.model[position:]

    @rule(position=st.integers(-8, 40))
    def delete_entries_to(self, position: int) -> None:
        self.journal.deleteEntriesTo(position)
        self.model = self.model[position:]

    @rule()
    def clear(self) -> None:
        self.journal.clear()
        self.model = []

    @rule(term=st.integers(0, 2**63), voted=st.none() | st.text(max_size=12))
    def set_current_term(self, term: int, voted: str | None) -> None:
        self.journal.setCurrentTerm(term, voted)
        self.term_vote = (term, voted)

    @rule(commit=st.integers(0, 2**63))
    def set_commit_index(self, commit: int) -> None:
        self.journal.setRaftCommitIndex(commit)
        self.commit = commit

    @rule()
    def sync(self) -> None:
        self.journal.sync()
        assert not self.journal.dirty

    @rule()
    def reopen(self) -> None:
        self.journal._destroy()
        self.journal = RaftJournal(self.directory, fsync=self.fsync)

    @invariant()
    def matches_model(self) -> None:
        assert len(self.journal) == len(self.model)
        assert self.journal[:] == self.model
        if self.model:
            assert self.journal[-1] == self.model[-1]
            assert self.journal[0] == self.model[0]
        assert (self.journal.getCurrentTerm(), self.journal.getVotedForNodeId()) == self.term_vote
        assert self.journal.getRaftCommitIndex() == self.commit

    def teardown(self) -> None:
        self.journal._destroy()


def test_journal_behaves_like_a_list(tmp_path_factory: pytest.TempPathFactory) -> None:
    run_state_machine_as_test(
        lambda: JournalMachine(lambda: tmp_path_factory.mktemp("journal")),
        settings=settings(max_examples=60, stateful_step_count=30, deadline=None),
    )


# pysyncobj integration


def free_port() -> int:
    return free_port_block(1)


class Counter(SyncObj):
    def __init__(self, journal_dir: Path):
        self.counter = 0  # set before the tick thread starts replaying the journal
        self.address = f"127.0.0.1:{free_port()}"
        super().__init__(self.address, [], SyncObjConf(journalFile=str(journal_dir)))

    @replicated
    def add(self, amount: int) -> int:
        self.counter += amount
        return self.counter


def journals_for_syncobj(monkeypatch, make: Callable[[str], object]) -> list:
    """From now on a SyncObj with a journal file gets `make(path)` as its journal; the list of those made."""
    created = []

    def create_journal(path: str | None = None):
        if path is None:
            return MemoryJournal()
        created.append(make(path))
        return created[-1]

    monkeypatch.setattr(pysyncobj.syncobj, "createJournal", create_journal)
    return created


def test_syncobj_replays_its_raft_journal(tmp_path: Path, monkeypatch) -> None:
    created = journals_for_syncobj(monkeypatch, lambda path: RaftJournal(path, fsync=True))
    journal_dir = tmp_path / "partition-0"

    node = Counter(journal_dir)
    try:
        assert [node.add(n, sync=True, timeout=10) for n in range(1, 6)] == [1, 3, 6, 10, 15]
    finally:
        node.destroy_synchronous()
    assert len(created) == 1

    journal = RaftJournal(journal_dir, fsync=False)
    entries = journal[:]
    assert [idx for _, idx, _ in entries] == list(range(1, len(entries) + 1))
    regular = [entry for entry in entries if entry[0][:1] == b"\x00"]
    assert len(regular) == 5
    assert journal.getRaftCommitIndex() >= regular[-1][1]
    assert journal.getCurrentTerm() >= 1 and journal.getVotedForNodeId() == node.address
    journal._destroy()

    node = Counter(journal_dir)
    try:
        wait_until(lambda: node.counter == 15)
        assert node.add(100, sync=True, timeout=10) == 115
    finally:
        node.destroy_synchronous()
    assert len(created) == 2
    assert RaftJournal(journal_dir, fsync=False)[: len(entries)] == entries
