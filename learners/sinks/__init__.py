"""Sinks: where a learner delivers ChangeEvents. See base.Sink and docs/learners.md."""
