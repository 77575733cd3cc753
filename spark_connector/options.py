"""The connector's options, parsed and checked once. Pure.

Spark hands options over as a case-insensitive mapping; every lookup here goes
through it, so `keyFormat`, `key_format` and `KEY_FORMAT` are different names
but `key_format` and `Key_Format` are the same option.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Mapping

from raftkv.client.async_client import parse_endpoints
from raftkv.storage.engine import prefix_end
from raftkv.core.errors import ConfigError
from raftkv.core.spec import ClusterSpec
from raftkv.core.spec_toml import load_spec
from raftkv.security.tls import Tls, client_tls

FORMATS = ("binary", "string")
CONSISTENCY_LEVELS = ("linearizable", "leader", "follower", "learner")
STARTING_OFFSETS = ("earliest", "latest")


@dataclass(frozen=True)
class ConnectorOptions:
    endpoints: tuple[str, ...]             # empty only when reading a changelog
    key_format: str = "binary"
    value_format: str = "binary"
    consistency: str = "linearizable"
    learner: str | None = None             # a learner's --api-port address, for consistency=learner
    partitions: frozenset[int] | None = None
    start: bytes = b""
    end: bytes | None = None
    changelog: str | None = None           # a learner serving the changelog sink: the change feed
    starting_offsets: str | dict[int, int] = "earliest"  # earliest | latest | {partition: index} from JSON
    max_rows_per_trigger: int = 0
    write_batch_rows: int = 2000
    split_rows: int = 500_000              # a Raft partition with more keys is read as several Spark partitions
    timeout: float = 30.0
    tls: Tls | None = None                 # the cluster's CA and a client certificate (files on every executor)
    token: str | None = field(default=None, repr=False)  # a user's bearer token (Spark's default redaction hides "token")

    @property
    def read_endpoints(self) -> tuple[str, ...]:
        """Where scans go: a learner's copy for consistency=learner, else the cluster."""
        return (self.learner,) if self.consistency == "learner" else self.endpoints

    @property
    def client_consistency(self) -> str:
        return "follower" if self.consistency == "learner" else self.consistency


def parse_options(options: Mapping[str, str]) -> ConnectorOptions:
    """Raise ConfigError naming the option, and what to do, for anything wrong."""
    def get(name: str, default: str | None = None) -> str | None:
        value = options.get(name)
        return default if value is None or value == "" else str(value)

    def choice(name: str, allowed: tuple[str, ...], default: str) -> str:
        value = get(name, default).lower()
        if value not in allowed:
            raise _bad(name, f"is {value!r}; use one of {', '.join(allowed)}")
        return value

    def whole(name: str, default: int, minimum: int) -> int:
        raw = get(name, str(default))
        try:
            value = int(raw)
        except ValueError:
            raise _bad(name, f"must be a whole number, not {raw!r}") from None
        if value < minimum:
            raise _bad(name, f"must be at least {minimum}, not {value}")
        return value

    consistency = choice("consistency", CONSISTENCY_LEVELS, "linearizable")
    learner = get("learner")
    if consistency == "learner" and not learner:
        raise _bad("learner", "is needed with consistency=learner: the HOST:PORT of a learner's --api-port")
    start, end = _key_range(get("start"), get("end"), get("prefix"))
    spec = load_spec(get("config")) if get("config") else None
    starting = get("startingOffsets", "earliest")
    starting = starting.lower() if starting.lower() in STARTING_OFFSETS else offsets_from_json(starting)
    return ConnectorOptions(
        endpoints=_endpoints(get("endpoints"), spec, needed=not get("changelog")),
        key_format=choice("key_format", FORMATS, "binary"),
        value_format=choice("value_format", FORMATS, "binary"),
        consistency=consistency,
        learner=learner,
        partitions=_partitions(get("partitions")),
        start=start,
        end=end,
        changelog=get("changelog"),
        starting_offsets=starting,
        max_rows_per_trigger=whole("maxRowsPerTrigger", 0, 0),
        write_batch_rows=whole("write_batch_rows", 2000, 1),
        split_rows=whole("split_rows", 500_000, 0),
        timeout=float(whole("timeout", 30, 1)),
        tls=_tls(spec, get("tls.ca"), get("tls.cert"), get("tls.key")),
        token=get("token"),
    )


def _bad(option: str, problem: str) -> ConfigError:
    return ConfigError(f"option {option} {problem}", source="raftkv connector")


def _endpoints(endpoints: str | None, spec: ClusterSpec | None, needed: bool) -> tuple[str, ...]:
    if endpoints:
        return tuple(parse_endpoints(endpoints))
    if spec:
        return tuple(n.api_address for n in spec.nodes)
    if not needed:
        return ()
    raise _bad("endpoints", "is missing: give endpoints=HOST:PORT[,HOST:PORT...] or config=CLUSTER_SPEC.toml")


def _tls(spec: ClusterSpec | None, ca: str | None, cert: str | None, key: str | None) -> Tls | None:
    try:
        return client_tls(spec, ca, cert, key)
    except ConfigError:
        raise _bad("tls.cert", "and tls.key go together, with tls.ca (or a config whose [tls] names the CA); "
                               "a cluster with TLS needs them, or a config naming a client_cert") from None


def _partitions(raw: str | None) -> frozenset[int] | None:
    if raw is None:
        return None
    try:
        chosen = frozenset(int(p) for p in raw.split(","))
    except ValueError:
        raise _bad("partitions", f"must be comma-separated partition numbers, not {raw!r}") from None
    if any(p < 0 for p in chosen):
        raise _bad("partitions", f"must not be negative: {raw!r}")
    return chosen


def _key_range(start: str | None, end: str | None, prefix: str | None) -> tuple[bytes, bytes | None]:
    if prefix is not None:
        if start is not None or end is not None:
            raise _bad("prefix", "cannot be combined with start or end")
        return prefix.encode(), prefix_end(prefix.encode())
    return (start or "").encode(), None if end is None else end.encode()


def offsets_from_json(value: str) -> dict[int, int]:
    try:
        parsed = json.loads(value)
        return {int(p): int(i) for p, i in parsed.items()}
    except (ValueError, AttributeError, TypeError):
        raise _bad("startingOffsets", f"is {value!r}; use earliest, latest or JSON like "
                                      '{"0": 120, "1": 97} (partition: Raft index)') from None
