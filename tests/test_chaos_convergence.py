"""The chaos run's replica check (raftkv/chaos/convergence.py) on what no cluster is needed for."""

from __future__ import annotations

from raftkv.chaos.convergence import replica_differences
from raftkv.core.spec import build_spec, ports_per_node
from raftkv.dev.local_cluster import free_port_block


def test_a_replica_on_a_node_that_left_the_cluster_is_a_problem_line_not_a_crash(tmp_path):
    """The lose-last-second soak of seed 1880499202 ended in a ConfigError: a replaced node's replica was
    never moved (its partition had no leader), the placement still named the node, and the check asked
    the spec for its address."""
    spec = build_spec(nodes=3, partitions=1, replication=3, base_port=free_port_block(3 * ports_per_node(1)),
                      data_dir=tmp_path)
    problems = replica_differences(spec, (("n1", "n8", "n2"),), lambda: None, timeout=0.5)
    assert len(problems) == 1 and "partition 0: the replicas did not reach one applied index" in problems[0]
    assert "n8: no longer a member of the cluster" in problems[0]
