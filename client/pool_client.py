"""PoolClient: the one client module that speaks gRPC; everything it returns or raises is a domain type."""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import grpc

from client.errors import (
    ConflictError,
    InvalidArgumentError,
    UnavailableError,
    error_attributes_of,
    error_class_of,
    error_from_status,
    retryable,
)
from protos import remote_pool_pb2 as pb
from protos import remote_pool_pb2_grpc as pb_grpc
from snapshot.keys import NUM_KEY_GROUPS
from snapshot.names import validate_job

KeyGroups = tuple[int, int]
T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter for UNAVAILABLE / RESOURCE_EXHAUSTED, bounded attempts."""

    max_attempts: int = 8
    initial_backoff_s: float = 0.05
    max_backoff_s: float = 2.0
    multiplier: float = 2.0
    # attempts when nothing listens at the address ("connection refused"); None: max_attempts. A worker started before
    # its pool keeps the full budget; a command line that reads a pool once gives up sooner (clink sources use 3).
    refused_attempts: int | None = None

    def backoff(self, attempt: int, rng: random.Random) -> float:
        """Sleep before retry number ``attempt`` (0-based): uniform in [0, min(cap, base * mult**attempt)]."""
        # full jitter, as store/retry.py backs off from the store: the client depends on no store code
        return rng.uniform(0.0, min(self.max_backoff_s, self.initial_backoff_s * self.multiplier**attempt))


# one MultiGet carries at most this many keys and key bytes (half the pool's default limits); larger asks are split
MULTI_GET_BATCH_KEYS = 50_000
MULTI_GET_BATCH_BYTES = 4 << 20


def _batches(sizes: list[int], max_items: int, max_bytes: int) -> Iterator[tuple[int, int]]:
    """[lo, hi) runs of items, each at most max_items long and max_bytes big (an item bigger alone is a run of one)."""
    lo, total = 0, 0
    for i, size in enumerate(sizes):
        if i > lo and (i - lo >= max_items or total + size > max_bytes):
            yield lo, i
            lo, total = i, 0
        total += size
    if lo < len(sizes) or not sizes:
        yield lo, len(sizes)


# grpc's words when a server answered at the address, but not in HTTP/2: no retry will change that
_NOT_HTTP2 = "Failed parsing HTTP/2"
_FRAME_TYPE = re.compile(r"got frame type (\d+)")
# the first bytes of an HTTP/1 answer read as an HTTP/2 frame header: "HTTP/1.1 400" (type 'P'), or "<!DOCTYPE" (type 'O'),
# the error page Python's http.server (the pool's --http-port) sends for HTTP/2's preface
_HTTP1_FRAME_TYPES = frozenset({ord("P"), ord("O")})


# grpc's words when nothing listens at the address (the TCP connection was refused)
_REFUSED = "connection refused"


def nothing_listening(code: grpc.StatusCode, details: str | None, address: str) -> str | None:
    """A one-line reason when a call failed because no server listens at ``address``, else None."""
    if code != grpc.StatusCode.UNAVAILABLE or not details or _REFUSED not in details.lower():
        return None
    return f"no pool is listening on {address} (start one with clink-pool serve)"


def not_a_pool(details: str | None, address: str) -> str | None:
    """A one-line reason when a call's failure says the server at ``address`` does not speak gRPC at all, else None."""
    if not details or _NOT_HTTP2 not in details:
        return None
    frame = _FRAME_TYPE.search(details)
    http1 = "http1.x" in details or (frame is not None and int(frame.group(1)) in _HTTP1_FRAME_TYPES)
    where = "the port given to clink-pool serve --listen (7420 by default)"
    if http1:
        return f"{address} is not a gRPC pool (HTTP/1 answered): is it the pool's --http-port? The pool speaks gRPC on {where}"
    return f"{address} is not a gRPC pool (it answered, but not in HTTP/2): the pool speaks gRPC on {where}"


def _unreachable(message: str, reason: str) -> UnavailableError:
    """UnavailableError for an address with no pool behind it; ``unreachable`` holds the reason without the call's name."""
    err = UnavailableError(message)
    err.unreachable = reason  # type: ignore[attr-defined]
    return err


@dataclass(frozen=True)
class PoolClientConfig:
    """How the client talks to a pool: deadlines per call kind, retries, message limits, credentials."""

    call_deadline_s: float = 10.0
    commit_deadline_s: float = 120.0
    scan_deadline_s: float = 300.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    max_message_bytes: int = 256 * 1024 * 1024
    commit_chunk_bytes: int = 1024 * 1024
    # Bearer token sent as the authorization metadata on every call; None sends none.
    token: str | None = None
    # PEM root certificates: set to talk TLS to the pool.
    tls_root_certificates: bytes | None = None
    tls_server_name: str | None = None
    # PEM client certificate chain and key, for pools that require mutual TLS
    tls_client_cert: bytes | None = None
    tls_client_key: bytes | None = None
    sleep: Callable[[float], None] = time.sleep
    seed: int | None = None


@dataclass(frozen=True)
class WriterLease:
    """A writer epoch for a job's key-group range, and the newest complete checkpoint when it was granted."""

    job: str
    key_groups: KeyGroups
    epoch: int
    latest_checkpoint_id: int


@dataclass(frozen=True)
class CheckpointInfo:
    """What the pool says about one checkpoint."""

    job: str
    checkpoint_id: int
    parent_id: int
    complete: bool
    committed_ranges: tuple[KeyGroups, ...]
    created_at_ms: int
    num_files: int
    total_bytes: int
    num_rows: int
    operators: dict[int, str]
    state_versions: str
    # etag of the complete checkpoint's _metadata (passed back on reads so the pool may answer from its cache)
    manifest_etag: str = ""
    # a complete checkpoint a rewind left behind: never the latest, and never restored from by default
    abandoned: bool = False
    # stored bytes of keyed rows per key group 0..127 (empty from older pools, and for incomplete checkpoints)
    key_group_bytes: tuple[int, ...] = ()
    operator_state_bytes: int = 0
    # op_ids of ``operators`` the pool knows hold no row (named by a committer that wrote none): a restore needs not declare them
    operators_without_state: frozenset[int] = frozenset()

    def range_bytes(self, lo: int, hi: int) -> int | None:
        """Stored bytes a reader of key groups lo..hi fetches (its keyed rows and all operator state); None if not reported."""
        if len(self.key_group_bytes) != NUM_KEY_GROUPS:
            return None
        return sum(self.key_group_bytes[lo : hi + 1]) + self.operator_state_bytes


@dataclass(frozen=True)
class CommitResult:
    """The outcome of a commit: the checkpoint as it now stands, and how many new bytes were written."""

    checkpoint: CheckpointInfo
    bytes_written: int
    attempts: int = 1
    # True when a retry was answered by the pool as a repeat of this writer's earlier, identical attempt that had landed
    recovered: bool = False


@dataclass(frozen=True)
class SavepointInfo:
    """A savepoint the pool wrote: savepoints/<job>/<name>/ in its store, one folded base file per part."""

    name: str
    checkpoint_id: int
    files: int
    bytes: int
    rows: int
    # the savepoint's folder relative to the pool's store (savepoints/<job>/<name>/): the store's URI is the operator's
    location: str


@dataclass(frozen=True)
class PinInfo:
    """A pin: the checkpoint it holds from retention and when it expires (ms since the epoch)."""

    checkpoint_id: int
    expires_at_ms: int


@dataclass(frozen=True)
class CompactionInfo:
    """What a compaction folded: the parts' key-group ranges, and the base files it wrote."""

    checkpoint_id: int
    folded: tuple[KeyGroups, ...]
    files_written: int
    bytes_written: int


@dataclass(frozen=True)
class GcInfo:
    """A GC run of one job: keys deleted (or, on a dry run, that would be), and what it saw."""

    dry_run: bool
    deleted: tuple[str, ...]
    deleted_bytes: int
    listed_objects: int
    referenced: int
    too_young: int


def _range(kg: KeyGroups) -> pb.KeyGroupRange:
    return pb.KeyGroupRange(lo=int(kg[0]), hi=int(kg[1]))


def _info(msg: pb.CheckpointInfo) -> CheckpointInfo:
    return CheckpointInfo(
        job=msg.job,
        checkpoint_id=msg.checkpoint_id,
        parent_id=msg.parent_id,
        complete=msg.complete,
        committed_ranges=tuple((r.lo, r.hi) for r in msg.committed_ranges),
        created_at_ms=msg.created_at_ms,
        num_files=msg.num_files,
        total_bytes=msg.total_bytes,
        num_rows=msg.num_rows,
        operators={o.op_id: o.uid for o in msg.operators},
        state_versions=msg.state_versions,
        manifest_etag=msg.manifest_etag,
        abandoned=msg.abandoned,
        key_group_bytes=tuple(msg.key_group_bytes),
        operator_state_bytes=msg.operator_state_bytes,
        operators_without_state=frozenset(o.op_id for o in msg.operators if o.without_state),
    )


class PoolClient:
    """A RemotePool connection: deadlines on every call, retries with backoff and jitter, domain errors only."""

    def __init__(self, address: str, config: PoolClientConfig | None = None) -> None:
        if not isinstance(address, str) or not address:
            raise InvalidArgumentError(f"pool address must be a non-empty 'host:port' string, got {address!r}")
        self.address = address
        self.config = config or PoolClientConfig()
        self._rng = random.Random(self.config.seed)
        options: list[tuple[str, int | str]] = [
            ("grpc.max_receive_message_length", self.config.max_message_bytes),
            ("grpc.max_send_message_length", self.config.max_message_bytes),
            # reconnect quickly so a pool that comes up late is found by the next retry, not after grpc's 1-120 s backoff
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 500),
        ]
        if self.config.tls_root_certificates is not None:
            if self.config.tls_server_name:
                options.append(("grpc.ssl_target_name_override", self.config.tls_server_name))
            creds = grpc.ssl_channel_credentials(
                root_certificates=self.config.tls_root_certificates,
                private_key=self.config.tls_client_key,
                certificate_chain=self.config.tls_client_cert,
            )
            self._channel = grpc.secure_channel(address, creds, options=options)
        else:
            if self.config.token:  # a proxy from the environment would read the token of a plaintext channel
                options.append(("grpc.enable_http_proxy", 0))
            self._channel = grpc.insecure_channel(address, options=options)
        self._stub = pb_grpc.RemotePoolStub(self._channel)
        self._metadata = (("authorization", f"Bearer {self.config.token}"),) if self.config.token else None
        self.calls = 0
        self.retries = 0

    # -- plumbing -----------------------------------------------------------------------------------

    def _call(self, what: str, fn: Callable[[], T], deadline_s: float | None = None) -> T:
        """Run an idempotent call, retrying retryable codes with full-jitter backoff; map failures to domain errors."""
        attempt = 0
        while True:
            self.calls += 1
            try:
                return fn()
            except grpc.RpcError as exc:
                self._back_off_or_raise(exc, what, attempt)
                attempt += 1

    def _back_off_or_raise(self, exc: grpc.RpcError, what: str, attempt: int) -> None:
        """Sleep before the next try if the failure is retryable and attempts remain; otherwise raise the domain error."""
        policy = self.config.retry
        code, error_class = exc.code(), error_class_of(exc)
        wrong_server = not_a_pool(exc.details(), self.address)
        if wrong_server is not None:
            raise _unreachable(f"{what}: {wrong_server}", wrong_server) from None
        refused = nothing_listening(code, exc.details(), self.address)
        attempts = policy.max_attempts
        if refused is not None and policy.refused_attempts is not None:
            attempts = min(attempts, max(1, policy.refused_attempts))
        if retryable(code, error_class) and attempt + 1 < attempts:
            self.retries += 1
            self.config.sleep(policy.backoff(attempt, self._rng))
            return
        if refused is not None:
            raise _unreachable(f"{what}: {refused} (gave up after {attempt + 1} attempt(s))", refused) from None
        err = error_from_status(code, exc.details(), what, error_class, error_attributes_of(exc))
        if retryable(code, error_class):
            err.args = (f"{err} (gave up after {attempt + 1} attempt(s))",)
        raise err from None

    def _deadline(self, deadline_s: float | None = None) -> float:
        return self.config.call_deadline_s if deadline_s is None else deadline_s

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def __enter__(self) -> PoolClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_ready(self, timeout_s: float = 10.0) -> None:
        """Block until the pool answers its health check as SERVING, or raise UnavailableError."""
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        stub = health_pb2_grpc.HealthStub(self._channel)
        end = time.monotonic() + timeout_s
        last = "no answer"
        while time.monotonic() < end:
            try:
                resp = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=min(1.0, timeout_s), metadata=self._metadata)
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return
                last = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
            except grpc.RpcError as exc:
                wrong_server = not_a_pool(exc.details(), self.address)
                if wrong_server is not None:
                    raise _unreachable(wrong_server, wrong_server) from None
                last = f"{exc.code().name}: {exc.details()}"
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    return  # a pool without the health service still serves RemotePool
            time.sleep(0.05)
        raise UnavailableError(f"pool at {self.address} not ready after {timeout_s:.1f}s ({last})")

    # -- the RemotePool calls -----------------------------------------------------------------------

    def acquire_writer(self, job: str, key_groups: KeyGroups, restore_from: int | None = None) -> WriterLease:
        """A fencing epoch for ``job``'s key-group range; fences older writers of overlapping ranges.

        ``restore_from``: the checkpoint the writer restores from; every restore needs a fresh epoch (a new attempt).
        """
        job = validate_job(job)  # refused here, before any call, by the rule the pool applies
        req = pb.AcquireWriterRequest(job=job, key_groups=_range(key_groups))
        if restore_from is not None:
            req.restore_from = restore_from
        resp = self._call(
            f"acquire writer for job {job} key groups {key_groups[0]}-{key_groups[1]}",
            lambda: self._stub.AcquireWriter(req, timeout=self._deadline(), metadata=self._metadata),
        )
        return WriterLease(job, (int(key_groups[0]), int(key_groups[1])), resp.epoch, resp.latest_checkpoint_id)

    def commit_checkpoint(
        self,
        job: str,
        checkpoint_id: int,
        parent_id: int,
        key_groups: KeyGroups,
        epoch: int,
        delta: bytes | memoryview,
        state_versions: str = "",
        operators: dict[int, str] | None = None,
    ) -> CommitResult:
        """Stream a changelog delta in ~1 MiB chunks and commit it, retrying after UNAVAILABLE / RESOURCE_EXHAUSTED.

        A retry is safe: the pool names a part by checkpoint, range and epoch, and answers a repeat of a commit that had
        landed (same delta bytes) as that commit's outcome (``recovered``); a different delta under the same name is a
        ConflictError. FAILED_PRECONDITION (fenced) and every other error are raised at once.
        """
        job = validate_job(job)
        header = pb.CommitHeader(
            job=job,
            checkpoint_id=checkpoint_id,
            parent_id=parent_id,
            key_groups=_range(key_groups),
            epoch=epoch,
            state_versions=state_versions,
            operators=[pb.OperatorInfo(op_id=o, uid=u or "") for o, u in sorted((operators or {}).items())],
        )
        view = memoryview(delta)
        step = max(1, int(self.config.commit_chunk_bytes))

        def chunks() -> Iterator[pb.CommitChunk]:
            header.attempt = attempt
            yield pb.CommitChunk(header=header)
            for start in range(0, len(view), step):
                yield pb.CommitChunk(delta=bytes(view[start : start + step]))

        what = f"commit checkpoint {checkpoint_id} of job {job} key groups {key_groups[0]}-{key_groups[1]}"
        attempt = 0
        while True:
            self.calls += 1
            try:
                resp = self._stub.CommitCheckpoint(chunks(), timeout=self.config.commit_deadline_s, metadata=self._metadata)
                info = _info(resp.checkpoint)
                return CommitResult(info, resp.bytes_written, attempts=attempt + 1, recovered=resp.repeated and attempt > 0)
            except grpc.RpcError as exc:
                self._back_off_or_raise(exc, what, attempt)
                attempt += 1

    def get(self, job: str, checkpoint_id: int, op_id: int, key: bytes, manifest_etag: str = "") -> bytes | None:
        """The value of one key at a checkpoint (0: newest complete), None when absent."""
        return self.multi_get_at(job, checkpoint_id, [op_id], [key], manifest_etag)[0][0]

    def multi_get(
        self, job: str, checkpoint_id: int, op_ids: Sequence[int], keys: Sequence[bytes], manifest_etag: str = ""
    ) -> list[bytes | None]:
        """Values of many keys in one call, in order; ``op_ids`` is one per key or a single shared one."""
        return self.multi_get_at(job, checkpoint_id, op_ids, keys, manifest_etag)[0]

    def multi_get_at(
        self, job: str, checkpoint_id: int, op_ids: Sequence[int], keys: Sequence[bytes], manifest_etag: str = ""
    ) -> tuple[list[bytes | None], str]:
        """multi_get, and the etag of the _metadata the pool read the answers from.

        ``manifest_etag``: the version of the checkpoint the caller holds (a backend's read checkpoint); a pool whose cached
        manifest has exactly it answers without reading _metadata again. Without it the pool reads _metadata to be sure.
        """
        job = validate_job(job)
        op_ids = list(op_ids)
        if len(op_ids) == 1 and len(keys) != 1:
            op_ids = op_ids * len(keys)  # the proto allows one shared op_id; pairing them up works with every pool version
        if len(op_ids) != len(keys):
            raise InvalidArgumentError(f"{len(op_ids)} op_ids for {len(keys)} keys; they must pair up")
        out: list[bytes | None] = []
        # batches within the pool's default limits (--max-multiget-keys, --max-multiget-key-mb), each pinned to the first's version
        for lo, hi in _batches([len(k) for k in keys], MULTI_GET_BATCH_KEYS, MULTI_GET_BATCH_BYTES):
            values, manifest_etag = self._multi_get_batch(job, checkpoint_id, op_ids[lo:hi], keys[lo:hi], manifest_etag)
            out.extend(values)
        return out, manifest_etag

    def _multi_get_batch(
        self, job: str, checkpoint_id: int, op_ids: list[int], keys: Sequence[bytes], manifest_etag: str
    ) -> tuple[list[bytes | None], str]:
        req = pb.MultiGetRequest(job=job, checkpoint_id=checkpoint_id, op_ids=op_ids, keys=list(keys), manifest_etag=manifest_etag)
        resp = self._call(
            f"multi-get of {len(keys)} key(s) from job {job} checkpoint {checkpoint_id}",
            lambda: self._stub.MultiGet(req, timeout=self._deadline(), metadata=self._metadata),
        )
        if len(resp.found) != len(keys) or len(resp.values) not in (len(keys), 0):
            raise UnavailableError(f"pool answered a multi-get of {len(keys)} key(s) with {len(resp.found)} result(s)")
        values = resp.values
        return [values[i] if hit else None for i, hit in enumerate(resp.found)], resp.manifest_etag

    def scan_checkpoint(
        self,
        job: str,
        checkpoint_id: int,
        key_groups: KeyGroups | None = None,
        op_ids: Sequence[int] = (),
        delta: bytes = b"",
        manifest_etag: str = "",
    ) -> bytes:
        """One canonical snapshot stream for a checkpoint, range and operators, with an optional changelog overlaid."""
        job = validate_job(job)
        req = pb.ScanCheckpointRequest(job=job, checkpoint_id=checkpoint_id, op_ids=list(op_ids), delta=delta, manifest_etag=manifest_etag)
        if key_groups is not None:
            req.key_groups.CopyFrom(_range(key_groups))

        def run() -> bytes:
            stream = self._stub.ScanCheckpoint(req, timeout=self.config.scan_deadline_s, metadata=self._metadata)
            return b"".join(chunk.data for chunk in stream)

        return self._call(f"scan of job {job} checkpoint {checkpoint_id}", run)

    def list_jobs(self) -> list[str]:
        """Every job the pool holds."""
        resp = self._call("list jobs", lambda: self._stub.ListJobs(pb.ListJobsRequest(), timeout=self._deadline(), metadata=self._metadata))
        return list(resp.jobs)

    def list_checkpoints(self, job: str, include_incomplete: bool = False) -> list[CheckpointInfo]:
        """Checkpoints of a job (complete ones unless asked), as the pool orders them."""
        job = validate_job(job)
        req = pb.ListCheckpointsRequest(job=job, include_incomplete=include_incomplete)
        resp = self._call(
            f"list checkpoints of job {job}", lambda: self._stub.ListCheckpoints(req, timeout=self._deadline(), metadata=self._metadata)
        )
        return [_info(c) for c in resp.checkpoints]

    def describe_checkpoint(self, job: str, checkpoint_id: int) -> tuple[CheckpointInfo, str]:
        """A checkpoint's info and its manifest JSON as stored."""
        job = validate_job(job)
        req = pb.DescribeCheckpointRequest(job=job, checkpoint_id=checkpoint_id)
        resp = self._call(
            f"describe checkpoint {checkpoint_id} of job {job}",
            lambda: self._stub.DescribeCheckpoint(req, timeout=self._deadline(), metadata=self._metadata),
        )
        return _info(resp.checkpoint), resp.manifest_json

    def resolve_handle(self, handle):  # noqa: ANN001, ANN201 - snapshot.handles.Handle -> pa.Table, typed in client/changelog_export.py
        """The verified rows of a checkpoint handle, so canonicalise_state_snapshot(data, store=this client) works."""
        from client.changelog_export import PoolHandleResolver

        return PoolHandleResolver(self).resolve_handle(handle)

    def delete_checkpoint(self, job: str, checkpoint_id: int) -> None:
        """Delete one checkpoint (its files are left to GC)."""
        job = validate_job(job)
        req = pb.DeleteCheckpointRequest(job=job, checkpoint_id=checkpoint_id)
        self._call(
            f"delete checkpoint {checkpoint_id} of job {job}",
            lambda: self._stub.DeleteCheckpoint(req, timeout=self._deadline(), metadata=self._metadata),
        )

    # -- lifecycle (pool/lifecycle.py on the pool's store) -------------------------------------------

    def savepoint(self, job: str, name: str | None = None, checkpoint_id: int = 0, deadline_s: float | None = None) -> SavepointInfo:
        """Fold a checkpoint (0: newest complete) into savepoints/<job>/<name>/ of the pool's store; ConflictError if taken.

        With no name the pool picks savepoint-<chk>-<6 hex>. A job's token writes only under its own job's folder.
        Not blindly repeated: the savepoint's manifest is put-if-absent, so a retry after UNAVAILABLE cannot overwrite
        anything, and a conflict on such a retry is reported saying the earlier attempt may have written it (with no
        name, such a retry may leave a second savepoint of the same checkpoint).
        """
        job = validate_job(job)
        name = validate_job(name, what="savepoint name") if name is not None else ""
        req = pb.SavepointRequest(job=job, checkpoint_id=checkpoint_id, name=name)
        what = f"savepoint {name or '(named by the pool)'!r} of job {job} checkpoint {checkpoint_id}"
        attempt = 0
        while True:
            self.calls += 1
            try:
                resp = self._stub.Savepoint(req, timeout=deadline_s or self.config.commit_deadline_s, metadata=self._metadata)
                return SavepointInfo(resp.name, resp.checkpoint_id, resp.files, resp.bytes, resp.rows, resp.location)
            except grpc.RpcError as exc:
                code, details = exc.code(), exc.details()
                if attempt and code in (grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.ABORTED):
                    raise ConflictError(
                        f"{what}: {details} (an earlier attempt failed with its outcome unknown: the savepoint may be that attempt's)"
                    ) from None
                self._back_off_or_raise(exc, what, attempt)
                attempt += 1

    def pin_checkpoint(self, job: str, holder: str, ttl_s: float, checkpoint_id: int = 0) -> PinInfo:
        """Hold a checkpoint (0: newest complete) from retention for ttl_s; pinning again renews (safe to repeat)."""
        job = validate_job(job)
        holder = validate_job(holder, what="pin holder")
        req = pb.PinCheckpointRequest(job=job, checkpoint_id=checkpoint_id, holder=holder, ttl_seconds=ttl_s)
        resp = self._call(
            f"pin checkpoint {checkpoint_id} of job {job} for {holder!r}",
            lambda: self._stub.PinCheckpoint(req, timeout=self._deadline(), metadata=self._metadata),
        )
        return PinInfo(resp.checkpoint_id, resp.expires_at_ms)

    def unpin_checkpoint(self, job: str, checkpoint_id: int, holder: str) -> None:
        """Remove holder's pin on a checkpoint (idempotent)."""
        job = validate_job(job)
        holder = validate_job(holder, what="pin holder")
        req = pb.UnpinCheckpointRequest(job=job, checkpoint_id=checkpoint_id, holder=holder)
        self._call(
            f"unpin checkpoint {checkpoint_id} of job {job} for {holder!r}",
            lambda: self._stub.UnpinCheckpoint(req, timeout=self._deadline(), metadata=self._metadata),
        )

    def compact_checkpoint(self, job: str, checkpoint_id: int = 0, force: bool = False, deadline_s: float | None = None) -> CompactionInfo:
        """Fold deep parts of a checkpoint (0: newest) into one base each; reads answer the same before and after.

        Retried like a read: the manifest is replaced by compare-and-swap, so a repeat after a lost reply finds the
        parts already folded (one layer each) and folds nothing; a concurrent change is ConflictError.
        """
        job = validate_job(job)
        req = pb.CompactCheckpointRequest(job=job, checkpoint_id=checkpoint_id, force=force)
        resp = self._call(
            f"compact checkpoint {checkpoint_id} of job {job}",
            lambda: self._stub.CompactCheckpoint(req, timeout=deadline_s or self.config.commit_deadline_s, metadata=self._metadata),
        )
        return CompactionInfo(resp.checkpoint_id, tuple((r.lo, r.hi) for r in resp.folded), resp.files_written, resp.bytes_written)

    def collect_garbage(self, job: str, dry_run: bool = False, deadline_s: float | None = None) -> GcInfo:
        """GC of one job's unreferenced data files older than the pool's minimum age (retried: recomputed each run)."""
        job = validate_job(job)
        req = pb.CollectGarbageRequest(job=job, dry_run=dry_run)
        resp = self._call(
            f"GC of job {job}",
            lambda: self._stub.CollectGarbage(req, timeout=deadline_s or self.config.commit_deadline_s, metadata=self._metadata),
        )
        return GcInfo(dry_run, tuple(resp.deleted), resp.deleted_bytes, resp.listed_objects, resp.referenced, resp.too_young)

    # -- live export ----------------------------------------------------------------------------------

    def announce_live_export(self, job: str, key_groups: KeyGroups, epoch: int, url: str, token: str, ttl_s: int) -> int:
        """Tell the pool that the writer of ``key_groups`` at ``epoch`` serves its live state at ``url``; the expiry in ms."""
        job = validate_job(job)
        req = pb.AnnounceLiveExportRequest(job=job, key_groups=_range(key_groups), epoch=epoch, url=url, token=token, ttl_seconds=ttl_s)
        resp = self._call(
            f"announce the live export of job {job} key groups {key_groups[0]}-{key_groups[1]}",
            lambda: self._stub.AnnounceLiveExport(req, timeout=self._deadline(), metadata=self._metadata),
        )
        return int(resp.expires_at_ms)

    def withdraw_live_export(self, job: str, key_groups: KeyGroups, epoch: int) -> None:
        """Withdraw that announcement (a subtask closing)."""
        job = validate_job(job)
        req = pb.WithdrawLiveExportRequest(job=job, key_groups=_range(key_groups), epoch=epoch)
        self._call(
            f"withdraw the live export of job {job} key groups {key_groups[0]}-{key_groups[1]}",
            lambda: self._stub.WithdrawLiveExport(req, timeout=self._deadline(), metadata=self._metadata),
        )
