"""The systemd units in deploy/systemd: systemd's own checker accepts them, and the command each runs is
one the CLI accepts (docs/operations.md)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNITS = Path(__file__).resolve().parent.parent / "deploy" / "systemd"
INSTALLED = "/opt/raftkv/bin/raftkv"
RAFTKV = str(Path(sys.executable).parent / "raftkv")  # this venv's: the units' path does not exist here


@pytest.mark.parametrize("unit", ["raftkv-node@.service", "raftkv-learner@.service"])
def test_systemd_analyze_verifies_the_unit_without_a_word(unit, tmp_path):
    text = (UNITS / unit).read_text()
    assert INSTALLED in text
    (tmp_path / unit).write_text(text.replace(INSTALLED, RAFTKV))
    done = subprocess.run([shutil.which("systemd-analyze") or "systemd-analyze", "verify", "--man=no",
                           str(tmp_path / unit)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), done.stdout + done.stderr


@pytest.mark.parametrize("unit, instance", [("raftkv-node@.service", "n1"), ("raftkv-learner@.service", "feed")])
def test_the_command_a_unit_runs_is_one_the_cli_accepts(unit, instance):
    """Every option the unit passes exists (--help after them makes the CLI parse them and stop)."""
    [exec_start] = re.findall(r"^ExecStart=(.*)$", (UNITS / unit).read_text(), re.MULTILINE)
    argv = [arg.replace("%i", instance) for arg in shlex.split(exec_start) if not arg.startswith("$")]
    assert argv[0] == INSTALLED
    done = subprocess.run([RAFTKV, *argv[1:], "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
