"""A deterministic simulation of real pysyncobj members (`SyncObjGroup` and its `_Member`, with every
override of ours) on a virtual clock: one seeded scheduler, an in-memory network and in-memory disks
that lose what was not synced. docs/raft-engine.md, "The simulation, as built", says what it does and
what it checks; `scripts/raft_sim.py` runs it for long.
"""
