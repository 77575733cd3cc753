"""`python -m raftkv.powerloss BACKING MOUNT`: serve the power-loss filesystem on MOUNT, taking commands on stdin.

Prints `mounted` once the mount is usable, then answers each command line with one JSON line:

    crash | crash tear SEED     the power cut: unmount, undo what was not durable (with `tear`, the
                                last unsynced write keeps a prefix chosen by SEED), answer the report, exit
    delay fsync MS              every fsync and fsyncdir first sleeps MS milliseconds (0: off)
    fail read GLOB              EIO for reads of files whose path under the mount matches the fnmatch GLOB
    fail fsync GLOB             likewise for fsync, which also poisons the file's unsynced writes
    heal                        no more faults
    stop                        clean unmount, everything kept (also what the end of input does)

A bad command gets `{"error": ...}`; the others `{"ok": true}`. An unmount from outside is a clean stop.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Union

from raftkv.powerloss.fs import Faults, PowerLossFS
from raftkv.powerloss.fuse_mount import serve

MOUNT_TIMEOUT = 10.0
END_TIMEOUT = 30.0  # from the unmount to libfuse's return: operations still running have this long
# libfuse's loop ends on one of these only when its own thread takes the signal (libfuse 3.14's
# handler sets a flag; only the loop's thread is woken by it, see docs/chaos.md#power-loss).
LOOP_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


@dataclass(frozen=True)
class Crash:
    tear_seed: int | None = None


@dataclass(frozen=True)
class DelayFsync:
    ms: int


@dataclass(frozen=True)
class Fail:
    op: str
    glob: str


@dataclass(frozen=True)
class Heal:
    pass


@dataclass(frozen=True)
class Stop:
    pass


Command = Union[Crash, DelayFsync, Fail, Heal, Stop]
USAGE = "crash, crash tear SEED, delay fsync MS, fail read GLOB, fail fsync GLOB, heal, stop"


def parse_command(line: str) -> Command:
    match line.strip().split(maxsplit=2):
        case ["crash"]:
            return Crash()
        case ["crash", "tear", seed]:
            return Crash(_number(seed, "the seed"))
        case ["delay", "fsync", ms]:
            return DelayFsync(_number(ms, "the delay"))
        case ["fail", ("read" | "fsync") as op, glob]:
            return Fail(op, glob)
        case ["heal"]:
            return Heal()
        case ["stop"]:
            return Stop()
    raise ValueError(f"unknown command {line.strip()!r}; the commands are: {USAGE}")


def _number(text: str, what: str) -> int:
    if not text.isdigit():
        raise ValueError(f"{what} must be a whole number of 0 or more, not {text!r}")
    return int(text)


def with_command(faults: Faults, command: DelayFsync | Fail | Heal) -> Faults:
    if isinstance(command, DelayFsync):
        return replace(faults, fsync_delay_ms=command.ms)
    if isinstance(command, Fail):
        return replace(faults, **{f"fail_{command.op}": command.glob})
    return Faults()


class Session:
    """The command loop (its own thread) and the end of the process (the main thread, once
    libfuse has returned and no operation is in flight any more)."""

    def __init__(self, fs: PowerLossFS, mount: str):
        self.fs = fs
        self.mount = mount
        self.ending: Crash | Stop | None = None  # None: end of input, or an unmount from outside
        self.ended = False  # whether this side unmounted
        self.served = threading.Event()  # libfuse's loop has returned

    def say(self, line: str) -> None:
        try:
            print(line, flush=True)
        except (BrokenPipeError, ValueError):
            pass  # nobody listens any more; the filesystem still has to end properly

    def answer(self, fields: dict[str, Any]) -> None:
        self.say(json.dumps(fields))

    def serve_commands(self) -> None:
        # Libfuse's own threads block these; so must this one, or the kernel may hand it the
        # SIGTERM meant for the loop, and the crash would wait for a request that never comes.
        signal.pthread_sigmask(signal.SIG_BLOCK, LOOP_SIGNALS)
        deadline = time.monotonic() + MOUNT_TIMEOUT
        while not os.path.ismount(self.mount):
            if time.monotonic() > deadline:
                print(f"powerloss: {self.mount} was not mounted after {MOUNT_TIMEOUT:.0f} s", file=sys.stderr,
                      flush=True)
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.01)
        self.say("mounted")
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                command = parse_command(line)
            except ValueError as error:
                self.answer({"error": str(error)})
                continue
            if isinstance(command, (Crash, Stop)):
                self.end(command)
                return
            self.fs.set_faults(with_command(self.fs.faults, command))
            self.answer({"ok": True})
        self.end(None)

    def end(self, command: Crash | Stop | None) -> None:
        """Unmount, and wait for libfuse's loop to return; if it does not, answer why and exit."""
        self.ending = command
        self.ended = True
        unmount = subprocess.run(["fusermount3", "-u", self.mount], capture_output=True, text=True)
        if unmount.returncode != 0:
            # Busy: libfuse's own exit on SIGTERM closes the connection (whoever still uses the
            # mount gets ENOTCONN, as from a dead disk) and unmounts lazily.
            held = ", ".join(holders(self.mount)) or "no process now"
            print(f"powerloss: {unmount.stderr.strip() or 'fusermount3 -u failed'} (held by {held}); closing "
                  "the connection", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGTERM)
        if not self.served.wait(END_TIMEOUT):
            running = ", ".join(self.fs.in_flight()) or "no operation in flight"
            self.answer({"error": f"the filesystem did not stop within {END_TIMEOUT:.0f} s of its unmount "
                                  f"({running}); nothing was undone"})
            sys.stdout.flush()
            os._exit(1)

    def finish(self) -> None:
        if isinstance(self.ending, Crash):
            seed = self.ending.tear_seed
            report = self.fs.crash(random.Random(seed) if seed is not None else None)
            self.answer(report.to_dict())
            return
        self.fs.close()
        if isinstance(self.ending, Stop):
            self.answer({"ok": True})


def holders(mount: str) -> list[str]:
    """The processes with a file, a working directory or a mapping under `mount`: what keeps it busy."""
    inside = re.compile(rf"{re.escape(mount.rstrip('/'))}(/|$)")
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            links = [os.readlink(f"/proc/{pid}/cwd"), *(os.readlink(f"/proc/{pid}/fd/{fd}")
                                                       for fd in os.listdir(f"/proc/{pid}/fd"))]
            with open(f"/proc/{pid}/maps") as maps:
                links += [line.split(maxsplit=5)[-1].strip() for line in maps]
            with open(f"/proc/{pid}/comm") as comm:
                name = comm.read().strip()
        except OSError:
            continue  # gone, or not ours to read
        if any(inside.match(link) for link in links):
            found.append(f"{pid} ({name})")
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m raftkv.powerloss BACKING MOUNT", file=sys.stderr)
        return 2
    backing, mount = (os.path.abspath(arg) for arg in argv)
    if not os.path.isdir(backing):
        print(f"powerloss: the backing directory {backing} does not exist", file=sys.stderr)
        return 1
    if os.path.ismount(mount):
        print(f"powerloss: {mount} is a mount point already", file=sys.stderr)
        return 1
    fs = PowerLossFS(backing)
    session = Session(fs, mount)
    threading.Thread(target=session.serve_commands, name="powerloss-commands", daemon=True).start()
    try:
        serve(fs, mount)
    except Exception as error:
        if not session.ended:  # else it is libfuse's exit code after the SIGTERM of a busy unmount
            print(f"powerloss: cannot serve {mount}: {error}", file=sys.stderr)
            return 1
    session.served.set()
    session.finish()
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # not sys.exit: the command thread may still be blocked reading stdin
