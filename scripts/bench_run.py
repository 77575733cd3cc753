"""What every benchmark script's run shares: its flags (a frozen config dataclass, --quick and a flag per
field), its start (the config, one console, the data dir; SIGTERM unwinds like Ctrl-C), the header it
prints and its end (a temp data dir dropped)."""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
from dataclasses import asdict, fields, replace
from pathlib import Path

from rich.console import Console


def header(console: Console, host: dict, vers: dict, config, data_dir: Path) -> None:
    """The machine, its disk, the versions and the config, before the figures."""
    console.print(f"[bold]machine[/bold]  {host['nproc']} cores, {host['cpu']}, {host['memory']}, "
                  f"kernel {host['kernel']}, load average before the run {host['load_average']}")
    console.print(f"[bold]disk[/bold]     {data_dir}: {host['disk']}")
    console.print("[bold]versions[/bold] " + ", ".join(f"{k} {v}" for k, v in vers.items()))
    console.print("[bold]config[/bold]   " + ", ".join(f"{k}={v}" for k, v in asdict(config).items()))


def config_arguments(parser: argparse.ArgumentParser, default, quick, quick_help: str) -> None:
    """--quick, and a flag per field of the config dataclass of `default` (None when not given): see `configured`."""
    parser.add_argument("--quick", action="store_true", help=quick_help)
    for field in fields(default):
        parser.add_argument("--" + field.name.replace("_", "-"), type=type(field.default), default=None,
                            help=f"default {field.default}, --quick {getattr(quick, field.name)}")


def configured(args: argparse.Namespace, default, quick):
    """`default` (or `quick` with --quick) with every field given on the command line."""
    base = quick if args.quick else default
    return replace(base, **{f.name: v for f in fields(base) if (v := getattr(args, f.name)) is not None})


def start_run(args: argparse.Namespace, default, quick, prefix: str, width: int):
    """(config, console, data dir) of a benchmark run; SIGTERM then unwinds like Ctrl-C.

    The config is the defaults (or `quick` with --quick) with every flag given on
    the command line; the data dir is --data-dir or a new temp dir.
    """
    config = configured(args, default, quick)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # every started process is stopped on the way out
    console = Console() if sys.stdout.isatty() else Console(width=width)
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix=prefix))
    data_dir.mkdir(parents=True, exist_ok=True)
    return config, console, data_dir


def drop_data_dir(args: argparse.Namespace, data_dir: Path) -> None:
    """At the end of a run: a temp data dir goes, unless --keep-data; a --data-dir stays."""
    if args.data_dir is None and not args.keep_data:
        shutil.rmtree(data_dir, ignore_errors=True)
