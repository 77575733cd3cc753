"""Options shared by several commands, defined once."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import click

from raftkv.client.sync_client import Client
from raftkv.core.errors import ConfigError
from raftkv.core.spec import DURABILITY_MODES, FSYNC, ClusterSpec
from raftkv.core.spec_toml import load_spec
from raftkv.security.tls import Tls, client_tls

DEFAULT_CONFIG = "raftkv-data/cluster.toml"
config_option = click.option(
    "--config", "-c", "config", type=click.Path(dir_okay=False), default=DEFAULT_CONFIG,
    show_default=True, help="Cluster spec (TOML) written by `raftkv cluster init` or `raftkv dev up`.",
)
endpoints_option = click.option(
    "--endpoints", "-e", default=None,
    help="Comma-separated node API addresses (host:port); default: every node in --config.",
)
consistency_option = click.option(
    "--consistency", type=click.Choice(["linearizable", "leader", "follower", "stale"]), default="linearizable",
    show_default=True, help="Read consistency level.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")


class Utf8Text(click.ParamType):
    """Text the cluster keeps as UTF-8 (keys, values, prefixes): a shell's bytes that are not UTF-8
    reach Python as surrogates, and are a usage error here rather than a traceback in the client."""

    name = "text"

    def convert(self, value: str, param: click.Parameter | None, ctx: click.Context | None) -> str:
        try:
            value.encode()
        except UnicodeEncodeError:
            self.fail(f"{value!r} is not UTF-8 text", param, ctx)
        return value


UTF8 = Utf8Text()


@contextmanager
def writing(source: str) -> Iterator[None]:
    """Files written where the user said: the OS refusing one (a name too long, no permission, a full
    disk) is one ConfigError line, not a traceback."""
    try:
        yield
    except OSError as exc:
        raise ConfigError(f"cannot write {exc.filename or 'there'}: {exc.strerror}", source=source) from None


def parse_key_values(pairs: tuple[str, ...], source: str) -> dict[str, str]:
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"expected KEY=VALUE, got {pair!r}", source=source)
        options[key] = value
    return options


def tls_files(spec: ClusterSpec | None) -> Tls | None:
    """What this CLI run presents: the root --cacert/--cert/--key (or RAFTKV_CACERT...), else the spec's."""
    root = click.get_current_context().find_root().params
    return client_tls(spec, root.get("cacert"), root.get("cert"), root.get("key"))


def open_client(config: str, endpoints: str | None, **options) -> Client:
    """A client of the cluster in --config, or at --endpoints (then the spec, if there is one, gives TLS)."""
    spec = load_spec(config) if not endpoints or Path(config).exists() else None
    addresses = [e.strip() for e in endpoints.split(",") if e.strip()] if endpoints else \
        [n.api_address for n in spec.nodes]
    return Client(addresses, tls=tls_files(spec), token=click.get_current_context().find_root().params.get("token"),
                  **options)


def topology_options(command):
    """--nodes, --partitions, --replication, --base-port, --data-dir, --durability, --tls (cluster init, dev up)."""
    options = [
        click.option("--nodes", "-n", type=click.IntRange(1, 99), default=3, show_default=True),
        click.option("--partitions", "-p", type=click.IntRange(1, 4096), default=8, show_default=True,
                     help="Fixed for the life of the cluster."),
        click.option("--replication", "-r", type=click.IntRange(1, 99), default=3, show_default=True),
        click.option("--base-port", type=click.IntRange(1024, 65000), default=7000, show_default=True,
                     help="Node k uses ports base + k*(partitions+3) onwards: API, metrics, one Raft port a partition, the metadata group's."),
        click.option("--data-dir", type=click.Path(file_okay=False), default="raftkv-data", show_default=True),
        click.option("--durability", type=click.Choice(DURABILITY_MODES), default=FSYNC, show_default=True,
                     help="fsync: acknowledged writes survive power loss; lose-last-second: faster, but a "
                          "power cut of every node may lose about the last second's writes."),
        click.option("--tls/--no-tls", default=True, show_default=True,
                     help="Mutual TLS on every listener: makes a CA and certificates in certs/ beside the spec "
                          "(docs/security.md)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command
