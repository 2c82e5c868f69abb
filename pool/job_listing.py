"""One job's objects from one listing, sorted by what store/layout.py says each key is."""

from __future__ import annotations

from dataclasses import dataclass, field

from store.layout import parse_job_key
from store.objects import ObjectInfo


@dataclass
class JobListing:
    """One job's objects from a listing, sorted into checkpoints, manifests/parts, pins and data files (store/layout.py names them)."""

    checkpoints: dict[int, list[ObjectInfo]]
    complete: set[int]
    manifest_keys: list[str]
    pins: list[ObjectInfo]
    data: list[ObjectInfo]
    metadata_etags: dict[int, str] = field(default_factory=dict)

    @classmethod
    def of(cls, job: str, infos: list[ObjectInfo]) -> JobListing:
        """Sort the listed objects of ``job``; keys of other jobs and unknown keys are left out."""
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
