"""This node's member of the metadata group: a voter on the spec's first five nodes, a learner on the rest."""

from __future__ import annotations

import asyncio
from typing import Callable

from raftkv.core.errors import Undetermined, Unavailable
from raftkv.meta.records import META, ClusterMeta, MetaCommand, encode_command
from raftkv.meta.state_machine import MetaStateMachine
from raftkv.node.replica import Replica
from raftkv.raft.group import Outcome, RaftGroup, Role, StateMachine
from raftkv.storage.engine import ReplicaEngine


class MetaReplica(Replica):
    state_machine: MetaStateMachine

    def __init__(self, engine: ReplicaEngine, open_group: Callable[[StateMachine], RaftGroup],
                 on_change: Callable[[ClusterMeta], None], voting: bool):
        self.voting = voting  # a voter of the metadata group, or a learner following it
        super().__init__(META, engine, open_group, lambda engine: MetaStateMachine(engine, on_change))

    @property
    def meta(self) -> ClusterMeta:
        return self.state_machine.meta

    @property
    def is_leader(self) -> bool:
        return self.role == Role.LEADER

    def barrier(self) -> asyncio.Future[ClusterMeta]:
        """Commits an empty entry: everything appended before it is committed once it resolves."""
        return self._propose(b"")

    def propose(self, command: MetaCommand) -> asyncio.Future[ClusterMeta]:
        """The state after `command`; ChangeRefused if a rule refused it."""
        return self._propose(encode_command(command))

    def _propose(self, payload: bytes, timeout: float = 10.0) -> asyncio.Future[ClusterMeta]:
        """Resolves within `timeout` even if the group was closed meanwhile (reopened in another mode)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        loop.call_later(timeout, lambda: future.done() or future.set_exception(
            Undetermined(f"a metadata change was not committed within {timeout:.0f}s")))

        def done(result, outcome: Outcome) -> None:
            if future.done():
                return
            if outcome == Outcome.APPLIED:
                if isinstance(result, Exception):
                    future.set_exception(result)
                else:
                    future.set_result(result)
            elif outcome == Outcome.REJECTED:
                future.set_exception(Unavailable("this node does not lead the metadata group any more; retry"))
            else:
                future.set_exception(Undetermined("the metadata leader changed while a change was in flight"))

        self.group.propose(payload, done)
        return future
