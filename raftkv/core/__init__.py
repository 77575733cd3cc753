"""What every layer shares: the cluster spec, commands and their log encoding, partitioning,
errors, the pure state machine and policies, and the metrics definitions. No I/O but metrics."""
