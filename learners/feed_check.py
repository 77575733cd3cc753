"""Checks of a change feed read back from Kafka (tests, chaos runs). Pure.

    events = read_feed(bootstrap, topic)        # learners.consumer: deduplicated, in arrival order
    replay(events) == final contents            # the feed rebuilds the store
    chain_breaks(events) == []                  # and misses nothing, in order, per key

Per key, each event's before-image must be the previous event's after-image,
and its (partition, index, seq) must come after the previous one: a missing,
repeated or reordered event breaks the chain, so this checks completeness
and order, not just the final state.
"""

from __future__ import annotations

from typing import Iterable

from learners.change_event import ChangeEvent


def replay(events: Iterable[ChangeEvent]) -> dict[bytes, bytes]:
    """The table the events build: c/u/r set the key, d deletes it."""
    table: dict[bytes, bytes] = {}
    for event in events:
        if event.op == "d":
            table.pop(event.key, None)
        else:
            table[event.key] = event.after
    return table


def chain_breaks(events: Iterable[ChangeEvent]) -> list[str]:
    """One line per event that does not follow the previous event of its key (in arrival order)."""
    last: dict[bytes, ChangeEvent] = {}
    breaks = []
    for event in events:
        previous = last.get(event.key)
        if previous is not None and event.event_id <= previous.event_id:
            breaks.append(f"{event.key!r}: event {event.event_id} arrived after {previous.event_id}")
        elif event.before != (previous.after if previous else None):
            breaks.append(f"{event.key!r}: event {event.event_id} does not follow "
                          f"{previous.event_id if previous else 'the start of the feed'} (an event is missing)")
        last[event.key] = event
    return breaks
