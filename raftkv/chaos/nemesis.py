"""The nemesis schedule: which fault when, against whom. Pure: no I/O, randomness from a seeded Random.

A schedule is a tuple of `FaultStep`s, one fault at a time: each is injected
at `at` seconds into the run, held `hold` seconds, then healed, and the
cluster gets a quiet gap before the next. Targets that depend on the
cluster's state (the leader of a partition, a follower) are resolved when the
fault starts, by `resolve_targets`, from the step's own seed.

Faults and their variants (`kind:variant` on the command line):

    kill       leader | follower | minority | all    kill -9, restarted when healed
    pause      leader | follower | minority          SIGSTOP, SIGCONT when healed
    partition  isolate-leader | split                 Raft traffic cut between node groups
    restart    clean | wipe                           SIGTERM and start; or kill -9, wipe the data dir, start
    diskfull   fill                                   the disk node's tmpfs filled by a ballast file, then freed
    corrupt    journal | snapshot | rocksdb           bytes flipped in a stopped node's file (journal: its node log), then started
    membership move | transfer | kill-source          a replica moved to a node without one, or a leadership handed on;
               | stale-return | join                  or a move's source killed, then the replica moved back to it; or
               | decommission | replace               issue 32's six steps (docs/chaos.md); or a node joins, or one is
                                                      drained and removed, or one is killed and wiped, marked dead,
                                                      its replicas re-created and a new node brought in
    failpoint  leader | follower | all                restarted with a random fail point armed to crash there after a
                                                      few passes; started plainly when healed (docs/chaos.md)
    powerloss  cut | torn                             every node killed and its disk's unsynced writes dropped (torn: the
                                                      last one cut at a random byte), as in a power cut; then restarted
    disk       fsync-50ms | fsync-500ms | fsync-5s    one node's disk: its fsyncs slowed, or its reads or fsyncs
               | eio-read | eio-fsync                 failing with EIO (the node must stop with one line)
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Mapping, Sequence

VARIANTS: dict[str, tuple[str, ...]] = {
    "kill": ("leader", "follower", "minority", "all"),
    "pause": ("leader", "follower", "minority"),
    "partition": ("isolate-leader", "split"),
    "restart": ("clean", "wipe"),
    "diskfull": ("fill",),
    "corrupt": ("journal", "snapshot", "rocksdb"),
    "membership": ("move", "transfer", "kill-source", "stale-return", "join", "decommission", "replace"),
    "failpoint": ("leader", "follower", "all"),
    "powerloss": ("cut", "torn"),
    "disk": ("fsync-50ms", "fsync-500ms", "fsync-5s", "eio-read", "eio-fsync"),
}
POWER_LOSS_DISK_FAULTS = ("powerloss", "disk")  # faults that need every node's data dir on a power-loss disk
FAULTS = tuple(VARIANTS)

# seconds a fault is held (for restart and corrupt: how long the node stays down)
HOLD_SECONDS: dict[str, tuple[float, float]] = {
    "kill": (2.0, 6.0),
    "pause": (2.0, 6.0),
    "partition": (3.0, 8.0),
    "restart": (1.0, 3.0),
    "diskfull": (4.0, 8.0),
    "corrupt": (1.0, 3.0),
    "membership": (1.0, 3.0),  # then the heal waits for the move to finish
    "failpoint": (4.0, 8.0),
    "powerloss": (1.0, 3.0),
    "disk": (4.0, 8.0),
}
WARMUP_SECONDS = 3.0  # the workload runs undisturbed first
GAP_SECONDS = (2.0, 4.0)  # quiet time between a heal and the next fault


@dataclass(frozen=True)
class FaultChoice:
    """A fault kind and, optionally, the only variant to use (None: any)."""

    fault: str
    variant: str | None = None

    def __str__(self) -> str:
        return self.fault if self.variant is None else f"{self.fault}:{self.variant}"


@dataclass(frozen=True)
class FaultStep:
    at: float  # seconds after the run starts
    hold: float  # seconds between injecting and healing
    fault: str
    variant: str
    partition: int  # the partition whose leader or followers a leader/follower variant means
    seed: int  # picks among the candidates when the targets are resolved

    @property
    def name(self) -> str:
        return f"{self.fault}:{self.variant}"


def parse_faults(text: str) -> tuple[FaultChoice, ...]:
    """'kill,pause:leader' -> choices; raises ValueError naming what is unknown."""
    choices = []
    for token in (t.strip() for t in text.split(",")):
        if not token:
            continue
        fault, _, variant = token.partition(":")
        if fault not in VARIANTS:
            raise ValueError(f"unknown fault {fault!r}; choose from {', '.join(FAULTS)}")
        if variant and variant not in VARIANTS[fault]:
            raise ValueError(f"unknown variant {variant!r} of {fault}; choose from {', '.join(VARIANTS[fault])}")
        choices.append(FaultChoice(fault, variant or None))
    if not choices:
        raise ValueError("name at least one fault")
    return tuple(dict.fromkeys(choices))


def schedule(choices: Sequence[FaultChoice], duration: float, partitions: int,
             rng: random.Random) -> tuple[FaultStep, ...]:
    """Faults back to back from WARMUP_SECONDS until `duration`, cycling through `choices` in a
    shuffled order each round, so that every chosen fault comes up as often as the others; each
    fault cycles through its variants the same way."""
    steps: list[FaultStep] = []
    at = WARMUP_SECONDS
    cycle: list[FaultChoice] = []
    variant_cycles: dict[str, list[str]] = {}
    while True:
        if not cycle:
            cycle = list(choices)
            rng.shuffle(cycle)
        choice = cycle.pop()
        hold = round(rng.uniform(*HOLD_SECONDS[choice.fault]), 2)
        if at + hold > duration:
            break
        variants = variant_cycles.setdefault(str(choice), [])
        if not variants:
            variants += [choice.variant] if choice.variant else VARIANTS[choice.fault]
            rng.shuffle(variants)
        steps.append(FaultStep(
            at=round(at, 2),
            hold=hold,
            fault=choice.fault,
            variant=variants.pop(),
            partition=rng.randrange(partitions),
            seed=rng.getrandbits(32),
        ))
        at += hold + rng.uniform(*GAP_SECONDS)
    return tuple(steps)


def resolve_targets(step: FaultStep, node_ids: Sequence[str], leaders: Mapping[int, str],
                    replicas: Sequence[str], disk_node: str | None = None) -> tuple[str, ...]:
    """The nodes `step` hits, given the current leader of each partition and the step's partition's replicas.

    A leader variant falls back to a random replica when the partition has no leader right now.
    """
    pick = random.Random(step.seed)
    leader = leaders.get(step.partition)
    if step.fault == "diskfull":
        return (disk_node,) if disk_node else ()
    if step.variant in ("leader", "isolate-leader"):
        return (leader if leader in node_ids else pick.choice(list(replicas)),)
    if step.variant == "follower":
        followers = [n for n in replicas if n != leader]
        return (pick.choice(followers or list(replicas)),)
    if step.variant in ("minority", "split"):
        return tuple(sorted(pick.sample(list(node_ids), max(1, (len(node_ids) - 1) // 2))))
    if step.variant == "all" or step.fault == "powerloss":
        return tuple(node_ids)
    return (pick.choice(list(node_ids)),)  # restart, corrupt, disk: any one node


def choose_disk_node(node_ids: Sequence[str], rng: random.Random) -> str:
    """The node whose data dir lives on a small tmpfs for the diskfull fault."""
    return rng.choice(list(node_ids))
