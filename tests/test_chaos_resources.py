"""Resource growth of a chaos run's processes (raftkv/chaos/resources.py): the judgement is pure."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from raftkv.chaos.resources import Usage, grown, usage


def series(*points: tuple[float, int, int, int]) -> list[Usage]:
    return [Usage(*p) for p in points]


def test_growth_counts_only_after_the_process_settled_and_past_the_floors():
    steady = series((0, 50_000, 10, 5), (600, 80_000, 40, 20), (3600, 90_000, 44, 21))  # +12.5% RSS after 600 s
    leaking = series((0, 50_000, 10, 5), (600, 80_000, 40, 20), (3600, 120_000, 40, 20))
    few_fds = series((0, 1, 10, 5), (600, 80_000, 10, 5), (3600, 80_000, 14, 5))  # +40%, but 4 descriptors
    young = series((3000, 50_000, 10, 5), (3600, 500_000, 10, 5))  # restarted late: not settled yet
    problems = grown({"n1 (pid 1)": steady, "n2 (pid 2)": leaking, "n3 (pid 3)": few_fds, "n4 (pid 4)": young})
    assert problems == ["n2 (pid 2): rss_kib grew from 80,000 to 120,000 (+50%) between 600 s and 3600 s into the run"]


def test_growth_compares_peaks_at_the_final_membership_so_memtables_and_joins_are_not_leaks():
    minutes = range(600, 4200, 300)
    memtables = series(*((at, (97 if i % 2 else 149) * 1024, 100, 20) for i, at in enumerate(minutes)))
    # a learner holds connections to every node: 105 descriptors with 3 nodes, 180 once two more joined
    joined = [Usage(at, 100_000, 105 if at < 2400 else 180, 20, 3 if at < 2400 else 5) for at in minutes]
    leaking = [Usage(at, 100_000, 105 + (at - 600) // 30, 20, 5) for at in minutes]
    problems = grown({"kafka learner (pid 1)": memtables, "changelog learner (pid 2)": joined,
                      "harness (pid 3)": leaking}, settle=0)
    assert problems == ["harness (pid 3): fds grew from 155 to 215 (+39%) between 2100 s and 3900 s into the run"]


def test_usage_reads_this_process_and_none_for_one_gone():
    mine = usage(os.getpid(), 1.0)
    assert mine.rss_kib > 1000 and mine.fds >= 3 and mine.threads >= 1
    assert usage(2**22 + 12345, 1.0) is None


def test_usage_of_a_zombie_is_none():
    child = subprocess.Popen(["true"])
    deadline = time.monotonic() + 10
    while "Z" not in Path(f"/proc/{child.pid}/stat").read_text().split(")")[1].split()[0]:
        assert time.monotonic() < deadline, "the child never exited"
        time.sleep(0.01)
    try:
        assert usage(child.pid, 1.0) is None
    finally:
        child.wait()
