"""Whether the client tries an operation again, where and when. Pure: time comes in as `now`.

One decision for every operation (reads, writes, scans before their first
chunk): `decide(error, attempt, now, deadline, is_write)`.

- Errors that say the request is wrong (InvalidRequest, StorageFull, ...) are final.
- A write that may have been applied (Undetermined) is final: retrying could
  apply it twice (the chaos harness found that: docs/chaos.md).
- A NotLeader hint naming another node is followed at once.
- Anything else (no leader yet, a node down, a read timing out) waits a
  little longer each attempt and asks the cluster again, until the deadline;
  then a read ends in Timeout and a write in Unavailable (never sent to a
  leader that accepted it, so certainly not applied).
"""

from __future__ import annotations

from dataclasses import dataclass

from raftkv.core.errors import NotLeader, RaftKVError, Timeout, Unavailable, Undetermined

RETRYABLE = (NotLeader, Unavailable, Timeout, Undetermined)
MAX_DELAY = 0.3


@dataclass(frozen=True)
class Decision:
    retry: bool
    error: RaftKVError | None = None  # what to raise when not retrying
    follow_hint: bool = False  # retry at once, at the leader the error named
    delay: float = 0.0  # else wait this long, then refresh the routing table


def decide(error: RaftKVError, *, attempt: int, now: float, deadline: float, is_write: bool,
           hinted_new_leader: bool, what: str, timeout: float) -> Decision:
    """`hinted_new_leader`: the error is a NotLeader naming a node other than the one just tried."""
    if not isinstance(error, RETRYABLE) or (is_write and isinstance(error, Undetermined)):
        return Decision(retry=False, error=error)
    if hinted_new_leader:
        return Decision(retry=True, follow_hint=True)
    delay = min(0.02 * attempt, MAX_DELAY)
    if now + delay >= deadline:
        return Decision(retry=False, error=give_up(what, is_write, timeout, error))
    return Decision(retry=True, delay=delay)


def give_up(what: str, is_write: bool, timeout: float, last_error: Exception) -> RaftKVError:
    why = f" (last error: {last_error})"
    if not is_write:
        return Timeout(f"{what} did not complete within {timeout}s{why}")
    return Unavailable(f"no leader accepted the {what} within {timeout}s{why}")
