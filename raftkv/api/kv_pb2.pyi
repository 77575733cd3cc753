from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Consistency(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LINEARIZABLE: _ClassVar[Consistency]
    LEADER: _ClassVar[Consistency]
    FOLLOWER: _ClassVar[Consistency]

class Code(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OK: _ClassVar[Code]
    NOT_LEADER: _ClassVar[Code]
    INVALID: _ClassVar[Code]
    UNAVAILABLE: _ClassVar[Code]
    UNDETERMINED: _ClassVar[Code]
    TIMEOUT: _ClassVar[Code]
    STORAGE_FULL: _ClassVar[Code]
    PERMISSION_DENIED: _ClassVar[Code]
    RESOURCE_EXHAUSTED: _ClassVar[Code]
    UNAUTHENTICATED: _ClassVar[Code]
LINEARIZABLE: Consistency
LEADER: Consistency
FOLLOWER: Consistency
OK: Code
NOT_LEADER: Code
INVALID: Code
UNAVAILABLE: Code
UNDETERMINED: Code
TIMEOUT: Code
STORAGE_FULL: Code
PERMISSION_DENIED: Code
RESOURCE_EXHAUSTED: Code
UNAUTHENTICATED: Code

class Put(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    value: bytes
    def __init__(self, key: _Optional[bytes] = ..., value: _Optional[bytes] = ...) -> None: ...

class Delete(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    def __init__(self, key: _Optional[bytes] = ...) -> None: ...

class DeleteRange(_message.Message):
    __slots__ = ("start", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: bytes
    end: bytes
    def __init__(self, start: _Optional[bytes] = ..., end: _Optional[bytes] = ...) -> None: ...

class Cas(_message.Message):
    __slots__ = ("key", "expected", "new")
    KEY_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_FIELD_NUMBER: _ClassVar[int]
    NEW_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    expected: bytes
    new: bytes
    def __init__(self, key: _Optional[bytes] = ..., expected: _Optional[bytes] = ..., new: _Optional[bytes] = ...) -> None: ...

class Mutation(_message.Message):
    __slots__ = ("put", "delete", "delete_range")
    PUT_FIELD_NUMBER: _ClassVar[int]
    DELETE_FIELD_NUMBER: _ClassVar[int]
    DELETE_RANGE_FIELD_NUMBER: _ClassVar[int]
    put: Put
    delete: Delete
    delete_range: DeleteRange
    def __init__(self, put: _Optional[_Union[Put, _Mapping]] = ..., delete: _Optional[_Union[Delete, _Mapping]] = ..., delete_range: _Optional[_Union[DeleteRange, _Mapping]] = ...) -> None: ...

class Batch(_message.Message):
    __slots__ = ("ops",)
    OPS_FIELD_NUMBER: _ClassVar[int]
    ops: _containers.RepeatedCompositeFieldContainer[Mutation]
    def __init__(self, ops: _Optional[_Iterable[_Union[Mutation, _Mapping]]] = ...) -> None: ...

class Guard(_message.Message):
    __slots__ = ("key", "expected")
    KEY_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    expected: bytes
    def __init__(self, key: _Optional[bytes] = ..., expected: _Optional[bytes] = ...) -> None: ...

class GuardedBatch(_message.Message):
    __slots__ = ("guards", "ops")
    GUARDS_FIELD_NUMBER: _ClassVar[int]
    OPS_FIELD_NUMBER: _ClassVar[int]
    guards: _containers.RepeatedCompositeFieldContainer[Guard]
    ops: _containers.RepeatedCompositeFieldContainer[Mutation]
    def __init__(self, guards: _Optional[_Iterable[_Union[Guard, _Mapping]]] = ..., ops: _Optional[_Iterable[_Union[Mutation, _Mapping]]] = ...) -> None: ...

class Get(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    def __init__(self, key: _Optional[bytes] = ...) -> None: ...

class RegisterLearner(_message.Message):
    __slots__ = ("name", "sink", "options")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    SINK_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    sink: str
    options: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., sink: _Optional[str] = ..., options: _Optional[_Mapping[str, str]] = ...) -> None: ...

class RemoveLearner(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class LearnerProgress(_message.Message):
    __slots__ = ("name", "index")
    NAME_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    name: str
    index: int
    def __init__(self, name: _Optional[str] = ..., index: _Optional[int] = ...) -> None: ...

class Op(_message.Message):
    __slots__ = ("partition", "put", "delete", "delete_range", "cas", "batch", "get", "register_learner", "remove_learner", "learner_progress", "put_many", "guarded_batch")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    PUT_FIELD_NUMBER: _ClassVar[int]
    DELETE_FIELD_NUMBER: _ClassVar[int]
    DELETE_RANGE_FIELD_NUMBER: _ClassVar[int]
    CAS_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    GET_FIELD_NUMBER: _ClassVar[int]
    REGISTER_LEARNER_FIELD_NUMBER: _ClassVar[int]
    REMOVE_LEARNER_FIELD_NUMBER: _ClassVar[int]
    LEARNER_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    PUT_MANY_FIELD_NUMBER: _ClassVar[int]
    GUARDED_BATCH_FIELD_NUMBER: _ClassVar[int]
    partition: int
    put: Put
    delete: Delete
    delete_range: DeleteRange
    cas: Cas
    batch: Batch
    get: Get
    register_learner: RegisterLearner
    remove_learner: RemoveLearner
    learner_progress: LearnerProgress
    put_many: Columns
    guarded_batch: GuardedBatch
    def __init__(self, partition: _Optional[int] = ..., put: _Optional[_Union[Put, _Mapping]] = ..., delete: _Optional[_Union[Delete, _Mapping]] = ..., delete_range: _Optional[_Union[DeleteRange, _Mapping]] = ..., cas: _Optional[_Union[Cas, _Mapping]] = ..., batch: _Optional[_Union[Batch, _Mapping]] = ..., get: _Optional[_Union[Get, _Mapping]] = ..., register_learner: _Optional[_Union[RegisterLearner, _Mapping]] = ..., remove_learner: _Optional[_Union[RemoveLearner, _Mapping]] = ..., learner_progress: _Optional[_Union[LearnerProgress, _Mapping]] = ..., put_many: _Optional[_Union[Columns, _Mapping]] = ..., guarded_batch: _Optional[_Union[GuardedBatch, _Mapping]] = ...) -> None: ...

class ExecuteRequest(_message.Message):
    __slots__ = ("ops", "consistency", "forwarded", "id", "timeout_ms")
    OPS_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_FIELD_NUMBER: _ClassVar[int]
    FORWARDED_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    ops: _containers.RepeatedCompositeFieldContainer[Op]
    consistency: Consistency
    forwarded: bool
    id: int
    timeout_ms: int
    def __init__(self, ops: _Optional[_Iterable[_Union[Op, _Mapping]]] = ..., consistency: _Optional[_Union[Consistency, str]] = ..., forwarded: _Optional[bool] = ..., id: _Optional[int] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class Result(_message.Message):
    __slots__ = ("code", "message", "leader_hint", "found", "value", "cas_succeeded", "applied_index")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LEADER_HINT_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    CAS_SUCCEEDED_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    code: Code
    message: str
    leader_hint: str
    found: bool
    value: bytes
    cas_succeeded: bool
    applied_index: int
    def __init__(self, code: _Optional[_Union[Code, str]] = ..., message: _Optional[str] = ..., leader_hint: _Optional[str] = ..., found: _Optional[bool] = ..., value: _Optional[bytes] = ..., cas_succeeded: _Optional[bool] = ..., applied_index: _Optional[int] = ...) -> None: ...

class ExecuteResponse(_message.Message):
    __slots__ = ("results", "id", "refused")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[Result]
    id: int
    refused: Result
    def __init__(self, results: _Optional[_Iterable[_Union[Result, _Mapping]]] = ..., id: _Optional[int] = ..., refused: _Optional[_Union[Result, _Mapping]] = ...) -> None: ...

class ScanRequest(_message.Message):
    __slots__ = ("partition", "start", "end", "limit", "consistency", "columnar")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_FIELD_NUMBER: _ClassVar[int]
    COLUMNAR_FIELD_NUMBER: _ClassVar[int]
    partition: int
    start: bytes
    end: bytes
    limit: int
    consistency: Consistency
    columnar: bool
    def __init__(self, partition: _Optional[int] = ..., start: _Optional[bytes] = ..., end: _Optional[bytes] = ..., limit: _Optional[int] = ..., consistency: _Optional[_Union[Consistency, str]] = ..., columnar: _Optional[bool] = ...) -> None: ...

class KeyValue(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    value: bytes
    def __init__(self, key: _Optional[bytes] = ..., value: _Optional[bytes] = ...) -> None: ...

class Columns(_message.Message):
    __slots__ = ("count", "keys", "key_offsets", "values", "value_offsets")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    KEY_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    VALUE_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    count: int
    keys: bytes
    key_offsets: bytes
    values: bytes
    value_offsets: bytes
    def __init__(self, count: _Optional[int] = ..., keys: _Optional[bytes] = ..., key_offsets: _Optional[bytes] = ..., values: _Optional[bytes] = ..., value_offsets: _Optional[bytes] = ...) -> None: ...

class ScanChunk(_message.Message):
    __slots__ = ("items", "applied_index", "columns", "applied_term")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_TERM_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[KeyValue]
    applied_index: int
    columns: Columns
    applied_term: int
    def __init__(self, items: _Optional[_Iterable[_Union[KeyValue, _Mapping]]] = ..., applied_index: _Optional[int] = ..., columns: _Optional[_Union[Columns, _Mapping]] = ..., applied_term: _Optional[int] = ...) -> None: ...

class SplitKeysRequest(_message.Message):
    __slots__ = ("partition", "start", "end", "every")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    EVERY_FIELD_NUMBER: _ClassVar[int]
    partition: int
    start: bytes
    end: bytes
    every: int
    def __init__(self, partition: _Optional[int] = ..., start: _Optional[bytes] = ..., end: _Optional[bytes] = ..., every: _Optional[int] = ...) -> None: ...

class SplitKeysResponse(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, keys: _Optional[_Iterable[bytes]] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ("brief",)
    BRIEF_FIELD_NUMBER: _ClassVar[int]
    brief: bool
    def __init__(self, brief: _Optional[bool] = ...) -> None: ...

class NodeInfo(_message.Message):
    __slots__ = ("id", "api_address")
    ID_FIELD_NUMBER: _ClassVar[int]
    API_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    id: str
    api_address: str
    def __init__(self, id: _Optional[str] = ..., api_address: _Optional[str] = ...) -> None: ...

class PartitionStatus(_message.Message):
    __slots__ = ("partition", "role", "leader", "term", "commit_index", "applied_index", "last_log_index", "replicas", "has_quorum", "learners", "last_data_index", "members")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    COMMIT_INDEX_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    HAS_QUORUM_FIELD_NUMBER: _ClassVar[int]
    LEARNERS_FIELD_NUMBER: _ClassVar[int]
    LAST_DATA_INDEX_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    partition: int
    role: str
    leader: str
    term: int
    commit_index: int
    applied_index: int
    last_log_index: int
    replicas: _containers.RepeatedScalarFieldContainer[str]
    has_quorum: bool
    learners: _containers.RepeatedCompositeFieldContainer[LearnerStatus]
    last_data_index: int
    members: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, partition: _Optional[int] = ..., role: _Optional[str] = ..., leader: _Optional[str] = ..., term: _Optional[int] = ..., commit_index: _Optional[int] = ..., applied_index: _Optional[int] = ..., last_log_index: _Optional[int] = ..., replicas: _Optional[_Iterable[str]] = ..., has_quorum: _Optional[bool] = ..., learners: _Optional[_Iterable[_Union[LearnerStatus, _Mapping]]] = ..., last_data_index: _Optional[int] = ..., members: _Optional[_Iterable[str]] = ...) -> None: ...

class LearnerStatus(_message.Message):
    __slots__ = ("name", "sink", "options", "progress")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    SINK_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    name: str
    sink: str
    options: _containers.ScalarMap[str, str]
    progress: int
    def __init__(self, name: _Optional[str] = ..., sink: _Optional[str] = ..., options: _Optional[_Mapping[str, str]] = ..., progress: _Optional[int] = ...) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("node_id", "cluster", "partitions", "nodes", "hosted", "meta_epoch", "version", "learners")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    HOSTED_FIELD_NUMBER: _ClassVar[int]
    META_EPOCH_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    LEARNERS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    cluster: str
    partitions: int
    nodes: _containers.RepeatedCompositeFieldContainer[NodeInfo]
    hosted: _containers.RepeatedCompositeFieldContainer[PartitionStatus]
    meta_epoch: int
    version: str
    learners: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, node_id: _Optional[str] = ..., cluster: _Optional[str] = ..., partitions: _Optional[int] = ..., nodes: _Optional[_Iterable[_Union[NodeInfo, _Mapping]]] = ..., hosted: _Optional[_Iterable[_Union[PartitionStatus, _Mapping]]] = ..., meta_epoch: _Optional[int] = ..., version: _Optional[str] = ..., learners: _Optional[_Iterable[str]] = ...) -> None: ...

class FollowRequest(_message.Message):
    __slots__ = ("after",)
    class AfterEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    AFTER_FIELD_NUMBER: _ClassVar[int]
    after: _containers.ScalarMap[int, int]
    def __init__(self, after: _Optional[_Mapping[int, int]] = ...) -> None: ...

class OffsetsRequest(_message.Message):
    __slots__ = ("after", "max_rows")
    class AfterEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    AFTER_FIELD_NUMBER: _ClassVar[int]
    MAX_ROWS_FIELD_NUMBER: _ClassVar[int]
    after: _containers.ScalarMap[int, int]
    max_rows: int
    def __init__(self, after: _Optional[_Mapping[int, int]] = ..., max_rows: _Optional[int] = ...) -> None: ...

class PartitionOffsets(_message.Message):
    __slots__ = ("partition", "earliest", "latest", "end", "resyncs")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    EARLIEST_FIELD_NUMBER: _ClassVar[int]
    LATEST_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    RESYNCS_FIELD_NUMBER: _ClassVar[int]
    partition: int
    earliest: int
    latest: int
    end: int
    resyncs: _containers.RepeatedCompositeFieldContainer[Resync]
    def __init__(self, partition: _Optional[int] = ..., earliest: _Optional[int] = ..., latest: _Optional[int] = ..., end: _Optional[int] = ..., resyncs: _Optional[_Iterable[_Union[Resync, _Mapping]]] = ...) -> None: ...

class Resync(_message.Message):
    __slots__ = ("base", "index")
    BASE_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    base: int
    index: int
    def __init__(self, base: _Optional[int] = ..., index: _Optional[int] = ...) -> None: ...

class OffsetsResponse(_message.Message):
    __slots__ = ("partitions",)
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionOffsets]
    def __init__(self, partitions: _Optional[_Iterable[_Union[PartitionOffsets, _Mapping]]] = ...) -> None: ...

class ChangesRequest(_message.Message):
    __slots__ = ("partition", "after", "until")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    partition: int
    after: int
    until: int
    def __init__(self, partition: _Optional[int] = ..., after: _Optional[int] = ..., until: _Optional[int] = ...) -> None: ...

class Change(_message.Message):
    __slots__ = ("index", "seq", "op", "key", "before", "after", "term", "snapshot", "ts_ms")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    TS_MS_FIELD_NUMBER: _ClassVar[int]
    index: int
    seq: int
    op: str
    key: bytes
    before: bytes
    after: bytes
    term: int
    snapshot: bool
    ts_ms: int
    def __init__(self, index: _Optional[int] = ..., seq: _Optional[int] = ..., op: _Optional[str] = ..., key: _Optional[bytes] = ..., before: _Optional[bytes] = ..., after: _Optional[bytes] = ..., term: _Optional[int] = ..., snapshot: _Optional[bool] = ..., ts_ms: _Optional[int] = ...) -> None: ...

class ChangesChunk(_message.Message):
    __slots__ = ("changes", "partition", "through")
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    THROUGH_FIELD_NUMBER: _ClassVar[int]
    changes: _containers.RepeatedCompositeFieldContainer[Change]
    partition: int
    through: int
    def __init__(self, changes: _Optional[_Iterable[_Union[Change, _Mapping]]] = ..., partition: _Optional[int] = ..., through: _Optional[int] = ...) -> None: ...

class StopReport(_message.Message):
    __slots__ = ("node", "reason")
    NODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    node: str
    reason: str
    def __init__(self, node: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class StopAck(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeReportRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ConsoleEvent(_message.Message):
    __slots__ = ("at", "kind", "subject", "text", "node")
    AT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    at: float
    kind: str
    subject: str
    text: str
    node: str
    def __init__(self, at: _Optional[float] = ..., kind: _Optional[str] = ..., subject: _Optional[str] = ..., text: _Optional[str] = ..., node: _Optional[str] = ...) -> None: ...

class NodeReportResponse(_message.Message):
    __slots__ = ("node_id", "started_at", "rss_bytes", "cpu_percent", "data_bytes", "disk_free_bytes", "write_rate", "read_rate", "events")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    CPU_PERCENT_FIELD_NUMBER: _ClassVar[int]
    DATA_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    WRITE_RATE_FIELD_NUMBER: _ClassVar[int]
    READ_RATE_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    started_at: float
    rss_bytes: int
    cpu_percent: float
    data_bytes: int
    disk_free_bytes: int
    write_rate: float
    read_rate: float
    events: _containers.RepeatedCompositeFieldContainer[ConsoleEvent]
    def __init__(self, node_id: _Optional[str] = ..., started_at: _Optional[float] = ..., rss_bytes: _Optional[int] = ..., cpu_percent: _Optional[float] = ..., data_bytes: _Optional[int] = ..., disk_free_bytes: _Optional[int] = ..., write_rate: _Optional[float] = ..., read_rate: _Optional[float] = ..., events: _Optional[_Iterable[_Union[ConsoleEvent, _Mapping]]] = ...) -> None: ...

class TopologyRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeRecord(_message.Message):
    __slots__ = ("id", "host", "api_port", "metrics_port", "raft_port_base", "state", "meta_port")
    ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    API_PORT_FIELD_NUMBER: _ClassVar[int]
    METRICS_PORT_FIELD_NUMBER: _ClassVar[int]
    RAFT_PORT_BASE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    META_PORT_FIELD_NUMBER: _ClassVar[int]
    id: str
    host: str
    api_port: int
    metrics_port: int
    raft_port_base: int
    state: str
    meta_port: int
    def __init__(self, id: _Optional[str] = ..., host: _Optional[str] = ..., api_port: _Optional[int] = ..., metrics_port: _Optional[int] = ..., raft_port_base: _Optional[int] = ..., state: _Optional[str] = ..., meta_port: _Optional[int] = ...) -> None: ...

class Voters(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, nodes: _Optional[_Iterable[str]] = ...) -> None: ...

class MoveInfo(_message.Message):
    __slots__ = ("group", "source", "target", "step")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    group: int
    source: str
    target: str
    step: str
    def __init__(self, group: _Optional[int] = ..., source: _Optional[str] = ..., target: _Optional[str] = ..., step: _Optional[str] = ...) -> None: ...

class TopologyResponse(_message.Message):
    __slots__ = ("epoch", "nodes", "placement", "moves", "meta_leader", "replication", "meta_voters", "spec_toml", "cluster_id", "access", "cluster_version")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    MOVES_FIELD_NUMBER: _ClassVar[int]
    META_LEADER_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FIELD_NUMBER: _ClassVar[int]
    META_VOTERS_FIELD_NUMBER: _ClassVar[int]
    SPEC_TOML_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    ACCESS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_VERSION_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    nodes: _containers.RepeatedCompositeFieldContainer[NodeRecord]
    placement: _containers.RepeatedCompositeFieldContainer[Voters]
    moves: _containers.RepeatedCompositeFieldContainer[MoveInfo]
    meta_leader: str
    replication: int
    meta_voters: Voters
    spec_toml: str
    cluster_id: str
    access: bytes
    cluster_version: str
    def __init__(self, epoch: _Optional[int] = ..., nodes: _Optional[_Iterable[_Union[NodeRecord, _Mapping]]] = ..., placement: _Optional[_Iterable[_Union[Voters, _Mapping]]] = ..., moves: _Optional[_Iterable[_Union[MoveInfo, _Mapping]]] = ..., meta_leader: _Optional[str] = ..., replication: _Optional[int] = ..., meta_voters: _Optional[_Union[Voters, _Mapping]] = ..., spec_toml: _Optional[str] = ..., cluster_id: _Optional[str] = ..., access: _Optional[bytes] = ..., cluster_version: _Optional[str] = ...) -> None: ...

class ChangeTopologyRequest(_message.Message):
    __slots__ = ("command",)
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    command: bytes
    def __init__(self, command: _Optional[bytes] = ...) -> None: ...

class ReplicaRequest(_message.Message):
    __slots__ = ("group", "log_index", "linearizable")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    LINEARIZABLE_FIELD_NUMBER: _ClassVar[int]
    group: int
    log_index: int
    linearizable: bool
    def __init__(self, group: _Optional[int] = ..., log_index: _Optional[int] = ..., linearizable: _Optional[bool] = ...) -> None: ...

class ReplicaState(_message.Message):
    __slots__ = ("mode", "applied_index", "commit_index", "leader", "snapshot_bytes_received", "log_index_term", "base", "term", "guarded", "last_log_index", "last_log_term")
    MODE_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    COMMIT_INDEX_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    LOG_INDEX_TERM_FIELD_NUMBER: _ClassVar[int]
    BASE_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    GUARDED_FIELD_NUMBER: _ClassVar[int]
    LAST_LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_LOG_TERM_FIELD_NUMBER: _ClassVar[int]
    mode: str
    applied_index: int
    commit_index: int
    leader: str
    snapshot_bytes_received: int
    log_index_term: int
    base: _containers.RepeatedCompositeFieldContainer[LogEntry]
    term: int
    guarded: bool
    last_log_index: int
    last_log_term: int
    def __init__(self, mode: _Optional[str] = ..., applied_index: _Optional[int] = ..., commit_index: _Optional[int] = ..., leader: _Optional[str] = ..., snapshot_bytes_received: _Optional[int] = ..., log_index_term: _Optional[int] = ..., base: _Optional[_Iterable[_Union[LogEntry, _Mapping]]] = ..., term: _Optional[int] = ..., guarded: _Optional[bool] = ..., last_log_index: _Optional[int] = ..., last_log_term: _Optional[int] = ...) -> None: ...

class CheckpointChunk(_message.Message):
    __slots__ = ("index", "term", "path", "data", "base", "files")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    BASE_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    index: int
    term: int
    path: str
    data: bytes
    base: _containers.RepeatedCompositeFieldContainer[LogEntry]
    files: _containers.RepeatedCompositeFieldContainer[CheckpointFile]
    def __init__(self, index: _Optional[int] = ..., term: _Optional[int] = ..., path: _Optional[str] = ..., data: _Optional[bytes] = ..., base: _Optional[_Iterable[_Union[LogEntry, _Mapping]]] = ..., files: _Optional[_Iterable[_Union[CheckpointFile, _Mapping]]] = ...) -> None: ...

class CheckpointFile(_message.Message):
    __slots__ = ("path", "size", "sha256")
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    path: str
    size: int
    sha256: str
    def __init__(self, path: _Optional[str] = ..., size: _Optional[int] = ..., sha256: _Optional[str] = ...) -> None: ...

class CheckpointFilesRequest(_message.Message):
    __slots__ = ("replica", "paths")
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    PATHS_FIELD_NUMBER: _ClassVar[int]
    replica: ReplicaRequest
    paths: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, replica: _Optional[_Union[ReplicaRequest, _Mapping]] = ..., paths: _Optional[_Iterable[str]] = ...) -> None: ...

class LogEntry(_message.Message):
    __slots__ = ("command", "index", "term")
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    command: bytes
    index: int
    term: int
    def __init__(self, command: _Optional[bytes] = ..., index: _Optional[int] = ..., term: _Optional[int] = ...) -> None: ...

class ChangeMembershipRequest(_message.Message):
    __slots__ = ("group", "action", "node")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    group: int
    action: str
    node: str
    def __init__(self, group: _Optional[int] = ..., action: _Optional[str] = ..., node: _Optional[str] = ...) -> None: ...

class TransferLeadershipRequest(_message.Message):
    __slots__ = ("group", "node")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    group: int
    node: str
    def __init__(self, group: _Optional[int] = ..., node: _Optional[str] = ...) -> None: ...

class ChangeMembershipResponse(_message.Message):
    __slots__ = ("done", "leader")
    DONE_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    done: bool
    leader: str
    def __init__(self, done: _Optional[bool] = ..., leader: _Optional[str] = ...) -> None: ...
