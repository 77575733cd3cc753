"""Where a partition's state lives: the engine interface, and its RocksDB and in-memory engines."""
