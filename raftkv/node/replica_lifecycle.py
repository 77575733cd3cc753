"""Which replicas a node opens, copies, closes and deletes: the pure decision of its replica
lifecycle, a reconciler in the Kubernetes sense (docs/architecture.md). `HostedReplicas` runs the
actions it returns; run again on the state they leave, it returns none.

A replica the metadata no longer gives the node is closed and its data deleted. That happens only to
a replica opened for an older state of the metadata, never at start-up (nothing is open then): the
node's copy of the metadata only moves forward, so a newer state that leaves a partition out means
it moved away.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from raftkv.meta.records import META, ClusterMeta


@dataclass(frozen=True)
class Desired:
    """What the metadata gives the node: partitions to run as a voter, and as the learner of a move here.
    `meta_voter`: whether it votes in the metadata group (None: the metadata does not know the node yet)."""

    voters: frozenset[int] = frozenset()
    learners: frozenset[int] = frozenset()
    meta_voter: bool | None = None

    @staticmethod
    def of(topology: ClusterMeta, node_id: str) -> Desired:
        meta_voter = node_id in topology.group_voters(META) if topology.has_node(node_id) else None
        return Desired(frozenset(topology.voter_partitions(node_id)), frozenset(topology.learner_partitions(node_id)),
                       meta_voter)


@dataclass(frozen=True)
class Local:
    """What runs on the node. `copied`: partitions whose copy was tried (it ended, or is under way): they
    open as learners next, on whatever the copy left. `empty`: the partitions among the desired learners
    that hold no data here. `meta_voter`: how the metadata replica runs (None: not open)."""

    voters: frozenset[int] = frozenset()
    learners: frozenset[int] = frozenset()
    copying: frozenset[int] = frozenset()
    copied: frozenset[int] = frozenset()
    empty: frozenset[int] = frozenset()
    meta_voter: bool | None = None


@dataclass(frozen=True)
class OpenVoter:
    partition: int


@dataclass(frozen=True)
class Promote:
    """The learner was added to its group: close it and reopen the same data as a voter."""

    partition: int


@dataclass(frozen=True)
class StartCopy:
    """Seed the new replica's empty folder from a backup or a voter's checkpoint, in the background."""

    partition: int


@dataclass(frozen=True)
class CancelCopy:
    """The move ended without this node while its copy was under way (the copy deletes what it wrote)."""

    partition: int


@dataclass(frozen=True)
class ForgetCopy:
    """A copy ended and the move with it: the data it left is deleted unless the partition runs here."""

    partition: int
    delete: bool


@dataclass(frozen=True)
class OpenLearner:
    partition: int


@dataclass(frozen=True)
class RemoveVoter:
    """Close the voter and delete its data: the partition moved away."""

    partition: int


@dataclass(frozen=True)
class RemoveLearner:
    """Close the learner and delete its data: the move here ended without it."""

    partition: int


@dataclass(frozen=True)
class ReopenMeta:
    """The same metadata data, now as a voter of its group, or no longer one."""

    voting: bool


Action = Union[OpenVoter, Promote, StartCopy, CancelCopy, ForgetCopy, OpenLearner, RemoveVoter, RemoveLearner,
               ReopenMeta]


def reconcile(desired: Desired, local: Local) -> list[Action]:
    """The actions, in order, that make `local` what `desired` asks. A copy under way ends first: its
    partition is neither opened nor deleted until then."""
    actions: list[Action] = []
    if local.meta_voter is not None and desired.meta_voter is not None and local.meta_voter != desired.meta_voter:
        actions.append(ReopenMeta(desired.meta_voter))
    learners = set(local.learners)
    opened = set(local.voters)
    for p in sorted(desired.voters - local.voters - local.copying):
        if p in learners:
            learners.discard(p)
            actions.append(Promote(p))
        else:
            actions.append(OpenVoter(p))
        opened.add(p)
    wanted = desired.voters | desired.learners
    actions += [CancelCopy(p) for p in sorted(local.copying - wanted)]
    copying = local.copying & wanted
    copied = set(local.copied)
    for p in sorted(local.copied - desired.learners):
        copied.discard(p)
        actions.append(ForgetCopy(p, delete=p not in desired.voters))
    for p in sorted(desired.learners - learners - opened - copying):
        if p not in copied and p in local.empty:
            actions.append(StartCopy(p))
        else:
            actions.append(OpenLearner(p))
            learners.add(p)
    actions += [RemoveVoter(p) for p in sorted(opened - desired.voters)]
    actions += [RemoveLearner(p) for p in sorted(learners - wanted)]
    return actions


def after(local: Local, actions: list[Action]) -> Local:
    """`local` once `actions` ran, the copies they started still under way: the model the executor
    follows, for tests and the scenario twin. A deleted partition's folder is empty."""
    voters, learners, copying, copied = set(local.voters), set(local.learners), set(local.copying), set(local.copied)
    empty, meta_voter = set(local.empty), local.meta_voter
    for action in actions:
        if isinstance(action, ReopenMeta):
            meta_voter = action.voting
            continue
        p = action.partition
        if isinstance(action, (OpenVoter, Promote)):
            learners.discard(p)
            voters.add(p)
        elif isinstance(action, StartCopy):
            copying.add(p)
            copied.add(p)
        elif isinstance(action, CancelCopy):
            copying.discard(p)
            empty.add(p)
        elif isinstance(action, ForgetCopy):
            copied.discard(p)
            if action.delete:
                empty.add(p)
        elif isinstance(action, OpenLearner):
            copied.discard(p)
            learners.add(p)
        elif isinstance(action, (RemoveVoter, RemoveLearner)):
            voters.discard(p)
            learners.discard(p)
            empty.add(p)
    return Local(frozenset(voters), frozenset(learners), frozenset(copying), frozenset(copied), frozenset(empty),
                 meta_voter)
