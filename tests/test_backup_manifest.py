"""A backup manifest read from storage: what it may name, and the one line a damaged one gets
(found by tests/test_fuzz_files.py)."""

from __future__ import annotations

import json

import pytest

from learners.backup_restore import restore
from raftkv.backup.manifest import MANIFEST, BackupInfo, pending_objects
from raftkv.backup.store import BackupStore
from raftkv.core.errors import CorruptData
from raftkv.core.spec import build_spec
from tests.test_backup import fill, open_sink
from tests.test_fuzz_files import BACKUP_ID, manifest_doc


def parsed(doc) -> BackupInfo:
    return BackupInfo.from_manifest(json.dumps(doc).encode(), "m.json")


def refused(data: bytes) -> str:
    with pytest.raises(CorruptData) as info:
        BackupInfo.from_manifest(data, "m.json")
    assert "\n" not in str(info.value)
    return str(info.value)


def test_a_valid_manifest_round_trips():
    assert parsed(manifest_doc()).to_manifest() == json.dumps(manifest_doc(), indent=2).encode()


@pytest.mark.parametrize("data", [b"[]", b'"x"', b"7", b"null", b"[" * 100_000])
def test_json_that_is_not_an_object_or_nests_too_deep_is_corrupt_data(data):
    assert refused(data).startswith("m.json: unreadable backup manifest (")


@pytest.mark.parametrize("field, value", [
    ("size", "1e999"), ("size", "-1e999"), ("size", "NaN"), ("size", "-1"), ("size", "1.5"), ("size", "true"),
    ("size", '"7"'), ("index", "1e999"), ("term", "-2"), ("partition", "true"), ("partition", "-1"),
])
def test_a_number_that_is_not_a_count_is_corrupt_data(field, value):
    text = json.dumps(manifest_doc())
    old = {"size": '"size": 100', "index": '"index": 10', "term": '"term": 2', "partition": '"partition": 0'}[field]
    assert refused(text.replace(old, f'"{field}": {value}', 1).encode()).endswith(
        f"({field}: expected a count, got {json.loads(value)!r})")


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "p0000/../../x", "p0001/x", "", ".", "p0000", "p0000/",
                                  "p0000/.", "p0000/..", "p0000//x", "./p0000/x", "p0000/x/y", "p0000/..\\x",
                                  "p0000/a\x00b", "p-001/x"])
def test_a_file_must_be_a_plain_name_in_its_partition_folder(path):
    doc = manifest_doc()
    doc["partitions"][0]["files"][0]["path"] = path
    assert refused(json.dumps(doc).encode()).endswith(f"(file {path!r} is not a plain name in p0000/)")


def test_an_id_with_a_line_break_is_named_on_one_line(tmp_path):
    doc = manifest_doc()
    doc["id"] = "a\nb"
    (tmp_path / BACKUP_ID).mkdir()
    (tmp_path / BACKUP_ID / MANIFEST).write_text(json.dumps(doc))
    with pytest.raises(CorruptData, match=r"the manifest is of backup 'a\\nb', not ") as info:
        BackupStore(tmp_path.as_uri()).backups()
    assert "\n" not in str(info.value)


def test_a_restore_writes_files_inside_the_new_data_dirs_only(tmp_path):
    """A manifest naming a file outside its partition folder stops the restore before anything is
    written; the untouched manifest restores into the spec's data dirs and nowhere else."""
    url = (tmp_path / "backups").as_uri()
    sink = open_sink(tmp_path, url)
    fill(sink)
    info = sink.export_now()
    sink.close()
    manifest = tmp_path / "backups" / info.id / MANIFEST
    original = manifest.read_bytes()
    spec = build_spec(nodes=2, partitions=2, replication=2, base_port=40000, data_dir=tmp_path / "new")
    before = set(tmp_path.rglob("*"))
    for hostile in ("p0000/../../../escaped", "p0000/a\x00b", "p0001/../p0000/x"):
        doc = json.loads(original)
        doc["partitions"][0]["files"][0]["path"] = hostile
        manifest.write_text(json.dumps(doc))
        with pytest.raises(CorruptData, match="is not a plain name in p0000/"):
            restore(url, info.id, spec)
        assert set(tmp_path.rglob("*")) == before
    manifest.write_bytes(original)
    restore(url, info.id, spec)
    assert all(path.is_relative_to(tmp_path / "new") for path in set(tmp_path.rglob("*")) - before)


def test_a_version_1_manifest_is_read_with_its_files_in_the_backups_own_folder():
    doc = manifest_doc()
    doc["version"] = 1
    info = parsed(doc)
    entry = info.copies[0].files[0]
    assert info.version == 1 and info.objects == {}
    assert info.location(entry) == f"{BACKUP_ID}/p0000/000009.sst"
    assert parsed(manifest_doc()).location(entry) == f"files/ab/{'ab' * 32}"  # version 2: by content
    assert info.to_manifest() == json.dumps(doc, indent=2).encode()


@pytest.mark.parametrize("sha256", ["../../../etc/passwd", "AB" * 32, "ab" * 31, "ab" * 33, "g" * 64, 7, None])
def test_a_sha256_that_is_not_64_lowercase_hex_digits_is_corrupt_data(sha256):
    """A version-2 file is fetched from the path its hash names: nothing else may pass for one."""
    doc = manifest_doc()
    doc["partitions"][0]["files"][0]["sha256"] = sha256
    assert refused(json.dumps(doc).encode()).endswith(f"(sha256: expected 64 lowercase hex digits, got {sha256!r})")


def test_a_pending_marker_names_the_objects_its_backup_will_reference():
    info = parsed(manifest_doc())
    assert pending_objects(info.pending_marker(), "p.json") == frozenset(info.objects)
    for damaged in (b"{", b"[]", b'{"format": "raftkv-backup-pending", "objects": ["../x"]}'):
        with pytest.raises(CorruptData, match="^p.json: unreadable pending marker"):
            pending_objects(damaged, "p.json")
