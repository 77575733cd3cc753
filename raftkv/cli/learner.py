"""raftkv learner start."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import click

from learners import learner_process
from raftkv.cli.options import config_option
from raftkv.errors import ConfigError
from raftkv.spec import load_spec


def register(cli: click.Group) -> None:
    cli.add_command(learner)


@click.group()
def learner() -> None:
    """Non-voting replicas that feed a sink (Kafka change feed, backup, plugins)."""


def parse_sink_options(pairs: tuple[str, ...]) -> dict[str, str]:
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"expected KEY=VALUE, got {pair!r}", source="--sink-option")
        options[key] = value
    return options


def parse_partitions(text: str, count: int) -> list[int]:
    if text == "all":
        return list(range(count))
    try:
        chosen = sorted({int(p) for p in text.split(",")})
    except ValueError:
        raise ConfigError(f"expected 'all' or comma-separated numbers, got {text!r}", source="--partitions") from None
    if not chosen or chosen[0] < 0 or chosen[-1] >= count:
        raise ConfigError(f"partitions must be within 0..{count - 1}", source="--partitions")
    return chosen


@learner.command()
@click.option("--name", required=True, help="The learner's name (its data folder and sink identity).")
@config_option
@click.option("--sink", "sink_name", required=True, help="A sink registered under raftkv.sinks (kafka, backup, ...).")
@click.option("--sink-option", "sink_options", multiple=True, metavar="KEY=VALUE", help="Passed to the sink.")
@click.option("--partitions", default="all", show_default=True, help="'all' or e.g. 0,3,5.")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Default: learners/<name> next to the cluster spec.")
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=None, help="Serve Prometheus metrics here.")
def start(name, config, sink_name, sink_options, partitions, data_dir, metrics_port) -> None:
    """Run a learner until SIGTERM or Ctrl-C."""
    spec = load_spec(config)
    folder = Path(data_dir) if data_dir else learner_process.learner_folder(spec, name)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(learner_process.serve(spec, name, sink_name, parse_sink_options(sink_options),
                                      parse_partitions(partitions, spec.partitions), folder, metrics_port))
