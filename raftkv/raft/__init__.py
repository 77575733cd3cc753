"""Raft: the only package that imports pysyncobj (its patches, loop driver, wire settings and journal)."""
