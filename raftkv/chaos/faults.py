"""Injecting and healing the nemesis's faults in a LocalCluster (all the I/O the schedule leaves out).

Each `inject` resolves the step's targets against the cluster's current
leaders, does the damage and opens a record on the timeline; `heal` undoes
it and closes the record. What the cluster did wrong on the way (a node
that exits on a corrupt file without saying so in one line) goes into the
record's `problems`.
"""

from __future__ import annotations

import random
import shutil
import signal
import subprocess
import time

import grpc

from raftkv import failpoints
from raftkv.api import kv_pb2 as pb
from raftkv.api import kv_pb2_grpc
from raftkv.chaos.corruption import flip_bytes
from raftkv.chaos.membership_faults import MembershipFaults
from raftkv.chaos.nemesis import FaultStep, resolve_targets
from raftkv.chaos.netcut import NetCut
from raftkv.chaos.node_logs import NodeLogs
from raftkv.chaos.small_disk import BALLAST_NAME, SmallDisk
from raftkv.powerloss.disk import PowerLossDisk
from raftkv.chaos.timeline import FaultRecord, Timeline
from raftkv.client.sync_client import Client
from raftkv.core.errors import RaftKVError
from raftkv.dev.local_cluster import LocalCluster
from raftkv.core.partitioning import replicas_for
from raftkv.core.spec import ClusterSpec
from raftkv.core.durable import SLOW_FSYNC_SECONDS, fsync_directory
from raftkv.core.event_loop import STRAGGLER
from raftkv.node.join import LEADER_WAIT_SECONDS

# For a restarted node to serve its API, or exit; a wiped node that had joined joins again first, which may
# wait out an election of the metadata group.
START_TIMEOUT = 30.0 + LEADER_WAIT_SECONDS
FAILPOINT_PASSES = 20  # an armed fail point lets up to this many hits pass before it crashes the node
SNAPSHOT_PASSES = 2  # a snapshot is taken every few seconds only
SLOW_FSYNC_MS = {"fsync-50ms": 50, "fsync-500ms": 500, "fsync-5s": 5000}
SLOW_FSYNC_GRACE = 2.0  # s after a slow fsync's delay by which its node has said so

# What a node stopped by a failing disk says: an fsync or a read failed, a file is unreadable, or (a joined
# node keeps its spec in its data dir) its spec cannot be read.
FAILING_DISK_SAYS = ("failed", "unreadable", "cannot read")


class FaultInjector(MembershipFaults):
    def __init__(self, cluster: LocalCluster, timeline: Timeline, netcut: NetCut | None = None,
                 disk: SmallDisk | None = None, disk_node: str | None = None,
                 power_loss_disks: dict[str, PowerLossDisk] | None = None,
                 spare_disks: dict[str, PowerLossDisk] | None = None):
        self.cluster = cluster
        self.timeline = timeline
        self.netcut = netcut
        self.disk = disk
        self.disk_node = disk_node
        self.power_loss_disks = power_loss_disks or {}  # every node's data dir, for powerloss and disk
        self.spare_disks = spare_disks or {}  # the spares', mounted when they join
        self.down: set[str] = set()  # nodes stopped on purpose
        self.paused: set[str] = set()
        self.damaged: dict[str, FaultRecord] = {}  # nodes running on files a corrupt fault damaged
        self.failing: dict[str, FaultRecord] = {}  # nodes running on a disk that fails reads or fsyncs
        self.armed: dict[str, str] = {}  # nodes running with a fail point armed to crash them: its name
        self.joining: dict[str, FaultRecord] = {}  # spares started to join, by the fault that joins them
        self.leaving: dict[str, FaultRecord] = {}  # members decommissioned, until they are removed
        self.replaced: dict[str, FaultRecord] = {}  # members killed and wiped, until they are dead and replaced
        self.logs = NodeLogs(cluster.log_path)  # marked when a node starts, and when a disk fault begins

    # -- the cluster as it is now -------------------------------------------

    @property
    def spec(self) -> ClusterSpec:
        """The cluster's members now (membership faults join and remove nodes)."""
        return self.cluster.live_spec

    def live(self) -> list[str]:
        """The members running and not paused."""
        return [n for n in self.cluster.members if n not in self.down | self.paused]

    def leaders(self) -> dict[int, str]:
        try:
            with Client(self.cluster.endpoints, timeout=2.0) as kv:
                statuses = kv.status()
        except RaftKVError:
            return {}
        return {ps.partition: s.node_id for s in statuses if s.reachable for ps in s.partitions if ps.role == "leader"}

    # -- inject and heal ---------------------------------------------------

    def placement(self) -> tuple[tuple[str, ...], ...]:
        return placement_of(self.spec)

    def inject(self, step: FaultStep) -> FaultRecord:
        replicas = self.placement()[step.partition]
        targets = resolve_targets(step, self.spec.node_ids, self.leaders(), replicas, self.disk_node)
        record = self.timeline.begin(step.fault, step.variant, targets)
        if step.variant in ("leader", "follower", "isolate-leader"):
            record.notes.append(f"partition {step.partition}")
        getattr(self, f"_inject_{step.fault}")(step, record)
        return record

    def heal(self, record: FaultRecord) -> None:
        getattr(self, f"_heal_{record.fault}")(record)
        self.timeline.healed(record)

    def heal_everything(self) -> None:
        """Undo whatever is still in force at the end of the run."""
        for node_id in list(self.paused):
            self.cluster.signal(node_id, signal.SIGCONT)
        self.paused.clear()
        if self.netcut is not None:
            self.netcut.heal()
        if self.disk is not None:
            self.disk.free()
        for disk in self.power_loss_disks.values():
            disk.heal()
        for node_id in list(self.armed):  # stopped here, then started plainly below
            del self.armed[node_id]
            self._kill(node_id)
        for node_id in list(self.down):
            self._start(node_id)
        for record in {id(r): r for r in (*self.leaving.values(), *self.replaced.values(),
                                          *self.joining.values())}.values():
            self._heal_membership(record)  # of a fault the end of the run cut short
        if self.timeline.current is not None:
            self.timeline.healed(self.timeline.current)

    # kill -9, restarted when healed
    def _inject_kill(self, step: FaultStep, record: FaultRecord) -> None:
        for node_id in record.targets:
            self._kill(node_id)

    def _heal_kill(self, record: FaultRecord) -> None:
        for node_id in record.targets:
            self._start(node_id)

    # SIGSTOP / SIGCONT
    def _inject_pause(self, step: FaultStep, record: FaultRecord) -> None:
        for node_id in record.targets:
            self.cluster.signal(node_id, signal.SIGSTOP)
            self.paused.add(node_id)

    def _heal_pause(self, record: FaultRecord) -> None:
        for node_id in record.targets:
            self.cluster.signal(node_id, signal.SIGCONT)
            self.paused.discard(node_id)

    # Raft traffic cut between the targets and the rest
    def _inject_partition(self, step: FaultStep, record: FaultRecord) -> None:
        rest = tuple(n for n in self.spec.node_ids if n not in record.targets)
        self.netcut.cut([record.targets, rest])
        record.notes.append(f"cut {','.join(record.targets)} | {','.join(rest)}")

    def _heal_partition(self, record: FaultRecord) -> None:
        self.netcut.heal()

    # a graceful restart, or a kill -9 and a wiped data dir (the node must re-sync from its peers)
    def _inject_restart(self, step: FaultStep, record: FaultRecord) -> None:
        (node_id,) = record.targets
        if step.variant == "clean":
            self.cluster.stop(node_id)
            self.down.add(node_id)
        else:
            self._kill(node_id)
            self._wipe(node_id, record)

    def _heal_restart(self, record: FaultRecord) -> None:
        self._start(record.targets[0])

    # the disk node's tmpfs filled up, then freed
    def _inject_diskfull(self, step: FaultStep, record: FaultRecord) -> None:
        ballast = self.disk.fill()
        record.notes.append(f"ballast of {ballast >> 20} MiB; {self.disk.free_bytes()} bytes left")

    def _heal_diskfull(self, record: FaultRecord) -> None:
        self.disk.free()

    # bytes flipped in a file of a stopped node, which is then started
    def _inject_corrupt(self, step: FaultStep, record: FaultRecord) -> None:
        (node_id,) = record.targets
        self._kill(node_id)
        record.notes.append(flip_bytes(self.spec.node(node_id).data_dir, step.variant, random.Random(step.seed)))

    def _heal_corrupt(self, record: FaultRecord) -> None:
        (node_id,) = record.targets
        self._start(node_id)
        started = self._serves_or_exits(node_id, record)
        if started == "served":
            record.notes.append(f"{node_id} started on the damaged files")
            self.damaged[node_id] = record  # it may still run into the damage later, and stop
        elif started == "exited":
            self._refused(node_id, record)
        else:  # a problem already; its damaged files would stop every later start too
            self._kill(node_id)
            self._start_wiped(node_id, record)

    def _refused(self, node_id: str, record: FaultRecord, says: tuple[str, ...] = ("corrupt",),
                 on: str = "damaged files") -> None:
        """A node stopped on damaged files (or a failing disk): it must say so in one line; then it is
        wiped and re-syncs, as that line tells an operator to do."""
        self._stopped_with_one_line(node_id, record, says, on)
        self._start_wiped(node_id, record)

    def _start_wiped(self, node_id: str, record: FaultRecord) -> None:
        self.down.add(node_id)
        self._wipe(node_id, record)
        self._start(node_id)

    def _stopped_with_one_line(self, node_id: str, record: FaultRecord, says: tuple[str, ...], on: str) -> None:
        code = self.cluster.procs[node_id].returncode
        errors = self.logs.errors(node_id)
        if self.logs.lines(node_id, STRAGGLER):
            record.problems.append(f"{node_id}: a task {STRAGGLER} as it stopped; see {self.cluster.log_path(node_id)}")
        if code == 2 and len(errors) == 1 and any(word in errors[0] for word in says):
            record.notes.append(f"{node_id} stopped: {errors[0]}")
        else:
            record.problems.append(f"{node_id} exited with code {code} on {on} without one clear "
                                   f"'error: ... {' or '.join(says)}' line; see {self.cluster.log_path(node_id)}")

    def restart_crashed(self) -> dict[str, int]:
        """Restart nodes that exited although nothing stopped them; returns the exit codes of those that
        crashed. A node started on damaged files that stops on them is not a crash (see `_refused`)."""
        crashed = {}
        for node_id, code in self.cluster.exited().items():
            if node_id in self.down or node_id in self.armed and code == -signal.SIGKILL or node_id in self.leaving:
                continue  # stopped on purpose, crashed at its fail point (restarted when healed), or removed
            self.armed.pop(node_id, None)
            if node_id in self.damaged:
                self._refused(node_id, self.damaged.pop(node_id))
            elif node_id in self.failing:  # its disk still fails: started again when the fault is healed
                self.down.add(node_id)
            else:
                crashed[node_id] = code
                self._start(node_id)
        return crashed

    # restarted with a fail point armed to crash there after a few passes; started plainly when healed
    def _inject_failpoint(self, step: FaultStep, record: FaultRecord) -> None:
        pick = random.Random(step.seed)
        points = failpoints.node_points(fsync=self.spec.durability == "fsync")
        shared = pick.choice(points)  # "all": every node crashes at the same point, as in a power cut
        for node_id in record.targets:
            point = shared if step.variant == "all" else pick.choice(points)
            passes = pick.randrange(SNAPSHOT_PASSES if point.startswith("snapshot-") else FAILPOINT_PASSES)
            setting = f"{point}={passes}*off->crash"
            self._kill(node_id)
            self._start(node_id, env={failpoints.ENVIRONMENT_VARIABLE: setting})
            self.armed[node_id] = point
            record.notes.append(f"{node_id} armed {setting}")

    def _heal_failpoint(self, record: FaultRecord) -> None:
        for node_id in record.targets:
            point = self.armed.pop(node_id, None)
            if point is None:  # it exited some other way, and `restart_crashed` restarted it plainly
                continue
            code = self.cluster.procs[node_id].poll()
            record.notes.append(f"{node_id} crashed at {point}" if code == -signal.SIGKILL
                                else f"{node_id} did not reach {point}")
            self._kill(node_id)
            self._start(node_id)

    # every node killed, the unsynced writes on its disk dropped, remounted; restarted when healed
    def _inject_powerloss(self, step: FaultStep, record: FaultRecord) -> None:
        for node_id in record.targets:
            self._kill(node_id)
        pick = random.Random(step.seed)
        for node_id in record.targets:
            disk = self.power_loss_disks[node_id]
            cut = disk.crash(tear=step.variant == "torn", seed=pick.getrandbits(32))
            record.notes.append(f"{node_id}: {cut}")
            if cut.failed_undo:  # the disk is in a state no real one could be in: the run proves less
                record.problems.append(f"{node_id}'s power cut could not undo {len(cut.failed_undo)} step(s), "
                                       f"first {cut.failed_undo[0]}")
            disk.mount()

    def _heal_powerloss(self, record: FaultRecord) -> None:
        for node_id in record.targets:
            self._start(node_id)

    # one node's disk slowed, or failing reads (the node is restarted onto it) or fsyncs
    def _inject_disk(self, step: FaultStep, record: FaultRecord) -> None:
        (node_id,) = record.targets
        disk = self.power_loss_disks[node_id]
        self.logs.mark(node_id)  # what it says comes after
        if step.variant in SLOW_FSYNC_MS:
            disk.slow_fsync(SLOW_FSYNC_MS[step.variant])
            return
        self.failing[node_id] = record
        if step.variant == "eio-read":
            self._kill(node_id)
            disk.fail("read", "*")
            self._start(node_id)
            if self._serves_or_exits(node_id, record) == "served":
                record.problems.append(f"{node_id} started and served on a disk whose every read fails")
        else:
            disk.fail("fsync", "*")

    def _heal_disk(self, record: FaultRecord) -> None:
        (node_id,) = record.targets
        self.power_loss_disks[node_id].heal()
        if record.variant in SLOW_FSYNC_MS:
            delay = SLOW_FSYNC_MS[record.variant] / 1000
            if delay > SLOW_FSYNC_SECONDS and self.spec.durability == "fsync":
                # The warning comes when a slow fsync returns, and at most every 10 s: a previous
                # fault's warning can silence the fsyncs of this one's first seconds, so the one that
                # says it may begin just before the heal and still sleep out its whole delay.
                deadline = time.monotonic() + delay + SLOW_FSYNC_GRACE
                while not (said := self.logs.lines(node_id, "the disk is slow")) and time.monotonic() < deadline:
                    time.sleep(0.1)
                if not said:
                    record.problems.append(f"{node_id} said nothing of its slow fsyncs; see "
                                           f"{self.cluster.log_path(node_id)}")
            return
        del self.failing[node_id]
        proc = self.cluster.procs[node_id]
        if proc.poll() is None and not self.logs.errors(node_id) and not self.logs.lines(node_id, " stopping: "):
            record.notes.append(f"{node_id} ran on: it did not {record.variant[4:]} during the fault")
            return
        try:  # it met the failure just before the heal, and is stopping (closing its files takes a while)
            proc.wait(START_TIMEOUT)
        except subprocess.TimeoutExpired:
            record.problems.append(f"{node_id} said it stops on a failing disk but did not exit within "
                                   f"{START_TIMEOUT:.0f}s")
            self._kill(node_id)
        self._refused(node_id, record, says=FAILING_DISK_SAYS, on=f"a disk failing every {record.variant[4:]}")

    # -- helpers -----------------------------------------------------------

    def _kill(self, node_id: str) -> None:
        if node_id in self.paused:
            self.cluster.signal(node_id, signal.SIGCONT)
            self.paused.discard(node_id)
        self.cluster.kill(node_id)
        self.down.add(node_id)

    def _start(self, node_id: str, env: dict[str, str] | None = None) -> None:
        self.logs.mark(node_id)
        self.cluster.start(node_id, env)
        self.down.discard(node_id)

    def _wipe(self, node_id: str, record: FaultRecord) -> None:
        """Delete a stopped node's data (its log and a ballast stay)."""
        data_dir = self.spec.node(node_id).data_dir
        self.damaged.pop(node_id, None)
        for item in data_dir.iterdir():
            if item.name in ("node.log", BALLAST_NAME):
                continue
            if item.is_dir():
                shutil.rmtree(item)
            else:
                item.unlink()
        fsync_directory(data_dir)  # a power cut must not bring the wiped files back
        record.notes.append(f"wiped {data_dir}; {node_id} re-syncs from its peers")

    def _serves_or_exits(self, node_id: str, record: FaultRecord) -> str:
        """"served" once the node answers on its API, "exited" if it exits first; "silent" if neither
        within START_TIMEOUT, a problem: the node prints its threads' stacks to its log (SIGUSR1)."""
        address = self.spec.node(node_id).api_address
        proc = self.cluster.procs[node_id]
        deadline = time.monotonic() + START_TIMEOUT
        with grpc.insecure_channel(address) as channel:
            stub = kv_pb2_grpc.KVStub(channel)
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    return "exited"
                try:
                    stub.Status(pb.StatusRequest(), timeout=1.0)
                    return "served"
                except grpc.RpcError:
                    time.sleep(0.1)
        if proc.poll() is not None:
            return "exited"
        self.cluster.signal(node_id, signal.SIGUSR1)
        record.problems.append(f"{node_id} neither served nor exited within {START_TIMEOUT:.0f}s of its start; its "
                               f"threads' stacks are in {self.cluster.log_path(node_id)}")
        return "silent"


def placement_of(spec: ClusterSpec, wait: float = 0.0) -> tuple[tuple[str, ...], ...]:
    """Each partition's voters now, from the cluster's metadata (the membership faults move them), asked
    again for up to `wait` seconds while no node answers; failing that, the spec's first placement (a
    guess, good enough to pick a fault's targets; the final checks wait: found when a guess after a
    replace sent them to a node that no longer held the replica)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            with Client([n.api_address for n in spec.nodes], timeout=5.0) as kv:
                meta = kv.topology().meta
            if meta.epoch:
                return meta.placement
        except RaftKVError:
            pass
        if time.monotonic() >= deadline:
            return tuple(replicas_for(p, spec.node_ids, spec.replication) for p in range(spec.partitions))
        time.sleep(0.5)
