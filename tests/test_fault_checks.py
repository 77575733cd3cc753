"""The fault injector's own checks of how a node handled a fault, on stand-ins for the cluster and disk."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

from raftkv.chaos.faults import FAILING_DISK_SAYS, FaultInjector
from raftkv.chaos.timeline import FaultRecord, Timeline
from raftkv.dev.local_cluster import free_port_block


class _Disk:
    def heal(self) -> None:
        pass


def test_a_slow_fsync_that_outlasts_its_fault_is_reported_when_it_returns_not_missed(tmp_path: Path):
    """An hour-long run reported "n2 said nothing of its slow fsyncs" three times: a 5 s fsync that began
    in a 4 s fault returned, and its node said so, a second after the heal looked."""
    log = tmp_path / "node.log"
    log.write_text("")
    cluster = SimpleNamespace(live_spec=SimpleNamespace(durability="fsync"), log_path=lambda node_id: log)
    injector = FaultInjector(cluster, Timeline(), power_loss_disks={"n2": _Disk()})
    record = FaultRecord("disk", "fsync-5s", ("n2",), start=time.monotonic() - 4.0)

    def fsync_returns() -> None:
        time.sleep(1.0)
        with log.open("a") as f:
            f.write("WARNING raftkv.core.durable: fsync of raft.log took 5.00s: the disk is slow\n")

    writer = threading.Thread(target=fsync_returns)
    writer.start()
    injector._heal_disk(record)
    writer.join()
    assert record.problems == []


def test_a_node_that_never_says_its_fsyncs_are_slow_is_reported(tmp_path: Path):
    log = tmp_path / "node.log"
    log.write_text("INFO raftkv.node.process: node n2 serving\n")
    cluster = SimpleNamespace(live_spec=SimpleNamespace(durability="fsync"), log_path=lambda node_id: log)
    injector = FaultInjector(cluster, Timeline(), power_loss_disks={"n2": _Disk()})
    record = FaultRecord("disk", "fsync-500ms", ("n2",), start=time.monotonic() - 5.0)
    injector._heal_disk(record)
    assert record.problems == [f"n2 said nothing of its slow fsyncs; see {log}"]


def test_a_node_whose_spec_copy_cannot_be_read_on_a_failing_disk_said_so_in_one_line(tmp_path: Path):
    """A joined node keeps its spec in its data dir: on a disk failing every read, its one line is that
    file's (a soak run counted it a node that stopped without saying why)."""
    log = tmp_path / "node.log"
    log.write_text("error: /data/n8/cluster.toml: cannot read: Input/output error\n")
    cluster = SimpleNamespace(procs={"n8": SimpleNamespace(returncode=2)}, log_path=lambda node_id: log)
    injector = FaultInjector(cluster, Timeline())
    record = FaultRecord("disk", "eio-read", ("n8",), start=time.monotonic())
    injector._stopped_with_one_line("n8", record, FAILING_DISK_SAYS, "a failing disk")
    assert record.problems == [] and record.notes == ["n8 stopped: error: /data/n8/cluster.toml: cannot read: "
                                                      "Input/output error"]


class _OneCrashed:
    """A cluster stand-in: n3 exited by itself once; no member answers (nothing listens on `port`)."""

    members = ["n1", "n2", "n3"]

    def __init__(self, log: Path, port: int):
        self.endpoints = [f"127.0.0.1:{port}"]
        self.started: list[str] = []
        self._log = log
        self._exited = {"n3": 1}

    def log_path(self, node_id: str) -> Path:
        return self._log

    def exited(self) -> dict[str, int]:
        exited, self._exited = self._exited, {}
        return exited

    def start(self, node_id: str, env=None) -> None:
        self.started.append(node_id)


def test_a_node_that_stops_while_a_change_of_shape_is_waited_on_is_started_again(tmp_path: Path):
    """The fsync sweep's seed 504: a node a corrupt fault had left on damaged files stopped on them during a
    `replace`. Nothing started it again while the replace's heal waited (165 s): it was marked dead, and the
    two live nodes could not take the replaced node's replicas ("not re-created elsewhere within 140s")."""
    log = tmp_path / "node.log"
    log.write_text("")
    cluster = _OneCrashed(log, free_port_block(1))
    injector = FaultInjector(cluster, Timeline())
    record = FaultRecord("membership", "replace", ("n1",), start=time.monotonic())
    assert not injector._meta_says(lambda meta: True, 1.0, record)
    assert cluster.started == ["n3"]
    assert record.problems == [f"n3 exited with code 1 during membership:replace; see {log}"]
