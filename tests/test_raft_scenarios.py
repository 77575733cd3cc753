"""The golden scenario scripts of tests/testdata/raft/, on the in-memory twin and on pysyncobj.

REWRITE=1 writes what the twin printed back into the scripts (then read the diff).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from tests.raft_scenarios import RealDriver, TwinDriver, run

SCRIPTS = sorted((Path(__file__).parent / "testdata" / "raft").glob("*.txt"))


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.stem for s in SCRIPTS])
@pytest.mark.parametrize("driver", [TwinDriver, RealDriver], ids=["twin", "pysyncobj"])
def test_scenario(script: Path, driver, tmp_path):
    expected = script.read_text()
    printed = asyncio.run(_run(expected, driver, tmp_path))
    if os.environ.get("REWRITE") and driver is TwinDriver:
        script.write_text(printed)
    assert printed == expected


async def _run(script: str, driver, folder: Path) -> str:
    return await run(script, driver(folder))
