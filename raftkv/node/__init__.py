"""A node process: its replicas, group commit and the gRPC service."""
