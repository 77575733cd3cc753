"""Fuzzing, in process, of what raftkv reads from the command line (security item 5).

Each target is one test; tests/fuzzing.py sets how many inputs it sends and tallies them.

4. CLI arguments -> `raftkv.cli.main`: argv built from the click command tree with hostile values
   (wrong types, huge numbers, unicode, bytes that are not UTF-8, missing and extra arguments, misspelled
   options, the hostile specs of target 1 as --config) against a spec whose nodes nothing listens on.
   It must exit 0, 1 (`get` of a missing key) or 2, without a traceback, and on 2 print one error line
   (after click's usage block, for a usage error). Commands that start long-running processes or
   reach outside the working folder are left out; every path it generates is relative, every host
   127.0.0.1, and the client gives up on the unreachable cluster at once (QUICK_TIMEOUT).
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Iterator
from unittest import mock

import click
import pytest
from hypothesis import strategies as st

from raftkv.cli import cli, main, output
from raftkv.client.sync_client import Client
from raftkv.core.spec import ports_per_node
from raftkv.core.spec_toml import parse_spec, spec_to_toml
from raftkv.dev.local_cluster import free_port_block
from raftkv.security.certs import with_certificates
from tests.fuzzing import HOSTILE_TEXTS, fuzz
from tests.test_fuzz_files import BACKUP_ID, NODE_ADDRESS_KEYS, manifest_doc, spec_doc, spec_texts

# -- 4. CLI arguments -------------------------------------------------------------------

LEFT_OUT = {("node", "start"), ("dev", "up"), ("learner", "start"), ("feed", "tail")}  # and every `chaos` command
# The client's timeout here. Admin commands (user, role, replica, rebalance, leader, node list/decommission,
# backup create) retry for their whole timeout, 10 to 15 s, while every node refuses the connection.
QUICK_TIMEOUT = 0.001
SURROGATES = [os.fsdecode(b) for b in (b"\xff\xfe", b"caf\xe9", b"\xc3")]  # a shell's bytes that are not UTF-8
SPECS = ["fixed/cluster.toml", "raftkv-data/cluster.toml"]  # (the default of --config) nodes nothing listens on
CONFIGS = [*SPECS, "hostile.toml", "missing.toml", "fixed", "", "fixed/garbage.pem"]
WRITABLE = ["out.toml", "sub/out.toml", "sub", "x" * 300, *SURROGATES, "a b", "-o", "out.toml/", "[/]"]
URLS = ["backups", "file://backups", "file://empty", "empty", "memory://fuzz", "nope://x", "", "::", "file://",
        "file://fixed/garbage.pem"]
KEY_VALUES = ["a=b", "=", "noeq", "a==", "=b", "client_kwargs.x=1", "a.b.c=true", "..=x", "auto_mkdir=1",
              "skip_instance_cache=1", "n4=127.0.0.1", "n4=", "../../x=h", "ü=ü"]
TEXT = (st.sampled_from([t for t in HOSTILE_TEXTS if "\x00" not in t] + SURROGATES + ["all", "0,1", "-1", "1,,2"])
        | st.text(st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"]), max_size=12))
NUMBERS = st.sampled_from(["0", "-1", "1", "3", "99", "100", "4096", "4097", "1024", "65000", "65536", "9" * 30,
                           "1e3", "0x10", "nan", "inf", "-inf", "1e309", "", " 5 ", "١٢", "1_0", "0.5"]) | TEXT


@functools.cache
def command_tree() -> list[tuple[tuple[str, ...], click.Command]]:
    """(words, command) of every command of `raftkv` the fuzzer runs."""
    found = []

    def walk(command: click.Command, words: tuple[str, ...]) -> None:
        if isinstance(command, click.Group):
            context = click.Context(command)
            for name in command.list_commands(context):
                walk(command.get_command(context, name), words + (name,))
        elif words not in LEFT_OUT and words[0] != "chaos":
            found.append((words, command))

    walk(cli, ())
    return found


def param_values(param: click.Parameter, endpoints: list[str]) -> st.SearchStrategy[str]:
    by_name = {"config": st.sampled_from(SPECS) | st.sampled_from(CONFIGS), "endpoints": st.sampled_from(endpoints),
               "url": st.sampled_from(URLS), "output": st.sampled_from(WRITABLE), "out": st.sampled_from(WRITABLE),
               "data_dir": st.sampled_from(WRITABLE), "hosts": st.sampled_from(["127.0.0.1", "a,b", ","]) | TEXT}
    if param.name in by_name:
        return by_name[param.name]
    if param.multiple:
        return st.sampled_from(KEY_VALUES) | TEXT
    if isinstance(param.type, click.Choice):
        return st.sampled_from([*param.type.choices, "READ", ""]) | TEXT
    if isinstance(param.type, (click.types.IntParamType, click.types.FloatParamType)):
        return NUMBERS
    return TEXT


def option_words(param: click.Option, value: str) -> list[str]:
    if param.is_flag:
        return [param.opts[0]] if value else param.secondary_opts[:1]
    return [param.opts[0], value]


@st.composite
def argvs(draw, endpoints: list[str]) -> list[str]:
    """The words of one `raftkv` command line: a command's options and arguments, some of them hostile."""
    words, command = draw(st.sampled_from(command_tree()))
    argv = list(words)
    for param in command.params:
        if not param.required and not draw(st.booleans()):
            continue
        value = draw(st.booleans()) if getattr(param, "is_flag", False) else draw(param_values(param, endpoints))
        argv += option_words(param, value) if isinstance(param, click.Option) else [value]
    if draw(st.integers(0, 3)) == 0:
        roots = draw(st.lists(st.sampled_from(["--cacert", "--cert", "--key", "--token"]), max_size=2, unique=True))
        argv = [w for root in roots for w in (root, draw(st.sampled_from(CONFIGS) | TEXT))] + argv
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):
        position = draw(st.integers(0, len(argv)))
        how = draw(st.sampled_from(["drop", "extra", "misspell", "help"]))
        if how == "drop" and position < len(argv):
            del argv[position]
        elif how == "misspell" and position < len(argv):
            argv[position] = argv[position][:-1] + draw(st.sampled_from(["x", "-", "_", "=", ""]))
        else:
            argv.insert(position, "--help" if how == "help" else draw(TEXT))
    return argv


@contextlib.contextmanager
def captured() -> Iterator[tuple[io.TextIOWrapper, io.TextIOWrapper]]:
    """stdout and stderr as a terminal's: stdout refuses what is not UTF-8, stderr escapes it."""
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="backslashreplace")
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            mock.patch.object(sys, "stdin", io.TextIOWrapper(io.BytesIO())):
        yield out, err


def run_cli(argv: list[str]) -> tuple[int, str]:
    """`raftkv *argv` in this process: its exit code and stderr."""
    with captured() as (_, err), mock.patch.object(sys, "argv", ["raftkv", *argv]):
        try:
            main()
            code = 0
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else 0 if exit.code is None else 2
        finally:  # rich keeps what a write failed on for its next print; a new process would not have it
            output.console._buffer.clear()
            output.err_console._buffer.clear()
        err.flush()
    return code, err.buffer.getvalue().decode(errors="backslashreplace")  # click writes argv bytes back as given


def check_exit(argv: list[str], code: int, stderr: str) -> None:
    """Exit 0, 1 (`get` of a missing key) or 2, no traceback, and on 2 one error line: after a warning
    line, or after click's usage block (whose error about a missing choice lists the choices, tabbed)."""
    assert "Traceback" not in stderr, stderr
    assert code in (0, 2) or (code == 1 and "get" in argv), (code, stderr)
    if code != 2:
        return
    lines = [line for line in stderr.splitlines() if line.strip() and not line.startswith("warning: ")]
    if lines and lines[0].startswith("Usage:"):
        lines = [line for line in lines[next((i for i, line in enumerate(lines) if line.startswith("Error:")), 0):]
                 if not line.startswith("\t")]
    assert len(lines) == 1, stderr


def _quick(real_init):
    """Client.__init__ with a timeout of at most QUICK_TIMEOUT (a --timeout of NaN, or below it, goes through)."""
    def init(self, endpoints, **options):
        if options.get("timeout", math.inf) > QUICK_TIMEOUT:
            options["timeout"] = QUICK_TIMEOUT
        real_init(self, endpoints, **options)
    return init


@pytest.fixture
def cli_folder(tmp_path, monkeypatch):
    """A working folder holding a TLS spec of nodes nothing listens on, a damaged backup and a bad PEM."""
    monkeypatch.chdir(tmp_path)
    base = free_port_block(2 * ports_per_node(2))
    doc = spec_doc(base, partitions=2)
    spec = with_certificates(parse_spec(doc, tmp_path / "fixed"), tmp_path / "fixed")
    specs = {path: spec_to_toml(spec, relative_to=(tmp_path / path).parent) for path in SPECS}
    backup = tmp_path / "backups" / BACKUP_ID
    backup.mkdir(parents=True)
    damaged = manifest_doc()
    damaged["partitions"][0]["files"][0]["path"] = "p0000/../../escaped"
    (backup / "manifest.json").write_text(json.dumps(damaged))
    (tmp_path / "empty").mkdir()

    def reset() -> None:
        """What a command may have overwritten, back as it was."""
        for path, text in specs.items():
            Path(path).parent.mkdir(exist_ok=True)
            Path(path).write_text(text)
        Path("fixed/garbage.pem").write_bytes(b"-----BEGIN CERTIFICATE-----\n\xff\n")

    reset()
    return doc, base, reset


def test_hostile_command_lines_exit_with_one_line_and_no_traceback(cli_folder, monkeypatch):
    doc, base, reset = cli_folder
    monkeypatch.setattr(Client, "__init__", _quick(Client.__init__))
    endpoints = [f"127.0.0.1:{base}", f"127.0.0.1:{base},127.0.0.1:{base + 1}", f"[::1]:{base}", "127.0.0.1",
                 "127.0.0.1:", "127.0.0.1:99999", "127.0.0.1:-1", ",", f"127.0.0.1:{base}\n"]
    addresses = lambda path: path[:1] == ("nodes",) and len(path) > 2 and path[2] in NODE_ADDRESS_KEYS

    def check(case: tuple[list[str], bytes]) -> str:
        argv, hostile_spec = case
        reset()
        Path("hostile.toml").write_bytes(hostile_spec)
        code, stderr = run_cli(argv)
        check_exit(argv, code, stderr)
        return f"exit {code}" + (" (usage)" if stderr.startswith("Usage:") else " (no node answered)"
                                 if "no node" in stderr else "")

    fuzz("CLI arguments -> raftkv", 1000, st.tuples(argvs(endpoints), spec_texts(doc, frozen=addresses)), check,
         seconds=10)


@pytest.mark.parametrize("argv", [["get", "k"], ["put", "k", "v"], ["delete", "k"], ["scan"], ["status"],
                                  ["learner", "list"], ["learner", "add", "--name", "l", "--sink", "changelog", "--sink-option", "path=changes"],
                                  ["user", "list"], ["node", "list"], ["leader", "transfer", "--partition", "0", "--to", "n1"],
                                  ["replica", "move", "--partition", "0", "--from", "n1", "--to", "n2"]])
def test_commands_fail_fast_with_one_line_when_no_node_listens(cli_folder, argv):
    started = time.monotonic()
    code, stderr = run_cli([*argv, "--config", "fixed/cluster.toml"])
    assert code == 2 and "no node answered" in stderr
    check_exit(argv, code, stderr)
    assert time.monotonic() - started < 3
