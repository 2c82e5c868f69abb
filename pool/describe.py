"""What a job holds, for ls and inspect: its checkpoints summarised, staged parts, pins and data bytes."""

from __future__ import annotations

from pool.job_listing import JobListing
from pool.lifecycle_context import LifecycleContext
from pool.pins import Pins
from snapshot.errors import NotFoundError
from store.layout import job_prefix, metadata_key, staged_part_label
from store.manifest import Manifest, parse_manifest


def manifest_summary(m: Manifest, with_files: bool = True) -> dict:
    """A manifest as a plain dict for ls/inspect: parts with their layer depth and bytes, optionally every file."""
    parts = []
    for p in m.parts:
        paths = [x for layer in p.layers for x in layer]
        part: dict[str, object] = {
            "kg_lo": p.kg_lo,
            "kg_hi": p.kg_hi,
            "epoch": p.epoch,
            "layers": len(p.layers),
            "bytes": sum(m.file(x).size for x in paths),
        }
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


class JobDescriber:
    """Describes the jobs of one store from one listing each."""

    def __init__(self, context: LifecycleContext, pins: Pins) -> None:
        self.context = context
        self.pins = pins

    def describe_job(self, job: str) -> dict:
        """A job's checkpoints (complete: summary of each manifest; incomplete: staged ranges) and live pins; one LIST."""
        job = self.context.job(job)
        listing = list(self.context.store.list(job_prefix(job)))
        if not listing:
            raise NotFoundError(f"job {job} not found in {self.context.store.uri}")
        layout = JobListing.of(job, listing)
        checkpoints = []
        for cid in sorted(layout.checkpoints):
            if cid in layout.complete:
                try:
                    m = parse_manifest(self.context.store.get(metadata_key(job, cid)), metadata_key(job, cid))
                except NotFoundError:
                    continue
                checkpoints.append(manifest_summary(m, with_files=False))
            else:
                staged = sorted(label for o in layout.checkpoints[cid] if (label := staged_part_label(o.key)) is not None)
                checkpoints.append({"checkpoint_id": cid, "complete": False, "staged_ranges": staged})
        pins = self.pins.summaries(layout.pins, self.context.now_ms())
        data_bytes = sum(o.size for o in layout.data)
        # a job whose workers connected but never checkpointed holds only its writers table: say who, not "empty"
        table, _ = self.context.fencing.read(job)
        writers = [{"kg_lo": w.kg_lo, "kg_hi": w.kg_hi, "epoch": w.epoch} for w in sorted(table.writers, key=lambda w: w.kg_lo)]
        return {
            "job": job,
            "checkpoints": checkpoints,
            "pins": pins,
            "writers": writers,
            "data_files": len(layout.data),
            "data_bytes": data_bytes,
        }
