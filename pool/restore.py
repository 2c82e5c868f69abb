"""Restore: checkpoint 1 of a new job made from a savepoint or a checkpoint, every file copied and verified, GC-safe while copying."""

from __future__ import annotations

import uuid
from collections.abc import Callable

from pool.lifecycle_context import LifecycleContext
from pool.writers import first_epoch
from snapshot.errors import ClinkError, ConflictError, InvalidArgumentError, NotFoundError, UnavailableError
from store.datafile import DataFile, verify_file
from store.layout import job_file_key, job_prefix, metadata_key, new_data_path, part_key, writers_key
from store.manifest import MANIFEST_FORMAT, PART_FORMAT, Manifest, Part, manifest_json
from store.objects import ObjectStore
from store.writers import WriterTable


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
        """Create checkpoint 1 of a NEW job from a savepoint or a checkpoint: every file copied (checksum verified) into its data/.

        Workers of the new job then acquire any key-group ranges and commit checkpoint 2 on top (parent 1).
        """
        new_job = self.context.job(new_job)
        if (savepoint is None) == (job is None):
            raise InvalidArgumentError("restore needs exactly one source: a savepoint name or a job (and checkpoint id)")
        src_store = source_store or self.context.store
        if savepoint is not None:
            _, manifest, folder = self.context.open_savepoint(savepoint, src_store)
        else:
            assert job is not None  # exactly one source, checked above
            _, manifest, folder = self.context.open_checkpoint(job, checkpoint_id, src_store)
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
                    self.context.store.put_if_absent(job_file_key(new_job, renamed[path]), data)
                    oldest = self.context.clock() if oldest is None else oldest
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
                    if self.context.clock() - oldest > self.context.config.max_write_s:
                        break  # too long since a copy no part names: GC may have taken it (refused below)
                    if self.context.clock() - oldest > self.context.config.max_write_s / 2:
                        holds += 1
                        written.append(self._hold(new_job, source_part, epoch - holds, created, manifest, copied))
                        oldest = None
                if oldest is not None and self.context.clock() - oldest > self.context.config.max_write_s:
                    raise UnavailableError(
                        f"copying the files of key groups {source_part.kg_lo}-{source_part.kg_hi} took longer than "
                        f"{self.context.config.max_write_s:g} s; the restore into {new_job} was undone, run it again"
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
                self.context.store.put_if_absent(key, one.to_json())
                written.append(key)
                parts.append(part)
        except BaseException:
            self._undo_restore(new_job, written + [job_file_key(new_job, p) for p in renamed.values()], claim)
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
        self.context.store.put_if_absent(metadata_key(new_job, 1), manifest_json(restored, origin))
        return restored

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
