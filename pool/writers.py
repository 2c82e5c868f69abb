"""Fencing: a job's writer epochs per key-group range, kept in jobs/<job>/writers and changed only by compare-and-swap."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager

from pool.domain import KeyGroupRange
from snapshot.errors import ConflictError, FencedError, NotFoundError
from store.layout import metadata_key, writers_key
from store.objects import ObjectStore
from store.writers import WriterTable, parse_writers

__all__ = ["Fencing", "WriterTable"]

# jobs whose last-seen writers table one Fencing keeps (a table is a few KiB at most)
SEEN_TABLES = 4096


class Fencing:
    """Reads and updates one store's writers files (retrying lost compare-and-swaps a bounded number of times)."""

    def __init__(self, store: ObjectStore, max_attempts: int = 64, sleep=time.sleep, clock=time.time) -> None:
        self.store = store
        self.max_attempts = max_attempts
        self._sleep = sleep
        self._clock = clock
        self._seen: OrderedDict[str, tuple[WriterTable, str]] = OrderedDict()
        self._seen_lock = threading.Lock()

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _update(self, job: str, change, what: str):
        """Apply ``change(table) -> (new table or None, result)`` by compare-and-swap, retrying when another update won."""
        for attempt in range(self.max_attempts):
            table, etag = self.read(job)
            new, result = change(table)
            if new is None:
                return result
            try:
                self._remember(job, new, self.store.compare_and_swap(writers_key(job), new.to_json(), etag))
                return result
            except ConflictError:
                self._sleep(min(0.2, 0.002 * (2 ** min(attempt, 7))) * random.random())  # jitter: racing updaters spread out
        raise ConflictError(f"could not {what} of job {job}: {self.max_attempts} concurrent updates won")

    def read(self, job: str) -> tuple[WriterTable, str | None]:
        """The writer table and its etag (None when no writer was ever registered).

        A job's first table starts its epochs at the clock in microseconds, so a job deleted and created again under its
        old name never hands out an epoch a process of its earlier life still holds.
        """
        key = writers_key(job)
        try:
            data, etag = self.store.get_with_etag(key)
        except NotFoundError:
            with self._seen_lock:
                self._seen.pop(job, None)
            return WriterTable(first_epoch(self._clock), (), life=uuid.uuid4().hex), None
        table = parse_writers(data, key)
        self._remember(job, table, etag)
        return table, etag

    def _remember(self, job: str, table: WriterTable, etag: str) -> None:
        with self._seen_lock:
            self._seen[job] = (table, etag)
            self._seen.move_to_end(job)
            while len(self._seen) > SEEN_TABLES:
                self._seen.popitem(last=False)

    def seen(self, job: str) -> tuple[WriterTable, str] | None:
        """The writers table (and its etag) this fencing last read or wrote for ``job``: a version that was current once, maybe stale."""
        with self._seen_lock:
            return self._seen.get(job)

    def acquire(self, job: str, key_groups: KeyGroupRange, base: int | None = None) -> int:
        """A new epoch for ``key_groups``; every writer whose range overlaps it is fenced, disjoint ones are kept.

        ``base`` is the checkpoint the new writer restores from (None: not a restore): recorded so that checkpoints a
        rewind left behind are told apart from the new attempt's.
        """
        now = self._now_ms()

        def change(table: WriterTable):
            if base:
                if base in table.retiring_ids(now):
                    raise NotFoundError(f"checkpoint {base} of job {job} is being deleted (retention or a delete); restore from another")
                # checked between reading the table and swapping it: a removal announced meanwhile makes the swap fail
                if not self.store.exists(metadata_key(job, base)):
                    raise NotFoundError(
                        f"checkpoint {base} of job {job} is not complete (deleted, or never completed); nothing to restore from"
                    )
            return table.with_writer(key_groups.lo, key_groups.hi, base, now)

        return self._update(job, change, f"register a writer for key groups {key_groups}")

    def retire(self, job: str, decide, until_ms: int, owner: str) -> tuple[set[int], WriterTable]:
        """Announce, as ``owner``, the checkpoints ``decide(table)`` picks as being removed (one compare-and-swap).

        A restore's acquire and this announcement serialise on the writers table: either the restore registers its base
        first (and ``decide`` keeps it), or it finds the checkpoint retiring and refuses.
        """
        now = self._now_ms()

        def change(table: WriterTable):
            chosen = set(decide(table))
            if not chosen:
                return None, (chosen, table)
            new = table.with_retiring(chosen, until_ms, now, owner)
            return new, (chosen, new)

        return self._update(job, change, "announce a removal")

    @contextmanager
    def removing(self, job: str, decide, lease_ms: int, kind: str) -> Iterator[tuple[set[int], int]]:
        """Announce the removal ``decide(table)`` picks for ``lease_ms``; yields (the checkpoints, the clock ms to stop deleting at).

        Deletions stop with half the lease to spare (past the lease a restore or a pin may take a checkpoint again); the
        announcement is withdrawn when the block ends, however it ends.
        """
        until = self._now_ms() + lease_ms
        owner = f"{kind}-{uuid.uuid4().hex}"
        chosen, _ = self.retire(job, decide, until, owner)
        try:
            yield chosen, until - lease_ms // 2
        finally:
            self.unretire(job, owner)

    def unretire(self, job: str, owner: str) -> None:
        """Withdraw ``owner``'s removal intents (best effort: an intent also expires by itself); other removals' stay."""
        self._update(
            job, lambda t: (t.without_retiring(owner) if any(r[2] == owner for r in t.retiring) else None, None), "withdraw a removal"
        )

    def check(self, job: str, key_groups: KeyGroupRange, epoch: int) -> WriterTable:
        """Raise FencedError unless ``epoch`` still owns ``key_groups``; returns the table read."""
        table, _ = self.read(job)
        if not table.holds(key_groups.lo, key_groups.hi, epoch):
            raise fenced_error(job, key_groups, epoch, table)
        return table

    def check_seen(self, job: str, key_groups: KeyGroupRange, epoch: int) -> tuple[WriterTable, str | None]:
        """The last-seen table if ``epoch`` owns ``key_groups`` in it, else a fresh read; FencedError unless the epoch owns them.

        Not a fencing decision (a stale table may still hold a fenced epoch): a commit decides from the table it reads
        after its part landed (protocol I2). This is the early check that keeps most zombies from uploading.
        """
        seen = self.seen(job)
        if seen is not None and seen[0].holds(key_groups.lo, key_groups.hi, epoch):
            return seen
        table, etag = self.read(job)
        if not table.holds(key_groups.lo, key_groups.hi, epoch):
            raise fenced_error(job, key_groups, epoch, table)
        return table, etag


def first_epoch(clock) -> int:
    """A new job's first epoch: the clock in microseconds (a job created again under a used name starts past its old epochs)."""
    return max(2, int(clock() * 1_000_000))


def fenced_error(job: str, key_groups: KeyGroupRange, epoch: int, table: WriterTable) -> FencedError:
    """The FencedError a writer gets once ``epoch`` no longer owns its range."""
    return FencedError(
        f"writer epoch {epoch} for key groups {key_groups} of job {job} is fenced "
        f"(current owner: {table.describe_owner(key_groups.lo, key_groups.hi)}); acquire a new epoch"
    )
