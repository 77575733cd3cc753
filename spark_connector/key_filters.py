"""Spark's pushed filters → the keys and partitions a read must touch. Pure.

Filters on `key` narrow the scanned range (<, <=, >, >=, StartsWith) or pick
exact keys (=, IN); filters on `partition` prune partitions. Each handled
filter is applied exactly, so Spark need not evaluate it again; anything else
goes back to Spark.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pyspark.sql.datasource import (
    EqualTo, Filter, GreaterThan, GreaterThanOrEqual, In, IsNotNull, LessThan, LessThanOrEqual,
    StringStartsWith,
)

from raftkv.storage.engine import prefix_end
from raftkv.core.partitioning import partition_for_key


@dataclass(frozen=True)
class KeyScope:
    start: bytes = b""
    end: bytes | None = None                  # exclusive; None: unbounded
    keys: frozenset[bytes] | None = None      # exact keys; None: every key in range
    partitions: frozenset[int] | None = None  # None: every partition

    def contains(self, key: bytes) -> bool:
        return self.start <= key and (self.end is None or key < self.end)

    def narrowed(self, start: bytes = b"", end: bytes | None = None) -> KeyScope:
        ends = [e for e in (self.end, end) if e is not None]
        return replace(self, start=max(self.start, start), end=min(ends) if ends else None)

    def only_keys(self, keys: frozenset[bytes]) -> KeyScope:
        return replace(self, keys=keys if self.keys is None else self.keys & keys)

    def only_partitions(self, partitions: frozenset[int]) -> KeyScope:
        return replace(self, partitions=partitions if self.partitions is None else self.partitions & partitions)

    def keys_by_partition(self, partitions: int) -> dict[int, list[bytes]]:
        """The exact keys in range, sorted, grouped by the partition that holds each."""
        grouped: dict[int, list[bytes]] = {}
        for key in sorted(k for k in self.keys or () if self.contains(k)):
            grouped.setdefault(partition_for_key(key, partitions), []).append(key)
        return grouped

    def partitions_to_read(self, partitions: int) -> list[int]:
        chosen = set(range(partitions)) if self.partitions is None else {p for p in self.partitions if p < partitions}
        if self.keys is not None:
            chosen &= set(self.keys_by_partition(partitions))
        if self.end is not None and self.end <= self.start:
            chosen = set()
        return sorted(chosen)


def push_filters(scope: KeyScope, filters: list[Filter], key_format: str) -> tuple[KeyScope, list[Filter]]:
    """The scope narrowed by every filter it can apply exactly, and the filters left for Spark."""
    rest: list[Filter] = []
    for f in filters:
        narrowed = _apply(scope, f, key_format)
        if narrowed is None:
            rest.append(f)
        else:
            scope = narrowed
    return scope, rest


def _apply(scope: KeyScope, f: Filter, key_format: str) -> KeyScope | None:
    column = f.attribute
    if column == ("partition",):
        if isinstance(f, EqualTo) and isinstance(f.value, int):
            return scope.only_partitions(frozenset({f.value}))
        if isinstance(f, In) and all(isinstance(v, int) for v in f.value):
            return scope.only_partitions(frozenset(f.value))
        return None
    if column != ("key",):
        return None
    if isinstance(f, IsNotNull):
        return scope  # keys are never null
    if isinstance(f, In):
        values = [_key_bytes(v, key_format) for v in f.value]
        return None if None in values else scope.only_keys(frozenset(values))
    if not isinstance(f, (EqualTo, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual, StringStartsWith)):
        return None
    value = _key_bytes(f.value, key_format)
    if value is None:
        return None
    if isinstance(f, EqualTo):
        return scope.only_keys(frozenset({value}))
    if isinstance(f, GreaterThan):
        return scope.narrowed(start=value + b"\x00")  # the smallest key above `value`
    if isinstance(f, GreaterThanOrEqual):
        return scope.narrowed(start=value)
    if isinstance(f, LessThan):
        return scope.narrowed(end=value)
    if isinstance(f, LessThanOrEqual):
        return scope.narrowed(end=value + b"\x00")
    if isinstance(f, StringStartsWith):
        end = prefix_end(value)
        return scope.narrowed(start=value) if end is None else scope.narrowed(start=value, end=end)
    return None


def _key_bytes(value: object, key_format: str) -> bytes | None:
    """The filter's literal as stored key bytes; None when it cannot match a key of this format."""
    if key_format == "string" and isinstance(value, str):
        return value.encode()
    if key_format == "binary" and isinstance(value, (bytes, bytearray)):
        return bytes(value)
    return None
