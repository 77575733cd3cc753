"""The cluster grows, shrinks and heals under load, on real node processes (docs/elasticity.md)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from raftkv import Client
from raftkv.core.spec import NodeSpec, ports_per_node
from raftkv.dev.local_cluster import free_port_block
from raftkv.dev.netns import Hosts
from raftkv.dev.write_load import WriteLoad
from raftkv.meta.bootstrap import node_record
from raftkv.meta.records import AddNode, NodeState
from tests.conftest import settled_topology, wait_until
from tests.raft_admin import statuses
from tests.test_cli import assert_one_line_error, run

FAST = dict(rebalance_interval=0.5, max_moves=4, max_moves_per_node=2)


def _all_read_back(load: WriteLoad) -> None:
    missing = load.not_read_back()
    assert not missing, f"{len(missing)} of {len(load.acked)} acknowledged writes not read back: {sorted(missing)[:5]}"


class Joiner:
    """`raftkv node start --join` processes this test starts (and stops); with `hosts` (a cluster's, from
    `make_cluster(hosts=True)`) each on a host of its own."""

    def __init__(self, root: Path, partitions: int, hosts: Hosts | None = None):
        self.root = root
        self.partitions = partitions
        self.hosts = hosts
        self.procs: dict[str, subprocess.Popen] = {}
        self.host_of: dict[str, str] = {}
        self.logs: list = []

    def join(self, node_id: str, seed: str, tls: tuple[Path, Path, Path] | None = None, cwd: Path | None = None,
             host: str | None = None) -> str:
        """`tls`: the CA, and this node's certificate and key (relative to `cwd`, if given). `host`: one of
        `hosts` made for it (a new one by default), or 127.0.0.1 without them."""
        host = host or (self.hosts.add() if self.hosts else "127.0.0.1")
        base = free_port_block(ports_per_node(self.partitions))
        files = ["--cacert", str(tls[0]), "--cert", str(tls[1]), "--key", str(tls[2])] if tls else []
        self.log_path(node_id).parent.mkdir(parents=True, exist_ok=True)
        self._start(node_id, host, [*files, "node", "start", "--join", seed, "--node", node_id, "--host", host,
                                    "--base-port", str(base), "--data-dir", str(self.root / node_id)], cwd)
        return f"{host}:{base}"

    def restart(self, node_id: str) -> None:
        """kill -9 it, and start it again from its data dir, as `node start --join` told its operator to."""
        self.procs[node_id].kill()
        self.procs[node_id].wait()
        self._start(node_id, self.host_of[node_id],
                    ["node", "start", "--node", node_id, "--data-dir", str(self.root / node_id)], None)

    def log_path(self, node_id: str) -> Path:
        return self.root / node_id / "node.log"

    def _start(self, node_id: str, host: str, args: list[str], cwd: Path | None) -> None:
        log = open(self.log_path(node_id), "ab")
        self.logs.append(log)
        command = [sys.executable, "-m", "raftkv", *args]
        self.host_of[node_id] = host
        self.procs[node_id] = subprocess.Popen(self.hosts.command_for(host, command) if self.hosts else command,
                                               stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd)

    def close(self) -> None:
        for proc in self.procs.values():
            proc.kill()
            proc.wait()
        for log in self.logs:
            log.close()


@pytest.fixture
def joiner(tmp_path):
    made = []

    def make(partitions: int, hosts: Hosts | None = None) -> Joiner:
        made.append(Joiner(tmp_path / "joined", partitions, hosts))
        return made[-1]

    yield make
    for j in made:
        j.close()


def _balanced(kv: Client, nodes: list[str]) -> bool:
    meta = kv.topology().meta
    if meta.moves or sorted(meta.nodes_in(NodeState.UP)) != sorted(nodes):
        return False
    replicas = Counter({n: len(meta.voter_partitions(n)) for n in nodes})
    leaders = Counter({n: 0 for n in nodes})
    for s in kv.status():
        leaders.update(s.node_id for ps in s.partitions if ps.role == "leader")
    return max(replicas.values()) - min(replicas.values()) <= 1 and max(leaders.values()) - min(leaders.values()) <= 1


def test_two_nodes_join_under_load_and_the_cluster_balances_itself(make_cluster, joiner):
    """Every node on a host of its own (a network namespace with its own address): a node that
    advertised or dialled 127.0.0.1 anywhere would not be reached."""
    cluster = make_cluster(nodes=3, partitions=8, replication=3, hosts=True, **FAST)
    joined = joiner(8, cluster.hosts)
    with WriteLoad(cluster.endpoints, 8) as load, Client(cluster.endpoints, timeout=10.0) as kv:
        wait_until(lambda: len(load.acked) > 200, 30, "the load to get going")
        joined.join("n4", cluster.endpoints[0])
        joined.join("n5", cluster.endpoints[1])
        wait_until(lambda: _balanced(kv, ["n1", "n2", "n3", "n4", "n5"]), 120,
                   "replica and leader counts to be balanced within one across the five nodes")
        before = len(load.acked)
        wait_until(lambda: len(load.acked) > before + 100, 30, "writes after the rebalance")
    assert max(load.longest_partition_gap.values()) < 2.0, load.longest_partition_gap
    _all_read_back(load)
    meta = kv_topology(cluster)
    assert all(len(set(voters)) == 3 for voters in meta.placement)
    assert len(meta.meta_voters) == 5


def test_a_node_joins_a_tls_cluster_with_its_own_certificate_and_one_without_is_told(make_cluster, joiner, tmp_path):
    """n4's files are named relative to the current directory, as README's demo user did: its data dir's
    spec once named them relative to the data dir instead, and it could not read them."""
    cluster = make_cluster(nodes=3, partitions=4, replication=3, tls=True, hosts=True, **FAST)
    certs = cluster.spec.tls.ca.parent
    n4 = cluster.hosts.add()  # a host of its own, as the cluster's nodes: its certificate names its address
    assert run("certs", "init", "--out", str(certs), "--node", f"n4={n4}").returncode == 0
    stranger = run("node", "start", "--join", cluster.endpoints[0], "--node", "n5", "--host", "127.0.0.1",
                   "--base-port", str(free_port_block(ports_per_node(4))), "--data-dir", str(tmp_path / "n5"))
    assert_one_line_error(stranger, "cannot join through", "requires TLS")
    joiner(4, cluster.hosts).join("n4", cluster.endpoints[0], tls=(Path("certs/ca.pem"), Path("certs/node-n4.pem"),
                                                                   Path("certs/node-n4.key")), cwd=certs.parent, host=n4)
    with Client(cluster.endpoints, timeout=10.0, tls=cluster.tls) as kv:
        wait_until(lambda: _balanced(kv, ["n1", "n2", "n3", "n4"]), 120, "n4 to take its share of replicas")
        assert [n.id for n in kv.topology().meta.nodes] == ["n1", "n2", "n3", "n4"]
        kv.put(b"after-join", b"1")
        assert kv.get(b"after-join") == b"1"


def kv_topology(cluster):
    with Client(cluster.endpoints, timeout=10.0) as kv:
        return kv.topology().meta



def _meta_leader(kv: Client) -> str:
    return wait_until(lambda: kv.topology().meta_leader, 10, "a metadata leader")


def test_two_nodes_are_decommissioned_under_load_one_the_metadata_leader(make_cluster):
    cluster = make_cluster(nodes=5, partitions=8, replication=3, **FAST)
    with WriteLoad(cluster.endpoints, 8) as load, Client(cluster.endpoints, timeout=10.0) as kv:
        wait_until(lambda: kv.topology().meta.epoch and len(load.acked) > 200, 30, "the load to get going")
        leaving = [_meta_leader(kv)]
        leaving.append(next(n for n in ("n1", "n2", "n3", "n4", "n5") if n not in leaving))
        seeded = Client([cluster.spec.node(leaving[0]).api_address], timeout=10.0)  # a client given one node
        seeded.put(b"seeded", b"0")
        fewest = 3
        for node_id in leaving:
            result = subprocess.run([sys.executable, "-m", "raftkv", "node", "decommission", node_id, "--no-wait",
                                     "--config", str(cluster.spec_path)], capture_output=True, text=True, timeout=60)
            assert result.returncode == 0, result.stderr

        def removed() -> bool:
            nonlocal fewest
            meta = kv.topology().meta
            fewest = min([fewest] + [len(voters) for voters in meta.placement])
            return all(meta.node(n).state == NodeState.REMOVED for n in leaving)

        wait_until(removed, 180, f"{' and '.join(leaving)} to be drained and removed", interval=0.2)
        for node_id in leaving:
            assert cluster.procs[node_id].wait(timeout=30) == 0  # the process exits by itself, cleanly
        meta = kv.topology().meta
        assert fewest == 3
        assert all(len(voters) == 3 and not set(voters) & set(leaving) for voters in meta.placement)
        assert not set(meta.meta_voters) & set(leaving) and len(meta.meta_voters) == 3
        before = len(load.acked)
        wait_until(lambda: len(load.acked) > before + 100, 30, "writes after the decommissions")
        with seeded:
            seeded.put(b"seeded", b"1")  # it learned the other nodes from the one it was given, now gone
            assert seeded.get(b"seeded") == b"1"
    _all_read_back(load)


def test_a_dead_node_is_replaced_by_itself_and_nothing_acknowledged_is_lost(make_cluster):
    cluster = make_cluster(nodes=4, partitions=8, replication=3, dead_after=10.0, **FAST)
    with WriteLoad(cluster.endpoints, 8) as load, Client(cluster.endpoints, timeout=10.0) as kv:
        wait_until(lambda: kv.topology().meta.epoch and len(load.acked) > 200, 30, "the load to get going")
        victim = next(n for n in ("n4", "n3") if n != kv.topology().meta_leader)
        cluster.kill(victim)
        shutil.rmtree(cluster.spec.node(victim).data_dir)
        wait_until(lambda: (meta := kv.topology().meta).node(victim).state == NodeState.DEAD and not meta.moves
                   and not meta.holds_anything(victim), 120, f"{victim} to be marked dead and replaced")
        meta = kv.topology().meta
        assert all(len(voters) == 3 and victim not in voters for voters in meta.placement)
        before = len(load.acked)
        wait_until(lambda: len(load.acked) > before + 100, 30, "writes after the replacement")
    _all_read_back(load)


def test_bad_membership_commands_are_one_line_and_change_nothing(make_cluster, tmp_path):
    cluster = make_cluster(nodes=3, partitions=2, replication=3)
    config = ("--config", str(cluster.spec_path))
    with Client(cluster.endpoints, timeout=10.0) as kv:
        before = settled_topology(kv)
        base = str(free_port_block(ports_per_node(2)))
        join = ("node", "start", "--node", "n9", "--base-port", base, "--data-dir", str(tmp_path / "n9"))
        assert_one_line_error(run(*join, "--join", "127.0.0.1:1"), "cannot join through 127.0.0.1:1")
        assert_one_line_error(run("node", "start", "--node", "n1", "--base-port", base, "--data-dir",
                                  str(tmp_path / "n1"), "--join", cluster.endpoints[0]),
                              "node n1 is already in the cluster")
        assert_one_line_error(run("node", "start", "--node", "n9", "--join", cluster.endpoints[0]),
                              "--join needs --base-port and --data-dir")
        assert_one_line_error(run("node", "decommission", "n3", *config),
                              "decommissioning n3 would leave 2 nodes up for replication factor 3")
        assert_one_line_error(run("node", "decommission", "n9", *config), "node 'n9' is not in the cluster")
        assert_one_line_error(run("leader", "transfer", "--partition", "0", "--to", "n9", *config),
                              "n9 holds no replica of partition 0")
        assert kv.topology().meta == before
        planned = run("rebalance", "--dry-run", *config)
        assert planned.returncode == 0 and ("balanced" in planned.stdout or "plan" in planned.stdout), planned
        stuck = NodeSpec("n9", "127.0.0.1", int(base), int(base) + 1, int(base) + 2, tmp_path / "n9")
        kv.change_topology(AddNode(node_record(cluster.spec, stuck)))  # registered, and never served
        assert kv.topology().meta.node("n9").state == NodeState.JOINING
        removed = run("node", "decommission", "n9", "--timeout", "30", *config)
        assert removed.returncode == 0 and "n9 is removed from the cluster" in removed.stdout, removed
        assert kv.topology().meta.node("n9").state == NodeState.REMOVED


def test_a_join_through_a_member_whose_metadata_group_has_no_leader_waits_until_one_is_elected(make_cluster,
                                                                                                joiner):
    """A soak (seed 1880499214) found a wiped node that had joined before stopping on its restart with
    "the metadata group has no leader right now; retry": its seed was in an election. It asks again."""
    cluster = make_cluster(nodes=3, partitions=1, replication=3)
    for node_id in ("n1", "n2", "n3"):
        cluster.stop(node_id)
    cluster.start("n1")  # alone: its metadata group cannot elect a leader
    wait_until(lambda: statuses([cluster.endpoints[0]]), 60, "n1 to serve")
    joined = joiner(1)
    joined.join("n4", cluster.endpoints[0])
    wait_until(lambda: "cannot register this node right now" in joined.log_path("n4").read_text(errors="replace"),
               30, "n4 to be told there is no metadata leader")
    assert joined.procs["n4"].poll() is None, joined.log_path("n4").read_text(errors="replace")
    cluster.start("n2")
    cluster.start("n3")
    with Client(cluster.endpoints, timeout=10.0) as kv:
        wait_until(lambda: (meta := kv.topology().meta).has_node("n4") and meta.node("n4").state == NodeState.UP,
                   60, "n4 to join and serve")


def test_a_dead_metadata_voter_that_comes_back_learns_the_topology_from_the_others(make_cluster):
    """Replaced while it was away, it is no member of the metadata group any more, and Raft does not
    tell it: it must ask the other nodes, follow the group as a learner, and come back up."""
    cluster = make_cluster(nodes=4, partitions=4, replication=3, dead_after=5.0, **FAST)
    with Client(cluster.endpoints, timeout=10.0) as kv:
        wait_until(lambda: kv.topology().meta.epoch, 30, "the metadata to be bootstrapped")
        victim = next(n for n in kv.topology().meta.meta_voters if n != kv.topology().meta_leader)
        for i in range(100):
            kv.put(b"k%03d" % i, b"v%d" % i)
        cluster.kill(victim)
        wait_until(lambda: (meta := kv.topology().meta).node(victim).state == NodeState.DEAD and not meta.moves
                   and victim not in meta.meta_voters and not meta.holds_anything(victim), 120,
                   f"{victim} to be dead and replaced, as a metadata voter too")
        cluster.start(victim)
        wait_until(lambda: kv.topology().meta.node(victim).state == NodeState.UP, 60, f"{victim} to be up again")
        with Client([cluster.spec.node(victim).api_address], timeout=10.0) as direct:
            wait_until(lambda: direct.topology().meta.epoch == kv.topology().meta.epoch, 30,
                       f"{victim}'s copy of the metadata to catch up")
            for i in range(100):
                assert direct.get(b"k%03d" % i) == b"v%d" % i


def test_a_spec_node_that_lost_its_data_after_every_other_spec_node_left_learns_the_members_through_join(
        make_cluster, joiner):
    """The first soak hour (docs/chaos.md): n2 was the last node of the spec left when its data was wiped.
    Restarted from the spec alone it knew only nodes that had left, heard none of the members, and its
    replicas campaigned for half an hour. Given --join, it learns the members and catches up."""
    cluster = make_cluster(nodes=3, partitions=2, replication=3, **FAST)
    joined = joiner(2)
    config = ("--config", str(cluster.spec_path))
    with Client(cluster.endpoints, timeout=10.0) as kv:
        wait_until(lambda: kv.topology().meta.epoch, 30, "the metadata to be bootstrapped")
        seed = joined.join("n4", cluster.endpoints[1])
        joined.join("n5", cluster.endpoints[1])
        wait_until(lambda: sorted(kv.topology().meta.nodes_in(NodeState.UP)) == ["n1", "n2", "n3", "n4", "n5"],
                   60, "n4 and n5 to join")
        for node_id in ("n1", "n3"):
            kv.decommission(node_id)
        wait_until(lambda: all(kv.topology().meta.node(n).state == NodeState.REMOVED for n in ("n1", "n3")), 120,
                   "n1 and n3 to be drained and removed")
        for i in range(50):
            kv.put(b"k%02d" % i, b"v%d" % i)
    assert_one_line_error(run("node", "start", *config, "--node", "n1", "--join", seed),
                          "node n1 is no member of the cluster at", "(removed?)")
    cluster.kill("n2")
    for item in cluster.spec.node("n2").data_dir.iterdir():
        if item.name != "node.log":
            shutil.rmtree(item) if item.is_dir() else item.unlink()
    with open(cluster.log_path("n2"), "ab") as log:
        cluster.procs["n2"] = subprocess.Popen([sys.executable, "-m", "raftkv", "node", "start", *config, "--node",
                                                "n2", "--join", seed], stdout=log, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL)
    with Client([cluster.spec.node("n2").api_address], timeout=10.0) as direct:
        wait_until(lambda: direct.topology().meta.has_node("n4"), 30, "n2 to know the members that joined")

        def n2_caught_up() -> bool:
            applied = {(node, ps.partition): ps.applied_index for node, ps in statuses(cluster.endpoints[1:2] + [seed])}
            return all(applied.get(("n2", p), -1) >= applied[("n4", p)] > 1 for p in range(2))

        wait_until(n2_caught_up, 30, "n2's replicas to catch up")
        for i in range(50):
            assert direct.get(b"k%02d" % i, consistency="follower") == b"v%d" % i

    # n4 joined the cluster and the metadata group after it began: restarted, it is a voter of the group at
    # once, as its copy of the metadata says, not a learner until the group's leader tells it (a cluster
    # restarted whole could not elect one while its joined voters waited for it: docs/chaos.md)
    assert "n4" in kv_topology(cluster).meta_voters
    restarted_at = joined.log_path("n4").stat().st_size
    joined.restart("n4")
    wait_until(lambda: b"node n4 serving" in joined.log_path("n4").read_bytes()[restarted_at:], 60,
               "n4 to serve again")
    assert b"metadata group: now a voter here" not in joined.log_path("n4").read_bytes()[restarted_at:]
    with Client([seed], timeout=10.0) as on_n4:
        on_n4.put(b"after-restart", b"1")
        assert on_n4.get(b"after-restart") == b"1"
