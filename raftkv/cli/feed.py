"""raftkv feed tail: print the change feed as it arrives, from Kafka or from a changelog learner."""

from __future__ import annotations

from pathlib import Path

import click

from learners.changelog_client import tail as tail_changelog
from learners.consumer import tail as tail_feed
from raftkv.cli.options import config_option, parse_key_values, tls_files
from raftkv.core.spec import load_spec



@click.group()
def feed() -> None:
    """Read the change feed."""


@feed.command()
@click.option("--topic", help="The topic a kafka learner writes to.")
@click.option("--bootstrap", default="127.0.0.1:9092", show_default=True, help="Kafka bootstrap servers.")
@click.option("--changelog", metavar="HOST:PORT",
              help="Instead of Kafka: the --api-port of a learner running --sink changelog.")
@click.option("--from-beginning", is_flag=True, help="Start at the oldest event instead of new ones.")
@click.option("--max-events", type=click.IntRange(1), default=None, help="Stop after this many events.")
@click.option("--timeout", type=float, default=None, help="Stop after this many seconds without an event.")
@click.option("--kafka-option", "kafka_options", multiple=True, metavar="KEY=VALUE",
              help="Passed to the Kafka consumer, e.g. security.protocol=SASL_SSL; repeatable.")
@config_option
def tail(topic, bootstrap, changelog, from_beginning, max_events, timeout, kafka_options, config) -> None:
    """Print events as JSON lines (Kafka: read_committed, deduplicated by partition/index/seq).

    A changelog learner of a cluster with TLS is reached with the spec's client certificate (--config),
    or the one given as `raftkv --cert ... --key ... feed tail`."""
    if (topic is None) == (changelog is None):
        raise click.UsageError("name one feed: --topic (Kafka) or --changelog HOST:PORT (a changelog learner)")
    if changelog:
        tls = tls_files(load_spec(config) if Path(config).exists() else None)
        tail_changelog(changelog, from_beginning=from_beginning, max_events=max_events, timeout=timeout, tls=tls,
                       token=click.get_current_context().find_root().params.get("token"))
    else:
        tail_feed(bootstrap, topic, from_beginning=from_beginning, max_events=max_events, timeout=timeout,
                  config=parse_key_values(kafka_options, "--kafka-option"))
