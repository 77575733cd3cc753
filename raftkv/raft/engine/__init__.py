"""The node's Raft engine: batched steady-state replication for groups pysyncobj hands it (docs/raft-engine.md)."""
