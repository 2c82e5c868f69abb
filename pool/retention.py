"""Retention: a job's checkpoints beyond the newest few, or left behind by a rewind, deleted unless pinned or restored from."""

from __future__ import annotations

from dataclasses import dataclass

from pool.job_listing import JobListing
from pool.lifecycle_context import LifecycleContext
from pool.pins import Pins
from pool.protocol import remove_checkpoint
from snapshot.errors import InvalidArgumentError, NotFoundError
from store.checkpoint import CheckpointReader
from store.layout import job_prefix, pin_prefix
from store.writers import WriterTable


@dataclass(frozen=True)
class RetentionResult:
    """Checkpoints a retention pass removed, kept, and kept only because a pin holds them."""

    job: str
    deleted: tuple[int, ...]
    kept: tuple[int, ...]
    pinned: tuple[int, ...]
    dry_run: bool


class Retention:
    """Applies retention to the jobs of one store, announcing what it removes first (protocol I3)."""

    def __init__(self, context: LifecycleContext, pins: Pins) -> None:
        self.context = context
        self.pins = pins

    def retain(self, job: str, keep_last: int | None = None, dry_run: bool = False) -> RetentionResult:
        """Delete complete checkpoints older than the newest keep_last (unless pinned), and abandoned ones past the minimum age.

        Kept besides: every checkpoint a current writer restored from (a rewound job builds on it). Complete checkpoints
        a rewind left behind and incomplete ones older than the latest are deleted once older than the minimum age.
        A deletion removes _metadata first (the checkpoint vanishes atomically), then the rest of chk-N/; data files
        are left to GC. Savepoints live outside jobs/ and are never touched.
        """
        job = self.context.job(job)
        keep = self.context.config.retain_last if keep_last is None else keep_last
        if keep < 1:
            raise InvalidArgumentError(f"keep_last = {keep} must be at least 1")
        listing = list(self.context.store.list(job_prefix(job)))
        if not listing:
            raise NotFoundError(f"job {job} not found in {self.context.store.uri}")
        layout = JobListing.of(job, listing)
        now = self.context.now_ms()
        held, _ = self.pins.live(layout.pins, now)
        min_age = int(self.context.config.gc_min_age_s * 1000)
        reader = CheckpointReader(self.context.store, job, self.context.cache)
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
            delete: set[int] = set()
            pinned: set[int] = set()
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
            with self.context.fencing.removing(job, decide, int(self.context.config.max_write_s * 1000), "retention") as (chosen, stop_at):
                delete = chosen - self._pinned_meanwhile(job, chosen, now)
                # listed again after the announcement: a checkpoint whose objects changed since the decision (a late part,
                # a re-commit) is not the one judged; a part written after this listing finds the checkpoint retiring
                relisted = JobListing.of(job, list(self.context.store.list(job_prefix(job))))
                for cid in sorted(delete):
                    before = {(o.key, o.etag) for o in layout.checkpoints.get(cid, [])}
                    now_objs = relisted.checkpoints.get(cid, [])
                    if {(o.key, o.etag) for o in now_objs} - before:
                        delete = delete - {cid}
                        continue
                    keys = [o.key for o in now_objs]
                    if not remove_checkpoint(
                        self.context.store, job, cid, keys, layout.metadata_etags.get(cid), stop_at, self.context.clock
                    ):
                        delete = {c for c in delete if c < cid}
                        break
        keep_ids, pinned = plan.get("keep", set()), plan.get("pinned", set())
        return RetentionResult(job, tuple(sorted(delete)), tuple(sorted(keep_ids)), tuple(sorted(pinned)), dry_run)

    def _pinned_meanwhile(self, job: str, chosen: set[int], now: int) -> set[int]:
        """Checkpoints among ``chosen`` a pin took after the decision (a pin checks the announcement after it is written)."""
        held, _ = self.pins.live(list(self.context.store.list(pin_prefix(job))), now)
        return chosen & held
