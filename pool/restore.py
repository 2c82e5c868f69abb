"""Restore: checkpoint 1 of a new job made from a savepoint or a checkpoint, every file copied and verified, GC-safe while copying."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import pyarrow as pa
import pyarrow.compute as pc

from pool.lifecycle_context import LifecycleContext
from pool.savepoints import write_folded
from pool.writers import first_epoch
from snapshot import StateVersionMap, empty_table, operator_id
from snapshot.errors import ClinkError, ConflictError, InvalidArgumentError, NonRestoredStateError, NotFoundError, UnavailableError
from store.anatomy import WRITER_VERSION, operators_with_state
from store.checkpoint import CheckpointReader
from store.datafile import KIND_BASE, DataFile, verify_file
from store.layout import (
    JOBS,
    checkpoint_prefix,
    job_file_key,
    job_prefix,
    metadata_key,
    new_data_path,
    part_key,
    writers_key,
)
from store.locations import StateLocation, directory_uri
from store.manifest import MANIFEST_FORMAT, PART_FORMAT, Manifest, Part, info_field, manifest_extra_fields, manifest_json
from store.objects import ObjectStore
from store.views import PrefixStore
from store.writers import WriterTable


@dataclass(frozen=True)
class RestoreResult:
    """A restore done: the new job's checkpoint 1, its source, and how the declared operators matched the source's state."""

    manifest: Manifest
    source: str  # the source's location (a savepoint directory or a checkpoint folder URI)
    declared_without_state: dict[str, int]  # uid -> op_id: declared, but the source holds no state for it (a renamed uid?)
    dropped: dict[int, str | None]  # op_id -> uid: state the source held for undeclared operators, not restored


class Restorer:
    """Creates new jobs of one store from savepoints or checkpoints (of this store or another)."""

    def __init__(self, context: LifecycleContext) -> None:
        self.context = context

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
        """Create checkpoint 1 of a NEW job from a savepoint (NAME under savepoints/) or a checkpoint; see ``restore``."""
        if (savepoint is None) == (job is None):
            raise InvalidArgumentError("restore needs exactly one source: a savepoint name or a job (and checkpoint id)")
        src_store = source_store or self.context.store
        if savepoint is not None:
            source = self.context.savepoint_location(savepoint, src_store)
        else:
            assert job is not None  # exactly one source, checked above
            source = self.checkpoint_location(job, checkpoint_id, src_store)
        return self.restore(new_job, source, progress=progress).manifest

    def checkpoint_location(self, job: str, checkpoint_id: int, store: ObjectStore) -> StateLocation:
        """A complete checkpoint (0: the latest) of a job of ``store`` as a location."""
        _, manifest, _ = self.context.open_checkpoint(job, checkpoint_id, store)
        uri = f"{store.uri.rstrip('/')}/{checkpoint_prefix(manifest.job, manifest.checkpoint_id).rstrip('/')}"
        return StateLocation(uri, "checkpoint", store, store, manifest.job, manifest.checkpoint_id, manifest, {})

    def jobs_restored_from(self, location: str) -> list[tuple[str, int]]:
        """(job, 1) of every job of this store whose checkpoint 1, made by a restore from ``location``, is still there.

        Only information recorded at restore time is compared (restored_from.location), never used to open anything.
        """
        wanted = directory_uri(location)
        found = []
        for job in self.context.store.list_prefixes(JOBS):
            try:
                extra = manifest_extra_fields(self.context.store.get(metadata_key(job, 1)))
            except NotFoundError:
                continue
            origin = extra.get("restored_from")
            if isinstance(origin, dict) and isinstance(origin.get("location"), str) and directory_uri(origin["location"]) == wanted:
                found.append((job, 1))
        return found

    def restore(
        self,
        new_job: str,
        source: StateLocation,
        uids: Sequence[str] | None = None,
        allow_non_restored_state: bool = False,
        progress: Callable[[int, int], None] | None = None,
    ) -> RestoreResult:
        """Create checkpoint 1 of a NEW job from an opened savepoint or checkpoint: every file copied (checksum verified) into its data/.

        ``uids``: the operators the new job declares (Flink's rule): state of an operator it does not declare is
        NonRestoredStateError, nothing written, unless ``allow_non_restored_state`` (that state is then dropped: the
        other operators' rows are folded into new files); declared operators with no state are reported in the result.
        Workers of the new job then acquire any key-group ranges and commit checkpoint 2 on top (parent 1).
        """
        new_job = self.context.job(new_job)
        manifest = source.manifest
        declared = {operator_id(uid): uid for uid in uids or ()}
        held, live = self._operators_with_state(source, declared)
        without_state = {uid: op for op, uid in declared.items() if op not in held}
        undeclared = {op: uid for op, uid in held.items() if op not in declared} if declared else {}
        if undeclared and not allow_non_restored_state:
            names = ", ".join(f"{uid!r} (op_id 0x{op:016x})" if uid else f"unnamed (op_id 0x{op:016x})" for op, uid in undeclared.items())
            raise NonRestoredStateError(
                f"{source.describe()} holds state for operator(s) the new job does not declare: {names}; nothing was written. "
                "Declare them (--uid), or drop their state with --allow-non-restored-state",
                undeclared,
            )
        src_store, folder = source.directory, source.files_prefix
        if next(iter(self.context.store.list(job_prefix(new_job))), None) is not None:
            raise ConflictError(
                f"job {new_job} already exists in {self.context.store.uri}; restore only creates new jobs: give a new job name"
            )
        # the writers table is the new job's claim: of two concurrent restores into one name, one writes nothing. Its epochs
        # start at the clock, as a new job's do, so no process of an earlier job of this name holds one of them.
        epoch = first_epoch(self.context.clock)
        try:
            claim = self.context.store.put_if_absent(writers_key(new_job), WriterTable(epoch + 1, (), life=uuid.uuid4().hex).to_json())
        except ConflictError:
            raise ConflictError(f"job {new_job} was created concurrently in {self.context.store.uri}; this restore wrote nothing") from None
        renamed: dict[str, str] = {}
        copied: dict[str, DataFile] = {}
        written: list[str] = []
        created = self.context.now_ms()
        parts: list[Part] = []
        operators = tuple((op, uid) for op, uid in manifest.operators if op not in undeclared)
        versions = StateVersionMap.unpack(manifest.state_versions)
        if undeclared:  # a dropped operator's state versions go with its state
            versions = StateVersionMap({(op, t): v for (op, t), v in versions.items() if op not in undeclared})
        state_versions = versions.pack() if undeclared else manifest.state_versions
        max_write_s = self.context.config.max_write_s
        try:
            holds = 0
            # folded (the dropped state gone, or operators whose rows were all erased in layers: then _metadata counts live rows)
            fold = bool(undeclared) or bool(set(operators_with_state(manifest)) - set(held))
            if fold:  # the kept operators' rows folded into new files, one per part, each part written as its file lands
                kept = [op for op in held if op not in undeclared]
                if live is not None:  # read already to judge the operators: keep the kept ones' rows
                    table = live.filter(pc.is_in(live.column("op_id"), pa.array(kept, pa.uint64())))
                else:
                    reader = CheckpointReader(source.store, manifest.job, self.context.cache)
                    table = reader.read_manifest_table(manifest, op_ids=kept) if kept else empty_table()
                fold_put_at = [self.context.clock()]

                def before_put(path: str) -> None:
                    renamed[path] = path  # undone on failure even if its put fails half-way
                    fold_put_at[0] = self.context.clock()

                def landed(part: Part, entry: DataFile | None) -> None:
                    if entry is not None:
                        copied[entry.path] = entry
                    written.append(self._write_part(new_job, part, created, operators, state_versions, copied))
                    parts.append(part)
                    if entry is not None:
                        self._referenced_in_time(fold_put_at[0], f"folding key groups {part.kg_lo}-{part.kg_hi}", new_job)

                target = PrefixStore(self.context.store, job_prefix(new_job))
                write_folded(target, table, [(p.kg_lo, p.kg_hi, epoch) for p in manifest.parts], 1, versions, before_put, landed)
            for source_part in manifest.parts if not fold else ():
                # part by part: each part is written right after its files, so GC sees every copy referenced soon after it
                # lands; a part whose copying takes long is covered meanwhile by holding parts (epochs no writer ever gets)
                oldest: float | None = None
                what = f"copying the files of key groups {source_part.kg_lo}-{source_part.kg_hi}"
                for path in [x for layer in source_part.layers for x in layer if x not in renamed]:
                    entry = manifest.file(path)
                    try:
                        data = src_store.get(folder + entry.path)
                    except NotFoundError:
                        raise NotFoundError(f"data file {entry.path} of {folder.rstrip('/')} is missing from {src_store.uri}") from None
                    verify_file(entry, data)
                    renamed[path] = new_data_path()
                    put_at = self.context.clock()  # before the put: a pause while it lands counts against the copy's age
                    self.context.store.put_if_absent(job_file_key(new_job, renamed[path]), data)
                    oldest = put_at if oldest is None else oldest
                    # as_of shifted so the source's newest state is checkpoint 1 of the new job and its order of layers is kept
                    as_of = None if entry.as_of is None else entry.as_of - manifest.checkpoint_id + 1
                    copied[path] = replace(entry, path=renamed[path], as_of=as_of)
                    if progress is not None:
                        progress(len(copied), len(manifest.files))
                    if self.context.clock() - oldest > max_write_s:
                        break  # too long since a copy no part names: GC may have taken it (refused below)
                    if self.context.clock() - oldest > max_write_s / 2:
                        holds += 1
                        written.append(self._hold(new_job, source_part, epoch - holds, created, manifest, copied))
                        self._referenced_in_time(oldest, what, new_job)
                        oldest = None
                if oldest is not None:
                    self._referenced_in_time(oldest, what, new_job)
                part = Part(
                    source_part.kg_lo, source_part.kg_hi, epoch, 0, tuple(tuple(renamed[x] for x in layer) for layer in source_part.layers)
                )
                written.append(self._write_part(new_job, part, created, operators, manifest.state_versions, copied))
                parts.append(part)
                if oldest is not None:  # the part names the copies from here on; a pause before it landed may have let GC in
                    self._referenced_in_time(oldest, what, new_job)
        except BaseException:
            self._undo_restore(new_job, written + [job_file_key(new_job, p) for p in renamed.values()], claim)
            raise
        restored = Manifest(
            MANIFEST_FORMAT,
            new_job,
            1,
            0,
            created,
            operators,
            state_versions,
            tuple(parts),
            tuple(sorted(copied.values(), key=lambda f: f.path)),
        )
        origin = {
            "restored_from": {
                # information only (never used to open a file): where the state came from when it was restored
                "location": source.uri,
                "kind": source.kind,
                "job": manifest.job,
                "checkpoint_id": manifest.checkpoint_id,
                **({"savepoint": info_field(source.extra, "savepoint").get("name")} if "savepoint" in source.extra else {}),
                **({"dropped_operators": [f"0x{op:016x}" for op in sorted(undeclared)]} if undeclared else {}),
                "restored_at_ms": created,
                "writer": WRITER_VERSION,
            }
        }
        self.context.store.put_if_absent(metadata_key(new_job, 1), manifest_json(restored, origin))
        return RestoreResult(restored, source.uri, without_state, undeclared)

    def _referenced_in_time(self, first_put: float, what: str, new_job: str) -> None:
        """UnavailableError unless files put since ``first_put`` were named by a part within max_write_s (GC's minimum age
        protects an unnamed file only so long: past it, a copy may be gone although a part names it).
        """
        if self.context.clock() - first_put > self.context.config.max_write_s:
            raise UnavailableError(
                f"{what} took longer than {self.context.config.max_write_s:g} s before a part named them (GC may have taken "
                f"one meanwhile); the restore into {new_job} was undone, run it again"
            )

    def _operators_with_state(self, source: StateLocation, declared: dict[int, str]) -> tuple[dict[int, str | None], pa.Table | None]:
        """op_id -> uid of the operators whose live rows the source holds, as exactly as the check of ``declared`` needs;
        and the live rows when they had to be read (None: not read).

        From _metadata when it knows: every file counts its operators and each part is one layer. Otherwise (files
        written before manifest version 4, or delta layers whose rows may all be erased) the live rows are read.
        """
        manifest = source.manifest
        held = operators_with_state(manifest)
        counted = all(f.operators is not None for f in manifest.files)
        layered = any(len(p.layers) > 1 for p in manifest.parts) or any(f.kind != KIND_BASE for f in manifest.files)
        if not declared or (counted and not (layered and set(held) - set(declared))):
            return held, None
        live = CheckpointReader(source.store, manifest.job, self.context.cache).read_manifest_table(manifest)
        uids = {op: uid for op, uid in manifest.operators}
        return {op: uids.get(op) or None for op in sorted(pc.unique(live.column("op_id")).to_pylist())}, live

    def _write_part(
        self,
        new_job: str,
        part: Part,
        created: int,
        operators: tuple[tuple[int, str], ...],
        state_versions: str,
        copied: dict[str, DataFile],
    ) -> str:
        """Checkpoint 1's part file for one part of the new job (naming the copies its layers list), put-if-absent; its key."""
        used = {x for layer in part.layers for x in layer}
        files = tuple(sorted((f for f in copied.values() if f.path in used), key=lambda f: f.path))
        one = Manifest(PART_FORMAT, new_job, 1, 0, created, operators, state_versions, (part,), files)
        key = part_key(new_job, 1, part.kg_lo, part.kg_hi, part.epoch)
        self.context.store.put_if_absent(key, one.to_json())
        return key

    def _hold(self, new_job: str, source_part: Part, epoch: int, created: int, manifest: Manifest, copied: dict[str, DataFile]) -> str:
        """A part no writer can ever hold (its epoch is below the new job's first) naming every copy so far: GC keeps them."""
        files = tuple(sorted(copied.values(), key=lambda f: f.path))
        held = Part(source_part.kg_lo, source_part.kg_hi, epoch, 0, tuple((f.path,) for f in files))
        key = part_key(new_job, 1, held.kg_lo, held.kg_hi, epoch)
        self.context.store.put_if_absent(
            key, Manifest(PART_FORMAT, new_job, 1, 0, created, manifest.operators, manifest.state_versions, (held,), files).to_json()
        )
        return key

    def _undo_restore(self, new_job: str, keys: list[str], claim_etag: str) -> None:
        """Remove what a failed restore wrote (its parts and copies, then its claim if nobody has changed it), best effort."""
        try:
            for key in keys:
                self.context.store.delete(key)
            if self.context.store.head(writers_key(new_job)).etag == claim_etag:
                self.context.store.delete(writers_key(new_job))
        except ClinkError:
            pass  # what is left is unreferenced: GC removes the copies, and the name stays taken until deleted
