"""The golden elasticity scripts of tests/testdata/elastic/: moves, joins, decommissions and dead nodes,
the node's controllers run over in-memory Raft groups on a fake clock (tests/elastic_twin.py). Every
action is printed; a test fails when one changes. REWRITE=1 writes what was printed back into the
scripts (then read the diff)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftkv.meta.records import BeginMove, NodeState, SetNodeState
from tests.elastic_twin import Twin

SCRIPTS = sorted((Path(__file__).parent / "testdata" / "elastic").glob("*.txt"))


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.stem for s in SCRIPTS])
def test_scenario(script: Path, tmp_path):
    expected = script.read_text()
    printed = run(expected, tmp_path)
    if os.environ.get("REWRITE"):
        script.write_text(printed)
    assert printed == expected



@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(3, 5), st.integers(2, 4),
       st.lists(st.tuples(st.sampled_from(["join", "decommission", "kill", "put"]), st.integers(0, 99)),
                min_size=1, max_size=4))
def test_any_joins_decommissions_and_one_death_settle_with_every_write_on_every_voter(tmp_path_factory, nodes,
                                                                                   partitions, operations):
    """Whatever the order of joins, decommissions (refused ones too), puts and one node's death, the
    controllers settle: no move left, every partition run by the voters the metadata names, holding
    every acknowledged put."""
    twin = Twin(tmp_path_factory.mktemp("twin"))
    twin.cluster(nodes, partitions, rebalance=True)
    joined, killed = nodes, False
    for i, (verb, pick) in enumerate(operations):
        up = [n.id for n in twin.meta.nodes if n.state == NodeState.UP]
        if verb == "join":
            joined += 1
            twin.join(f"n{joined}")
        elif verb == "decommission":
            twin.change(SetNodeState(up[pick % len(up)], NodeState.DRAINING))
        elif verb == "kill" and not killed:
            killed = True
            twin.kill(up[pick % len(up)])
            twin.run(6)  # past dead_after
        else:
            twin.put(pick % partitions, f"k{i}", str(pick))
        twin.settle()
    assert not [line for line in twin.out if "not settled" in line]
    assert twin.check() == ["ok"]


def run(script: str, folder: Path) -> str:
    """The script with each block's output replaced by what the twin printed."""
    twin, out = Twin(folder), []
    for block in script.strip().split("\n\n"):
        command = block.split("\n----")[0].strip()
        lines = [line for line in command.splitlines() if not line.startswith("#")]
        verb, *args = lines[-1].split()
        twin.out = []
        result = _command(twin, verb, args)
        out.append(f"{command}\n----\n" + "\n".join(twin.out + result or ["ok"]))
    return "\n\n".join(out) + "\n"


def _command(twin: Twin, verb: str, args: list[str]) -> list[str]:
    if verb == "cluster":
        options = dict(a.split("=") for a in args)
        twin.cluster(int(options["nodes"]), int(options["partitions"]), options.get("rebalance", "on") == "on")
    elif verb == "put":
        return [twin.put(int(args[0]), args[1], args[2])]
    elif verb == "move":
        twin.change(BeginMove(int(args[0]), args[1], args[2]))
    elif verb == "join":
        twin.join(args[0])
    elif verb == "decommission":
        twin.change(SetNodeState(args[0], NodeState.DRAINING))
    elif verb == "kill":
        twin.kill(args[0])
    elif verb == "run":
        twin.run(float(args[0]))
    elif verb == "settle":
        twin.settle()
    elif verb == "state":
        return twin.state()
    elif verb == "check":
        return twin.check()
    else:
        raise ValueError(f"unknown command {verb!r}")
    return []
