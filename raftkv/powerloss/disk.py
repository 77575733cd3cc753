"""A power-loss disk over one directory: starts and drives the `python -m raftkv.powerloss` process.

    disk = PowerLossDisk(node.data_dir, backing=tmp / "disk")   # the data dir must be empty
    disk.mount()
    disk.fail("fsync", "journal*")    # EIO, and the journal's unsynced writes are lost for good
    disk.slow_fsync(50)
    report = disk.crash(tear=True, seed=7)   # power cut: only what was durable is left in `backing`
    disk.close()                             # or a clean unmount that keeps everything

The process holds the filesystem; this side only talks to it, so a test that kills this process
still leaves a process that a `close()` elsewhere, or fusermount3 -u -z, can end.
"""

from __future__ import annotations

import collections
import ctypes.util
import importlib.util
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

from raftkv.core.errors import ConfigError
from raftkv.powerloss.pending import CrashReport

MOUNT_TIMEOUT = 15.0
COMMAND_TIMEOUT = 10.0
CRASH_TIMEOUT = 60.0  # unmounting, then undoing everything not durable
STDERR_LINES_KEPT = 200


def unavailable_reason() -> str:
    """'' when this process can mount the power-loss filesystem, else why not."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing (load the fuse module, or pass the device into the container)"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "/dev/fuse is not readable and writable by this user"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is missing (install the fuse3 package)"
    if ctypes.util.find_library("fuse3") is None:
        return "libfuse3 is missing (install the fuse3 package)"
    if importlib.util.find_spec("mfusepy") is None:
        return "mfusepy is not installed"
    return ""


def is_mounted(path: Path) -> bool:
    """Whether `path` is a mount point, a dead FUSE mount (which stat cannot reach) included."""
    target = os.path.abspath(path)
    with open("/proc/self/mountinfo") as mounts:
        # mountinfo writes a space in a path as \040, and so on
        return any(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), line.split()[4]) == target
                   for line in mounts)


class PowerLossDisk:
    def __init__(self, mount: Path, backing: Path):
        self.mount_point = Path(mount)
        self.backing = Path(backing)
        self._process: subprocess.Popen | None = None
        self._answers: queue.Queue[str | None] = queue.Queue()
        self._stderr_read = threading.Event()  # the process's stderr reached its end
        self.stderr_lines: collections.deque[str] = collections.deque(maxlen=STDERR_LINES_KEPT)

    def __enter__(self) -> PowerLossDisk:
        self.mount()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pid(self) -> int | None:
        """The filesystem process, while it runs."""
        return self._process.pid if self._process is not None else None

    def mount(self) -> None:
        reason = unavailable_reason()
        if reason:
            raise ConfigError(f"cannot mount a power-loss disk: {reason}", source="powerloss")
        if self.mount_point.exists() and not self.mount_point.is_dir():
            raise ConfigError(f"{self.mount_point} is not a directory to mount on", source="powerloss")
        self.mount_point.mkdir(parents=True, exist_ok=True)
        if any(self.mount_point.iterdir()):
            raise ConfigError(f"{self.mount_point} is not empty; the power-loss disk mounted over it would hide its "
                              "files", source="powerloss")
        self.backing.mkdir(parents=True, exist_ok=True)
        self._answers = queue.Queue()
        self._stderr_read = threading.Event()
        self._process = subprocess.Popen(
            [sys.executable, "-m", "raftkv.powerloss", str(self.backing), str(self.mount_point)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
            # mfusepy takes libfuse 2 when it finds both; this filesystem is written for libfuse 3
            env={**os.environ, "FUSE_LIBRARY_NAME": "fuse3"},
        )
        # Each process its own queue: the reader of the one before may still be putting its end.
        threading.Thread(target=_read_answers, args=(self._process.stdout, self._answers), daemon=True).start()
        threading.Thread(target=self._read_stderr, args=(self._process.stderr, self._stderr_read), daemon=True).start()
        first = self._next_answer(MOUNT_TIMEOUT)
        if first != "mounted":
            self._stop_process()
            self._unmount_if_left()
            said = "; ".join(self.stderr_lines) or "nothing"
            raise ConfigError(f"the power-loss disk did not mount on {self.mount_point} (it said: {said})",
                              source="powerloss")

    def crash(self, tear: bool = False, seed: int = 0) -> CrashReport:
        """The power cut: unmounts, keeps in `backing` only what was durable, and ends the process."""
        report = CrashReport.from_dict(self._ask(f"crash tear {seed}" if tear else "crash", CRASH_TIMEOUT))
        self._stop_process()
        return report

    def slow_fsync(self, ms: int) -> None:
        self._ask(f"delay fsync {int(ms)}")

    def fail(self, op: str, glob: str) -> None:
        """EIO on `op` ("read" or "fsync") of the files whose path under the mount matches `glob`."""
        if op not in ("read", "fsync"):
            raise ConfigError(f"a power-loss disk fails read or fsync, not {op!r}", source="powerloss")
        if not glob or "\n" in glob:
            raise ConfigError(f"a glob is one line, not {glob!r}", source="powerloss")
        self._ask(f"fail {op} {glob}")

    def heal(self) -> None:
        self._ask("heal")

    def close(self) -> None:
        """Unmount cleanly, keeping everything. Idempotent; if the process died, unmounts lazily."""
        if self._process is not None and self._process.poll() is None:
            try:
                self._ask("stop", COMMAND_TIMEOUT)
            except ConfigError:
                pass  # _stop_process below ends it all the same
        self._stop_process()
        self._unmount_if_left()

    # -- the process -----------------------------------------------------------

    def _ask(self, command: str, timeout: float = COMMAND_TIMEOUT) -> dict[str, Any]:
        if self._process is None or self._process.poll() is not None:
            raise ConfigError(f"the power-loss disk on {self.mount_point} is not mounted", source="powerloss")
        try:
            self._process.stdin.write(command + "\n")
            self._process.stdin.flush()
        except (BrokenPipeError, ValueError) as error:
            raise ConfigError(f"the power-loss disk process is gone: {error}", source="powerloss") from error
        try:
            line = self._answers.get(timeout=timeout)
        except queue.Empty:
            raise ConfigError(f"the power-loss disk did not answer {command!r} within {timeout:.0f} s; it said: "
                              f"{self._last_words()}", source="powerloss") from None
        if line is None:
            raise ConfigError(f"the power-loss disk did not answer {command!r}: its process ended with code "
                              f"{self._exit_code()}; it said: {self._last_words()}", source="powerloss")
        try:
            answer = json.loads(line)
        except json.JSONDecodeError:
            raise ConfigError(f"the power-loss disk answered {command!r} with {line!r}", source="powerloss") from None
        if "error" in answer:
            raise ConfigError(f"the power-loss disk failed {command!r}: {answer['error']}", source="powerloss")
        return answer

    def _exit_code(self) -> int | str:
        """Its output has ended: the process is exiting, and soon has a code."""
        try:
            return self._process.wait(COMMAND_TIMEOUT)
        except subprocess.TimeoutExpired:
            return "unknown (it closed its output and runs on)"

    def _last_words(self) -> str:
        if self._process.poll() is not None:
            self._stderr_read.wait(COMMAND_TIMEOUT)  # what it said last may still be in the pipe
        return "; ".join(list(self.stderr_lines)[-5:]) or "nothing"

    def _next_answer(self, timeout: float) -> str | None:
        try:
            return self._answers.get(timeout=timeout)
        except queue.Empty:
            return None

    def _read_stderr(self, stderr: IO[str], done: threading.Event) -> None:
        # Drained all along: a full pipe would block the filesystem in the middle of an operation.
        for line in stderr:
            self.stderr_lines.append(line.rstrip("\n"))
            print(line, end="", file=sys.stderr, flush=True)
        done.set()

    def _unmount_if_left(self) -> None:
        if is_mounted(self.mount_point):
            subprocess.run(["fusermount3", "-u", "-z", str(self.mount_point)], capture_output=True)

    def _stop_process(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.stdin:
            try:
                process.stdin.close()  # end of input: a clean stop
            except BrokenPipeError:
                pass
        try:
            process.wait(timeout=COMMAND_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.terminate()
            try:
                process.wait(timeout=COMMAND_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _read_answers(stdout: IO[str], answers: queue.Queue[str | None]) -> None:
    for line in stdout:
        answers.put(line.strip())
    answers.put(None)
