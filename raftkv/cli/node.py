"""raftkv node start."""

from __future__ import annotations

import asyncio
import logging

import click

from raftkv.node import process as node_process
from raftkv.cli.options import config_option
from raftkv.core.spec import load_spec



@click.group()
def node() -> None:
    """Run node processes."""


@node.command()
@config_option
@click.option("--node", "node_id", required=True, help="This node's id in the spec (e.g. n1).")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
              show_default=True)
def start(config: str, node_id: str, log_level: str) -> None:
    """Run one node until SIGTERM or Ctrl-C."""
    spec = load_spec(config)
    spec.node(node_id)
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(node_process.serve(spec, node_id))
