"""Every message of the node engine's fast path, of a group resting in the engine and waking, and of a
hand-over on a new term, printed and compared
with tests/testdata/engine/*.txt (etcd-raft's interaction tests are the model): one group of three
members in the simulation, fsync mode, a network that neither loses, repeats nor reorders.

    RAFTKV_GOLDEN_UPDATE=1 pytest tests/engine_sim/test_engine_golden.py    # rewrite the files after a change
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable

import pytest

from tests.engine_sim.checker import Checker
from tests.engine_sim.clock import Scheduler, virtual_time
from tests.engine_sim.cluster import LEARNER, SimCluster
from tests.engine_sim.network import NetFaults, SimNetwork
from tests.engine_sim.trace import Trace, describe

GOLDEN = Path(__file__).resolve().parents[1] / "testdata" / "engine"  # not raft/: those are raft_scenarios' scripts
QUIET = NetFaults(loss=0.0, duplication=0.0, reorder=False, jitter=0.0)


class _Scenario:
    def __init__(self, folder: Path):
        self.scheduler = Scheduler()
        self.trace = Trace(self.scheduler)
        self.checker = Checker(self.trace)
        self.cluster = SimCluster(3, 1, 3, True, 1, folder, self.scheduler,
                                  lambda directory: SimNetwork(self.scheduler, 1, QUIET, directory, self.trace),
                                  self.trace, self.checker, engine=True)
        self.acknowledged: list[bytes] = []

    def run_until(self, done: Callable[[], bool], limit: float = 10.0) -> None:
        deadline = self.scheduler.now + limit
        while not done():
            assert self.scheduler.now < deadline, "the scenario did not get there"
            handle = self.scheduler.step()
            assert handle is not None, "every member rests before the scenario got there"
            self.cluster.check(handle.member)
        assert not self.checker.violations, self.checker.violations

    def settled(self) -> bool:
        return not self.cluster.unsettled()

    def propose(self, *payloads: bytes) -> None:
        leader = self.cluster.leader(0)
        for payload in payloads:
            self.cluster.propose(0, payload, leader)
        self.run_until(lambda: all(p in self.checker.group(0).acked for p in payloads))
        self.run_until(self.settled)

    def messages(self, since: int) -> list[str]:
        """The messages delivered since trace line `since`, and the leaders elected and writers answered, in
        order; those of one moment sorted, as pysyncobj and the engine walk sets of nodes in an order that
        differs between processes (string hashes)."""
        moments: dict[float, list[str]] = {}
        for _, when, kind, body in self.trace.lines[since:]:
            if kind == "recv":
                a, b, group, message = body
                moments.setdefault(when, []).append(f"{a}->{b} {describe(message)}")
            elif kind in ("leader", "answer"):
                moments.setdefault(when, []).append(f"{kind} {body}")
        return [line for when in sorted(moments) for line in sorted(moments[when])]


def _script() -> dict[str, str]:
    with tempfile.TemporaryDirectory(prefix="raft-golden-") as tmp, pytest.MonkeyPatch.context():
        scenario = _Scenario(Path(tmp))
        with virtual_time(scenario.scheduler, 1, scenario.cluster.create_journal):
            scenario.cluster.start()
            scenario.run_until(lambda: scenario.cluster.leader(0) is not None and scenario.settled())
            mark = len(scenario.trace.lines)
            scenario.propose(b"a=1")
            scenario.propose(b"b=2", b"c=3")
            fast = scenario.messages(mark)
            mark = len(scenario.trace.lines)
            idle: list[bool] = []
            scenario.scheduler.after(2.0, idle.append, True)  # past IDLE_HEARTBEATS: the leader rests the group
            scenario.run_until(lambda: idle)
            scenario.propose(b"e=5")  # steps at once: no offer, no take
            rest = scenario.messages(mark)
            mark = len(scenario.trace.lines)
            old = scenario.cluster.leader(0)
            scenario.cluster.transfer(0, next(n for n in scenario.cluster.voters[0] if n != old.node))
            scenario.run_until(lambda: (leader := scenario.cluster.leader(0)) is not None and leader is not old
                               and scenario.settled())
            scenario.propose(b"d=4")
            handover = scenario.messages(mark)
    return {"fast_path.txt": "\n".join(fast) + "\n", "rest.txt": "\n".join(rest) + "\n",
            "new_term.txt": "\n".join(handover) + "\n"}


def test_a_learner_that_joins_a_group_resting_in_the_engine_is_fed():
    """bench_big at 10M keys: a learner from zero waited for good on four partitions. Its connections closed
    (it read too slowly), their groups rested in the engine without it, and when it joined again the
    resting leader took it in (its tick follows the hub's links) and went on resting: nothing fed it."""
    with tempfile.TemporaryDirectory(prefix="raft-golden-") as tmp, pytest.MonkeyPatch.context():
        scenario = _Scenario(Path(tmp))
        with virtual_time(scenario.scheduler, 1, scenario.cluster.create_journal):
            cluster = scenario.cluster
            cluster.start()
            scenario.run_until(lambda: cluster.leader(0) is not None and scenario.settled())
            scenario.propose(b"a=1", b"b=2")
            leader = cluster.leader(0)
            scenario.run_until(lambda: leader.raft.steady.resting)
            cluster.network.node_up(LEARNER)
            cluster._open(LEARNER, 0)
            learner = cluster.learners[(LEARNER, 0)]
            scenario.run_until(lambda: learner.raft.last_applied == leader.raft.commit_index)


def test_the_engines_messages_are_as_recorded():
    printed = _script()
    if os.environ.get("RAFTKV_GOLDEN_UPDATE"):
        for name, text in printed.items():
            (GOLDEN / name).write_text(text)
    for name, text in printed.items():
        assert text == (GOLDEN / name).read_text(), f"{name} differs; RAFTKV_GOLDEN_UPDATE=1 rewrites it"
