"""The hot delta: writes since the last snapshot, per-key writes in a dict and bulk writes as Arrow runs; newest wins."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from functools import cached_property
from operator import itemgetter
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import snapshot
from snapshot.key_index import KeyIndex, hash_keys

StateKey = tuple[int, bytes]  # (op_id, key_bytes)
Layer = dict[StateKey, "bytes | None"]  # None marks an erase


class _Missing(enum.Enum):
    """The sentinel of a lookup that found nothing (None is a value there: a key known absent, an erase)."""

    MISSING = enum.auto()


MISSING: Final = _Missing.MISSING


def entry_bytes(key: StateKey, value: bytes | None) -> int:
    """Key plus value bytes of one entry (an erase counts its key)."""
    return len(key[1]) + (len(value) if value is not None else 0)


def changelog_table(layer: Mapping[StateKey, bytes | None]) -> pa.Table:
    """A changelog table (puts and erases) of a layer, built column-wise: the columns are listed once, the rest is Arrow."""
    if not layer:
        return snapshot.empty_table(changelog=True)
    keys = list(layer.keys())
    values = pa.array(list(layer.values()), type=pa.binary())  # an erase (None) becomes a null, then an erase row
    kinds = pc.if_else(values.is_null(), pa.scalar(snapshot.ROW_ERASE, pa.uint8()), pa.scalar(snapshot.ROW_PUT, pa.uint8()))
    op_ids = pa.array(list(map(itemgetter(0), keys)), type=pa.uint64())
    key_bytes = pa.array(list(map(itemgetter(1), keys)), type=pa.binary())
    columns = [kinds, op_ids, key_bytes, values.fill_null(b"")]
    return pa.Table.from_arrays(columns, schema=snapshot.CHANGELOG_SCHEMA)


def _data_bytes(array: pa.Array) -> int:
    """Bytes of a binary array's values (its last offset minus its first), without touching the rows."""
    n = len(array)
    if n == 0:
        return 0
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int32, count=n + 1, offset=array.offset * 4)
    return int(offsets[-1] - offsets[0])


class ArrowRun:
    """A bulk write held as a changelog table (puts and erases), indexed by hash the first time a read reaches it.

    A key written twice in one run resolves to its last row, as a changelog replays.
    """

    def __init__(self, changelog: pa.Table) -> None:
        self.changelog = changelog.combine_chunks()
        self.rows = self.changelog.num_rows
        self.bytes = _data_bytes(self.changelog.column("key_bytes").chunk(0)) + _data_bytes(self.changelog.column("value_bytes").chunk(0))
        if self.rows:
            erases = pc.equal(self.changelog.column("row_kind"), snapshot.ROW_ERASE)
            self.erases = int(pc.sum(erases).as_py() or 0)
        else:
            self.erases = 0

    @classmethod
    def from_layer(cls, layer: Mapping[StateKey, bytes | None]) -> ArrowRun:
        """A run of a dict layer's entries."""
        return cls(changelog_table(layer))

    @cached_property
    def index(self) -> KeyIndex:
        """The hash index of the run's rows (a key written twice is found at its last row: ``find_one(last=True)``)."""
        table = self.changelog
        hashes = hash_keys(table.column("op_id").to_numpy(), table.column("key_bytes"))
        order = np.argsort(hashes)
        return KeyIndex(table.select(["op_id", "key_bytes", "value_bytes"]), hashes[order], order)

    @cached_property
    def _erase_mask(self) -> np.ndarray | None:
        if not self.erases:
            return None
        return self.changelog.column("row_kind").to_numpy() == snapshot.ROW_ERASE

    def get(self, key: StateKey) -> bytes | None | _Missing:
        """The run's value of a key (None: erased here), MISSING when the run does not write it."""
        if not self.rows:
            return MISSING
        index = self.index
        row = index.find_one(key[0], key[1], last=True)
        if row < 0:
            return MISSING
        erased = self._erase_mask
        if erased is not None and erased[row]:
            return None
        return index.value_at(row)


def _merged(older: ArrowRun, newer: ArrowRun) -> ArrowRun:
    """Two runs as one: the newer's rows win (a vectorised replay, one row per key)."""
    return ArrowRun(snapshot.replay_changelog(pa.concat_tables([older.changelog, newer.changelog])))


class Delta:
    """Writes since a snapshot: bulk runs (oldest first) under a dict of per-key writes that is newer than all of them."""

    def __init__(self) -> None:
        self.runs: list[ArrowRun] = []
        self.top: Layer = {}
        self.bytes = 0  # key plus value bytes written (a key rewritten in another run counts again)

    def __bool__(self) -> bool:
        return bool(self.top) or bool(self.runs)

    @property
    def rows(self) -> int:
        """Puts and erases held (a key written by per-key writes and by a run counts once in each)."""
        return len(self.top) + sum(r.rows for r in self.runs)

    def put(self, key: StateKey, value: bytes | None) -> None:
        """A per-key put (value) or erase (None)."""
        old = self.top.get(key, MISSING)
        if old is not MISSING:
            self.bytes -= entry_bytes(key, old)
        self.top[key] = value
        self.bytes += entry_bytes(key, value)

    def put_run(self, changelog: pa.Table) -> None:
        """A bulk write, newer than everything held: the per-key writes so far become a run beneath it."""
        if not changelog.num_rows:
            return
        if self.top:
            self.runs.append(ArrowRun.from_layer(self.top))
            self.top = {}
        run = ArrowRun(changelog)
        self.runs.append(run)
        self.bytes += run.bytes
        # size-tiered: fold the newest run into the one beneath while that one is not much bigger (few runs per read)
        while len(self.runs) > 1 and self.runs[-2].rows <= 2 * self.runs[-1].rows:
            newer = self.runs.pop()
            self.runs[-1] = _merged(self.runs[-1], newer)

    def get(self, key: StateKey) -> bytes | None | _Missing:
        """The newest write of a key (None: an erase), MISSING when none."""
        value = self.top.get(key, MISSING)
        if value is not MISSING:
            return value
        for run in reversed(self.runs):
            value = run.get(key)
            if value is not MISSING:
                return value
        return MISSING

    def __contains__(self, key: StateKey) -> bool:
        return self.get(key) is not MISSING

    def op_ids(self) -> set[int]:
        """The operators written."""
        ops = {k[0] for k in self.top}
        for run in self.runs:
            if run.rows:
                ops.update(pc.unique(run.changelog.column("op_id")).to_pylist())
        return ops

    def changelog_table(self) -> pa.Table:
        """Every write as one changelog, one row per key (the newest)."""
        tables = [r.changelog for r in self.runs]
        if self.top:
            tables.append(changelog_table(self.top))
        if not tables:
            return snapshot.empty_table(changelog=True)
        if len(tables) == 1:
            return tables[0]
        return snapshot.replay_changelog(pa.concat_tables(tables))

    def absorb_newer(self, newer: Delta) -> None:
        """Put ``newer``'s writes on top of these (a failed snapshot's delta taking back the writes made meanwhile)."""
        if newer.runs:
            if self.top:
                self.runs.append(ArrowRun.from_layer(self.top))
                self.top = {}
            self.runs.extend(newer.runs)
            self.top = newer.top
        else:
            self.top.update(newer.top)
        self.bytes = sum(r.bytes for r in self.runs) + sum(entry_bytes(k, v) for k, v in self.top.items())

    def key_columns(self) -> tuple[np.ndarray, pa.Array]:
        """op_ids and key_bytes of every write (the per-key ones listed once), for marking them changed elsewhere."""
        ops = [r.changelog.column("op_id").chunk(0) for r in self.runs if r.rows]
        keys = [r.changelog.column("key_bytes").chunk(0) for r in self.runs if r.rows]
        if self.top:
            top = list(self.top)
            ops.append(pa.array(list(map(itemgetter(0), top)), pa.uint64()))
            keys.append(pa.array(list(map(itemgetter(1), top)), pa.binary()))
        if not keys:
            return np.zeros(0, dtype=np.uint64), pa.array([], pa.binary())
        return pa.concat_arrays(ops).to_numpy(zero_copy_only=False), pa.concat_arrays(keys)
