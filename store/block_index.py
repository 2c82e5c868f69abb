"""A segment's block index, partitioned: a small top naming partitions of blocks, each with its blocks and a bloom filter."""

from __future__ import annotations

import base64
import bisect
import struct
import zlib
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from snapshot.errors import ChecksumMismatchError, CorruptDataError

MAGIC = b"CLBI"  # a partition: some consecutive blocks of a segment and one bloom filter of their keys
VERSION = 1
TOP_MAGIC = b"CLBT"  # a segment's top: where each partition lies and the first key of each
TOP_VERSION = 1
_TOP_HEADER = struct.Struct("<4sBII")  # magic, version, partitions, blocks
# blocks per partition: a partition (~60 B a block and ~560 B of bloom for a 32 KiB block of ~450 rows) is about the
# size of a block, and the top grows by one entry per 32 blocks, so a cold Get reads top, partition and block
BLOCKS_PER_PARTITION = 32
# the footer metadata key holding every segment's index (base64, one blob per segment laid end to end)
FOOTER_KEY = "clink.block-index"
_HEADER = struct.Struct("<4sBIIB")  # magic, version, blocks, bloom bits, bloom probes
BLOOM_BITS_PER_KEY = 10
BLOOM_PROBES = 6  # about 0.8% false positives at 10 bits a key


def _probe_positions(hashes: np.ndarray, bits: int, probes: int) -> np.ndarray:
    """Bit positions of every hash's probes (double hashing on the two halves of the 64-bit hash), shape (n, probes)."""
    h1 = (hashes & np.uint64(0xFFFFFFFF)).astype(np.uint64)
    h2 = (hashes >> np.uint64(32)) | np.uint64(1)
    steps = np.arange(probes, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return (h1[:, None] + steps[None, :] * h2[:, None]) % np.uint64(bits)


def build_bloom(hashes: np.ndarray) -> tuple[np.ndarray, int]:
    """A bloom filter of these key hashes: (bits packed little-endian, number of bits)."""
    bits = max(64, -(-len(hashes) * BLOOM_BITS_PER_KEY // 64) * 64)
    flags = np.zeros(bits, dtype=bool)
    flags[_probe_positions(hashes, bits, BLOOM_PROBES).ravel()] = True
    return np.packbits(flags, bitorder="little"), bits


def _firsts(first_keys: tuple[bytes, ...], first_ops: np.ndarray) -> list[tuple[bytes, int]]:
    # the layout's sort order: key bytes, then op_id (Python compares bytes unsigned, as Arrow sorts them)
    return list(zip(first_keys, (int(o) for o in first_ops), strict=True))


def _last_not_after(firsts: list[tuple[bytes, int]], key: bytes, op_id: int) -> int:
    """The entry whose run can hold (key, op_id): the last whose first row is not after it."""
    return max(0, bisect.bisect_right(firsts, (key, op_id)) - 1)


def _padded(header: bytes, arrays: list[bytes], first_keys: tuple[bytes, ...], tail: bytes = b"") -> bytes:
    """An index's bytes: header, fixed-width arrays, the first keys (lengths, then bytes), a tail; padded to a multiple of 3
    (so its base64 starts at a known place in the footer's text).
    """
    lengths = np.fromiter((len(k) for k in first_keys), "<u4", len(first_keys)).tobytes()
    blob = b"".join([header, *arrays, lengths, b"".join(first_keys), tail])
    return blob + b"\0" * (-len(blob) % 3)


@dataclass(frozen=True)
class BlockIndex:
    """Consecutive blocks of a segment (a partition) in key order: byte range, rows, crc32 and first (key, op_id) of each,
    and one bloom filter of their keys.
    """

    offsets: np.ndarray  # int64, absolute in the file
    lengths: np.ndarray  # int64
    rows: np.ndarray  # int64
    crcs: np.ndarray  # uint32
    first_ops: np.ndarray  # uint64
    first_keys: tuple[bytes, ...]
    bloom: np.ndarray  # uint8, bits little-endian
    bloom_bits: int
    probes: int = BLOOM_PROBES

    def check_first_row(self, block: int, key: bytes, op_id: int, where: str) -> None:
        """A decoded block must start where its index says, or a key would be looked for in the wrong block."""
        if (key, op_id) != self._firsts[block]:
            raise CorruptDataError(f"{where}: block {block} starts with another key than its block index says")

    @cached_property
    def _firsts(self) -> list[tuple[bytes, int]]:
        return _firsts(self.first_keys, self.first_ops)

    @property
    def nbytes(self) -> int:
        """Memory held, for the cache's byte bound."""
        return 48 * len(self.first_keys) + sum(len(k) for k in self.first_keys) + self.bloom.nbytes + 200

    def may_hold(self, hashes: np.ndarray) -> np.ndarray:
        """Per hash: False when the segment surely lacks the key, True when it may hold it."""
        if hashes.size == 0:
            return np.zeros(0, dtype=bool)
        pos = _probe_positions(hashes, self.bloom_bits, self.probes)
        bit = (self.bloom[(pos >> np.uint64(3)).astype(np.int64)] >> (pos & np.uint64(7)).astype(np.uint8)) & 1
        return bit.all(axis=1)

    def block_of(self, key: bytes, op_id: int) -> int:
        """The only block that can hold (key, op_id): the last whose first row is not after it."""
        return _last_not_after(self._firsts, key, op_id)

    def encode(self) -> bytes:
        """The partition's bytes, padded to a multiple of 3."""
        arrays = [self.offsets.astype("<u8"), self.lengths.astype("<u4"), self.rows.astype("<u4"), self.crcs.astype("<u4")]
        arrays.append(self.first_ops.astype("<u8"))
        header = _HEADER.pack(MAGIC, VERSION, len(self.first_keys), self.bloom_bits, self.probes)
        return _padded(header, [a.tobytes() for a in arrays], self.first_keys, self.bloom.tobytes())


class _Reader:
    """Little-endian arrays read one after another from an index's bytes; a short read is CorruptDataError."""

    def __init__(self, raw: bytes, at: int, where: str) -> None:
        self.raw, self.at, self.where = raw, at, where

    def take(self, dtype: str, count: int) -> np.ndarray:
        size = np.dtype(dtype).itemsize * count
        if self.at + size > len(self.raw):
            raise CorruptDataError(f"{self.where}: block index is truncated")
        out = np.frombuffer(self.raw, dtype=dtype, count=count, offset=self.at)
        self.at += size
        return out

    def keys(self, lengths: np.ndarray) -> tuple[bytes, ...]:
        data = self.take("u1", int(lengths.sum())).tobytes()
        ends = np.cumsum(lengths)
        return tuple(data[int(e - k) : int(e)] for e, k in zip(ends, lengths, strict=True))


def parse_block_index(data: bytes, where: str, crc32: int, segment_start: int, segment_end: int, rows: int) -> BlockIndex:
    """Decode and check one partition of a segment's index (its base64 text as stored); errors name ``where``."""
    reader, (n, bloom_bits, probes) = _open(data, where, crc32, _HEADER, MAGIC, VERSION)
    offsets = reader.take("<u8", n).astype(np.int64)
    lengths = reader.take("<u4", n).astype(np.int64)
    block_rows = reader.take("<u4", n).astype(np.int64)
    crcs = reader.take("<u4", n).astype(np.uint32)
    first_ops = reader.take("<u8", n).astype(np.uint64)
    first_keys = reader.keys(reader.take("<u4", n).astype(np.int64))
    bloom = reader.take("u1", -(-bloom_bits // 8)).copy()
    # the blocks must tile the segment in order and hold its rows, or a read would trust bytes outside it
    tiles = n > 0 and offsets[0] == segment_start and bool((offsets[1:] == offsets[:-1] + lengths[:-1]).all())
    if not tiles or int(offsets[-1] + lengths[-1]) != segment_end or int(block_rows.sum()) != rows or probes < 1 or bloom_bits < 8:
        raise CorruptDataError(f"{where}: block index does not tile its segment ({n} blocks, {int(block_rows.sum())} rows)")
    index = BlockIndex(offsets, lengths, block_rows, crcs, first_ops, first_keys, bloom, bloom_bits, probes)
    _check_key_order(index._firsts, where)
    return index


@dataclass(frozen=True)
class IndexTop:
    """A segment's top index: per partition, its place in the footer text (relative to the top), crc32, byte range, rows and first key."""

    text_offsets: np.ndarray  # int64, chars after the top's own first char
    text_lengths: np.ndarray  # int64
    crcs: np.ndarray  # uint32
    starts: np.ndarray  # int64, absolute byte offset of the partition's first block
    ends: np.ndarray  # int64, where its last block ends
    rows: np.ndarray  # int64
    first_ops: np.ndarray  # uint64
    first_keys: tuple[bytes, ...]

    @cached_property
    def _firsts(self) -> list[tuple[bytes, int]]:
        return _firsts(self.first_keys, self.first_ops)

    @property
    def nbytes(self) -> int:
        """Memory held, for the cache's byte bound."""
        return 160 * len(self.first_keys) + sum(len(k) for k in self.first_keys) + 200

    def partition_of(self, key: bytes, op_id: int) -> int:
        """The only partition that can hold (key, op_id): the last whose first row is not after it."""
        return _last_not_after(self._firsts, key, op_id)

    def encode(self) -> bytes:
        """The top's bytes, padded to a multiple of 3 like a partition's."""
        arrays = [self.text_offsets.astype("<u4"), self.text_lengths.astype("<u4"), self.crcs.astype("<u4")]
        arrays += [self.starts.astype("<u8"), self.ends.astype("<u8"), self.rows.astype("<u4"), self.first_ops.astype("<u8")]
        header = _TOP_HEADER.pack(TOP_MAGIC, TOP_VERSION, len(self.first_keys), 0)
        return _padded(header, [a.tobytes() for a in arrays], self.first_keys)


def partition(index: BlockIndex, lo: int, hi: int, bloom: np.ndarray, bloom_bits: int) -> BlockIndex:
    """Blocks lo..hi-1 of a segment's block arrays as one partition with its own bloom filter."""
    return BlockIndex(
        index.offsets[lo:hi],
        index.lengths[lo:hi],
        index.rows[lo:hi],
        index.crcs[lo:hi],
        index.first_ops[lo:hi],
        index.first_keys[lo:hi],
        bloom,
        bloom_bits,
    )


def encode_segment_index(blocks: BlockIndex, hashes: np.ndarray, per_partition: int = BLOCKS_PER_PARTITION) -> tuple[bytes, int]:
    """A segment's index as footer text (base64: the top, then its partitions) and the top's length in chars.

    Every piece is padded to a multiple of 3 bytes, so each one's base64 is a slice of the whole text.
    """
    n = len(blocks.first_keys)
    bounds = list(range(0, n, per_partition)) + [n]
    row_starts = np.concatenate([[0], np.cumsum(blocks.rows)])
    texts = []
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        bloom, bits = build_bloom(hashes[row_starts[lo] : row_starts[hi]])
        texts.append(base64.b64encode(partition(blocks, lo, hi, bloom, bits).encode()))

    def top_for(first_char: int) -> IndexTop:
        lengths = np.array([len(t) for t in texts], np.int64)
        return IndexTop(
            first_char + np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64),
            lengths,
            np.array([zlib.crc32(t) for t in texts], np.uint32),
            np.array([int(blocks.offsets[lo]) for lo in bounds[:-1]], np.int64),
            np.array([int(blocks.offsets[hi - 1] + blocks.lengths[hi - 1]) for hi in bounds[1:]], np.int64),
            np.array([int(row_starts[hi] - row_starts[lo]) for lo, hi in zip(bounds, bounds[1:], strict=False)], np.int64),
            blocks.first_ops[bounds[:-1]],
            tuple(blocks.first_keys[lo] for lo in bounds[:-1]),
        )

    top_bytes = len(top_for(0).encode())  # fixed-width fields: the length does not depend on the offsets
    top = base64.b64encode(top_for(top_bytes // 3 * 4).encode())
    assert len(top) == top_bytes // 3 * 4
    return top + b"".join(texts), len(top)


def parse_index_top(data: bytes, where: str, crc32: int, segment_start: int, segment_end: int, rows: int) -> IndexTop:
    """Decode and check a segment's top (its base64 text as stored): partitions must tile the segment in key order."""
    reader, (n, _) = _open(data, where, crc32, _TOP_HEADER, TOP_MAGIC, TOP_VERSION)
    text_offsets = reader.take("<u4", n).astype(np.int64)
    text_lengths = reader.take("<u4", n).astype(np.int64)
    crcs = reader.take("<u4", n).astype(np.uint32)
    starts = reader.take("<u8", n).astype(np.int64)
    ends = reader.take("<u8", n).astype(np.int64)
    part_rows = reader.take("<u4", n).astype(np.int64)
    first_ops = reader.take("<u8", n).astype(np.uint64)
    first_keys = reader.keys(reader.take("<u4", n).astype(np.int64))
    top = IndexTop(text_offsets, text_lengths, crcs, starts, ends, part_rows, first_ops, first_keys)
    tiles = n > 0 and starts[0] == segment_start and bool((starts[1:] == ends[:-1]).all()) and bool((ends > starts).all())
    if not tiles or int(ends[-1]) != segment_end or int(part_rows.sum()) != rows or (text_lengths < 4).any():
        raise CorruptDataError(f"{where}: block index does not tile its segment ({n} partitions, {int(part_rows.sum())} rows)")
    _check_key_order(top._firsts, where)
    return top


def parse_partition(data: bytes, where: str, top: IndexTop, p: int) -> BlockIndex:
    """Partition ``p`` of a segment (its text as stored), checked against what the segment's top says of it."""
    part = parse_block_index(data, where, int(top.crcs[p]), int(top.starts[p]), int(top.ends[p]), int(top.rows[p]))
    if (part.first_keys[0], int(part.first_ops[0])) != (top.first_keys[p], int(top.first_ops[p])):
        raise CorruptDataError(f"{where}: starts with another key than its segment's top says")
    return part


def _open(data: bytes, where: str, crc32: int, header: struct.Struct, magic: bytes, version: int) -> tuple[_Reader, tuple]:
    """Check an index piece's crc32, decode its base64 and header: a reader past the header, and the header's other fields."""
    actual = zlib.crc32(data)
    if actual != crc32:
        raise ChecksumMismatchError(where, f"crc32 {crc32:08x}", f"crc32 {actual:08x}")
    try:
        raw = base64.b64decode(data, validate=True)
        found, found_version, *fields = header.unpack_from(raw, 0)
    except (ValueError, struct.error) as exc:
        raise CorruptDataError(f"{where}: block index does not decode: {exc}") from exc
    if found != magic or found_version != version:
        raise CorruptDataError(f"{where}: block index has magic {found!r} version {found_version}, expected {magic!r} version {version}")
    return _Reader(raw, header.size, where), tuple(fields)


def _check_key_order(firsts: list[tuple[bytes, int]], where: str) -> None:
    if any(a >= b for a, b in zip(firsts, firsts[1:], strict=False)):  # a key would be looked for in the wrong place
        raise CorruptDataError(f"{where}: block index first keys are not in key order")
