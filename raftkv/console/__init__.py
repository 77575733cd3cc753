"""The operator's console: a read-only web console on every node's metrics port (docs/console.md)."""
