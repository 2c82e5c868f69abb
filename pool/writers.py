"""Fencing: a job's writer epochs per key-group range, kept in jobs/<job>/writers and changed only by compare-and-swap."""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass

from pool.domain import KeyGroupRange
from snapshot.errors import ConflictError, CorruptDataError, FencedError, NotFoundError
from store.manifest import writers_key
from store.objects import ObjectStore

WRITERS_FORMAT = "clink.writers"


@dataclass(frozen=True)
class WriterTable:
    """The current writers of a job: disjoint ranges, each with the epoch that owns it; epochs only grow."""

    next_epoch: int
    writers: tuple[tuple[KeyGroupRange, int], ...]

    def holds(self, key_groups: KeyGroupRange, epoch: int) -> bool:
        """Whether ``epoch`` still owns exactly ``key_groups``."""
        return (key_groups, epoch) in self.writers

    def describe_owner(self, key_groups: KeyGroupRange) -> str:
        """Who owns key groups overlapping this range now (for error messages)."""
        owners = [f"{r} at epoch {e}" for r, e in self.writers if r.overlaps(key_groups)]
        return ", ".join(owners) if owners else "nobody"

    def to_json(self) -> bytes:
        """Deterministic JSON."""
        body = {
            "format": WRITERS_FORMAT,
            "version": 1,
            "next_epoch": self.next_epoch,
            "writers": [{"kg_lo": r.lo, "kg_hi": r.hi, "epoch": e} for r, e in sorted(self.writers, key=lambda w: w[0].lo)],
        }
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def parse_writers(data: bytes, name: str) -> WriterTable:
    """Parse a writers file; CorruptDataError naming it on anything malformed."""
    try:
        d = json.loads(data)
        if d["format"] != WRITERS_FORMAT or d["version"] != 1:
            raise ValueError(f"format {d['format']!r} version {d['version']!r}")
        next_epoch = d["next_epoch"]
        writers = tuple((KeyGroupRange(w["kg_lo"], w["kg_hi"]), w["epoch"]) for w in d["writers"])
        if not isinstance(next_epoch, int) or any(not isinstance(e, int) or not 1 <= e < next_epoch for _, e in writers):
            raise ValueError("epochs must be integers below next_epoch")
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptDataError(f"writers file {name} is malformed: {exc}") from None
    return WriterTable(next_epoch, writers)


class Fencing:
    """Reads and updates one store's writers files (retrying lost compare-and-swaps a bounded number of times)."""

    def __init__(self, store: ObjectStore, max_attempts: int = 64) -> None:
        self.store = store
        self.max_attempts = max_attempts

    def read(self, job: str) -> tuple[WriterTable, str | None]:
        """The writer table and its etag (None when no writer was ever registered)."""
        key = writers_key(job)
        try:
            data, etag = self.store.get_with_etag(key)
        except NotFoundError:
            return WriterTable(1, ()), None
        return parse_writers(data, key), etag

    def acquire(self, job: str, key_groups: KeyGroupRange) -> int:
        """A new epoch for ``key_groups``; every writer whose range overlaps it is fenced, disjoint ones are kept."""
        for attempt in range(self.max_attempts):
            table, etag = self.read(job)
            epoch = table.next_epoch
            kept = tuple(w for w in table.writers if not w[0].overlaps(key_groups))
            new = WriterTable(epoch + 1, (*kept, (key_groups, epoch)))
            try:
                self.store.compare_and_swap(writers_key(job), new.to_json(), etag)
                return epoch
            except ConflictError:
                time.sleep(min(0.2, 0.002 * (2 ** min(attempt, 7))) * random.random())  # jitter: racing acquirers spread out
        raise ConflictError(f"could not register a writer for key groups {key_groups} of job {job}: {self.max_attempts} concurrent updates won")

    def check(self, job: str, key_groups: KeyGroupRange, epoch: int) -> WriterTable:
        """Raise FencedError unless ``epoch`` still owns ``key_groups``; returns the table read."""
        table, _ = self.read(job)
        if not table.holds(key_groups, epoch):
            raise FencedError(
                f"writer epoch {epoch} for key groups {key_groups} of job {job} is fenced "
                f"(current owner: {table.describe_owner(key_groups)}); acquire a new epoch"
            )
        return table
