"""What every lifecycle operation shares: the store, its settings, clock, segment cache and fencing; names checked, sources opened."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pool.writers import Fencing
from snapshot.errors import InvalidArgumentError, NotFoundError
from snapshot.names import validate_job
from store.checkpoint import CheckpointReader
from store.layout import (
    SAVEPOINT_ENTRIES,
    SAVEPOINT_MANIFEST,
    job_prefix,
    job_savepoint_name,
    savepoint_manifest_key,
    savepoint_prefix,
    split_job_savepoint_name,
)
from store.locations import NotAStateLocationError, StateLocation, open_directory
from store.manifest import Manifest
from store.objects import ObjectStore
from store.segment_cache import SegmentCache
from store.views import PrefixStore


@dataclass(frozen=True)
class LifecycleConfig:
    """Retention depth, compaction thresholds, GC minimum age and the lifecycle's limits; passed to Lifecycle, read by its operations alone."""

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


def validate_name(name: object, what: str = "savepoint name", max_bytes: int = 128) -> str:
    """Savepoint names and pin holders follow the job-id rule of snapshot/names.py."""
    return validate_job(name, max_bytes, what)


class LifecycleContext:
    """The store the lifecycle works on, with its settings, clock, one segment cache and fencing; opens checkpoints and savepoints."""

    def __init__(
        self,
        store: ObjectStore,
        config: LifecycleConfig,
        clock: Callable[[], float],
        cache: SegmentCache,
        on_manifest_replaced: Callable[[str, int], None] | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.clock = clock
        self.cache = cache
        self.on_manifest_replaced = on_manifest_replaced  # a pool forgets its cached manifest of a compacted checkpoint
        self.fencing = Fencing(store, clock=clock)

    def job(self, job: object) -> str:
        """A checked job id."""
        return validate_job(job, self.config.max_name_bytes)

    def name(self, name: object, what: str = "savepoint name") -> str:
        """A checked savepoint name or pin holder."""
        return validate_name(name, what, self.config.max_name_bytes)

    def savepoint_name(self, name: object) -> str:
        """A savepoint's name: NAME, or JOB/NAME for one the pool's RPC wrote under its job (NAME not a folder entry's name)."""
        under_job = split_job_savepoint_name(name) if isinstance(name, str) else None
        if under_job is not None:
            job, own = self.job(under_job[0]), self.name(under_job[1])
            if own in SAVEPOINT_ENTRIES:
                raise InvalidArgumentError(
                    f"savepoint name {own!r} is reserved (a savepoint folder holds {', '.join(sorted(SAVEPOINT_ENTRIES))})"
                )
            return job_savepoint_name(job, own)
        return self.name(name)

    def readable_savepoint_name(self, name: object) -> str:
        """The name of any savepoint folder under savepoints/ to read (a --to may lie deeper than JOB/NAME): valid parts."""
        if isinstance(name, str) and "/" in name:
            return "/".join(self.name(part) for part in name.split("/"))
        return self.savepoint_name(name)

    def now_ms(self) -> int:
        """The clock in milliseconds."""
        return int(self.clock() * 1000)

    def open_checkpoint(self, job: str, checkpoint_id: int = 0, store: ObjectStore | None = None) -> tuple[CheckpointReader, Manifest, str]:
        """(reader, manifest, folder) of a complete checkpoint (0 = latest); NotFoundError naming what is missing."""
        store = store or self.store
        job = self.job(job)
        reader = CheckpointReader(store, job, self.cache)
        if checkpoint_id == 0:
            checkpoint_id = reader.latest()
            if checkpoint_id == 0:
                raise NotFoundError(f"job {job} has no complete checkpoint in {store.uri}")
        if isinstance(checkpoint_id, bool) or not isinstance(checkpoint_id, int) or checkpoint_id < 0:
            raise InvalidArgumentError(f"checkpoint id {checkpoint_id!r} must be a non-negative integer")
        return reader, reader.manifest(checkpoint_id), job_prefix(job)

    def savepoint_location(self, name: str, store: ObjectStore | None = None) -> StateLocation:
        """savepoints/NAME/ (or JOB/NAME) of a store opened as a location, checked as any location is; NotFoundError naming it."""
        store = store or self.store
        name = self.readable_savepoint_name(name)
        directory = PrefixStore(store, savepoint_prefix(name))
        try:
            return open_directory(directory)
        except (NotAStateLocationError, NotFoundError) as exc:
            if isinstance(exc, NotAStateLocationError) and directory.exists(SAVEPOINT_MANIFEST):
                raise  # a damaged, newer or misplaced _metadata is said as such (exit 2), not "not found"
            raise NotFoundError(f"savepoint {name!r} not found (no {savepoint_manifest_key(name)} in {store.uri})") from None

    def open_savepoint(self, name: str, store: ObjectStore | None = None) -> tuple[CheckpointReader, Manifest, str]:
        """(reader, manifest, folder) of a savepoint (NAME or JOB/NAME), read through a read-only view of its folder."""
        loc = self.savepoint_location(name, store)
        return CheckpointReader(loc.store, loc.job, self.cache), loc.manifest, savepoint_prefix(self.readable_savepoint_name(name))
