"""Prometheus metrics of a node, defined once. Labels: partition."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, make_wsgi_app

from raftkv.core import http_server

LEADER_CHANGES = Counter("raftkv_leader_changes_total", "Times this replica's role changed", ["partition"])
IS_LEADER = Gauge("raftkv_is_leader", "1 while this replica leads its partition", ["partition"])
TERM = Gauge("raftkv_term", "Current Raft term", ["partition"])
COMMIT_INDEX = Gauge("raftkv_commit_index", "Raft commit index", ["partition"])
APPLIED_INDEX = Gauge("raftkv_applied_index", "Index of the last entry applied to RocksDB", ["partition"])
PROPOSALS = Counter("raftkv_proposals_total", "Raft entries proposed by this leader", ["partition"])
INGEST_FILES = Counter("raftkv_ingest_files_total",
                       "put_manys this leader logged as one table file to ingest (docs/bulk-ingest.md)", ["partition"])
PROPOSAL_OPS = Histogram(
    "raftkv_proposal_ops",
    "Operations (writes and read barriers) per proposal",
    ["partition"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096),
)
APPLY_SECONDS = Histogram(
    "raftkv_apply_seconds",
    "Time to apply one committed entry to RocksDB",
    ["partition"],
    buckets=(0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05),
)
JOURNAL_FSYNCS = Counter("raftkv_journal_fsyncs_total",
                         "fdatasync calls on a replica's own Raft journal before it sends (fsync mode; a learner's)",
                         ["partition"])
NODE_LOG_FSYNCS = Counter("raftkv_node_log_fsyncs_total",
                          "fdatasync calls on the node's Raft log of every group that frames or a single-voter "
                          "commit waited for (fsync mode): one per loop turn that wrote, for all groups")
RAFT_BYTES_SENT = Counter("raftkv_raft_bytes_sent_total",
                          "Bytes of log entries and of snapshot chunks this replica sent to other members",
                          ["partition", "kind"])
CHECKPOINT_BYTES_SENT = Counter("raftkv_checkpoint_bytes_sent_total",
                                "Bytes of checkpoint files this node's voter sent: to a new replica, to a backup "
                                "(Admin.Checkpoint, Admin.CheckpointFiles)",
                                ["partition"])
GROUP_RESTING = Gauge("raftkv_group_resting",
                      "1 while this replica's Raft group rests: idle, it neither ticks nor heartbeats", ["partition"])
# What a put costs, step by step, summed over the node's groups (scripts/bench_steps.py divides them by
# the puts and the Raft entries of a load; docs/raft-engine.md): cheap to count, no partition label.
RAFT_TICKS = Counter("raftkv_raft_ticks_total", "Ticks of this node's Raft groups (each a turn of its Raft state machine)")
RAFT_MESSAGES = Counter("raftkv_raft_messages_total", "Raft messages of this node's groups", ["direction"])
RAFT_MESSAGES_SENT = RAFT_MESSAGES.labels("sent")
RAFT_MESSAGES_RECEIVED = RAFT_MESSAGES.labels("received")
RAFT_SOCKET_WRITES = Counter("raftkv_raft_socket_writes_total",
                             "Writes to the Raft hub's connections (each carries the frames of one loop turn)")
JOURNAL_WRITES = Counter("raftkv_journal_writes_total",
                         "Writes (os.write calls) to this node's Raft logs: one per entry to a RaftJournal, "
                         "one per batch of many groups' records to the node log")
# Node-wide sums for the console's per-second series: summing a thousand partitions' series each second
# cost 20 ms of the loop.
NODE_FSYNCS = Counter("raftkv_node_fsyncs_total",
                      "fsync and fdatasync calls of this node: its Raft logs, their meta files, snapshots (durable.py)")
NODE_RAFT_BYTES_SENT = Counter("raftkv_node_raft_bytes_sent_total",
                               "Bytes of log entries and snapshot chunks this node's replicas sent")
ENGINE_HANDOVERS = Counter("raftkv_engine_handovers_total",
                           "Raft groups handed to the node engine (take: offered by this leader; taken: by this "
                           "follower) and back to the Raft library (handback)", ["kind"])
ENGINE_RESTS = Counter("raftkv_engine_rests_total",
                       "Idle engine-driven groups this node's leaders rested in the engine (no beats until the next entry)")
ENGINE_STALE = Counter("raftkv_engine_stale_total",
                       "Engine items dropped: for another term or ownership epoch, a group not hosted, or a "
                       "Raft answer the engine superseded")
ENGINE_FRAMES = Counter("raftkv_engine_frames_total", "Engine frames (one per peer node per loop turn)",
                        ["direction"])
ENGINE_ON = Gauge("raftkv_engine_on", "1 once this node's leaders hand settled groups to the node engine "
                  "(every member runs a release that has it); 0 before, or with raft_engine = \"off\"")
API_REQUESTS = Counter("raftkv_api_requests_total", "Execute requests received")
API_OPS = Counter("raftkv_api_ops_total", "Operations received in Execute requests (several per request)")
# What a client asked of this node (forwarded requests are counted where they arrived): the console's
# rates and latencies, the dashboards' (docs/console.md §7).
CLIENT_OPS = Counter("raftkv_client_ops_total", "Operations clients sent to this node", ["kind"])
CLIENT_READS = CLIENT_OPS.labels("read")
CLIENT_WRITES = CLIENT_OPS.labels("write")
REQUEST_SECONDS = Histogram("raftkv_request_seconds", "Time to answer one client Execute request",
                            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5))
# Set once a second by the console's sampler (raftkv/console/sampler.py), for the alert rules.
DISK_FREE = Gauge("raftkv_disk_free_bytes", "Free bytes on the filesystem of the node's data directory")
DISK_SIZE = Gauge("raftkv_disk_size_bytes", "Size of the filesystem of the node's data directory")
DATA_BYTES = Gauge("raftkv_data_bytes", "Bytes of the node's data directory (every ten seconds)")
STORAGE_FULL = Gauge("raftkv_storage_full_replicas", "Replicas here that cannot write: their disk was full")
REPLICATION_FACTOR = Gauge("raftkv_replication_factor", "Voters each partition should have")
LIVE_VOTERS = Gauge("raftkv_partition_live_voters",
                    "On a partition's leader: its voters this node is connected to, itself included", ["partition"])
LEARNER_LAG = Gauge("raftkv_learner_undelivered_entries",
                    "On a partition's leader: data entries a learner has not yet delivered", ["partition", "learner"])
MOVES = Gauge("raftkv_moves_in_progress", "Replica moves under way, as this node's metadata has them")
MOVE_AGE = Gauge("raftkv_move_age_seconds", "How long this node has seen a move under way", ["group"])
PEER_STOPPED = Gauge("raftkv_node_stopped_on_bad_storage",
                     "1: that node told this one it stopped on corrupt data or a failed disk, and has not come "
                     "back since", ["node"])

# Set once a second by a node or learner with TLS (raftkv/security/tls_files.py), for the alert rules.
TLS_CERT_EXPIRES = Gauge("raftkv_tls_certificate_expiry_timestamp_seconds",
                         "When the certificate this process presents expires (Unix time)")
TLS_FILES_REFUSED = Gauge("raftkv_tls_files_refused",
                          "1: this process's certificate, key or CA file changed but failed the checks (its log "
                          "says which and why); it serves with the files it had until they pass")


def init_partition(partition: int) -> None:
    """Create a partition's series at start, so they exist before the first event."""
    LEADER_CHANGES.labels(partition)
    IS_LEADER.labels(partition).set(0)
    PROPOSALS.labels(partition)
    JOURNAL_FSYNCS.labels(partition)
    for kind in ("entries", "snapshot"):
        RAFT_BYTES_SENT.labels(partition, kind)
    CHECKPOINT_BYTES_SENT.labels(partition)


def serve(host: str, port: int) -> None:
    """`/metrics` over plain HTTP (a learner's; a node's metrics port serves its console too)."""
    http_server.serve(make_wsgi_app(), host, port)
