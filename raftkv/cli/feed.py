"""raftkv feed tail: print the change feed as it arrives, from Kafka or from a changelog learner."""

from __future__ import annotations

import re
from pathlib import Path

import click

from learners.changelog_client import tail as tail_changelog
from learners.consumer import tail as tail_feed
from raftkv.cli.options import config_option, open_client, parse_key_values, tls_files
from raftkv.core.errors import ConfigError
from raftkv.core.spec_toml import load_spec

_HOST_PORT = re.compile(r"^[A-Za-z0-9._\[\]:-]+:(\d{1,5})$")


def check_bootstrap(text: str) -> str:
    """HOST:PORT[,HOST:PORT...], or a ConfigError naming the bad entry. Pure."""
    for entry in text.split(","):
        match = _HOST_PORT.match(entry.strip())
        if not match or not 1 <= int(match.group(1)) <= 65535:
            raise ConfigError(f"{entry.strip()!r} is not HOST:PORT", source="--bootstrap")
    return text


def kafka_feed(learners, topic: str | None) -> tuple[str, str]:
    """(bootstrap, topic) of the one kafka learner registered (writing to `topic`, if given). Pure."""
    registered = sorted({(v.options.get("bootstrap.servers", ""), v.options.get("topic", ""))
                         for v in learners.values() if v.sink == "kafka"})
    feeds = [(b, t) for b, t in registered if topic in (None, t)]
    if len(feeds) != 1:
        found = ", ".join(f"{t} on {b}" for b, t in registered) or "none"
        raise ConfigError(f"name the feed with --bootstrap HOST:PORT --topic TOPIC (kafka learners registered: "
                          f"{found})", source="feed tail")
    return feeds[0]



@click.group()
def feed() -> None:
    """Read the change feed."""


@feed.command()
@click.option("--topic", help="The topic a kafka learner writes to (default: the one kafka learner's).")
@click.option("--bootstrap", default=None,
              help="Kafka bootstrap servers (default: those of the one kafka learner of the cluster in --config, "
                   "e.g. `raftkv dev up`'s).")
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

    Without --bootstrap, the feed of the one kafka learner registered in the cluster of --config is read.
    A changelog learner of a cluster with TLS is reached with the spec's client certificate (--config),
    or the one given as `raftkv --cert ... --key ... feed tail`."""
    if changelog and (topic or bootstrap):
        raise click.UsageError("name one feed: --topic/--bootstrap (Kafka) or --changelog HOST:PORT")
    if changelog:
        tls = tls_files(load_spec(config) if Path(config).exists() else None)
        tail_changelog(changelog, from_beginning=from_beginning, max_events=max_events, timeout=timeout, tls=tls,
                       token=click.get_current_context().find_root().params.get("token"))
    else:
        if bootstrap is None:
            if not Path(config).exists():
                raise click.UsageError(f"name one feed: --bootstrap HOST:PORT --topic TOPIC (Kafka) or --changelog "
                                       f"HOST:PORT; without them the kafka learner of the cluster in --config is read, "
                                       f"and there is no {config}")
            with open_client(config, None) as kv:
                bootstrap, topic = kafka_feed(kv.learners(), topic)
        elif topic is None:
            raise click.UsageError("--bootstrap needs --topic")
        tail_feed(check_bootstrap(bootstrap), topic, from_beginning=from_beginning, max_events=max_events,
                  timeout=timeout, config=parse_key_values(kafka_options, "--kafka-option"))
