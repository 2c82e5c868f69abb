"""The writers table of a job (jobs/<job>/writers): current writer epochs per key-group range and where each restored from."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from snapshot import NUM_KEY_GROUPS
from snapshot.errors import CorruptDataError

WRITERS_FORMAT = "clink.writers"
# restore records kept per job (the newest epochs win): a rewind's record only matters until retention removes what it left behind
MAX_RESTORE_RECORDS = 64


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
    """The current writers of a job: disjoint ranges, each owned by one epoch; epochs only grow (next_epoch is the next one).

    ``restores`` records (base, epoch) of restores: a restore from checkpoint B at epoch E started a new attempt, so a
    checkpoint after B that only older epochs completed was left behind. ``retiring`` holds (checkpoint, until_ms,
    owner) of checkpoints retention or a delete is removing: no restore or pin may take them meanwhile.
    """

    next_epoch: int
    writers: tuple[Writer, ...]
    restores: tuple[tuple[int, int], ...] = ()
    retiring: tuple[tuple[int, int, str], ...] = ()  # (checkpoint, until_ms, owner): who announced the removal
    serial: int = 0  # bumped on every change, so a table never returns to earlier bytes (an S3 etag is their MD5)
    # drawn at random when a job's first table is made: a job deleted and made again never repeats an earlier life's
    # bytes (and so etags) even when the clock that starts its epochs repeats
    life: str = ""

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
        epochs older than E was made by the attempt before it (it is never latest; re-committing its id replaces it). Any
        checkpoint completed after that restore holds a part of epoch E or newer, so the record never abandons one.
        The newest restore decides: an operator restoring a checkpoint an earlier rewind left behind brings it back.
        """
        if not self.restores:
            return False
        base, epoch = max(self.restores, key=lambda r: r[1])
        return checkpoint_id > base and max_epoch < epoch

    def retiring_ids(self, now_ms: int) -> set[int]:
        """Checkpoints being removed now (their intent not expired)."""
        return {cid for cid, _, _ in self._live_retiring(now_ms)}

    def with_writer(self, kg_lo: int, kg_hi: int, base: int | None, now_ms: int = 0) -> tuple[WriterTable, int]:
        """This table with a new writer for kg_lo..kg_hi (every overlapping writer dropped) and the epoch it got."""
        epoch = self.next_epoch
        kept = tuple(w for w in self.writers if not w.overlaps(kg_lo, kg_hi))
        restores = self.restores
        if base is not None:
            best = {b: e for b, e in restores}
            best[base] = epoch
            restores = tuple(sorted(best.items(), key=lambda r: r[1])[-MAX_RESTORE_RECORDS:])
        table = replace(
            self,
            next_epoch=epoch + 1,
            writers=(*kept, Writer(kg_lo, kg_hi, epoch, base)),
            restores=tuple(sorted(restores)),
            retiring=self._live_retiring(now_ms),
            serial=self.serial + 1,
        )
        return table, epoch

    def _live_retiring(self, now_ms: int) -> tuple[tuple[int, int, str], ...]:
        """The removal intents not expired at now_ms (an expired one is dropped by the next change)."""
        return tuple(r for r in self.retiring if r[1] > now_ms)

    def with_retiring(self, checkpoint_ids: set[int], until_ms: int, now_ms: int, owner: str) -> WriterTable:
        """This table announcing that ``owner`` is removing these checkpoints until until_ms (expired intents dropped)."""
        kept = [*self._live_retiring(now_ms), *((cid, until_ms, owner) for cid in sorted(checkpoint_ids))]
        return replace(self, retiring=tuple(sorted(kept)), serial=self.serial + 1)

    def without_retiring(self, owner: str) -> WriterTable:
        """This table with ``owner``'s removal intents withdrawn (its removal is done, or given up); others' stay."""
        return replace(self, retiring=tuple(r for r in self.retiring if r[2] != owner), serial=self.serial + 1)

    def to_json(self) -> bytes:
        """Deterministic JSON."""
        rows = []
        for w in sorted(self.writers, key=lambda w: w.kg_lo):
            row = {"kg_lo": w.kg_lo, "kg_hi": w.kg_hi, "epoch": w.epoch}
            if w.base is not None:
                row["base"] = w.base
            rows.append(row)
        body: dict = {"format": WRITERS_FORMAT, "version": 1, "next_epoch": self.next_epoch, "writers": rows}
        if self.restores:
            body["restores"] = [{"base": b, "epoch": e} for b, e in self.restores]
        if self.retiring:
            body["retiring"] = [{"checkpoint": c, "until_ms": u, "owner": o} for c, u, o in self.retiring]
        if self.serial:
            body["serial"] = self.serial
        if self.life:
            body["life"] = self.life
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
        restores = tuple((_int(r["base"]), _int(r["epoch"])) for r in d.get("restores", []))
        retiring = tuple((_int(r["checkpoint"]), _int(r["until_ms"]), str(r.get("owner", ""))) for r in d.get("retiring", []))
        serial = _int(d.get("serial", 0))
        life = d.get("life", "")  # absent in tables written before it
        if not isinstance(life, str):
            raise ValueError("life must be a string")
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptDataError(f"writers file {name} is malformed: {exc}") from exc
    return WriterTable(next_epoch, tuple(writers), restores, retiring, serial, life)


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{value!r} must be a non-negative integer")
    return value
