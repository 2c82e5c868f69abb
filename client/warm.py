"""The warm table: a backend's key groups at its restore checkpoint, loaded in bulk after a restore to answer reads locally."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

import snapshot
from snapshot import NUM_KEY_GROUPS
from snapshot.key_index import KeyIndex, hash_key, hash_keys

WARM_MODES = ("auto", "off", "eager")
# what a warm table holds beside a row's own bytes: its hash (8) and a share of the bucket table (1), rounded up
INDEX_BYTES_PER_ROW = 10
# at most this many key groups' bytes per ScanCheckpoint, so the scan's bytes and their decoded copy stay small
MIN_CHUNK_BYTES = 2 << 20
CHUNKS_PER_RANGE = 8
# when this share of the table has been rewritten since its checkpoint, it answers too little: load it again
REWARM_STALE_SHARE = 0.25


def check_warm_mode(mode: str) -> str:
    """The warm-up setting, or InvalidArgumentError naming the choices."""
    if mode not in WARM_MODES:
        raise snapshot.InvalidArgumentError(f"warm_up must be one of {', '.join(WARM_MODES)}; got {mode!r}")
    return mode


@dataclass(frozen=True)
class WarmPlan:
    """Which key groups to load, in which scans, and what they are expected to hold."""

    groups: tuple[int, ...]  # ascending
    chunks: tuple[tuple[int, int], ...]  # contiguous (lo, hi) scans
    expected_bytes: int  # the memory the chosen key groups are expected to take, their index included
    range_bytes: int  # stored bytes of the whole range
    state: str  # "full", "partial" or "none"


def plan_warm_up(
    lo: int,
    hi: int,
    key_group_bytes: Sequence[int],
    operator_bytes: int,
    budget: int,
    reads_by_group: Sequence[int],
    bytes_per_row: float = 0.0,
) -> WarmPlan:
    """Every key group of lo..hi when they fit ``budget``; else the most read ones that fit (key group order on ties).

    A key group costs its stored bytes plus the index's share (INDEX_BYTES_PER_ROW for each row, rows estimated from
    ``bytes_per_row``, the checkpoint's stored bytes per row). Operator state comes with the first scan and counts too.
    The stored bytes are estimates (a segment over several key groups is split evenly): the load checks the real size.
    """
    groups = list(range(lo, hi + 1))
    overhead = 1.0 + (INDEX_BYTES_PER_ROW / bytes_per_row if bytes_per_row > 0 else 0.0)
    stored = [int(b) for b in key_group_bytes]
    cost = [int(b * overhead) for b in stored]  # what a key group takes in memory once loaded and indexed
    operator_cost = int(operator_bytes * overhead)
    range_bytes = sum(stored[g] for g in groups) + operator_bytes  # as stored: what the table's memory is compared with
    if sum(cost[g] for g in groups) + operator_cost <= budget:
        chosen = groups
        state = "full"
    else:
        room = budget - operator_cost
        chosen = []
        for g in sorted(groups, key=lambda g: (-reads_by_group[g], g)):
            if cost[g] <= room:
                chosen.append(g)
                room -= cost[g]
        chosen.sort()
        state = "partial" if chosen else "none"
    expected = sum(cost[g] for g in chosen) + (operator_cost if chosen else 0)
    chunk_limit = max(MIN_CHUNK_BYTES, range_bytes // CHUNKS_PER_RANGE)  # a scan's size: stored bytes
    chunks: list[tuple[int, int]] = []
    size = 0
    for g in chosen:
        if chunks and chunks[-1][1] == g - 1 and size + stored[g] <= chunk_limit:
            chunks[-1] = (chunks[-1][0], g)
            size += stored[g]
        else:
            chunks.append((g, g))
            size = stored[g]
    return WarmPlan(tuple(chosen), tuple(chunks), expected, range_bytes, state)


def format_groups(groups: Sequence[int]) -> str:
    """Key groups (ascending) as ranges: "0-31,40-47" ("" for none)."""
    runs: list[list[int]] = []
    for g in groups:
        if runs and runs[-1][1] == g - 1:
            runs[-1][1] = g
        else:
            runs.append([g, g])
    return ",".join(f"{lo}-{hi}" if lo != hi else f"{lo}" for lo, hi in runs)


class WarmTable:
    """A range's rows at checkpoint ``base``, by key group as their scans arrive; answers reads until a key changes.

    Keys a later checkpoint of the backend changed are marked stale (by hash) and never answered here, so a read of
    them goes on to the read cache or the pool. Operator state is every subtask's: answered only while the backend
    still reads ``base``.
    """

    def __init__(self, base: int, key_groups: tuple[int, int], budget: int) -> None:
        self.base = base
        self.key_groups = key_groups
        self.budget = budget  # the table never holds more: a scan that would take it past is dropped
        self.plan: WarmPlan | None = None  # set once the warm-up knows what fits
        self._by_group: list[KeyIndex | None] = [None] * NUM_KEY_GROUPS
        self._operator: KeyIndex | None = None
        self._stale = np.zeros(0, dtype=np.uint64)
        self._lock = threading.Lock()
        self.rows = 0
        self.bytes = 0
        self.loaded_groups: list[int] = []
        self.hits = 0
        self.state = "loading"
        self.error = ""
        self.dropped = False  # a scan was larger than the room left, so it was not kept

    def set_plan(self, plan: WarmPlan) -> None:
        """What will be loaded (nothing: the state says why)."""
        self.plan = plan
        if not plan.groups:
            self.state = plan.state

    @property
    def range_bytes(self) -> int:
        """Stored bytes of the whole range, as the checkpoint reported them (0 until planned)."""
        return self.plan.range_bytes if self.plan is not None else 0

    def add_scan(self, lo: int, hi: int, table: pa.Table, first: bool) -> bool:
        """Take one scan's rows of key groups lo..hi (and, from the first scan, the operator state) if they fit the budget.

        The rows are copied into hash order (the scan's buffers are let go); False when they would not fit, and nothing is kept.
        """
        table = table.select(["op_id", "key_bytes", "value_bytes"])
        if self.bytes + table.nbytes > self.budget:  # the decoded rows alone do not fit: not worth indexing
            self.dropped = True
            return False
        lead = snapshot.leading_bytes(table.column("key_bytes").combine_chunks()) if table.num_rows else np.zeros(0, np.uint8)
        keyed = lead < NUM_KEY_GROUPS
        keyed_index = KeyIndex.build_compact(table if keyed.all() else table.filter(pa.array(keyed))).prepare()
        operator_index = KeyIndex.build_compact(table.filter(pa.array(~keyed))).prepare() if first else None
        size = sum(index.nbytes for index in (keyed_index, operator_index) if index is not None)
        with self._lock:
            if self.bytes + size > self.budget:
                self.dropped = True
                return False
            for g in range(lo, hi + 1):
                self._by_group[g] = keyed_index
            self.loaded_groups.extend(range(lo, hi + 1))
            if operator_index is not None:
                self._operator = operator_index
            self.rows += sum(len(index.hashes) for index in (keyed_index, operator_index) if index is not None)
            self.bytes += size
        return True

    def finish(self) -> None:
        """Every planned scan arrived (or was dropped for want of room: then the table is partial, or holds none)."""
        if self.plan is None:
            return
        if self.dropped:
            self.state = "partial" if self.loaded_groups else "none"
        else:
            self.state = self.plan.state

    def fail(self, error: BaseException) -> None:
        """The load stopped: what arrived keeps answering; the rest goes to the pool."""
        self.state = "failed"
        self.error = f"{type(error).__name__}: {error}"

    def _index_for(self, lead: int, read_checkpoint: int | None) -> KeyIndex | None:
        """The index that answers keys of this leading byte (operator state: only while ``base`` is still read)."""
        if lead < NUM_KEY_GROUPS:
            return self._by_group[lead]
        return self._operator if read_checkpoint == self.base else None

    def lookup(self, key: tuple[int, bytes], read_checkpoint: int | None) -> tuple[bool, bytes | None]:
        """(True, value or None when absent) for a key this table answers, else (False, None)."""
        op_id, key_bytes = key
        index = self._index_for(key_bytes[0], read_checkpoint)
        if index is None:
            return False, None
        h = hash_key(op_id, key_bytes)
        stale = self._stale
        if stale.size:
            i = int(np.searchsorted(stale, np.uint64(h)))
            if i < stale.size and int(stale[i]) == h:
                return False, None
        row = index.find_one(op_id, key_bytes, h)
        self.hits += 1
        return True, (index.value_at(row) if row >= 0 else None)

    def lookup_many(self, ks: Sequence[tuple[int, bytes]], read_checkpoint: int | None) -> dict[int, bytes | None]:
        """``lookup`` of many keys at once, vectorised per scan: {position in ks: value (None: absent)} of those it answers."""
        n = len(ks)
        answers: dict[int, bytes | None] = {}
        if n == 0:
            return answers
        ops = np.fromiter((k[0] for k in ks), dtype=np.uint64, count=n)
        keys = pa.array([k[1] for k in ks], pa.binary())
        lead = snapshot.leading_bytes(keys)
        by_index: dict[int, tuple[KeyIndex, list[int]]] = {}
        for i, g in enumerate(lead.tolist()):
            index = self._index_for(g, read_checkpoint)
            if index is not None:
                by_index.setdefault(id(index), (index, []))[1].append(i)
        if not by_index:
            return answers
        hashes = hash_keys(ops, keys)
        stale = self._stale
        for index, positions in by_index.values():
            pos = np.asarray(positions, dtype=np.int64)
            if stale.size:
                at = np.minimum(np.searchsorted(stale, hashes[pos]), stale.size - 1)
                pos = pos[stale[at] != hashes[pos]]
            if not pos.size:
                continue
            rows = index.find(hashes[pos], keys.take(pa.array(pos)), ops[pos])
            present = rows >= 0
            values = index.values.take(pa.array(rows[present])).to_pylist() if present.any() else []
            found = iter(values)
            for p, hit in zip(pos.tolist(), present.tolist(), strict=True):
                answers[p] = next(found) if hit else None
        self.hits += len(answers)
        return answers

    def mark_changed(self, op_ids: np.ndarray, keys: pa.Array) -> bool:
        """Keys a newer checkpoint of the backend holds: never answered here again. True when so many changed a reload pays.

        Only keys of key groups the table holds or may still load count (and operator state); a reload is due once the
        load has finished and more than REWARM_STALE_SHARE of its rows changed.
        """
        if len(keys):
            lead = snapshot.leading_bytes(keys)
            wanted = np.ones(NUM_KEY_GROUPS + 1, dtype=bool)  # by leading byte; index 128 stands for operator state
            plan = self.plan
            if plan is not None:
                wanted[:NUM_KEY_GROUPS] = False
                wanted[list(plan.groups)] = True
            mine = wanted[np.minimum(lead, NUM_KEY_GROUPS)]
            if mine.any():
                if not mine.all():
                    op_ids, keys = op_ids[mine], keys.filter(pa.array(mine))
                hashes = hash_keys(op_ids, keys)
                with self._lock:
                    self._stale = np.union1d(self._stale, hashes)
        if self.state == "loading" or not self.rows:
            return False
        return self._stale.size > max(64, REWARM_STALE_SHARE * self.rows)

    @property
    def stale_keys(self) -> int:
        """Keys marked changed since ``base``."""
        return int(self._stale.size)


def table_of_scan(blob: bytes) -> pa.Table:
    """The rows of a canonical scan stream (checked by the format reader)."""
    return snapshot.read_snapshot(blob).table
