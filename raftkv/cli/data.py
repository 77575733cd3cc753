"""raftkv put | get | delete | scan.

Values are bytes: `put` takes one from the command line, stdin (`-`) or a file, and `get` and `scan`
print them unchanged into a pipe or a file. `--json` encodes keys and values in base64, or as text with
`--text` where they are UTF-8, and says which in each object's "encoding".
"""

from __future__ import annotations

import base64
import json
import os
import sys

import click

from raftkv.cli.options import UTF8, config_option, consistency_option, endpoints_option, json_option, open_client
from raftkv.cli.output import console, err_console, print_bytes
from raftkv.client.sync_client import Client
from raftkv.core.errors import ConfigError

MAX_VALUE_READ = 64 * 1024 * 1024  # gRPC's message limit on the nodes: no value can be larger


def _client(config: str, endpoints: str | None, timeout: float) -> Client:
    return open_client(config, endpoints, timeout=timeout)


def _json_item(key: bytes, value: bytes | None, text: bool) -> dict:
    """Key and value as text where asked and both are UTF-8, else in base64; "encoding" says which."""
    if text:
        try:
            return {"key": key.decode(), "value": None if value is None else value.decode(), "encoding": "utf-8"}
        except UnicodeDecodeError:
            pass
    return {"key": _base64(key), "value": None if value is None else _base64(value), "encoding": "base64"}


def _base64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _read_value(value: str | None, value_file: str | None) -> bytes:
    """VALUE as the shell gave its bytes, stdin's bytes for `-`, or the file's."""
    if (value is None) == (value_file is None):
        raise ConfigError("give the value as VALUE, as - to read it from stdin, or with --value-file PATH", source="put")
    if value_file is None and value != "-":
        return os.fsencode(value)  # bytes that are not UTF-8 came as surrogates: these are the shell's bytes
    if value_file is None:
        data = sys.stdin.buffer.read(MAX_VALUE_READ + 1)
    else:
        try:
            with open(value_file, "rb") as f:
                data = f.read(MAX_VALUE_READ + 1)
        except OSError as exc:
            raise ConfigError(f"cannot read {value_file}: {exc.strerror}", source="--value-file") from None
    if len(data) > MAX_VALUE_READ:
        raise ConfigError(f"the value is over {MAX_VALUE_READ >> 20} MiB; no node takes a message that large",
                          source="put")
    return data


timeout_option = click.option("--timeout", type=float, default=10.0, show_default=True, help="Seconds.")
text_option = click.option("--text", is_flag=True,
                           help="With --json: keys and values that are UTF-8 as text, not base64.")


@click.command()
@click.argument("key", type=UTF8)
@click.argument("value", required=False)
@click.option("--value-file", type=click.Path(dir_okay=False), default=None, help="Read the value from this file.")
@config_option
@endpoints_option
@timeout_option
def put(key: str, value: str | None, value_file: str | None, config: str, endpoints: str | None,
        timeout: float) -> None:
    """Set KEY to VALUE (bytes as given; - reads them from stdin)."""
    data = _read_value(value, value_file)
    with _client(config, endpoints, timeout) as kv:
        kv.put(key, data)
    console.print("OK")


@click.command()
@click.argument("key", type=UTF8)
@config_option
@endpoints_option
@consistency_option
@timeout_option
@json_option
@text_option
def get(key: str, config: str, endpoints: str | None, consistency: str, timeout: float, as_json: bool,
        text: bool) -> None:
    """Print KEY's value (its bytes, unchanged, into a pipe or a file); exit 1 if it is absent."""
    with _client(config, endpoints, timeout) as kv:
        read = kv.read(key, consistency=consistency)
    if as_json:
        print(json.dumps({**_json_item(key.encode(), read.value, text), "applied_index": read.applied_index}))
    elif read.value is not None:
        print_bytes(read.value)
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
@text_option
def scan(prefix, start, end, limit, config, endpoints, consistency, timeout, as_json, text) -> None:
    """Print keys and values in key order: KEY, a tab, VALUE, a line break (bytes unchanged into a pipe
    or a file; --json for values that hold tabs or line breaks)."""
    with _client(config, endpoints, timeout) as kv:
        items = kv.scan(start, end, prefix=prefix, limit=limit, consistency=consistency)
        for key, value in items:
            if as_json:
                print(json.dumps(_json_item(key, value, text)))
            else:
                print_bytes(key + b"\t" + value + (b"" if console.is_terminal else b"\n"))
