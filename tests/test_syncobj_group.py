"""SyncObjGroup's membership calls against real pysyncobj members in one process.

The hazards of membership changes (docs/elasticity.md) get their own tests with
the elastic-cluster work; this pins that the calls reach pysyncobj and report
their outcome the way proposals do.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from raftkv.core.errors import StorageFull
from raftkv.core.spec import Tuning
from raftkv.dev.local_cluster import free_port_block
from raftkv.raft import journal, snapshot_file
from raftkv.raft.group import Outcome, Role
from raftkv.raft.syncobj_group import GroupConfig, SyncObjGroup
from tests.loopback_hubs import LoopbackHubs
from tests.raft_scenarios import DictStateMachine
from tests.test_snapshot_writer import until


def voter(hubs: LoopbackHubs, address: str, addresses: list[str], folder, machine, loop, **config) -> SyncObjGroup:
    """The member at `address` of the group of `addresses` (known to `hubs`), its data in `folder`."""
    return SyncObjGroup(GroupConfig(partition=0, hub=hubs.hub(address), self_address=address,
                                    peers=tuple(a for a in addresses if a != address), folder=folder,
                                    fsync=False, tuning=Tuning(), **config), machine, loop)


def _three_voters(tmp_path, hubs: LoopbackHubs, machines, loop, **config) -> list[SyncObjGroup]:
    """One group of three voters over `hubs`, each on its state machine in `machines`."""
    port = free_port_block(3)
    addresses = [f"127.0.0.1:{port + i}" for i in range(3)]
    hubs.know(*addresses)
    return [voter(hubs, a, addresses, tmp_path / f"n{i}", machines[i], loop, **config)
            for i, a in enumerate(addresses)]

@contextlib.asynccontextmanager
async def _led_voters(tmp_path, machines):
    """Three voters with membership changes, once one leads and has applied its own first entry (pysyncobj
    refuses a change, REJECTED, until then): the groups and the leader. All closed after."""
    hubs = LoopbackHubs()
    groups = _three_voters(tmp_path, hubs, machines, asyncio.get_running_loop(), membership_changes=True)
    try:
        await until(lambda: sum(g.role == Role.LEADER for g in groups) == 1 and
                    all(g.last_applied == g.commit_index > 0 for g in groups))
        leader = next(g for g in groups if g.role == Role.LEADER)
        await until(lambda: leader.last_applied == leader.last_log_index > 1)
        yield groups, leader
    finally:
        for g in groups:
            g.close()
        await hubs.close()


async def outcome_of(call, *args) -> Outcome:
    """What became of `call(*args, callback)`: the outcome its callback was given."""
    done = asyncio.get_running_loop().create_future()
    call(*args, lambda result, o: done.done() or done.set_result(o))
    return await asyncio.wait_for(done, 20)


def test_a_leader_removes_a_follower_refuses_to_remove_itself_and_goes_on_committing(tmp_path):
    async def scenario():
        machines = [DictStateMachine() for _ in range(3)]
        async with _led_voters(tmp_path, machines) as (groups, leader):
            follower = next(g for g in groups if g is not leader)
            assert await outcome_of(leader.remove_member, follower.config.self_address) == Outcome.APPLIED
            follower.close()
            machine_of = dict(zip(map(id, groups), machines))
            groups.remove(follower)  # closed already
            assert await outcome_of(leader.remove_member, leader.config.self_address) == Outcome.REJECTED
            assert await outcome_of(leader.propose, b"k=v") == Outcome.APPLIED  # two voters of two now
            await until(lambda: all(machine_of[id(g)].data.get("k") == "v" for g in groups))

    asyncio.run(scenario())


def test_a_removed_member_that_runs_on_and_is_still_heard_campaigns_without_unseating_the_leader(tmp_path):
    """The 35-minute lose-last-second soak (docs/chaos.md): a move of partition 1 from n8, marked dead,
    removed n8 before adding n4, and n8 came back. Raft does not tell a removed member: it campaigns
    with ever higher terms, and until the target is added the metadata still names it, so its peers
    hear it. pysyncobj adopts any higher term it hears; without `Votes.admits` refusing a non-member's vote
    request while a leader lives, each campaign deposed the leader."""
    async def scenario():
        async with _led_voters(tmp_path, [DictStateMachine() for _ in range(3)]) as (groups, leader):
            removed = next(g for g in groups if g is not leader)
            assert await outcome_of(leader.remove_member, removed.config.self_address) == Outcome.APPLIED
            term = leader.term
            await until(lambda: removed.term >= term + 3, timeout=30)  # three campaigns, each a timeout apart
            assert (leader.role, leader.term) == (Role.LEADER, term)
            assert all(g.term == term for g in groups if g is not removed)

    asyncio.run(scenario())


def test_a_member_restarted_from_a_snapshot_does_not_count_itself_as_a_peer(tmp_path):
    """With membership changes on, pysyncobj takes the members from the snapshot at start-up and
    compares them with its own node; the snapshot's addresses must not make it its own peer (a
    single voter would then wait for a quorum of two forever)."""

    async def scenario():
        loop = asyncio.get_running_loop()
        hubs = LoopbackHubs()
        address = f"127.0.0.1:{free_port_block(1)}"
        config = GroupConfig(partition=0, hub=hubs.hub(address), self_address=address, peers=(),
                             folder=tmp_path / "n1", fsync=False, tuning=Tuning(), membership_changes=True)

        async def applied(group, payload: bytes) -> Outcome:
            done = loop.create_future()
            group.propose(payload, lambda result, o: done.set_result(o))
            return await asyncio.wait_for(done, 20)

        group = SyncObjGroup(config, DictStateMachine(), loop)
        try:
            await until(lambda: group.role == Role.LEADER)
            assert await applied(group, b"a=1") == Outcome.APPLIED
            group.compact()
            await until(lambda: group.log_entries <= 2)
        finally:
            group.close()
        machine = DictStateMachine()
        group = SyncObjGroup(config, machine, loop)
        try:
            await until(lambda: group.role == Role.LEADER)
            assert machine.data == {"a": "1"}  # restored from the snapshot
            assert await applied(group, b"b=2") == Outcome.APPLIED
        finally:
            group.close()
            await hubs.close()

    asyncio.run(scenario())


def test_a_new_leader_refuses_a_membership_change_until_its_own_entry_commits(tmp_path):
    """The single-server-change bug (Ongaro's dissertation §4.1): a leader that changes the membership
    before an entry of its own term commits can make two disjoint majorities. pysyncobj refuses until
    its no-op entry is applied, and one change at a time; the move driver retries. A change asked for
    the moment leadership is won is refused, deterministically: the no-op needs a round trip first."""

    async def scenario():
        loop = asyncio.get_running_loop()
        port = free_port_block(5)
        addresses = [f"127.0.0.1:{port + i}" for i in range(3)]
        newcomers = [f"127.0.0.1:{port + 3}", f"127.0.0.1:{port + 4}"]
        hubs = LoopbackHubs()
        hubs.know(*addresses, *newcomers)
        groups: dict[str, SyncObjGroup] = {}
        at_election: list[Outcome] = []

        def outcome_into(outcomes: list):
            return lambda result, o: outcomes.append(o)

        def on_role_changed(address):
            def changed(old: Role, new: Role) -> None:
                if new == Role.LEADER:
                    groups[address].add_member(newcomers[0], outcome_into(at_election))
            return changed

        for i, a in enumerate(addresses):
            groups[a] = SyncObjGroup(GroupConfig(partition=0, hub=hubs.hub(a), self_address=a, peers=tuple(p for p in addresses if p != a),
                                                 folder=tmp_path / f"n{i}", fsync=False, tuning=Tuning(),
                                                 on_role_changed=on_role_changed(a), membership_changes=True),
                                     DictStateMachine(), loop)
        try:
            await until(lambda: at_election)
            assert at_election == [Outcome.REJECTED]
            leader = next(g for g in groups.values() if g.role == Role.LEADER)
            await until(lambda: leader.last_applied == leader.last_log_index > 1)  # its no-op is in
            first, second = [], []
            leader.add_member(newcomers[0], outcome_into(first))
            leader.add_member(newcomers[1], outcome_into(second))  # one change at a time
            await until(lambda: first and second)
            assert (first, second) == ([Outcome.APPLIED], [Outcome.REJECTED])
            assert leader.voters == frozenset(addresses + newcomers[:1])
        finally:
            for g in groups.values():
                g.close()
            await hubs.close()

    asyncio.run(scenario())


def test_a_member_restarted_from_a_snapshot_older_than_its_leader_reaches_the_leader(tmp_path):
    """pysyncobj takes a restarted member's peers from its snapshot. A member whose snapshot predates
    the leader's joining did not count it as a member, and caught up only once its elections had
    disrupted the group into electing a leader it knew (a decommission stalled for minutes in CI; with
    pysyncobj's transport, where only the higher address connects, it never even heard from it). The
    peers our metadata names are kept: it catches up from the same leader, in the same term."""

    async def scenario():
        loop = asyncio.get_running_loop()
        port = free_port_block(4)
        newcomer, *addresses = [f"127.0.0.1:{port + i}" for i in range(4)]  # the newcomer's is the lowest
        stale = addresses[-1]
        hubs = LoopbackHubs()
        hubs.know(newcomer, *addresses)

        def open_member(address: str, peers) -> SyncObjGroup:
            return SyncObjGroup(GroupConfig(partition=0, hub=hubs.hub(address), self_address=address, peers=tuple(peers),
                                            folder=tmp_path / address.replace(":", "_"), fsync=False,
                                            tuning=Tuning(), membership_changes=True), DictStateMachine(), loop)

        async def outcome(call, *args) -> Outcome:
            done = loop.create_future()
            call(*args, lambda result, o: done.set_result(o) if not done.done() else None)
            return await asyncio.wait_for(done, 20)

        groups = {a: open_member(a, [p for p in addresses if p != a]) for a in addresses}
        try:
            await until(lambda: sum(g.role == Role.LEADER for g in groups.values()) == 1)
            leader = next(g for g in groups.values() if g.role == Role.LEADER)
            await until(lambda: leader.last_applied == leader.last_log_index > 1)
            assert await outcome(leader.propose, b"a=1") == Outcome.APPLIED
            if leader is groups[stale]:
                leader.transfer_leadership(addresses[0])
                leader = groups[addresses[0]]
                await until(lambda: leader.role == Role.LEADER and leader.last_applied == leader.last_log_index)
            await until(lambda: groups[stale].last_applied >= leader.last_applied)
            groups[stale].compact()  # its snapshot's members: the first three
            await until(lambda: groups[stale].log_entries <= 2)
            groups.pop(stale).close()

            added = asyncio.ensure_future(outcome(leader.add_member, newcomer))  # commits once the newcomer runs
            groups[newcomer] = open_member(newcomer, addresses)
            assert await added == Outcome.APPLIED
            await until(lambda: groups[newcomer].last_applied >= leader.last_applied)
            leader.transfer_leadership(newcomer)
            await until(lambda: groups[newcomer].role == Role.LEADER)
            new_leader = groups[newcomer]
            assert await outcome(new_leader.propose, b"b=2") == Outcome.APPLIED
            term = new_leader.term

            groups[stale] = open_member(stale, [newcomer] + addresses[:-1])  # as the metadata names them now
            await until(lambda: groups[stale].last_applied >= new_leader.last_applied)
            assert new_leader.role == Role.LEADER and new_leader.term == term
            assert groups[stale].term == term
        finally:
            for g in groups.values():
                g.close()
            await hubs.close()

    asyncio.run(scenario())


def test_a_snapshot_lists_the_members_as_of_its_last_entry_not_a_change_still_uncommitted(tmp_path):
    """pysyncobj stores its current members in a snapshot, uncommitted changes included. A new leader
    may truncate such a change; a member restarted from the snapshot would still count it."""

    async def scenario():
        loop = asyncio.get_running_loop()
        port = free_port_block(4)
        addresses = [f"127.0.0.1:{port + i}" for i in range(3)]
        newcomer = f"127.0.0.1:{port + 3}"
        hubs = LoopbackHubs()
        hubs.know(*addresses, newcomer)
        groups = {a: SyncObjGroup(GroupConfig(partition=0, hub=hubs.hub(a), self_address=a, peers=tuple(p for p in addresses if p != a),
                                              folder=tmp_path / f"n{i}", fsync=False, tuning=Tuning(),
                                              membership_changes=True), DictStateMachine(), loop)
                  for i, a in enumerate(addresses)}
        try:
            await until(lambda: sum(g.role == Role.LEADER for g in groups.values()) == 1)
            leader = next(g for g in groups.values() if g.role == Role.LEADER)
            await until(lambda: leader.last_applied == leader.last_log_index > 1)
            for i in range(3):
                done = loop.create_future()
                leader.propose(f"k{i}=v".encode(), lambda result, o: done.set_result(o))
                assert await asyncio.wait_for(done, 20) == Outcome.APPLIED
            for address in [a for a, g in groups.items() if g is not leader]:
                groups.pop(address).close()  # nothing commits from here on
            outcomes = []
            leader.add_member(newcomer, lambda result, o: outcomes.append(o))
            await until(lambda: newcomer in leader.voters)  # appended, not committed
            leader.compact()
            await until(lambda: (leader.config.folder / "raft.snapshot").exists() and leader.log_entries <= 3)
            assert snapshot_file.read_meta(leader.config.folder / "raft.snapshot").cluster == sorted(addresses)
            assert not outcomes
        finally:
            for g in groups.values():
                g.close()
            await hubs.close()

    asyncio.run(scenario())


def test_a_replica_ticks_as_soon_as_it_opens_not_at_its_first_raft_timer(tmp_path):
    """Until its first tick a replica drops what arrives (its snapshot is not loaded yet). When ticks came
    only at Raft timers, that first tick waited up to an election timeout: a follower missed every append
    of its first second, and a moved-in replica promoted and stopped within it never loaded its checkpoint."""
    async def scenario():
        port = free_port_block(3)
        addresses = [f"127.0.0.1:{port + i}" for i in range(3)]
        hubs = LoopbackHubs()
        hubs.know(*addresses)  # its peers never start: no message, no link change ticks it
        group = SyncObjGroup(GroupConfig(partition=0, hub=hubs.hub(addresses[0]), self_address=addresses[0],
                                         peers=tuple(addresses[1:]), folder=tmp_path / "n0", fsync=False,
                                         tuning=Tuning()), DictStateMachine(), asyncio.get_running_loop())
        try:
            await until(lambda: group._member._SyncObj__transport._ticked, timeout=Tuning().election_timeout_min / 2)
        finally:
            group.close()
            await hubs.close()

    asyncio.run(scenario())


def test_a_new_clusters_group_campaigns_within_the_shortest_timeout_and_others_wait_a_whole_one(tmp_path):
    """A new cluster waited a whole election timeout (0.4 to 1.4 s) for each group's first leader. A group that
    never had a term, in a new cluster, has no leader to unseat. One that had a term keeps pysyncobj's
    timeout, and so does one added to a running group: its leader reaches it within that time."""
    async def scenario():
        loop, hubs, tuning = asyncio.get_running_loop(), LoopbackHubs(), Tuning()
        address = f"127.0.0.1:{free_port_block(1)}"

        def open_group(folder: str, new_cluster: bool) -> tuple[SyncObjGroup, float, float]:
            """The group, and its first election's deadline from before it opened and from after."""
            before = time.monotonic()
            group = SyncObjGroup(GroupConfig(partition=0, hub=hubs.hub(address), self_address=address, peers=(),
                                             folder=tmp_path / folder, fsync=False, tuning=tuning,
                                             new_cluster=new_cluster), DictStateMachine(), loop)
            deadline = group._member._SyncObj__raftElectionDeadline
            return group, deadline - before, deadline - time.monotonic()

        added, from_before, _ = open_group("added", new_cluster=False)
        added.close()
        assert from_before >= tuning.election_timeout_min
        new, _, from_after = open_group("n0", new_cluster=True)
        try:
            assert from_after <= tuning.election_timeout_min
            await until(lambda: new.role == Role.LEADER and new.term == 1)
        finally:
            new.close()
        reopened, from_before, _ = open_group("n0", new_cluster=True)
        try:
            assert reopened.term == 1 and from_before >= tuning.election_timeout_min
        finally:
            reopened.close()
            await hubs.close()

    asyncio.run(scenario())


def test_a_proposal_is_journaled_as_bytes_and_an_entry_pickled_by_pysyncobj_still_applies(tmp_path):
    """pysyncobj's @replicated wrapper pickles in protocol 2, which stores bytes as latin-1 text rebuilt
    through codecs.encode: an entry of non-ASCII bytes was 1.5 times its size, and a MB took 10 ms to
    write and read. Proposals now go in protocol 5; entries journaled before still apply."""
    async def scenario():
        loop = asyncio.get_running_loop()
        hubs = LoopbackHubs()
        address = f"127.0.0.1:{free_port_block(1)}"
        state = DictStateMachine()
        group = SyncObjGroup(GroupConfig(partition=0, hub=hubs.hub(address), self_address=address, peers=(),
                                         folder=tmp_path / "n0", fsync=False, tuning=Tuning()), state, loop)
        value = "é" * 1000
        try:
            await until(lambda: group.role == Role.LEADER and group.last_applied >= 1)
            new = loop.create_future()
            group.propose(f"new={value}".encode(), lambda result, outcome: new.set_result(outcome))
            assert await asyncio.wait_for(new, 10) == Outcome.APPLIED
            command = group._journal[len(group._journal) - 1][0]
            assert len(command) <= len(f"new={value}".encode()) + 32
            old = loop.create_future()
            group._member._apply(f"old={value}".encode(), callback=lambda result, reason: old.set_result(reason))
            group._ticker.soon()
            await asyncio.wait_for(old, 10)
            assert len(group._journal[len(group._journal) - 1][0]) > 1.4 * len(value.encode())
            assert state.data == {"new": value, "old": value}
        finally:
            group.close()
            await hubs.close()

    asyncio.run(scenario())


class _FullDisk(DictStateMachine):
    """Its database refuses the first `refusals` applies: the disk is full until then."""

    def __init__(self, refusals: int):
        super().__init__()
        self.refusals = refusals

    def apply(self, entry):
        if self.refusals and entry.payload.startswith(b"full"):
            self.refusals -= 1
            raise StorageFull("disk full writing the database; writes resume once space is freed")
        return super().apply(entry)


def _single_voter(tmp_path, machine, hubs, loop) -> SyncObjGroup:
    address = f"127.0.0.1:{free_port_block(1)}"
    return SyncObjGroup(GroupConfig(partition=0, hub=hubs.hub(address), self_address=address, peers=(),
                                    folder=tmp_path / "n0", fsync=False, tuning=Tuning()), machine, loop)


def test_a_proposal_whose_apply_met_a_full_disk_is_answered_once_it_applies(tmp_path):
    """pysyncobj takes an entry's waiting proposals before applying it; an apply that raised (a full disk,
    retried every tick) lost them, and the leader's group commit waited the whole request timeout for an
    answer that never came, holding every later write and read barrier of the partition behind it
    (test_disk_full, a read timed out at 3 s once the disk had room)."""
    async def scenario():
        loop = asyncio.get_running_loop()
        hubs = LoopbackHubs()
        machine = _FullDisk(refusals=3)
        group = _single_voter(tmp_path, machine, hubs, loop)
        try:
            await until(lambda: group.role == Role.LEADER and group.last_applied >= 1)
            answered = loop.create_future()
            group.propose(b"full=1", lambda result, outcome: answered.set_result((result, outcome)))
            assert await asyncio.wait_for(answered, 5) == ("full", Outcome.APPLIED)
            assert machine.refusals == 0 and machine.data == {"full": "1"}
        finally:
            group.close()
            await hubs.close()

    asyncio.run(scenario())


def test_a_proposal_the_journal_could_not_append_for_a_full_disk_is_refused_at_once(tmp_path, monkeypatch):
    """pysyncobj takes a queued proposal and then appends it; an append that raised lost its callback the
    same way, and the writer waited the request timeout for an Undetermined it need not have had."""
    async def scenario():
        loop = asyncio.get_running_loop()
        hubs = LoopbackHubs()
        group = _single_voter(tmp_path, DictStateMachine(), hubs, loop)
        try:
            await until(lambda: group.role == Role.LEADER and group.last_applied >= 1)
            _full_once(monkeypatch)
            refused = loop.create_future()
            group.propose(b"k=1", lambda result, outcome: refused.set_result(outcome))
            assert await asyncio.wait_for(refused, 5) == Outcome.REJECTED
            applied = loop.create_future()
            group.propose(b"k=2", lambda result, outcome: applied.set_result(outcome))
            assert await asyncio.wait_for(applied, 5) == Outcome.APPLIED
        finally:
            group.close()
            await hubs.close()

    asyncio.run(scenario())


def _full_once(monkeypatch) -> None:
    """The journal's next append (any group's in this process) meets a full disk."""
    appended = journal.append_whole

    def full_once(*args):
        monkeypatch.setattr(journal, "append_whole", appended)
        raise StorageFull("disk full while writing the journal; free space on that disk")

    monkeypatch.setattr(journal, "append_whole", full_once)


def test_a_membership_change_the_journal_could_not_append_is_refused_and_undone(tmp_path, monkeypatch):
    """pysyncobj changes its members before it appends the change: refused, the change must be undone too,
    or the leader counts a member its log never named."""
    async def scenario():
        loop = asyncio.get_running_loop()
        hubs = LoopbackHubs()
        port = free_port_block(2)
        address, newcomer = f"127.0.0.1:{port}", f"127.0.0.1:{port + 1}"
        hubs.know(address, newcomer)
        group = SyncObjGroup(GroupConfig(partition=0, hub=hubs.hub(address), self_address=address, peers=(),
                                         folder=tmp_path / "n0", fsync=False, tuning=Tuning(),
                                         membership_changes=True), DictStateMachine(), loop)
        try:
            await until(lambda: group.role == Role.LEADER and group.last_applied == group.last_log_index >= 1)
            _full_once(monkeypatch)
            refused = loop.create_future()
            group.add_member(newcomer, lambda result, outcome: refused.set_result(outcome))
            assert await asyncio.wait_for(refused, 5) == Outcome.REJECTED
            assert group.voters == frozenset([address])
        finally:
            group.close()
            await hubs.close()

    asyncio.run(scenario())


def test_a_proposal_forwarded_by_a_follower_that_the_leader_could_not_append_is_refused_at_once(tmp_path, monkeypatch):
    async def scenario():
        loop = asyncio.get_running_loop()
        hubs = LoopbackHubs()
        groups = _three_voters(tmp_path, hubs, [DictStateMachine() for _ in range(3)], loop)
        try:
            await until(lambda: sum(g.role == Role.LEADER for g in groups) == 1 and
                        all(g.last_applied == g.commit_index > 0 for g in groups))
            follower = next(g for g in groups if g.role != Role.LEADER)
            _full_once(monkeypatch)
            refused = loop.create_future()
            follower.propose(b"k=1", lambda result, outcome: refused.set_result(outcome))
            assert await asyncio.wait_for(refused, 5) == Outcome.REJECTED
        finally:
            for g in groups:
                g.close()
            await hubs.close()

    asyncio.run(scenario())
