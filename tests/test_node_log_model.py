"""The node log against a model under random operations, reopens, kills and power cuts, and on the
power-loss filesystem (raftkv.powerloss), which keeps only what the kernel was told to make durable."""

from __future__ import annotations

import copy
import os
import random
import shutil
import tempfile
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from raftkv.powerloss import PowerLossDisk, unavailable_reason as powerloss_unavailable
from raftkv.raft.node_log import NodeLog
from tests.test_node_log import Clock, kill


# The log against a model


@dataclass
class Model:
    entries: list = field(default_factory=list)
    term: int = 0
    voted: str | None = None
    commit: int = 1
    written_commit: int = 1  # the commit index of the group's last state record


class NodeLogMachine(RuleBasedStateMachine):
    """Random operations over several groups, with clean reopens, kills and power cuts, against a dict of
    lists. A power cut returns to the model as of the last sync (everything written since is cut off)."""

    groups = st.sampled_from([0, 1, 2, 0xFFFFFFFE])

    def __init__(self) -> None:
        super().__init__()
        self.folder = Path(tempfile.mkdtemp(prefix="node-log-model-"))
        self.clock = Clock()
        self.model: dict[int, Model] = {}

    @initialize(fsync=st.booleans(), segment_bytes=st.sampled_from([1, 160, 1 << 20]))
    def open(self, fsync: bool, segment_bytes: int) -> None:
        self.fsync, self.segment_bytes = fsync, segment_bytes
        self.reopen_log()

    def reopen_log(self) -> None:
        self.log = NodeLog(self.folder, fsync=self.fsync, segment_bytes=self.segment_bytes, clock=self.clock)
        self.synced()

    def synced(self) -> None:
        """Everything written is durable now."""
        self.durable = copy.deepcopy(self.model), self.log.durable_point

    def group(self, g: int):
        self.model.setdefault(g, Model())
        return self.log.group(g)

    def add_to(self, g: int, command: bytes, term_step: int, first_idx: int) -> None:
        view, model = self.group(g), self.model.setdefault(g, Model())
        last = model.entries[-1] if model.entries else None
        entry = (command, last[1] + 1, last[2] + term_step) if last else (command, first_idx, term_step)
        view.add(*entry)
        model.entries.append(entry)

    @rule(g=groups, commands=st.lists(st.binary(max_size=24), min_size=1, max_size=3), batched=st.booleans(),
          term_step=st.integers(0, 2), first_idx=st.integers(1, 2**40))
    def add(self, g: int, commands: list[bytes], batched: bool, term_step: int, first_idx: int) -> None:
        with self.log.batch() if batched else nullcontext():
            for command in commands:
                self.add_to(g, command, term_step, first_idx)

    @rule(steps=st.lists(st.tuples(st.sampled_from(["add", "add", "from", "to", "clear", "commit"]), groups,
                                   st.integers(-3, 6)), min_size=1, max_size=10))
    def turn(self, steps: list[tuple[str, int, int]]) -> None:
        """One loop turn's changes over several groups: one batch."""
        with self.log.batch():
            for step, g, number in steps:
                if step == "add":
                    self.add_to(g, b"%d" % number, number % 2, 1)
                elif step == "commit":
                    self.set_commit_index(g, abs(number))
                else:
                    getattr(self, {"from": "delete_entries_from", "to": "delete_entries_to", "clear": "clear"}[step])(
                        *((g,) if step == "clear" else (g, number)))

    @rule(g=groups, position=st.integers(-8, 12))
    def delete_entries_from(self, g: int, position: int) -> None:
        self.group(g).deleteEntriesFrom(position)
        del self.model[g].entries[position:]

    @rule(g=groups, position=st.integers(-8, 12))
    def delete_entries_to(self, g: int, position: int) -> None:
        self.group(g).deleteEntriesTo(position)
        self.model[g].entries = self.model[g].entries[position:]

    @rule(g=groups)
    def clear(self, g: int) -> None:
        self.group(g).clear()
        self.model[g].entries = []

    @rule(g=groups, term=st.integers(0, 2**63), voted=st.none() | st.text(max_size=12))
    def set_current_term(self, g: int, term: int, voted: str | None) -> None:
        self.group(g).setCurrentTerm(term, voted)
        model = self.model[g]
        model.term, model.voted, model.written_commit = term, voted, model.commit
        self.synced()

    @rule(g=groups, commit=st.integers(0, 2**63))
    def set_commit_index(self, g: int, commit: int) -> None:
        self.group(g).setRaftCommitIndex(commit)
        self.model[g].commit = commit

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def remove(self, data) -> None:
        g = data.draw(st.sampled_from(sorted(self.model)))
        self.log.remove(g)
        del self.model[g]
        self.synced()

    @rule()
    def sync(self) -> None:
        self.log.sync()
        self.synced()

    @rule()
    def timer(self) -> None:
        self.clock.now += 1
        self.log.on_timer()
        for model in self.model.values():
            model.written_commit = model.commit
        self.synced()

    @rule()
    def collect(self) -> None:
        self.log.collect()
        self.synced()

    @rule(max_bytes=st.sampled_from([0, 64, 1 << 20]))
    def purge(self, max_bytes: int) -> None:
        for g in self.log.purge(max_bytes).rewritten:
            self.model[g].written_commit = self.model[g].commit
        self.synced()

    @rule()
    def reopen(self) -> None:
        self.log.close()
        for model in self.model.values():
            model.written_commit = model.commit
        self.reopen_log()

    @rule()
    def kill(self) -> None:
        kill(self.log)
        for model in self.model.values():
            model.commit = model.written_commit
        self.reopen_log()

    @rule()
    def power_cut(self) -> None:
        self.model, (seq, offset) = self.durable
        kill(self.log)
        for later in self.log.segments:
            if later > seq:
                self.log.segment_path(later).unlink()
        os.truncate(self.log.segment_path(seq), offset)
        for model in self.model.values():
            model.commit = model.written_commit
        self.reopen_log()

    @invariant()
    def matches_model(self) -> None:
        assert self.log.groups() == sorted(self.model)
        for g, model in self.model.items():
            view = self.log.group(g)
            assert view[:] == model.entries and len(view) == len(model.entries)
            assert (view.getCurrentTerm(), view.getVotedForNodeId(), view.getRaftCommitIndex()) == (
                model.term, model.voted, model.commit)

    def teardown(self) -> None:
        try:
            self.log.close()
        finally:
            shutil.rmtree(self.folder)


TestTheLogBehavesLikeAModelUnderRandomOperationsAndCrashes = NodeLogMachine.TestCase
TestTheLogBehavesLikeAModelUnderRandomOperationsAndCrashes.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None)


# On a filesystem that loses what was not made durable


def _contents(log: NodeLog) -> dict[int, tuple]:
    """Entries, term and vote of every group (commit indexes are written lazily, so left out)."""
    return {g: (tuple(log.group(g)[:]), log.group(g).getCurrentTerm(), log.group(g).getVotedForNodeId())
            for g in log.groups()}


def _random_steps(log: NodeLog, clock: Clock, rng: random.Random, steps: int) -> list[dict[int, tuple]]:
    """Random single-write or syncing steps; returns what the log may hold after a power cut: the
    contents at the last sync and after every write since."""
    history = [_contents(log)]
    for _ in range(steps):
        g = rng.randrange(4)
        view = log.group(g)  # its state record, if new: a write of its own
        if view.closed:
            continue
        history.append(_contents(log))
        step = rng.choices(["add", "turn", "from", "to", "clear", "term", "timer", "purge", "remove"],
                           [30, 20, 5, 5, 2, 4, 6, 3, 1])[0]
        synced = step in ("term", "timer", "purge", "remove")
        if step == "add":
            view.add(rng.randbytes(rng.randrange(200)), view[-1][1] + 1 if len(view) else 1, 1)
        elif step == "turn":
            with log.batch():
                for other in {rng.randrange(4) for _ in range(3)}:
                    other = log.group(other)
                    other.add(rng.randbytes(40), other[-1][1] + 1 if len(other) else 1, 1)
        elif step in ("from", "to"):
            (view.deleteEntriesFrom if step == "from" else view.deleteEntriesTo)(rng.randrange(-2, 6))
        elif step == "clear":
            view.clear()
        elif step == "term":
            view.setCurrentTerm(rng.randrange(9), rng.choice([None, "n1", "n2"]))
        elif step == "timer":
            clock.now += 1
            view.setRaftCommitIndex(rng.randrange(9))
            view.onOneSecondTimer()
        elif step == "purge":
            log.purge(rng.choice([0, 1 << 20]))
        else:
            log.remove(g)
        if synced:
            history = []
        history.append(_contents(log))
    return history


@pytest.mark.skipif(bool(powerloss_unavailable()), reason=powerloss_unavailable() or "FUSE is available")
@pytest.mark.parametrize("fsync", [False, True], ids=["default", "fsync"])
@pytest.mark.parametrize("seed", range(6))
def test_a_power_cut_keeps_the_last_synced_state_or_a_later_one(tmp_path: Path, fsync: bool, seed: int) -> None:
    """Every step is one write or ends synced, so after a power cut (the newest write torn) the log must
    hold what it held at the last sync or after one of the writes since: never less, never a mix."""
    (tmp_path / "data").mkdir()
    clock = Clock()
    with PowerLossDisk(tmp_path / "data", tmp_path / "backing") as disk:
        log = NodeLog(tmp_path / "data" / "wal", fsync=fsync, segment_bytes=700, clock=clock)
        history = _random_steps(log, clock, random.Random(seed), 250)
        for n in range(3):  # and the last writes never synced
            log.group(n).add(b"unsynced", log.group(n)[-1][1] + 1 if len(log.group(n)) else 1, 1)
            history.append(_contents(log))
        segments = len(log.segments)
        kill(log)
        report = disk.crash(tear=True, seed=seed)
    assert report.torn is not None and report.bytes_dropped
    log = NodeLog(tmp_path / "backing" / "wal", fsync=fsync, segment_bytes=700, clock=clock)
    assert _contents(log) in history
    assert segments > 1
    log.close()
