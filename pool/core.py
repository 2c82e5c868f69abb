"""The pool's domain core: fenced, incremental, multi-part checkpoint commits and reads over one ObjectStore."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pool.budget import COMMIT_WORKING_FACTOR, Holding, MemoryBudget
from pool.domain import MAX_CHECKPOINT_ID, CheckpointInfo, CommitRequest, CommitResult, KeyGroupRange, PoolConfig
from pool.live_exports import LiveExports, LiveState
from pool.point_read import PointReads
from pool.protocol import CommitProtocol, incomplete_info, info_of, remove_checkpoint
from pool.streaming import stream_chunks
from pool.writers import Fencing
from snapshot import (
    NUM_KEY_GROUPS,
    ROW_PUT,
    SnapshotArrowWriter,
    StateVersionMap,
    filter_key_groups,
    has_adjacent_repeats,
    leading_bytes,
    operator_id,
    overlay,
    read_snapshot,
    replay_changelog,
    sort_for_layout,
)
from snapshot.errors import (
    ConflictError,
    CorruptSnapshotError,
    InvalidArgumentError,
    LimitExceededError,
    NotFoundError,
    UnavailableError,
    UnsupportedFormatVersionError,
)
from snapshot.names import validate_job  # the one job-id rule, shared with the client and the CLI
from store.checkpoint import CheckpointReader
from store.layout import JOBS, checkpoint_prefix, job_prefix, metadata_key, writers_key
from store.manifest import Manifest
from store.objects import ObjectStore
from store.segment_cache import SegmentCache

_U64 = (1 << 64) - 1


def _uint64s(values: Sequence[int] | np.ndarray) -> np.ndarray:
    """op_ids as a uint64 array (one numpy conversion); InvalidArgumentError naming the first that is not a uint64."""
    if isinstance(values, np.ndarray) and values.dtype == np.uint64:
        return values
    try:
        if any(isinstance(v, float | bool | str | bytes) for v in values[:1]):
            raise TypeError
        return np.array(values, dtype=np.uint64)
    except (TypeError, ValueError, OverflowError):
        bad = next((v for v in values if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= _U64), values)
        raise InvalidArgumentError(f"op_id {bad!r} must be a uint64") from None


def _binary_keys(keys: Sequence[bytes]) -> pa.Array:
    """Keys as one binary array; InvalidArgumentError for anything that is not bytes (None included)."""
    try:
        key_array = pa.array(keys, pa.binary())
    except (TypeError, pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise InvalidArgumentError(f"keys must be bytes: {exc}") from exc
    if key_array.null_count:
        raise InvalidArgumentError("keys must be bytes, not None")
    return key_array


def _check_id(value: object, what: str, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= MAX_CHECKPOINT_ID:
        raise InvalidArgumentError(f"{what} {value!r} must be an integer in {lo}..{MAX_CHECKPOINT_ID}")
    return value


def _as_changelog(table: pa.Table, is_changelog: bool) -> pa.Table:
    if is_changelog:
        return table
    kinds = pa.array(np.full(table.num_rows, ROW_PUT, dtype=np.uint8))
    return pa.table(
        {
            "row_kind": kinds,
            "op_id": table.column("op_id"),
            "key_bytes": table.column("key_bytes"),
            "value_bytes": table.column("value_bytes"),
        }
    )


class _released:  # noqa: N801 - used like the generator function it stands for
    """The chunks; the reservation goes when the stream ends, however it ends (read out, closed, or dropped unread)."""

    def __init__(self, chunks: Iterator[bytes], held: Holding) -> None:
        self._chunks = chunks
        self._held: Holding | None = held

    def __iter__(self) -> _released:
        return self

    def __next__(self) -> bytes:
        try:
            return next(self._chunks)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            held.release()
            getattr(self._chunks, "close", lambda: None)()

    def __del__(self) -> None:
        self.close()


class PoolCore:
    """Commits, reads and lists checkpoints; stateless apart from caches, so several may share one store."""

    def __init__(self, store: ObjectStore, config: PoolConfig | None = None, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.config = config = config or PoolConfig()
        self.cache = SegmentCache(config.cache_bytes)
        self.budget = MemoryBudget(config.request_memory_bytes)
        self.fencing = Fencing(store, config.max_cas_attempts, clock=clock)
        self.protocol = CommitProtocol(store, self.fencing, self.reader, config, clock)
        self.point_reads = PointReads()
        self.live_exports = LiveExports(self.fencing, config.live)
        self._readers: dict[str, CheckpointReader] = {}
        self._lock = threading.Lock()

    # ---- helpers ----------------------------------------------------------------------------------------------

    def _job(self, job: object) -> str:
        if type(job) is str and job in self._readers:  # checked when its reader was made (a point read asks up to four times)
            return job
        return validate_job(job, self.config.max_job_id_bytes)

    def reader(self, job: str) -> CheckpointReader:
        """The (cached) checkpoint reader of a job, sharing this core's segment cache."""
        reader = self._readers.get(job) if type(job) is str else None
        if reader is not None:  # made for a valid job id, and never replaced: no lock needed to read it
            return reader
        job = self._job(job)
        with self._lock:
            reader = self._readers.get(job)
            if reader is None:
                reader = self._readers[job] = CheckpointReader(self.store, job, self.cache, self.config.resolved_index_after)
            return reader

    def _job_exists(self, job: str) -> bool:
        return self.store.exists(writers_key(job)) or next(iter(self.store.list(job_prefix(job))), None) is not None

    def resolve(self, job: str, checkpoint_id: int, manifest_etag: str | None = None) -> tuple[Manifest, str]:
        """(manifest, etag) of complete checkpoint N (0 = the latest no rewind abandoned); NotFoundError for unknown jobs or ids.

        The cached manifest is used only when ``manifest_etag`` (a client's token, or a listing's) proves it current (I5).
        """
        job = self._job(job)
        _check_id(checkpoint_id, "checkpoint id", 0)
        reader = self.reader(job)
        try:
            if checkpoint_id == 0:
                found = reader.latest_manifest()
                if found is None:
                    raise NotFoundError(f"job {job} has no complete checkpoint yet")
                return found
            return reader.manifest_and_etag(checkpoint_id, manifest_etag or None)
        except NotFoundError:
            if not self._job_exists(job):
                raise NotFoundError(f"job {job} not found in {self.store.uri}") from None
            raise

    def _resolve(self, job: str, checkpoint_id: int, manifest_etag: str | None = None) -> Manifest:
        return self.resolve(job, checkpoint_id, manifest_etag)[0]

    def forget_manifest(self, job: str, checkpoint_id: int) -> None:
        """Drop a cached manifest (its _metadata was replaced or deleted by this process)."""
        self.reader(job).forget(checkpoint_id)
        self.protocol.forget_parent(job, checkpoint_id)

    def stats(self) -> dict[str, int]:
        """Counters for metrics: cache hits/misses and bytes moved at the store."""
        return {
            "cache_hits": self.cache.hits,
            "cache_misses": self.cache.misses,
            "cache_bytes": self.cache.size_bytes,
            "bytes_read": self.store.counters.bytes_read,
            "bytes_written": self.store.counters.bytes_written,
        }

    # ---- writers and commits ----------------------------------------------------------------------------------

    def acquire_writer(self, job: str, key_groups: KeyGroupRange, restore_from: int | None = None) -> tuple[int, int]:
        """A new fencing epoch for the range (older overlapping writers are fenced) and the latest complete checkpoint id.

        ``restore_from``: the checkpoint the writer restores from; every restore takes a fresh epoch, so parts of the
        attempt before it never complete a checkpoint (protocol I3).
        """
        job = self._job(job)
        if not isinstance(key_groups, KeyGroupRange):
            raise InvalidArgumentError(f"key_groups must be a KeyGroupRange, got {key_groups!r}")
        if restore_from is not None:
            _check_id(restore_from, "restore point", 0)
        epoch = self.protocol.acquire(job, key_groups, restore_from)
        return epoch, self.reader(job).latest()

    def announce_live_export(self, job: str, key_groups: KeyGroupRange, epoch: int, url: str, token: str, ttl_s: int) -> int:
        """Record where a running subtask serves its live state (see pool/live_exports.py); its expiry in ms since the epoch."""
        return self.live_exports.announce(self._job(job), key_groups, epoch, url, token, ttl_s)

    def live_state(self, job: str, key_groups: KeyGroupRange | None = None, allow_partial: bool = False) -> LiveState:
        """The merged live state of a running job's announced subtasks (see pool/live_exports.py)."""
        return self.live_exports.live_state(self._job(job), key_groups, allow_partial)

    def withdraw_live_export(self, job: str, key_groups: KeyGroupRange, epoch: int) -> None:
        """Forget a subtask's announcement (it is closing)."""
        self.live_exports.withdraw(self._job(job), key_groups, epoch)

    def _validate_request(self, request: CommitRequest) -> tuple[str, tuple[tuple[int, str], ...], str]:
        job = self._job(request.job)
        cid = _check_id(request.checkpoint_id, "checkpoint id", 1)
        pid = _check_id(request.parent_id, "parent id", 0)
        if pid >= cid:
            raise InvalidArgumentError(f"parent id {pid} must be below checkpoint id {cid}")
        if not isinstance(request.key_groups, KeyGroupRange):
            raise InvalidArgumentError(f"key_groups must be a KeyGroupRange, got {request.key_groups!r}")
        _check_id(request.epoch, "epoch", 1)
        try:
            versions = StateVersionMap.unpack(request.state_versions or "").pack()
        except (CorruptSnapshotError, InvalidArgumentError) as exc:
            raise InvalidArgumentError(f"state_versions of the commit: {exc}") from exc
        ops: dict[int, str] = {}
        for item in request.operators:
            op_id, uid = item
            if isinstance(op_id, bool) or not isinstance(op_id, int) or not 0 <= op_id <= _U64 or not isinstance(uid, str):
                raise InvalidArgumentError(f"operator {item!r} must be (uint64 op_id, uid string)")
            if uid and operator_id(uid) != op_id:
                raise InvalidArgumentError(f"operator uid {uid!r} has op_id {operator_id(uid)}, not {op_id}")
            ops[op_id] = uid or ops.get(op_id, "")
        return job, tuple(sorted(ops.items())), versions

    def _read_delta(self, request: CommitRequest, chunks: Iterable[bytes], held: Holding) -> pa.Table:
        """The resolved changelog of the delta (one row per key), checked against the writer's range."""
        received = bytearray()  # chunks appended as they arrive (grown in place): no list of them beside their join
        for chunk in self._bounded_chunks(request, chunks, held):
            received += chunk
        data = pa.py_buffer(received)  # zero-copy: the rows decoded below point into it
        if not data.size:
            return _as_changelog(
                pa.table(
                    {"op_id": pa.array([], pa.uint64()), "key_bytes": pa.array([], pa.binary()), "value_bytes": pa.array([], pa.binary())}
                ),
                False,
            )
        try:
            snap = read_snapshot(data)
        except (CorruptSnapshotError, UnsupportedFormatVersionError) as exc:
            raise InvalidArgumentError(f"delta of checkpoint {request.checkpoint_id} is not a valid snapshot stream: {exc}") from exc
        table = _as_changelog(snap.table.replace_schema_metadata(None), snap.is_changelog)
        if table.num_rows:  # checked in the order sent, so an error names the row the client sent
            keys = table.column("key_bytes")
            empty = pc.equal(pc.binary_length(keys), 0).to_numpy(zero_copy_only=False)
            if empty.any():
                raise InvalidArgumentError(f"delta row {int(np.argmax(empty))} has an empty key (keys start with a key-group byte)")
            lead = leading_bytes(keys)
            kg = request.key_groups
            outside = (lead < NUM_KEY_GROUPS) & ((lead < kg.lo) | (lead > kg.hi))
            if outside.any():
                first = int(lead[np.argmax(outside)])
                raise InvalidArgumentError(
                    f"delta holds {int(outside.sum())} row(s) outside the writer's key groups {kg}; the first is in key group {first}"
                )
            del keys
        # sorted (a stable sort: a key's rows keep their order), so repeated keys sit side by side and replay runs only if
        # there are any; the sort's copy is the only one, and the received bytes go once it is made
        table = sort_for_layout(table)
        del snap, data, received
        if has_adjacent_repeats(table):
            table = replay_changelog(table)
        return table

    def _bounded_chunks(self, request: CommitRequest, chunks: Iterable[bytes], held: Holding) -> Iterator[bytes]:
        """The delta's chunks, refused as soon as they pass max_commit_bytes; each reserves its working memory first."""
        limit, total = self.config.max_commit_bytes, 0
        what = f"the commit of checkpoint {request.checkpoint_id}"
        for chunk in chunks:
            total += len(chunk)
            if total > limit:
                raise LimitExceededError(
                    f"the delta of checkpoint {request.checkpoint_id} holds more than {limit} bytes, "
                    f"the pool's limit per commit (--max-commit-mb {limit >> 20}); nothing was written"
                )
            held.add(len(chunk) * COMMIT_WORKING_FACTOR, what)
            yield bytes(chunk)

    def commit_checkpoint(self, request: CommitRequest, delta_chunks: Iterable[bytes], holder: str | None = None) -> CommitResult:
        """Stage one range of checkpoint N and complete it once the valid parts tile 0..127 (pool/protocol.py)."""
        job, operators, versions = self._validate_request(request)
        # before the body is read: a writer this pool saw fenced uploads nothing (the table read after its part decides, I2)
        seen = self.fencing.check_seen(job, request.key_groups, request.epoch)
        with (
            self.budget.holding(holder) as held
        ):  # holder: the caller's token, whose share of the budget this counts against  # what every commit and scan overlay in flight holds, in all, is bounded
            delta = self._read_delta(request, delta_chunks, held)
            return self.protocol.commit(
                job,
                request.checkpoint_id,
                request.parent_id,
                request.key_groups,
                request.epoch,
                delta,
                operators,
                versions,
                retry=request.attempt > 0,
                seen=seen,
            )

    # ---- reads ------------------------------------------------------------------------------------------------

    def get(self, job: str, checkpoint_id: int, op_id: int, key: bytes, manifest_etag: str | None = None) -> tuple[bool, bytes, int]:
        """One point read at checkpoint N (0 = latest complete): (found, value, checkpoint id answered)."""
        found, value, cid, _ = self.get_with_etag(job, checkpoint_id, op_id, key, manifest_etag)
        return found, value, cid

    def get_with_etag(
        self, job: str, checkpoint_id: int, op_id: int, key: bytes, manifest_etag: str | None = None
    ) -> tuple[bool, bytes, int, str]:
        """get, and the etag of the _metadata the answer was read from; the same answer as multi_get of the one key.

        It builds no arrays (pool.point_read): pyarrow's kernels release the GIL, and on a busy server each release
        can cost a wait for the GIL far longer than the kernel itself.
        """
        job = self._job(job)
        if type(key) is not bytes or type(op_id) is not int or not 0 <= op_id <= _U64:
            # numpy ints, bytearrays, str: converted (or refused, with the same message) as multi_get converts them
            op_id, key = int(_uint64s([op_id])[0]), _binary_keys([key])[0].as_py()
        self.check_multi_get_size(1, len(key))
        manifest, etag = self.resolve(job, checkpoint_id, manifest_etag)
        found, value = self.point_reads.lookup(self.reader(job), manifest, op_id, key)
        return found, value, manifest.checkpoint_id, etag

    def multi_get(
        self, job: str, checkpoint_id: int, op_ids: Sequence[int], keys: Sequence[bytes], manifest_etag: str | None = None
    ) -> tuple[list[bool], list[bytes], int]:
        """Point reads, batched per data file and segment: (found flags, values, checkpoint id answered)."""
        found, values, cid = self.multi_get_arrays(job, checkpoint_id, op_ids, keys, manifest_etag)
        return found.tolist(), values.to_pylist(), cid

    def check_multi_get_size(self, keys: int, key_bytes: int | None) -> None:
        """LimitExceededError when a MultiGet asks for more keys (or key bytes) than the pool serves in one call."""
        if keys > self.config.max_multiget_keys:
            raise LimitExceededError(
                f"a MultiGet of {keys} keys; the pool serves at most {self.config.max_multiget_keys} per call "
                "(--max-multiget-keys): split it"
            )
        if key_bytes is not None and key_bytes > self.config.max_multiget_key_bytes:
            raise LimitExceededError(
                f"a MultiGet carrying {key_bytes} bytes of keys; the pool takes at most "
                f"{self.config.max_multiget_key_bytes} per call (--max-multiget-key-mb): split it"
            )

    def multi_get_arrays(
        self, job: str, checkpoint_id: int, op_ids: Sequence[int] | np.ndarray, keys: Sequence[bytes], manifest_etag: str | None = None
    ) -> tuple[np.ndarray, pa.Array, int]:
        """Point reads like multi_get, with the answers as arrays (found mask, binary values, b"" where not found), for encoding in bulk."""
        job = self._job(job)
        if len(op_ids) != len(keys):
            raise InvalidArgumentError(f"{len(op_ids)} op_ids for {len(keys)} keys; they must pair up")
        self.check_multi_get_size(len(keys), None)
        ops = _uint64s(op_ids)
        key_array = _binary_keys(keys)
        self.check_multi_get_size(len(key_array), key_array.buffers()[2].size if key_array.buffers()[2] is not None else 0)
        manifest = self._resolve(job, checkpoint_id, manifest_etag)
        found, values = self.reader(job).lookup_values(manifest, ops, key_array)
        return found, values, manifest.checkpoint_id

    def scan_table(
        self,
        job: str,
        checkpoint_id: int,
        key_groups: KeyGroupRange | None,
        op_ids: Sequence[int],
        delta: bytes | None,
        manifest_etag: str | None = None,
    ) -> tuple[pa.Table, Manifest]:
        """The canonical table a scan streams (layers merged, optional changelog delta overlaid, optional op_ids filter)."""
        job = self._job(job)
        if key_groups is not None and not isinstance(key_groups, KeyGroupRange):
            raise InvalidArgumentError(f"key_groups must be a KeyGroupRange or None, got {key_groups!r}")
        snap = None
        if delta:
            try:
                snap = read_snapshot(delta)
            except (CorruptSnapshotError, UnsupportedFormatVersionError) as exc:
                raise InvalidArgumentError(f"scan delta is not a valid snapshot stream: {exc}") from exc
        if len(op_ids) > self.config.max_scan_op_ids:
            raise LimitExceededError(
                f"a scan filtered to {len(op_ids)} op_ids; the pool takes at most {self.config.max_scan_op_ids} "
                "(scan without the filter and filter the stream instead)"
            )
        for op in op_ids:
            if isinstance(op, bool) or not isinstance(op, int) or not 0 <= op <= _U64:
                raise InvalidArgumentError(f"op_id {op!r} must be a uint64")
        manifest = self._resolve(job, checkpoint_id, manifest_etag)
        rng = (key_groups.lo, key_groups.hi) if key_groups else None
        table = self.reader(job).read_manifest_table(manifest, rng, list(op_ids) or None)
        if snap is not None:
            change = _as_changelog(snap.table.replace_schema_metadata(None), snap.is_changelog)
            if rng:
                change = filter_key_groups(change, *rng)
            if op_ids:
                change = change.filter(pc.is_in(change.column("op_id"), value_set=pa.array(list(op_ids), pa.uint64())))
            table = overlay(table, change)
        return table, manifest

    def scan(
        self,
        job: str,
        checkpoint_id: int,
        key_groups: KeyGroupRange | None,
        op_ids: Sequence[int],
        delta: bytes | None,
        frame: Callable[[int], bytes] | None = None,
        manifest_etag: str | None = None,
        holder: str | None = None,
    ) -> Iterator[bytes]:
        """One canonical snapshot stream (one RecordBatch) in ~scan_chunk_bytes chunks; errors raise before the first chunk.

        The chunks are cut straight from the merged table's buffers (one chunk copied at a time, no second full-size
        stream); ``frame`` prefixes each chunk with a header in the same copy (the servicer's ScanChunk field header).
        """
        if not delta:
            table, manifest = self.scan_table(job, checkpoint_id, key_groups, op_ids, delta, manifest_etag)
            writer = SnapshotArrowWriter(StateVersionMap.unpack(manifest.state_versions))
            return stream_chunks(writer, table, max(1, self.config.scan_chunk_bytes), frame=frame)
        # an overlay builds a table of its own, held while the caller reads the stream: it counts against the budget
        held = Holding(self.budget, holder)
        try:
            held.add(len(delta) * COMMIT_WORKING_FACTOR, f"a scan of job {job} with an overlay")
            table, manifest = self.scan_table(job, checkpoint_id, key_groups, op_ids, delta, manifest_etag)
            held.add(table.nbytes, f"a scan of job {job} with an overlay")
        except BaseException:
            held.release()
            raise
        writer = SnapshotArrowWriter(StateVersionMap.unpack(manifest.state_versions))
        return _released(stream_chunks(writer, table, max(1, self.config.scan_chunk_bytes), frame=frame), held)

    # ---- listing and deletion ---------------------------------------------------------------------------------

    def list_jobs(self) -> list[str]:
        """Every job with anything under jobs/, sorted."""
        return self.store.list_prefixes(JOBS)

    def list_checkpoints(self, job: str, include_incomplete: bool = False) -> list[CheckpointInfo]:
        """Checkpoints of a job, ascending, each complete one flagged when a rewind abandoned it; incomplete ones only when asked."""
        job = self._job(job)
        reader = self.reader(job)
        listing = reader.listing()
        if not listing and not self._job_exists(job):
            raise NotFoundError(f"job {job} not found in {self.store.uri}")
        complete = {m.checkpoint_id: info_of(job, m, etag, abandoned) for m, etag, abandoned in reader.complete_checkpoints(listing)}
        infos = []
        for item in listing:
            if item.checkpoint_id in complete:
                infos.append(complete[item.checkpoint_id])
            elif include_incomplete and not item.complete:
                ranges, parts = self.protocol.staged(job, item)
                infos.append(incomplete_info(job, item.checkpoint_id, ranges, parts))
        return infos

    def describe_checkpoint(self, job: str, checkpoint_id: int) -> tuple[CheckpointInfo, str]:
        """A checkpoint's info and its manifest JSON (for an incomplete one: its staged parts)."""
        job = self._job(job)
        _check_id(checkpoint_id, "checkpoint id", 0)
        if checkpoint_id and not self.store.exists(metadata_key(job, checkpoint_id)):
            item = next((c for c in self.reader(job).listing() if c.checkpoint_id == checkpoint_id), None)
            if item is not None and item.part_names:
                ranges, parts = self.protocol.staged(job, item)
                doc = {"job": job, "checkpoint_id": checkpoint_id, "complete": False, "parts": [json.loads(p.to_json()) for p in parts]}
                return incomplete_info(job, checkpoint_id, ranges, parts), json.dumps(doc, sort_keys=True)
        manifest, etag = self.resolve(job, checkpoint_id)
        abandoned = self.reader(job).writers().abandons(manifest.checkpoint_id, manifest.max_epoch)
        return info_of(job, manifest, etag, abandoned), manifest.to_json().decode()

    def delete_checkpoint(self, job: str, checkpoint_id: int) -> None:
        """Remove a checkpoint's manifest (first: it vanishes atomically) and parts; data files are left for GC.

        Refused (ConflictError) for the checkpoint a current writer restored from: its next commit builds on it.
        The removal is announced in the writers table first, so no restore starts from it meanwhile.
        """
        job = self._job(job)
        _check_id(checkpoint_id, "checkpoint id", 1)
        if not next(iter(self.store.list(checkpoint_prefix(job, checkpoint_id))), None):
            if not self._job_exists(job):
                raise NotFoundError(f"job {job} not found in {self.store.uri}")
            raise NotFoundError(f"checkpoint {checkpoint_id} of job {job} not found")

        def decide(table) -> set[int]:
            holders = [w for w in table.writers if w.base == checkpoint_id]
            if holders:
                w = holders[0]
                raise ConflictError(
                    f"checkpoint {checkpoint_id} of job {job} is where the writer of key groups {w.kg_lo}-{w.kg_hi} "
                    f"(epoch {w.epoch}) restored from; restore it elsewhere before deleting"
                )
            return {checkpoint_id}

        with self.fencing.removing(job, decide, int(self.config.max_commit_s * 1000), "delete") as (_, stop_at):
            # listed after the announcement: a part written later finds the checkpoint retiring and never completes it
            keys = [o.key for o in self.store.list(checkpoint_prefix(job, checkpoint_id))]
            if not remove_checkpoint(self.store, job, checkpoint_id, keys, None, stop_at, self.protocol.clock):
                raise UnavailableError(f"deleting checkpoint {checkpoint_id} of job {job} took too long and stopped part way; run it again")
            self.reader(job).forget(checkpoint_id)
