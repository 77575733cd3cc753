"""The decisions of incremental backups (raftkv/backup/plan.py): what an export uploads and waits for, what a
prune deletes. Pure: listings and the time in."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from hypothesis import given
from hypothesis import strategies as st

from raftkv.backup.manifest import BackupInfo, FileEntry, PartitionCopy, backup_id_for
from raftkv.backup.plan import (CLOCK_MARGIN, PENDING_GRACE, PRUNE_WINDOW, is_fresh, plan_prune, prunes_in_the_way,
                                to_fetch, to_upload)
from raftkv.storage.engine import Position

NOW = datetime(2026, 3, 4, 5, 6, 7, tzinfo=timezone.utc)
SHA = {name: name * 64 for name in "abcdef"}  # object name per letter


def backup(minutes_ago: float, *objects: str, version: int = 2) -> BackupInfo:
    files = tuple(FileEntry(f"p0000/{i:06d}.sst", 10, SHA[o]) for i, o in enumerate(objects))
    return BackupInfo(backup_id_for(NOW - timedelta(minutes=minutes_ago)), "c", NOW,
                      (PartitionCopy(0, Position(1, 1), files),), version=version)


def test_an_export_uploads_what_is_absent_or_cut_short_in_its_own_order():
    needed = {SHA["c"]: 5, SHA["a"]: 7, SHA["b"]: 9}
    assert to_upload(needed, {SHA["a"]: 7, SHA["b"]: 4, SHA["d"]: 1}) == [SHA["c"], SHA["b"]]
    assert to_upload(needed, needed) == []


def test_backup_create_fetches_what_the_store_lacks_or_holds_cut_short_and_every_unhashed_file():
    listed = [("000009.sst", 7, SHA["a"]), ("CURRENT", 16, ""), ("000011.sst", 9, SHA["b"]),
              ("000012.sst", 5, SHA["c"]), ("MANIFEST-000010", 300, "")]
    present = {SHA["a"]: 7, SHA["b"]: 4, SHA["d"]: 1}
    assert to_fetch(listed, present) == ["CURRENT", "000011.sst", "000012.sst", "MANIFEST-000010"]
    assert to_fetch(listed, {}) == [path for path, _, _ in listed]


def test_an_export_waits_for_a_prune_until_its_window_and_the_clock_margin_passed():
    started = NOW - PRUNE_WINDOW - CLOCK_MARGIN
    locks = {"old": started - timedelta(microseconds=1), "edge": started, "young": started + timedelta(seconds=1),
             "ahead": NOW + timedelta(minutes=3)}  # a writer whose clock is ahead of ours
    assert prunes_in_the_way(locks, NOW) == ["ahead", "young"]
    assert prunes_in_the_way({}, NOW) == []


def test_a_partial_backup_is_fresh_for_a_day_and_a_name_that_is_no_id_never():
    assert is_fresh(backup_id_for(NOW - PENDING_GRACE + timedelta(seconds=1)), NOW)
    assert not is_fresh(backup_id_for(NOW - PENDING_GRACE), NOW)
    assert not is_fresh("files", NOW) and not is_fresh("locks", NOW)


def test_prune_deletes_backups_beyond_keep_and_objects_only_they_reference():
    old, middle, new = backup(30, "a", "b"), backup(20, "b", "c"), backup(10, "c", "d")
    plan = plan_prune([old, middle, new], {}, [old.id, middle.id, new.id], [SHA[o] for o in "abcde"], {}, 2, NOW)
    assert plan.backups == (old.id,)
    assert plan.objects == (SHA["a"], SHA["e"])  # b, c, d: a kept backup needs them; e: nobody ever did
    assert plan.partial == () and plan.locks == ()


def test_prune_spares_what_a_backup_under_way_announced_until_its_marker_is_a_day_old():
    kept = backup(10, "a")
    running = backup_id_for(NOW - timedelta(minutes=5))
    crashed = backup_id_for(NOW - PENDING_GRACE - timedelta(minutes=1))
    pending = {running: [SHA["b"]], crashed: [SHA["c"]]}
    plan = plan_prune([kept], pending, [kept.id, running, crashed], [SHA[o] for o in "abc"], {}, 1, NOW)
    assert plan.objects == (SHA["c"],)
    assert plan.partial == (crashed,)  # the running one's folder (its marker) stays


def test_version_1_backups_reference_no_shared_object():
    v1 = backup(5, "a", version=1)
    plan = plan_prune([v1], {}, [v1.id], [SHA["a"]], {}, 1, NOW)
    assert plan.backups == () and plan.objects == (SHA["a"],)


def test_prune_removes_the_locks_no_export_waits_for_any_more():
    stale = NOW - PRUNE_WINDOW - CLOCK_MARGIN - timedelta(seconds=1)
    plan = plan_prune([], {}, [], [], {"dead": stale, "running": NOW}, 1, NOW)
    assert plan.locks == ("dead",)


names = st.sampled_from(sorted(SHA.values()))


@given(backups=st.lists(st.tuples(st.integers(0, 3000), st.lists(names, max_size=4), st.sampled_from([1, 2])),
                        max_size=5, unique_by=lambda b: b[0]),
       pending=st.dictionaries(st.integers(0, 3000), st.lists(names, max_size=3), max_size=3),
       present=st.lists(names, unique=True), keep=st.integers(1, 4))
def test_prune_never_deletes_an_object_a_kept_backup_or_a_fresh_marker_names(backups, pending, present, keep):
    """Against a naive twin: an object survives iff a kept version-2 manifest or a marker younger than a day
    names it."""
    infos = sorted((backup(m, *(next(k for k, v in SHA.items() if v == o) for o in objs), version=v)
                    for m, objs, v in backups), key=lambda info: info.id)
    markers = {backup_id_for(NOW - timedelta(minutes=m)): objs for m, objs in pending.items()}
    plan = plan_prune(infos, markers, [i.id for i in infos] + list(markers), present, {}, keep, NOW)
    kept = infos[-keep:]
    needed = {f.sha256 for i in kept if i.version == 2 for c in i.copies for f in c.files}
    announced = {o for backup_id, objs in markers.items() if NOW - datetime.strptime(
        backup_id, "%Y%m%dT%H%M%S.%fZ").replace(tzinfo=timezone.utc) < timedelta(days=1) for o in objs}
    assert set(plan.objects) == set(present) - needed - announced
    assert set(plan.backups) == {i.id for i in infos[:-keep]}
