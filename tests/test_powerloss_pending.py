"""pending: which operations a power cut keeps, and the undo steps that take back the rest. No FUSE here."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings, strategies as st

from raftkv.powerloss.pending import (CrashReport, Discard, MakeDir, Move, PendingLog, PutBytes, SetSize,
                                      TornWrite, UndoStep)

ROOT, SUB = 1, 2  # directory inodes
FILE = 100


class Disk:
    """Files as byte arrays and a name table: the backing directory, applied at once and then undone."""

    def __init__(self) -> None:
        self.files: dict[int, bytearray] = {}
        self.names: dict[str, int] = {}
        self.trash = 0

    def write(self, log: PendingLog, file: int, offset: int, data: bytes) -> None:
        content = self.files[file]
        size = len(content)
        log.write(file, f"/{file}", offset, len(data), size, bytes(content[offset:offset + len(data)]))
        content.extend(bytes(max(0, offset - size)))
        content[offset:offset + len(data)] = data

    def truncate(self, log: PendingLog, file: int, length: int) -> None:
        content = self.files[file]
        log.truncate(file, f"/{file}", length, len(content), bytes(content[length:]))
        del content[length:]
        content.extend(bytes(length - len(content)))

    def undo(self, steps: tuple[UndoStep, ...]) -> None:
        for step in steps:
            if isinstance(step, PutBytes):
                content = self.files[step.file]
                assert step.offset + len(step.data) <= len(content), "undo writes stay inside the file"
                content[step.offset:step.offset + len(step.data)] = step.data
            elif isinstance(step, SetSize):
                content = self.files[step.file]
                del content[step.size:]
                content.extend(bytes(step.size - len(content)))
            elif isinstance(step, Discard):
                self.names.pop(step.path)
            elif isinstance(step, Move):
                assert step.old in self.names, f"{step}: nothing to move back"
                self.names[step.new] = self.names.pop(step.old)
            else:
                raise AssertionError(f"no directories in these tests: {step}")

    def tree(self) -> dict[str, bytes]:
        return {path: bytes(self.files[file]) for path, file in self.names.items() if not path.startswith("/.trash")}


def one_file(content: bytes = b"") -> tuple[PendingLog, Disk]:
    disk = Disk()
    disk.files[FILE] = bytearray(content)
    return PendingLog(), disk


def crash(log: PendingLog, disk: Disk, tear: random.Random | None = None) -> CrashReport:
    plan = log.crash_plan(tear)
    disk.undo(plan.steps)
    return plan.report


# -- file data -------------------------------------------------------------------

def test_an_unsynced_overwrite_is_undone_and_a_synced_one_kept():
    log, disk = one_file(b"0123456789")
    disk.write(log, FILE, 2, b"ab")
    log.fsync(FILE)
    assert not log.has_data(FILE)  # the filesystem may close its descriptor
    disk.write(log, FILE, 8, b"XYZW")  # past the end: nothing to keep of the old file beyond 10
    assert log.has_data(FILE)
    report = crash(log, disk)
    assert disk.files[FILE] == b"01ab456789"
    assert report == CrashReport(writes_dropped=1, bytes_dropped=4)


def test_a_write_past_the_end_undoes_to_the_old_size_without_a_pre_image():
    log, disk = one_file(b"abc")
    disk.write(log, FILE, 10, b"zz")
    assert log.crash_plan().steps == (SetSize(FILE, 3),)


def test_a_truncate_is_undone_with_the_bytes_it_cut():
    log, disk = one_file(b"0123456789")
    disk.truncate(log, FILE, 4)
    disk.truncate(log, FILE, 12)
    report = crash(log, disk)
    assert disk.files[FILE] == b"0123456789"
    assert report.truncates_dropped == 2


def test_entries_must_carry_exactly_the_bytes_they_overwrote():
    log = PendingLog()
    with pytest.raises(ValueError):
        log.write(FILE, "/f", 2, 4, 4, b"x")  # overwrote 2 bytes, [2, 4)
    with pytest.raises(ValueError):
        log.truncate(FILE, "/f", 1, 4, b"")
    log.write(FILE, "/f", 0, 0, 4, b"")
    log.truncate(FILE, "/f", 4, 4, b"")
    assert len(log) == 0  # empty writes and same-size truncates change nothing


def test_a_failed_fsync_poisons_the_writes_before_it_for_good():
    log, disk = one_file(b"..........")
    disk.write(log, FILE, 0, b"AAAA")
    log.fsync_failed(FILE)
    disk.write(log, FILE, 2, b"BBBB")
    log.fsync(FILE)  # succeeds: BBBB is durable, AAAA is not, and never will be
    log.fsync(FILE)
    assert log.has_data(FILE)
    report = crash(log, disk)
    assert disk.files[FILE] == b"..BBBB...."
    assert report.poisoned_dropped == 1 and report.writes_dropped == 1


def test_undoing_a_poisoned_write_leaves_a_later_durable_truncate_and_extension_alone():
    log, disk = one_file(b"0123456789")
    disk.write(log, FILE, 6, b"PPPPPP")  # to 12 bytes
    log.fsync_failed(FILE)
    disk.truncate(log, FILE, 8)
    disk.write(log, FILE, 14, b"DD")  # a hole at [8, 14)
    log.fsync(FILE)
    crash(log, disk)
    # durable replay: truncate 0123456789 to 8, then write DD at 14
    assert disk.files[FILE] == b"01234567" + bytes(6) + b"DD"


def test_a_truncate_that_changes_nothing_still_fixes_the_size_after_a_poisoned_write():
    log, disk = one_file()
    disk.write(log, FILE, 0, b"P")
    log.fsync_failed(FILE)
    disk.truncate(log, FILE, 1)  # the file is 1 byte long already
    log.fsync(FILE)
    crash(log, disk)
    assert disk.files[FILE] == b"\0"  # replayed: the write is lost, the truncate to 1 is not


# -- tearing ---------------------------------------------------------------------

def test_a_torn_write_keeps_a_prefix_of_the_last_unsynced_write_only():
    for seed in range(20):
        log, disk = one_file(b"0123456789")
        disk.write(log, FILE, 0, b"aa")
        disk.write(log, FILE, 5, b"bbbbbbbb")  # the last one: 5 old bytes, 3 new
        report = crash(log, disk, random.Random(seed))
        kept = report.torn.kept
        assert report.torn == TornWrite(f"/{FILE}", 5, 8, kept) and 0 <= kept < 8
        assert disk.files[FILE] == (b"01234" + b"b" * kept + b"56789"[kept:])
        assert report.writes_dropped == 1 and report.bytes_dropped == 2 + 8 - kept


def test_the_tear_follows_the_seed_and_skips_durable_writes():
    def kept(seed: int) -> int:
        log, disk = one_file()
        disk.write(log, FILE, 0, b"x" * 100)
        return log.crash_plan(random.Random(seed)).report.torn.kept
    assert kept(3) == kept(3)
    assert len({kept(seed) for seed in range(10)}) > 1
    log, disk = one_file()
    disk.write(log, FILE, 0, b"x")
    log.fsync(FILE)
    assert log.crash_plan(random.Random(0)).report.torn is None


# -- names -----------------------------------------------------------------------

def test_a_create_is_durable_once_its_directory_is_fsynced():
    log = PendingLog()
    log.create("create", "/a", [ROOT])
    log.create("mkdir", "/d/b", [SUB])
    assert log.fsyncdir(ROOT) == []
    assert log.crash_plan().steps == (Discard("/d/b", SUB),)


def test_a_rename_between_directories_needs_both_fsynced():
    log = PendingLog()
    log.rename("/a", "/d/a", [ROOT, SUB])
    log.fsyncdir(SUB)
    assert log.crash_plan().steps == (Move("/d/a", "/a"),)
    log.fsyncdir(ROOT)
    assert log.crash_plan().steps == ()


def test_removed_files_leave_the_trash_only_once_the_removal_is_durable():
    log = PendingLog()
    log.remove("unlink", "/a", "/.trash/0", [ROOT])
    log.rename("/b", "/c", [ROOT], replaced_trash="/.trash/1")
    log.rename("/e", "/f", [ROOT], replaced_dir_mode=0o750)
    assert log.crash_plan().steps == (Move("/f", "/e"), MakeDir("/f", 0o750), Move("/c", "/b"),
                                      Move("/.trash/1", "/c"), Move("/.trash/0", "/a", ROOT))
    assert log.fsyncdir(ROOT) == ["/.trash/0", "/.trash/1"]


def test_a_removed_directory_takes_its_pending_name_changes_with_it():
    log = PendingLog()
    log.remove("unlink", "/d/f", "/.trash/0", [SUB])
    log.remove("rmdir", "/d", "/.trash/1", [ROOT], directory=SUB)
    assert log.fsyncdir(ROOT) == ["/.trash/1", "/.trash/0"]
    assert log.crash_plan().steps == ()


def test_a_durable_rename_keeps_the_pending_changes_of_the_name_it_moves():
    """Found by chaos under load (issue 32): a snapshot install makes its database in a temporary
    directory, moves it to db.incoming and that to db, and fsyncs only the partition's folder; the
    temporary directory (removed next) is never fsynced. Undoing the first move and the mkdir
    would find nothing to move or discard: db.incoming is db for good."""
    log = PendingLog()
    log.create("mkdir", "/p/tmp/db", [SUB])
    log.rename("/p/tmp/db", "/p/db.incoming", [SUB, ROOT])
    log.rename("/p/db.incoming", "/p/db", [ROOT])
    assert log.fsyncdir(ROOT) == []
    assert log.crash_plan().steps == ()


def test_a_durable_name_change_keeps_only_the_last_change_of_each_name_before_it():
    log = PendingLog()
    log.create("create", "/d/a", [SUB])
    log.rename("/d/a", "/b", [SUB, ROOT])
    log.create("create", "/d/c", [SUB])
    log.create("create", "/d/a", [SUB])  # the name again, in the directory left unsynced
    log.remove("unlink", "/b", "/.trash/0", [ROOT])
    assert log.fsyncdir(ROOT) == ["/.trash/0"]
    assert log.crash_plan().steps == (Discard("/d/a", SUB), Discard("/d/c", SUB))


def test_undo_goes_newest_first_across_data_and_names():
    log, disk = one_file(b"abc")
    log.create("create", "/a", [ROOT])
    disk.write(log, FILE, 0, b"X")
    log.rename("/a", "/b", [ROOT])
    assert log.crash_plan().steps == (Move("/b", "/a"), SetSize(FILE, 3), PutBytes(FILE, 0, b"a"), Discard("/a", ROOT))
    assert log.crash_plan().report == CrashReport(writes_dropped=1, bytes_dropped=1, namespace_undone=2)


def test_the_report_survives_json():
    report = CrashReport(1, 2, 3, 4, 5, TornWrite("/a", 6, 7, 8), ("move /a -> /b: No such file",))
    assert CrashReport.from_dict(report.to_dict()) == report
    assert CrashReport.from_dict(CrashReport().to_dict()) == CrashReport()


# -- the property: a crash keeps exactly the durable operations, replayed in order --

DIRS = {"/": ROOT, "/d/": SUB}
NAMES = ("a", "b", "c")


@dataclass
class Twin:
    """The naive model: every operation in a list; durability decided at the end; then the durable
    ones replayed from an empty disk."""

    ops: list[tuple] = field(default_factory=list)
    forced: set[int] = field(default_factory=set)  # a torn write's prefix, which reached the disk

    def durable(self, index: int) -> bool:
        if index in self.forced:
            return True
        op = self.ops[index]
        later = self.ops[index + 1:]
        if op[0] in ("write", "truncate"):
            syncs = [o for o in later if o[0] in ("fsync", "fsync_failed") and o[1] == op[1]]
            return bool(syncs) and syncs[0][0] == "fsync"
        dirs = {_dir_of(p) for p in _names_of(op)}
        if all(any(o[0] == "fsyncdir" and o[1] == d for o in later) for d in dirs):
            return True
        # A durable change of a name keeps the change of that name before it.
        return any(self._previous_change(j, path) == index and self.durable(j)
                   for j in range(index + 1, len(self.ops)) for path in _names_of(self.ops[j]))

    def _previous_change(self, index: int, path: str) -> int | None:
        return max((i for i in range(index) if path in _names_of(self.ops[i])), default=None)

    def replay(self) -> dict[str, bytes]:
        names: dict[str, int] = {}
        files: dict[int, bytearray] = {}
        for index, op in enumerate(self.ops):
            if op[0] in ("fsync", "fsync_failed", "fsyncdir") or not self.durable(index):
                continue
            if op[0] == "create":
                assert op[1] not in names
                names[op[1]] = op[2]
            elif op[0] == "unlink":
                del names[op[1]]
            elif op[0] == "rename":
                names[op[2]] = names.pop(op[1])
            elif op[0] == "write":
                content = files.setdefault(op[1], bytearray())
                _, _, offset, data = op
                content.extend(bytes(max(0, offset - len(content))))
                content[offset:offset + len(data)] = data
            else:
                content = files.setdefault(op[1], bytearray())
                del content[op[2]:]
                content.extend(bytes(op[2] - len(content)))
        return {path: bytes(files.get(file, b"")) for path, file in names.items()}


def _dir_of(path: str) -> str:
    return path[:path.rindex("/") + 1]


def _names_of(op: tuple) -> tuple[str, ...]:
    return op[1:3] if op[0] == "rename" else op[1:2] if op[0] in ("create", "unlink") else ()


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_crash_keeps_exactly_the_durable_operations(data):
    log, disk, twin = PendingLog(), Disk(), Twin()
    next_file = FILE
    for _ in range(data.draw(st.integers(0, 40), label="steps")):
        existing = sorted(p for p in disk.names if not p.startswith("/.trash"))
        free = [d + n for d in DIRS for n in NAMES if d + n not in disk.names]
        kinds = ["fsyncdir"] + ["create"] * bool(free)
        kinds += ["write", "truncate", "fsync", "fsync_failed", "unlink", "rename"] * bool(existing)
        kind = data.draw(st.sampled_from(kinds), label="op")
        if kind == "fsyncdir":
            directory = data.draw(st.sampled_from(sorted(DIRS)))
            for trash in log.fsyncdir(DIRS[directory]):
                del disk.names[trash]
            twin.ops.append(("fsyncdir", directory))
        elif kind == "create":
            path = data.draw(st.sampled_from(free))
            next_file += 1
            disk.files[next_file] = bytearray()
            disk.names[path] = next_file
            log.create("create", path, [DIRS[_dir_of(path)]])
            twin.ops.append(("create", path, next_file))
        elif kind == "unlink":
            path = data.draw(st.sampled_from(existing))
            trash = f"/.trash/{disk.trash}"
            disk.trash += 1
            disk.names[trash] = disk.names.pop(path)
            log.remove("unlink", path, trash, [DIRS[_dir_of(path)]])
            twin.ops.append(("unlink", path))
        elif kind == "rename":
            old = data.draw(st.sampled_from(existing))
            new = data.draw(st.sampled_from([p for p in existing + free if p != old]))
            replaced = None
            if new in disk.names:
                replaced = f"/.trash/{disk.trash}"
                disk.trash += 1
                disk.names[replaced] = disk.names[new]
            disk.names[new] = disk.names.pop(old)
            dirs = {_dir_of(old), _dir_of(new)}
            log.rename(old, new, [DIRS[d] for d in dirs], replaced_trash=replaced)
            twin.ops.append(("rename", old, new))
        else:
            file = disk.names[data.draw(st.sampled_from(existing))]
            size = len(disk.files[file])
            if kind == "write":
                offset = data.draw(st.integers(0, size + 4))
                payload = data.draw(st.binary(min_size=1, max_size=8))
                disk.write(log, file, offset, payload)
                twin.ops.append(("write", file, offset, payload))
            elif kind == "truncate":
                length = data.draw(st.integers(0, size + 4))
                disk.truncate(log, file, length)
                twin.ops.append(("truncate", file, length))
            elif kind == "fsync":
                log.fsync(file)
                twin.ops.append(("fsync", file))
            else:
                log.fsync_failed(file)
                twin.ops.append(("fsync_failed", file))
    tear = data.draw(st.booleans(), label="tear")
    report = crash(log, disk, random.Random(7) if tear else None)
    if report.torn is not None and report.torn.kept:
        index = max(i for i, op in enumerate(twin.ops) if op[0] == "write" and not twin.durable(i))
        _, file, offset, payload = twin.ops[index]
        twin.ops[index] = ("write", file, offset, payload[:report.torn.kept])
        twin.forced.add(index)
    assert disk.tree() == twin.replay()
