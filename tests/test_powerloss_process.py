"""The power-loss disk's process, through a real FUSE mount: injected faults, crashes, and its command
protocol."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import pytest

from raftkv.core.errors import ConfigError
from raftkv.powerloss import PowerLossDisk, unavailable_reason
from raftkv.powerloss.disk import is_mounted
from raftkv.powerloss.fs import TRASH
from tests.powerloss_disks import disk, durable, fsync, new_disk, put, tree  # `disk` asks for `new_disk`

pytestmark = pytest.mark.skipif(bool(unavailable_reason()), reason=unavailable_reason() or "FUSE is available")


# -- faults and the process ------------------------------------------------------

def test_an_injected_read_error_hits_matching_files_only_until_healed(disk):
    root = durable(disk, {"x1": b"x", "y1": b"y"})
    disk.fail("read", "x*")
    for _ in range(2):
        with pytest.raises(OSError) as failed:
            (root / "x1").read_bytes()
        assert failed.value.errno == errno.EIO
    assert (root / "y1").read_bytes() == b"y"
    assert [line for line in disk.stderr_lines if "injected" in line] == ["powerloss: injected EIO on read of /x1"]
    disk.heal()
    assert (root / "x1").read_bytes() == b"x"


def test_a_delayed_fsync_takes_that_long(disk):
    root = durable(disk, {"f": b"x"})

    def seconds(path: Path) -> float:
        start = time.monotonic()
        fsync(path)
        return time.monotonic() - start

    disk.slow_fsync(200)
    assert seconds(root / "f") >= 0.2 and seconds(root) >= 0.2
    disk.slow_fsync(0)
    assert seconds(root / "f") < 0.1


def test_a_clean_close_keeps_everything(disk):
    root = disk.mount_point
    put(root / "a", b"unsynced")
    (root / "d").mkdir()
    os.rename(root / "a", root / "d" / "a")
    disk.close()
    disk.close()
    assert tree(disk.backing) == {"d": "dir", "d/a": b"unsynced"}
    assert not (disk.backing / TRASH).exists()


def test_a_crash_with_a_file_still_open_cuts_its_holder_off(disk):
    root = durable(disk, {"f": b"old"})
    fd = os.open(root / "f", os.O_RDWR)
    os.pwrite(fd, b"new", 0)
    try:
        report = disk.crash()  # fusermount3 -u fails (busy): the process closes the connection instead
        assert report.writes_dropped == 1 and (disk.backing / "f").read_bytes() == b"old"
        assert any(f"held by {os.getpid()} (" in line for line in disk.stderr_lines), disk.stderr_lines
        assert not is_mounted(disk.mount_point)
        with pytest.raises(OSError) as failed:
            os.pwrite(fd, b"more", 0)
        assert failed.value.errno == errno.ENOTCONN
    finally:
        try:
            os.close(fd)
        except OSError:
            pass  # its flush cannot reach the dead disk


def test_only_the_loop_thread_can_take_the_signal_that_ends_the_loop(disk):
    """Issue 32: a crash on a busy mount ends libfuse's loop with a SIGTERM to its own process.
    Libfuse 3.14's handler only sets a flag, which the loop sees only if the signal interrupted
    its own (the main) thread. The kernel may hand a process's signal to any thread that does not
    block it: given to the command thread, the crash waited for a request that never came."""
    sigterm = 1 << (signal.SIGTERM - 1)
    blocked = {}
    for task in Path(f"/proc/{disk.pid}/task").iterdir():
        status = dict(line.split(":\t", 1) for line in (task / "status").read_text().splitlines() if ":\t" in line)
        blocked[int(task.name)] = int(status["SigBlk"], 16) & sigterm
    assert blocked.pop(disk.pid) == 0, "the loop's thread must take SIGTERM"
    assert len(blocked) >= 2 and all(blocked.values()), "the command thread and libfuse's workers block it"


def test_a_crash_whose_process_dies_says_so_with_its_last_words(disk):
    """Never a silent wait: the crash names the exit, not a timeout that may or may not have passed."""
    os.kill(disk.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while not _stopped(disk.pid):  # else a thread already in read() may still take the command
        assert time.monotonic() < deadline, "the disk process did not stop"
        time.sleep(0.01)
    failed: list[ConfigError] = []
    asking = threading.Thread(target=lambda: failed.extend(_raised(disk.crash)))
    asking.start()
    while _unread(disk) == 0:  # the command is in the pipe: the process dies before reading it
        assert time.monotonic() < deadline, f"the crash command was never sent: {failed}"
        time.sleep(0.01)
    os.kill(disk.pid, signal.SIGKILL)
    asking.join(30)
    assert not asking.is_alive() and len(failed) == 1
    assert "did not answer 'crash': its process ended with code -9" in str(failed[0])


def _raised(call) -> list[ConfigError]:
    try:
        call()
    except ConfigError as error:
        return [error]
    return []


def _stopped(pid: int) -> bool:
    """Whether every thread of the process is stopped (the state after `)` in /proc's stat is T)."""
    return all((task / "stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
               for task in Path(f"/proc/{pid}/task").iterdir())


def _unread(disk: PowerLossDisk) -> int:
    """Bytes written to the disk process's stdin that it has not read yet."""
    return struct.unpack("i", fcntl.ioctl(disk._process.stdin.fileno(), termios.FIONREAD, b"\0" * 4))[0]


def test_close_unmounts_a_disk_whose_process_died(disk):
    os.kill(disk.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.listdir(disk.mount_point)
        except OSError as error:
            assert error.errno in (errno.ENOTCONN, errno.ECONNABORTED)
            break
        time.sleep(0.05)
    assert is_mounted(disk.mount_point)  # dead, and still in the way
    disk.close()
    assert not is_mounted(disk.mount_point) and os.listdir(disk.mount_point) == []


def test_mounting_over_files_is_refused(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "keep").write_bytes(b"")
    with pytest.raises(ConfigError, match="not empty"):
        PowerLossDisk(tmp_path / "data", tmp_path / "backing").mount()
    disk = PowerLossDisk(tmp_path / "data", tmp_path / "backing")
    with pytest.raises(ConfigError, match="read or fsync"):
        disk.fail("write", "*")


def test_the_process_answers_bad_commands_and_stops_cleanly(tmp_path):
    (tmp_path / "mnt").mkdir()
    (tmp_path / "b").mkdir()
    process = subprocess.Popen([sys.executable, "-m", "raftkv.powerloss", str(tmp_path / "b"), str(tmp_path / "mnt")],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
                               env={**os.environ, "FUSE_LIBRARY_NAME": "fuse3"})
    try:
        assert process.stdout.readline() == "mounted\n"
        answers = []
        for command in ("bogus", "delay fsync soon", "fail write *", "crash tear x", "", "fail read a b*", "heal",
                        "stop"):
            process.stdin.write(command + "\n")
            process.stdin.flush()
            if command:
                answers.append(json.loads(process.stdout.readline()))
        assert [sorted(a) for a in answers] == [["error"]] * 4 + [["ok"]] * 3
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if is_mounted(tmp_path / "mnt"):
            subprocess.run(["fusermount3", "-u", "-z", str(tmp_path / "mnt")])
    assert not is_mounted(tmp_path / "mnt")
