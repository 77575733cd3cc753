"""raftkv certs init."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from raftkv.cli.options import writing
from raftkv.cli.output import console
from raftkv.core.errors import ConfigError
from raftkv.core.spec_toml import load_spec
from raftkv.security.certs import init_certs


@click.group()
def certs() -> None:
    """Make a cluster's CA and certificates (docs/security.md)."""


@certs.command()
@click.option("--out", "out", required=True, type=click.Path(file_okay=False),
              help="Where the PEM files go; files already there are kept, never overwritten.")
@click.option("--config", "-c", "config", type=click.Path(dir_okay=False), default=None,
              help="Cluster spec: one node certificate per node, for its host.")
@click.option("--user", "users", multiple=True, metavar="NAME", help="A client certificate for this user; repeatable.")
@click.option("--node", "nodes", multiple=True, metavar="ID=HOST",
              help="A certificate for a node that is not in the spec (one that will join); repeatable.")
@click.option("--days", type=click.IntRange(1, 3650), default=825, show_default=True,
              help="Validity of the node, user and learner certificates (the CA's is ten years).")
def init(out: str, config: str | None, users: tuple[str, ...], nodes: tuple[str, ...], days: int) -> None:
    """A CA, a certificate per node of the spec and per --node, per --user, and one for learner processes."""
    spec = load_spec(config) if config else None
    pairs = [n.split("=", 1) for n in nodes]
    if any(len(p) != 2 or not p[1] for p in pairs):
        raise ConfigError("expected ID=HOST, e.g. n4=10.0.0.4", source="--node")
    with writing(source="--out"):
        written = init_certs(Path(out), spec, users, days, [(node_id, host) for node_id, host in pairs])
    table = Table(title=f"certificates in {out}")
    table.add_column("certificate (its .key beside it)")
    table.add_column("")
    for w in written:
        table.add_row(w.path.name, "created" if w.created else "kept")
    console.print(table)
