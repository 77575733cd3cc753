"""What a chaos run does: one frozen, validated object (built from the CLI's flags or by a test)."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from raftkv.chaos import netcut, small_disk
from raftkv.chaos.feeds import LEARNERS
from raftkv.chaos.nemesis import FAULTS, POWER_LOSS_DISK_FAULTS, FaultChoice
from raftkv.chaos.resources import SAMPLE_SECONDS
from raftkv.api.convert import CONSISTENCY_BY_NAME
from raftkv.core.spec import FSYNC, RAFT_ENGINES, NodeSpec, Tuning
from raftkv.powerloss import disk as power_loss_disk

# Short request deadlines keep clients moving through faults; frequent compaction puts
# snapshots on disk (to corrupt, and to install on wiped or lagging replicas) within a minute.
# dead_after: a replaced node is marked dead, and its replicas re-created, within a fault's heal; longer
# than any other fault keeps a node away (8 s at most).
CHAOS_TUNING = Tuning(request_timeout=3.0, compaction_min_entries=500, dead_after=20.0)


@dataclass(frozen=True)
class ChaosConfig:
    nodes: int = 3
    partitions: int = 4
    duration: float = 60.0  # seconds of workload under faults
    clients: int = 8
    faults: tuple[FaultChoice, ...] = tuple(FaultChoice(f) for f in FAULTS)
    learners: tuple[str, ...] = ()  # each feeds its sink (raftkv/chaos/feeds.py), and its feed is checked
    seed: int = 0
    out: Path | None = None  # where the run's files go; None: a temporary folder, kept only on a violation
    read_consistency: str = "linearizable"  # of the register workload's reads
    durability: str = FSYNC  # the cluster's (core/spec.py's DURABILITY_MODES)
    raft_engine: str = NodeSpec.raft_engine  # every node's (docs/raft-engine.md): the engine that ships
    client_timeout: float = 3.0
    tuning: Tuning = field(default_factory=lambda: CHAOS_TUNING)
    disk_mb: int = 256  # the tmpfs of the diskfull node
    hosts: bool = False  # each node on a host of its own (a network namespace, raftkv.dev.netns)
    sample_seconds: float = SAMPLE_SECONDS  # how often each process's memory, descriptors and threads are noted

    @property
    def fault_kinds(self) -> frozenset[str]:
        return frozenset(c.fault for c in self.faults)

    def problems(self) -> list[str]:
        """Every problem with the flags, and with this machine for the faults asked for."""
        problems = []
        if self.nodes < 3:
            problems.append("--nodes: at least 3 (a majority must survive a minority's faults)")
        if not 1 <= self.partitions <= 64:
            problems.append("--partitions: 1 to 64")
        if self.duration < 5:
            problems.append("--duration: at least 5 seconds")
        if self.clients < 2:
            problems.append("--clients: at least 2 (one register client and one set client)")
        for learner in self.learners:
            if learner not in LEARNERS:
                problems.append(f"--learner: {learner!r} is not one of {', '.join(LEARNERS)}")
        if len(set(self.learners)) < len(self.learners):
            problems.append("--learner: each kind at most once")
        if self.read_consistency not in CONSISTENCY_BY_NAME:
            problems.append(f"read consistency {self.read_consistency!r} is not one of {', '.join(CONSISTENCY_BY_NAME)}")
        if self.raft_engine not in RAFT_ENGINES:
            problems.append(f"--raft-engine: {self.raft_engine!r} is not one of {', '.join(RAFT_ENGINES)}")
        if self.client_timeout <= 0:
            problems.append("client_timeout: must be positive")
        if self.sample_seconds <= 0:
            problems.append("sample_seconds: must be positive")
        problems += self.tuning.problems()
        if self.hosts and os.geteuid() != 0:
            problems.append("--hosts: network namespaces need root")
        unavailable = unavailable_faults(self.fault_kinds, self.hosts)
        for fault in sorted(self.fault_kinds & set(unavailable)):
            what = "network partitions are not possible" if fault == "partition" else "not possible"
            problems.append(f"--faults {fault}: {what} here: {unavailable[fault]}")
        return problems


def unavailable_faults(kinds: Iterable[str], hosts: bool = False) -> dict[str, str]:
    """Each of these fault kinds that this machine cannot inject, and why (README.md#fault-injection
    lists what each needs). Only the kinds asked about are probed. On hosts of their own (`hosts`),
    a partition needs only nftables in each namespace, not cgroups."""
    kinds = set(kinds)
    found = {}
    if "partition" in kinds and hosts and not shutil.which("nft"):
        found["partition"] = "the nft command is missing (install Debian's nftables package)"
    elif "partition" in kinds and not hosts and (why := netcut.unavailable_reason()):
        found["partition"] = why
    if "diskfull" in kinds and (why := small_disk.unavailable_reason()):
        found["diskfull"] = why
    if kinds & set(POWER_LOSS_DISK_FAULTS) and (why := power_loss_disk.unavailable_reason()):
        found.update((fault, why) for fault in sorted(kinds & set(POWER_LOSS_DISK_FAULTS)))
    return found


def runnable_faults(choices: tuple[FaultChoice, ...],
                    unavailable: dict[str, str]) -> tuple[tuple[FaultChoice, ...], dict[str, list[str]]]:
    """The choices this machine can inject, and the kinds left out grouped by why (for the default set
    of faults: an explicit --faults that cannot run is a problem instead)."""
    skipped: dict[str, list[str]] = {}
    for choice in choices:
        if choice.fault in unavailable:
            skipped.setdefault(unavailable[choice.fault], []).append(choice.fault)
    return tuple(c for c in choices if c.fault not in unavailable), skipped
