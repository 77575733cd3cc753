"""raftkv feed tail: print the Kafka change feed as it arrives."""

from __future__ import annotations

import click

from learners.consumer import tail as tail_feed


def register(cli: click.Group) -> None:
    cli.add_command(feed)


@click.group()
def feed() -> None:
    """Read the change feed."""


@feed.command()
@click.option("--topic", required=True, help="The topic a kafka learner writes to.")
@click.option("--bootstrap", default="127.0.0.1:9092", show_default=True, help="Kafka bootstrap servers.")
@click.option("--from-beginning", is_flag=True, help="Start at the oldest event instead of new ones.")
@click.option("--max-events", type=click.IntRange(1), default=None, help="Stop after this many events.")
@click.option("--timeout", type=float, default=None, help="Stop after this many seconds without an event.")
def tail(topic, bootstrap, from_beginning, max_events, timeout) -> None:
    """Print events as JSON lines (read_committed, deduplicated by partition/index/seq)."""
    tail_feed(bootstrap, topic, from_beginning=from_beginning, max_events=max_events, timeout=timeout)
