"""raftkv certs init, list and renew."""

from __future__ import annotations

import datetime
from pathlib import Path

import click
from rich.table import Table

from raftkv.cli.options import writing
from raftkv.cli.output import console
from raftkv.core.errors import ConfigError
from raftkv.core.spec_toml import load_spec
from raftkv.security.certs import Held, init_certs, list_certs, renew_certs


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


_FOLDER = click.option("--out", "out", required=True, type=click.Path(file_okay=False, exists=True),
                       help="The folder `certs init` wrote (its ca.pem, and ca.key to renew).")


@certs.command("list")
@_FOLDER
def list_command(out: str) -> None:
    """The certificates the folder's CA issued, and when each expires."""
    _print(out, list_certs(Path(out)), renewing=False)


@certs.command()
@_FOLDER
@click.option("--days", type=click.IntRange(1, 3650), default=825, show_default=True,
              help="Validity of the renewed certificates.")
@click.option("--within", "within_days", type=click.FloatRange(min=0), default=90, show_default=True,
              help="Renew those that expire within this many days (0: the expired only; a large number: all).")
def renew(out: str, days: int, within_days: float) -> None:
    """Issue again, for the keys they have, the certificates that expire soon (the CA's key needed). Nodes and
    learners take up a renewed file within a second, no restart; long-running clients at their restart
    (docs/operations.md)."""
    with writing(source="--out"):
        held = renew_certs(Path(out), days, within_days)
    _print(out, held, renewing=True)


def _print(out: str, held: list[Held], renewing: bool) -> None:
    now = datetime.datetime.now(datetime.timezone.utc)
    table = Table(title=f"certificates in {out}")
    for column in ("certificate", "role", "name", "expires", "days left") + (("",) if renewing else ()):
        table.add_column(column)
    for h in held:
        left = h.days_left(now)
        row = [h.path.name, h.identity.role, h.identity.name, f"{h.expires:%Y-%m-%d %H:%M} UTC",
               f"{left:.0f}" if left >= 0 else "[red]expired[/red]"]
        table.add_row(*row, *(("renewed" if h.renewed else "kept",) if renewing else ()))
    console.print(table)
