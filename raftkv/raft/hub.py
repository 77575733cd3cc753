"""The Raft hub: one connection from each node to each other node, for the messages of all groups.

pysyncobj's own transport opens a socket per group per pair of members, trusts whatever address a
connection's first message claims, and answers its admin commands (add, remove, transfer) from anyone.
Here each process has one hub on its asyncio loop (docs/raft-transport.md):

- A node listens on one port (its `raft_port_base`) and dials every node it has a message for; it
  sends on the connection it dialed, and receives on the ones it accepted. A learner process dials
  the voters of its groups, asks to `join` each group, and is sent to on that same connection. So no
  rule decides which side connects: a node that does not know yet that another is a member still
  hears from it.
- With the cluster's TLS the connections are mutual TLS, and who sent a message is what the peer's
  certificate says, never what its bytes claim: a node certificate names its node, a learner
  certificate may only join groups read-only, anything else is refused at the handshake or at the
  hello. Without TLS the hello is trusted, as pysyncobj trusted its first message.
- Only Raft messages, the node engine's frames (to nodes that announced it in a ping after their
  hello) and the hub's own control frames are carried (`hub_frames`): pysyncobj's admin commands
  have no way in; membership changes go through the Admin API.
- Frames queued for a connection in one turn of the loop leave in one write; one flush a turn runs
  the node engine's turn (its frames of every group), then the owner's `before_send` (the node log
  written: `log_turn`), then writes every connection's, none if that failed. In fsync mode they are
  held until the node log's sync (on its I/O thread) covers that write (`synced`), except the early
  ones (a leader's appends), which never overtake a held frame (`hub_connection`).
- Each dialer pings every `ping_every` seconds and the other side answers, both at once, never held
  for a sync; a connection that hears nothing for `dead_after` seconds is closed (a cut network
  otherwise leaves it hanging for TCP's minutes), and the dialer tries again every `retry_seconds`.

Groups attach a `GroupEndpoint` (their transport, `syncobj_transport.GroupTransport`) under their
group number; who a group member is comes from the `Directory` the owner keeps up to date.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import ssl as ssl_module
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol

from raftkv.raft import hub_frames
from raftkv.raft.hub_connection import Connection
from raftkv.raft.hub_frames import CONTROL, ENGINE, BadFrame
from raftkv.core import metrics
from raftkv.core.clock import Clock, Throttle
from raftkv.core.errors import ConfigError
from raftkv.security.certs import Identity
from raftkv.security.tls import Tls, peer_identity

log = logging.getLogger(__name__)

HELLO_TIMEOUT = 5.0
CONNECT_TIMEOUT = 5.0
REFUSAL_LOG_SECONDS = 10.0


@dataclass(frozen=True)
class Directory:
    """Where each node's hub listens, and which node and group each Raft address belongs to."""

    endpoints: Mapping[str, tuple[str, int]] = field(default_factory=dict)  # node id -> (host, port)
    members: Mapping[str, tuple[str, int]] = field(default_factory=dict)  # Raft address -> (node id, group)

    @functools.cached_property
    def _addresses(self) -> dict[tuple[str, int], str]:
        return {where: address for address, where in self.members.items()}

    def address(self, node_id: str, group: int) -> str | None:
        return self._addresses.get((node_id, group))

    def locate(self, address: str) -> tuple[str, int] | None:
        return self.members.get(address)


class GroupEndpoint(Protocol):
    """What the hub calls on a group's transport (on the loop)."""

    def deliver(self, sender: str | None, connection: Connection, message: object) -> None:
        """A message of this group from node `sender` (None: a learner process) over `connection`."""

    def links_changed(self) -> None:
        """A connection came up or went down, or a subscriber joined or left: look again."""

    def directory_changed(self) -> None:
        """A node came, went or moved: look again when next awake."""


class RaftHub:
    def __init__(self, loop: asyncio.AbstractEventLoop, node_id: str | None, directory: Callable[[], Directory],
                 tls: Tls | None, retry_seconds: float, dead_after: float, compression: int = 0,
                 clock: Clock = time.monotonic):
        """`node_id`: this node, or None for a learner process (it only dials). `clock`: when a frame
        arrived, so when a connection is dead (`_ping`), and when a refusal is logged."""
        self.loop = loop
        self.clock = clock
        self.node_id = node_id
        self.directory = directory
        self._tls = tls
        self._retry_seconds = retry_seconds
        self._dead_after = dead_after
        self._ping_every = dead_after / 3
        self._compression = compression
        self._groups: dict[int, GroupEndpoint] = {}
        self._links: dict[str, Connection | None] = {}  # node id -> the connection dialed to it, if up
        self._dialing: dict[str, asyncio.Task] = {}
        self._accepted: set[Connection] = set()
        self._subscribers: dict[int, set[Connection]] = {}  # group -> accepted connections that joined it
        self._joins: dict[int, frozenset[str]] = {}  # this process's read-only groups -> the nodes to join at
        self._serving: asyncio.Task | None = None  # becomes the server
        self._pinger: asyncio.TimerHandle | None = None
        self._directory_seen: Directory | None = None
        self._refusals = Throttle(REFUSAL_LOG_SECONDS)
        self._closing = False
        self._to_flush: dict[Connection, None] = {}  # connections with frames queued this turn
        self._holding: set[Connection] = set()  # connections with frames waiting for a sync of the node log
        self._flush_scheduled = False
        # run before a flush: the node log's write point its frames wait for a sync of (0: none; None: drop them)
        self.before_send: Callable[[], int | None] | None = None
        self.engine = None  # the node engine (raft_engine = "steady"): it gets engine frames, its peers get them
        self._engine_peers: dict[str, Connection] = {}  # nodes that announced the engine, on this connection

    # -- set-up -------------------------------------------------------------

    def listen(self, host: str, port: int) -> None:
        """Bind now (OSError if the port is taken); serve once the loop runs."""
        sock = socket.create_server((host, port), reuse_port=False)
        ssl = self._tls.server_context() if self._tls else None
        self._serving = self.loop.create_task(asyncio.start_server(
            self._accept, sock=sock, ssl=ssl, ssl_handshake_timeout=HELLO_TIMEOUT if ssl else None))

    def start(self) -> None:
        self._directory_seen = self.directory()
        self._pinger = self.loop.call_later(self._ping_every, self._ping)

    async def close(self) -> None:
        self._closing = True
        if self._pinger is not None:
            self._pinger.cancel()
        server = await self._serving if self._serving is not None else None
        if server is not None:
            server.close()
        for task in self._dialing.values():
            task.cancel()
        await asyncio.gather(*self._dialing.values(), return_exceptions=True)
        for connection in [c for c in self._links.values() if c] + list(self._accepted):
            connection.close()
        if server is not None:
            await server.wait_closed()

    # -- what groups call ---------------------------------------------------

    def attach(self, group: int, endpoint: GroupEndpoint) -> None:
        self._groups[group] = endpoint
        endpoint.links_changed()  # subscribers that joined before the group opened

    def detach(self, group: int) -> None:
        self._groups.pop(group, None)
        for node_id in self._joins.pop(group, ()):
            self._control(node_id, "leave", group)

    def subscribers(self, group: int) -> frozenset[Connection]:
        return frozenset(self._subscribers.get(group, ()))

    def is_up(self, node_id: str) -> bool:
        """Whether a connection to `node_id` is up; dials it if none is (or being made)."""
        if self._links.get(node_id) is not None:
            return True
        if node_id != self.node_id and node_id not in self._dialing and not self._closing:
            self._dialing[node_id] = self.loop.create_task(self._dial(node_id))
        return False

    def send(self, node_id: str, group: int, message: object, early: bool = False) -> bool:
        """`early`: it may leave before the turn's sync of the node log (`Connection.send`)."""
        connection = self._links.get(node_id)
        return connection is not None and self.reply(connection, group, message, early)

    def reply(self, connection: Connection, group: int, message: object, early: bool = False) -> bool:
        """To a read-only subscriber, on the connection it joined over (and, through `send`, to a node)."""
        metrics.RAFT_MESSAGES_SENT.inc()
        return connection.send(hub_frames.encode((group, message), self._compression), early)

    def engine_peer(self, node_id: str) -> bool:  # it announced the engine, and the connection to it is up
        return node_id in self._engine_peers and self._links.get(node_id) is not None

    def join(self, group: int, node_ids: frozenset[str]) -> None:
        """Be a read-only member of `group` at these nodes, now and after every reconnect."""
        before = self._joins.get(group, frozenset())
        self._joins[group] = node_ids
        for node_id in node_ids - before:
            if self.is_up(node_id):
                self._control(node_id, "join", group)
        for node_id in before - node_ids:
            self._control(node_id, "leave", group)

    def flush_soon(self) -> None:
        """End this turn of the loop with one flush (`before_send`, then every queued frame)."""
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _queued(self, connection: Connection) -> None:
        self._to_flush[connection] = None
        self.flush_soon()

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self.engine is not None:  # its items of the turn join the frames below
            self.engine.turn()
        connections, self._to_flush = self._to_flush, {}
        point = self.before_send() if self.before_send is not None else 0
        for connection in connections:  # dropped, they may speak of records not written: Raft sends again
            connection._end_turn(point)

    def synced(self, point: int) -> None:
        """The node log's sync covers write `point`: the frames that waited for it leave."""
        for connection in list(self._holding):
            if not connection._release(point):
                self._holding.discard(connection)

    def sync_failed(self) -> None:
        """The node log's sync failed: no frame that waited for it may leave."""
        for connection in self._holding:
            connection._drop_held()
        self._holding.clear()

    # -- connections ----------------------------------------------------------

    async def _dial(self, node_id: str) -> None:
        try:
            while not self._closing:
                where = self.directory().endpoints.get(node_id)
                if where is None:  # not (or no longer) a node of the cluster; asked for again, dialed again
                    return
                connection = await self._connect(node_id, *where)
                if connection is not None:
                    self._links[node_id] = connection
                    for group, nodes in self._joins.items():
                        if node_id in nodes:
                            self._control(node_id, "join", group)
                    self._changed()
                    await connection.read_frames()
                await asyncio.sleep(self._retry_seconds)
        finally:
            self._dialing.pop(node_id, None)

    async def _connect(self, node_id: str, host: str, port: int) -> Connection | None:
        ssl = self._tls.client_context() if self._tls else None
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port, ssl=ssl, server_hostname=host if ssl else None), CONNECT_TIMEOUT)
        except ssl_module.SSLError as exc:  # the other side is down, or not the cluster's: say which
            self._log_refusal(f"node {node_id} at {host}:{port} failed the TLS handshake: {exc.reason or exc}")
            return None
        except (OSError, asyncio.TimeoutError):
            return None
        if ssl is not None:
            try:
                identity = peer_identity(writer.get_extra_info("ssl_object"))
            except ConfigError as exc:
                identity = Identity(str(exc), "unknown")
            if (identity.role, identity.name) != ("node", node_id):
                self._log_refusal(f"{host}:{port} is {identity.role} {identity.name}, not node {node_id}")
                writer.close()
                return None
        connection = Connection(self, reader, writer, node_id, dialed=True)
        connection.send(hub_frames.encode((CONTROL, "hello", self.node_id)))
        if self.engine is not None:
            connection.send(hub_frames.ENGINE_PING)
        return connection

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """asyncio's server runs this as a task of its own, and logs a traceback for one that ends
        cancelled (as every one does when the process stops): so cancellation just ends it."""
        try:
            await self._serve(reader, writer)
        except asyncio.CancelledError:
            pass

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = Connection(self, reader, writer, None, dialed=False)
        self._accepted.add(connection)
        try:
            header = await asyncio.wait_for(reader.readexactly(hub_frames.HEADER_BYTES), HELLO_TIMEOUT)
            body = hub_frames.decode(await asyncio.wait_for(
                reader.readexactly(hub_frames.frame_length(header)), HELLO_TIMEOUT))
            connection.peer = self._greeted(writer, body)
        except BadFrame as exc:
            self._refused(writer, str(exc))
            connection.close()
            return
        except (asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError, OSError):
            connection.close()
            return
        connection.greeted = True
        connection.last_received = self.clock()
        await connection.read_frames()

    def _greeted(self, writer: asyncio.StreamWriter, body: tuple) -> str | None:
        """The node id (None: a learner) an accepted connection speaks for, from its hello."""
        if body[:2] != (CONTROL, "hello") or not (body[2] is None or isinstance(body[2], str)):
            raise BadFrame("the first frame is not a hello")
        claimed = body[2]
        if self._tls is not None:
            try:
                identity = peer_identity(writer.get_extra_info("ssl_object"))
            except ConfigError as exc:  # the CA signed it, but not as a raftkv role
                raise BadFrame(str(exc)) from None
            if identity.role == "node":
                expected = identity.name
            elif identity.role == "learner":
                expected = None
            else:
                raise BadFrame(f"a {identity.role} certificate ({identity.name}) may not be a Raft peer")
            if claimed != expected:
                raise BadFrame(f"{identity.role} {identity.name} claimed to be {claimed or 'a learner'}")
        return claimed

    def _received(self, connection: Connection, body: tuple) -> None:
        if body[0] == CONTROL:
            self._on_control(connection, body[1], body[2])
            return
        if body[0] == ENGINE:
            if connection.peer is not None and self.engine is not None:
                self.engine.receive(connection.peer, body[1])
            return
        group, message = body
        metrics.RAFT_MESSAGES_RECEIVED.inc()
        endpoint = self._groups.get(group)
        if endpoint is not None and (connection.peer is not None or group in connection.joined):
            endpoint.deliver(connection.peer, connection, message)

    def _on_control(self, connection: Connection, verb: str, arg: object) -> None:
        if verb == "ping" and not connection.dialed:
            if hub_frames.announces_engine(arg) and connection.peer is not None:
                self._engine_peers[connection.peer] = connection
            connection.send_now(hub_frames.encode((CONTROL, "pong", None)))
        elif verb in ("join", "leave") and not connection.dialed and isinstance(arg, int):
            subscribers = self._subscribers.setdefault(arg, set())
            if verb == "join":
                connection.joined.add(arg)
                subscribers.add(connection)
            else:
                connection.joined.discard(arg)
                subscribers.discard(connection)
            if (endpoint := self._groups.get(arg)) is not None:
                endpoint.links_changed()
        elif verb not in ("ping", "pong"):
            raise BadFrame(f"an unknown control frame {verb!r}")

    def _control(self, node_id: str, verb: str, arg: object) -> None:
        connection = self._links.get(node_id)
        if connection is not None:
            connection.send(hub_frames.encode((CONTROL, verb, arg)))

    def _closed(self, connection: Connection) -> None:
        self._accepted.discard(connection)
        self._holding.discard(connection)
        if self._engine_peers.get(connection.peer) is connection:  # not a newer connection's announcement
            del self._engine_peers[connection.peer]
        if connection.dialed and self._links.get(connection.peer) is connection:
            self._links[connection.peer] = None
        for group in connection.joined:
            self._subscribers.get(group, set()).discard(connection)
        if connection.dialed or connection.joined:
            connection.joined = set()
            self._changed()

    def _changed(self) -> None:
        for endpoint in list(self._groups.values()):
            endpoint.links_changed()

    def _ping(self) -> None:
        directory = self.directory()
        if directory is not self._directory_seen:
            self._directory_seen = directory
            for endpoint in list(self._groups.values()):
                endpoint.directory_changed()
        now = self.clock()
        for connection in [c for c in self._links.values() if c] + list(self._accepted):
            if now - connection.last_received > self._dead_after:
                log.info("closing the Raft connection %r: nothing heard on it for %.1fs", connection,
                         now - connection.last_received)
                connection.close()
            elif connection.dialed:
                connection.send_now(hub_frames.encode((CONTROL, "ping", None)))
        self._pinger = self.loop.call_later(self._ping_every, self._ping)

    def _refused(self, writer: asyncio.StreamWriter, why: str) -> None:
        """A peer that broke the protocol or is not allowed."""
        self._log_refusal(f"refused a Raft connection from {writer.get_extra_info('peername')}: {why}")

    def _log_refusal(self, line: str) -> None:
        """At most every few seconds: a stranger knocking, or a misconfigured node retrying, would flood the log."""
        if self._refusals.due(self.clock()):
            log.warning("%s", line)
