"""Point reads by hash: a 64-bit hash of (op_id, key) over every key byte and a sorted index of them over some rows."""

from __future__ import annotations

import operator
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_HASH_BLOCK = 1 << 16  # rows hashed at a time (bounds the per-byte temporaries)
_HASH_SEED = 0x5EED
_multipliers = np.random.default_rng(_HASH_SEED).integers(1, 2**63, size=256, dtype=np.uint64) | np.uint64(1)


def _position_multipliers(length: int) -> np.ndarray:
    """Odd 64-bit multipliers for byte positions 0..length-1 (grown on demand, always the same sequence)."""
    global _multipliers
    if length > len(_multipliers):
        size = max(length, 2 * len(_multipliers))
        _multipliers = np.random.default_rng(_HASH_SEED).integers(1, 2**63, size=size, dtype=np.uint64) | np.uint64(1)
    return _multipliers


_U64 = (1 << 64) - 1
# keys up to this long are hashed with Python ints (under 1 us at 11 bytes, where numpy's three calls take ~2 us)
_SHORT_KEY = 32
_short_multipliers = _multipliers[:_SHORT_KEY].tolist()


def _mix64_int(h: int) -> int:
    """_mix64 on one Python int (the scalar path of a point read)."""
    h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & _U64
    h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & _U64
    return h ^ (h >> 31)


def hash_key(op_id: int, key: bytes) -> int:
    """hash_keys of one (op_id, key), as a Python int: the same value, without building arrays."""
    n = len(key)
    if n <= _SHORT_KEY:
        sums = sum(map(operator.mul, key, _short_multipliers)) & _U64  # the same sum mod 2**64 the matmul wraps to
    else:
        sums = int(np.frombuffer(key, dtype=np.uint8).astype(np.uint64) @ _position_multipliers(n)[:n])
    h = sums ^ ((n * 0x9E3779B97F4A7C15) & _U64)
    return _mix64_int(h ^ _mix64_int(op_id & _U64))


def binary_parts(array: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A binary array's offsets (int64, relative to its slice) and its data bytes, as numpy views."""
    n = len(array)
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int32, count=n + 1, offset=array.offset * 4).astype(np.int64)
    raw = array.buffers()[2]
    data = np.frombuffer(raw, dtype=np.uint8) if raw is not None and raw.size else np.zeros(0, dtype=np.uint8)
    return offsets, data


def _mix64(h: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: spreads every input bit over the output."""
    with np.errstate(over="ignore"):
        h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return h ^ (h >> np.uint64(31))


def hash_keys(op_ids: np.ndarray, keys: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A 64-bit hash of every (op_id, key) over all of the key's bytes; vectorised, in blocks of rows.

    Each byte is multiplied by an odd constant of its position and the products summed per key (reduceat),
    so keys that differ anywhere hash apart; equal hashes are still confirmed by comparing the keys.
    """
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    n = len(keys)
    out = np.empty(n, dtype=np.uint64)
    if n == 0:
        return out
    offsets, data = binary_parts(keys)
    ops = np.asarray(op_ids, dtype=np.uint64)
    for b in range(0, n, _HASH_BLOCK):
        stop = min(b + _HASH_BLOCK, n)
        starts, ends = offsets[b:stop], offsets[b + 1 : stop + 1]
        lens = ends - starts
        total = int(ends[-1] - starts[0])
        sums = np.zeros(stop - b, dtype=np.uint64)
        width = int(lens[0])
        if total and (lens == width).all():  # every key one width (the usual case): a 2-D product, no gather or reduceat
            rows = data[starts[0] : ends[-1]].reshape(stop - b, width).astype(np.uint64)
            sums = rows @ _position_multipliers(width)[:width]  # integer matmul wraps mod 2**64, like the sum below
        elif total:
            chunk = data[starts[0] : ends[-1]].astype(np.uint64)
            position = np.arange(total, dtype=np.int64) - np.repeat(starts - starts[0], lens)
            with np.errstate(over="ignore"):
                products = chunk * _position_multipliers(int(lens.max()))[position]
            nonempty = lens > 0
            sums[nonempty] = np.add.reduceat(products, (starts - starts[0])[nonempty])
        with np.errstate(over="ignore"):
            h = sums ^ (lens.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15))
            h ^= _mix64(ops[b:stop])
        out[b:stop] = _mix64(h)
    return out


def _view(array: np.ndarray) -> memoryview:
    """A 1-D array as a memoryview of its items (a copy only if it is not contiguous)."""
    return np.ascontiguousarray(array).data


def _one_chunk(column: pa.ChunkedArray) -> pa.Array:
    """A column as one array: its only chunk as it is (combine_chunks copies even one chunk), else combined."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


@dataclass(frozen=True)
class KeyIndex:
    """Rows of some segments in one contiguous table, with their (op_id, key) hashes sorted for np.searchsorted."""

    table: pa.Table
    hashes: np.ndarray
    order: np.ndarray | None  # the row of each sorted hash; None: the table's rows are in hash order already
    rows_per_bucket: int = 1  # the bucket table's size: about one entry per this many rows (a walk of about as many)

    @classmethod
    def build(cls, table: pa.Table) -> KeyIndex:
        """Hash every row once (vectorised) and sort the hashes."""
        table = table.combine_chunks()
        hashes = hash_keys(table.column("op_id").to_numpy(), table.column("key_bytes"))
        order = np.argsort(hashes, kind="stable")
        return cls(table, hashes[order], order)

    @classmethod
    def build_compact(cls, table: pa.Table) -> KeyIndex:
        """An index that holds little beside the rows: the rows copied into hash order (no order array), a bucket per 4 rows.

        About 9 bytes a row beyond the rows themselves (8 of hash, 1 of buckets); the copy also drops whatever larger
        buffers the input's columns were slices of.
        """
        hashes = hash_keys(_one_chunk(table.column("op_id")).to_numpy(zero_copy_only=False), table.column("key_bytes"))
        order = np.argsort(hashes, kind="stable")
        return cls(table.take(pa.array(order)).combine_chunks(), hashes[order], None, rows_per_bucket=4)

    @cached_property
    def _keys(self) -> pa.Array:
        return _one_chunk(self.table.column("key_bytes"))

    @cached_property
    def _ops(self) -> np.ndarray:
        return _one_chunk(self.table.column("op_id")).to_numpy(zero_copy_only=False)

    @cached_property
    def values(self) -> pa.Array:
        """The value column as one array (the table is contiguous, so no copy)."""
        return _one_chunk(self.table.column("value_bytes"))

    def prepare(self) -> KeyIndex:
        """Build the lazily built parts now (bucket starts, column views), so a first read pays none of it."""
        _ = self._bucket_starts, self._scalar_views
        return self

    @cached_property
    def _bucket_bits(self) -> int:
        return min(max(1, int(len(self.hashes) // self.rows_per_bucket - 1).bit_length()), 30)

    @cached_property
    def _bucket_starts(self) -> np.ndarray:
        """Where each bucket (the top bits of a hash) starts in the sorted hashes, with n appended: ~1 hash per bucket."""
        bits = self._bucket_bits
        bounds = np.arange(1 << bits, dtype=np.uint64) << np.uint64(64 - bits)
        return np.append(np.searchsorted(self.hashes, bounds, side="left"), len(self.hashes)).astype(
            np.int32 if len(self.hashes) < 2**31 else np.int64
        )

    def _first_at_least(self, q_hashes: np.ndarray) -> np.ndarray:
        """np.searchsorted(hashes, q, "left") in about two memory reads per query: the bucket's start, then a short walk.

        A binary search's ~18 dependent reads per query dominate once the index is out of the CPU cache (as between RPCs).
        """
        starts = self._bucket_starts
        bucket = (q_hashes >> np.uint64(64 - self._bucket_bits)).astype(np.intp)
        slot = starts[bucket].astype(np.int64)
        end = starts[bucket + 1]
        cand = np.flatnonzero(slot < end)
        cand = cand[self.hashes[slot[cand]] < q_hashes[cand]]
        while cand.size:  # buckets hold ~1 hash: a few shrinking rounds
            slot[cand] += 1
            cand = cand[slot[cand] < end[cand]]
            cand = cand[self.hashes[slot[cand]] < q_hashes[cand]]
        return slot

    @property
    def nbytes(self) -> int:
        """Bytes held (table buffers and the index arrays, the bucket starts included)."""
        starts = ((1 << self._bucket_bits) + 1) * (4 if len(self.hashes) < 2**31 else 8)
        order = self.order.nbytes if self.order is not None else 0
        return self.table.get_total_buffer_size() + self.hashes.nbytes + order + starts

    @cached_property
    def _scalar_views(self) -> tuple[memoryview, memoryview, memoryview | None, memoryview, memoryview, memoryview, memoryview, memoryview]:
        """Zero-copy views of the sorted hashes, bucket starts, their order, op ids, key offsets and bytes, value offsets and bytes.

        Memoryviews, not numpy arrays: an item of one is a Python int at once, a numpy scalar costs several times more.
        """
        key_offsets, key_data = binary_parts(self._keys)
        value_offsets, value_data = binary_parts(self.values)
        order = None if self.order is None else _view(self.order)
        hashes, starts, ops = _view(self.hashes), _view(self._bucket_starts), _view(self._ops)
        return hashes, starts, order, ops, _view(key_offsets), _view(key_data), _view(value_offsets), _view(value_data)

    def find_one(self, op_id: int, key: bytes, key_hash: int | None = None, last: bool = False) -> int:
        """Row of one (op_id, key), -1 if absent: the scalar path of ``find`` (no arrays built, a few array reads).

        ``last``: of a key the table holds more than once, its highest row (a changelog's newest write).
        """
        n = len(self.hashes)
        if n == 0:
            return -1
        h = hash_key(op_id, key) if key_hash is None else key_hash
        hashes, starts, order, ops, key_offsets, key_data, _, _ = self._scalar_views
        bucket = h >> (64 - self._bucket_bits)
        slot, end = starts[bucket], starts[bucket + 1]
        while slot < end and hashes[slot] < h:
            slot += 1
        found = -1
        while slot < n and hashes[slot] == h:
            row = slot if order is None else order[slot]
            if ops[row] == op_id and key_data[key_offsets[row] : key_offsets[row + 1]] == key:
                if not last:
                    return row
                found = max(found, row)
            slot += 1
        return found

    def value_at(self, row: int) -> bytes:
        """The value bytes of one row."""
        offsets, data = self._scalar_views[6:]
        return bytes(data[offsets[row] : offsets[row + 1]])

    def _rows_of(self, slots: np.ndarray) -> np.ndarray:
        return slots if self.order is None else self.order[slots]

    def find(self, q_hashes: np.ndarray, q_keys: pa.Array, q_ops: np.ndarray) -> np.ndarray:
        """Row of each query in the table, -1 if absent; equal hashes are confirmed by comparing the keys."""
        m, n = len(q_hashes), len(self.hashes)
        pos = np.full(m, -1, dtype=np.int64)
        slot = self._first_at_least(q_hashes)
        keys, ops = self._keys, self._ops
        if n == 0 or m == 0:
            return pos
        # first round over every query at once (a miss compares against some row, harmlessly): no take of the queries
        rows = self._rows_of(np.minimum(slot, n - 1))
        hashed = (slot < n) & (self.hashes[np.minimum(slot, n - 1)] == q_hashes)
        same = pc.equal(keys.take(pa.array(rows)), q_keys).to_numpy(zero_copy_only=False)
        same &= hashed & (ops[rows] == q_ops)
        pos[same] = rows[same]
        cand = np.flatnonzero(hashed & ~same)  # equal hash, other key: walk on to the next equal hash
        slot[cand] += 1
        while cand.size:  # only when two keys share a hash
            inside = slot[cand] < n
            cand = cand[inside]
            cand = cand[self.hashes[slot[cand]] == q_hashes[cand]]
            if not cand.size:
                break
            rows = self._rows_of(slot[cand])
            same = pc.equal(keys.take(pa.array(rows)), q_keys.take(pa.array(cand))).to_numpy(zero_copy_only=False)
            same &= ops[rows] == q_ops[cand]
            pos[cand[same]] = rows[same]
            cand = cand[~same]
            slot[cand] += 1
        return pos
