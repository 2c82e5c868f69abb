"""Domain types of the pool: configuration, key-group ranges, commit requests and checkpoint descriptions (no gRPC)."""

from __future__ import annotations

from dataclasses import dataclass, field

from snapshot import NUM_KEY_GROUPS, check_key_group_range
from snapshot.errors import InvalidArgumentError
from store.datafile import DEFAULT_BLOCK_TARGET_BYTES, DEFAULT_SEGMENT_TARGET_BYTES

MAX_CHECKPOINT_ID = (1 << 63) - 1


@dataclass(frozen=True)
class LiveExportConfig:
    """How the pool merges running subtasks' live state (GET /jobs/JOB/state.arrow?live=1, pool/live_exports.py)."""

    # seconds a subtask has to answer in all before the export gives 503 naming its range
    fetch_timeout_s: float = 10.0
    # the longest expiry a subtask may ask for its announcement (it renews well before)
    max_ttl_s: int = 300
    # bytes the pool takes from all subtasks of one live export together (the merge holds them in memory)
    max_bytes: int = 1 << 30
    # announcements the pool keeps in all (each range replaces the overlapping ones of its job)
    max_announcements: int = 4096
    # PEM roots the pool trusts for https:// subtask URLs (None: the system's)
    ca_pem: bytes | None = None

    def __post_init__(self) -> None:
        if not self.fetch_timeout_s > 0:
            raise InvalidArgumentError(f"live fetch_timeout_s = {self.fetch_timeout_s} must be positive")
        for name in ("max_ttl_s", "max_bytes", "max_announcements"):
            if isinstance(getattr(self, name), bool) or not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise InvalidArgumentError(f"live {name} = {getattr(self, name)!r} must be a positive int")


@dataclass(frozen=True)
class PoolConfig:
    """Tuning of one PoolCore: cache size, scan chunking, job-id limit, data-file segment size, CAS retries, read indexing."""

    cache_bytes: int = 256 << 20
    scan_chunk_bytes: int = 1 << 20
    max_job_id_bytes: int = 128
    segment_target_bytes: int = DEFAULT_SEGMENT_TARGET_BYTES
    block_target_bytes: int = DEFAULT_BLOCK_TARGET_BYTES  # a point read's unit: one record batch of about this many bytes
    max_cas_attempts: int = 64
    resolved_index_after: int = 8  # point-read batches on one checkpoint before its merged view is indexed (-1: never)
    # a commit that takes longer publishes nothing: GC's minimum age (which must exceed this) protects its new files
    max_commit_s: float = 600.0
    # what one request may carry (each past its limit: RESOURCE_EXHAUSTED naming it, nothing read further)
    max_multiget_keys: int = 100_000
    max_multiget_key_bytes: int = 8 << 20
    max_commit_bytes: int = 1 << 30
    # estimated working memory of the commits and scan overlays in flight, in all (pool/budget.py); past it they wait, then
    # get RESOURCE_EXHAUSTED
    request_memory_bytes: int = 1 << 30
    max_scan_op_ids: int = 1024  # operators one scan may filter to (each distinct filter is cached apart)
    live: LiveExportConfig = field(default_factory=LiveExportConfig)

    def __post_init__(self) -> None:
        if not self.max_commit_s > 0:
            raise InvalidArgumentError(f"max_commit_s = {self.max_commit_s} must be positive")
        for name in ("segment_target_bytes", "block_target_bytes"):
            if isinstance(getattr(self, name), bool) or not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise InvalidArgumentError(f"{name} = {getattr(self, name)!r} must be a positive number of bytes")


@dataclass(frozen=True)
class KeyGroupRange:
    """An inclusive key-group range, validated 0 <= lo <= hi <= 127."""

    lo: int
    hi: int

    def __post_init__(self) -> None:
        check_key_group_range(self.lo, self.hi, refuse_bools=True)

    def overlaps(self, other: KeyGroupRange) -> bool:
        """Whether the two ranges share a key group."""
        return self.lo <= other.hi and other.lo <= self.hi

    def __str__(self) -> str:
        return f"{self.lo}-{self.hi}"


FULL_RANGE = KeyGroupRange(0, NUM_KEY_GROUPS - 1)


@dataclass(frozen=True)
class CommitRequest:
    """One subtask's commit of its key-group range of checkpoint N (the delta arrives separately as chunks)."""

    job: str
    checkpoint_id: int
    parent_id: int
    key_groups: KeyGroupRange
    epoch: int
    state_versions: str = ""
    operators: tuple[tuple[int, str], ...] = ()
    attempt: int = 0  # a client's retry number (0: first): a retry looks for its earlier attempt's part before uploading


@dataclass(frozen=True)
class CheckpointInfo:
    """A checkpoint as listed: complete once its _metadata exists; files, bytes and rows count every referenced file."""

    job: str
    checkpoint_id: int
    parent_id: int
    complete: bool
    committed_ranges: tuple[KeyGroupRange, ...]
    created_at_ms: int
    num_files: int
    total_bytes: int
    num_rows: int
    operators: tuple[tuple[int, str], ...]
    state_versions: str
    # the etag of the _metadata described (complete checkpoints): a client passes it back so a pool may serve its cache
    manifest_etag: str = ""
    # a complete checkpoint a rewind left behind (made by an older attempt after some writer's restore point)
    abandoned: bool = False
    # stored bytes of keyed rows per key group (128 entries; empty for incomplete checkpoints) and of operator state
    key_group_bytes: tuple[int, ...] = ()
    operator_state_bytes: int = 0
    # op_ids of ``operators`` known to hold no row (named by a committer that wrote none); a safe restore needs not declare them
    operators_without_state: tuple[int, ...] = ()


@dataclass(frozen=True)
class CommitResult:
    """What a commit did: the checkpoint as it now stands, the bytes this commit wrote, and whether it repeated an earlier one."""

    checkpoint: CheckpointInfo
    bytes_written: int
    repeated: bool = False
