"""Named fail points on the hot paths, where a test or a chaos run can crash or delay a process.

Off by default, and then a hit costs one call and one test of an empty dict. A process arms
them at start from ``RAFTKV_FAILPOINTS`` (``arm_from_environment``), as gofail and fail-rs do::

    RAFTKV_FAILPOINTS="snapshot-rename-after=3*off->crash;journal-fsync-before=10%delay(500)"

The grammar of a setting is in `program`. docs/chaos.md lists the points.
"""

from __future__ import annotations

import errno
import logging
import os
import random
import signal
import time
from typing import Mapping

from raftkv.core.errors import ConfigError
from raftkv.failpoints.program import Action, Program, SettingError, parse, parse_settings

ENVIRONMENT_VARIABLE = "RAFTKV_FAILPOINTS"

# name: where it sits (docs/chaos.md has this table)
POINTS: dict[str, str] = {
    "journal-append-before": "a Raft log entry is about to be written to the journal",
    "journal-append-after": "a Raft log entry was written to the journal (not yet synced)",
    "journal-fsync-before": "the journal is about to be synced (fsync mode)",
    "journal-fsync-after": "the journal was synced (fsync mode), before anything that waited on it goes on",
    "snapshot-rename-before": "a finished snapshot is about to be renamed over the current one",
    "snapshot-rename-after": "a snapshot was renamed in; the journal is not yet compacted to it",
    "apply-before": "a committed entry is about to be applied to the partition's database",
    "apply-after": "a committed entry was applied to the database; Raft has not yet counted it applied",
    "learner-deliver-before": "a learner is about to hand a batch of change events to its sink",
    "sink-flush-before": "a learner's sink has the batch and is about to flush it",
    "sink-flush-after": "a learner's sink flushed the batch; the learner has not yet recorded that",
    "backup-upload-after": "a backup uploaded a file; its manifest is not written yet",
    "backup-download-after": "a restore, a verify or a seed downloaded and checked a file of a backup",
    "checkpoint-read-before": "a voter is about to read the next chunk of a checkpoint it sends a new replica",
    "seed-rename-before": "a new replica's copy is staged and synced; its rename into the replica's folder is next",
    "seed-rename-after": "a new replica's copy was renamed into its folder; the data dir is not synced, nothing opened",
    "ingest-after": "a bulk-load file was ingested into a partition's database; its position is not written yet",
    "log-convert-after": "at start-up, a replica's journal was converted into the node log; its folder is not marked",
    "log-convert-marked": "at start-up, a converted replica's folder was marked; its old journal is not deleted yet",
}
NAMES = tuple(POINTS)
LEARNER_POINTS = ("learner-deliver-before", "sink-flush-before", "sink-flush-after")
# reached by a backup sink's learner, `raftkv backup create`, `restore` and `verify` (and rarely, a node's seed)
BACKUP_POINTS = ("backup-upload-after", "backup-download-after")
FSYNC_POINTS = ("journal-fsync-before", "journal-fsync-after")  # reached only with durability = "fsync"
# reached only while a replica is copied to a node (a move, a re-seed)
COPY_POINTS = ("checkpoint-read-before", "seed-rename-before", "seed-rename-after")
UPGRADE_POINTS = ("log-convert-after", "log-convert-marked")  # reached only by the start on an older data dir
INGEST_POINTS = ("ingest-after",)  # reached only by a put_many large enough to be ingested (docs/bulk-ingest.md)


def node_points(fsync: bool) -> tuple[str, ...]:
    """The points every node process reaches (under writes alone)."""
    elsewhere = LEARNER_POINTS + BACKUP_POINTS + COPY_POINTS + UPGRADE_POINTS + INGEST_POINTS
    return tuple(n for n in NAMES if n not in elsewhere and (fsync or n not in FSYNC_POINTS))

_log = logging.getLogger(__name__)
_armed: dict[str, Program] = {}
_rng = random.Random()


def hit(name: str) -> None:
    """Pass fail point `name`: nothing happens unless it is armed."""
    if _armed:
        _fire(name)


def _fire(name: str) -> None:
    program = _armed.get(name)
    action = program.next(_rng) if program is not None else None
    if action is not None:
        perform(name, action)


def perform(name: str, action: Action) -> None:
    if action.task == "crash":
        _log.warning("fail point %s: crashing (SIGKILL)", name)
        logging.shutdown()
        os.kill(os.getpid(), signal.SIGKILL)
    elif action.task == "delay":
        time.sleep(action.millis / 1000)
    elif action.task == "error":
        raise OSError(errno.EIO, f"fail point {name}: injected I/O error")


def arm(name: str, setting: str) -> None:
    """Arm one point in this process (tests); SettingError if either is wrong."""
    parse_settings(f"{name}={setting}", NAMES)
    _armed[name] = parse(setting)


def disarm_all() -> None:
    _armed.clear()


def arm_from_environment(environ: Mapping[str, str] = os.environ) -> None:
    """Arm what RAFTKV_FAILPOINTS names; a wrong value is a ConfigError naming the problem."""
    text = environ.get(ENVIRONMENT_VARIABLE, "")
    try:
        settings = parse_settings(text, NAMES)
    except SettingError as exc:
        raise ConfigError(str(exc), source=ENVIRONMENT_VARIABLE) from None
    for name, setting in settings.items():
        _armed[name] = parse(setting)
        _log.warning("fail point %s armed: %s", name, setting)
