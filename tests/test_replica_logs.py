"""Tests for raftkv.raft.replica_logs: which replica folder's Raft log is which group of the node log, the
start-up that makes them agree (a folder moved away, wiped, or of another log; a group whose folder is
gone), the conversion of a previous release's journals with a crash at each step, and a pysyncobj
replica reading its log back from the node log."""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path

import pytest

from raftkv import failpoints
from raftkv.core.commands import Put
from raftkv.core.errors import ConfigError, CorruptData
from raftkv.core.log_codec import encode_proposal
from raftkv.raft.group import Outcome, Role
from raftkv.raft.journal import RaftJournal
from raftkv.raft.replica_logs import JOURNAL, MARKER, META_GROUP, ReplicaLogs, log_group
from tests.test_snapshot_writer import single_voter, until

ENTRIES = [(b"noop", 1, 1), (b"put a", 2, 1), (b"put b", 3, 2)]


def logs(data: Path) -> ReplicaLogs:
    return ReplicaLogs(data / "raft-log", fsync=True)


def opened(data: Path, *groups: int) -> None:
    """Replica folders p<g> whose groups hold ENTRIES, in a node log closed afterwards."""
    with_logs = logs(data)
    for group in groups:
        folder = data / f"p{group}"
        folder.mkdir()
        view = with_logs.open(folder, group)
        for entry in ENTRIES:
            view.add(*entry)
    with_logs.close()


def old_journal(folder: Path, term: int = 2, vote: str | None = "a:1") -> None:
    """A replica folder of the previous release: its own RaftJournal."""
    journal = RaftJournal(folder / JOURNAL, fsync=True)
    for entry in ENTRIES:
        journal.add(*entry)
    journal.setCurrentTerm(term, vote)
    journal.setRaftCommitIndex(3)
    journal._destroy()


def test_the_metadata_group_has_a_fixed_group_and_partitions_their_own_number():
    assert log_group(0) == 0 and log_group(1023) == 1023 and log_group(-1) == META_GROUP


def test_a_replica_reopened_finds_its_log_and_its_folder_names_the_group(tmp_path):
    opened(tmp_path, 3)
    again = logs(tmp_path)
    again.settle({3: tmp_path / "p3"})
    assert again.open(tmp_path / "p3", 3)[:] == ENTRIES
    assert (tmp_path / "p3" / MARKER).read_text().split() == [again.identity, "3"]
    again.close()


@pytest.mark.parametrize("how", ["moved away", "emptied"])
def test_a_folder_moved_away_or_emptied_does_not_find_its_old_group(tmp_path, how):
    opened(tmp_path, 3, 4)
    shutil.move(tmp_path / "p3", tmp_path / "elsewhere")
    if how == "emptied":
        (tmp_path / "p3").mkdir()
    again = logs(tmp_path)
    again.settle({4: tmp_path / "p4"} | ({3: tmp_path / "p3"} if how == "emptied" else {}))
    assert again.log.groups() == [4]
    (tmp_path / "p3").mkdir(exist_ok=True)
    assert again.open(tmp_path / "p3", 3)[:] == []  # starts empty and re-syncs
    assert again.open(tmp_path / "p4", 4)[:] == ENTRIES
    again.close()


def test_a_replica_that_comes_back_after_it_was_dropped_starts_afresh(tmp_path):
    """A replica moved away (its group dropped, its folder deleted), then moved back to this node."""
    opened(tmp_path, 3)
    with_logs = logs(tmp_path)
    with_logs.drop(3)
    shutil.rmtree(tmp_path / "p3")
    (tmp_path / "p3").mkdir()  # seeded, or empty: the move copies into an empty folder
    assert with_logs.open(tmp_path / "p3", 3)[:] == []
    with_logs.close()


def test_a_node_killed_between_dropping_a_group_and_deleting_its_folder_empties_the_folder(tmp_path, caplog):
    opened(tmp_path, 3)
    with_logs = logs(tmp_path)
    with_logs.drop(3)
    with_logs.close()
    again = logs(tmp_path)
    with caplog.at_level(logging.INFO, logger="raftkv.raft.replica_logs"):
        again.settle({3: tmp_path / "p3"})
    assert not (tmp_path / "p3").exists() and again.log.groups() == []
    assert [r.levelname for r in caplog.records] == ["INFO"] and "was being deleted" in caplog.text
    again.close()


def test_folders_of_a_node_log_moved_away_are_emptied_so_every_replica_re_syncs(tmp_path, caplog):
    opened(tmp_path, 3, 4)
    shutil.move(tmp_path / "raft-log", tmp_path / "damaged-log")
    again = logs(tmp_path)
    again.settle({3: tmp_path / "p3", 4: tmp_path / "p4"})
    assert not (tmp_path / "p3").exists() and not (tmp_path / "p4").exists()
    assert caplog.text.count("was the node log moved away?") == 2
    again.close()


def test_a_folder_of_another_log_is_refused_at_open_if_start_up_did_not_settle_it(tmp_path):
    opened(tmp_path, 3)
    shutil.move(tmp_path / "raft-log", tmp_path / "damaged-log")
    again = logs(tmp_path)
    with pytest.raises(CorruptData, match=r"names a Raft log that is not .*raft-log .*move .*p3 away"):
        again.open(tmp_path / "p3", 3)
    again.close()


def test_a_log_with_groups_but_no_identity_is_not_trusted(tmp_path):
    opened(tmp_path, 3)
    (tmp_path / "raft-log" / "identity").unlink()
    with pytest.raises(CorruptData, match=r"holds groups but no identity file; stop the node, move .*raft-log away"):
        logs(tmp_path)


def test_a_group_without_a_folder_is_dropped_at_start_up(tmp_path):
    opened(tmp_path, 3, 4)
    shutil.rmtree(tmp_path / "p4")
    again = logs(tmp_path)
    again.settle({3: tmp_path / "p3"})
    assert again.log.groups() == [3]
    again.close()


# The upgrade: a previous release's journal converted at start-up


def assert_converted(data: Path, group: int = 3) -> None:
    again = logs(data)
    again.settle({group: data / f"p{group}"})
    view = again.open(data / f"p{group}", group)
    assert view[:] == ENTRIES
    assert (view.getCurrentTerm(), view.getVotedForNodeId(), view.getRaftCommitIndex()) == (2, "a:1", 3)
    assert not (data / f"p{group}" / JOURNAL).exists()
    again.close()


def test_a_previous_release_journal_is_converted_then_marked_then_deleted(tmp_path):
    (tmp_path / "p3").mkdir()
    old_journal(tmp_path / "p3")
    assert_converted(tmp_path)
    assert_converted(tmp_path)  # and a second start finds it converted


@pytest.mark.parametrize("point", ["log-convert-after", "log-convert-marked", "journal-fsync-after"])
def test_a_conversion_cut_short_at_any_step_is_done_right_at_the_next_start(tmp_path, point):
    """The fail points stand for a crash there: the node log is left as the crash left it (not closed)."""
    (tmp_path / "p3").mkdir()
    old_journal(tmp_path / "p3")
    interrupted = logs(tmp_path)
    failpoints.arm(point, "1*error")
    try:
        with pytest.raises(OSError, match="injected"):
            interrupted.settle({3: tmp_path / "p3"})
    finally:
        failpoints.disarm_all()
    interrupted.close()  # lets the next start have the log: what it writes is what the log already holds
    marked = (tmp_path / "p3" / MARKER).exists()
    assert marked == (point == "log-convert-marked") and (tmp_path / "p3" / JOURNAL).is_dir()
    assert_converted(tmp_path)


def test_a_second_process_on_the_same_log_is_refused_in_one_line(tmp_path):
    first = logs(tmp_path)
    try:
        with pytest.raises(ConfigError, match=r"raft-log is in use by another process"):
            logs(tmp_path)
    finally:
        first.close()
    logs(tmp_path).close()  # free again


def test_a_damaged_old_journal_stops_the_start_naming_the_replica_folder(tmp_path):
    (tmp_path / "p3").mkdir()
    old_journal(tmp_path / "p3")
    log_file = tmp_path / "p3" / JOURNAL / "raft.log"
    data = bytearray(log_file.read_bytes())
    data[20:28] = b"\xff" * 8
    log_file.write_bytes(bytes(data) + b"more")
    with pytest.raises(CorruptData, match=r"move .*p3.* away"):
        logs(tmp_path).settle({3: tmp_path / "p3"})


# pysyncobj on the node log


def test_a_replica_on_the_node_log_reads_its_entries_back_after_a_restart(tmp_path):
    async def scenario():
        with_logs = logs(tmp_path)
        replica = single_voter(tmp_path / "p0", fsync=True, node_log=with_logs)
        try:
            await until(lambda: replica.role == Role.LEADER)
            for i in range(5):
                done = asyncio.get_running_loop().create_future()
                replica.propose(encode_proposal([Put(b"k%d" % i, b"v")]),
                                lambda result, outcome, done=done: done.set_result(outcome))
                assert await done == Outcome.APPLIED
            last = replica.group.last_log_index
            assert not (tmp_path / "p0" / JOURNAL).exists()
        finally:
            replica.close()
        with_logs.close()
        again = logs(tmp_path)
        again.settle({0: tmp_path / "p0"})
        replica = single_voter(tmp_path / "p0", fsync=True, node_log=again)
        try:
            await until(lambda: replica.group.last_applied >= last)
            assert replica.group.last_log_index >= last and replica.engine.get(b"k4") == b"v"
        finally:
            replica.close()
        again.close()

    asyncio.run(scenario())
