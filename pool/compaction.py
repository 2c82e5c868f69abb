"""Compaction: the layers of a checkpoint's parts folded into one base file each, its _metadata replaced by compare-and-swap."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from pool.lifecycle_context import LifecycleContext
from snapshot.errors import ConflictError, NotFoundError, UnavailableError
from store.datafile import KIND_BASE, KIND_DELTA, DataFile, EncodedFile, encode_datafile
from store.layout import job_file_key, metadata_key, new_data_path
from store.manifest import MANIFEST_FORMAT, Manifest, Part, manifest_extra_fields, manifest_json, parse_manifest

# folded files aim for about this many segments per key group they cover (one per key group once big enough)
_MIN_FOLD_SEGMENT_BYTES = 4 << 10


@dataclass(frozen=True)
class CompactionResult:
    """What a compaction folded: the part ranges it rewrote, layers before, files and bytes written."""

    job: str
    checkpoint_id: int
    folded: tuple[tuple[int, int, int], ...]  # (kg_lo, kg_hi, layers before)
    files_written: int
    bytes_written: int


def fold_segment_target(table: pa.Table, kg_count: int) -> int:
    """Segment target for a folded file: about one segment per key group, never tiny segments."""
    if table.num_rows == 0:
        return _MIN_FOLD_SEGMENT_BYTES
    est = (
        pc.sum(pc.binary_length(table.column("key_bytes"))).as_py()
        + pc.sum(pc.binary_length(table.column("value_bytes"))).as_py()
        + 9 * table.num_rows
    )
    return max(_MIN_FOLD_SEGMENT_BYTES, int(est) // max(1, 2 * kg_count))


class Compaction:
    """Folds checkpoints of the jobs of one store when their parts pass the configured thresholds (or when forced)."""

    def __init__(self, context: LifecycleContext) -> None:
        self.context = context

    def needs_compaction(self, manifest: Manifest) -> list[Part]:
        """Parts whose layers pass a threshold: more than compact_max_layers layers, or delta bytes above compact_max_delta_bytes."""
        out = []
        for part in manifest.parts:
            if len(part.layers) <= 1:
                continue
            delta_bytes = sum(manifest.file(x).size for layer in part.layers for x in layer if manifest.file(x).kind == KIND_DELTA)
            if len(part.layers) > self.context.config.compact_max_layers or delta_bytes > self.context.config.compact_max_delta_bytes:
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
        job = self.context.job(job)
        started = self.context.clock()
        reader, manifest, _ = self.context.open_checkpoint(job, checkpoint_id)
        key = metadata_key(job, manifest.checkpoint_id)
        raw, etag = self.context.store.get_with_etag(key)
        manifest = parse_manifest(raw, key)
        todo = [p for p in manifest.parts if len(p.layers) > 1] if force else self.needs_compaction(manifest)
        if not todo:
            return CompactionResult(job, manifest.checkpoint_id, (), 0, 0)
        new_parts: list[Part] = []
        new_files: dict[str, DataFile] = {}
        folded, written = [], 0
        try:
            for part in manifest.parts:
                if part not in todo:
                    new_parts.append(part)
                    continue
                keyed = reader.part_keyed(manifest, part, part.kg_lo, part.kg_hi)
                ops = reader.operator_view(manifest)  # the checkpoint's whole operator state: a base is as of its checkpoint for every part
                table = pa.concat_tables([keyed, ops.cast(keyed.schema)]) if ops.num_rows else keyed
                encoded: EncodedFile = encode_datafile(
                    table,
                    changelog=False,
                    target_segment_bytes=fold_segment_target(table, part.kg_hi - part.kg_lo + 1),
                    count_states=True,  # each part's base repeats the operator state: the anatomy counts it once by its slots
                )
                # written even when empty: the base marks the point its part was folded at (older rows, keyed or operator, are gone)
                path = new_data_path()
                self.context.store.put_if_absent(job_file_key(job, path), encoded.data)
                written += len(encoded.data)
                new_files[path] = encoded.entry(path, KIND_BASE, part.kg_lo, part.kg_hi, manifest.checkpoint_id)
                new_parts.append(Part(part.kg_lo, part.kg_hi, part.epoch, part.parent_id, ((path,),)))
                folded.append((part.kg_lo, part.kg_hi, len(part.layers)))
        except BaseException:
            self._discard(job, new_files)  # named by nothing yet: left behind, they would hold a deleted job's folder open
            raise
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
        if self.context.clock() - started > self.context.config.max_write_s:
            self._discard(job, new_files)
            raise UnavailableError(
                f"compaction of checkpoint {manifest.checkpoint_id} of job {job} took longer than "
                f"{self.context.config.max_write_s:g} s; nothing was replaced (its files were deleted)"
            )
        try:
            self.context.store.compare_and_swap(key, manifest_json(compacted, manifest_extra_fields(raw)), etag)
        except (ConflictError, NotFoundError):
            self._discard(job, new_files)  # the swap did not happen: nothing names the bases just written
            raise ConflictError(
                f"checkpoint {manifest.checkpoint_id} of job {job} changed or was deleted while compacting; nothing was replaced"
            ) from None
        if self.context.on_manifest_replaced is not None:
            self.context.on_manifest_replaced(job, manifest.checkpoint_id)
        return CompactionResult(job, manifest.checkpoint_id, tuple(folded), len(new_files), written)

    def _discard(self, job: str, new_files: dict[str, DataFile]) -> None:
        """Delete the bases of a compaction that replaced nothing (best effort: one that stays is GC's, past its minimum age)."""
        for path in new_files:
            try:
                self.context.store.delete(job_file_key(job, path))
            except Exception:  # noqa: BLE001 - the compaction's own error is the one to report
                return

    def compact_job(self, job: str, force: bool = False) -> CompactionResult:
        """Compact the latest complete checkpoint of a job (what the next commits build on)."""
        return self.compact(job, 0, force)
