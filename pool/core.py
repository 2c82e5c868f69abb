"""The pool's domain core: fenced, incremental, multi-part checkpoint commits and reads over one ObjectStore."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pool.domain import MAX_CHECKPOINT_ID, CheckpointInfo, CommitRequest, CommitResult, KeyGroupRange, PoolConfig
from pool.streaming import stream_chunks
from pool.writers import Fencing
from snapshot import (
    NUM_KEY_GROUPS,
    ROW_PUT,
    SnapshotArrowWriter,
    StateVersionMap,
    filter_key_groups,
    leading_bytes,
    operator_id,
    overlay,
    read_snapshot,
    replay_changelog,
)
from snapshot.errors import (
    ConflictError,
    CorruptSnapshotError,
    FencedError,
    InvalidArgumentError,
    NotFoundError,
    UnsupportedFormatVersionError,
)
from store.checkpoint import CheckpointReader, SegmentCache
from store.datafile import KIND_DELTA, DataFile, encode_datafile
from store.manifest import (
    MANIFEST_FORMAT,
    PART_FORMAT,
    Manifest,
    Part,
    checkpoint_prefix,
    job_prefix,
    metadata_key,
    parse_manifest,
    part_key,
    tiles,
    writers_key,
)
from store.objects import ObjectStore

_U64 = (1 << 64) - 1


def validate_job(job: object, max_bytes: int = 128) -> str:
    """A job id that cannot leave its prefix: non-empty, no '/', '\\', '..', control characters, at most max_bytes UTF-8."""
    if not isinstance(job, str) or not job:
        raise InvalidArgumentError("job id must be a non-empty string")
    size = len(job.encode("utf-8", errors="surrogatepass"))
    if size > max_bytes:
        raise InvalidArgumentError(f"job id is {size} bytes; at most {max_bytes} are allowed")
    bad = next((c for c in job if c in "/\\" or ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 or 0xD800 <= ord(c) < 0xE000), None)
    if bad is not None:
        raise InvalidArgumentError(f"job id {job!r} contains a forbidden character {bad!r} (no '/', '\\' or control characters)")
    if ".." in job or job in (".",) or job.startswith(".clink-"):
        raise InvalidArgumentError(f"job id {job!r} must not contain '..' or be '.'")
    return job


def _uint64s(values: Sequence[int]) -> np.ndarray:
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


def _check_id(value: object, what: str, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= MAX_CHECKPOINT_ID:
        raise InvalidArgumentError(f"{what} {value!r} must be an integer in {lo}..{MAX_CHECKPOINT_ID}")
    return value


def _as_changelog(table: pa.Table, is_changelog: bool) -> pa.Table:
    if is_changelog:
        return table
    kinds = pa.array(np.full(table.num_rows, ROW_PUT, dtype=np.uint8))
    return pa.table({"row_kind": kinds, "op_id": table.column("op_id"), "key_bytes": table.column("key_bytes"), "value_bytes": table.column("value_bytes")})


def _merge_versions(packed: Iterable[str]) -> str:
    """Union of state-version maps; on a disagreement the higher version wins."""
    merged: dict[tuple[int, str], int] = {}
    for text in packed:
        for op, st, v in StateVersionMap.unpack(text).entries():
            merged[(op, st)] = max(v, merged.get((op, st), 0))
    return StateVersionMap(merged).pack()


def _info(job: str, m: Manifest) -> CheckpointInfo:
    return CheckpointInfo(
        job=job,
        checkpoint_id=m.checkpoint_id,
        parent_id=m.parent_id,
        complete=m.complete,
        committed_ranges=tuple(KeyGroupRange(p.kg_lo, p.kg_hi) for p in m.parts),
        created_at_ms=m.created_at_ms,
        num_files=len(m.files),
        total_bytes=m.total_bytes,
        num_rows=m.total_rows,
        operators=m.operators,
        state_versions=m.state_versions,
    )


def _incomplete_info(job: str, checkpoint_id: int, parts: list[Manifest]) -> CheckpointInfo:
    files = {f.path: f for p in parts for f in p.files}
    ops = {o: u for p in parts for o, u in p.operators}
    return CheckpointInfo(
        job=job,
        checkpoint_id=checkpoint_id,
        parent_id=max((p.parent_id for p in parts), default=0),
        complete=False,
        committed_ranges=tuple(sorted((KeyGroupRange(p.parts[0].kg_lo, p.parts[0].kg_hi) for p in parts), key=lambda r: r.lo)),
        created_at_ms=max((p.created_at_ms for p in parts), default=0),
        num_files=len(files),
        total_bytes=sum(f.size for f in files.values()),
        num_rows=sum(f.rows for f in files.values()),
        operators=tuple(sorted(ops.items())),
        state_versions=_merge_versions(p.state_versions for p in parts),
    )


class PoolCore:
    """Commits, reads and lists checkpoints; stateless apart from caches, so several may share one store."""

    def __init__(self, store: ObjectStore, config: PoolConfig | None = None) -> None:
        self.store = store
        self.config = config = config or PoolConfig()
        self.cache = SegmentCache(config.cache_bytes)
        self.fencing = Fencing(store, config.max_cas_attempts)
        self._readers: dict[str, CheckpointReader] = {}
        self._lock = threading.Lock()

    # ---- helpers ----------------------------------------------------------------------------------------------

    def _job(self, job: object) -> str:
        return validate_job(job, self.config.max_job_id_bytes)

    def reader(self, job: str) -> CheckpointReader:
        """The (cached) checkpoint reader of a job, sharing this core's segment cache."""
        job = self._job(job)
        with self._lock:
            reader = self._readers.get(job)
            if reader is None:
                reader = self._readers[job] = CheckpointReader(self.store, job, self.cache, self.config.resolved_index_after)
            return reader

    def _job_exists(self, job: str) -> bool:
        return self.store.exists(writers_key(job)) or next(iter(self.store.list(job_prefix(job))), None) is not None

    def _resolve(self, job: str, checkpoint_id: int) -> Manifest:
        """The complete manifest of checkpoint N (0 = latest complete); NotFoundError for unknown jobs or ids."""
        _check_id(checkpoint_id, "checkpoint id", 0)
        reader = self.reader(job)
        if checkpoint_id == 0:
            checkpoint_id = reader.latest()
            if checkpoint_id == 0:
                if not self._job_exists(job):
                    raise NotFoundError(f"job {job} not found in {self.store.uri}")
                raise NotFoundError(f"job {job} has no complete checkpoint yet")
        try:
            return reader.manifest(checkpoint_id)
        except NotFoundError:
            if not self._job_exists(job):
                raise NotFoundError(f"job {job} not found in {self.store.uri}") from None
            raise

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

    def acquire_writer(self, job: str, key_groups: KeyGroupRange) -> tuple[int, int]:
        """A new fencing epoch for the range (older overlapping writers are fenced) and the latest complete checkpoint id."""
        job = self._job(job)
        if not isinstance(key_groups, KeyGroupRange):
            raise InvalidArgumentError(f"key_groups must be a KeyGroupRange, got {key_groups!r}")
        epoch = self.fencing.acquire(job, key_groups)
        return epoch, self.reader(job).latest()

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
            raise InvalidArgumentError(f"state_versions of the commit: {exc}") from None
        ops: dict[int, str] = {}
        for item in request.operators:
            op_id, uid = item
            if isinstance(op_id, bool) or not isinstance(op_id, int) or not 0 <= op_id <= _U64 or not isinstance(uid, str):
                raise InvalidArgumentError(f"operator {item!r} must be (uint64 op_id, uid string)")
            if uid and operator_id(uid) != op_id:
                raise InvalidArgumentError(f"operator uid {uid!r} has op_id {operator_id(uid)}, not {op_id}")
            ops[op_id] = uid or ops.get(op_id, "")
        return job, tuple(sorted(ops.items())), versions

    def _read_delta(self, request: CommitRequest, chunks: Iterable[bytes]) -> pa.Table:
        """The resolved changelog of the delta (one row per key), checked against the writer's range."""
        data = b"".join(bytes(c) for c in chunks)
        if not data:
            return _as_changelog(pa.table({"op_id": pa.array([], pa.uint64()), "key_bytes": pa.array([], pa.binary()), "value_bytes": pa.array([], pa.binary())}), False)
        try:
            snap = read_snapshot(data)
        except (CorruptSnapshotError, UnsupportedFormatVersionError) as exc:
            raise InvalidArgumentError(f"delta of checkpoint {request.checkpoint_id} is not a valid snapshot stream: {exc}") from None
        table = replay_changelog(_as_changelog(snap.table.replace_schema_metadata(None), snap.is_changelog))
        if table.num_rows:
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
        return table

    def _parent(self, job: str, parent_id: int, kg: KeyGroupRange) -> Manifest:
        """The parent's complete manifest, or (checkpoints in flight) its staged, unfenced parts covering this range."""
        try:
            return self.reader(job).manifest(parent_id)
        except NotFoundError:
            pass
        writers, _ = self.fencing.read(job)
        staged = [
            p for p in self._parts(job, parent_id)
            if p.parts[0].overlaps(kg.lo, kg.hi) and writers.holds(KeyGroupRange(p.parts[0].kg_lo, p.parts[0].kg_hi), p.parts[0].epoch)
        ]
        covered = np.zeros(NUM_KEY_GROUPS, dtype=bool)
        for p in staged:
            covered[p.parts[0].kg_lo : p.parts[0].kg_hi + 1] = True
        if not staged or not covered[kg.lo : kg.hi + 1].all():
            raise NotFoundError(f"parent checkpoint {parent_id} of job {job} not found (neither complete nor staged for key groups {kg})")
        staged.sort(key=lambda p: p.parts[0].kg_lo)
        files = {f.path: f for p in staged for f in p.files}
        first = staged[0]
        return Manifest(PART_FORMAT, job, parent_id, first.parent_id, first.created_at_ms, first.operators, first.state_versions,
                        tuple(p.parts[0] for p in staged), tuple(files.values()))

    def _parent_layers(self, job: str, parent: Manifest | None, kg: KeyGroupRange) -> tuple[list[tuple[str, ...]], dict[str, DataFile]]:
        """The parent's layers for this range: parts overlapping it, in key-group order, files that matter here only."""
        if parent is None:
            return [], {}
        layers: list[tuple[str, ...]] = []
        files: dict[str, DataFile] = {}
        for part in parent.parts:
            if not part.overlaps(kg.lo, kg.hi):
                continue
            for layer in part.layers:
                keep = []
                for path in layer:
                    entry = parent.file(path)
                    useful = any(s.operator or s.overlaps(kg.lo, kg.hi) for s in entry.segments)
                    if useful and path not in files:
                        keep.append(path)
                        files[path] = entry
                if keep:
                    layers.append(tuple(keep))
        return layers, files

    def commit_checkpoint(self, request: CommitRequest, delta_chunks: Iterable[bytes]) -> CommitResult:
        """Stage one range of checkpoint N (data file, then part); write _metadata once the valid parts tile 0..127."""
        job, operators, versions = self._validate_request(request)
        cid, kg = request.checkpoint_id, request.key_groups
        delta = self._read_delta(request, delta_chunks)
        self.fencing.check(job, kg, request.epoch)
        staged = self._staged_by(job, cid, kg, request.epoch)
        parent = self._parent(job, request.parent_id, kg) if request.parent_id else None
        layers, files = self._parent_layers(job, parent, kg)
        written = 0
        encoded = encode_datafile(delta, changelog=True, target_segment_bytes=self.config.segment_target_bytes) if delta.num_rows else None
        if staged is not None:
            return self._repeat(job, cid, kg, request.epoch, staged, set(files), encoded)
        if encoded is not None:
            path = f"data/{uuid.uuid4().hex}.arrow"
            self.store.put_if_absent(job_prefix(job) + path, encoded.data)  # immutable, unreferenced until a part names it
            written += len(encoded.data)
            files[path] = encoded.entry(path, KIND_DELTA, kg.lo, kg.hi, cid)
            layers.append((path,))
        self.fencing.check(job, kg, request.epoch)  # a writer fenced while uploading publishes nothing
        part = Manifest(
            PART_FORMAT, job, cid, request.parent_id, int(time.time() * 1000), operators, versions,
            (Part(kg.lo, kg.hi, request.epoch, request.parent_id, tuple(layers)),), tuple(files.values()),
        )
        blob = part.to_json()
        try:
            self.store.put_if_absent(part_key(job, cid, kg.lo, kg.hi), blob)
        except ConflictError:
            raise ConflictError(f"key groups {kg} of checkpoint {cid} of job {job} were already committed by another writer") from None
        written += len(blob)
        manifest, manifest_bytes = self._try_complete(job, cid)
        written += manifest_bytes
        if manifest is not None:
            if (kg.lo, kg.hi, request.epoch) not in {(p.kg_lo, p.kg_hi, p.epoch) for p in manifest.parts}:
                raise FencedError(f"writer epoch {request.epoch} for key groups {kg} of job {job} was fenced before checkpoint {cid} completed")
            return CommitResult(_info(job, manifest), written)
        return CommitResult(_incomplete_info(job, cid, self._parts(job, cid)), written)

    def _staged_by(self, job: str, cid: int, kg: KeyGroupRange, epoch: int) -> Manifest | None:
        """This writer's own staged part or manifest of checkpoint N (a repeated commit), None if absent; ConflictError if another's."""
        meta = metadata_key(job, cid)
        if self.store.exists(meta):
            manifest = parse_manifest(self.store.get(meta), meta)
            if (kg.lo, kg.hi, epoch) in {(p.kg_lo, p.kg_hi, p.epoch) for p in manifest.parts}:
                return manifest
            raise ConflictError(f"checkpoint {cid} of job {job} is already complete")
        key = part_key(job, cid, kg.lo, kg.hi)
        try:
            part = parse_manifest(self.store.get(key), key)
        except NotFoundError:
            return None
        if part.parts[0].epoch != epoch:
            raise ConflictError(f"key groups {kg} of checkpoint {cid} of job {job} were already committed")
        return part

    def _repeat(self, job: str, cid: int, kg: KeyGroupRange, epoch: int, staged: Manifest, parent_files: set[str], encoded) -> CommitResult:
        """A writer repeating a commit whose reply was lost: the same delta finishes the checkpoint, a different one conflicts."""
        mine = next(p for p in staged.parts if (p.kg_lo, p.kg_hi, p.epoch) == (kg.lo, kg.hi, epoch))
        new_files = {path for layer in mine.layers for path in layer} - parent_files
        new_sums = {staged.file(path).sha256 for path in new_files}
        if new_sums != ({encoded.sha256} if encoded is not None else set()):
            raise ConflictError(f"key groups {kg} of checkpoint {cid} of job {job} were already committed by this writer with another delta")
        if staged.complete:
            return CommitResult(_info(job, staged), 0)
        manifest, written = self._try_complete(job, cid)
        if manifest is not None:
            if (kg.lo, kg.hi, epoch) not in {(p.kg_lo, p.kg_hi, p.epoch) for p in manifest.parts}:
                raise FencedError(f"writer epoch {epoch} for key groups {kg} of job {job} was fenced before checkpoint {cid} completed")
            return CommitResult(_info(job, manifest), written)
        return CommitResult(_incomplete_info(job, cid, self._parts(job, cid)), written)

    def _part_names(self, job: str, cid: int) -> list[tuple[str, KeyGroupRange]]:
        """Keys of the staged parts of checkpoint N with the ranges their names carry (one LIST, no GETs)."""
        out = []
        for obj in self.store.list(checkpoint_prefix(job, cid) + "parts/"):
            name = obj.key.rsplit("/", 1)[-1]
            lo, _, hi = name.removesuffix(".json").partition("-")
            if lo.isdigit() and hi.isdigit() and int(lo) <= int(hi) < NUM_KEY_GROUPS:
                out.append((obj.key, KeyGroupRange(int(lo), int(hi))))
        return out

    def _read_parts(self, keys: Iterable[str]) -> list[Manifest]:
        parts = []
        for key in keys:
            try:
                parts.append(parse_manifest(self.store.get(key), key))
            except NotFoundError:
                continue  # deleted while listing
        return parts

    def _parts(self, job: str, cid: int) -> list[Manifest]:
        return self._read_parts(k for k, _ in self._part_names(job, cid))

    def _try_complete(self, job: str, cid: int) -> tuple[Manifest | None, int]:
        """Write _metadata if the parts whose epochs still hold tile 0..127; returns (manifest or None, bytes written)."""
        writers, _ = self.fencing.read(job)
        owned = {r for r, _ in writers.writers}
        staged = [(k, r) for k, r in self._part_names(job, cid) if r in owned]
        # part names carry their ranges: the parts are read only once the current writers' staged ranges tile 0..127
        if not tiles([Part(r.lo, r.hi, 1, 0, ()) for _, r in staged]):
            return None, 0
        parts = self._read_parts(k for k, _ in staged)
        valid = [p for p in parts if writers.holds(KeyGroupRange(p.parts[0].kg_lo, p.parts[0].kg_hi), p.parts[0].epoch)]
        if not tiles([p.parts[0] for p in valid]):
            return None, 0
        valid.sort(key=lambda p: p.parts[0].kg_lo)
        files = {f.path: f for p in valid for f in p.files}
        ops = {o: u for p in valid for o, u in p.operators}
        manifest = Manifest(
            MANIFEST_FORMAT, job, cid, max(p.parent_id for p in valid), max(p.created_at_ms for p in valid),
            tuple(sorted(ops.items())), _merge_versions(p.state_versions for p in valid),
            tuple(p.parts[0] for p in valid), tuple(sorted(files.values(), key=lambda f: f.path)),
        )
        blob = manifest.to_json()
        key = metadata_key(job, cid)
        try:
            self.store.put_if_absent(key, blob)
        except ConflictError:
            existing = self.store.get(key)  # another committer assembled it first; same parts give the same bytes
            return parse_manifest(existing, key), 0
        return manifest, len(blob)

    # ---- reads ------------------------------------------------------------------------------------------------

    def get(self, job: str, checkpoint_id: int, op_id: int, key: bytes) -> tuple[bool, bytes, int]:
        """One point read at checkpoint N (0 = latest complete): (found, value, checkpoint id answered)."""
        found, values, cid = self.multi_get(job, checkpoint_id, [op_id], [key])
        return bool(found[0]), values[0], cid

    def multi_get(self, job: str, checkpoint_id: int, op_ids: Sequence[int], keys: Sequence[bytes]) -> tuple[list[bool], list[bytes], int]:
        """Point reads, batched per data file and segment: (found flags, values, checkpoint id answered)."""
        found, values, cid = self.multi_get_arrays(job, checkpoint_id, op_ids, keys)
        return found.tolist(), values.to_pylist(), cid

    def multi_get_arrays(self, job: str, checkpoint_id: int, op_ids: Sequence[int], keys: Sequence[bytes]) -> tuple[np.ndarray, pa.Array, int]:
        """Point reads like multi_get, with the answers as arrays (found mask, binary values, b"" where not found), for encoding in bulk."""
        job = self._job(job)
        if len(op_ids) != len(keys):
            raise InvalidArgumentError(f"{len(op_ids)} op_ids for {len(keys)} keys; they must pair up")
        ops = _uint64s(op_ids)
        try:
            key_array = pa.array(keys, pa.binary())
        except (TypeError, pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise InvalidArgumentError(f"keys must be bytes: {exc}") from None
        if key_array.null_count:
            raise InvalidArgumentError("keys must be bytes, not None")
        manifest = self._resolve(job, checkpoint_id)
        found, values = self.reader(job).lookup_values(manifest, ops, key_array)
        return found, values, manifest.checkpoint_id

    def scan_table(self, job: str, checkpoint_id: int, key_groups: KeyGroupRange | None, op_ids: Sequence[int], delta: bytes | None) -> tuple[pa.Table, Manifest]:
        """The canonical table a scan streams (layers merged, optional changelog delta overlaid, optional op_ids filter)."""
        job = self._job(job)
        if key_groups is not None and not isinstance(key_groups, KeyGroupRange):
            raise InvalidArgumentError(f"key_groups must be a KeyGroupRange or None, got {key_groups!r}")
        snap = None
        if delta:
            try:
                snap = read_snapshot(delta)
            except (CorruptSnapshotError, UnsupportedFormatVersionError) as exc:
                raise InvalidArgumentError(f"scan delta is not a valid snapshot stream: {exc}") from None
        for op in op_ids:
            if isinstance(op, bool) or not isinstance(op, int) or not 0 <= op <= _U64:
                raise InvalidArgumentError(f"op_id {op!r} must be a uint64")
        manifest = self._resolve(job, checkpoint_id)
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
    ) -> Iterator[bytes]:
        """One canonical snapshot stream (one RecordBatch) in ~scan_chunk_bytes chunks; errors raise before the first chunk.

        The chunks are cut straight from the merged table's buffers (one chunk copied at a time, no second full-size
        stream); ``frame`` prefixes each chunk with a header in the same copy (the servicer's ScanChunk field header).
        """
        table, manifest = self.scan_table(job, checkpoint_id, key_groups, op_ids, delta)
        writer = SnapshotArrowWriter(StateVersionMap.unpack(manifest.state_versions))
        return stream_chunks(writer, table, max(1, self.config.scan_chunk_bytes), frame=frame)

    # ---- listing and deletion ---------------------------------------------------------------------------------

    def list_jobs(self) -> list[str]:
        """Every job with anything under jobs/, sorted."""
        return self.store.list_prefixes("jobs/")

    def list_checkpoints(self, job: str, include_incomplete: bool = False) -> list[CheckpointInfo]:
        """Checkpoints of a job, ascending; incomplete ones (parts staged, no _metadata) only when asked."""
        job = self._job(job)
        reader = self.reader(job)
        listing = reader.listing()
        if not listing and not self._job_exists(job):
            raise NotFoundError(f"job {job} not found in {self.store.uri}")
        infos = []
        for item in listing:
            if item.complete:
                try:
                    infos.append(_info(job, reader.manifest(item.checkpoint_id)))
                except NotFoundError:
                    continue  # deleted since the listing
            elif include_incomplete:
                infos.append(_incomplete_info(job, item.checkpoint_id, self._parts(job, item.checkpoint_id)))
        return infos

    def describe_checkpoint(self, job: str, checkpoint_id: int) -> tuple[CheckpointInfo, str]:
        """A checkpoint's info and its manifest JSON (for an incomplete one: its staged parts)."""
        job = self._job(job)
        _check_id(checkpoint_id, "checkpoint id", 0)
        if checkpoint_id:
            parts = [] if self.store.exists(metadata_key(job, checkpoint_id)) else self._parts(job, checkpoint_id)
            if parts:
                doc = {"job": job, "checkpoint_id": checkpoint_id, "complete": False, "parts": [json.loads(p.to_json()) for p in parts]}
                return _incomplete_info(job, checkpoint_id, parts), json.dumps(doc, sort_keys=True)
        manifest = self._resolve(job, checkpoint_id)
        return _info(job, manifest), manifest.to_json().decode()

    def delete_checkpoint(self, job: str, checkpoint_id: int) -> None:
        """Remove a checkpoint's manifest (first: it vanishes atomically) and parts; data files are left for GC."""
        job = self._job(job)
        _check_id(checkpoint_id, "checkpoint id", 1)
        keys = [o.key for o in self.store.list(checkpoint_prefix(job, checkpoint_id))]
        if not keys:
            if not self._job_exists(job):
                raise NotFoundError(f"job {job} not found in {self.store.uri}")
            raise NotFoundError(f"checkpoint {checkpoint_id} of job {job} not found")
        meta = metadata_key(job, checkpoint_id)
        if meta in keys:
            self.store.delete(meta)
        for key in keys:
            if key != meta:
                self.store.delete(key)
        self.reader(job).forget(checkpoint_id)
