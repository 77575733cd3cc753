"""The cluster's metadata, kept in a Raft group of its own (docs/elasticity.md §1)."""
