"""A replica whose database a power cut left further than its Raft log (the default mode)."""

from __future__ import annotations

import asyncio
import logging
import shutil

import pytest

from raftkv.core.commands import Put
from raftkv.core.log_codec import encode_proposal
from raftkv.raft.group import Outcome, Role
from tests.test_snapshot_writer import single_voter, until

KEYS = [b"k%02d" % i for i in range(16)]


@pytest.mark.parametrize("snapshot", [True, False], ids=["from-its-snapshot", "from-empty"])
def test_a_database_a_power_cut_left_past_the_log_is_rolled_back_and_applied_from_the_log(tmp_path, snapshot, caplog):
    """Found by the chaos harness (powerloss:torn, default mode): the kernel wrote the database's last
    writes back and not the journal's. The node stopped on "the Raft log contradicts the database" as
    soon as a new leader's entry took an index the database had applied."""
    folder, kept = tmp_path / "p0", tmp_path / "journal-at-the-cut"

    async def run(keys: list[bytes], cut_after: int | None = None) -> dict[bytes, bytes | None]:
        replica = single_voter(folder)
        try:
            await until(lambda: replica.role == Role.LEADER)
            for i, key in enumerate(keys):
                done = asyncio.get_running_loop().create_future()
                replica.propose(encode_proposal([Put(key, b"v")]), lambda _, outcome, done=done: done.set_result(outcome))
                assert await asyncio.wait_for(done, 10) == Outcome.APPLIED
                if snapshot and i == 4:
                    replica.group.compact()
                    await until(lambda: replica.group.snapshots.last_index() is not None)
                if i == cut_after:
                    shutil.copytree(folder / "journal", kept)  # what the journal keeps of a cut here
            return {key: replica.engine.get(key) for key in KEYS}
        finally:
            replica.close()

    async def scenario():
        await run(KEYS[:15], cut_after=9)
        shutil.rmtree(folder / "journal")
        shutil.copytree(kept, folder / "journal")  # the database kept everything, the journal up to k09
        with caplog.at_level(logging.WARNING, logger="raftkv.raft.syncobj_group"):
            after = await run(KEYS[15:])
        assert "rolled back" in caplog.text
        assert after == {key: b"v" if key <= b"k09" or key == b"k15" else None for key in KEYS}

    asyncio.run(scenario())
