"""Checkpoint lifecycle over one store: savepoints, restore into a new job, pins, retention, compaction and GC."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from pool.core import validate_job
from pool.protocol import remove_checkpoint
from pool.writers import Fencing, first_epoch
from snapshot import NUM_KEY_GROUPS
from snapshot.errors import (
    ClinkError,
    ConflictError,
    CorruptDataError,
    InvalidArgumentError,
    LimitExceededError,
    NotFoundError,
    PermissionDeniedError,
    UnavailableError,
)
from store.checkpoint import CheckpointReader
from store.datafile import KIND_BASE, KIND_DELTA, DataFile, EncodedFile, encode_datafile, verify_file
from store.layout import (
    GC_MARKER,
    JOB_GC_MARKER,
    SAVEPOINT_ENTRIES,
    SAVEPOINT_MANIFEST,
    SAVEPOINTS,
    job_gc_marker_key,
    job_prefix,
    metadata_key,
    new_data_path,
    parse_job_key,
    part_key,
    pin_key,
    pin_prefix,
    savepoint_of,
    savepoint_prefix,
    writers_key,
)
from store.local import TMP_DIR as FILE_STORE_TMP_DIR
from store.local import FileStore
from store.manifest import MANIFEST_FORMAT, PART_FORMAT, Manifest, Part, parse_manifest
from store.objects import ObjectInfo, ObjectStore
from store.segment_cache import SegmentCache
from store.views import SavepointView
from store.writers import WriterTable

__all__ = [
    "GC_MARKER",
    "JOB_GC_MARKER",
    "CompactionResult",
    "GcResult",
    "Lifecycle",
    "LifecycleConfig",
    "RetentionResult",
    "SavepointInfo",
    "manifest_summary",
    "savepoint_prefix",
    "validate_name",
]

PIN_FORMAT = "clink.pin"
# a GC run re-lists a job whose manifests change under it this many times before it leaves the job for the next run
_GC_LISTING_ROUNDS = 3
# folded files aim for about this many segments per key group they cover (one per key group once big enough)
_MIN_FOLD_SEGMENT_BYTES = 4 << 10


@dataclass(frozen=True)
class LifecycleConfig:
    """Retention depth, compaction thresholds and GC minimum age; passed to Lifecycle, read by no one else."""

    retain_last: int = 3
    compact_max_layers: int = 8
    compact_max_delta_bytes: int = 256 << 20
    gc_min_age_s: float = 3600.0
    max_name_bytes: int = 128
    cache_bytes: int = 128 << 20
    # a compaction or savepoint that takes longer publishes nothing (GC's minimum age protects only what is younger)
    max_write_s: float = 1800.0
    # pins: how many one job may hold (each blocks retention), and for how long one may last before it is renewed
    max_pins_per_job: int = 64
    max_pin_ttl_s: float = 7 * 86400.0

    def __post_init__(self) -> None:
        if self.max_pins_per_job < 1 or not self.max_pin_ttl_s > 0:
            raise InvalidArgumentError(
                f"max_pins_per_job ({self.max_pins_per_job}) and max_pin_ttl_s ({self.max_pin_ttl_s}) must be positive"
            )
        if not 0 < self.max_write_s:
            raise InvalidArgumentError(f"max_write_s = {self.max_write_s} must be positive")
        if self.retain_last < 1:
            raise InvalidArgumentError(f"retain_last = {self.retain_last} must be at least 1 (the latest checkpoint is always kept)")
        if self.compact_max_layers < 1:
            raise InvalidArgumentError(f"compact_max_layers = {self.compact_max_layers} must be at least 1")
        if self.gc_min_age_s < 0:
            raise InvalidArgumentError(f"gc_min_age_s = {self.gc_min_age_s} must not be negative")


@dataclass(frozen=True)
class SavepointInfo:
    """A written savepoint: where it lives and what it holds."""

    name: str
    store_uri: str
    job: str
    checkpoint_id: int
    files: int
    bytes: int
    rows: int


@dataclass(frozen=True)
class CompactionResult:
    """What a compaction folded: the part ranges it rewrote, layers before, files and bytes written."""

    job: str
    checkpoint_id: int
    folded: tuple[tuple[int, int, int], ...]  # (kg_lo, kg_hi, layers before)
    files_written: int
    bytes_written: int


@dataclass(frozen=True)
class RetentionResult:
    """Checkpoints a retention pass removed, kept, and kept only because a pin holds them."""

    job: str
    deleted: tuple[int, ...]
    kept: tuple[int, ...]
    pinned: tuple[int, ...]
    dry_run: bool


@dataclass
class GcResult:
    """What a GC run found and did; deleted lists keys (or would-delete keys on a dry run)."""

    scope: str
    dry_run: bool
    listed_objects: int = 0
    referenced: int = 0
    deleted: list[str] = field(default_factory=list)
    deleted_bytes: int = 0
    too_young: int = 0
    resumed: dict | None = None
    # store-wide runs on a file:// store: writers' temp files past the minimum age (left by a killed process)
    temp_files: int = 0
    # jobs left alone because manifests kept vanishing while they were read (retention or deletes racing the run)
    skipped_jobs: list[str] = field(default_factory=list)


def validate_name(name: object, what: str = "savepoint name", max_bytes: int = 128) -> str:
    """Savepoint names and pin holders follow the job-id rules (no '/', '..', control characters, bounded)."""
    try:
        return validate_job(name, max_bytes)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(str(exc).replace("job id", what)) from None


def _unreferenced_old_enough(infos: list[ObjectInfo], refs: set[str], now: int, min_age: int, result: GcResult) -> list[ObjectInfo]:
    """GC's one rule: an object goes only if nothing references it and it is older than the minimum age (counting the too-young)."""
    out = []
    for info in infos:
        if info.key in refs:
            continue
        if now - info.last_modified_ms < min_age:
            result.too_young += 1
            continue
        out.append(info)
    return out


def _fold_target(table: pa.Table, kg_count: int) -> int:
    """Segment target for a folded file: about one segment per key group, never tiny segments."""
    if table.num_rows == 0:
        return _MIN_FOLD_SEGMENT_BYTES
    est = (
        pc.sum(pc.binary_length(table.column("key_bytes"))).as_py()
        + pc.sum(pc.binary_length(table.column("value_bytes"))).as_py()
        + 9 * table.num_rows
    )
    return max(_MIN_FOLD_SEGMENT_BYTES, int(est) // max(1, 2 * kg_count))


def _extra_fields(raw: bytes) -> dict:
    """Top-level fields a stored manifest carries beyond the manifest itself (restored_from, savepoint): kept on rewrite."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return {}
    return {k: doc[k] for k in ("restored_from", "savepoint") if k in doc}


def _manifest_json(m: Manifest, extra: dict | None = None) -> bytes:
    """The manifest's deterministic JSON, with optional extra top-level fields (readers ignore unknown fields)."""
    if not extra:
        return m.to_json()
    doc = json.loads(m.to_json())
    doc.update(extra)
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


class Lifecycle:
    """Savepoints, restores, pins, retention, compaction and GC over one store (no server needed)."""

    def __init__(
        self,
        store: ObjectStore,
        config: LifecycleConfig | None = None,
        clock: Callable[[], float] = time.time,
        cache: SegmentCache | None = None,
        on_manifest_replaced: Callable[[str, int], None] | None = None,
    ) -> None:
        self.store = store
        self.config = config or LifecycleConfig()
        self.clock = clock
        self.cache = cache if cache is not None else SegmentCache(self.config.cache_bytes)
        self._on_replaced = on_manifest_replaced  # a pool forgets its cached manifest of a compacted checkpoint
        self.fencing = Fencing(store, clock=clock)

    # ---- opening sources -------------------------------------------------------------------------------------

    def _job(self, job: object) -> str:
        return validate_job(job, self.config.max_name_bytes)

    def _name(self, name: object, what: str = "savepoint name") -> str:
        return validate_name(name, what, self.config.max_name_bytes)

    def _savepoint_name(self, name: object) -> str:
        """A savepoint's name: NAME, or JOB/NAME for one the pool's RPC wrote under its job (NAME not a folder entry's name)."""
        if isinstance(name, str) and name.count("/") == 1:
            job, own = name.split("/")
            job, own = self._job(job), self._name(own)
            if own in SAVEPOINT_ENTRIES:
                raise InvalidArgumentError(
                    f"savepoint name {own!r} is reserved (a savepoint folder holds {', '.join(sorted(SAVEPOINT_ENTRIES))})"
                )
            return f"{job}/{own}"
        return self._name(name)

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def open_checkpoint(self, job: str, checkpoint_id: int = 0, store: ObjectStore | None = None) -> tuple[CheckpointReader, Manifest, str]:
        """(reader, manifest, folder) of a complete checkpoint (0 = latest); NotFoundError naming what is missing."""
        store = store or self.store
        job = self._job(job)
        reader = CheckpointReader(store, job, self.cache)
        if checkpoint_id == 0:
            checkpoint_id = reader.latest()
            if checkpoint_id == 0:
                raise NotFoundError(f"job {job} has no complete checkpoint in {store.uri}")
        if isinstance(checkpoint_id, bool) or not isinstance(checkpoint_id, int) or checkpoint_id < 0:
            raise InvalidArgumentError(f"checkpoint id {checkpoint_id!r} must be a non-negative integer")
        return reader, reader.manifest(checkpoint_id), job_prefix(job)

    def open_savepoint(self, name: str, store: ObjectStore | None = None) -> tuple[CheckpointReader, Manifest, str]:
        """(reader, manifest, folder) of a savepoint (NAME or JOB/NAME), read through a read-only view of its folder."""
        store = store or self.store
        name = self._savepoint_name(name)
        base = savepoint_prefix(name)
        try:
            data = store.get(base + SAVEPOINT_MANIFEST)
        except NotFoundError:
            raise NotFoundError(f"savepoint {name!r} not found (no {base}{SAVEPOINT_MANIFEST} in {store.uri})") from None
        manifest = parse_manifest(data, base + SAVEPOINT_MANIFEST)
        reader = CheckpointReader(SavepointView(store, base, manifest.job, manifest.checkpoint_id), manifest.job, self.cache)
        return reader, manifest, base

    def read_table(self, reader: CheckpointReader, manifest: Manifest, key_groups: tuple[int, int] | None = None) -> pa.Table:
        """Canonical rows of a checkpoint or savepoint (clipped to key_groups: only those segments are fetched)."""
        return reader.read_manifest_table(manifest, key_groups)

    # ---- savepoints ------------------------------------------------------------------------------------------

    def savepoint(
        self, job: str, checkpoint_id: int, name: str, target_store: ObjectStore | None = None, under_job: bool = False
    ) -> SavepointInfo:
        """Write savepoints/NAME/ (one folded base file + _metadata, relative paths) into target_store or this store.

        ``under_job``: write savepoints/JOB/NAME/ instead, the job's own namespace (what a job's token may write through
        the pool's RPC: no tenant can create or squat a name another job's savepoints use).
        The layers of the checkpoint are folded into one canonical base covering 0..127 with about one segment per
        key group, so the savepoint is self-contained, compact, and any key-group range reads only its bytes.
        """
        name = self._savepoint_name(f"{self._job(job)}/{self._name(name)}" if under_job else self._name(name))
        target = target_store or self.store
        base = savepoint_prefix(name)
        if target.exists(base + SAVEPOINT_MANIFEST):
            raise ConflictError(f"savepoint {name!r} already exists")
        reader, manifest, _ = self.open_checkpoint(job, checkpoint_id)
        table = reader.read_manifest_table(manifest)
        encoded = encode_datafile(table, changelog=False, target_segment_bytes=_fold_target(table, NUM_KEY_GROUPS))
        path = new_data_path()
        files: tuple[DataFile, ...] = ()
        layers: tuple[tuple[str, ...], ...] = ()
        written_at = self.clock()
        if encoded.rows:
            target.put_if_absent(base + path, encoded.data)
            files = (encoded.entry(path, KIND_BASE, 0, NUM_KEY_GROUPS - 1, manifest.checkpoint_id),)
            layers = ((path,),)
        epoch = max(p.epoch for p in manifest.parts)
        if self.clock() - written_at > self.config.max_write_s:  # GC's minimum age protects the unpublished base only so long
            raise UnavailableError(
                f"savepoint {name!r} took longer than {self.config.max_write_s:g} s between its file and its _metadata; "
                "nothing was published (the file is left to GC), run it again"
            )
        sp = Manifest(
            MANIFEST_FORMAT,
            manifest.job,
            manifest.checkpoint_id,
            0,
            manifest.created_at_ms,
            manifest.operators,
            manifest.state_versions,
            (Part(0, NUM_KEY_GROUPS - 1, epoch, 0, layers),),
            files,
        )
        extra = {"savepoint": {"name": name, "source_store": self.store.uri, "created_at_ms": self._now_ms()}}
        try:
            target.put_if_absent(base + SAVEPOINT_MANIFEST, _manifest_json(sp, extra))  # written last: the savepoint exists from here on
        except ConflictError:
            raise ConflictError(f"savepoint {name!r} was created concurrently; this copy was not published") from None
        return SavepointInfo(name, target.uri, manifest.job, manifest.checkpoint_id, len(files), len(encoded.data), encoded.rows)

    def list_savepoints(self, store: ObjectStore | None = None) -> list[str]:
        """Names (NAME, or JOB/NAME for those written under a job) of every savepoint folder (complete or not), sorted."""
        store = store or self.store
        return sorted({name for info in store.list(SAVEPOINTS) if (name := savepoint_of(info.key)) is not None})

    # ---- restore ---------------------------------------------------------------------------------------------

    def restore_job(
        self,
        new_job: str,
        *,
        savepoint: str | None = None,
        job: str | None = None,
        checkpoint_id: int = 0,
        source_store: ObjectStore | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> Manifest:
        """Create checkpoint 1 of a NEW job from a savepoint or a checkpoint: every file copied (checksum verified) into its data/.

        Workers of the new job then acquire any key-group ranges and commit checkpoint 2 on top (parent 1).
        """
        new_job = self._job(new_job)
        if (savepoint is None) == (job is None):
            raise InvalidArgumentError("restore needs exactly one source: a savepoint name or a job (and checkpoint id)")
        src_store = source_store or self.store
        if savepoint is not None:
            _, manifest, folder = self.open_savepoint(savepoint, src_store)
        else:
            _, manifest, folder = self.open_checkpoint(job, checkpoint_id, src_store)
        if next(iter(self.store.list(job_prefix(new_job))), None) is not None:
            raise ConflictError(f"job {new_job} already exists in {self.store.uri}; restore only creates new jobs")
        # the writers table is the new job's claim: of two concurrent restores into one name, one writes nothing. Its epochs
        # start at the clock, as a new job's do, so no process of an earlier job of this name holds one of them.
        epoch = first_epoch(self.clock)
        try:
            claim = self.store.put_if_absent(writers_key(new_job), WriterTable(epoch + 1, ()).to_json())
        except ConflictError:
            raise ConflictError(f"job {new_job} was created concurrently in {self.store.uri}; this restore wrote nothing") from None
        renamed: dict[str, str] = {}
        copied: dict[str, DataFile] = {}
        written: list[str] = []
        created = self._now_ms()
        parts: list[Part] = []
        try:
            holds = 0
            for source_part in manifest.parts:
                # part by part: each part is written right after its files, so GC sees every copy referenced soon after it
                # lands; a part whose copying takes long is covered meanwhile by holding parts (epochs no writer ever gets)
                oldest: float | None = None
                for path in [x for layer in source_part.layers for x in layer if x not in renamed]:
                    entry = manifest.file(path)
                    try:
                        data = src_store.get(folder + entry.path)
                    except NotFoundError:
                        raise NotFoundError(f"data file {entry.path} of {folder.rstrip('/')} is missing from {src_store.uri}") from None
                    verify_file(entry, data)
                    renamed[path] = new_data_path()
                    self.store.put_if_absent(job_prefix(new_job) + renamed[path], data)
                    oldest = self.clock() if oldest is None else oldest
                    # as_of shifted so the source's newest state is checkpoint 1 of the new job and its order of layers is kept
                    as_of = None if entry.as_of is None else entry.as_of - manifest.checkpoint_id + 1
                    copied[path] = DataFile(
                        renamed[path],
                        entry.kind,
                        entry.kg_lo,
                        entry.kg_hi,
                        entry.rows,
                        entry.size,
                        entry.sha256,
                        entry.segments,
                        as_of,
                        entry.encoding,
                    )
                    if progress is not None:
                        progress(len(copied), len(manifest.files))
                    if self.clock() - oldest > self.config.max_write_s:
                        break  # too long since a copy no part names: GC may have taken it (refused below)
                    if self.clock() - oldest > self.config.max_write_s / 2:
                        holds += 1
                        written.append(self._hold(new_job, source_part, epoch - holds, created, manifest, copied))
                        oldest = None
                if oldest is not None and self.clock() - oldest > self.config.max_write_s:
                    raise UnavailableError(
                        f"copying the files of key groups {source_part.kg_lo}-{source_part.kg_hi} took longer than "
                        f"{self.config.max_write_s:g} s; the restore into {new_job} was undone, run it again"
                    )
                part = Part(
                    source_part.kg_lo, source_part.kg_hi, epoch, 0, tuple(tuple(renamed[x] for x in layer) for layer in source_part.layers)
                )
                used = {x for layer in source_part.layers for x in layer}
                one = Manifest(
                    PART_FORMAT,
                    new_job,
                    1,
                    0,
                    created,
                    manifest.operators,
                    manifest.state_versions,
                    (part,),
                    tuple(copied[x] for x in sorted(used)),
                )
                key = part_key(new_job, 1, part.kg_lo, part.kg_hi, epoch)
                self.store.put_if_absent(key, one.to_json())
                written.append(key)
                parts.append(part)
        except BaseException:
            self._undo_restore(new_job, written + [job_prefix(new_job) + p for p in renamed.values()], claim)
            raise
        restored = Manifest(
            MANIFEST_FORMAT,
            new_job,
            1,
            0,
            created,
            manifest.operators,
            manifest.state_versions,
            tuple(parts),
            tuple(sorted(copied.values(), key=lambda f: f.path)),
        )
        origin = {
            "restored_from": {"savepoint": savepoint} if savepoint else {"job": manifest.job, "checkpoint_id": manifest.checkpoint_id}
        }
        self.store.put_if_absent(metadata_key(new_job, 1), _manifest_json(restored, origin))
        return restored

    def _hold(self, new_job: str, source_part: Part, epoch: int, created: int, manifest: Manifest, copied: dict[str, DataFile]) -> str:
        """A part no writer can ever hold (its epoch is below the new job's first) naming every copy so far: GC keeps them."""
        files = tuple(sorted(copied.values(), key=lambda f: f.path))
        held = Part(source_part.kg_lo, source_part.kg_hi, epoch, 0, tuple((f.path,) for f in files))
        key = part_key(new_job, 1, held.kg_lo, held.kg_hi, epoch)
        self.store.put_if_absent(
            key, Manifest(PART_FORMAT, new_job, 1, 0, created, manifest.operators, manifest.state_versions, (held,), files).to_json()
        )
        return key

    def _undo_restore(self, new_job: str, keys: list[str], claim_etag: str) -> None:
        """Remove what a failed restore wrote (its parts and copies, then its claim if nobody has changed it), best effort."""
        try:
            for key in keys:
                self.store.delete(key)
            if self.store.head(writers_key(new_job)).etag == claim_etag:
                self.store.delete(writers_key(new_job))
        except ClinkError:
            pass  # what is left is unreferenced: GC removes the copies, and the name stays taken until deleted

    # ---- pins ------------------------------------------------------------------------------------------------

    def pin(self, job: str, checkpoint_id: int, holder: str, ttl_s: float, owner: str | None = None) -> tuple[int, int]:
        """Protect a complete checkpoint (0 = latest) from retention until now + ttl_s (renewable): (checkpoint id, expiry ms).

        ``owner``: who pins (a token's identity through the RPC; None for the operator's commands); a pin of the same holder
        made by another owner is theirs and is not taken over. A job holds at most max_pins_per_job pins, each at most
        max_pin_ttl_s long, so pins cannot block retention without bound.
        """
        job, holder = self._job(job), self._name(holder, "pin holder")
        if isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float) or not 0 < ttl_s:
            raise InvalidArgumentError(f"pin ttl {ttl_s!r} must be a positive number of seconds")
        if ttl_s > self.config.max_pin_ttl_s:
            raise LimitExceededError(
                f"pin ttl {ttl_s:g} s is longer than the pool allows ({self.config.max_pin_ttl_s:g} s); renew a shorter pin instead"
            )
        _, manifest, _ = self.open_checkpoint(job, checkpoint_id)
        key = pin_key(job, manifest.checkpoint_id, holder)
        current = self._pin_body(key)
        if current is not None and current.get("owner") != owner and owner is not None:
            raise PermissionDeniedError(
                f"pin {holder!r} of checkpoint {manifest.checkpoint_id} is held by another token; pick another holder name"
            )
        if current is None:
            pins = sum(1 for _ in self.store.list(pin_prefix(job)))
            if pins >= self.config.max_pins_per_job:
                raise LimitExceededError(f"job {job} holds {pins} pins, the pool's limit (max_pins_per_job); unpin or let some expire")
        expires = self._now_ms() + int(ttl_s * 1000)
        body = {"format": PIN_FORMAT, "job": job, "checkpoint_id": manifest.checkpoint_id, "holder": holder, "expires_at_ms": expires}
        if owner is not None:
            body["owner"] = owner
        self.store.put(key, json.dumps(body, sort_keys=True).encode())
        table, _ = self.fencing.read(job)  # read after the pin landed: retention re-lists pins after announcing what it removes
        if manifest.checkpoint_id in table.retiring_ids(self._now_ms()) or not self.store.exists(metadata_key(job, manifest.checkpoint_id)):
            self.store.delete(key)
            raise NotFoundError(f"checkpoint {manifest.checkpoint_id} of job {job} is being deleted; it cannot be pinned")
        return manifest.checkpoint_id, expires

    def _pin_body(self, key: str) -> dict | None:
        try:
            body = json.loads(self.store.get(key))
        except NotFoundError:
            return None
        except ValueError:
            raise CorruptDataError(f"pin {key} is malformed") from None
        return body if isinstance(body, dict) else {}

    def unpin(self, job: str, checkpoint_id: int, holder: str, owner: str | None = None, may_unpin_others: bool = True) -> None:
        """Drop a pin (idempotent); one another owner made only with ``may_unpin_others`` (write access to the job)."""
        job, holder = self._job(job), self._name(holder, "pin holder")
        if isinstance(checkpoint_id, bool) or not isinstance(checkpoint_id, int) or checkpoint_id < 1:
            raise InvalidArgumentError(f"checkpoint id {checkpoint_id!r} of a pin must be a positive integer")
        key = pin_key(job, checkpoint_id, holder)
        if not may_unpin_others:
            current = self._pin_body(key)
            if current is not None and current.get("owner") != owner:
                raise PermissionDeniedError(
                    f"pin {holder!r} of checkpoint {checkpoint_id} was made by another token; removing it needs write access"
                )
        self.store.delete(key)

    def _live_pins(self, infos: list[ObjectInfo], now_ms: int) -> tuple[set[int], list[str]]:
        """(checkpoint ids held by unexpired pins, keys of expired pins) among listed pin objects."""
        held, expired = set(), []
        for info in infos:
            try:
                body = json.loads(self.store.get(info.key))
                cid, expires = int(body["checkpoint_id"]), int(body["expires_at_ms"])
            except NotFoundError:
                continue
            except (ValueError, KeyError, TypeError):
                raise CorruptDataError(f"pin {info.key} is malformed") from None
            if expires > now_ms:
                held.add(cid)
            else:
                expired.append(info.key)
        return held, expired

    # ---- retention -------------------------------------------------------------------------------------------

    def retain(self, job: str, keep_last: int | None = None, dry_run: bool = False) -> RetentionResult:
        """Delete complete checkpoints older than the newest keep_last (unless pinned), and abandoned ones past the minimum age.

        Kept besides: every checkpoint a current writer restored from (a rewound job builds on it). Complete checkpoints
        a rewind left behind and incomplete ones older than the latest are deleted once older than the minimum age.
        A deletion removes _metadata first (the checkpoint vanishes atomically), then the rest of chk-N/; data files
        are left to GC. Savepoints live outside jobs/ and are never touched.
        """
        job = self._job(job)
        keep = self.config.retain_last if keep_last is None else keep_last
        if keep < 1:
            raise InvalidArgumentError(f"keep_last = {keep} must be at least 1")
        listing = list(self.store.list(job_prefix(job)))
        if not listing:
            raise NotFoundError(f"job {job} not found in {self.store.uri}")
        layout = _JobLayout.of(job, listing)
        now = self._now_ms()
        held, _ = self._live_pins(layout.pins, now)
        min_age = int(self.config.gc_min_age_s * 1000)
        reader = CheckpointReader(self.store, job, self.cache)
        max_epochs: dict[int, int] = {}
        for cid in sorted(layout.complete):
            try:
                max_epochs[cid] = reader.manifest(cid, layout.metadata_etags.get(cid)).max_epoch
            except NotFoundError:
                continue  # deleted since the listing
        old_enough = {cid: all(now - o.last_modified_ms >= min_age for o in objs) for cid, objs in layout.checkpoints.items()}
        plan: dict[str, list[int] | set[int]] = {}

        def decide(table: WriterTable) -> set[int]:
            current = [c for c in sorted(max_epochs) if not table.abandons(c, max_epochs[c])]
            left_behind = [c for c in sorted(max_epochs) if table.abandons(c, max_epochs[c])]
            # the newest keep_last of the current attempt, and every checkpoint a live writer restored from (a rewound job's base)
            keep_ids = set(current[-keep:]) | {w.base for w in table.writers if w.base is not None}
            delete, pinned = set(), set()
            for cid in current:
                if cid not in keep_ids:
                    (pinned if cid in held else delete).add(cid)
            latest = current[-1] if current else 0
            for (
                cid
            ) in left_behind:  # complete checkpoints a rewind left behind: gone once the attempt has passed them, past the minimum age
                if cid in held:
                    pinned.add(cid)
                elif cid < latest and old_enough[cid] and cid not in keep_ids:
                    delete.add(cid)
            for cid in layout.checkpoints:  # incomplete checkpoints older than the latest: abandoned
                if cid not in max_epochs and cid not in layout.complete and cid < latest and old_enough[cid] and cid not in held | keep_ids:
                    delete.add(cid)
            plan.update(keep=keep_ids, pinned=pinned)
            return delete

        if dry_run:
            delete = decide(reader.writers())
        else:
            # announced first (protocol I3): a restore from one of them either registered its base before (kept) or is refused
            with self.fencing.removing(job, decide, int(self.config.max_write_s * 1000), "retention") as (chosen, stop_at):
                delete = chosen - self._pinned_meanwhile(job, chosen, now)
                # listed again after the announcement: a checkpoint whose objects changed since the decision (a late part,
                # a re-commit) is not the one judged; a part written after this listing finds the checkpoint retiring
                relisted = _JobLayout.of(job, list(self.store.list(job_prefix(job))))
                for cid in sorted(delete):
                    before = {(o.key, o.etag) for o in layout.checkpoints.get(cid, [])}
                    now_objs = relisted.checkpoints.get(cid, [])
                    if {(o.key, o.etag) for o in now_objs} - before:
                        delete = delete - {cid}
                        continue
                    keys = [o.key for o in now_objs]
                    if not remove_checkpoint(self.store, job, cid, keys, layout.metadata_etags.get(cid), stop_at, self.clock):
                        delete = {c for c in delete if c < cid}
                        break
        keep_ids, pinned = plan.get("keep", set()), plan.get("pinned", set())
        delete = sorted(delete)
        return RetentionResult(job, tuple(delete), tuple(sorted(keep_ids)), tuple(sorted(pinned)), dry_run)

    def _pinned_meanwhile(self, job: str, chosen: set[int], now: int) -> set[int]:
        """Checkpoints among ``chosen`` a pin took after the decision (a pin checks the announcement after it is written)."""
        held, _ = self._live_pins(list(self.store.list(job_prefix(job) + "pins/")), now)
        return chosen & held

    # ---- compaction ------------------------------------------------------------------------------------------

    def needs_compaction(self, manifest: Manifest) -> list[Part]:
        """Parts whose layers pass a threshold: more than compact_max_layers layers, or delta bytes above compact_max_delta_bytes."""
        out = []
        for part in manifest.parts:
            if len(part.layers) <= 1:
                continue
            delta_bytes = sum(manifest.file(x).size for layer in part.layers for x in layer if manifest.file(x).kind == KIND_DELTA)
            if len(part.layers) > self.config.compact_max_layers or delta_bytes > self.config.compact_max_delta_bytes:
                out.append(part)
        return out

    def compact(self, job: str, checkpoint_id: int = 0, force: bool = False) -> CompactionResult:
        """Fold the layers of each part over a threshold (every multi-layer part with force) into one base file.

        The compacted manifest replaces _metadata by compare-and-swap on the etag read, so a concurrent deletion or
        compaction makes it a ConflictError that changes nothing visible. Every read answers the same: a part's base
        holds exactly its keyed rows after all layers plus the checkpoint's whole operator-state view (as_of = N). Later commits whose parent is
        this checkpoint reference the base. The old layers stay referenced by the checkpoint's parts until retention
        removes it, so a reader still holding the old manifest keeps working.
        """
        job = self._job(job)
        started = self.clock()
        reader, manifest, _ = self.open_checkpoint(job, checkpoint_id)
        key = metadata_key(job, manifest.checkpoint_id)
        raw, etag = self.store.get_with_etag(key)
        manifest = parse_manifest(raw, key)
        todo = [p for p in manifest.parts if len(p.layers) > 1] if force else self.needs_compaction(manifest)
        if not todo:
            return CompactionResult(job, manifest.checkpoint_id, (), 0, 0)
        new_parts: list[Part] = []
        new_files: dict[str, DataFile] = {}
        folded, written = [], 0
        for part in manifest.parts:
            if part not in todo:
                new_parts.append(part)
                continue
            keyed = reader.part_keyed(manifest, part, part.kg_lo, part.kg_hi)
            ops = reader.operator_view(manifest)  # the checkpoint's whole operator state: a base is as of its checkpoint for every part
            table = pa.concat_tables([keyed, ops.cast(keyed.schema)]) if ops.num_rows else keyed
            encoded: EncodedFile = encode_datafile(
                table, changelog=False, target_segment_bytes=_fold_target(table, part.kg_hi - part.kg_lo + 1)
            )
            # written even when empty: the base marks the point its part was folded at (older rows, keyed or operator, are gone)
            path = new_data_path()
            self.store.put_if_absent(job_prefix(job) + path, encoded.data)
            written += len(encoded.data)
            new_files[path] = encoded.entry(path, KIND_BASE, part.kg_lo, part.kg_hi, manifest.checkpoint_id)
            new_parts.append(Part(part.kg_lo, part.kg_hi, part.epoch, part.parent_id, ((path,),)))
            folded.append((part.kg_lo, part.kg_hi, len(part.layers)))
        used = {x for p in new_parts for layer in p.layers for x in layer}
        files = {f.path: f for f in manifest.files if f.path in used} | new_files
        # the files no longer used stay referenced while the checkpoint exists: a commit may have copied them already
        retired = tuple(sorted(manifest.referenced_paths - set(files)))
        compacted = Manifest(
            MANIFEST_FORMAT,
            job,
            manifest.checkpoint_id,
            manifest.parent_id,
            manifest.created_at_ms,
            manifest.operators,
            manifest.state_versions,
            tuple(new_parts),
            tuple(sorted(files.values(), key=lambda f: f.path)),
            retired,
        )
        if self.clock() - started > self.config.max_write_s:
            raise UnavailableError(
                f"compaction of checkpoint {manifest.checkpoint_id} of job {job} took longer than "
                f"{self.config.max_write_s:g} s; nothing was replaced (its files are left to GC)"
            )
        try:
            self.store.compare_and_swap(key, _manifest_json(compacted, _extra_fields(raw)), etag)
        except (ConflictError, NotFoundError):
            raise ConflictError(
                f"checkpoint {manifest.checkpoint_id} of job {job} changed or was deleted while compacting; nothing was replaced"
            ) from None
        if self._on_replaced is not None:
            self._on_replaced(job, manifest.checkpoint_id)
        return CompactionResult(job, manifest.checkpoint_id, tuple(folded), len(new_files), written)

    def compact_job(self, job: str, force: bool = False) -> CompactionResult:
        """Compact the latest complete checkpoint of a job (what the next commits build on)."""
        return self.compact(job, 0, force)

    # ---- listing and inspection ----------------------------------------------------------------------------------

    def describe_job(self, job: str) -> dict:
        """A job's checkpoints (complete: summary of each manifest; incomplete: staged ranges) and live pins; one LIST."""
        job = self._job(job)
        listing = list(self.store.list(job_prefix(job)))
        if not listing:
            raise NotFoundError(f"job {job} not found in {self.store.uri}")
        layout = _JobLayout.of(job, listing)
        checkpoints = []
        for cid in sorted(layout.checkpoints):
            if cid in layout.complete:
                try:
                    m = parse_manifest(self.store.get(metadata_key(job, cid)), metadata_key(job, cid))
                except NotFoundError:
                    continue
                checkpoints.append(manifest_summary(m, with_files=False))
            else:
                staged = sorted(o.key.rsplit("/", 1)[-1].removesuffix(".json") for o in layout.checkpoints[cid] if "/parts/" in o.key)
                checkpoints.append({"checkpoint_id": cid, "complete": False, "staged_ranges": staged})
        now = self._now_ms()
        pins = []
        for info in layout.pins:
            try:
                body = json.loads(self.store.get(info.key))
            except (NotFoundError, ValueError):
                continue
            pins.append(
                {
                    "checkpoint_id": body.get("checkpoint_id"),
                    "holder": body.get("holder"),
                    "expires_at_ms": body.get("expires_at_ms"),
                    "expired": body.get("expires_at_ms", 0) <= now,
                }
            )
        data_bytes = sum(o.size for o in layout.data)
        return {"job": job, "checkpoints": checkpoints, "pins": pins, "data_files": len(layout.data), "data_bytes": data_bytes}

    # ---- garbage collection ----------------------------------------------------------------------------------

    def gc(
        self,
        job: str | None = None,
        dry_run: bool = False,
        max_deletes: int | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> GcResult:
        """Delete data files that nothing references and that are older than gc_min_age_s; one LIST per run.

        Referenced: every file named by a complete checkpoint's _metadata or by any staged part (of complete or
        in-flight checkpoints) of the job; a savepoint's files by its own _metadata. Also removed: expired pins and,
        in a store-wide run, files of savepoint folders without _metadata (an interrupted savepoint), both past the
        minimum age. A run writes a progress marker (gc/progress.json, or jobs/<job>/gc-progress.json for one job) before
        deleting and removes it at the end, so an interrupted run is reported by the next one in its scope, which
        recomputes everything from a fresh listing (deletes are idempotent).
        """
        scope = "" if job is None else job_prefix(self._job(job))
        marker_key = job_gc_marker_key(job) if scope else GC_MARKER
        result = GcResult(scope or "(whole store)", dry_run)
        now = self._now_ms()
        min_age = int(self.config.gc_min_age_s * 1000)
        markers: list[str] = []  # progress markers of interrupted runs in scope (a store-wide run also finishes job runs)
        by_job: dict[str, list[ObjectInfo]] = {}
        by_savepoint: dict[str, list[ObjectInfo]] = {}
        for info in self.store.list(scope):  # the only LIST of the run
            result.listed_objects += 1
            parts = info.key.split("/")
            if info.key == GC_MARKER or (parts[0] == "jobs" and len(parts) == 3 and parts[2] == JOB_GC_MARKER):
                markers.append(info.key)
            elif parts[0] == "jobs" and len(parts) > 2:
                by_job.setdefault(parts[1], []).append(info)
            elif parts[0] == "savepoints" and len(parts) > 2:
                by_savepoint.setdefault(savepoint_of(info.key) or parts[1], []).append(info)
        if markers and not dry_run:
            try:
                result.resumed = json.loads(self.store.get(markers[0]))
            except (NotFoundError, ValueError):
                result.resumed = {}
        candidates: list[ObjectInfo] = []
        for name, infos in sorted(by_job.items()):
            for _ in range(_GC_LISTING_ROUNDS):
                layout = _JobLayout.of(name, infos)
                refs = self._job_references(name, layout)
                if refs is not None:
                    break
                infos = list(self.store.list(job_prefix(name)))  # a manifest vanished while read: judge from a fresh listing
            if refs is None:
                result.skipped_jobs.append(name)  # its checkpoints kept changing: nothing of it is deleted this run
                continue
            result.referenced += len(refs)
            _, expired = self._live_pins(layout.pins, now)
            expired_set = set(expired)
            candidates += _unreferenced_old_enough(
                layout.data + [p for p in layout.pins if p.key in expired_set], refs, now, min_age, result
            )
        for name, infos in sorted(by_savepoint.items()):
            base = savepoint_prefix(name)
            refs = set()
            if any(i.key == base + SAVEPOINT_MANIFEST for i in infos):
                try:
                    m = parse_manifest(self.store.get(base + SAVEPOINT_MANIFEST), base + SAVEPOINT_MANIFEST)
                    refs = {base + f.path for f in m.files} | {base + SAVEPOINT_MANIFEST}
                except NotFoundError:
                    continue  # deleted meanwhile: judge it next run
            result.referenced += len(refs)
            candidates += _unreferenced_old_enough(infos, refs, now, min_age, result)
        candidates.sort(key=lambda i: i.key)
        stale_temps = [] if scope else self._stale_temp_files(now, min_age)
        result.temp_files = len(stale_temps)
        if dry_run:
            result.deleted = [c.key for c in candidates]
            result.deleted_bytes = sum(c.size for c in candidates)
            return result
        for path in stale_temps:
            path.unlink(missing_ok=True)
        if candidates:
            plan = {"started_ms": now, "scope": result.scope, "planned": len(candidates)}
            self.store.put(marker_key, json.dumps(plan, sort_keys=True).encode())
        for n, info in enumerate(candidates):
            if max_deletes is not None and n >= max_deletes:
                return result  # stopped early on purpose: the marker stays, as after a crash
            self.store.delete(info.key)
            result.deleted.append(info.key)
            result.deleted_bytes += info.size
            if progress is not None:
                progress(n + 1, len(candidates))
        for key in {marker_key, *markers} if candidates or markers else ():
            self.store.delete(key)
        return result

    def _stale_temp_files(self, now_ms: int, min_age_ms: int) -> list[Path]:
        """Temp files of a file:// store older than the minimum age: a process killed between write and rename left them."""
        if not isinstance(self.store, FileStore):
            return []
        out = []
        for path in (self.store.root / FILE_STORE_TMP_DIR).iterdir():
            try:
                if now_ms - int(path.stat().st_mtime * 1000) >= min_age_ms:
                    out.append(path)
            except FileNotFoundError:
                continue  # renamed into place or removed meanwhile
        return out

    def _job_references(self, job: str, layout: _JobLayout) -> set[str] | None:
        """Store keys of every data file a _metadata (used or retired) or a staged part names; None if one vanished while read.

        A manifest deleted between the listing and its read may have been the source a commit copied references from
        after the listing (protocol I6), so the run cannot judge the job from this listing.
        """
        refs: set[str] = set()
        prefix = job_prefix(job)
        for key in layout.manifest_keys:
            try:
                m = parse_manifest(self.store.get(key), key)
            except NotFoundError:
                return None
            refs.update(prefix + path for path in m.referenced_paths)
        return refs


def manifest_summary(m: Manifest, with_files: bool = True) -> dict:
    """A manifest as a plain dict for ls/inspect: parts with their layer depth and bytes, optionally every file."""
    parts = []
    for p in m.parts:
        paths = [x for layer in p.layers for x in layer]
        part = {"kg_lo": p.kg_lo, "kg_hi": p.kg_hi, "epoch": p.epoch, "layers": len(p.layers), "bytes": sum(m.file(x).size for x in paths)}
        if with_files:
            part["layer_files"] = [list(layer) for layer in p.layers]
        parts.append(part)
    out = {
        "job": m.job,
        "checkpoint_id": m.checkpoint_id,
        "parent_id": m.parent_id,
        "complete": m.complete,
        "created_at_ms": m.created_at_ms,
        "operators": [{"op_id": o, "uid": u} for o, u in m.operators],
        "files": len(m.files),
        "bytes": m.total_bytes,
        "rows_stored": m.total_rows,
        "max_layers": max((len(p.layers) for p in m.parts), default=0),
        "parts": parts,
    }
    if with_files:
        out["file_entries"] = [
            {
                "path": f.path,
                "kind": f.kind,
                "kg_lo": f.kg_lo,
                "kg_hi": f.kg_hi,
                "rows": f.rows,
                "size": f.size,
                "segments": len(f.segments),
                "sha256": f.sha256,
            }
            for f in m.files
        ]
    return out


@dataclass
class _JobLayout:
    """One job's objects from a listing, sorted into checkpoints, manifests/parts, pins and data files (store/layout.py names them)."""

    checkpoints: dict[int, list[ObjectInfo]]
    complete: set[int]
    manifest_keys: list[str]
    pins: list[ObjectInfo]
    data: list[ObjectInfo]
    metadata_etags: dict[int, str] = field(default_factory=dict)

    @classmethod
    def of(cls, job: str, infos: list[ObjectInfo]) -> _JobLayout:
        out = cls({}, set(), [], [], [])
        for info in infos:
            parsed = parse_job_key(info.key)
            if parsed is None or parsed.job != job:
                continue
            if parsed.checkpoint_id:
                out.checkpoints.setdefault(parsed.checkpoint_id, []).append(info)
                if parsed.kind == "metadata":
                    out.complete.add(parsed.checkpoint_id)
                    out.manifest_keys.append(info.key)
                    out.metadata_etags[parsed.checkpoint_id] = info.etag
                elif parsed.kind == "part":
                    out.manifest_keys.append(info.key)
            elif parsed.kind == "pin":
                out.pins.append(info)
            elif parsed.kind == "data":
                out.data.append(info)
        return out
