"""Checkpoint lifecycle over one store, one entry point: savepoints, restore, pins, retention, compaction, inspect and GC."""

from __future__ import annotations

import time
from collections.abc import Callable

import pyarrow as pa

from pool.compaction import Compaction, CompactionResult
from pool.describe import JobDescriber, manifest_summary
from pool.gc import GarbageCollector, GcResult
from pool.lifecycle_context import LifecycleConfig, LifecycleContext, validate_name
from pool.pins import Pins
from pool.restore import Restorer, RestoreResult
from pool.retention import Retention, RetentionResult
from pool.savepoints import SavepointInfo, Savepoints
from store.checkpoint import CheckpointReader
from store.locations import StateLocation
from store.manifest import Manifest, Part
from store.objects import ObjectStore
from store.segment_cache import SegmentCache

__all__ = [
    "CompactionResult",
    "GcResult",
    "Lifecycle",
    "LifecycleConfig",
    "RestoreResult",
    "RetentionResult",
    "SavepointInfo",
    "manifest_summary",
    "validate_name",
]


class Lifecycle:
    """Savepoints, restores, pins, retention, compaction and GC over one store (no server needed), each done by its own module."""

    def __init__(
        self,
        store: ObjectStore,
        config: LifecycleConfig | None = None,
        clock: Callable[[], float] = time.time,
        cache: SegmentCache | None = None,
        on_manifest_replaced: Callable[[str, int], None] | None = None,
    ) -> None:
        config = config or LifecycleConfig()
        cache = cache if cache is not None else SegmentCache(config.cache_bytes)
        self.context = LifecycleContext(store, config, clock, cache, on_manifest_replaced)
        self.store, self.config, self.clock, self.cache, self.fencing = store, config, clock, cache, self.context.fencing
        self.pins = Pins(self.context)
        self.savepoints = Savepoints(self.context)
        self.restorer = Restorer(self.context)
        self.retention = Retention(self.context, self.pins)
        self.compaction = Compaction(self.context)
        self.describer = JobDescriber(self.context, self.pins)
        self.collector = GarbageCollector(self.context, self.pins)

    # ---- opening sources -------------------------------------------------------------------------------------

    def open_checkpoint(self, job: str, checkpoint_id: int = 0, store: ObjectStore | None = None) -> tuple[CheckpointReader, Manifest, str]:
        """(reader, manifest, folder) of a complete checkpoint (0 = latest); NotFoundError naming what is missing."""
        return self.context.open_checkpoint(job, checkpoint_id, store)

    def open_savepoint(self, name: str, store: ObjectStore | None = None) -> tuple[CheckpointReader, Manifest, str]:
        """(reader, manifest, folder) of a savepoint (NAME or JOB/NAME), read through a read-only view of its folder."""
        return self.context.open_savepoint(name, store)

    def read_table(self, reader: CheckpointReader, manifest: Manifest, key_groups: tuple[int, int] | None = None) -> pa.Table:
        """Canonical rows of a checkpoint or savepoint (clipped to key_groups: only those segments are fetched)."""
        return reader.read_manifest_table(manifest, key_groups)

    # ---- savepoints and restore ------------------------------------------------------------------------------

    def savepoint(
        self,
        job: str,
        checkpoint_id: int = 0,
        name: str | None = None,
        target_store: ObjectStore | None = None,
        under_job: bool = False,
        to: ObjectStore | None = None,
    ) -> SavepointInfo:
        """Write a savepoint: into ``to`` (any directory), savepoints/NAME/, or savepoints/JOB/savepoint-<chk>-<hex>/; see Savepoints.savepoint."""
        return self.savepoints.savepoint(job, checkpoint_id, name, target_store, under_job, to)

    def list_savepoints(self, store: ObjectStore | None = None) -> list[str]:
        """Names (NAME, or JOB/NAME for those written under a job) of every savepoint folder (complete or not), sorted."""
        return self.savepoints.list_savepoints(store)

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
        """Create checkpoint 1 of a NEW job from a savepoint or a checkpoint; see Restorer.restore_job."""
        return self.restorer.restore_job(
            new_job, savepoint=savepoint, job=job, checkpoint_id=checkpoint_id, source_store=source_store, progress=progress
        )

    def checkpoint_location(self, job: str, checkpoint_id: int = 0, store: ObjectStore | None = None) -> StateLocation:
        """A complete checkpoint (0: the latest) of a job of ``store`` (default: this one) opened as a location."""
        return self.restorer.checkpoint_location(job, checkpoint_id, store or self.store)

    def jobs_restored_from(self, location: str) -> list[tuple[str, int]]:
        """(job, checkpoint) of every job of this store still holding the checkpoint a restore from ``location`` made."""
        return self.restorer.jobs_restored_from(location)

    # ---- pins and retention ----------------------------------------------------------------------------------

    def pin(self, job: str, checkpoint_id: int, holder: str, ttl_s: float, owner: str | None = None) -> tuple[int, int]:
        """Protect a complete checkpoint (0 = latest) from retention until now + ttl_s: (checkpoint id, expiry ms); see Pins.pin."""
        return self.pins.pin(job, checkpoint_id, holder, ttl_s, owner)

    def unpin(
        self,
        job: str,
        checkpoint_id: int,
        holder: str,
        owner: str | None = None,
        may_unpin_others: bool = True,
        latest_for_0: bool = False,
    ) -> tuple[int, bool]:
        """Drop a pin (idempotent; 0 = latest with ``latest_for_0``): (checkpoint id, whether there was one); see Pins.unpin."""
        return self.pins.unpin(job, checkpoint_id, holder, owner, may_unpin_others, latest_for_0)

    def pins_held_by(self, job: str, holder: str) -> list[int]:
        """The checkpoints of ``job`` that ``holder`` pins, sorted."""
        return self.pins.held_by(job, holder)

    def retain(self, job: str, keep_last: int | None = None, dry_run: bool = False) -> RetentionResult:
        """Delete complete checkpoints older than the newest keep_last (unless pinned) and abandoned ones; see Retention.retain."""
        return self.retention.retain(job, keep_last, dry_run)

    # ---- compaction ------------------------------------------------------------------------------------------

    def needs_compaction(self, manifest: Manifest) -> list[Part]:
        """Parts whose layers pass a threshold: more than compact_max_layers layers, or delta bytes above compact_max_delta_bytes."""
        return self.compaction.needs_compaction(manifest)

    def compact(self, job: str, checkpoint_id: int = 0, force: bool = False) -> CompactionResult:
        """Fold the layers of each part over a threshold (every multi-layer part with force) into one base file; see Compaction.compact."""
        return self.compaction.compact(job, checkpoint_id, force)

    def compact_job(self, job: str, force: bool = False) -> CompactionResult:
        """Compact the latest complete checkpoint of a job (what the next commits build on)."""
        return self.compaction.compact_job(job, force)

    # ---- inspection and garbage collection -------------------------------------------------------------------

    def describe_job(self, job: str) -> dict:
        """A job's checkpoints (complete: summary of each manifest; incomplete: staged ranges) and live pins; one LIST."""
        return self.describer.describe_job(job)

    def gc(
        self,
        job: str | None = None,
        dry_run: bool = False,
        max_deletes: int | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> GcResult:
        """Delete data files that nothing references and that are older than gc_min_age_s; see GarbageCollector.gc."""
        return self.collector.gc(job, dry_run, max_deletes, progress)

    def held_files(self, job: str) -> dict | None:
        """Files of ``job`` its newest checkpoint no longer reads that older or compacted checkpoints still name; see GarbageCollector."""
        return self.collector.held_files(job)
