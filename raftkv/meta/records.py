"""What the cluster knows of itself, and how it changes. Pure: values in, values out.

`ClusterMeta` is the state of the metadata group (docs/elasticity.md §1): the
nodes, each partition's voters, the metadata group's own voters, and the
replica moves under way. Every change is a command, checked and applied by
`apply`, which either returns the next state (with `epoch` one higher) or raises
`ChangeRefused` with one line that says what is wrong; a refused command changes
nothing.

Groups are numbered: partitions 0..P-1, and `META` for the metadata group, whose
replicas move the same way as a partition's.
"""

from __future__ import annotations

import enum
import json
import typing
from dataclasses import asdict, dataclass, is_dataclass, replace
from typing import Union

from raftkv.core.errors import ChangeRefused
from raftkv.meta.access import (AccessCommand, GrantPermission, Permission, PutUser, RemoveUser, RevokePermission,
                                RoleRecord, UserRecord, apply_access)
from raftkv.meta.cluster_version import FIRST_RELEASE, LearnerRelease, RaiseClusterVersion, learner_releases, raised
from raftkv.raft.hub import Directory

ACCESS_COMMANDS = (PutUser, RemoveUser, GrantPermission, RevokePermission)

META = -1  # the metadata group's number among the groups
MAX_META_VOTERS = 5  # enough to survive two failures; more only slows every metadata change


def meta_voter_count(nodes: int) -> int:
    """How many of `nodes` up nodes vote in the metadata group: at most five, and an odd number (an
    even count survives no more failures than the odd one below it)."""
    count = min(MAX_META_VOTERS, nodes)
    return count - 1 if count % 2 == 0 else count


class NodeState(str, enum.Enum):
    JOINING = "joining"  # registered, not serving yet
    UP = "up"
    DRAINING = "draining"  # being decommissioned: its replicas move away, then it is removed
    DEAD = "dead"  # unreachable for longer than dead_after: its replicas are re-created elsewhere
    REMOVED = "removed"  # holds nothing and takes nothing; its process exits


class MoveStep(str, enum.Enum):
    """Where a replica move stands (docs/elasticity.md §3); each step is recorded before it is taken."""

    CATCHING_UP = "catching_up"  # the target runs the group as a learner until it is added to the group
    VOTING = "voting"  # the target was added and runs as a voter; next the source is removed
    LEAVING = "leaving"  # the metadata group only: the source follows as a learner before it is removed,
    # because Raft does not tell a member it was removed, and it must go on learning the metadata


@dataclass(frozen=True)
class NodeRecord:
    id: str
    host: str
    api_port: int
    metrics_port: int
    raft_port_base: int
    meta_port: int
    state: NodeState = NodeState.UP

    @property
    def api_address(self) -> str:
        return f"{self.host}:{self.api_port}"

    def raft_address(self, group: int) -> str:
        return f"{self.host}:{self.meta_port if group == META else self.raft_port_base + group}"

    def ports(self, partitions: int) -> set[int]:
        return {self.api_port, self.metrics_port, self.meta_port, *range(self.raft_port_base,
                                                                          self.raft_port_base + partitions)}


@dataclass(frozen=True)
class Move:
    group: int  # a partition, or META
    source: str  # "" when the group only grows (the metadata group)
    target: str  # "" when it only shrinks (the metadata group)
    step: MoveStep = MoveStep.CATCHING_UP


@dataclass(frozen=True)
class ClusterMeta:
    epoch: int = 0  # 0: not bootstrapped yet
    replication: int = 0
    nodes: tuple[NodeRecord, ...] = ()
    placement: tuple[tuple[str, ...], ...] = ()  # partition -> its voters' node ids
    meta_voters: tuple[str, ...] = ()
    moves: tuple[Move, ...] = ()
    cluster_id: str = ""  # random, made at bootstrap: tells this cluster's backups from another's of one name
    users: tuple[UserRecord, ...] = ()  # who may do what: raftkv/meta/access.py
    roles: tuple[RoleRecord, ...] = ()
    cluster_version: str = FIRST_RELEASE  # the lowest release every member runs: raftkv/meta/cluster_version.py
    learner_releases: tuple[tuple[str, str], ...] = ()  # (learner name, the release it last reported)

    def node(self, node_id: str) -> NodeRecord:
        for n in self.nodes:
            if n.id == node_id:
                return n
        known = ", ".join(n.id for n in self.nodes) or "none"
        raise ChangeRefused(f"node {node_id!r} is not in the cluster; known nodes: {known}")

    def has_node(self, node_id: str) -> bool:
        return any(n.id == node_id for n in self.nodes)

    def nodes_in(self, *states: NodeState) -> list[str]:
        return [n.id for n in self.nodes if n.state in states]

    @property
    def members(self) -> list[str]:
        """The nodes not removed."""
        return [n.id for n in self.nodes if n.state != NodeState.REMOVED]

    @property
    def groups(self) -> list[int]:
        return [META, *range(len(self.placement))]

    def voters_of(self, group: int) -> tuple[str, ...]:
        """The voters as recorded (a move's target not included)."""
        return self.meta_voters if group == META else self.placement[group]

    def move_of(self, group: int) -> Move | None:
        return next((m for m in self.moves if m.group == group), None)

    def group_voters(self, group: int) -> tuple[str, ...]:
        """The group's voters: as recorded, and the target of a move once it was added."""
        move = self.move_of(group)
        voters = self.voters_of(group)
        if move is None or move.step == MoveStep.CATCHING_UP:
            return voters
        if move.target and move.target not in voters:
            voters += (move.target,)
        return tuple(v for v in voters if v != move.source) if move.step == MoveStep.LEAVING else voters

    def linked_voters(self, group: int) -> tuple[str, ...]:
        """The members every replica of the group must hear from, whatever its own log says: the group's
        voters, less a move's source once the target was added. The source is removed next, and a
        removed member, which Raft does not tell, campaigns against the others until its node closes it."""
        move = self.move_of(group)
        voters = self.group_voters(group)
        return voters if move is None or move.step == MoveStep.CATCHING_UP else tuple(
            v for v in voters if v != move.source)

    def voter_partitions(self, node_id: str) -> list[int]:
        """The partitions `node_id` runs as a voter."""
        return [p for p in range(len(self.placement)) if node_id in self.group_voters(p)]

    def learner_partitions(self, node_id: str) -> list[int]:
        """The partitions `node_id` runs as a learner: the targets of moves still catching up."""
        return sorted(m.group for m in self.moves
                      if m.target == node_id and m.step == MoveStep.CATCHING_UP and m.group != META)

    def holds_anything(self, node_id: str) -> bool:
        return node_id in self.meta_voters or any(node_id in voters for voters in self.placement) or any(
            node_id in (m.source, m.target) for m in self.moves)


# -- commands ---------------------------------------------------------------


@dataclass(frozen=True)
class Bootstrap:
    """The first state, from the spec: proposed once, by the first leader of the metadata group."""

    replication: int
    nodes: tuple[NodeRecord, ...]
    placement: tuple[tuple[str, ...], ...]
    meta_voters: tuple[str, ...]
    cluster_id: str = ""
    users: tuple[UserRecord, ...] = ()  # with TLS: the admin user, holding the root role


@dataclass(frozen=True)
class AddNode:
    """A node joins (`raftkv node start --join`), in state `joining` until it serves."""

    node: NodeRecord


@dataclass(frozen=True)
class SetNodeState:
    node_id: str
    state: NodeState
    force: bool = False  # decommission even below the replication factor


@dataclass(frozen=True)
class BeginMove:
    group: int
    source: str
    target: str


@dataclass(frozen=True)
class AdvanceMove:
    group: int
    step: MoveStep


@dataclass(frozen=True)
class EndMove:
    """The move is over: `voters` are the group's voters now (unchanged if it was abandoned)."""

    group: int
    voters: tuple[str, ...]


MetaCommand = Union[Bootstrap, AddNode, SetNodeState, BeginMove, AdvanceMove, EndMove, AccessCommand,
                    RaiseClusterVersion, LearnerRelease]


def apply(meta: ClusterMeta, command: MetaCommand) -> ClusterMeta:
    """The state after `command`, or ChangeRefused."""
    if isinstance(command, Bootstrap):
        if meta.epoch:
            raise ChangeRefused("the cluster's metadata already exists")
        return ClusterMeta(epoch=1, replication=command.replication, nodes=command.nodes,
                           placement=command.placement, meta_voters=command.meta_voters,
                           cluster_id=command.cluster_id, users=command.users)
    if not meta.epoch:
        raise ChangeRefused("the cluster's metadata does not exist yet; retry once the nodes have started")
    if isinstance(command, ACCESS_COMMANDS):
        users, roles = apply_access(meta.users, meta.roles, command)
        return replace(meta, epoch=meta.epoch + 1, users=users, roles=roles)
    if isinstance(command, AddNode):
        return _add_node(meta, command.node)
    if isinstance(command, SetNodeState):
        return _set_state(meta, command)
    if isinstance(command, RaiseClusterVersion):
        return replace(meta, epoch=meta.epoch + 1, cluster_version=raised(meta.cluster_version, meta.members, command))
    if isinstance(command, LearnerRelease):
        return replace(meta, epoch=meta.epoch + 1,
                       learner_releases=learner_releases(meta.cluster_version, meta.learner_releases, command))
    _check_group(meta, command.group)
    move = meta.move_of(command.group)
    if isinstance(command, BeginMove):
        _check_move(meta, command)
        return replace(meta, epoch=meta.epoch + 1, moves=meta.moves + (Move(command.group, command.source, command.target),))
    if move is None:
        raise ChangeRefused(f"{group_name(command.group)} has no move under way")
    others = tuple(m for m in meta.moves if m is not move)
    if isinstance(command, AdvanceMove):
        return replace(meta, epoch=meta.epoch + 1, moves=others + (replace(move, step=command.step),))
    if command.group == META:
        return replace(meta, epoch=meta.epoch + 1, meta_voters=command.voters, moves=others)
    placement = list(meta.placement)
    placement[command.group] = command.voters
    return replace(meta, epoch=meta.epoch + 1, placement=tuple(placement), moves=others)


def group_name(group: int) -> str:
    return "the metadata group" if group == META else f"partition {group}"


def _add_node(meta: ClusterMeta, node: NodeRecord) -> ClusterMeta:
    partitions = len(meta.placement)
    known = meta.node(node.id) if meta.has_node(node.id) else None
    if known is not None and known.state != NodeState.REMOVED:
        if replace(known, state=node.state) == node:
            return meta  # the same node asking again (its first answer was lost): nothing to change
        raise ChangeRefused(f"node {node.id} is already in the cluster (at {known.api_address}, {known.state.value}); "
                            "pick another id")
    for other in meta.nodes:
        if other.state != NodeState.REMOVED and other.host == node.host and other.ports(partitions) & node.ports(partitions):
            raise ChangeRefused(f"{node.id}'s ports {min(node.ports(partitions))}-{max(node.ports(partitions))} on "
                                f"{node.host} overlap {other.id}'s; choose another --base-port")
    others = tuple(n for n in meta.nodes if n.id != node.id)  # a removed node may come back under its id
    return replace(meta, epoch=meta.epoch + 1, nodes=others + (replace(node, state=NodeState.JOINING),))


_ALLOWED = {  # state -> the states it may be set from
    NodeState.UP: (NodeState.JOINING, NodeState.UP, NodeState.DEAD),
    # a dead node decommissioned, or one that registered and never served (nothing to move: removed at once)
    NodeState.DRAINING: (NodeState.JOINING, NodeState.UP, NodeState.DRAINING, NodeState.DEAD),
    NodeState.DEAD: (NodeState.JOINING, NodeState.UP, NodeState.DRAINING, NodeState.DEAD),
    NodeState.REMOVED: (NodeState.DRAINING, NodeState.REMOVED),
}


def _set_state(meta: ClusterMeta, command: SetNodeState) -> ClusterMeta:
    node = meta.node(command.node_id)
    new = command.state
    if node.state not in _ALLOWED[new]:
        raise ChangeRefused(f"{node.id} is {node.state.value}; it cannot become {new.value}")
    if new == NodeState.DRAINING and not command.force:
        up = [n for n in meta.nodes_in(NodeState.UP) if n != node.id]
        if len(up) < meta.replication:
            raise ChangeRefused(f"decommissioning {node.id} would leave {len(up)} nodes up for replication factor "
                                f"{meta.replication}; add a node first (or --force, which leaves partitions short)")
        if meta.meta_voters == (node.id,):
            raise ChangeRefused(f"{node.id} is the last voter of the metadata group; add a node first (or --force)")
    if new == NodeState.REMOVED and meta.holds_anything(node.id):
        raise ChangeRefused(f"{node.id} still holds replicas; it is removed once they have moved away")
    nodes = tuple(replace(n, state=new) if n.id == node.id else n for n in meta.nodes)
    return replace(meta, epoch=meta.epoch + 1, nodes=nodes)


def _check_group(meta: ClusterMeta, group: int) -> None:
    if not (group == META or 0 <= group < len(meta.placement)):
        raise ChangeRefused(f"partition {group} does not exist; the cluster has {len(meta.placement)}")


def _check_move(meta: ClusterMeta, move: BeginMove) -> None:
    g, voters = move.group, meta.voters_of(move.group)
    if not (move.source or move.target) or (g != META and not (move.source and move.target)):
        raise ChangeRefused(f"a move of {group_name(g)} needs a source and a target node")
    if move.source:
        meta.node(move.source)
    if (m := meta.move_of(g)) is not None:
        raise ChangeRefused(f"{group_name(g)} is already moving ({m.source or 'new'} -> {m.target}); wait for it to finish")
    if move.source and move.source not in voters:
        raise ChangeRefused(f"{move.source} holds no replica of {group_name(g)}; its replicas are on {', '.join(voters)}")
    if not move.target:
        if len(voters) < 2:
            raise ChangeRefused(f"{move.source} is the last voter of {group_name(g)}")
        return
    target = meta.node(move.target)
    if move.target in voters:
        raise ChangeRefused(f"{move.target} already holds a replica of {group_name(g)}")
    if target.state != NodeState.UP:
        raise ChangeRefused(f"{move.target} is {target.state.value}; replicas move only to nodes that are up")


# -- encoding ---------------------------------------------------------------

_COMMANDS = {cls.__name__: cls for cls in (Bootstrap, AddNode, SetNodeState, BeginMove, AdvanceMove, EndMove,
                                            RaiseClusterVersion, LearnerRelease, *ACCESS_COMMANDS)}


def encode_command(command: MetaCommand) -> bytes:
    return json.dumps({"kind": type(command).__name__, **asdict(command)}).encode()


def decode_command(data: bytes) -> MetaCommand:
    """The command `data` encodes; ValueError when it is not one, field types included: a command arrives
    from callers, and a well-formed one of wrong types would fail the metadata group's apply on every node."""
    try:
        doc = json.loads(data)
        if not isinstance(doc, dict) or not isinstance(doc.get("kind"), str) or doc["kind"] not in _COMMANDS:
            raise ValueError(f"a JSON object whose \"kind\" is one of {', '.join(_COMMANDS)}")
        command = _decoded(doc)
    except (KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise ValueError(f"{type(exc).__name__}: {exc}") from None
    return _typed(command, type(command), type(command).__name__)


def _decoded(doc: dict) -> MetaCommand:
    kind = _COMMANDS[doc.pop("kind")]
    if kind is Bootstrap:
        return Bootstrap(doc["replication"], _nodes(doc["nodes"]), _placement(doc["placement"]),
                         tuple(doc["meta_voters"]), doc.get("cluster_id", ""), _users(doc.get("users", ())))
    if kind is AddNode:
        return AddNode(_node(doc["node"]))
    if kind is SetNodeState:
        return SetNodeState(doc["node_id"], NodeState(doc["state"]), doc["force"])
    if kind is AdvanceMove:
        return AdvanceMove(doc["group"], MoveStep(doc["step"]))
    if kind is EndMove:
        return EndMove(doc["group"], tuple(doc["voters"]))
    if kind is PutUser:
        return PutUser(_user(doc["user"]), bool(doc["keep_token"]))
    if kind is RaiseClusterVersion:
        return RaiseClusterVersion(str(doc["version"]), tuple((str(n), str(r)) for n, r in doc["releases"]))
    if kind is GrantPermission:
        return GrantPermission(str(doc["role"]), Permission(str(doc["permission"]["access"]),
                                                            str(doc["permission"]["prefix"])))
    return kind(**doc)


def _typed(value, hint, where: str):
    """`value` when it is of the type `hint` (the types the records use); ValueError naming `where` otherwise."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is tuple:
        if not isinstance(value, tuple) or (args[-1] is not Ellipsis and len(value) != len(args)):
            raise ValueError(f"{where} is not a {hint}")
        for i, item in enumerate(value):
            _typed(item, args[0] if args[-1] is Ellipsis else args[i], f"{where}[{i}]")
    elif is_dataclass(hint):
        if type(value) is not hint:
            raise ValueError(f"{where} is not a {hint.__name__}")
        for name, field_hint in typing.get_type_hints(hint).items():
            _typed(getattr(value, name), field_hint, f"{where}.{name}")
    elif type(value) is not hint:  # exactly: a bool is not an int here
        raise ValueError(f"{where} is {type(value).__name__}, not {hint.__name__}")
    return value


def encode_access(users: tuple[UserRecord, ...], roles: tuple[RoleRecord, ...]) -> bytes:
    return json.dumps({"users": [asdict(u) for u in users], "roles": [asdict(r) for r in roles]}).encode()


def decode_access(data: bytes) -> dict:
    """{"users": ..., "roles": ...}, as ClusterMeta takes them."""
    doc = json.loads(data)
    return {"users": _users(doc["users"]), "roles": _roles(doc["roles"])}


def encode_meta(meta: ClusterMeta) -> bytes:
    return json.dumps(asdict(meta)).encode()


def decode_meta(data: bytes) -> ClusterMeta:
    doc = json.loads(data)
    return ClusterMeta(
        epoch=doc["epoch"],
        replication=doc["replication"],
        nodes=_nodes(doc["nodes"]),
        placement=_placement(doc["placement"]),
        meta_voters=tuple(doc["meta_voters"]),
        moves=tuple(Move(m["group"], m["source"], m["target"], MoveStep(m["step"])) for m in doc["moves"]),
        cluster_id=doc.get("cluster_id", ""),  # none in metadata bootstrapped before it existed
        users=_users(doc.get("users", ())),  # nor these
        roles=_roles(doc.get("roles", ())),
        cluster_version=doc.get("cluster_version", FIRST_RELEASE),  # nor this
        learner_releases=tuple((str(n), str(r)) for n, r in doc.get("learner_releases", ())),  # nor these
    )


def _node(doc: dict) -> NodeRecord:
    return NodeRecord(**{**doc, "state": NodeState(doc["state"])})


def _nodes(docs: list[dict]) -> tuple[NodeRecord, ...]:
    return tuple(_node(d) for d in docs)


def _user(doc: dict) -> UserRecord:
    return UserRecord(str(doc["name"]), tuple(map(str, doc["roles"])), str(doc["token_sha256"]))


def _users(docs) -> tuple[UserRecord, ...]:
    return tuple(_user(d) for d in docs)


def _roles(docs) -> tuple[RoleRecord, ...]:
    return tuple(RoleRecord(str(r["name"]), tuple(Permission(str(p["access"]), str(p["prefix"]))
                                                  for p in r["permissions"])) for r in docs)


def _placement(docs: list[list[str]]) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple(voters) for voters in docs)


def raft_directory(nodes: tuple[NodeRecord, ...], partitions: int) -> Directory:
    """Where each node's Raft hub listens (its first Raft port), and whose each group's Raft address is."""
    groups = [*range(partitions), META]
    return Directory(endpoints={n.id: (n.host, n.raft_port_base) for n in nodes},
                     members={n.raft_address(g): (n.id, g) for n in nodes for g in groups})
