"""The snapshot stream: schemas, the one writer and the reference reader."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from snapshot.errors import CorruptSnapshotError, InvalidArgumentError, UnsupportedFormatVersionError
from snapshot.messages import DEFAULT_LIMITS, ReadLimits, check_stream
from snapshot.versions import StateVersionMap

FORMAT_VERSION = 1
FORMAT_VERSION_KEY = b"clink.format_version"
STATE_VERSIONS_KEY = b"clink.state_versions"
# op_id -> operator uid as JSON, added by exporters that know the names (an additive key: readers may ignore it)
OPERATORS_KEY = b"clink.operators"

ROW_MATERIALISATION = 0
ROW_PUT = 1
ROW_ERASE = 2
# a materialisation handle (snapshot/handles.py): rows stored elsewhere; outside 0..2, so a reader that does not know handles fails
ROW_HANDLE = 3

CANONICAL_FIELDS = [
    pa.field("op_id", pa.uint64(), nullable=False),
    pa.field("key_bytes", pa.binary(), nullable=False),
    pa.field("value_bytes", pa.binary(), nullable=False),
]
CANONICAL_SCHEMA = pa.schema(CANONICAL_FIELDS)
CHANGELOG_SCHEMA = pa.schema([pa.field("row_kind", pa.uint8(), nullable=False), *CANONICAL_FIELDS])

Bytesish: TypeAlias = bytes | bytearray | memoryview | pa.Buffer
# keys and values as bytes or str (encoded as UTF-8); one union member per key type, since a Mapping is invariant in its keys
ExtraMetadata: TypeAlias = Mapping[bytes, bytes | str] | Mapping[str, bytes | str] | Mapping[bytes | str, bytes | str]


def operators_metadata(operators: Mapping[int, str | None]) -> dict[bytes, bytes]:
    """The OPERATORS_KEY entry for the named ones of ``operators`` (op_id -> uid); empty when none is named."""
    named = {str(op_id): uid for op_id, uid in sorted(operators.items()) if uid}
    return {OPERATORS_KEY: json.dumps(named, separators=(",", ":")).encode()} if named else {}


def operators_from_metadata(metadata: Mapping[bytes, bytes]) -> dict[int, str]:
    """op_id -> uid from an OPERATORS_KEY entry; empty when absent or unreadable (the names are a courtesy, never needed)."""
    try:
        named = json.loads(metadata.get(OPERATORS_KEY, b"{}"))
        return {int(op_id): str(uid) for op_id, uid in named.items() if uid} if isinstance(named, dict) else {}
    except (ValueError, TypeError, AttributeError):
        return {}


def empty_table(changelog: bool = False) -> pa.Table:
    """A zero-row table of the canonical or changelog schema."""
    return (CHANGELOG_SCHEMA if changelog else CANONICAL_SCHEMA).empty_table()


def _metadata(state_versions: StateVersionMap | None, extra: ExtraMetadata | None) -> dict[bytes, bytes]:
    meta: dict[bytes, bytes] = {}
    for key, value in (extra or {}).items():
        k = key.encode() if isinstance(key, str) else bytes(key)
        meta[k] = value.encode() if isinstance(value, str) else bytes(value)
    meta.pop(STATE_VERSIONS_KEY, None)
    meta[FORMAT_VERSION_KEY] = str(FORMAT_VERSION).encode()
    if state_versions:
        meta[STATE_VERSIONS_KEY] = state_versions.pack().encode()
    return meta


def conform(table: pa.Table, changelog: bool = False) -> pa.Table:
    """Cast a table to the exact schema (names, types, non-null); refuse nulls and missing columns."""
    schema = CHANGELOG_SCHEMA if changelog else CANONICAL_SCHEMA
    if not changelog and "row_kind" in table.column_names:
        # dropping row_kind would turn erases into puts: make the caller say which variant it means
        raise InvalidArgumentError("table has a row_kind column: write it with changelog=True, or canonical_from_changelog() it first")
    columns = []
    for f in schema:
        if f.name not in table.column_names:
            raise InvalidArgumentError(f"column {f.name} missing (have {table.column_names})")
        col = table.column(f.name)
        if col.null_count:
            raise InvalidArgumentError(f"column {f.name} has {col.null_count} null(s); snapshot columns are non-nullable")
        if col.type != f.type:
            try:
                col = col.cast(f.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise InvalidArgumentError(f"column {f.name} must be {f.type}, got {col.type}: {exc}") from exc
        columns.append(col)
    return pa.Table.from_arrays(columns, schema=schema)


class SnapshotArrowWriter:
    """The one writer: canonical or changelog variant, one RecordBatch, version stamped."""

    def __init__(
        self,
        state_versions: StateVersionMap | None = None,
        extra_metadata: ExtraMetadata | None = None,
        changelog: bool = False,
    ) -> None:
        self.changelog = changelog
        self.metadata = _metadata(state_versions, extra_metadata)
        self.schema = (CHANGELOG_SCHEMA if changelog else CANONICAL_SCHEMA).with_metadata(self.metadata)

    def record_batch(self, table: pa.Table) -> pa.RecordBatch:
        """The single RecordBatch this writer emits for ``table``."""
        table = conform(table, self.changelog).combine_chunks()
        arrays = [c.chunk(0) if c.num_chunks else pa.array([], type=c.type) for c in table.columns]
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def write_to(self, sink: pa.NativeFile | object, table: pa.Table) -> None:
        """Write the stream to a sink (a pyarrow NativeFile or a Python file object)."""
        batch = self.record_batch(table)
        with ipc.new_stream(sink, self.schema) as writer:
            writer.write_batch(batch)

    def write(self, table: pa.Table) -> bytes:
        """The stream as bytes."""
        return self.write_buffer(table).to_pybytes()

    def write_buffer(self, table: pa.Table) -> pa.Buffer:
        """The stream as a pyarrow Buffer (no extra copy)."""
        return self.batch_buffer(self.record_batch(table))

    def batch_buffer(self, batch: pa.RecordBatch) -> pa.Buffer:
        """The stream of one batch already shaped by record_batch, in one exactly sized pyarrow Buffer."""
        # measure first, then write into an exactly sized buffer: no regrowth copies of a large stream
        mock = pa.MockOutputStream()
        with ipc.new_stream(mock, self.schema) as writer:
            writer.write_batch(batch)
        buffer = pa.allocate_buffer(mock.size())
        with ipc.new_stream(pa.FixedSizeBufferWriter(buffer), self.schema) as writer:
            writer.write_batch(batch)
        return buffer


def write_snapshot(
    table: pa.Table,
    state_versions: StateVersionMap | None = None,
    extra_metadata: ExtraMetadata | None = None,
    changelog: bool = False,
) -> bytes:
    """Shorthand for ``SnapshotArrowWriter(...).write(table)``."""
    return SnapshotArrowWriter(state_versions, extra_metadata, changelog).write(table)


@dataclass(frozen=True)
class Snapshot:
    """A snapshot as read: its table and what its metadata says."""

    table: pa.Table
    format_version: int
    state_versions: StateVersionMap
    metadata: dict[bytes, bytes] = field(default_factory=dict)
    is_changelog: bool = False
    # the table is canonical, replayed from a changelog (read_canonical): what the input was, for tools that say so
    replayed: bool = False

    @property
    def extra_metadata(self) -> dict[bytes, bytes]:
        """Metadata keys other than the format's own (kept by merge)."""
        return {k: v for k, v in self.metadata.items() if k not in (FORMAT_VERSION_KEY, STATE_VERSIONS_KEY)}


def parse_format_version(metadata: Mapping[bytes, bytes]) -> int:
    """The declared format version (absent reads as 1); above 1 raises."""
    raw = metadata.get(FORMAT_VERSION_KEY)
    if raw is None:
        return FORMAT_VERSION
    text = raw.decode("utf-8", errors="replace")
    if not text.isascii() or not text.isdigit():
        raise CorruptSnapshotError(f"clink.format_version {text!r} is not an integer")
    version = int(text)
    if version > FORMAT_VERSION:
        raise UnsupportedFormatVersionError(
            f"snapshot format version {version} is newer than the highest this reader knows ({FORMAT_VERSION}); upgrade clink"
        )
    if version < 1:
        raise CorruptSnapshotError(f"clink.format_version {version} is not a valid version")
    return version


def _check_schema(schema: pa.Schema) -> bool:
    if schema.equals(CANONICAL_SCHEMA):  # fast path: exactly what the writer emits
        return False
    names = schema.names
    is_changelog = bool(names) and names[0] == "row_kind"
    expected = CHANGELOG_SCHEMA if is_changelog else CANONICAL_SCHEMA
    for f in expected:
        if f.name not in names:
            raise CorruptSnapshotError(f"{f.name} column missing (columns are {names})")
    if names != expected.names:
        raise CorruptSnapshotError(f"columns must be {expected.names}, got {names}")
    for f in expected:
        got = schema.field(f.name).type
        if got != f.type:
            raise CorruptSnapshotError(f"{f.name} must be {f.type}, got {got}")
    return is_changelog


END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"
LEGACY_END_OF_STREAM = b"\x00\x00\x00\x00"  # streams written before Arrow 0.15 have no continuation marker


def _as_buffer(data: Bytesish | pa.NativeFile) -> pa.Buffer:
    """The whole stream as one buffer (zero-copy for bytes, buffers and memory maps)."""
    try:
        if isinstance(data, pa.NativeFile):
            return data.read_buffer()
        return data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
    except (pa.ArrowException, OSError, ValueError, TypeError) as exc:
        raise CorruptSnapshotError(f"not an Arrow IPC stream: {exc}") from exc


def _open_reader(source: pa.BufferReader) -> ipc.RecordBatchStreamReader:
    try:
        return ipc.open_stream(source)
    except (pa.ArrowException, OSError, ValueError, TypeError) as exc:
        if _is_arrow_file(source):
            raise CorruptSnapshotError("this is an Arrow IPC file (a stored data file?), not an Arrow IPC stream") from None
        raise CorruptSnapshotError(f"not an Arrow IPC stream: {exc}") from exc


ARROW_FILE_MAGIC = b"ARROW1"


def _is_arrow_file(source: pa.BufferReader | pa.Buffer) -> bool:
    buffer = source if isinstance(source, pa.Buffer) else None
    if buffer is None:
        source.seek(0)
        head = source.read(len(ARROW_FILE_MAGIC))
    else:
        head = buffer.slice(0, min(len(ARROW_FILE_MAGIC), buffer.size)).to_pybytes()
    return head == ARROW_FILE_MAGIC


def _check_end_of_stream(buffer: pa.Buffer, consumed: int) -> None:
    """Refuse a stream cut before its end-of-stream marker, or with bytes after it (Arrow would read a prefix silently)."""
    legacy = buffer.size >= 4 and buffer.slice(0, 4).to_pybytes() != END_OF_STREAM[:4]
    marker = LEGACY_END_OF_STREAM if legacy else END_OF_STREAM
    if consumed < len(marker) or buffer.slice(consumed - len(marker), len(marker)).to_pybytes() != marker:
        raise CorruptSnapshotError("stream does not end with the Arrow end-of-stream marker: it is truncated")
    if consumed != buffer.size:
        raise CorruptSnapshotError(
            f"{buffer.size - consumed} byte(s) after the end-of-stream marker at offset {consumed} (after the end of the stream): "
            "streams laid end to end are not one snapshot"
        )


def _check_offsets(column: pa.ChunkedArray | pa.Array, name: str) -> None:
    """Refuse binary offsets that decrease or point outside their data (they would make later reads return garbage or crash)."""
    for chunk in column.chunks if isinstance(column, pa.ChunkedArray) else [column]:
        n = len(chunk)
        _, off_buf, data_buf = chunk.buffers()
        if n == 0:
            continue
        offsets = np.frombuffer(off_buf, dtype=np.int32, count=n + 1, offset=chunk.offset * 4)
        data_size = data_buf.size if data_buf is not None else 0
        if offsets[0] < 0 or offsets[-1] > data_size or not (offsets[1:] >= offsets[:-1]).all():
            raise CorruptSnapshotError(f"{name} has damaged offsets (values outside the {data_size}-byte data buffer or decreasing)")


def check_rows(table: pa.Table | pa.RecordBatch, is_changelog: bool, handles: bool = False) -> None:
    """The row-level checks every reader makes: binary offsets inside their data, no nulls, row kinds 0..2.

    ``handles``: row kind 3 (materialisation handles) is allowed too; without it a handle is a HandleNeedsStoreError naming it.
    """
    for col, name in zip(table.columns, table.column_names, strict=False):
        if pa.types.is_binary(col.type):
            _check_offsets(col, name)
        if col.null_count:
            raise CorruptSnapshotError(f"{name} has {col.null_count} null(s); columns are non-nullable")
    if is_changelog and table.num_rows:
        largest = pc.max(table.column("row_kind")).as_py()
        if largest == ROW_HANDLE and not handles:
            from snapshot.handles import refuse_unresolved  # handles.py builds on this module: imported when needed

            refuse_unresolved(table)
        if largest > (ROW_HANDLE if handles else ROW_ERASE):
            raise CorruptSnapshotError(f"row_kind {largest} is outside 0 (materialisation), 1 (put), 2 (erase), 3 (handle)")


def _snapshot_of(table: pa.Table, metadata: dict[bytes, bytes], is_changelog: bool, handles: bool = False) -> Snapshot:
    version = parse_format_version(metadata)
    raw_versions = metadata.get(STATE_VERSIONS_KEY)
    state_versions = StateVersionMap.unpack(raw_versions) if raw_versions is not None else StateVersionMap()
    check_rows(table, is_changelog, handles)
    expected = CHANGELOG_SCHEMA if is_changelog else CANONICAL_SCHEMA
    if not table.schema.equals(expected):  # only nullability flags can differ here; re-labelling is zero-copy
        table = pa.Table.from_arrays(table.columns, schema=expected.with_metadata(metadata))
    return Snapshot(table, version, state_versions, metadata, is_changelog)


def read_snapshot(data: Bytesish | pa.NativeFile, limits: ReadLimits = DEFAULT_LIMITS, handles: bool = False) -> Snapshot:
    """The reference reader: check the stream is whole, its schema, nulls, offsets and metadata; return the table and what it declares.

    A changelog holding materialisation handles (row kind 3) is a HandleNeedsStoreError naming them, unless ``handles``
    (canonicalise_state_snapshot reads them so, to resolve them through a store).

    Every message is checked before anything is decoded (snapshot/messages.py): compressed or dictionary batches are refused,
    and ``limits`` bound the bytes and the number of batches, so a small crafted stream cannot make the reader allocate gigabytes.
    """
    buffer = _as_buffer(data)
    if _is_arrow_file(buffer):
        raise CorruptSnapshotError("this is an Arrow IPC file (a stored data file?), not an Arrow IPC stream")
    source = pa.BufferReader(buffer)
    reader = _open_reader(source)
    try:
        schema = reader.schema
        metadata = dict(schema.metadata or {})
        schema.names  # noqa: B018 -- a damaged field name fails to decode here, not later in a caller
    except (pa.ArrowException, ValueError) as exc:
        raise CorruptSnapshotError(f"stream schema is damaged: {exc}") from exc
    parse_format_version(metadata)
    is_changelog = _check_schema(schema)
    check_stream(buffer, limits)  # the schema is read; nothing after it is decoded before every message passed
    try:
        table = reader.read_all()
        table.validate()  # buffer sizes; the offsets themselves are checked below
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise CorruptSnapshotError(f"stream is truncated or damaged: {exc}") from exc
    _check_end_of_stream(buffer, source.tell())
    return _snapshot_of(table, metadata, is_changelog, handles)


def read_arrow_file(data: Bytesish | pa.NativeFile) -> Snapshot:
    """An Arrow IPC file (a stored data file: one batch per segment) read whole and checked as read_snapshot checks a stream."""
    buffer = _as_buffer(data)
    try:
        reader = ipc.open_file(buffer)
        schema = reader.schema
        metadata = dict(schema.metadata or {})
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise CorruptSnapshotError(f"not an Arrow IPC file: {exc}") from exc
    parse_format_version(metadata)
    is_changelog = _check_schema(schema)
    try:
        table = reader.read_all()
        table.validate()
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise CorruptSnapshotError(f"Arrow IPC file is truncated or damaged: {exc}") from exc
    return _snapshot_of(table, metadata, is_changelog)


def read_any(data: Bytesish | pa.NativeFile) -> Snapshot:
    """read_snapshot for a stream, read_arrow_file for an Arrow IPC file (told apart by the file's magic bytes)."""
    buffer = _as_buffer(data)
    return read_arrow_file(buffer) if _is_arrow_file(buffer) else read_snapshot(buffer)
