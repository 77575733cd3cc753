"""Fault injection: run a workload against a cluster under faults, then check the history."""
