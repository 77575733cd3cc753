"""raftkv learner add | list | start | remove."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import click

from learners import learner_process, learner_status
from raftkv import failpoints
from raftkv.cli.options import config_option, endpoints_option, json_option, open_client, parse_key_values
from learners.sinks.base import CheckedSink, available_sinks, load_sink
from learners.sinks.options import limits
from raftkv.cli import output
from raftkv.core import event_loop
from raftkv.core.errors import ConfigError, Unavailable
from raftkv.core.spec_toml import load_spec



@click.group()
def learner() -> None:
    """Non-voting replicas that feed a sink (Kafka change feed, backup, plugins)."""


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


sink_option = click.option("--sink-option", "sink_options", multiple=True, metavar="KEY=VALUE",
                           help="Passed to the sink (repeatable).")


@learner.command()
@click.option("--name", required=True, help="The learner's name.")
@click.option("--sink", "sink_name", required=True, help="A sink registered under raftkv.sinks (kafka, backup, ...).")
@sink_option
@click.option("--partitions", default="all", show_default=True, help="'all' or e.g. 0,3,5.")
@config_option
@endpoints_option
def add(name, sink_name, sink_options, partitions, config, endpoints) -> None:
    """Register a learner through the Raft log of each chosen partition."""
    options = parse_key_values(sink_options, "--sink-option")
    spec = load_spec(config) if Path(config).exists() else None
    _check_sink(name, sink_name, options, spec)
    with open_client(config, endpoints) as kv:
        chosen = parse_partitions(partitions, kv.partitions)
        kv.register_learner(name, sink_name, options, chosen)
    output.console.print(f"registered learner {name} ({sink_name}) on partitions {chosen}; run it with:\n"
                  f"  raftkv learner start --name {name} --config {config}")


def _check_sink(name: str, sink_name: str, options: dict[str, str], spec) -> None:
    """Refuse what the sink, if installed here, says cannot work; a backend that does not answer is only noted
    (the learner checks again when it starts)."""
    if sink_name not in available_sinks():
        return
    sink = load_sink(sink_name)
    if not isinstance(sink, CheckedSink):
        return
    cluster = limits(spec.name, spec.max_key_bytes, spec.max_value_bytes) if spec else {}
    try:
        sink.check({"learner": name, **options, **cluster})
    except Unavailable as exc:
        output.err_console.print(f"note: {exc}; the learner checks again when it starts")


@learner.command(name="list")
@config_option
@endpoints_option
@json_option
def list_(config, endpoints, as_json) -> None:
    """Registered learners, their sinks and how far each partition's feed has got.

    A partition a learner feeds no events from shows why, when the learner runs here (its folder is next
    to the spec in --config): stopped (its sink refused an event; tried again later) or resyncing (its log
    contradicted the learner's copy)."""
    with open_client(config, endpoints) as kv:
        learners = kv.learners()
    spec = load_spec(config) if Path(config).exists() else None
    troubles = {name: learner_status.read(learner_process.learner_folder(spec, name)) if spec else {}
                for name in learners}
    if as_json:
        output.console.print_json(json.dumps({
            name: {"sink": v.sink, "options": v.options,
                   "partitions": {p: {"delivered": v.progress[p], "lag": v.lag(p),
                                      **(dict([troubles[name][p]]) if p in troubles[name] else {})}
                                  for p in sorted(v.progress)}}
            for name, v in learners.items()}))
        return
    from rich.table import Table  # not at the top: `learner start` prints no table

    table = Table(title="raftkv learners")
    for column in ("learner", "sink", "partition", "delivered", "lag (entries)", "not flowing"):
        table.add_column(column)
    for name, v in learners.items():
        for p in sorted(v.progress):
            trouble = troubles[name].get(p)
            table.add_row(name, v.sink, str(p), str(v.progress[p]), str(v.lag(p)),
                          f"{trouble[0]}: {trouble[1]}" if trouble else "")
    output.console.print(table)


@learner.command()
@click.option("--name", required=True)
@click.option("--partitions", default="all", show_default=True)
@config_option
@endpoints_option
def remove(name, partitions, config, endpoints) -> None:
    """Unregister a learner; voters stop retaining the log for it."""
    with open_client(config, endpoints) as kv:
        kv.remove_learner(name, parse_partitions(partitions, kv.partitions))
    output.console.print(f"removed learner {name}")


@learner.command()
@click.option("--name", required=True, help="A learner registered with `raftkv learner add`.")
@config_option
@sink_option
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Default: learners/<name> next to the cluster spec.")
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=None, help="Serve Prometheus metrics here.")
@click.option("--api-port", type=click.IntRange(1, 65535), default=None,
              help="Serve follower/stale reads and scans from the learner's copy on HOST:PORT.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="The address --api-port and --metrics-port listen on: this host's, for clients on others.")
def start(name, config, sink_options, data_dir, metrics_port, api_port, host) -> None:
    """Run a registered learner until SIGTERM or Ctrl-C (--sink-option overrides registered options)."""
    spec = load_spec(config)
    overrides = parse_key_values(sink_options, "--sink-option")
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    failpoints.arm_from_environment()
    event_loop.run(learner_process.serve(spec, name, Path(data_dir) if data_dir else None, overrides, metrics_port,
                                      api_port, host))
