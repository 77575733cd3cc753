"""Fuzzing, in process, of what raftkv reads from files, frames and the command line (security item 5).

Each target is one test; tests/fuzzing.py sets how many inputs it sends and tallies them.

1. TOML specs -> `load_spec`: random bytes and text, and a valid spec (with [tls], [backup], [tuning])
   mutated value by value: wrong types, zero/negative/huge numbers, NaN and infinities, empty, long and
   control-character strings, absolute and `..` paths in every path field, missing tables, unknown keys,
   duplicate nodes, non-UTF-8 bytes, tomllib's own limits. It must give a spec that validates, names no
   path a file cannot have, and survives spec_to_toml and parsing unchanged, or a one-line ConfigError;
   never another exception, and never a second of work.
2. Backup manifests -> `BackupInfo.from_manifest`: random bytes, random JSON, deep nesting, and a valid
   manifest mutated: wrong types, huge, negative, float and infinite numbers, missing keys, file names
   that climb out (`../x`, `/etc/passwd`, `p0001/x` under partition 0, NUL, backslashes). It must give a
   BackupInfo whose every file is `<partition dir>/<plain name>`, or a one-line CorruptData.
3. Raft hub frames -> `frame_length` and `decode`: random bytes, valid frames truncated, extended and
   re-flagged, pickles that name globals, pickle bombs (deep nesting, memo references, marks) and zlib
   bombs, lengths 0 and past MAX_FRAME_BYTES. It must give the documented tuple or BadFrame, decode a
   frame of at most 1 MiB within a second, and not grow the process by more than 512 MiB in all.
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
import copy
import functools
import gc
import io
import json
import math
import os
import pickle
import resource
import signal
import struct
import sys
import time
import tomllib
import zlib
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator
from unittest import mock

import click
import pytest
import tomli_w
from hypothesis import given
from hypothesis import strategies as st

from raftkv.backup.manifest import BackupInfo, FileEntry, PartitionCopy, partition_dir
from raftkv.cli import cli, main, output
from raftkv.client.sync_client import Client
from raftkv.core.errors import ConfigError, CorruptData
from raftkv.core.spec import Tuning, ports_per_node
from raftkv.core.spec_toml import load_spec, parse_spec, spec_to_toml
from raftkv.dev.local_cluster import free_port_block
from raftkv.raft import hub_frames
from raftkv.raft.hub_frames import CONTROL, BadFrame
from raftkv.security.certs import with_certificates
from raftkv.storage.engine import Position
from tests.fuzzing import hypothesis_settings, tally

# -- what every target mutates with --------------------------------------------------

HOSTILE_TEXTS = ["", " ", "x" * 100_000, "a\nb", "a\r\nb", "\x00", "\x1b[2J", "{id}", "üñï", "\u202e", "-", "--x",
                 "a=b", "=", "[/]", "[bold]b", "%s%n"]
HOSTILE_PATHS = ["../../etc", "/etc/passwd", "..", ".", "/", "a/../../b", "C:\\x", "..\\..\\x", "~root",
                 "x" * 5000, "n1/../n2", "a\x00b"]
HOSTILE_NUMBERS = [0, -1, 1, 2, 65535, 65536, 4096, 4097, 2**31, 2**63 - 1, -2**63, 10**30, -0.0, 0.5, 1e308,
                   math.inf, -math.inf, math.nan]


def _paths(doc, prefix: tuple = ()):
    """Every key path in a document of dicts and lists, tables and leaves alike."""
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        yield prefix + (key,)
        yield from _paths(value, prefix + (key,))


@st.composite
def mutated(draw, valid: dict, values, frozen=lambda path: False) -> dict:
    """`valid` with one to four values set to `values(path)`, deleted, or joined by an unknown key."""
    doc = copy.deepcopy(valid)
    for _ in range(draw(st.integers(1, 4))):
        paths = [path for path in _paths(doc) if not frozen(path)]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(["set", "set", "delete", "add"]))
        if action == "delete":
            del parent[path[-1]]
        elif action == "add" and isinstance(parent, dict):
            parent[draw(st.sampled_from(["x", "", "a\nb", "__class__", "problems"]) | st.text(max_size=8))] = \
                draw(values(path))
        else:
            parent[path[-1]] = draw(values(path))
    return doc


def is_one_line(error: Exception) -> bool:
    return str(error).splitlines() == [str(error)]


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """TimeoutError in this (the main) thread after `seconds`: a hang fails its input instead of the run."""
    def expired(signum, frame):
        raise TimeoutError(f"one input took over {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def fuzz(target: str, short: int, strategy: st.SearchStrategy, check, always: list = (), seconds: float = 1) -> None:
    """`check` every value of `always`, then `inputs(short)` values of `strategy`, each within `seconds`;
    tallied under `target` by the outcome `check` names."""
    with tally(target) as sent:
        def counted(value) -> None:
            outcome = "failed"
            try:
                with time_limit(seconds):
                    outcome = check(value)
            finally:
                sent.add(outcome=outcome)

        for value in always:
            counted(value)
        given(strategy)(hypothesis_settings(short)(counted))()


# -- 1. TOML specs --------------------------------------------------------------------

SPEC_PATH_KEYS = {"data_dir", "ca", "node_cert", "node_key", "learner_cert", "learner_key", "client_cert",
                  "client_key"}
NUMBER_KEYS = {"partitions", "replication", "max_key_bytes", "max_value_bytes", "api_port", "metrics_port",
               "raft_port_base"}
NODE_ADDRESS_KEYS = {"host", "api_port", "metrics_port", "raft_port_base", "data_dir"}
TLS = {"ca": "certs/ca.pem", "node_cert": "certs/node-{id}.pem", "node_key": "certs/node-{id}.key",
       "learner_cert": "certs/learner.pem", "learner_key": "certs/learner.key",
       "client_cert": "certs/user-admin.pem", "client_key": "certs/user-admin.key", "metrics": False}


def spec_doc(base_port: int, partitions: int = 4) -> dict:
    """A valid spec of two nodes on 127.0.0.1 from `base_port`, with every optional table."""
    stride = ports_per_node(partitions)
    nodes = [{"id": f"n{i + 1}", "host": "127.0.0.1", "api_port": base_port + i * stride,
              "metrics_port": base_port + i * stride + 1, "raft_port_base": base_port + i * stride + 2,
              "data_dir": f"n{i + 1}"} for i in range(2)]
    return {"cluster": {"name": "fuzz", "partitions": partitions, "replication": 2, "durability": "fsync"},
            "tuning": {"heartbeat_period": 0.05, "max_batch_ops": 64},
            "backup": {"url": "file:///srv/backups", "seed": True, "storage": {"auto_mkdir": True}},
            "tls": dict(TLS), "nodes": nodes}


scalars = (st.sampled_from(HOSTILE_NUMBERS + HOSTILE_TEXTS + HOSTILE_PATHS + [True, False]) | st.integers()
           | st.floats() | st.datetimes() | st.text(max_size=20))
toml_values = scalars | st.lists(scalars, max_size=3) | st.dictionaries(st.text(max_size=8), scalars, max_size=3)


def spec_values(path: tuple) -> st.SearchStrategy:
    if path[-1] in SPEC_PATH_KEYS:
        return st.sampled_from(HOSTILE_PATHS) | toml_values
    if path[-1] in NUMBER_KEYS or path[:1] == ("tuning",):
        return st.sampled_from(HOSTILE_NUMBERS) | toml_values
    return toml_values


def _nodes_duplicated(valid: dict, copies: int) -> dict:
    doc = copy.deepcopy(valid)
    doc["nodes"] += [copy.deepcopy(doc["nodes"][0]) for _ in range(copies)]
    return doc


def _tuned(valid: dict, key: str, value) -> dict:
    """`valid` with one Tuning field (or a name that is not one) set: `mutated` reaches only those it has."""
    doc = copy.deepcopy(valid)
    doc["tuning"][key] = value
    return doc


RAW_TOMLS = [b"a = " + b"[" * 100_000, b"a = " + b"{b=" * 100_000, b"[" + b"a." * 10_000 + b"b]",
             b"[cluster]\npartitions = " + b"9" * 5000, b"[cluster]\npartitions = 1e999", b"\xef\xbb\xbf[cluster]"]


def spec_texts(valid: dict, frozen=lambda path: False) -> st.SearchStrategy[bytes]:
    """A spec file's bytes: random, or `valid` mutated, perhaps with bytes that are not UTF-8 spliced in."""
    numbers = st.sampled_from(HOSTILE_NUMBERS)
    documents = st.one_of(
        mutated(valid, spec_values, frozen),
        mutated(valid, lambda path: numbers, lambda path: path[-1] not in NUMBER_KEYS or frozen(path)),
        st.builds(_nodes_duplicated, st.just(valid), st.integers(1, 3)),
        st.builds(_tuned, st.just(valid), st.sampled_from(sorted(vars(Tuning())) + ["problems", "__doc__"]), numbers))
    tomls = documents.map(lambda doc: tomli_w.dumps(doc).encode())
    spliced = st.tuples(tomls, st.integers(0, 10_000), st.sampled_from([b"\xff", b"\xc3", b"\x00", b"\r", b"["])).map(
        lambda t: t[0][:t[1]] + t[2] + t[0][t[1]:])
    return st.one_of(tomls, tomls, spliced, st.binary(max_size=200), st.text(max_size=200).map(str.encode))


def spec_paths(spec) -> list[Path]:
    tls = [v for k, v in vars(spec.tls).items() if k != "metrics" and v is not None] if spec.tls else []
    return [n.data_dir for n in spec.nodes] + tls


def check_spec_file(path: Path) -> str:
    try:
        spec = load_spec(path)
    except ConfigError as error:
        assert is_one_line(error), str(error)
        return "ConfigError"
    assert spec.validate() == []
    assert all("\x00" not in str(p) for p in spec_paths(spec)), "a path no file can have"
    base = path.parent.resolve()
    assert parse_spec(tomllib.loads(spec_to_toml(spec, relative_to=base)), base) == spec
    return "a spec"


def test_hostile_specs_load_or_fail_with_one_line(tmp_path):
    path = tmp_path / "cluster.toml"

    def check(data: bytes) -> str:
        path.write_bytes(data)
        return check_spec_file(path)

    fuzz("TOML specs -> load_spec", 2000, spec_texts(spec_doc(7000)), check, always=RAW_TOMLS)


# -- 2. backup manifests --------------------------------------------------------------

BACKUP_ID = "20260102T030405.123456Z"
TRAVERSALS = ["../x", "/etc/passwd", "p0000/../../x", "p0001/x", "", ".", "p0000", "p0000/", "p0000/.",
              "p0000/..", "p0000//x", "./p0000/x", "p0000\\..\\x", "p0000/..\\x", "p0000/a\x00b", "P0000/x",
              "p0000/x/y", "p0000/" + "x" * 5000, "p-001/x", "p00000/x", " p0000/x"]


def manifest_doc() -> dict:
    files = (FileEntry("p0000/000009.sst", 100, "ab" * 32), FileEntry("p0000/CURRENT", 16, "cd" * 32))
    copies = (PartitionCopy(0, Position(10, 2), files),
              PartitionCopy(1, Position(0, 0), (FileEntry("p0001/MANIFEST-000005", 9, "ef" * 32),)))
    info = BackupInfo(BACKUP_ID, "fuzz", datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=timezone.utc), copies, "cid")
    return json.loads(info.to_manifest())


json_scalars = (st.none() | st.booleans() | st.integers(-10**300, 10**300) | st.floats()
                | st.sampled_from(HOSTILE_NUMBERS + HOSTILE_TEXTS + TRAVERSALS) | st.text(max_size=20))
def containers(inner: st.SearchStrategy) -> st.SearchStrategy:
    return st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)


json_values = st.recursive(json_scalars, containers, max_leaves=20)


def manifest_values(path: tuple) -> st.SearchStrategy:
    return st.sampled_from(TRAVERSALS) | json_values if path[-1] == "path" else json_values


def manifest_bytes() -> st.SearchStrategy[bytes]:
    documents = mutated(manifest_doc(), manifest_values) | json_values
    texts = documents.map(lambda doc: json.dumps(doc).encode())
    overflowing = texts.map(lambda text: text.replace(b": 100,", b": 1e999,").replace(b": 10,", b": -1e999,"))
    return st.one_of(texts, texts, overflowing, st.binary(max_size=300))


JSON_ATTACKS = [b"[" * 100_000, b'{"a":' * 100_000, b"[" * 100_000 + b"]" * 100_000, b"[]", b"7", b'"x"', b"null"]


def plain_file_of(path: str, partition: int) -> bool:
    folder, _, name = path.partition("/")
    return (folder == partition_dir(partition) and name not in ("", ".", "..")
            and not any(c in name for c in "/\\\x00"))


def check_manifest(data: bytes) -> str:
    try:
        info = BackupInfo.from_manifest(data, "fuzz/manifest.json")
    except CorruptData as error:
        assert is_one_line(error), str(error)
        return "CorruptData"
    for c in info.copies:
        assert type(c.partition) is int and c.partition >= 0, c.partition
        assert all(type(n) is int and n >= 0 for n in (c.position.index, c.position.term)), c.position
        for f in c.files:
            assert plain_file_of(f.path, c.partition), (c.partition, f.path)
            assert type(f.size) is int and f.size >= 0 and isinstance(f.sha256, str), f
    return "a BackupInfo"


def test_hostile_manifests_parse_to_files_inside_their_partition_or_fail_with_one_line():
    fuzz("backup manifests -> BackupInfo.from_manifest", 2000, manifest_bytes(), check_manifest, always=JSON_ATTACKS)


# -- 3. Raft hub frames ----------------------------------------------------------------

FRAME_SECONDS = 1.0  # a decode may hold the hub's loop this long at most...
FRAME_BYTES_TIMED = 1 << 20  # ...for a frame of up to this many bytes (every one sent here)
MEMORY_GROWTH = 512 << 20
_MIB = 1 << 20

plain_data = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10)
                          | st.binary(max_size=20), lambda inner: containers(inner) | st.tuples(inner, inner),
                          max_leaves=12)
bodies = (st.tuples(st.integers(-2**63, 2**63), plain_data)
          | st.tuples(st.just(CONTROL), st.sampled_from(["hello", "join", "leave", "ping", "pong"]) | st.text(),
                      plain_data)
          | st.tuples(plain_data, plain_data) | plain_data)


def _raw(body: bytes, flag: int = 0) -> bytes:
    """A frame (length, flag, body) around bytes that need not be a pickle."""
    return struct.pack(">I", len(body) + 1) + bytes((flag,)) + body


def _pickle_attacks() -> list[bytes]:
    """Pickles that name globals, call what they must not, or blow up the unpickler's stacks."""
    proto = b"\x80\x05"
    return [
        *(pickle.dumps((0, os.system), protocol=p) for p in range(pickle.HIGHEST_PROTOCOL + 1)),
        b"cos\nsystem\n(S'true'\ntR.",  # GLOBAL + REDUCE, protocol 0
        proto + b"\x8c\x02os\x8c\x06system\x93\x8c\x04true\x85R.",  # STACK_GLOBAL + REDUCE
        proto + b"\x82\x01.",  # EXT1: the copyreg extension registry
        proto + b"P0\n.",  # PERSID
        proto + b"K\x01K\x02R.",  # REDUCE with a number as the callable
        proto + b"]K\x01b.",  # BUILD on a list
        proto + b"]" * 100_000 + b"a" * 99_999 + b".",  # lists 100,000 deep
        proto + b"]\x94(" + b"h\x00" * 30_000 + b"e.",  # one list holding itself 30,000 times
        proto + b"(" * 60_000 + b".",  # 60,000 marks
        proto + b"]" * 60_000 + b".",  # 60,000 lists on the stack
        proto + b"\x8e" + struct.pack("<Q", 2**62) + b"x.",  # BINBYTES8 longer than the frame
        proto + b"\x8a\xff" + b"\xff" * 255 + b".",  # a 2040-bit int
    ]


def _compressed(*parts: tuple[bytes, int]) -> bytes:
    """zlib of each (bytes, times) in turn, level 9, without holding the whole in memory."""
    packer, out = zlib.compressobj(9), []
    for chunk, times in parts:
        for _ in range(times):
            out.append(packer.compress(chunk))
    return b"".join(out) + packer.flush()


def _zlib_bombs() -> list[bytes]:
    """Compressed bodies from 1 MiB to past MAX_FRAME_BYTES, of zeros and of pickle opcodes, and the
    worst the inflation limit lets through: as many EMPTY_LIST opcodes as it allows beside bytes that
    do not compress."""
    noise = os.urandom(60_000)
    lists = hub_frames.inflation_limit(len(noise)) - len(noise) - 100
    worst = (b"\x80\x05", 1), (b"]", lists), (b"\x8e" + struct.pack("<Q", len(noise)) + noise + b".", 1)
    return [_compressed((b"\x00" * _MIB, 1)), _compressed((b"]" * _MIB, 16)),
            _compressed((b"\x80\x05", 1), (b"(" * _MIB, 64)),
            _compressed((b"\x00" * _MIB, hub_frames.MAX_FRAME_BYTES // _MIB + 1)), _compressed(*worst)]


@functools.cache
def hostile_frames() -> list[bytes]:
    return [*(_raw(p) for p in _pickle_attacks()), *(_raw(zlib.compress(p), 1) for p in _pickle_attacks()),
            *(_raw(bomb, 1) for bomb in _zlib_bombs()),
            *(struct.pack(">I", n) + b"\x00" for n in (0, 1, hub_frames.MAX_FRAME_BYTES + 1, 2**32 - 1))]


@st.composite
def frames(draw) -> bytes:
    """A whole frame, header included: valid ones broken, attacks, or random bytes."""
    kind = draw(st.sampled_from(["valid", "broken", "broken", "attack", "random"]))
    if kind == "attack":
        return draw(st.sampled_from(hostile_frames()))
    if kind == "random":
        return draw(st.binary(max_size=64))
    frame = hub_frames.encode(draw(bodies), draw(st.sampled_from([0, 0, 1, 9])))
    if kind == "broken":
        cut = draw(st.integers(0, len(frame)))
        how = draw(st.sampled_from(["truncate", "extend", "flag", "flip"]))
        if how == "truncate":
            frame = frame[:cut]
        elif how == "extend":
            frame += draw(st.binary(min_size=1, max_size=32))
        elif how == "flag" and len(frame) > 4:
            frame = frame[:4] + bytes((draw(st.integers(0, 255)),)) + frame[5:]
        elif cut < len(frame):
            frame = frame[:cut] + bytes((frame[cut] ^ draw(st.integers(1, 255)),)) + frame[cut + 1:]
    return frame


def check_frame(frame: bytes) -> str:
    header, rest = frame[:hub_frames.HEADER_BYTES], frame[hub_frames.HEADER_BYTES:]
    try:
        assert 1 <= hub_frames.frame_length(header) <= hub_frames.MAX_FRAME_BYTES
    except BadFrame:
        pass
    body, seconds = _decode_timed(rest)
    assert len(rest) > FRAME_BYTES_TIMED or seconds < FRAME_SECONDS, f"decoding {len(rest)} bytes took {seconds} s"
    assert body is None or (body[0] == CONTROL and len(body) == 3 and isinstance(body[1], str)) or (
        len(body) == 2 and type(body[0]) is int), body
    return "BadFrame" if body is None else "a tuple"


def _decode_timed(frame: bytes) -> tuple[tuple | None, float]:
    """decode's tuple (None for BadFrame) and its seconds, with the collector off: a full collection
    of this test process's heap (hypothesis keeps a lot in it) is not the decode's time."""
    gc.disable()
    started = time.monotonic()
    try:
        return hub_frames.decode(frame), time.monotonic() - started
    except BadFrame:
        return None, time.monotonic() - started
    finally:
        gc.enable()


def _rss_peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def test_hostile_frames_decode_or_fail_as_bad_frames_within_bounds():
    before = _rss_peak()
    fuzz("Raft hub frames -> frame_length, decode", 2500, frames(), check_frame, always=hostile_frames())
    assert _rss_peak() - before < MEMORY_GROWTH


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
