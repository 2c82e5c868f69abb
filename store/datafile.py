"""Data files: one Arrow IPC file of small blocks grouped in key-group segments, each with a block index; verified on read."""

from __future__ import annotations

import hashlib
import weakref
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from snapshot import (
    CANONICAL_SCHEMA,
    CHANGELOG_SCHEMA,
    NUM_KEY_GROUPS,
    SnapshotArrowWriter,
    StateVersionMap,
    check_rows,
    leading_bytes,
    read_snapshot,
    sort_for_layout,
)
from snapshot.errors import (
    ChecksumMismatchError,
    CorruptDataError,
    CorruptSnapshotError,
    InvalidArgumentError,
    UnsupportedFormatVersionError,
)
from snapshot.key_index import binary_parts, hash_keys
from snapshot.keys import RAW_SLOT, SEPARATOR
from snapshot.messages import check_message
from store.block_index import (
    BLOCKS_PER_PARTITION,
    FOOTER_KEY,
    BlockIndex,
    IndexTop,
    encode_segment_index,
    parse_index_top,
    parse_partition,
)

KIND_BASE = "base"
KIND_DELTA = "delta"
# how a data file lays out its segments: one Arrow IPC file with one record batch per segment (any Arrow reader gets
# every row), or (files written before it) complete Arrow IPC streams laid end to end
ENCODING_FILE = "arrow-file"
ENCODING_STREAMS = "arrow-streams"

# a segment closes at the first key-group boundary past this size: files over ~128x this get one segment per key group
DEFAULT_SEGMENT_TARGET_BYTES = 64 << 10
# a block (one record batch, the unit a point read fetches) closes at the first row past this size
DEFAULT_BLOCK_TARGET_BYTES = 32 << 10


@dataclass(frozen=True)
class Segment:
    """Consecutive blocks of a data file holding keyed rows of kg_lo..kg_hi, or the operator-state rows.

    ``index``: (offset, length, crc32, total length) of the segment's block index in the file's footer: its top, then its
    partitions (None: a file written before block indexes, one record batch or stream per segment).
    """

    offset: int
    length: int
    rows: int
    crc32: int
    kg_lo: int = 0
    kg_hi: int = NUM_KEY_GROUPS - 1
    operator: bool = False
    index: tuple[int, int, int, int] | None = None

    def overlaps(self, lo: int, hi: int) -> bool:
        """Whether this keyed segment holds key groups in lo..hi (operator segments never do)."""
        return not self.operator and self.kg_lo <= hi and lo <= self.kg_hi


@dataclass(frozen=True)
class StateStats:
    """The rows of one state slot of an operator in a data file: its name, kind (keyed or operator state), rows, bytes."""

    slot: str
    kind: str  # "keyed", "operator" or "raw" (a legacy key without '|')
    rows: int
    bytes: int


@dataclass(frozen=True)
class OperatorStats:
    """The rows of one operator in a data file: rows, key plus value bytes, and per slot where they were counted (else ())."""

    op_id: int
    rows: int
    bytes: int
    states: tuple[StateStats, ...] = ()


@dataclass(frozen=True)
class DataFile:
    """A data file as its manifest entry describes it; path is relative to the job prefix."""

    path: str
    kind: str
    kg_lo: int
    kg_hi: int
    rows: int
    size: int
    sha256: str
    segments: tuple[Segment, ...]
    as_of: int | None = None  # the checkpoint whose state the rows are (orders operator-state layers across parts); None: legacy
    encoding: str = ENCODING_STREAMS
    # rows and bytes per operator (and per state slot, where counted); None: a file written before manifest version 4
    operators: tuple[OperatorStats, ...] | None = None

    @property
    def changelog(self) -> bool:
        """Delta layers keep row kinds (so erases survive); bases are canonical."""
        return self.kind == KIND_DELTA


@dataclass(frozen=True)
class EncodedFile:
    """The bytes of a new data file (in memory, or spooled to a local file) and what its manifest entry will say."""

    data: bytes  # b"" when spooled
    rows: int
    sha256: str
    segments: tuple[Segment, ...]
    encoding: str = ENCODING_FILE
    spooled: Path | None = None  # the local file holding the bytes (removed when this object goes)
    spooled_size: int = 0
    operators: tuple[OperatorStats, ...] = ()

    @property
    def size(self) -> int:
        """Bytes of the file."""
        return self.spooled_size if self.spooled is not None else len(self.data)

    def entry(self, path: str, kind: str, kg_lo: int, kg_hi: int, as_of: int | None = None) -> DataFile:
        """The manifest entry for these bytes stored at ``path`` (as_of: the checkpoint whose state they are)."""
        return DataFile(path, kind, kg_lo, kg_hi, self.rows, self.size, self.sha256, self.segments, as_of, self.encoding, self.operators)


def _spans(lead: np.ndarray, row_end_bytes: np.ndarray, target: int) -> list[tuple[int, int, int, int]]:
    """(row_start, row_end, kg_lo, kg_hi) for the keyed rows (sorted, leading byte < 128); row_end_bytes[r]: bytes of rows < r."""
    keyed = int(np.searchsorted(lead, NUM_KEY_GROUPS, side="left"))
    if keyed == 0:
        return []
    kg_end_row = np.searchsorted(lead[:keyed], np.arange(NUM_KEY_GROUPS), side="right")
    kg_start_row = np.concatenate([[0], kg_end_row[:-1]])
    per_kg_bytes = row_end_bytes[kg_end_row] - row_end_bytes[kg_start_row]
    spans = []
    start_row, span_lo, acc = 0, int(lead[0]), 0.0
    last_kg = int(lead[keyed - 1])
    for kg in range(span_lo, last_kg + 1):  # a loop over key groups (at most 128), never over rows
        acc += per_kg_bytes[kg]
        if acc >= target or kg == last_kg:
            end_row = int(kg_end_row[kg])
            if end_row > start_row:
                spans.append((start_row, end_row, span_lo, kg))
            start_row, span_lo, acc = end_row, kg + 1, 0.0
    return spans


def _block_starts(row_end_bytes: np.ndarray, start: int, end: int, target: int) -> np.ndarray:
    """First row of every block of rows start..end: a block closes at the first row that takes it past ``target`` bytes."""
    cum = row_end_bytes[start + 1 : end + 1] - row_end_bytes[start]  # bytes of rows start..r, for each r
    closes = np.searchsorted(cum, np.arange(target, cum[-1], target), side="left") + 1  # row after each crossing
    return np.unique(np.concatenate([[0], closes[closes < end - start]])).astype(np.int64) + start


def _row_end_bytes(keys: pa.Array, values: pa.Array) -> np.ndarray:
    """Bytes of rows 0..r-1 for every r in 0..n (key and value bytes plus 9 of fixed columns), from the arrays' offsets."""
    key_offsets, _ = binary_parts(keys)
    value_offsets, _ = binary_parts(values)
    return (key_offsets - key_offsets[0]) + (value_offsets - value_offsets[0]) + 9 * np.arange(len(keys) + 1, dtype=np.int64)


def _schema_prefix_bytes(schema: pa.Schema) -> int:
    """Bytes an Arrow IPC file writer puts before its first record batch: the magic, padded, and the schema message."""
    return 8 + schema.serialize().size


def _write_file(
    schema: pa.Schema, batches: list[pa.RecordBatch], metadata: dict[str, bytes] | None, body_end: int, spool: Path | None
) -> tuple[bytes, int, bytes, str]:
    """The Arrow IPC file of these batches: (its bytes or b"" when written to ``spool``, its size, its footer, its sha256).

    In memory it is written straight into one buffer sized up front (no growing copy, no copy out); spooled, it never
    is in memory at all.
    """
    if spool is not None:
        with pa.OSFile(str(spool), "wb") as sink, ipc.new_file(sink, schema, metadata=metadata) as out:
            for batch in batches:
                out.write_batch(batch)
        digest = hashlib.sha256()
        with open(spool, "rb") as fh:
            while chunk := fh.read(1 << 20):
                digest.update(chunk)
            size = fh.tell()
            fh.seek(body_end)
            footer = fh.read()
        return b"", size, footer, digest.hexdigest()
    # what the footer holds: the schema again, a 24-byte entry per batch, the metadata text, and flatbuffer slack
    text_bytes = sum(len(v) for v in (metadata or {}).values())
    room = body_end + _schema_prefix_bytes(schema) + 32 * len(batches) + text_bytes + 4096
    data = bytearray(room)
    target = pa.py_buffer(data)
    sink = pa.FixedSizeBufferWriter(target)
    with ipc.new_file(sink, schema, metadata=metadata) as out:
        for batch in batches:
            out.write_batch(batch)
        if batches and sink.tell() != body_end:
            raise AssertionError(f"the file writer put {sink.tell()} bytes before its footer, expected {body_end}")  # never
    size = sink.tell()
    del out, sink, target  # no view may remain on the buffer before it is cut to size
    del data[size:]
    # a bytearray, typed as the bytes it stands for: every ObjectStore writes any bytes-like object, and copying it out
    # would hold the file twice
    return cast(bytes, data), size, bytes(data[body_end:]), hashlib.sha256(data).hexdigest()


def encode_datafile(
    table: pa.Table,
    changelog: bool,
    state_versions: StateVersionMap | None = None,
    target_segment_bytes: int = DEFAULT_SEGMENT_TARGET_BYTES,
    target_block_bytes: int = DEFAULT_BLOCK_TARGET_BYTES,
    spool: Path | None = None,
    blocks_per_partition: int = BLOCKS_PER_PARTITION,
    count_states: bool = False,
) -> EncodedFile:
    """Lay ``table`` out as one Arrow IPC file (sorted by key) of small blocks grouped in segments, and checksum it.

    Every block is one record batch, so a ranged read decodes it alone (with the schema every file of its kind shares),
    and a segment is consecutive blocks of whole key groups. Each segment's block index (block byte ranges, crc32s,
    first keys, a bloom filter of its keys) goes in the file footer's metadata, so a point read fetches it and then
    only the block that may hold its key. The whole file opened by any Arrow reader yields every row. An empty table
    gives a valid file with zero segments. ``spool``: write the file there (a local path) instead of into memory.
    Rows and bytes per operator are always counted (the manifest's anatomy); ``count_states`` counts them per state slot
    too (it decodes every key: bases and savepoints pay it, a commit's delta does not).
    """
    if target_segment_bytes < 1 or target_block_bytes < 1:
        raise InvalidArgumentError(f"segment and block targets ({target_segment_bytes}, {target_block_bytes} bytes) must be positive")
    table = sort_for_layout(table).combine_chunks()
    writer = SnapshotArrowWriter(state_versions, changelog=changelog)
    n = table.num_rows
    segments: list[Segment] = []
    indexes: list[tuple[bytes, int]] = []
    batches: list[pa.RecordBatch] = []
    at = _schema_prefix_bytes(writer.schema)  # where the next block starts
    operators: tuple[OperatorStats, ...] = ()
    if n:
        whole = writer.record_batch(table)
        del table  # the batch holds the same buffers
        keys = whole.column("key_bytes")
        lead = leading_bytes(keys)
        row_end_bytes = _row_end_bytes(keys, whole.column("value_bytes"))
        spans = [(s, e, lo, hi, False) for s, e, lo, hi in _spans(lead, row_end_bytes, target_segment_bytes)]
        op_start = int(np.searchsorted(lead, NUM_KEY_GROUPS, side="left"))
        if op_start < n:
            spans.append((op_start, n, 0, NUM_KEY_GROUPS - 1, True))
        ops = whole.column("op_id").to_numpy(zero_copy_only=False)
        operators = operator_stats(ops, np.diff(row_end_bytes) - 9, keys, lead, count_states)  # key and value bytes
        for start, end, lo, hi, is_op in spans:
            starts = _block_starts(row_end_bytes, start, end, target_block_bytes)
            stops = np.append(starts[1:], end)
            lengths, crcs, seg_crc, seg_start = [], [], 0, at
            for b0, b1 in zip(starts.tolist(), stops.tolist(), strict=True):
                batch = whole.slice(b0, b1 - b0)
                message = batch.serialize()  # the bytes the file writer will append for it: lengths and crc32 known up front
                lengths.append(message.size)
                crcs.append(zlib.crc32(message))
                seg_crc = zlib.crc32(message, seg_crc)
                batches.append(batch)
            length = sum(lengths)
            offsets = np.cumsum([seg_start, *lengths[:-1]], dtype=np.int64)
            at += length
            blocks = BlockIndex(
                offsets,
                np.asarray(lengths, np.int64),
                (stops - starts).astype(np.int64),
                np.asarray(crcs, np.uint32),
                ops[starts],
                tuple(keys.take(pa.array(starts)).to_pylist()),
                np.zeros(8, np.uint8),
                64,
            )
            hashes = hash_keys(ops[start:end], keys.slice(start, end - start))  # per segment: small temporaries
            indexes.append(encode_segment_index(blocks, hashes, blocks_per_partition))
            segments.append(Segment(seg_start, length, end - start, seg_crc, lo, hi, is_op))
    text = b"".join(piece for piece, _ in indexes)
    data, size, footer, sha = _write_file(writer.schema, batches, {FOOTER_KEY: text} if segments else None, at, spool)
    if segments:
        # the footer stores the text contiguously (a flatbuffer string): find it once, each segment's index is a slice of it
        found = footer.rfind(text)
        text_at = at + found
        if found < 4 or int.from_bytes(footer[found - 4 : found], "little") != len(text):
            raise AssertionError("the block index is not where the footer should hold it")
        at_char = 0
        for i, (seg, (piece, top)) in enumerate(zip(segments, indexes, strict=True)):
            total = len(piece)
            crc = zlib.crc32(piece[:top])
            segments[i] = Segment(
                seg.offset, seg.length, seg.rows, seg.crc32, seg.kg_lo, seg.kg_hi, seg.operator, (text_at + at_char, top, crc, total)
            )
            at_char += total
    encoded = EncodedFile(data, n, sha, tuple(segments), spooled=spool, spooled_size=size if spool is not None else 0, operators=operators)
    if spool is not None:
        weakref.finalize(encoded, _remove, spool)  # the spool goes with the object, whatever path the caller took
    return encoded


def operator_stats(
    ops: np.ndarray, row_bytes: np.ndarray, keys: pa.Array, lead: np.ndarray, count_states: bool
) -> tuple[OperatorStats, ...]:
    """Rows and bytes per operator (sorted by op_id), and per state slot when ``count_states``, vectorised (group-bys)."""
    columns: dict[str, object] = {"op": pa.array(ops, pa.uint64()), "b": pa.array(row_bytes, pa.int64())}
    if count_states:
        parts = pc.split_pattern(pc.binary_slice(keys, 1, (1 << 31) - 1), pattern=SEPARATOR, max_splits=1)
        raw = pc.less(pc.list_value_length(parts), 2)  # no '|' after the prefix byte: a legacy raw key
        columns["slot"] = pc.if_else(raw, pa.scalar(RAW_SLOT.encode(), pa.binary()), pc.list_element(parts, 0))
        columns["kind"] = pc.if_else(raw, "raw", pc.if_else(pa.array(lead < NUM_KEY_GROUPS), "keyed", "operator"))
    table = pa.table(columns)
    per_op = table.group_by("op").aggregate([("b", "sum"), ("b", "count")]).sort_by("op").to_pydict()
    states: dict[int, list[StateStats]] = {}
    if count_states:
        per_slot = table.group_by(["op", "slot", "kind"]).aggregate([("b", "sum"), ("b", "count")])
        per_slot = per_slot.sort_by([("op", "ascending"), ("slot", "ascending"), ("kind", "ascending")]).to_pydict()
        for op, slot, kind, b, count in zip(
            per_slot["op"], per_slot["slot"], per_slot["kind"], per_slot["b_sum"], per_slot["b_count"], strict=True
        ):
            states.setdefault(op, []).append(StateStats(slot.decode("utf-8", errors="backslashreplace"), kind, count, b))
    return tuple(
        OperatorStats(op, count, b, tuple(states.get(op, ())))
        for op, b, count in zip(per_op["op"], per_op["b_sum"], per_op["b_count"], strict=True)
    )


def operator_state_sources(entries: list[DataFile]) -> tuple[DataFile | None, list[DataFile]]:
    """Of a checkpoint's dated files (each once, in part order), those whose operator state a reader takes: the newest
    base (each base holds the whole operator view as of its checkpoint, so the first of that checkpoint serves) and the
    deltas after it that hold some, ordered by (as_of, kg_lo). Older bases and the other parts' copies only repeat it.
    """
    bases = [e for e in entries if not e.changelog]
    start = max((_dated(e) for e in bases), default=None)
    newest = next((e for e in bases if e.as_of == start), None)
    deltas = [e for e in entries if e.changelog and (start is None or _dated(e) > start) and any(s.operator for s in e.segments)]
    return newest, sorted(deltas, key=lambda e: (_dated(e), e.kg_lo))


def _dated(entry: DataFile) -> int:
    """The as_of of a file written since as_of exists (operator_state_sources is given only those)."""
    assert entry.as_of is not None, entry.path
    return entry.as_of


def _remove(path: Path) -> None:
    path.unlink(missing_ok=True)


def verify_file(entry: DataFile, data: bytes) -> None:
    """Whole-file check: size and sha256 from the manifest; ChecksumMismatchError naming the file."""
    if len(data) != entry.size:
        raise ChecksumMismatchError(entry.path, f"size {entry.size}", f"size {len(data)}")
    actual = hashlib.sha256(data).hexdigest()
    if actual != entry.sha256:
        raise ChecksumMismatchError(entry.path, f"sha256 {entry.sha256}", f"sha256 {actual}")


def verify_segment(entry: DataFile, segment: Segment, data: bytes) -> None:
    """Ranged-read check: length and crc32 of one segment; ChecksumMismatchError naming the file."""
    where = f"{entry.path} (segment at offset {segment.offset})"
    if len(data) != segment.length:
        raise ChecksumMismatchError(where, f"length {segment.length}", f"length {len(data)}")
    actual = zlib.crc32(data)
    if actual != segment.crc32:
        raise ChecksumMismatchError(where, f"crc32 {segment.crc32:08x}", f"crc32 {actual:08x}")


def decode_segment(entry: DataFile, segment: Segment, data: bytes | pa.Buffer) -> pa.Table:
    """The rows of one verified segment (changelog schema for deltas, canonical for bases), checked as the format reader checks."""
    if entry.encoding == ENCODING_FILE:
        return decode_blocks(entry, segment.offset, data, segment.rows)
    try:
        snap = read_snapshot(data)
    except (CorruptSnapshotError, UnsupportedFormatVersionError) as exc:
        raise CorruptDataError(f"data file {entry.path}: segment at offset {segment.offset} does not decode: {exc}") from exc
    if snap.is_changelog != entry.changelog or snap.table.num_rows != segment.rows:
        raise CorruptDataError(
            f"data file {entry.path}: segment at offset {segment.offset} holds {snap.table.num_rows} "
            f"{'changelog' if snap.is_changelog else 'canonical'} rows, manifest says {segment.rows} {entry.kind} rows"
        )
    return snap.table.replace_schema_metadata(None)


def decode_blocks(entry: DataFile, offset: int, data: bytes | pa.Buffer, rows: int) -> pa.Table:
    """The rows of consecutive verified blocks (record-batch messages) of an Arrow-file data file starting at ``offset``."""
    schema = CHANGELOG_SCHEMA if entry.changelog else CANONICAL_SCHEMA
    buffer = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
    batches = []
    try:
        reader = pa.BufferReader(buffer)
        while reader.tell() < buffer.size:
            message = ipc.read_message(reader)
            check_message(message, 0)  # a crafted file in the store must not decompress either
            batch = ipc.read_record_batch(message, schema)
            batch.validate()
            batches.append(batch)
        got = sum(b.num_rows for b in batches)
        if got != rows:
            raise CorruptDataError(f"data file {entry.path}: segment at offset {offset} holds {got} rows, manifest says {rows}")
        table = pa.Table.from_batches(batches, schema)  # zero-copy: the blocks' columns point into the bytes read
        check_rows(table, entry.changelog)
    except (pa.ArrowException, OSError, ValueError, CorruptSnapshotError) as exc:
        raise CorruptDataError(f"data file {entry.path}: segment at offset {offset} does not decode: {exc}") from exc
    return table


def verify_block(entry: DataFile, index: BlockIndex, block: int, data: bytes | pa.Buffer) -> None:
    """Ranged-read check of one block: its length and crc32 from the segment's block index; errors name the file."""
    offset = int(index.offsets[block])
    where = f"{entry.path} (block at offset {offset})"
    if len(data) != int(index.lengths[block]):
        raise ChecksumMismatchError(where, f"length {int(index.lengths[block])}", f"length {len(data)}")
    actual = zlib.crc32(data)
    if actual != int(index.crcs[block]):
        raise ChecksumMismatchError(where, f"crc32 {int(index.crcs[block]):08x}", f"crc32 {actual:08x}")


def segment_index(entry: DataFile, segment: Segment, data: bytes) -> tuple[IndexTop, list[BlockIndex]]:
    """A segment's top and partitions, parsed and checked, from the whole file's bytes; errors name the file and the part."""
    assert segment.index is not None
    offset, top_len, crc, _ = segment.index
    where = f"{entry.path} (block index of the segment at offset {segment.offset})"
    top = parse_index_top(data[offset : offset + top_len], where, crc, segment.offset, segment.offset + segment.length, segment.rows)
    parts = []
    for p in range(len(top.first_keys)):
        at = offset + int(top.text_offsets[p])
        part_where = f"{where}, partition {p}"
        parts.append(parse_partition(data[at : at + int(top.text_lengths[p])], part_where, top, p))
    return top, parts


def verify_segment_index(entry: DataFile, segment: Segment, data: bytes) -> int:
    """Check a segment's whole block index against the file's bytes: top, partitions, every block (crc32, first row, every
    key in its partition's bloom filter); returns the blocks checked. Errors name the file and the part that is wrong.
    """
    _, parts = segment_index(entry, segment, data)
    checked = 0
    for p, part in enumerate(parts):
        where = f"{entry.path} (block index of the segment at offset {segment.offset}), partition {p}"
        for b in range(len(part.first_keys)):
            block = data[int(part.offsets[b]) : int(part.offsets[b] + part.lengths[b])]
            verify_block(entry, part, b, block)
            rows = decode_blocks(entry, int(part.offsets[b]), block, int(part.rows[b]))
            part.check_first_row(b, rows.column("key_bytes")[0].as_py(), rows.column("op_id")[0].as_py(), where)
            if not part.may_hold(hash_keys(rows.column("op_id").to_numpy(), rows.column("key_bytes"))).all():
                raise CorruptDataError(f"{where}: its bloom filter lacks keys of block {b}")  # they would read as absent
            checked += 1
    return checked
