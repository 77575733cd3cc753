"""raftkv certs init."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from raftkv.cli.output import console
from raftkv.core.spec import load_spec
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
@click.option("--days", type=click.IntRange(1, 3650), default=825, show_default=True,
              help="Validity of the node, user and learner certificates (the CA's is ten years).")
def init(out: str, config: str | None, users: tuple[str, ...], days: int) -> None:
    """A CA, a certificate per node of the spec, per --user, and one for learner processes."""
    spec = load_spec(config) if config else None
    written = init_certs(Path(out), spec, users, days)
    table = Table(title=f"certificates in {out}")
    table.add_column("certificate (its .key beside it)")
    table.add_column("")
    for w in written:
        table.add_row(w.path.name, "created" if w.created else "kept")
    console.print(table)
