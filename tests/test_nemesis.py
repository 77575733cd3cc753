"""The nemesis schedule (pure): fault choices, the schedule, and whom a step hits."""

from __future__ import annotations

import random

import pytest

from raftkv.chaos.nemesis import (
    FAULTS, GAP_SECONDS, VARIANTS, FaultChoice, FaultStep, parse_faults, resolve_targets, schedule,
)


def test_parse_faults_takes_kinds_and_variants_and_names_what_is_unknown():
    assert parse_faults("kill, pause:leader,kill") == (FaultChoice("kill"), FaultChoice("pause", "leader"))
    with pytest.raises(ValueError, match="unknown fault 'flood'"):
        parse_faults("kill,flood")
    with pytest.raises(ValueError, match="unknown variant 'all' of pause"):
        parse_faults("pause:all")
    with pytest.raises(ValueError, match="at least one"):
        parse_faults(" , ")


def test_a_schedule_is_one_fault_at_a_time_within_the_duration_and_covers_every_fault_and_variant():
    choices = tuple(FaultChoice(f) for f in FAULTS)
    steps = schedule(choices, duration=600, partitions=4, rng=random.Random(7))
    assert steps == schedule(choices, duration=600, partitions=4, rng=random.Random(7))  # the seed replays it
    for before, after in zip(steps, steps[1:]):
        assert after.at >= before.at + before.hold + GAP_SECONDS[0] - 0.01
    assert steps[-1].at + steps[-1].hold <= 600
    assert {(s.fault, s.variant) for s in steps} == {(f, v) for f, vs in VARIANTS.items() for v in vs}
    assert all(0 <= s.partition < 4 for s in steps)


def test_a_chosen_variant_is_the_only_one_used():
    steps = schedule((FaultChoice("kill", "leader"),), duration=60, partitions=2, rng=random.Random(1))
    assert steps and {s.name for s in steps} == {"kill:leader"}


def step(fault: str, variant: str, seed: int = 0) -> FaultStep:
    return FaultStep(at=0, hold=1, fault=fault, variant=variant, partition=1, seed=seed)


NODES = ("n1", "n2", "n3", "n4", "n5")


def test_targets_follow_the_cluster_as_it_is_when_the_fault_starts():
    leaders = {1: "n3"}
    replicas = ("n2", "n3", "n4")
    assert resolve_targets(step("kill", "leader"), NODES, leaders, replicas) == ("n3",)
    assert resolve_targets(step("partition", "isolate-leader"), NODES, leaders, replicas) == ("n3",)
    assert resolve_targets(step("kill", "leader"), NODES, {}, replicas)[0] in replicas  # no leader right now
    for seed in range(20):
        (follower,) = resolve_targets(step("pause", "follower", seed), NODES, leaders, replicas)
        assert follower in ("n2", "n4")
        minority = resolve_targets(step("kill", "minority", seed), NODES, leaders, replicas)
        assert len(minority) == 2 and set(minority) <= set(NODES)
    assert resolve_targets(step("kill", "all"), NODES, leaders, replicas) == NODES
    assert resolve_targets(step("diskfull", "fill"), NODES, leaders, replicas, disk_node="n5") == ("n5",)
