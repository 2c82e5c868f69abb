"""Savepoints: a checkpoint folded into one self-contained base file and manifest under savepoints/, in this store or another."""

from __future__ import annotations

from dataclasses import dataclass

from pool.compaction import fold_segment_target
from pool.lifecycle_context import LifecycleContext
from snapshot import NUM_KEY_GROUPS
from snapshot.errors import ConflictError, UnavailableError
from store.datafile import KIND_BASE, DataFile, encode_datafile
from store.layout import SAVEPOINTS, job_savepoint_name, new_data_path, savepoint_file_key, savepoint_manifest_key, savepoint_of
from store.manifest import MANIFEST_FORMAT, Manifest, Part, manifest_json
from store.objects import ObjectStore


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


class Savepoints:
    """Writes and lists the savepoints of one store."""

    def __init__(self, context: LifecycleContext) -> None:
        self.context = context

    def savepoint(
        self, job: str, checkpoint_id: int, name: str, target_store: ObjectStore | None = None, under_job: bool = False
    ) -> SavepointInfo:
        """Write savepoints/NAME/ (one folded base file + _metadata, relative paths) into target_store or this store.

        ``under_job``: write savepoints/JOB/NAME/ instead, the job's own namespace (what a job's token may write through
        the pool's RPC: no tenant can create or squat a name another job's savepoints use).
        The layers of the checkpoint are folded into one canonical base covering 0..127 with about one segment per
        key group, so the savepoint is self-contained, compact, and any key-group range reads only its bytes.
        """
        own = self.context.name(name)
        name = self.context.savepoint_name(job_savepoint_name(self.context.job(job), own) if under_job else own)
        target = target_store or self.context.store
        if target.exists(savepoint_manifest_key(name)):
            raise ConflictError(f"savepoint {name!r} already exists in {target.uri}; choose another name (savepoints are never replaced)")
        reader, manifest, _ = self.context.open_checkpoint(job, checkpoint_id)
        table = reader.read_manifest_table(manifest)
        encoded = encode_datafile(table, changelog=False, target_segment_bytes=fold_segment_target(table, NUM_KEY_GROUPS))
        path = new_data_path()
        files: tuple[DataFile, ...] = ()
        layers: tuple[tuple[str, ...], ...] = ()
        written_at = self.context.clock()
        if encoded.rows:
            target.put_if_absent(savepoint_file_key(name, path), encoded.data)
            files = (encoded.entry(path, KIND_BASE, 0, NUM_KEY_GROUPS - 1, manifest.checkpoint_id),)
            layers = ((path,),)
        epoch = max(p.epoch for p in manifest.parts)
        if (
            self.context.clock() - written_at > self.context.config.max_write_s
        ):  # GC's minimum age protects the unpublished base only so long
            raise UnavailableError(
                f"savepoint {name!r} took longer than {self.context.config.max_write_s:g} s between its file and its _metadata; "
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
        extra = {"savepoint": {"name": name, "source_store": self.context.store.uri, "created_at_ms": self.context.now_ms()}}
        try:
            target.put_if_absent(savepoint_manifest_key(name), manifest_json(sp, extra))  # written last: the savepoint exists from here on
        except ConflictError:
            raise ConflictError(f"savepoint {name!r} was created concurrently; this copy was not published") from None
        return SavepointInfo(name, target.uri, manifest.job, manifest.checkpoint_id, len(files), len(encoded.data), encoded.rows)

    def list_savepoints(self, store: ObjectStore | None = None) -> list[str]:
        """Names (NAME, or JOB/NAME for those written under a job) of every savepoint folder (complete or not), sorted."""
        store = store or self.context.store
        return sorted({name for info in store.list(SAVEPOINTS) if (name := savepoint_of(info.key)) is not None})
