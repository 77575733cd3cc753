"""The long fuzzing run: the fuzz tests of `make test`, with many more inputs, and one table of what was sent.

    .venv/bin/python scripts/fuzz.py                    # scale 20: about 180,000 inputs
    .venv/bin/python scripts/fuzz.py --scale 2 --seed 7 # a short run, the live cluster's inputs seeded

The tests are tests/test_fuzz_cluster.py (a live TLS cluster: gRPC methods, raw bytes to every port,
hostile Raft hub frames) and tests/test_fuzz_files.py, test_fuzz_frames.py, test_fuzz_cli.py (specs, backup manifests, hub frames and CLI
arguments, in process). Each input count of `make test` is multiplied by --scale. The figures go in
docs/security.md §7; a failure prints pytest's report, with the seed that replays it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
TESTS = ["tests/test_fuzz_cluster.py", "tests/test_fuzz_files.py", "tests/test_fuzz_frames.py", "tests/test_fuzz_cli.py"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=20, help="times the inputs of `make test` (default 20)")
    parser.add_argument("--seed", type=int, default=None, help="the live cluster's input seed (default: random)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "fuzz.jsonl"
        env = {**os.environ, "RAFTKV_FUZZ_SCALE": str(args.scale), "RAFTKV_FUZZ_REPORT": str(report)}
        if args.seed is not None:
            env["RAFTKV_FUZZ_SEED"] = str(args.seed)
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-s", *TESTS],
                             cwd=ROOT, env=env, capture_output=True, text=True)
        lines = [json.loads(line) for line in report.read_text().splitlines()] if report.exists() else []
    console = Console()
    console.print(_table(lines, args.scale))
    if run.returncode != 0:
        console.print(run.stdout[-20000:], markup=False, highlight=False)
        console.print(run.stderr[-5000:], markup=False, highlight=False)
    return run.returncode


def _table(lines: list[dict], scale: float) -> Table:
    table = Table(title=f"fuzzing at scale {scale:g}")
    for column in ("target", "inputs", "seconds", "how they ended", "findings"):
        table.add_column(column, justify="right" if column in ("inputs", "seconds", "findings") else "left")
    for line in lines:
        outcomes = ", ".join(f"{name} {count:,}" for name, count in line.get("outcomes", {}).items())
        table.add_row(line["target"], f"{line['inputs']:,}", f"{line['seconds']:.0f}", outcomes,
                      str(len(line["findings"])))
    table.add_row("all", f"{sum(line['inputs'] for line in lines):,}",
                  f"{sum(line['seconds'] for line in lines):.0f}", "",
                  str(sum(len(line["findings"]) for line in lines)), style="bold")
    return table


if __name__ == "__main__":
    sys.exit(main())
