"""Which console pages a caller may read: the verbs they stand for, decided by the node's
gatekeeper (`security.permissions.check`) like every other request (docs/console.md §4). Pure.

What `raftkv status` shows any identity (nodes, partitions, leaders, rates, events) needs the
`status` verb; the learners page (sinks and their options) and the moves page (the planner's plan)
need the admin verbs their commands do."""

from __future__ import annotations

from typing import Callable

from raftkv.console.params import PAGES
from raftkv.security.permissions import Request

VERBS: dict[str, Request] = {
    "overview": Request.admin("status"),
    "placement": Request.admin("status"),
    "partition": Request.admin("status"),
    "series": Request.admin("status"),
    "events": Request.admin("status"),
    "learners": Request.admin("learners"),
    "moves": Request.admin("rebalance"),
}
assert VERBS.keys() == PAGES.keys()


def readable(refusal: Callable[[Request], str | None]) -> list[str]:
    """The pages whose verbs `refusal` (a caller's check) allows."""
    return [page for page in PAGES if refusal(VERBS[page]) is None]
