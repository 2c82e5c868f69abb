"""Fencing: a job's writer epochs per key-group range, kept in jobs/<job>/writers and changed only by compare-and-swap."""

from __future__ import annotations

import random
import time

from pool.domain import KeyGroupRange
from snapshot.errors import ConflictError, FencedError, NotFoundError
from store.layout import writers_key
from store.objects import ObjectStore
from store.writers import EMPTY_TABLE, WriterTable, parse_writers

__all__ = ["Fencing", "WriterTable"]


class Fencing:
    """Reads and updates one store's writers files (retrying lost compare-and-swaps a bounded number of times)."""

    def __init__(self, store: ObjectStore, max_attempts: int = 64, sleep=time.sleep) -> None:
        self.store = store
        self.max_attempts = max_attempts
        self._sleep = sleep

    def read(self, job: str) -> tuple[WriterTable, str | None]:
        """The writer table and its etag (None when no writer was ever registered)."""
        key = writers_key(job)
        try:
            data, etag = self.store.get_with_etag(key)
        except NotFoundError:
            return EMPTY_TABLE, None
        return parse_writers(data, key), etag

    def acquire(self, job: str, key_groups: KeyGroupRange, base: int | None = None) -> int:
        """A new epoch for ``key_groups``; every writer whose range overlaps it is fenced, disjoint ones are kept.

        ``base`` is the checkpoint the new writer restores from (None: not a restore): recorded so that checkpoints a
        rewind left behind are told apart from the new attempt's.
        """
        for attempt in range(self.max_attempts):
            table, etag = self.read(job)
            new, epoch = table.with_writer(key_groups.lo, key_groups.hi, base)
            try:
                self.store.compare_and_swap(writers_key(job), new.to_json(), etag)
                return epoch
            except ConflictError:
                self._sleep(min(0.2, 0.002 * (2 ** min(attempt, 7))) * random.random())  # jitter: racing acquirers spread out
        raise ConflictError(f"could not register a writer for key groups {key_groups} of job {job}: {self.max_attempts} concurrent updates won")

    def check(self, job: str, key_groups: KeyGroupRange, epoch: int) -> WriterTable:
        """Raise FencedError unless ``epoch`` still owns ``key_groups``; returns the table read."""
        table, _ = self.read(job)
        if not table.holds(key_groups.lo, key_groups.hi, epoch):
            raise fenced_error(job, key_groups, epoch, table)
        return table


def fenced_error(job: str, key_groups: KeyGroupRange, epoch: int, table: WriterTable) -> FencedError:
    """The FencedError a writer gets once ``epoch`` no longer owns its range."""
    return FencedError(
        f"writer epoch {epoch} for key groups {key_groups} of job {job} is fenced "
        f"(current owner: {table.describe_owner(key_groups.lo, key_groups.hi)}); acquire a new epoch"
    )
