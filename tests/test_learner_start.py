"""`raftkv learner start` imports only what it runs: no sink but the chosen one, no node, no console library.

The learner's start-up is mostly imports (docs/learners.md, "Start-up"); this pins the lazy ones in one
subprocess, without timing anything.
"""

from __future__ import annotations

import json
import subprocess
import sys

# What the command imports before it runs (`python -m raftkv learner start`), then the sink it looks up
IMPORTS = """
import json, sys
import raftkv.cli, raftkv.cli.learner
before = set(sys.modules)
from learners.sinks.base import load_sink
load_sink("changelog")
print(json.dumps([sorted(before), sorted(set(sys.modules))]))
"""
NOT_AT_START = ("confluent_kafka", "fsspec", "rich", "raftkv.node.process", "raftkv.node.service",
                "learners.learner_reads", "learners.sinks.kafka_sink", "learners.sinks.backup_sink")


def test_learner_start_imports_neither_other_sinks_nor_the_node_nor_rich():
    out = subprocess.run([sys.executable, "-c", IMPORTS], capture_output=True, text=True, check=True, timeout=60)
    at_start, with_the_sink = (set(modules) for modules in json.loads(out.stdout))
    assert "learners.learner_process" in at_start
    assert sorted(m for m in at_start if m in NOT_AT_START or m.split(".")[0] in NOT_AT_START) == []
    assert "learners.sinks.changelog_sink" in with_the_sink
    assert not {m for m in with_the_sink if m.startswith(("confluent_kafka", "fsspec"))}
