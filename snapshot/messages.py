"""Arrow IPC messages checked before anything is decoded: no compression, no dictionaries, rows and batches bounded by bytes."""

from __future__ import annotations

import io
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
from pyarrow import ipc

from snapshot.errors import CorruptSnapshotError, LimitExceededError

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

# Message.header_type values of the Arrow IPC flatbuffer schema (Message.fbs)
_HEADER_SCHEMA, _HEADER_DICTIONARY, _HEADER_RECORD_BATCH = 1, 2, 3
# field slots: Message(version, header_type, header, bodyLength, custom_metadata); RecordBatch(length, nodes, buffers, compression)
_MESSAGE_HEADER_TYPE, _MESSAGE_HEADER, _MESSAGE_CUSTOM_METADATA = 1, 2, 4
_BATCH_LENGTH, _BATCH_COMPRESSION = 0, 3
# every row of either schema holds at least an 8-byte op_id: a batch declaring more rows than body_bytes / 8 lies
MIN_ROW_BYTES = 8


@dataclass(frozen=True)
class ReadLimits:
    """Bounds one read of a stream: decoded bytes, and record batches (each costs memory beyond its bytes)."""

    max_bytes: int | None = None  # None: whatever the caller already holds
    # batches allowed: base + one per batch_bytes of body; a stream of 100,000 one-row batches is refused, DuckDB's 2,048-row ones are not
    base_batches: int = 1024
    batch_bytes: int = 16 << 10

    def max_batches(self, body_bytes: int) -> int:
        """Record batches a stream of ``body_bytes`` may hold."""
        return self.base_batches + body_bytes // self.batch_bytes


DEFAULT_LIMITS = ReadLimits()


def _table(buf: memoryview, pos: int) -> tuple[int, int, int]:
    """(table position, vtable position, vtable size) of the flatbuffer table at ``pos``."""
    (soffset,) = struct.unpack_from("<i", buf, pos)
    vtable = pos - soffset
    (vsize,) = struct.unpack_from("<H", buf, vtable)
    return pos, vtable, vsize


def _field(buf: memoryview, table: tuple[int, int, int], slot: int) -> int:
    """The position of a field of the table, 0 when absent."""
    pos, vtable, vsize = table
    at = 4 + 2 * slot
    if at + 2 > vsize:
        return 0
    (offset,) = struct.unpack_from("<H", buf, vtable + at)
    return pos + offset if offset else 0


def inspect_message(metadata: pa.Buffer) -> tuple[int, int | None, bool]:
    """(header type, declared rows of a record batch or None, whether it is compressed) from a message's flatbuffer metadata.

    Compressed means either way Arrow knows: the RecordBatch's compression field, or (Arrow 0.17's experimental form, still
    decoded for V4 messages) an 'ARROW:experimental_compression' key in the message's custom metadata; any custom metadata
    on a record batch message counts, since the format never writes it.
    """
    buf = memoryview(metadata)
    try:
        (root,) = struct.unpack_from("<I", buf, 0)
        message = _table(buf, root)
        kind_at = _field(buf, message, _MESSAGE_HEADER_TYPE)
        kind = buf[kind_at] if kind_at else 0
        if kind != _HEADER_RECORD_BATCH:
            return kind, None, False
        header_at = _field(buf, message, _MESSAGE_HEADER)
        if not header_at:
            raise CorruptSnapshotError("a record batch message has no header")
        (rel,) = struct.unpack_from("<I", buf, header_at)
        batch = _table(buf, header_at + rel)
        length_at = _field(buf, batch, _BATCH_LENGTH)
        rows = struct.unpack_from("<q", buf, length_at)[0] if length_at else 0
        return kind, rows, bool(_field(buf, batch, _BATCH_COMPRESSION) or _field(buf, message, _MESSAGE_CUSTOM_METADATA))
    except (struct.error, IndexError):
        raise CorruptSnapshotError("an IPC message's metadata is damaged (it points outside itself)") from None


def check_message(message: ipc.Message, index: int) -> int:
    """Refuse, before decoding it, a message the format never writes (compressed or dictionary batches, rows its bytes cannot hold).

    Returns the message's body bytes. Parses the flatbuffer itself: pyarrow's own message decoding is left to ipc.open_stream,
    which verifies the flatbuffers first (decoding an unverified message can crash the process).
    """
    kind, rows, compressed = inspect_message(message.metadata)
    if kind == _HEADER_DICTIONARY:
        raise CorruptSnapshotError(f"message {index} is a dictionary batch; snapshot streams hold no dictionary-encoded columns")
    if kind != _HEADER_RECORD_BATCH:
        raise CorruptSnapshotError(
            f"message {index} is of header type {kind}; after the schema a snapshot stream holds record batches only"
        )
    if compressed:
        raise CorruptSnapshotError(
            f"record batch {index} is compressed; the snapshot format never compresses batches (refused before decoding)"
        )
    body = message.body.size if message.body is not None else 0
    if rows is None or rows < 0 or rows * MIN_ROW_BYTES > body:
        raise CorruptSnapshotError(
            f"record batch {index} declares {rows} rows in {body} body bytes; each row needs at least {MIN_ROW_BYTES}"
        )
    return body


class _Tally:
    """Counts batches and bytes of one read against its limits."""

    def __init__(self, limits: ReadLimits) -> None:
        self.limits = limits
        self.batches = 0
        self.bytes = 0

    def add(self, message: ipc.Message) -> None:
        self.bytes += check_message(message, self.batches)
        self.batches += 1
        limits = self.limits
        if limits.max_bytes is not None and self.bytes > limits.max_bytes:
            raise LimitExceededError(f"the stream holds more than {limits.max_bytes} bytes of record batches (the limit of this read)")
        if self.batches > limits.max_batches(self.bytes):
            raise LimitExceededError(
                f"the stream holds {self.batches} record batches in {self.bytes} bytes, more than {limits.max_batches(self.bytes)} "
                f"(at most {limits.base_batches} plus one per {limits.batch_bytes} bytes): write fewer, larger batches"
            )


def _messages(source: pa.NativeFile) -> Iterator[ipc.Message]:
    """The stream's messages, framed but not decoded; CorruptSnapshotError for damaged framing."""
    reader = ipc.MessageReader.open_stream(source)
    while True:
        try:
            yield reader.read_next_message()
        except StopIteration:
            return
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise CorruptSnapshotError(f"stream is truncated or damaged: {exc}") from exc


def check_stream(buffer: pa.Buffer, limits: ReadLimits = DEFAULT_LIMITS) -> None:
    """Check every message of a whole stream before ipc.open_stream decodes it (zero-copy: the messages are slices of ``buffer``)."""
    messages = _messages(pa.BufferReader(buffer))
    first = next(messages, None)
    if first is None:
        raise CorruptSnapshotError("the stream is empty: no schema message")
    if inspect_message(first.metadata)[0] != _HEADER_SCHEMA:
        raise CorruptSnapshotError("the stream does not start with a schema message")
    tally = _Tally(limits)
    for message in messages:
        tally.add(message)


class _CheckedFeed(io.RawIOBase):
    """A readable file of a source's messages, each checked before pyarrow's stream reader sees (and decodes) it."""

    def __init__(self, source: pa.NativeFile, limits: ReadLimits) -> None:
        self._messages = _messages(source)
        self._tally = _Tally(limits)
        self._first = True
        self._pending = memoryview(b"")
        self._done = False

    def readable(self) -> bool:
        return True

    def _refill(self) -> None:
        message = next(self._messages, None)
        if message is None:
            self._pending, self._done = memoryview(_END_OF_STREAM), True
            return
        if self._first:
            if inspect_message(message.metadata)[0] != _HEADER_SCHEMA:
                raise CorruptSnapshotError("the stream does not start with a schema message")
            self._first = False
        else:
            self._tally.add(message)
        self._pending = memoryview(message.serialize()).cast("B")

    def readinto(self, out: WriteableBuffer) -> int:
        view = memoryview(out).cast("B")
        while not self._pending and not self._done:
            self._refill()
        n = min(len(view), len(self._pending))
        view[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n


_END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"


def open_checked_stream(source: pa.NativeFile, limits: ReadLimits = DEFAULT_LIMITS) -> ipc.RecordBatchStreamReader:
    """A stream reader over ``source`` read lazily (an HTTP body, a pipe), every message checked before it is decoded."""
    try:
        return ipc.open_stream(pa.PythonFile(io.BufferedReader(_CheckedFeed(source, limits), 1 << 20), mode="r"))
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise CorruptSnapshotError(f"not an Arrow IPC stream: {exc}") from exc
