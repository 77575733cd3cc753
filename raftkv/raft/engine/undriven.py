"""A group's part in the node engine: a `SteadyGroup`, or on a node without the engine (`raft_engine =
"off"`, learners, in-process tests) `UNDRIVEN`, which leaves the group to pysyncobj, always: so
`SyncObjGroup`'s hooks need no `None` checks."""

from __future__ import annotations

from raftkv.raft.engine.steady import PYSYNCOBJ, Engine, SteadyGroup


def steady_part(group, engine: Engine | None) -> SteadyGroup | _Undriven:
    """`group`'s part: `SyncObjGroup.steady`."""
    return UNDRIVEN if engine is None else SteadyGroup(group, engine)


class _Undriven:
    leading = False
    mode = PYSYNCOBJ

    def before_tick(self, now: float) -> bool:
        return False

    def heard(self, node, message: object) -> bool:
        return False

    def asked(self, what: str) -> None:
        pass

    def links_changed(self) -> None:
        pass

    def close(self) -> None:
        pass


UNDRIVEN = _Undriven()
