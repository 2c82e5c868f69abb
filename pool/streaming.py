"""Cut a snapshot stream into wire chunks straight from the table's buffers, without building the whole stream first."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pyarrow as pa

from snapshot import SnapshotArrowWriter

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer


class _PieceSink:
    """A file-like sink for pyarrow.ipc that keeps what is written; large bodies arrive as zero-copy Buffers."""

    closed = False

    def __init__(self) -> None:
        self.pieces: list[pa.Buffer] = []

    def write(self, data: ReadableBuffer) -> int:
        piece = data if isinstance(data, pa.Buffer) else pa.py_buffer(bytes(data))
        self.pieces.append(piece)
        return piece.size

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def stream_chunks(
    writer: SnapshotArrowWriter, table: pa.Table, chunk_bytes: int, frame: Callable[[int], bytes] | None = None
) -> Iterator[bytes]:
    """The bytes ``writer.write(table)`` would produce, as chunks of ``chunk_bytes`` (the last may be shorter).

    Only one chunk is copied at a time: the stream's large pieces are the table's own buffers, so peak
    memory is the table plus one chunk, not the table plus a second full-size stream buffer. With
    ``frame``, each chunk is prefixed by ``frame(len(chunk))`` in the same copy (a protobuf field header).
    """
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    sink = _PieceSink()
    writer.write_to(sink, table)
    pending: list[pa.Buffer] = []
    size = 0
    for piece in sink.pieces:
        offset = 0
        while offset < piece.size:
            take = min(chunk_bytes - size, piece.size - offset)
            pending.append(piece.slice(offset, take))
            size += take
            offset += take
            if size == chunk_bytes:
                yield b"".join([frame(size), *pending] if frame else pending)
                pending, size = [], 0
    if size:
        yield b"".join([frame(size), *pending] if frame else pending)
