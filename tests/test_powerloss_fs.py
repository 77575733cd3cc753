"""fs, through a real FUSE mount driven by PowerLossDisk: each POSIX case of what a power cut keeps, of
file data and of names."""

from __future__ import annotations

import errno
import os

import pytest

from raftkv.powerloss import TornWrite, unavailable_reason
from raftkv.powerloss.fs import TRASH
from tests.powerloss_disks import disk, durable, fsync, new_disk, put, tree

pytestmark = pytest.mark.skipif(bool(unavailable_reason()), reason=unavailable_reason() or "FUSE is available")


# -- data ------------------------------------------------------------------------

def test_an_unsynced_write_is_lost_and_an_fsynced_one_kept(disk):
    root = durable(disk, {"f": b""})
    with open(root / "f", "ab") as f:
        f.write(b"durable")
        f.flush()
        os.fsync(f.fileno())
        f.write(b"-lost")
    assert (root / "f").read_bytes() == b"durable-lost"
    report = disk.crash()
    assert (disk.backing / "f").read_bytes() == b"durable"
    assert (report.writes_dropped, report.bytes_dropped, report.failed_undo) == (1, 5, ())
    disk.mount()  # after the power cut, as a restarted node finds its data dir
    assert (root / "f").read_bytes() == b"durable"


@pytest.mark.parametrize("synced", [False, True])
def test_a_truncate_is_undone_unless_fsynced(disk, synced):
    root = durable(disk, {"f": b"0123456789", "g": b"abcdef"})
    fd = os.open(root / "f", os.O_RDWR)
    os.ftruncate(fd, 3)
    if synced:
        os.fsync(fd)
    os.close(fd)
    with open(root / "g", "wb"):  # O_TRUNC on open
        pass
    disk.crash()
    assert tree(disk.backing) == {"f": b"012" if synced else b"0123456789", "g": b"abcdef"}


def test_a_torn_write_keeps_a_prefix_of_the_last_unsynced_write(new_disk):
    kept = set()
    for seed in range(3):
        disk = new_disk()
        root = durable(disk, {"f": b"." * 100})
        fd = os.open(root / "f", os.O_WRONLY)
        os.pwrite(fd, b"a" * 50, 20)
        os.close(fd)
        report = disk.crash(tear=True, seed=seed)
        assert report.torn == TornWrite("/f", 20, 50, report.torn.kept) and 0 <= report.torn.kept < 50
        k = report.torn.kept
        assert (disk.backing / "f").read_bytes() == b"." * 20 + b"a" * k + b"." * (80 - k)
        kept.add(k)
    assert len(kept) > 1


def test_fsyncgate_a_failed_fsync_loses_the_data_even_after_a_later_fsync_succeeds(disk):
    root = durable(disk, {"f": b"old!", "g": b""})
    fd = os.open(root / "f", os.O_RDWR)
    os.pwrite(fd, b"new!", 0)
    disk.fail("fsync", "f")
    for _ in range(2):
        with pytest.raises(OSError) as failed:
            os.fsync(fd)
        assert failed.value.errno == errno.EIO
    fsync(root / "g")  # other files are fine
    disk.heal()
    os.fsync(fd)
    os.close(fd)
    assert (root / "f").read_bytes() == b"new!"  # the page cache still has it
    report = disk.crash()
    assert (disk.backing / "f").read_bytes() == b"old!"
    assert report.poisoned_dropped == 1
    assert [line for line in disk.stderr_lines if "injected" in line] == ["powerloss: injected EIO on fsync of /f"]


# -- names -----------------------------------------------------------------------

@pytest.mark.parametrize("synced", [False, True])
def test_a_create_is_lost_unless_its_directory_is_fsynced(disk, synced):
    root = disk.mount_point
    put(root / "f", b"data", sync=True)  # the file's data is durable; its name is not
    if synced:
        fsync(root)
    disk.crash()
    assert tree(disk.backing) == ({"f": b"data"} if synced else {})


@pytest.mark.parametrize("synced", [False, True])
def test_a_rename_and_a_replacing_rename(disk, synced):
    root = durable(disk, {"a": b"A", "b": b"B", "c": b"C"})
    os.rename(root / "a", root / "x")
    os.rename(root / "b", root / "c")
    if synced:
        fsync(root)
    disk.crash()
    assert tree(disk.backing) == ({"x": b"A", "c": b"B"} if synced else {"a": b"A", "b": b"B", "c": b"C"})


@pytest.mark.parametrize("fsynced", [(), ("sub",), ("",), ("", "sub")])
def test_a_rename_across_directories_needs_both_fsynced(disk, fsynced):
    root = durable(disk, {"a": b"A"}, dirs=("sub",))
    os.rename(root / "a", root / "sub" / "a")
    for name in fsynced:
        fsync(root / name)
    disk.crash()
    moved = len(fsynced) == 2
    assert tree(disk.backing) == ({"sub": "dir", "sub/a": b"A"} if moved else {"a": b"A", "sub": "dir"})


def test_a_directory_fsync_covers_that_directory_only(disk):
    root = durable(disk, {}, dirs=("sub",))
    put(root / "a", b"1", sync=True)
    put(root / "sub" / "b", b"2", sync=True)
    fsync(root / "sub")
    disk.crash()
    assert tree(disk.backing) == {"sub": "dir", "sub/b": b"2"}


def test_an_unlink_is_undone_into_its_own_directory_wherever_that_went(disk):
    """Found with the chaos harness: an engine's snapshot install renames db to db.old and a new
    db in; an unlink in the old db that was not durable came back, after a power cut, into the new
    one by its path, over a table file of the same name. It belongs in the old db, now db.old."""
    root = durable(disk, {"db/f": b"old table"}, dirs=("db",))
    os.unlink(root / "db" / "f")
    (root / "new").mkdir()
    put(root / "new" / "f", b"new table", sync=True)
    fsync(root / "new")
    os.rename(root / "db", root / "db.old")
    os.rename(root / "new", root / "db")
    fsync(root)
    report = disk.crash()
    assert tree(disk.backing) == {"db": "dir", "db/f": b"new table", "db.old": "dir", "db.old/f": b"old table"}
    assert report.failed_undo == ()


def test_a_snapshot_install_is_undone_without_a_failed_step(disk):
    """The engine's install as chaos runs it under load (issue 32): the new database made in a
    temporary directory and moved in through db.incoming, the old one removed, the temporary
    directory removed; only the new tree and the partition's folder are fsynced. The cut keeps the
    new database and puts back what was removed without a sync, each file in its own directory."""
    root = durable(disk, {"p/db/000013.log": b"old wal"}, dirs=("p", "p/db"))
    os.unlink(root / "p" / "db" / "000013.log")  # RocksDB drops a log; nobody syncs db for that
    (root / "p" / "install-x").mkdir()
    (root / "p" / "install-x" / "db").mkdir()
    put(root / "p" / "install-x" / "db" / "000020.sst", b"new table")
    os.rename(root / "p" / "install-x" / "db", root / "p" / "db.incoming")
    fsync(root / "p" / "db.incoming" / "000020.sst")
    fsync(root / "p" / "db.incoming")
    os.rename(root / "p" / "db", root / "p" / "db.old")
    os.rename(root / "p" / "db.incoming", root / "p" / "db")
    fsync(root / "p")
    os.rmdir(root / "p" / "db.old")
    os.rmdir(root / "p" / "install-x")
    report = disk.crash()
    assert report.failed_undo == ()
    assert tree(disk.backing) == {"p": "dir", "p/db": "dir", "p/db/000020.sst": b"new table", "p/db.old": "dir",
                                  "p/db.old/000013.log": b"old wal", "p/install-x": "dir"}


def test_a_directory_removed_for_good_takes_its_unlinks_with_it(disk):
    """Found with the chaos harness's wipe: rm -r of a directory, its parent fsynced, the same name
    made again; a power cut then moved the old file back into the new directory (its unlink was
    never durable: nobody can fsync a directory that is gone)."""
    root = durable(disk, {"d/f": b"old"}, dirs=("d",))
    os.unlink(root / "d" / "f")
    os.rmdir(root / "d")
    fsync(root)
    (root / "d").mkdir()
    put(root / "d" / "g", b"new")  # not durable: the new directory is never fsynced
    fsync(root)
    disk.crash()
    assert tree(disk.backing) == {"d": "dir"}


@pytest.mark.parametrize("synced", [False, True])
def test_an_unlinked_file_comes_back_unless_its_directory_is_fsynced(disk, synced):
    root = durable(disk, {"f": b"old"})
    fd = os.open(root / "f", os.O_RDWR)
    os.unlink(root / "f")
    os.pwrite(fd, b"new", 0)  # still open: hard_remove hands the unlink straight to the filesystem
    os.fsync(fd)
    assert os.pread(fd, 3, 0) == b"new"
    os.close(fd)
    assert os.listdir(root) == []  # the trash is hidden
    with pytest.raises(FileNotFoundError):
        os.stat(root / TRASH)
    if synced:
        fsync(root)
    report = disk.crash()
    assert tree(disk.backing) == ({} if synced else {"f": b"new"})
    assert not (disk.backing / TRASH).exists()
    assert report.namespace_undone == (0 if synced else 1)


@pytest.mark.parametrize("synced", [False, True])
def test_links_are_lost_unless_their_directory_is_fsynced(disk, synced):
    root = durable(disk, {"a": b"A"})
    os.link(root / "a", root / "b")
    os.symlink("a", root / "s")
    if synced:
        fsync(root)
    disk.crash()
    assert tree(disk.backing) == ({"a": b"A", "b": b"A", "s": b"A"} if synced else {"a": b"A"})
    assert (disk.backing / "s").is_symlink() == synced


@pytest.mark.parametrize("synced", [False, True])
def test_mkdir_and_rmdir(disk, synced):
    root = durable(disk, {}, dirs=("old",))
    os.rmdir(root / "old")
    (root / "new").mkdir()
    put(root / "new" / "f", b"x", sync=True)
    fsync(root / "new")  # the file in it is durable, but not the directory's own name
    if synced:
        fsync(root)
    disk.crash()
    assert tree(disk.backing) == ({"new": "dir", "new/f": b"x"} if synced else {"old": "dir"})


@pytest.mark.parametrize("synced", [False, True])
def test_a_rename_over_an_empty_directory(disk, synced):
    root = durable(disk, {"x/f": b"f"}, dirs=("x", "y"))
    os.rename(root / "x", root / "y")
    if synced:
        fsync(root)
    disk.crash()
    assert tree(disk.backing) == ({"y": "dir", "y/f": b"f"} if synced else {"x": "dir", "x/f": b"f", "y": "dir"})
