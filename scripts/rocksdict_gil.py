"""Which rocksdict calls a worker thread can take off the event loop: each runs on a thread while this
one sleeps 1 ms at a time, and the longest it waited says whether the call held the GIL. Then how
long a checkpoint takes with what was written since the last flush (docs/benchmarks.md, "What the
write p99 is made of").

    .venv/bin/python scripts/rocksdict_gil.py [--dir /work]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import threading
import time
from typing import Callable

from rocksdict import Checkpoint, Options, Rdict, WriteBatch


def fill(db: Rdict, rows: int, value: bytes) -> None:
    batch = WriteBatch()
    for _ in range(rows):
        batch.put(os.urandom(16), value)
    db.write(batch)


def held(call: Callable[[], None]) -> tuple[float, float]:
    """(ms the call took on a thread, ms this thread waited at most meanwhile)."""
    done, took = threading.Event(), [0.0]

    def run() -> None:
        start = time.perf_counter()
        call()
        took[0] = time.perf_counter() - start
        done.set()

    worker, last, worst = threading.Thread(target=run), time.perf_counter(), 0.0
    worker.start()
    while not done.is_set():
        time.sleep(0.001)
        now = time.perf_counter()
        worst, last = max(worst, now - last), now
    worker.join()
    return took[0] * 1000, worst * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=None, help="where the scratch database goes (a temporary folder)")
    args = parser.parse_args()
    folder = tempfile.mkdtemp(dir=args.dir, prefix="rocksdict-gil-")
    options = Options()
    options.set_write_buffer_size(256 << 20)
    db = Rdict(f"{folder}/db", options)
    checkpoints = iter(range(1_000_000))

    def checkpoint() -> None:
        Checkpoint(db).create_checkpoint(f"{folder}/cp{next(checkpoints)}")

    try:
        print("call on a thread, 150,000 rows of 1 KB unflushed: took / the loop's longest wait")
        for name, call in (("flush_wal(True)", lambda: db.flush_wal(True)), ("flush(wait=True)", lambda: db.flush(True)),
                           ("create_checkpoint", checkpoint)):
            fill(db, 150_000, os.urandom(1000))
            took, waited = held(call)
            print(f"  {name:<18} {took:7.0f} ms / {waited:5.0f} ms")
        fill(db, 1_000_000, os.urandom(100))
        db.flush(True)
        print("create_checkpoint on 1,000,000 rows of 100 B, by rows written since the last flush (median of 5)")
        for rows in (0, 10_000, 30_000):
            times = []
            for _ in range(5):
                fill(db, rows, os.urandom(100))
                start = time.perf_counter()
                checkpoint()
                times.append((time.perf_counter() - start) * 1000)
            fill(db, rows, os.urandom(100))
            flushed, _ = held(lambda: db.flush(True))
            start = time.perf_counter()
            checkpoint()
            after = (time.perf_counter() - start) * 1000
            print(f"  {rows:>6} rows: {sorted(times)[2]:5.1f} ms (max {max(times):.1f}); "
                  f"flushed first ({flushed:.0f} ms), then {after:.1f} ms")
    finally:
        db.close()
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
