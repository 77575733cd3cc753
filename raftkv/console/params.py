"""The console's pages and the query parameters each takes, checked before anything is gathered. Pure.

A bad parameter is `BadParameter`, one line the page shows (HTTP 400)."""

from __future__ import annotations

from typing import Mapping, Sequence

from raftkv.console.ring import HOUR

# page -> the parameters it takes
PAGES: dict[str, tuple[str, ...]] = {
    "overview": (),
    "placement": (),
    "partition": ("p",),
    "learners": (),
    "moves": (),
    "series": ("window", "since"),
    "events": ("limit", "kind"),
}
EVENT_KINDS = ("leader", "node", "move", "learner", "storage")


class BadParameter(ValueError):
    pass


def parse(page: str, query: Mapping[str, Sequence[str]], partitions: int) -> dict:
    """The page's parameters as values, with their defaults; BadParameter names the first wrong one."""
    takes = PAGES[page]
    for name in query:
        if name not in takes:
            allowed = ", ".join(takes) or "none"
            raise BadParameter(f"unknown parameter {name!r} for the {page} page (it takes: {allowed})")
    for name, values in query.items():
        if len(values) != 1:
            raise BadParameter(f"parameter {name!r} given {len(values)} times; give it once")
    value = {name: values[0] for name, values in query.items()}
    out: dict = {}
    if page == "partition":
        if "p" not in value:
            raise BadParameter("which partition? add ?p=N")
        out["p"] = _integer("p", value["p"], 0, partitions - 1, f"a partition number, 0 to {partitions - 1}")
    if page == "series":
        out["window"] = _integer("window", value.get("window", str(HOUR)), 10, HOUR, f"seconds, 10 to {HOUR}")
        out["since"] = _time("since", value.get("since", "0"))
    if page == "events":
        out["limit"] = _integer("limit", value.get("limit", "200"), 1, 500, "a count, 1 to 500")
        kind = value.get("kind", "")
        if kind and kind not in EVENT_KINDS:
            raise BadParameter(f"kind {kind!r} is none of {', '.join(EVENT_KINDS)}")
        out["kind"] = kind
    return out


def _integer(name: str, text: str, low: int, high: int, what: str) -> int:
    try:
        number = int(text)
    except ValueError:
        raise BadParameter(f"{name}={text!r} is not a number: expected {what}") from None
    if not low <= number <= high:
        raise BadParameter(f"{name}={number} is out of range: expected {what}")
    return number


def _time(name: str, text: str) -> float:
    """Unix seconds (the `at` of the last row a page has: live updates ask only for what came after)."""
    try:
        at = float(text)
    except ValueError:
        at = -1.0
    if not 0 <= at < float("inf"):
        raise BadParameter(f"{name}={text!r} is not a time: expected unix seconds")
    return at
