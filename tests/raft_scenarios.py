"""Scenario scripts for a Raft group, run against the in-memory twin and against pysyncobj.

A script (tests/testdata/raft/*.txt) is a list of blocks, in the style of
etcd-io/raft's interaction tests:

    put n1 a 1
    ----
    applied

Commands: `start n1 n2 n3`, `elect n1`, `put n1 KEY VALUE` (wait for the
outcome), `put-async n1 KEY VALUE` (propose, don't wait), `stop n2`,
`restart n2`, `compact n1` (until its log no longer holds the first entries),
`stabilize` (until every running member applied everything the leader
has), `state` (role and data of each running member) and `check` (every
applied put is on every running member, and they all hold the same data).
Membership, as a node drives it: `learner n4` (open n4, on what its folder
holds, as a learner of the voters as they are now), `add n1 n4` (n1 adds
learner n4, which then reopens as a voter on the same data), `remove n1 n2`
(n1 removes n2, which is stopped) and `wipe n2` (its data goes). After each
change every running member is told the voters (`name_members`), as the
cluster metadata tells a node's replicas.
Outputs name no terms or indexes: how many elections a real group needs
depends on timing, what it holds must not.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from raftkv.core.spec import Tuning
from raftkv.dev.local_cluster import free_port_block
from raftkv.raft import snapshot_file
from raftkv.raft.group import Entry, Outcome, Role, Snapshot
from raftkv.raft.memory_group import Disk, MemoryGroup
from raftkv.raft.memory_network import MemoryNetwork
from raftkv.raft.syncobj_group import GroupConfig, SyncObjGroup
from tests.loopback_hubs import LoopbackHubs
from raftkv.storage.engine import Position

DEADLINE = 30.0
MEMBERS = 9  # names n1 to n9, each on a port of its own


class DictStateMachine:
    """Payloads are b"KEY=VALUE"; the checkpoint is a JSON file."""

    def __init__(self):
        self.data: dict[str, str] = {}
        self.position = Position(0, 0)

    @classmethod
    def at(cls, db: Path) -> DictStateMachine:
        """The state checkpointed at `db` (a replica's database, seeded in place), or the empty one."""
        machine = cls()
        if (db / "state.json").exists():
            state = json.loads((db / "state.json").read_text())
            machine.data, machine.position = state["data"], Position(state["index"], state["term"])
        return machine

    def apply(self, entry: Entry):
        key, value = entry.payload.decode().split("=", 1)
        self.data[key] = value
        self.position = Position(entry.index, entry.term)
        return key

    def checkpoint(self, dest: Path, last: Position) -> Position:
        dest.mkdir(parents=True)
        state = {"data": self.data, "index": self.position.index, "term": self.position.term}
        (dest / "state.json").write_text(json.dumps(state))
        return self.position

    def verify(self, checkpoint: Path) -> None:
        """Nothing to check: a file this process wrote a moment ago."""

    def restore(self, snapshot: Snapshot) -> None:
        if snapshot.position.index <= self.position.index:
            return
        with tempfile.TemporaryDirectory() as tmp:
            state = json.loads((snapshot_file.extract_db(snapshot.path, Path(tmp)) / "state.json").read_text())
        self.data, self.position = state["data"], Position(state["index"], state["term"])

    def flush(self) -> None:
        pass


@dataclass
class Member:
    group: object
    machine: DictStateMachine
    running: bool = True


@dataclass
class Driver:
    """What both twins share: members by name, and what each put ended as."""

    folder: Path
    members: dict[str, Member] = field(default_factory=dict)
    outcomes: dict[str, Outcome] = field(default_factory=dict)  # "key=value" -> outcome
    voters: list[str] = field(default_factory=list)  # as the cluster metadata has them

    def running(self) -> dict[str, Member]:
        return {name: m for name, m in sorted(self.members.items()) if m.running}

    def leader(self) -> str | None:
        leaders = [n for n, m in self.running().items() if m.group.role == Role.LEADER]
        return leaders[0] if len(leaders) == 1 else None

    def propose(self, name: str, key: str, value: str) -> None:
        item = f"{key}={value}"
        self.outcomes[item] = None

        def done(result, outcome: Outcome) -> None:
            self.outcomes[item] = outcome

        self.members[name].group.propose(item.encode(), done)

    def settled(self) -> bool:
        leader = self.leader()
        if leader is None:
            return False
        group = self.members[leader].group
        return group.commit_index == group.last_log_index and all(
            m.group.last_applied == group.commit_index for m in self.running().values())

    async def put(self, name: str, key: str, value: str, wait: bool) -> None:
        self.propose(name, key, value)
        self._deliver()
        if wait:
            await self.until(lambda: self.outcomes[f"{key}={value}"] is not None)

    async def stop(self, name: str) -> None:
        self.members[name].group.close()
        self.members[name].running = False

    async def restart(self, name: str) -> None:
        self._open(name)

    async def learner(self, name: str) -> None:
        self._open_learner(name)
        self._name_members()

    async def change(self, leader: str, action: str, name: str) -> Outcome | None:
        outcome: list[Outcome] = []
        group = self.members[leader].group
        change = group.add_member if action == "add" else group.remove_member
        change(self._address(name), lambda result, o: outcome.append(o))
        self._deliver()
        await self.until(lambda: outcome)
        if outcome == [Outcome.APPLIED]:
            if action == "add":
                self.voters.append(name)
                await self.stop(name)
                self._open(name)
            else:
                self.voters.remove(name)
                if self.members[name].running:
                    await self.stop(name)
            self._name_members()
        return outcome[0] if outcome else None

    def _name_members(self) -> None:
        addresses = frozenset(self._address(n) for n in self.voters)
        for member in self.running().values():
            member.group.name_members(addresses)

    async def wipe(self, name: str) -> None:
        shutil.rmtree(self.folder / name, ignore_errors=True)

    async def compact(self, name: str) -> None:
        group = self.members[name].group
        group.compact()
        await self.until(lambda: _compacted(group))

    async def stabilize(self) -> None:
        await self.until(self.settled)

    def state(self) -> list[str]:
        return [f"{name} {m.group.role.label} " + " ".join(f"{k}={v}" for k, v in sorted(m.machine.data.items()))
                for name, m in self.running().items()]

    def check(self) -> list[str]:
        problems = []
        datas = {name: m.machine.data for name, m in self.running().items()}
        if len({json.dumps(d, sort_keys=True) for d in datas.values()}) > 1:
            problems.append(f"members differ: {datas}")
        for item, outcome in self.outcomes.items():
            key, value = item.split("=", 1)
            for name, data in datas.items():
                if outcome == Outcome.APPLIED and data.get(key) != value:
                    problems.append(f"{name} lost applied {item}")
                if outcome == Outcome.REJECTED and data.get(key) == value:
                    problems.append(f"{name} holds rejected {item}")
        return problems or ["ok"]


class TwinDriver(Driver):
    def __init__(self, folder: Path):
        super().__init__(folder)
        self.net = MemoryNetwork(seed=1)
        self.disks: dict[str, Disk] = {}

    async def start(self, names: list[str]) -> None:
        self.voters = list(names)
        for name in names:
            (self.folder / name).mkdir()
            self.disks[name] = Disk(self.folder / name, voters=frozenset(names))
            self._open(name)

    def _open(self, name: str) -> None:
        machine = DictStateMachine()
        self.members[name] = Member(MemoryGroup(name, self.disks[name], machine, self.net), machine)

    def _open_learner(self, name: str) -> None:
        if not (self.folder / name).exists():
            (self.folder / name).mkdir()
            self.disks[name] = Disk(self.folder / name, voters=frozenset(self.voters))
        self._open(name)

    def _address(self, name: str) -> str:
        return name

    async def until(self, condition) -> bool:
        for _ in range(200):
            if condition():
                return True
            self.net.tick()
        return condition()

    async def elect(self, name: str) -> None:
        self.members[name].group.campaign()
        self.net.stabilize()
        await self.until(lambda: self.leader() is not None)

    def _deliver(self) -> None:
        self.net.stabilize()

    async def close(self) -> None:
        pass


class RealDriver(Driver):
    """pysyncobj groups on loopback ports, all ticked on this test's event loop."""

    def __init__(self, folder: Path):
        super().__init__(folder)
        self.configs: dict[str, GroupConfig] = {}
        self.hubs: LoopbackHubs | None = None

    async def start(self, names: list[str]) -> None:
        self.voters = list(names)
        self._port = free_port_block(MEMBERS)
        self.hubs = LoopbackHubs()
        for name in names:
            self._open(name)

    def _address(self, name: str) -> str:
        return f"127.0.0.1:{self._port + int(name.lstrip('n')) - 1}"

    def _open(self, name: str, voter: bool = True) -> None:
        address = self._address(name)
        self.hubs.know(address)
        config = self.configs[name] = GroupConfig(
            partition=0, hub=self.hubs.hub(address), self_address=address if voter else None,
            peers=tuple(self._address(n) for n in self.voters if n != name), folder=self.folder / name,
            fsync=False, tuning=Tuning(), membership_changes=True)
        machine = DictStateMachine()
        self.members[name] = Member(SyncObjGroup(config, machine, asyncio.get_running_loop()), machine)

    def _open_learner(self, name: str) -> None:
        self._open(name, voter=False)

    async def until(self, condition) -> bool:
        deadline = asyncio.get_running_loop().time() + DEADLINE
        while not condition():
            if asyncio.get_running_loop().time() > deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    async def elect(self, name: str) -> None:
        target = self.configs[name].self_address

        def elected() -> bool:
            leader = self.leader()
            if leader is not None and leader != name:
                self.members[leader].group.transfer_leadership(target)
            return leader == name and self.members[name].group.has_quorum

        await self.until(elected)

    def _deliver(self) -> None:
        """Messages go out on the loop by themselves."""

    async def close(self) -> None:
        for member in self.running().values():
            member.group.close()
        if self.hubs is not None:
            await self.hubs.close()


def _compacted(group) -> bool:
    try:
        group.committed_entries(0, 1)
    except LookupError:
        return True
    return False


async def run(script: str, driver: Driver) -> str:
    """The script with each block's output replaced by what `driver` printed."""
    out = []
    try:
        for block in script.strip().split("\n\n"):
            command = block.split("\n----\n")[0].strip()
            out.append(f"{command}\n----\n" + "\n".join(await _run_command(driver, command)))
    finally:
        await driver.close()
    return "\n\n".join(out) + "\n"


async def _run_command(driver: Driver, command: str) -> list[str]:
    lines = [line for line in command.splitlines() if not line.startswith("#")]
    verb, *args = lines[-1].split()
    if verb == "start":
        await driver.start(args)
    elif verb == "elect":
        await driver.elect(args[0])
        return [f"leader {driver.leader()}"]
    elif verb in ("put", "put-async"):
        await driver.put(args[0], args[1], args[2], wait=verb == "put")
        if verb == "put":
            outcome = driver.outcomes[f"{args[1]}={args[2]}"]
            return [outcome.value if outcome else "pending"]
    elif verb == "stop":
        await driver.stop(args[0])
    elif verb == "restart":
        await driver.restart(args[0])
    elif verb == "learner":
        await driver.learner(args[0])
    elif verb in ("add", "remove"):
        outcome = await driver.change(args[0], verb, args[1])
        return [outcome.value if outcome else "pending"]
    elif verb == "wipe":
        await driver.wipe(args[0])
    elif verb == "compact":
        await driver.compact(args[0])
    elif verb == "stabilize":
        await driver.stabilize()
    elif verb == "state":
        return driver.state()
    elif verb == "check":
        return driver.check()
    else:
        raise ValueError(f"unknown command {verb!r}")
    return ["ok"]
