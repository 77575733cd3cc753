"""The machine, the versions, and the physical ceiling of the disk the benchmark writes to."""

from __future__ import annotations

import os
import platform
import random
import shutil
import subprocess
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Callable

from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from bench_load import VALUE_BYTES, key, percentile

REPO = Path(__file__).resolve().parent.parent
WRITE_BATCH_PUTS = 1000


def machine(data_dir: Path) -> dict[str, str]:
    return {
        "nproc": str(os.cpu_count()),
        "cpu": _cpu_model(),
        "memory": f"{_meminfo_kib('MemTotal') / 2**20:.1f} GiB",
        "disk": _disk(data_dir),
        "kernel": platform.release(),
        "load_average": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _meminfo_kib(field: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _disk(path: Path) -> str:
    """The filesystem holding `path`: type, device, mount point and size."""
    path = path.resolve()
    best = ("", "?", "?")
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, rest = line.partition(" - ")
        mount = fields.split()[4]
        if path.is_relative_to(mount) and len(mount) >= len(best[0]):
            fstype, source = rest.split()[:2]
            best = (mount, fstype, source)
    usage = shutil.disk_usage(path)
    mount, fstype, source = best
    return f"{fstype} on {source} (mounted at {mount}), {usage.total / 1e9:.0f} GB, {usage.free / 1e9:.0f} GB free"


def versions(etcd: str, etcd_client: str) -> dict[str, str]:
    return {
        "python": platform.python_version(),
        "raftkv": git_rev(),
        "etcd": etcd,
        "etcd client": etcd_client,
        "rocksdict": package_version("rocksdict"),
        "grpcio": package_version("grpcio"),
        "protobuf": package_version("protobuf"),
    }


def package_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def git_rev() -> str:
    """HEAD's short hash, '+dirty' when tracked files differ; read-only (no index refresh)."""
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, env=env).stdout.strip()

    rev = git("rev-parse", "--short", "HEAD") or "unknown"
    return rev + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


# -- the disk's ceiling ---------------------------------------------------------------


def disk_ceiling(folder: Path, seconds: float) -> dict[str, float]:
    """What one Python process gets from RocksDB and fdatasync on this disk, without Raft or network.

    put/s with the default write options (WAL, no sync), put/s through
    WriteBatches of 1000, put/s with sync=True (one WAL fdatasync each), and
    the latency of appending 100 bytes to a file and calling os.fdatasync.
    """
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    value = rng.randbytes(VALUE_BYTES)
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    db = Rdict(str(folder / "db"), options)
    sync = WriteOptions()
    sync.sync = True

    def write_batch() -> None:
        wb = WriteBatch(raw_mode=True)
        for _ in range(WRITE_BATCH_PUTS):
            wb.put(key(rng.randrange(10**9)), value)
        db.write(wb)

    try:
        figures = {
            "rocksdict_put_per_s": _rate(lambda: db.put(key(rng.randrange(10**9)), value), seconds),
            "rocksdict_write_batch_puts_per_s": _rate(write_batch, seconds) * WRITE_BATCH_PUTS,
            "rocksdict_sync_put_per_s": _rate(lambda: db.put(key(rng.randrange(10**9)), value, sync), seconds),
        }
    finally:
        db.close()
    return figures | _fdatasync_latency(folder / "fdatasync.bin", seconds, value)


def _rate(call: Callable[[], None], seconds: float) -> float:
    count, start = 0, time.monotonic()
    while (elapsed := time.monotonic() - start) < seconds:
        call()
        count += 1
    return count / elapsed


def _fdatasync_latency(path: Path, seconds: float, record: bytes) -> dict[str, float]:
    latencies = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            os.write(fd, record)
            start = time.monotonic()
            os.fdatasync(fd)
            latencies.append(time.monotonic() - start)
    finally:
        os.close(fd)
    latencies.sort()
    return {"fdatasync_p50_ms": percentile(latencies, 0.5) * 1e3, "fdatasync_p99_ms": percentile(latencies, 0.99) * 1e3}
