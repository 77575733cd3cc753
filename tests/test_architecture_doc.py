"""docs/architecture.md's pictures are what the code draws (`make docs`): they cannot drift."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import architecture  # noqa: E402


def test_the_architecture_pictures_are_current():
    assert architecture.main(["--check"]) == 0, "run `make docs` and commit docs/architecture.md"


def test_a_path_naming_a_function_the_code_no_longer_has_fails_loudly(monkeypatch):
    monkeypatch.setattr(architecture, "PUT", architecture.PUT + (("raftkv.node.service", "KVService.Gone", "x"),))
    with pytest.raises(SystemExit, match="raftkv.node.service:KVService.Gone"):
        architecture.generated()
