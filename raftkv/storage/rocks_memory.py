"""What the RocksDB databases of one process may hold in memory, all together.

Left to RocksDB's defaults, each database keeps its own 8 MiB block cache, up to two 64 MiB memtables,
and the index block of every table file it has open outside any cache: a node's memory grew with its
number of partitions and with its data. Instead, every database of a process (a node's replicas and its
metadata, a learner's copies) shares one LRU block cache, which holds the tables' index and filter blocks
too (those of level 0 pinned, as RocksDB advises), and one write buffer manager caps their memtables
together: a database's memtable is flushed at `MEMTABLE_MB`, and the largest ones early once all of them
pass the budget. So what RocksDB holds is the two budgets, whatever the partitions and the data; a node
sets them from `tuning.rocksdb_block_cache_mb` and `tuning.rocksdb_memtables_mb` before it opens a
database (`configure`), other processes keep the defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

from rocksdict import BlockBasedOptions, Cache, Options, WriteBufferManager

BLOCK_CACHE_MB = 64
MEMTABLES_MB = 64
MEMTABLE_MB = 16  # one database's memtable is flushed at this size
# A memtable past its first 2 KiB holds one arena block at least, and the write buffer manager counts whole
# blocks: with 256 KiB blocks a database of a few writes (two memtables) counted 516 KiB, 1,024 of them eight
# times the 64 MiB budget, and RocksDB flushed a table file of a few entries on nearly every write (300 a
# second a node). At 8 KiB such a database counts 20 KiB, 20 MiB for 1,024.
ARENA_BLOCK_BYTES = 8 << 10
# Each open database has its own table cache, of 2^bits shards; RocksDB's 64 cost 25 KiB a database (25 MiB a
# node at 1,024 partitions), and a partition's database has few readers at once
TABLE_CACHE_SHARD_BITS = 2


@dataclass(frozen=True)
class _Budget:
    cache: Cache
    memtables: WriteBufferManager


_budget: list[_Budget] = []  # made on first use: the process's one budget


def configure(block_cache_mb: int, memtables_mb: int) -> None:
    """The process's budgets; the databases opened before and after share them."""
    if _budget:
        _budget[0].cache.set_capacity(block_cache_mb << 20)
        _budget[0].memtables.set_buffer_size(memtables_mb << 20)
    else:
        _budget.append(_Budget(Cache(block_cache_mb << 20), WriteBufferManager(memtables_mb << 20, False)))


def usage() -> tuple[int, int]:
    """Bytes in the block cache, bytes of memtables."""
    budget = _shared()
    return budget.cache.get_usage(), budget.memtables.get_usage()


def _shared() -> _Budget:
    if not _budget:
        configure(BLOCK_CACHE_MB, MEMTABLES_MB)
    return _budget[0]


def options() -> Options:
    """A database's options (raw bytes), within the process's budgets."""
    budget = _shared()
    table = BlockBasedOptions()
    table.set_block_cache(budget.cache)
    table.set_cache_index_and_filter_blocks(True)
    table.set_pin_l0_filter_and_index_blocks_in_cache(True)
    opts = Options(raw_mode=True)
    opts.set_block_based_table_factory(table)
    opts.set_write_buffer_manager(budget.memtables)
    opts.set_write_buffer_size(MEMTABLE_MB << 20)
    opts.set_arena_block_size(ARENA_BLOCK_BYTES)
    opts.set_table_cache_num_shard_bits(TABLE_CACHE_SHARD_BITS)
    return opts
