"""Garbage collection: data files nothing references, expired pins and interrupted savepoints deleted past a minimum age."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pool.job_listing import JobListing
from pool.lifecycle_context import LifecycleContext
from pool.pins import Pins
from snapshot.errors import CorruptDataError, InvalidArgumentError, NotFoundError
from store.layout import (
    DATA_DIR,
    GC_MARKER,
    SAVEPOINTS,
    is_gc_marker,
    job_file_key,
    job_gc_marker_key,
    job_prefix,
    parse_job_key,
    savepoint_file_key,
    savepoint_folders,
    savepoint_manifest_key,
    savepoint_of,
    savepoint_prefix,
)
from store.local import TMP_DIR as FILE_STORE_TMP_DIR
from store.local import FileStore
from store.manifest import parse_manifest
from store.objects import ObjectInfo

# a GC run re-lists a job whose manifests change under it this many times before it leaves the job for the next run
_GC_LISTING_ROUNDS = 3


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
    # why the run stopped before its last delete (``stop`` said so); its progress marker stays, as after a crash
    stopped: str | None = None


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


class GarbageCollector:
    """Runs GC over one store, store-wide or for one job, from one listing per run."""

    def __init__(self, context: LifecycleContext, pins: Pins) -> None:
        self.context = context
        self.pins = pins

    def gc(
        self,
        job: str | None = None,
        dry_run: bool = False,
        max_deletes: int | None = None,
        progress: Callable[[int, int], None] | None = None,
        stop: Callable[[int, int], str | None] | None = None,
        by_store_clock: bool = False,
    ) -> GcResult:
        """Delete data files that nothing references and that are older than gc_min_age_s; one LIST per run.

        Referenced: every file named by a complete checkpoint's _metadata or by any staged part (of complete or
        in-flight checkpoints) of the job; a savepoint's files by its own _metadata. Also removed: expired pins and,
        in a store-wide run, files of savepoint folders without _metadata (an interrupted savepoint), both past the
        minimum age. A run writes a progress marker (gc/progress.json, or jobs/<job>/gc-progress.json for one job) before
        deleting and removes it at the end, so an interrupted run is reported by the next one in its scope, which
        recomputes everything from a fresh listing (deletes are idempotent). A ``job`` with no object is NotFoundError.
        ``stop(done, planned)`` may end the run before a delete with its reason (``GcResult.stopped``);
        ``by_store_clock`` judges ages by the store's clock (the marker's last-modified time) instead of this pool's.
        """
        scope = "" if job is None else job_prefix(self.context.job(job))
        marker_key = job_gc_marker_key(job) if job is not None else GC_MARKER
        result = GcResult(scope or "(whole store)", dry_run)
        now = self.context.now_ms()
        min_age = int(self.context.config.gc_min_age_s * 1000)
        markers: list[str] = []  # progress markers of interrupted runs in scope (a store-wide run also finishes job runs)
        by_job: dict[str, list[ObjectInfo]] = {}
        savepoint_objects: list[ObjectInfo] = []
        for info in self.context.store.list(scope):  # the only LIST of the run
            result.listed_objects += 1
            if is_gc_marker(info.key):
                markers.append(info.key)
            elif (parsed := parse_job_key(info.key)) is not None:
                by_job.setdefault(parsed.job, []).append(info)
            elif savepoint_of(info.key) is not None:  # under savepoints/, in a folder (a loose savepoints/x is not GC's)
                savepoint_objects.append(info)
        if job is not None and not result.listed_objects:
            raise NotFoundError(f"job {job} not found in {self.context.store.uri}")  # not "deleted 0": a typo'd job is no job
        if markers and not dry_run:
            try:
                result.resumed = json.loads(self.context.store.get(markers[0]))
            except (NotFoundError, ValueError):
                result.resumed = {}
        candidates: list[ObjectInfo] = []
        for name, infos in sorted(by_job.items()):
            for _ in range(_GC_LISTING_ROUNDS):
                layout = JobListing.of(name, infos)
                refs = self._job_references(name, layout)
                if refs is not None:
                    break
                infos = list(self.context.store.list(job_prefix(name)))  # a manifest vanished while read: judge from a fresh listing
            if refs is None:
                result.skipped_jobs.append(name)  # its checkpoints kept changing: nothing of it is deleted this run
                continue
            result.referenced += len(refs)
            _, expired = self.pins.live(layout.pins, now)
            expired_set = set(expired)
            candidates += _unreferenced_old_enough(
                layout.data + [p for p in layout.pins if p.key in expired_set], refs, now, min_age, result
            )
        candidates += self._savepoint_candidates(savepoint_objects, now, min_age, result)
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
            self.context.store.put(marker_key, json.dumps(plan, sort_keys=True).encode())
            if by_store_clock:  # the maintainer runs on every pool: one whose clock runs ahead must not judge ages
                candidates = self._old_by_the_stores_clock(marker_key, candidates, min_age, result)
        for n, info in enumerate(candidates):
            if max_deletes is not None and n >= max_deletes:
                return result  # stopped early on purpose: the marker stays, as after a crash
            result.stopped = stop(n, len(candidates)) if stop is not None else None
            if result.stopped is not None:
                return result  # the caller's reason (a maintainer's lease about to lapse): the marker stays
            self.context.store.delete(info.key)
            result.deleted.append(info.key)
            result.deleted_bytes += info.size
            if progress is not None:
                progress(n + 1, len(candidates))
        for key in {marker_key, *markers} if candidates or markers else ():
            self.context.store.delete(key)
        return result

    def _old_by_the_stores_clock(self, marker_key: str, candidates: list[ObjectInfo], min_age: int, result: GcResult) -> list[ObjectInfo]:
        """The candidates old enough by the store's own clock (the marker just written): a pool whose clock runs ahead deletes nothing young."""
        try:
            store_now = self.context.store.head(marker_key).last_modified_ms
        except NotFoundError:
            return []  # the marker is gone already (another run finished it): judge again next run
        kept = [c for c in candidates if store_now - c.last_modified_ms >= min_age]
        result.too_young += len(candidates) - len(kept)
        return kept

    def _savepoint_candidates(self, infos: list[ObjectInfo], now: int, min_age: int, result: GcResult) -> list[ObjectInfo]:
        """Objects under savepoints/ that no savepoint's _metadata names (a savepoint is any folder holding one, at any depth).

        A folder whose _metadata vanished or does not parse keeps it and its data/ this run (never delete what a
        damaged _metadata may still name); objects under no _metadata (an interrupted savepoint) go past the minimum age.
        """
        published, _ = savepoint_folders(i.key for i in infos)
        refs: set[str] = set()
        kept: set[str] = set()
        for name in published:
            key = savepoint_manifest_key(name)
            try:
                m = parse_manifest(self.context.store.get(key), key)
            except (NotFoundError, CorruptDataError, InvalidArgumentError):
                kept.add(name)  # deleted meanwhile or unreadable: judged again next run
                continue
            refs |= {savepoint_file_key(name, f.path) for f in m.files} | {key}
        result.referenced += len(refs)
        # what an unreadable _metadata could name: itself and its folder's data/ (the parser refuses any other path)
        keep = tuple(savepoint_prefix(n) + DATA_DIR for n in kept) + tuple(savepoint_manifest_key(n) for n in kept)
        held = [i for i in infos if i.key not in refs and i.key.startswith(keep)]
        refs |= {i.key for i in held}
        return _unreferenced_old_enough(infos, refs, now, min_age, result)

    def held_files(self, job: str) -> dict | None:
        """Why a run may free nothing: the data files of ``job`` its newest complete checkpoint does not read that some
        manifest or part still names, and which checkpoints those are (None when the job has no complete checkpoint).

        Older checkpoints name their own layers, and a compacted checkpoint keeps the layers it folded as ``retired``
        (readers may have cached its old version), so those files go only when the checkpoints naming them leave retention.
        """
        job = self.context.job(job)
        layout = JobListing.of(job, list(self.context.store.list(job_prefix(job))))
        if not layout.complete:
            return None
        newest = max(layout.complete)
        sizes = {info.key: info.size for info in layout.data}
        used: set[str] = set()
        holders: dict[str, set[int]] = {}
        for key in layout.manifest_keys:
            parsed = parse_job_key(key)
            assert parsed is not None  # the listing sorted it as a manifest or a part
            try:
                m = parse_manifest(self.context.store.get(key), key)
            except NotFoundError:
                continue  # gone since the listing: it holds nothing any more
            if parsed.kind == "metadata" and parsed.checkpoint_id == newest:
                used = {job_file_key(job, f.path) for f in m.files}
            for path in m.referenced_paths:
                holders.setdefault(job_file_key(job, path), set()).add(parsed.checkpoint_id)
        held = {key: ids for key, ids in holders.items() if key not in used and key in sizes}
        return {
            "job": job,
            "newest_checkpoint": newest,
            "files": len(held),
            "bytes": sum(sizes[key] for key in held),
            "checkpoints": sorted(set().union(*held.values())) if held else [],
        }

    def _stale_temp_files(self, now_ms: int, min_age_ms: int) -> list[Path]:
        """Temp files of a file:// store older than the minimum age: a process killed between write and rename left them."""
        if not isinstance(self.context.store, FileStore):
            return []
        out: list[Path] = []
        root = self.context.store.root
        temp_dirs = [root / FILE_STORE_TMP_DIR]  # and those of savepoints written to a folder of the store (--to)
        temp_dirs += [Path(d) / FILE_STORE_TMP_DIR for d, names, _ in os.walk(root / SAVEPOINTS) if FILE_STORE_TMP_DIR in names]
        for temp_dir in temp_dirs:
            if not temp_dir.is_dir():  # a store nothing was written to yet has no temp folder
                continue
            for path in temp_dir.iterdir():
                try:
                    if now_ms - int(path.stat().st_mtime * 1000) >= min_age_ms:
                        out.append(path)
                except FileNotFoundError:
                    continue  # renamed into place or removed meanwhile
        return out

    def _job_references(self, job: str, layout: JobListing) -> set[str] | None:
        """Store keys of every data file a _metadata (used or retired) or a staged part names; None if one vanished while read.

        A manifest deleted between the listing and its read may have been the source a commit copied references from
        after the listing (protocol I6), so the run cannot judge the job from this listing.
        """
        refs: set[str] = set()
        for key in layout.manifest_keys:
            try:
                m = parse_manifest(self.context.store.get(key), key)
            except NotFoundError:
                return None
            refs.update(job_file_key(job, path) for path in m.referenced_paths)
        return refs
