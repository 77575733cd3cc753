"""Local development: start node processes, a tansu broker and a Kafka learner on this machine."""
