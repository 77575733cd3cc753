"""After a fault is healed: does every partition take a write again, and do all replicas catch up?"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Callable

from raftkv.client.async_client import AsyncClient
from raftkv.client.sync_client import Client
from raftkv.core.errors import RaftKVError
from raftkv.core.partitioning import partition_for_key
from raftkv.core.spec import ClusterSpec

WRITE_DEADLINE = 10.0  # seconds after healing by which every partition must take a write
CATCH_UP_DEADLINE = 30.0


def probe_keys(partitions: int) -> dict[int, bytes]:
    """One key per partition, outside the workloads' key spaces."""
    keys: dict[int, bytes] = {}
    for i in itertools.count():
        key = b"probe/%d" % i
        keys.setdefault(partition_for_key(key, partitions), key)
        if len(keys) == partitions:
            return keys


async def _write_until(endpoints: list[str], key: bytes, deadline: float) -> float | None:
    """Seconds until a put of `key` is acknowledged (None: not before `deadline`, a time.monotonic())."""
    started = time.monotonic()
    while (left := deadline - time.monotonic()) > 0:
        try:
            async with AsyncClient(endpoints, timeout=max(0.5, min(left, 3.0))) as kv:
                await kv.put(key, b"%d" % time.monotonic_ns())
            return time.monotonic() - started
        except RaftKVError:
            await asyncio.sleep(0.1)
    return None


def writes_resume(spec: ClusterSpec, healed_at: float, loop: asyncio.AbstractEventLoop,
                  deadline: float = WRITE_DEADLINE) -> dict[int, float | None]:
    """Per partition: seconds from `healed_at` (a time.monotonic()) until a write was acknowledged, or None.
    On the run's `loop`: gRPC's poller delivers a closed call's last events after a loop of its own has
    closed, and logs a traceback for each."""
    endpoints = [n.api_address for n in spec.nodes]
    keys = probe_keys(spec.partitions)

    async def probe_all() -> list[float | None]:
        return await asyncio.gather(*(_write_until(endpoints, keys[p], healed_at + deadline)
                                      for p in range(spec.partitions)))

    started = time.monotonic()
    took = loop.run_until_complete(probe_all())
    return {p: None if t is None else t + started - healed_at for p, t in enumerate(took)}


def lagging_replicas(spec: ClusterSpec, each_round: Callable[[], None],
                     deadline: float = CATCH_UP_DEADLINE) -> list[str]:
    """Waits until every replica has applied what its leader had committed at the start; names those that
    did not. `each_round()` runs before every look (the runner restarts nodes that stopped meanwhile)."""
    endpoints = [n.api_address for n in spec.nodes]
    target: dict[int, int] = {}
    behind: list[str] = ["no status yet"]
    end = time.monotonic() + deadline
    with Client(endpoints, timeout=2.0) as kv:
        while time.monotonic() < end:
            each_round()
            try:
                statuses = kv.status()
            except RaftKVError:
                time.sleep(0.2)
                continue
            for s in statuses:
                for ps in s.partitions:
                    if ps.role == "leader":
                        target.setdefault(ps.partition, ps.commit_index)
            members = set(spec.node_ids)  # a node the run removed (decommissioned, or dead and wiped) is no one's
            replicas = {(s.node_id, ps.partition): ps for s in statuses if s.reachable and s.node_id in members
                        for ps in s.partitions}
            unreachable = [s.node_id for s in statuses if not s.reachable and s.node_id in members]
            lagging = [(node_id, p) for (node_id, p), ps in sorted(replicas.items())
                       if p in target and ps.applied_index < target[p]]
            leaders = {ps.partition: (s.node_id, ps) for s in statuses if s.node_id in members
                       for ps in s.partitions if ps.role == "leader"}
            behind = [f"{n} is unreachable" for n in unreachable] + [
                f"{node_id} partition {p} at {replicas[node_id, p].applied_index} < {target[p]} "
                f"({_state(replicas[node_id, p])}; {_leader_state(leaders.get(p))})" for node_id, p in lagging
            ] + [f"partition {p} has no leader ({_replica_states(replicas, p)})" for p in range(spec.partitions)
                 if p not in target]
            if not behind:
                return []
            time.sleep(0.2)
    return behind


def _state(ps) -> str:
    """What a replica believes, for the report: a violation must explain itself."""
    return (f"{ps.role} in term {ps.term}, leader {ps.leader or 'unknown'}, log to {ps.last_log_index}, "
            f"commit {ps.commit_index}, members {','.join(ps.members) or '?'}")


def _replica_states(replicas: dict, partition: int) -> str:
    """Each replica of a partition that answered, as it believes: why no leader is elected."""
    return "; ".join(f"{node_id}: {_state(ps)}" for (node_id, p), ps in sorted(replicas.items())
                     if p == partition) or "no replica answered"


def _leader_state(leader) -> str:
    """The lagging replica's partition as its current leader has it (None: no leader answered)."""
    if leader is None:
        return "no leader answered"
    node_id, ps = leader
    return f"the leader {node_id}: {_state(ps)}"
