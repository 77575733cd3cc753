"""pysyncobj's transport interface over the node's Raft hub (`hub.py`).

A group's members are pysyncobj nodes named by Raft address; the hub's `Directory` says which
node and group an address is. What pysyncobj sees:

- a member is connected while the hub's connection to its node is up (looked at in the next tick
  after the hub says that something changed, or the members did);
- a read-only member (a learner) is one per hub connection that joined this group, and all it may
  send is its answer to an append (`next_node_idx`): a vote request or an append from it would
  otherwise be obeyed as if a member had sent it;
- this group, when read-only itself, joins its voters' groups through the hub;
- pysyncobj's admin commands never arrive: the hub does not carry them;
- quiescence's own messages (`quiescence`) go to the group's `Quiet`, never to pysyncobj, and
  every other message and link change is shown to it first: they may wake a resting group.

And, as before the hub:
- every append-entries message sent is counted (entry and snapshot bytes);
- in fsync mode an entry is durable before a follower acknowledges it or a leader counts itself: a
  group's own dirty journal is synced before any message leaves (one fsync per group commit); on
  the node log, the hub's flush of the turn writes and syncs every group's records first (`log_turn`);
- the members the cluster metadata names for the group (`name_members`) stay linked whatever
  pysyncobj drops: it takes its members from a snapshot, which may predate a member that joined
  since, and replays the membership entries of a journal, which may remove a member that a later
  entry, one this replica has not received yet, added back. Without the link it would never hear
  from that member, even when it leads (docs/pysyncobj.md).
"""

from __future__ import annotations

import logging
import time

from pysyncobj.node import Node, TCPNode
from pysyncobj.transport import Transport

from raftkv.core.clock import Throttle
from raftkv.raft.hub import Connection, RaftHub

log = logging.getLogger(__name__)

STRANGER_LOG_SECONDS = 30.0
# Dropped from a non-member, these are logged: a leader or a candidate this replica does not know.
# A departing member's answers and wakes are routine.
_LOGGED_WHEN_DROPPED = ("append_entries", "request_vote")


class GroupTransport(Transport):
    def __init__(self, syncObj, selfNode, otherNodes):
        super().__init__(syncObj, selfNode, otherNodes)
        self._syncObj = syncObj
        config = syncObj._group.config
        self._hub: RaftHub = config.hub
        self._group = config.partition
        self._poller = syncObj._group.poller
        self._read_only = selfNode is None
        self._named = frozenset(node.address for node in otherNodes)  # the metadata's members, this one aside
        self._nodes: dict[str, Node] = {}  # address -> the member's pysyncobj node
        self._connected: set[Node] = set()
        self._subscribers: dict[Connection, Node] = {}  # read-only members, by the connection they joined on
        self._joined_over: dict[Node, Connection] = {}  # ... and the other way round
        self._subscriber_count = 0
        self._destroyed = False
        self._strangers = Throttle(STRANGER_LOG_SECONDS)  # a removed member campaigns until its node closes it
        self._ticked = False  # pysyncobj loads its snapshot in its first tick: nothing is heard or joined before
        self._links_moved = True  # the hub's links, its directory or the members changed since the last look
        for node in otherNodes:
            self.addNode(node)
        syncObj.addOnTickCallback(self._follow_links)
        self._hub.attach(self._group, self)

    def name_members(self, addresses: frozenset[str]) -> None:
        """The group's members as the cluster metadata has them now (this one's own address aside):
        each stays linked whatever pysyncobj drops; one no longer named goes unless pysyncobj counts it."""
        if addresses == self._named:
            return
        gone, self._named = self._named - addresses, addresses
        members = {node.address for node in self._syncObj._SyncObj__otherNodes}
        for address in gone - members:
            if address in self._nodes:
                self._unlink(self._nodes[address])
        for address in addresses - self._nodes.keys():
            self.addNode(TCPNode(address))

    # -- pysyncobj's Transport ------------------------------------------------

    def addNode(self, node):
        self._nodes[node.address] = node
        self._links_moved = True
        self._joined_changed()

    def dropNode(self, node):
        if node.address not in self._named:
            self._unlink(node)

    def send(self, node, message):
        self._syncObj.sync_journal()
        sent = self.notify(node, message)
        if sent and isinstance(message, dict) and message.get("type") == "append_entries":
            self._syncObj.on_sent(message)
        return sent

    def destroy(self):
        self._destroyed = True
        self._hub.detach(self._group)
        self._syncObj.removeOnTickCallback(self._follow_links)

    # -- what quiescence calls ------------------------------------------------

    def notify(self, node, message) -> bool:
        """Send `message`, which acknowledges nothing, so no journal needs to be synced first."""
        connection = self._joined_over.get(node)
        if connection is not None:
            return self._hub.reply(connection, self._group, message)
        where = self._hub.directory().locate(node.address)
        return where is not None and self._hub.send(where[0], self._group, message)

    def reaches(self, address: str) -> bool:
        """Whether the hub's connection to the node of member `address` is up (it dials it if not)."""
        where = self._hub.directory().locate(address)
        return where is not None and self._hub.is_up(where[0])

    # -- what the hub calls ---------------------------------------------------

    def deliver(self, sender: str | None, connection: Connection, message: object) -> None:
        if not self._ticked:  # an append judged against the log before its snapshot is loaded gets one sent
            self._poller.on_event()  # the leader sends it again; that first tick must not wait for a timer
            return
        address = self._hub.directory().address(sender, self._group) if sender is not None else None
        node = self._nodes.get(address) if address is not None else None
        # A member first: a node whose read-only replica was just added to the group answers the leader's
        # appends to the member over the connection its read-only replica joined on.
        if node is None and self._group in connection.joined:  # a read-only member of this group
            if not _read_only_answer(message):
                return
            self._follow_links()
            node = self._subscribers.get(connection)
        if node is not None:
            self._poller.run(self._received, node, message)
        elif (kind := message.get("type") if isinstance(message, dict) else None) in _LOGGED_WHEN_DROPPED \
                and self._strangers.due(time.monotonic()):
            log.info("Raft group %d: dropped a %r from %s: not a member here (members: %s)", self._group, kind,
                     sender or "a learner", ", ".join(sorted(self._nodes)) or "none")

    def _received(self, node: Node, message: object) -> None:
        group = self._syncObj._group
        if not group.votes.admits(node, message) or group.steady.heard(node, message):
            return  # a vote request dropped wakes nothing and hands nothing back
        if not group.quiet.heard(node, message):
            self._onMessageReceived(node, message)

    def directory_changed(self) -> None:
        self._links_moved = True
        self._joined_changed()

    def links_changed(self) -> None:
        self._links_moved = True
        if self._ticked:  # nothing rests before
            group = self._syncObj._group
            group.quiet.links_changed()
            group.steady.links_changed()
        self._poller.on_event()  # a tick soon, which follows them (`_follow_links`)

    # -- keeping pysyncobj's view in step with the hub's ----------------------

    def _follow_links(self) -> None:
        """After every tick (the first one loads the snapshot) that follows a change, and when a
        read-only member answers over a connection not seen yet."""
        if self._destroyed or not self._ticked and not self._first_tick_done() or not self._links_moved:
            return
        self._links_moved = False
        self._joined_changed()  # a member on a node the directory did not know yet
        for node in list(self._nodes.values()):
            up = self.reaches(node.address)
            if up and node not in self._connected:
                self._connected.add(node)
                self._onNodeConnected(node)
            elif not up and node in self._connected:
                self._connected.discard(node)
                self._onNodeDisconnected(node)
        self._syncObj.hasten_first_election(reachable_voters=1 + len(self._connected))
        joined = self._hub.subscribers(self._group)
        for connection in [c for c in self._subscribers if c not in joined]:
            node = self._subscribers.pop(connection)
            del self._joined_over[node]
            self._onReadonlyNodeDisconnected(node)
        for connection in joined - self._subscribers.keys():
            self._subscriber_count += 1
            node = self._subscribers[connection] = Node(f"learner-{self._subscriber_count}")
            self._joined_over[node] = connection
            self._onReadonlyNodeConnected(node)

    def _unlink(self, node: Node) -> None:
        if self._nodes.pop(node.address, None) is not None and node in self._connected:
            self._connected.discard(node)
            self._onNodeDisconnected(node)
        self._links_moved = True
        self._joined_changed()

    def _first_tick_done(self) -> bool:
        self._ticked = not self._syncObj._SyncObj__needLoadDumpFile
        return self._ticked

    def _joined_changed(self) -> None:
        """A read-only group joins the group at every member's node (once it has ticked)."""
        if self._read_only and self._ticked:
            directory = self._hub.directory()
            nodes = (directory.locate(address) for address in self._nodes)
            self._hub.join(self._group, frozenset(where[0] for where in nodes if where is not None))


def _read_only_answer(message: object) -> bool:
    """Whether `message` is what a read-only member sends: its answer to an append, well formed."""
    return (isinstance(message, dict) and message.get("type") == "next_node_idx"
            and type(message.get("next_node_idx")) is int
            and type(message.get("reset")) is bool and type(message.get("success")) is bool)
