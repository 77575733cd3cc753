"""The README's pictures of the web console (docs/console.md), made, not drawn by hand.

Starts a local 4-node cluster (8 partitions, RF 3) under a stream of puts, moves a replica while the
copy is slowed by a fail point, and has Debian's headless Chromium take the overview and the placement
grid during the move:

    python scripts/screenshots.py                 # writes docs/images/console-{overview,placement}.png
    python scripts/screenshots.py --out /tmp/shots
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from raftkv.client.sync_client import Client  # noqa: E402
from raftkv.core.partitioning import partition_for_key  # noqa: E402
from raftkv.core.spec import Tuning, build_spec, ports_per_node  # noqa: E402
from raftkv.core.spec_toml import save_spec  # noqa: E402
from raftkv.dev.local_cluster import LocalCluster, free_port_block  # noqa: E402

PARTITIONS = 8
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic", "--hide-scrollbars"]


def shoot(chromium: str, url: str, path: Path, size: str) -> None:
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([chromium, *FLAGS, f"--user-data-dir={profile}", f"--window-size={size}",
                        "--virtual-time-budget=4000", f"--screenshot={path}", url],
                       check=True, capture_output=True, timeout=60)
    print(f"wrote {path}")


def _moves(url: str) -> list[dict]:
    with urllib.request.urlopen(f"{url}api/moves", timeout=5) as reply:
        return json.load(reply)["under_way"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    args = parser.parse_args()
    chromium = shutil.which("chromium") or sys.exit("needs Debian's chromium: apt-get install chromium")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        spec = build_spec(nodes=4, partitions=PARTITIONS, replication=3,
                          base_port=free_port_block(4 * ports_per_node(PARTITIONS)), data_dir=folder,
                          durability="lose-last-second")
        spec = dataclasses.replace(spec, tuning=Tuning(rebalance_interval=0))
        cluster = LocalCluster(spec, save_spec(spec, folder / "cluster.toml"),
                               env={"RAFTKV_FAILPOINTS": "checkpoint-read-before=delay(1000)"})
        stop = threading.Event()
        try:
            cluster.start_all()
            cluster.wait_ready(timeout=60)
            url = f"http://127.0.0.1:{spec.nodes[0].metrics_port}/"
            with Client(cluster.endpoints, timeout=10) as kv:
                p, source, target = next((p, v[-1], t) for p, v in enumerate(kv.topology().meta.placement)
                                         for t in spec.node_ids if t not in v)
                big = [k for k in (b"big-%05d" % i for i in range(2000)) if partition_for_key(k, PARTITIONS) == p]
                for key in big[:40]:  # 10 MB: a copy of ten seconds
                    kv.put(key, os.urandom(256 * 1024))

                def load() -> None:
                    i = 0
                    while not stop.is_set():
                        kv.put(b"key-%06d" % i, b"value")
                        kv.get(b"key-%06d" % (i // 2))
                        i += 1

                loader = threading.Thread(target=load, daemon=True)
                loader.start()
                try:
                    time.sleep(3)  # a few seconds of rates in the nodes' ring buffers
                    kv.move_replica(p, source, target)
                    deadline = time.monotonic() + 20
                    while not any((m["bytes"] or 0) > 0 for m in _moves(url)) and time.monotonic() < deadline:
                        time.sleep(0.1)
                    shoot(chromium, f"{url}placement", args.out / "console-placement.png", "1280,420")
                    shoot(chromium, url, args.out / "console-overview.png", "1280,470")
                finally:
                    stop.set()
                    loader.join()
        finally:
            for node_id in list(cluster.procs):
                cluster.kill(node_id)


if __name__ == "__main__":
    main()
