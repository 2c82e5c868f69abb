"""Data files: segments of Arrow IPC streams laid end to end, one per key-group span, verified on read."""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass

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
)
from snapshot.errors import ChecksumMismatchError, CorruptDataError, CorruptSnapshotError, UnsupportedFormatVersionError
from snapshot.messages import check_message

KIND_BASE = "base"
KIND_DELTA = "delta"
# how a data file lays out its segments: one Arrow IPC file with one record batch per segment (any Arrow reader gets
# every row), or (files written before it) complete Arrow IPC streams laid end to end
ENCODING_FILE = "arrow-file"
ENCODING_STREAMS = "arrow-streams"

# a segment closes at the first key-group boundary past this size: files over ~128x this get one segment per key group
DEFAULT_SEGMENT_TARGET_BYTES = 64 << 10


@dataclass(frozen=True)
class Segment:
    """One complete Arrow IPC stream inside a data file: keyed rows of kg_lo..kg_hi, or the operator-state rows."""

    offset: int
    length: int
    rows: int
    crc32: int
    kg_lo: int = 0
    kg_hi: int = NUM_KEY_GROUPS - 1
    operator: bool = False

    def overlaps(self, lo: int, hi: int) -> bool:
        """Whether this keyed segment holds key groups in lo..hi (operator segments never do)."""
        return not self.operator and self.kg_lo <= hi and lo <= self.kg_hi


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

    @property
    def changelog(self) -> bool:
        """Delta layers keep row kinds (so erases survive); bases are canonical."""
        return self.kind == KIND_DELTA


@dataclass(frozen=True)
class EncodedFile:
    """The bytes of a new data file and what its manifest entry will say (path assigned by the caller)."""

    data: bytes
    rows: int
    sha256: str
    segments: tuple[Segment, ...]
    encoding: str = ENCODING_FILE

    def entry(self, path: str, kind: str, kg_lo: int, kg_hi: int, as_of: int | None = None) -> DataFile:
        """The manifest entry for these bytes stored at ``path`` (as_of: the checkpoint whose state they are)."""
        return DataFile(path, kind, kg_lo, kg_hi, self.rows, len(self.data), self.sha256, self.segments, as_of, self.encoding)


def sort_for_layout(table: pa.Table) -> pa.Table:
    """Rows sorted by key bytes then op_id: keyed rows by key group first, operator-state rows (>= 0x80) last."""
    if table.num_rows <= 1:
        return table
    idx = pc.sort_indices(table, sort_keys=[("key_bytes", "ascending"), ("op_id", "ascending")])
    return table.take(idx)


def _spans(lead: np.ndarray, row_bytes: np.ndarray, target: int) -> list[tuple[int, int, int, int]]:
    """(row_start, row_end, kg_lo, kg_hi) for the keyed rows (sorted, leading byte < 128)."""
    keyed = int(np.searchsorted(lead, NUM_KEY_GROUPS, side="left"))
    if keyed == 0:
        return []
    per_kg_bytes = np.bincount(lead[:keyed], weights=row_bytes[:keyed], minlength=NUM_KEY_GROUPS)
    kg_end_row = np.searchsorted(lead[:keyed], np.arange(NUM_KEY_GROUPS), side="right")
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


def encode_datafile(
    table: pa.Table,
    changelog: bool,
    state_versions: StateVersionMap | None = None,
    target_segment_bytes: int = DEFAULT_SEGMENT_TARGET_BYTES,
) -> EncodedFile:
    """Lay ``table`` out as one Arrow IPC file, one record batch per segment (sorted by key), and checksum it.

    A segment is exactly one batch's encapsulated message, so a ranged read decodes it alone (with the schema every
    file of its kind shares), while the whole file opened by any Arrow reader yields every row. An empty table gives
    a valid file with zero segments.
    """
    table = sort_for_layout(table).combine_chunks()
    writer = SnapshotArrowWriter(state_versions, changelog=changelog)
    n = table.num_rows
    segments: list[Segment] = []
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, writer.schema) as out:
        if n:
            keys = table.column("key_bytes")
            lead = leading_bytes(keys)
            row_bytes = pc.binary_length(keys).to_numpy(zero_copy_only=False).astype(np.float64)
            row_bytes += pc.binary_length(table.column("value_bytes")).to_numpy(zero_copy_only=False) + 9
            spans = [(s, e, lo, hi, False) for s, e, lo, hi in _spans(lead, row_bytes, target_segment_bytes)]
            op_start = int(np.searchsorted(lead, NUM_KEY_GROUPS, side="left"))
            if op_start < n:
                spans.append((op_start, n, 0, NUM_KEY_GROUPS - 1, True))
            for start, end, lo, hi, is_op in spans:
                batch = writer.record_batch(table.slice(start, end - start))
                out.write_batch(batch)
                stop = sink.tell()
                length = batch.serialize().size  # the message the writer just appended (the first also follows the file header)
                segments.append(Segment(stop - length, length, end - start, 0, lo, hi, is_op))
    data = sink.getvalue().to_pybytes()
    view = memoryview(data)
    segments = [
        Segment(g.offset, g.length, g.rows, zlib.crc32(view[g.offset : g.offset + g.length]), g.kg_lo, g.kg_hi, g.operator)
        for g in segments
    ]
    return EncodedFile(data, n, hashlib.sha256(data).hexdigest(), tuple(segments))


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
        schema = CHANGELOG_SCHEMA if entry.changelog else CANONICAL_SCHEMA
        try:
            buffer = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
            check_message(ipc.read_message(buffer), 0)  # a crafted file in the store must not decompress either
            batch = ipc.read_record_batch(buffer, schema)
            batch.validate()
            check_rows(batch, entry.changelog)
        except (pa.ArrowException, OSError, ValueError, CorruptSnapshotError) as exc:
            raise CorruptDataError(f"data file {entry.path}: segment at offset {segment.offset} does not decode: {exc}") from exc
        if batch.num_rows != segment.rows:
            raise CorruptDataError(
                f"data file {entry.path}: segment at offset {segment.offset} holds {batch.num_rows} rows, manifest says {segment.rows}"
            )
        return pa.Table.from_batches([batch])
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
