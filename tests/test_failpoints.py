"""Fail points: the setting grammar, what a hit does, and arming from the environment."""

from __future__ import annotations

import errno
import os
import random
import re
import signal
import subprocess
import sys

import pytest

from raftkv import failpoints
from raftkv.core.errors import ConfigError
from raftkv.core.spec import build_spec
from raftkv.core.spec_toml import save_spec
from raftkv.failpoints.program import Action, SettingError, parse, parse_settings
from raftkv.raft.group import contradicts
from raftkv.storage.engine import Position


@pytest.fixture(autouse=True)
def disarmed():
    yield
    failpoints.disarm_all()


def actions(setting: str, hits: int, seed: int = 0) -> list[Action | None]:
    program, rng = parse(setting), random.Random(seed)
    return [program.next(rng) for _ in range(hits)]


def test_counted_terms_run_in_order():
    assert actions("3*off->crash", 5) == [None, None, None, Action("crash"), Action("crash")]
    assert actions("2*delay(5)->error", 4) == [Action("delay", 5.0), Action("delay", 5.0), Action("error"),
                                                Action("error")]
    assert actions("1*crash", 3) == [Action("crash"), None, None]  # used up: the point passes again


def test_a_percentage_acts_on_about_that_share_of_hits():
    acted = sum(a is not None for a in actions("25%error", 4000, seed=3))
    assert 850 < acted < 1150


@pytest.mark.parametrize("setting, says", [
    ("explode", "TASK one of off, crash, delay, error"),
    ("delay", "delay needs milliseconds"),
    ("delay(soon)", "delay needs milliseconds"),
    ("crash(3)", "crash takes no argument"),
    ("150%crash", "at most 100"),
    ("0%crash", "above 0"),
    ("2*off->", "'' is not"),
])
def test_a_wrong_setting_names_the_part_and_why(setting, says):
    with pytest.raises(SettingError, match=re.escape(says)):
        parse(setting)


def test_settings_name_known_points_only():
    assert parse_settings(" apply-before=crash ; journal-fsync-after=10%delay(5);", failpoints.NAMES) == {
        "apply-before": "crash", "journal-fsync-after": "10%delay(5)"}
    with pytest.raises(SettingError, match="no fail point 'apply'; the fail points are journal-append-before"):
        parse_settings("apply=crash", failpoints.NAMES)
    with pytest.raises(SettingError, match="'apply-before' is not NAME=SETTING"):
        parse_settings("apply-before", failpoints.NAMES)


def test_a_hit_on_a_point_that_is_off_does_nothing_and_an_armed_error_raises_eio():
    failpoints.hit("apply-before")
    failpoints.arm("apply-before", "1*off->1*error")
    failpoints.hit("apply-before")
    failpoints.hit("journal-append-before")  # another point: not armed
    with pytest.raises(OSError, match="fail point apply-before: injected I/O error") as raised:
        failpoints.hit("apply-before")
    assert raised.value.errno == errno.EIO
    failpoints.hit("apply-before")


def test_a_crash_is_a_sigkill_of_the_process_exactly_there():
    script = ("from raftkv import failpoints; failpoints.arm('apply-after', '2*off->crash')\n"
              "for i in range(5):\n    print(i, flush=True); failpoints.hit('apply-after')")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGKILL
    assert done.stdout.split() == ["0", "1", "2"]


def test_the_environment_arms_points_and_a_wrong_value_is_a_config_error():
    failpoints.arm_from_environment({failpoints.ENVIRONMENT_VARIABLE: "sink-flush-after=1*error"})
    with pytest.raises(OSError):
        failpoints.hit("sink-flush-after")
    with pytest.raises(ConfigError, match="RAFTKV_FAILPOINTS: 'crash-now' is not NAME=SETTING"):
        failpoints.arm_from_environment({failpoints.ENVIRONMENT_VARIABLE: "crash-now"})


def test_a_node_started_with_a_wrong_setting_says_so_in_one_line_and_exits_2(tmp_path):
    spec = build_spec(nodes=1, partitions=1, replication=1, base_port=20000, data_dir=tmp_path / "data")
    path = save_spec(spec, tmp_path / "cluster.toml")
    done = subprocess.run([sys.executable, "-m", "raftkv", "node", "start", "--config", str(path), "--node", "n1"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, failpoints.ENVIRONMENT_VARIABLE: "apply-before=sometimes"})
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: RAFTKV_FAILPOINTS: 'sometimes' is not [P%][N*]TASK[(ARG)] with TASK one of off, crash, delay, error"]


def test_node_points_leave_out_the_learners_and_fsync_points_without_fsync():
    assert "apply-before" in failpoints.node_points(fsync=False)
    assert "journal-fsync-before" not in failpoints.node_points(fsync=False)
    assert "journal-fsync-before" in failpoints.node_points(fsync=True)
    assert not set(failpoints.LEARNER_POINTS) & set(failpoints.node_points(fsync=True))


@pytest.mark.parametrize("index, term, position, contradiction", [
    (5, 2, Position(7, 3), False),  # an older entry of an older term
    (7, 3, Position(7, 3), False),  # the position's own entry
    (5, 3, Position(7, 3), False),
    (7, 2, Position(7, 3), True),  # another entry at the position's index
    (7, 4, Position(7, 3), True),
    (5, 4, Position(7, 3), True),  # newer than the entry the state ends with
    (5, 4, Position(7, 0), False),  # restored data: no log position to check against
])
def test_a_committed_entry_below_the_state_contradicts_it_only_when_no_single_log_holds_both(
        index, term, position, contradiction):
    assert contradicts(index, term, position) is contradiction
