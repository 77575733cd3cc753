"""The power-loss disk against a model, through a real FUSE mount: random operation sequences, then a power
cut that must keep exactly the durable operations, replayed in order."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from raftkv.powerloss import PowerLossDisk, unavailable_reason
from tests.powerloss_disks import disk, durable, fsync, new_disk, tree

pytestmark = pytest.mark.skipif(bool(unavailable_reason()), reason=unavailable_reason() or "FUSE is available")


# -- the model: a power cut keeps exactly the durable operations, replayed in order --

DIRS = ("/", "/sub/")
NAMES = ("a", "b", "c")


def _dir_of(path: str) -> str:
    return path[:path.rindex("/") + 1]


class Model:
    """Files by identity and names by directory; every operation recorded, then the durable ones replayed."""

    def __init__(self) -> None:
        self.ops: list[tuple] = []
        self.names: dict[str, int] = {}  # now, with every operation applied
        self.files: dict[int, bytes] = {}

    def do(self, op: tuple) -> None:
        self.ops.append(op)
        _apply(op, self.names, self.files)

    def durable(self, index: int) -> bool:
        op, later = self.ops[index], self.ops[index + 1:]
        if op[0] in ("write", "truncate"):
            syncs = [o[0] for o in later if o[0] in ("fsync", "fsync_failed") and o[1] == op[1]]
            return syncs[:1] == ["fsync"]
        dirs = {_dir_of(path) for path in op[1:] if isinstance(path, str)}
        return all(("fsyncdir", d) in later for d in dirs)

    def after_crash(self) -> dict[str, bytes]:
        names: dict[str, int] = {}
        files: dict[int, bytes] = {}
        for index, op in enumerate(self.ops):
            if op[0] not in ("fsync", "fsync_failed", "fsyncdir") and self.durable(index):
                _apply(op, names, files)
        return {path: files.get(file, b"") for path, file in names.items()}


def _apply(op: tuple, names: dict[str, int], files: dict[int, bytes]) -> None:
    kind = op[0]
    if kind == "create":
        names[op[1]] = op[2]
    elif kind == "unlink":
        del names[op[1]]
    elif kind == "rename":
        names[op[2]] = names.pop(op[1])
    elif kind == "write":
        _, file, offset, data = op
        old = files.get(file, b"")
        padded = old + bytes(max(0, offset - len(old)))
        files[file] = padded[:offset] + data + padded[offset + len(data):]
    elif kind == "truncate":
        _, file, length = op
        old = files.get(file, b"")
        files[file] = old[:length] + bytes(max(0, length - len(old)))


def _fsync_failing(disk: PowerLossDisk, path: Path, relative: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    disk.fail("fsync", relative)
    try:
        with pytest.raises(OSError) as failed:
            os.fsync(fd)
        assert failed.value.errno == errno.EIO
    finally:
        disk.heal()
        os.close(fd)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_a_power_cut_keeps_exactly_the_durable_operations(new_disk, data):
    disk = new_disk()
    root = durable(disk, {}, dirs=("sub",))
    model = Model()
    # Names a cross-directory rename changed stay untouched until both directories are fsynced: a
    # durable operation on them (fsync of one directory) would build on a rename the power cut
    # takes back, and there undoing and replaying disagree by nature.
    frozen: dict[str, set[str]] = {}
    next_file = 0
    for _ in range(data.draw(st.integers(1, 30), label="steps")):
        existing = sorted(p for p in model.names if p not in frozen)
        free = [d + n for d in DIRS for n in NAMES if d + n not in model.names and d + n not in frozen]
        kinds = ["fsyncdir"] + ["create"] * bool(free)
        kinds += ["write", "write", "append", "truncate", "fsync", "fsync_failed", "unlink", "rename"] * bool(existing)
        kind = data.draw(st.sampled_from(kinds), label="op")
        if kind == "fsyncdir":
            directory = data.draw(st.sampled_from(DIRS))
            fsync(root / directory.strip("/"))
            model.do(("fsyncdir", directory))
            for path in list(frozen):
                frozen[path].discard(directory)
                if not frozen[path]:
                    del frozen[path]
        elif kind == "create":
            path = data.draw(st.sampled_from(free))
            os.close(os.open(root / path[1:], os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            next_file += 1
            model.do(("create", path, next_file))
        elif kind == "unlink":
            path = data.draw(st.sampled_from(existing))
            os.unlink(root / path[1:])
            model.do(("unlink", path))
        elif kind == "rename":
            old = data.draw(st.sampled_from(existing))
            new = data.draw(st.sampled_from([p for p in existing + free if p != old]))
            os.rename(root / old[1:], root / new[1:])
            model.do(("rename", old, new))
            if _dir_of(old) != _dir_of(new):
                frozen[old] = frozen[new] = set(DIRS)
        else:
            path = data.draw(st.sampled_from(existing))
            file, size = model.names[path], len(model.files.get(model.names[path], b""))
            if kind in ("write", "append"):
                payload = data.draw(st.binary(min_size=1, max_size=12))
                offset = size if kind == "append" else data.draw(st.integers(0, size + 6))
                flags = os.O_WRONLY | (os.O_APPEND if kind == "append" else 0)
                fd = os.open(root / path[1:], flags)
                try:
                    os.write(fd, payload) if kind == "append" else os.pwrite(fd, payload, offset)
                finally:
                    os.close(fd)
                model.do(("write", file, offset, payload))
            elif kind == "truncate":
                length = data.draw(st.integers(0, size + 6))
                os.truncate(root / path[1:], length)
                model.do(("truncate", file, length))
            elif kind == "fsync":
                fsync(root / path[1:])
                model.do(("fsync", file))
            else:
                _fsync_failing(disk, root / path[1:], path[1:])
                model.do(("fsync_failed", file))
    everything = {path[1:]: model.files.get(file, b"") for path, file in model.names.items()}
    assert {k: v for k, v in tree(root).items() if k != "sub"} == everything
    disk.crash()
    expected = {path[1:]: content for path, content in model.after_crash().items()}
    assert {k: v for k, v in tree(disk.backing).items() if k != "sub"} == expected
