"""raftkv cluster init."""

from __future__ import annotations

from pathlib import Path

import click

from raftkv.cli.output import console
from raftkv.core.errors import ConfigError
from raftkv.cli.options import topology_options, writing
from raftkv.core.spec import build_spec
from raftkv.core.spec_toml import save_spec
from raftkv.security.certs import CERTS_DIR, with_certificates



@click.group()
def cluster() -> None:
    """Create cluster specs."""


@cluster.command()
@topology_options
@click.option("--hosts", default=None, help="Comma-separated host of each node (default: all 127.0.0.1).")
@click.option("--name", default="raftkv", show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False), default="cluster.toml", show_default=True)
@click.option("--force", is_flag=True, help="Overwrite an existing spec.")
def init(nodes, partitions, replication, base_port, data_dir, hosts, name, durability, tls, output, force) -> None:
    """Write a cluster spec (TOML)."""
    out = Path(output)
    with writing(source="cluster init"):
        if out.exists() and not force:
            raise ConfigError(f"{out} exists; pass --force to overwrite it", source="cluster init")
        spec = build_spec(
            nodes=nodes, partitions=partitions, replication=replication, base_port=base_port, data_dir=data_dir,
            hosts=[h.strip() for h in hosts.split(",")] if hosts else None, name=name, durability=durability,
        )
        if tls:
            spec = with_certificates(spec, out.parent.resolve())
        save_spec(spec, out)
    console.print(f"wrote {out}: {nodes} nodes, {partitions} partitions, replication {replication}")
    if tls:
        console.print(f"mutual TLS: certificates in {out.parent / CERTS_DIR}; the CLI presents the admin user's "
                      f"(the spec's [tls] client_cert). Keep ca.key offline.")
    console.print(f"start each node with: raftkv node start --config {out} --node <id>  ({', '.join(spec.node_ids)})")
