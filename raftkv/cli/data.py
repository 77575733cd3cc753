"""raftkv put | get | delete | scan."""

from __future__ import annotations

import json
import sys

import click

from raftkv.cli.options import UTF8, config_option, consistency_option, endpoints_option, json_option, open_client
from raftkv.cli.output import console, err_console
from raftkv.client.sync_client import Client



def _text(value: bytes) -> str:
    return value.decode("utf-8", errors="backslashreplace")


def _client(config: str, endpoints: str | None, timeout: float) -> Client:
    return open_client(config, endpoints, timeout=timeout)


timeout_option = click.option("--timeout", type=float, default=10.0, show_default=True, help="Seconds.")


@click.command()
@click.argument("key", type=UTF8)
@click.argument("value", type=UTF8)
@config_option
@endpoints_option
@timeout_option
def put(key: str, value: str, config: str, endpoints: str | None, timeout: float) -> None:
    """Set KEY to VALUE."""
    with _client(config, endpoints, timeout) as kv:
        kv.put(key, value)
    console.print("OK")


@click.command()
@click.argument("key", type=UTF8)
@config_option
@endpoints_option
@consistency_option
@timeout_option
@json_option
def get(key: str, config: str, endpoints: str | None, consistency: str, timeout: float, as_json: bool) -> None:
    """Print KEY's value; exit 1 if it is absent."""
    with _client(config, endpoints, timeout) as kv:
        read = kv.read(key, consistency=consistency)
    if as_json:
        value = None if read.value is None else _text(read.value)
        console.print_json(json.dumps({"key": key, "value": value, "applied_index": read.applied_index}))
    elif read.value is not None:
        console.print(_text(read.value), markup=False)
    if read.value is None:
        if not as_json:
            err_console.print(f"{key}: not found")
        sys.exit(1)


@click.command()
@click.argument("key", type=UTF8)
@config_option
@endpoints_option
@timeout_option
def delete(key: str, config: str, endpoints: str | None, timeout: float) -> None:
    """Delete KEY."""
    with _client(config, endpoints, timeout) as kv:
        kv.delete(key)
    console.print("OK")


@click.command()
@click.option("--prefix", type=UTF8, default=None, help="Only keys starting with this.")
@click.option("--start", type=UTF8, default="", help="First key (inclusive).")
@click.option("--end", type=UTF8, default=None, help="Last key (exclusive).")
@click.option("--limit", type=click.IntRange(0), default=100, show_default=True, help="0: no limit.")
@config_option
@endpoints_option
@consistency_option
@timeout_option
@json_option
def scan(prefix, start, end, limit, config, endpoints, consistency, timeout, as_json) -> None:
    """Print keys and values in key order."""
    with _client(config, endpoints, timeout) as kv:
        items = kv.scan(start, end, prefix=prefix, limit=limit, consistency=consistency)
        for key, value in items:
            if as_json:
                print(json.dumps({"key": _text(key), "value": _text(value)}))
            else:
                console.print(f"{_text(key)}\t{_text(value)}", markup=False)
