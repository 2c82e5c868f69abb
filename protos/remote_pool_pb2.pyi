from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class KeyGroupRange(_message.Message):
    __slots__ = ("lo", "hi")
    LO_FIELD_NUMBER: _ClassVar[int]
    HI_FIELD_NUMBER: _ClassVar[int]
    lo: int
    hi: int
    def __init__(self, lo: _Optional[int] = ..., hi: _Optional[int] = ...) -> None: ...

class OperatorInfo(_message.Message):
    __slots__ = ("op_id", "uid", "without_state")
    OP_ID_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    WITHOUT_STATE_FIELD_NUMBER: _ClassVar[int]
    op_id: int
    uid: str
    without_state: bool
    def __init__(self, op_id: _Optional[int] = ..., uid: _Optional[str] = ..., without_state: _Optional[bool] = ...) -> None: ...

class AcquireWriterRequest(_message.Message):
    __slots__ = ("job", "key_groups", "restore_from")
    JOB_FIELD_NUMBER: _ClassVar[int]
    KEY_GROUPS_FIELD_NUMBER: _ClassVar[int]
    RESTORE_FROM_FIELD_NUMBER: _ClassVar[int]
    job: str
    key_groups: KeyGroupRange
    restore_from: int
    def __init__(self, job: _Optional[str] = ..., key_groups: _Optional[_Union[KeyGroupRange, _Mapping]] = ..., restore_from: _Optional[int] = ...) -> None: ...

class AcquireWriterResponse(_message.Message):
    __slots__ = ("epoch", "latest_checkpoint_id")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LATEST_CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    latest_checkpoint_id: int
    def __init__(self, epoch: _Optional[int] = ..., latest_checkpoint_id: _Optional[int] = ...) -> None: ...

class CommitHeader(_message.Message):
    __slots__ = ("job", "checkpoint_id", "parent_id", "key_groups", "epoch", "state_versions", "operators", "attempt")
    JOB_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_GROUPS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    STATE_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    OPERATORS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    job: str
    checkpoint_id: int
    parent_id: int
    key_groups: KeyGroupRange
    epoch: int
    state_versions: str
    operators: _containers.RepeatedCompositeFieldContainer[OperatorInfo]
    attempt: int
    def __init__(self, job: _Optional[str] = ..., checkpoint_id: _Optional[int] = ..., parent_id: _Optional[int] = ..., key_groups: _Optional[_Union[KeyGroupRange, _Mapping]] = ..., epoch: _Optional[int] = ..., state_versions: _Optional[str] = ..., operators: _Optional[_Iterable[_Union[OperatorInfo, _Mapping]]] = ..., attempt: _Optional[int] = ...) -> None: ...

class CommitChunk(_message.Message):
    __slots__ = ("header", "delta")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    header: CommitHeader
    delta: bytes
    def __init__(self, header: _Optional[_Union[CommitHeader, _Mapping]] = ..., delta: _Optional[bytes] = ...) -> None: ...

class CheckpointInfo(_message.Message):
    __slots__ = ("job", "checkpoint_id", "parent_id", "complete", "committed_ranges", "created_at_ms", "num_files", "total_bytes", "num_rows", "operators", "state_versions", "manifest_etag", "abandoned", "key_group_bytes", "operator_state_bytes")
    JOB_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_ID_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_RANGES_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    NUM_FILES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_ROWS_FIELD_NUMBER: _ClassVar[int]
    OPERATORS_FIELD_NUMBER: _ClassVar[int]
    STATE_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_ETAG_FIELD_NUMBER: _ClassVar[int]
    ABANDONED_FIELD_NUMBER: _ClassVar[int]
    KEY_GROUP_BYTES_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_STATE_BYTES_FIELD_NUMBER: _ClassVar[int]
    job: str
    checkpoint_id: int
    parent_id: int
    complete: bool
    committed_ranges: _containers.RepeatedCompositeFieldContainer[KeyGroupRange]
    created_at_ms: int
    num_files: int
    total_bytes: int
    num_rows: int
    operators: _containers.RepeatedCompositeFieldContainer[OperatorInfo]
    state_versions: str
    manifest_etag: str
    abandoned: bool
    key_group_bytes: _containers.RepeatedScalarFieldContainer[int]
    operator_state_bytes: int
    def __init__(self, job: _Optional[str] = ..., checkpoint_id: _Optional[int] = ..., parent_id: _Optional[int] = ..., complete: _Optional[bool] = ..., committed_ranges: _Optional[_Iterable[_Union[KeyGroupRange, _Mapping]]] = ..., created_at_ms: _Optional[int] = ..., num_files: _Optional[int] = ..., total_bytes: _Optional[int] = ..., num_rows: _Optional[int] = ..., operators: _Optional[_Iterable[_Union[OperatorInfo, _Mapping]]] = ..., state_versions: _Optional[str] = ..., manifest_etag: _Optional[str] = ..., abandoned: _Optional[bool] = ..., key_group_bytes: _Optional[_Iterable[int]] = ..., operator_state_bytes: _Optional[int] = ...) -> None: ...

class CommitCheckpointResponse(_message.Message):
    __slots__ = ("checkpoint", "bytes_written", "repeated")
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    BYTES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    REPEATED_FIELD_NUMBER: _ClassVar[int]
    checkpoint: CheckpointInfo
    bytes_written: int
    repeated: bool
    def __init__(self, checkpoint: _Optional[_Union[CheckpointInfo, _Mapping]] = ..., bytes_written: _Optional[int] = ..., repeated: _Optional[bool] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("job", "checkpoint_id", "op_id", "key_bytes", "manifest_etag")
    JOB_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    OP_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_ETAG_FIELD_NUMBER: _ClassVar[int]
    job: str
    checkpoint_id: int
    op_id: int
    key_bytes: bytes
    manifest_etag: str
    def __init__(self, job: _Optional[str] = ..., checkpoint_id: _Optional[int] = ..., op_id: _Optional[int] = ..., key_bytes: _Optional[bytes] = ..., manifest_etag: _Optional[str] = ...) -> None: ...

class GetResponse(_message.Message):
    __slots__ = ("found", "value", "checkpoint_id", "manifest_etag")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_ETAG_FIELD_NUMBER: _ClassVar[int]
    found: bool
    value: bytes
    checkpoint_id: int
    manifest_etag: str
    def __init__(self, found: _Optional[bool] = ..., value: _Optional[bytes] = ..., checkpoint_id: _Optional[int] = ..., manifest_etag: _Optional[str] = ...) -> None: ...

class MultiGetRequest(_message.Message):
    __slots__ = ("job", "checkpoint_id", "op_ids", "keys", "manifest_etag")
    JOB_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    OP_IDS_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_ETAG_FIELD_NUMBER: _ClassVar[int]
    job: str
    checkpoint_id: int
    op_ids: _containers.RepeatedScalarFieldContainer[int]
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    manifest_etag: str
    def __init__(self, job: _Optional[str] = ..., checkpoint_id: _Optional[int] = ..., op_ids: _Optional[_Iterable[int]] = ..., keys: _Optional[_Iterable[bytes]] = ..., manifest_etag: _Optional[str] = ...) -> None: ...

class MultiGetResponse(_message.Message):
    __slots__ = ("found", "values", "checkpoint_id", "manifest_etag")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_ETAG_FIELD_NUMBER: _ClassVar[int]
    found: _containers.RepeatedScalarFieldContainer[bool]
    values: _containers.RepeatedScalarFieldContainer[bytes]
    checkpoint_id: int
    manifest_etag: str
    def __init__(self, found: _Optional[_Iterable[bool]] = ..., values: _Optional[_Iterable[bytes]] = ..., checkpoint_id: _Optional[int] = ..., manifest_etag: _Optional[str] = ...) -> None: ...

class ScanCheckpointRequest(_message.Message):
    __slots__ = ("job", "checkpoint_id", "key_groups", "op_ids", "delta", "manifest_etag")
    JOB_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_GROUPS_FIELD_NUMBER: _ClassVar[int]
    OP_IDS_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_ETAG_FIELD_NUMBER: _ClassVar[int]
    job: str
    checkpoint_id: int
    key_groups: KeyGroupRange
    op_ids: _containers.RepeatedScalarFieldContainer[int]
    delta: bytes
    manifest_etag: str
    def __init__(self, job: _Optional[str] = ..., checkpoint_id: _Optional[int] = ..., key_groups: _Optional[_Union[KeyGroupRange, _Mapping]] = ..., op_ids: _Optional[_Iterable[int]] = ..., delta: _Optional[bytes] = ..., manifest_etag: _Optional[str] = ...) -> None: ...

class ScanChunk(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, jobs: _Optional[_Iterable[str]] = ...) -> None: ...

class ListCheckpointsRequest(_message.Message):
    __slots__ = ("job", "include_incomplete")
    JOB_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_INCOMPLETE_FIELD_NUMBER: _ClassVar[int]
    job: str
    include_incomplete: bool
    def __init__(self, job: _Optional[str] = ..., include_incomplete: _Optional[bool] = ...) -> None: ...

class ListCheckpointsResponse(_message.Message):
    __slots__ = ("checkpoints",)
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    checkpoints: _containers.RepeatedCompositeFieldContainer[CheckpointInfo]
    def __init__(self, checkpoints: _Optional[_Iterable[_Union[CheckpointInfo, _Mapping]]] = ...) -> None: ...

class DescribeCheckpointRequest(_message.Message):
    __slots__ = ("job", "checkpoint_id")
    JOB_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    job: str
    checkpoint_id: int
    def __init__(self, job: _Optional[str] = ..., checkpoint_id: _Optional[int] = ...) -> None: ...

class DescribeCheckpointResponse(_message.Message):
    __slots__ = ("checkpoint", "manifest_json")
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_JSON_FIELD_NUMBER: _ClassVar[int]
    checkpoint: CheckpointInfo
    manifest_json: str
    def __init__(self, checkpoint: _Optional[_Union[CheckpointInfo, _Mapping]] = ..., manifest_json: _Optional[str] = ...) -> None: ...

class DeleteCheckpointRequest(_message.Message):
    __slots__ = ("job", "checkpoint_id")
    JOB_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    job: str
    checkpoint_id: int
    def __init__(self, job: _Optional[str] = ..., checkpoint_id: _Optional[int] = ...) -> None: ...

class DeleteCheckpointResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SavepointRequest(_message.Message):
    __slots__ = ("job", "checkpoint_id", "name")
    JOB_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    job: str
    checkpoint_id: int
    name: str
    def __init__(self, job: _Optional[str] = ..., checkpoint_id: _Optional[int] = ..., name: _Optional[str] = ...) -> None: ...

class SavepointResponse(_message.Message):
    __slots__ = ("name", "checkpoint_id", "files", "bytes", "rows", "location")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    name: str
    checkpoint_id: int
    files: int
    bytes: int
    rows: int
    location: str
    def __init__(self, name: _Optional[str] = ..., checkpoint_id: _Optional[int] = ..., files: _Optional[int] = ..., bytes: _Optional[int] = ..., rows: _Optional[int] = ..., location: _Optional[str] = ...) -> None: ...

class PinCheckpointRequest(_message.Message):
    __slots__ = ("job", "checkpoint_id", "holder", "ttl_seconds")
    JOB_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    job: str
    checkpoint_id: int
    holder: str
    ttl_seconds: float
    def __init__(self, job: _Optional[str] = ..., checkpoint_id: _Optional[int] = ..., holder: _Optional[str] = ..., ttl_seconds: _Optional[float] = ...) -> None: ...

class PinCheckpointResponse(_message.Message):
    __slots__ = ("checkpoint_id", "expires_at_ms")
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: int
    expires_at_ms: int
    def __init__(self, checkpoint_id: _Optional[int] = ..., expires_at_ms: _Optional[int] = ...) -> None: ...

class UnpinCheckpointRequest(_message.Message):
    __slots__ = ("job", "checkpoint_id", "holder")
    JOB_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    job: str
    checkpoint_id: int
    holder: str
    def __init__(self, job: _Optional[str] = ..., checkpoint_id: _Optional[int] = ..., holder: _Optional[str] = ...) -> None: ...

class UnpinCheckpointResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CompactCheckpointRequest(_message.Message):
    __slots__ = ("job", "checkpoint_id", "force")
    JOB_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    job: str
    checkpoint_id: int
    force: bool
    def __init__(self, job: _Optional[str] = ..., checkpoint_id: _Optional[int] = ..., force: _Optional[bool] = ...) -> None: ...

class CompactCheckpointResponse(_message.Message):
    __slots__ = ("checkpoint_id", "folded", "files_written", "bytes_written")
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    FOLDED_FIELD_NUMBER: _ClassVar[int]
    FILES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    BYTES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: int
    folded: _containers.RepeatedCompositeFieldContainer[KeyGroupRange]
    files_written: int
    bytes_written: int
    def __init__(self, checkpoint_id: _Optional[int] = ..., folded: _Optional[_Iterable[_Union[KeyGroupRange, _Mapping]]] = ..., files_written: _Optional[int] = ..., bytes_written: _Optional[int] = ...) -> None: ...

class CollectGarbageRequest(_message.Message):
    __slots__ = ("job", "dry_run")
    JOB_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    job: str
    dry_run: bool
    def __init__(self, job: _Optional[str] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class CollectGarbageResponse(_message.Message):
    __slots__ = ("deleted", "deleted_bytes", "listed_objects", "referenced", "too_young")
    DELETED_FIELD_NUMBER: _ClassVar[int]
    DELETED_BYTES_FIELD_NUMBER: _ClassVar[int]
    LISTED_OBJECTS_FIELD_NUMBER: _ClassVar[int]
    REFERENCED_FIELD_NUMBER: _ClassVar[int]
    TOO_YOUNG_FIELD_NUMBER: _ClassVar[int]
    deleted: _containers.RepeatedScalarFieldContainer[str]
    deleted_bytes: int
    listed_objects: int
    referenced: int
    too_young: int
    def __init__(self, deleted: _Optional[_Iterable[str]] = ..., deleted_bytes: _Optional[int] = ..., listed_objects: _Optional[int] = ..., referenced: _Optional[int] = ..., too_young: _Optional[int] = ...) -> None: ...

class JobPolicy(_message.Message):
    __slots__ = ("keep_last", "compact_max_layers", "compact_max_delta_bytes", "maintenance_disabled", "updated_ms")
    KEEP_LAST_FIELD_NUMBER: _ClassVar[int]
    COMPACT_MAX_LAYERS_FIELD_NUMBER: _ClassVar[int]
    COMPACT_MAX_DELTA_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAINTENANCE_DISABLED_FIELD_NUMBER: _ClassVar[int]
    UPDATED_MS_FIELD_NUMBER: _ClassVar[int]
    keep_last: int
    compact_max_layers: int
    compact_max_delta_bytes: int
    maintenance_disabled: bool
    updated_ms: int
    def __init__(self, keep_last: _Optional[int] = ..., compact_max_layers: _Optional[int] = ..., compact_max_delta_bytes: _Optional[int] = ..., maintenance_disabled: _Optional[bool] = ..., updated_ms: _Optional[int] = ...) -> None: ...

class SetJobPolicyRequest(_message.Message):
    __slots__ = ("job", "policy", "clear", "fields")
    JOB_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    CLEAR_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    job: str
    policy: JobPolicy
    clear: bool
    fields: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, job: _Optional[str] = ..., policy: _Optional[_Union[JobPolicy, _Mapping]] = ..., clear: _Optional[bool] = ..., fields: _Optional[_Iterable[str]] = ...) -> None: ...

class SetJobPolicyResponse(_message.Message):
    __slots__ = ("policy", "cleared", "effective")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    CLEARED_FIELD_NUMBER: _ClassVar[int]
    EFFECTIVE_FIELD_NUMBER: _ClassVar[int]
    policy: JobPolicy
    cleared: bool
    effective: JobPolicy
    def __init__(self, policy: _Optional[_Union[JobPolicy, _Mapping]] = ..., cleared: _Optional[bool] = ..., effective: _Optional[_Union[JobPolicy, _Mapping]] = ...) -> None: ...

class GetJobPolicyRequest(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: str
    def __init__(self, job: _Optional[str] = ...) -> None: ...

class GetJobPolicyResponse(_message.Message):
    __slots__ = ("found", "policy", "effective")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    EFFECTIVE_FIELD_NUMBER: _ClassVar[int]
    found: bool
    policy: JobPolicy
    effective: JobPolicy
    def __init__(self, found: _Optional[bool] = ..., policy: _Optional[_Union[JobPolicy, _Mapping]] = ..., effective: _Optional[_Union[JobPolicy, _Mapping]] = ...) -> None: ...

class RetainCheckpointsRequest(_message.Message):
    __slots__ = ("job", "keep_last", "dry_run")
    JOB_FIELD_NUMBER: _ClassVar[int]
    KEEP_LAST_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    job: str
    keep_last: int
    dry_run: bool
    def __init__(self, job: _Optional[str] = ..., keep_last: _Optional[int] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class RetainCheckpointsResponse(_message.Message):
    __slots__ = ("deleted", "kept", "pinned", "keep_last", "keep_last_from", "dry_run")
    DELETED_FIELD_NUMBER: _ClassVar[int]
    KEPT_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    KEEP_LAST_FIELD_NUMBER: _ClassVar[int]
    KEEP_LAST_FROM_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    deleted: _containers.RepeatedScalarFieldContainer[int]
    kept: _containers.RepeatedScalarFieldContainer[int]
    pinned: _containers.RepeatedScalarFieldContainer[int]
    keep_last: int
    keep_last_from: str
    dry_run: bool
    def __init__(self, deleted: _Optional[_Iterable[int]] = ..., kept: _Optional[_Iterable[int]] = ..., pinned: _Optional[_Iterable[int]] = ..., keep_last: _Optional[int] = ..., keep_last_from: _Optional[str] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class AnnounceLiveExportRequest(_message.Message):
    __slots__ = ("job", "key_groups", "epoch", "url", "token", "ttl_seconds")
    JOB_FIELD_NUMBER: _ClassVar[int]
    KEY_GROUPS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    job: str
    key_groups: KeyGroupRange
    epoch: int
    url: str
    token: str
    ttl_seconds: int
    def __init__(self, job: _Optional[str] = ..., key_groups: _Optional[_Union[KeyGroupRange, _Mapping]] = ..., epoch: _Optional[int] = ..., url: _Optional[str] = ..., token: _Optional[str] = ..., ttl_seconds: _Optional[int] = ...) -> None: ...

class AnnounceLiveExportResponse(_message.Message):
    __slots__ = ("expires_at_ms",)
    EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    expires_at_ms: int
    def __init__(self, expires_at_ms: _Optional[int] = ...) -> None: ...

class WithdrawLiveExportRequest(_message.Message):
    __slots__ = ("job", "key_groups", "epoch")
    JOB_FIELD_NUMBER: _ClassVar[int]
    KEY_GROUPS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    job: str
    key_groups: KeyGroupRange
    epoch: int
    def __init__(self, job: _Optional[str] = ..., key_groups: _Optional[_Union[KeyGroupRange, _Mapping]] = ..., epoch: _Optional[int] = ...) -> None: ...

class WithdrawLiveExportResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
