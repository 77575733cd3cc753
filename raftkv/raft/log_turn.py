"""The end of a loop turn for a node's Raft log: every group's records of the turn written with one
`os.write` and, in fsync mode, made durable with one fdatasync, before any frame of the turn leaves
(docs/raft-engine.md, "The node log, wired").

The node log defers every record (`NodeLog.defer_writes`); the first of a turn asks the hub for its
one flush of the turn, and the hub runs `before_send` before it writes any connection's frames. So a
follower's acknowledgement, a vote or a leader's append never leaves before what it speaks of is
written (and synced), and N groups busy in one turn cost one write and one fdatasync, not N.
The fdatasync runs on the loop (moving it to an I/O thread is issue 28's next step).
"""

from __future__ import annotations

import logging
from typing import Callable

from raftkv.core import metrics
from raftkv.core.errors import CorruptData, StorageFull
from raftkv.raft.hub import RaftHub
from raftkv.raft.node_log import NodeLog
from raftkv.raft.syncobj_loop import warn_disk_full

log = logging.getLogger(__name__)


class LogTurn:
    def __init__(self, log: NodeLog, hub: RaftHub, fsync: bool, on_corrupt: Callable[[CorruptData], None]):
        self._log = log
        self._fsync = fsync
        self._on_corrupt = on_corrupt
        self._clock = hub.clock
        self._failed = False
        hub.before_send = self.before_send
        log.defer_writes(hub.flush_soon)

    def before_send(self) -> bool:
        """Write the turn's records (and sync them, in fsync mode); False if the frames must not leave."""
        if self._failed:
            return False
        try:
            written = self._log.write_pending()
            if self._fsync and self._log.synced != written:
                self._log.sync()
                metrics.NODE_LOG_FSYNCS.inc()
        except StorageFull as exc:  # the batch waits for the next turn's write; Raft sends again
            warn_disk_full(exc, self._clock())
            return False
        except OSError as exc:  # a write the disk refused (EIO): as above
            log.warning("the node's Raft log could not be written (%s); the turn's messages are dropped", exc)
            return False
        except CorruptData as exc:  # a failed fsync (DiskFailed): nothing may be said of what it covered
            self._failed = True
            self._on_corrupt(exc)
            return False
        return True
