"""Learner replicas of raftkv partitions and the sinks they feed (docs/learners.md)."""
