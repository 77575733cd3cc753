"""The write load's gap arithmetic (raftkv/dev/write_load.py); the load itself runs in the elastic tests
and scripts/upgrade_check.py."""

from __future__ import annotations

from raftkv.dev.write_load import longest_gap


def test_the_longest_gap_is_between_acknowledgements_and_at_the_window_edges():
    assert longest_gap([1.0, 1.5, 4.0, 4.2]) == 2.5
    assert longest_gap([1.0, 1.5, 4.0, 4.2], start=0.0, end=4.5) == 2.5
    assert longest_gap([2.0, 2.5], start=0.0, end=3.0) == 2.0  # the window opened 2 s before the first
    assert longest_gap([2.0, 2.5], start=2.2, end=9.0) == 6.5  # times outside the window do not count
    assert longest_gap([], start=1.0, end=4.0) == 3.0  # nothing acknowledged in the whole window
    assert longest_gap([]) == 0.0 and longest_gap([3.0]) == 0.0
