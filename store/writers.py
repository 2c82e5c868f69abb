"""The writers table of a job (jobs/<job>/writers): current writer epochs per key-group range and where each restored from."""

from __future__ import annotations

import json
from dataclasses import dataclass

from snapshot import NUM_KEY_GROUPS
from snapshot.errors import CorruptDataError

WRITERS_FORMAT = "clink.writers"


@dataclass(frozen=True)
class Writer:
    """One current writer: its key-group range (inclusive), its epoch, and the checkpoint it restored from (None: not known)."""

    kg_lo: int
    kg_hi: int
    epoch: int
    base: int | None = None

    def overlaps(self, lo: int, hi: int) -> bool:
        """Whether this writer's range meets lo..hi."""
        return self.kg_lo <= hi and lo <= self.kg_hi


@dataclass(frozen=True)
class WriterTable:
    """The current writers of a job: disjoint ranges, each owned by one epoch; epochs only grow (next_epoch is the next one)."""

    next_epoch: int
    writers: tuple[Writer, ...]

    def holds(self, kg_lo: int, kg_hi: int, epoch: int | None) -> bool:
        """Whether ``epoch`` still owns exactly kg_lo..kg_hi."""
        return epoch is not None and any(w.kg_lo == kg_lo and w.kg_hi == kg_hi and w.epoch == epoch for w in self.writers)

    def describe_owner(self, kg_lo: int, kg_hi: int) -> str:
        """Who owns key groups overlapping this range now (for error messages)."""
        owners = [f"{w.kg_lo}-{w.kg_hi} at epoch {w.epoch}" for w in self.writers if w.overlaps(kg_lo, kg_hi)]
        return ", ".join(owners) if owners else "nobody"

    def abandons(self, checkpoint_id: int, max_epoch: int) -> bool:
        """Whether a complete checkpoint whose newest part has ``max_epoch`` belongs to an attempt a rewind left behind.

        A writer that restored from checkpoint B at epoch E started a new attempt: a checkpoint after B completed only by
        epochs older than E was made by the attempt that failed (it is never latest; re-committing its id replaces it).
        """
        return any(w.base is not None and checkpoint_id > w.base and max_epoch < w.epoch for w in self.writers)

    def with_writer(self, kg_lo: int, kg_hi: int, base: int | None) -> tuple[WriterTable, int]:
        """This table with a new writer for kg_lo..kg_hi (every overlapping writer dropped) and the epoch it got."""
        epoch = self.next_epoch
        kept = tuple(w for w in self.writers if not w.overlaps(kg_lo, kg_hi))
        return WriterTable(epoch + 1, (*kept, Writer(kg_lo, kg_hi, epoch, base))), epoch

    def to_json(self) -> bytes:
        """Deterministic JSON."""
        rows = []
        for w in sorted(self.writers, key=lambda w: w.kg_lo):
            row = {"kg_lo": w.kg_lo, "kg_hi": w.kg_hi, "epoch": w.epoch}
            if w.base is not None:
                row["base"] = w.base
            rows.append(row)
        body = {"format": WRITERS_FORMAT, "version": 1, "next_epoch": self.next_epoch, "writers": rows}
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


EMPTY_TABLE = WriterTable(1, ())


def parse_writers(data: bytes, name: str) -> WriterTable:
    """Parse a writers file; CorruptDataError naming it on anything malformed."""
    try:
        d = json.loads(data)
        if d["format"] != WRITERS_FORMAT or d["version"] != 1:
            raise ValueError(f"format {d['format']!r} version {d['version']!r}")
        next_epoch = d["next_epoch"]
        if isinstance(next_epoch, bool) or not isinstance(next_epoch, int):
            raise ValueError("next_epoch must be an integer")
        writers = []
        for w in d["writers"]:
            lo, hi, epoch, base = w["kg_lo"], w["kg_hi"], w["epoch"], w.get("base")
            ints = (lo, hi, epoch) + (() if base is None else (base,))
            if any(isinstance(v, bool) or not isinstance(v, int) for v in ints):
                raise ValueError("kg_lo, kg_hi, epoch and base must be integers")
            if not 0 <= lo <= hi < NUM_KEY_GROUPS or not 1 <= epoch < next_epoch or (base is not None and base < 0):
                raise ValueError(f"writer {w} is out of range")
            writers.append(Writer(lo, hi, epoch, base))
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptDataError(f"writers file {name} is malformed: {exc}") from None
    return WriterTable(next_epoch, tuple(writers))
