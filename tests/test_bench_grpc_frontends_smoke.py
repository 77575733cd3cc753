"""Smoke test of the gRPC front-end microbenchmark (scripts/bench_grpc_frontends.py): grpcio's servers only."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import bench_grpc_frontends as frontends  # noqa: E402
from bench_load import Figures  # noqa: E402

TINY = frontends.Config(processes=2, in_flight=4, duration=0.5, warmup=0.2)
FIGURES = Figures(ops=100, ops_per_s=50.0, p50_ms=2.0, p99_ms=4.0, errors=0, first_error="", client_cpu=0.5,
                  server_cpu=1.0, other_cpu=0.1)


def test_the_asyncio_and_the_threaded_servers_answer_every_call():
    for front_end in frontends.front_ends("aio,threads-1"):
        figures = frontends.measure(front_end, TINY, Console(quiet=True))
        for load, f in figures.items():
            assert f.errors == 0, f"{front_end.key} {load}: {f.first_error}"
            assert f.ops > 0 and 0 < f.p50_ms <= f.p99_ms and f.server_cpu > 0, (front_end.key, load)


def test_every_front_end_has_a_row_and_json():
    results = {front_end: dict.fromkeys(frontends.LOADS, FIGURES) for front_end in frontends.FRONT_ENDS}
    out = io.StringIO()
    Console(file=out, width=250).print(frontends.table(results, TINY))
    assert all(front_end.label in out.getvalue() for front_end in frontends.FRONT_ENDS)
    rows = json.loads(json.dumps(frontends.as_json(results)))
    assert [row["key"] for row in rows] == [front_end.key for front_end in frontends.FRONT_ENDS]
    assert rows[0]["concurrent"]["server_us_per_call"] == 20_000  # 1 core at 50 calls/s
