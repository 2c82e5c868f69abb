"""Crafted streams the reader refuses before decoding: compressed batches (decompression bombs), dictionaries, lying row counts, batch floods."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from snapshot.errors import CorruptSnapshotError, LimitExceededError
from snapshot.format import CANONICAL_SCHEMA, read_snapshot, write_snapshot
from snapshot.messages import ReadLimits, check_stream, open_checked_stream


def _table(rows: int, value: bytes = b"v") -> pa.Table:
    return pa.table(
        {
            "op_id": pa.array([1] * rows, pa.uint64()),
            "key_bytes": pa.array([b"\x01" + i.to_bytes(4, "big") for i in range(rows)]),
            "value_bytes": pa.array([value] * rows),
        },
        schema=CANONICAL_SCHEMA,
    )


def _stream(batches: list[pa.RecordBatch], compression: str | None = None) -> bytes:
    sink = pa.BufferOutputStream()
    with ipc.new_stream(
        sink, CANONICAL_SCHEMA.with_metadata(write_snapshot_metadata()), options=ipc.IpcWriteOptions(compression=compression)
    ) as w:
        for b in batches:
            w.write_batch(b)
    return sink.getvalue().to_pybytes()


def write_snapshot_metadata() -> dict[bytes, bytes]:
    return dict(ipc.open_stream(write_snapshot(_table(0))).schema.metadata)


def zstd_bomb(decoded_bytes: int) -> bytes:
    """A stream whose one batch holds ``decoded_bytes`` of zeros in a value, zstd-compressed to a few KiB."""
    value = pa.array([b"\x00" * decoded_bytes], pa.binary())
    batch = pa.record_batch([pa.array([1], pa.uint64()), pa.array([b"\x01k"]), value], schema=CANONICAL_SCHEMA)
    return _stream([batch], "zstd")


def test_a_zstd_bomb_is_refused_before_anything_is_decoded() -> None:
    bomb = zstd_bomb(256 << 20)  # 256 MiB of zeros
    assert len(bomb) < 64 << 10, "the bomb must be small for the test to mean anything"
    before = pa.total_allocated_bytes()
    with pytest.raises(CorruptSnapshotError, match="compressed"):
        read_snapshot(bomb)
    assert pa.total_allocated_bytes() - before < 1 << 20, "the reader decompressed the batch before refusing it"


def test_compression_of_any_codec_and_any_batch_is_refused() -> None:
    plain = _table(3).to_batches()[0]
    for codec in ("zstd", "lz4"):
        messages = list(ipc.MessageReader.open_stream(pa.BufferReader(_stream([plain]))))
        packed = list(ipc.MessageReader.open_stream(pa.BufferReader(_stream([plain], codec))))
        spliced = b"".join(m.serialize().to_pybytes() for m in [messages[0], messages[1], packed[1]]) + b"\xff\xff\xff\xff\x00\x00\x00\x00"
        with pytest.raises(CorruptSnapshotError, match="record batch 1 is compressed"):
            check_stream(pa.py_buffer(spliced))
    # the same batches uncompressed read fine
    assert read_snapshot(_stream([plain, plain])).table.num_rows == 6


def test_a_batch_declaring_more_rows_than_its_bytes_hold_is_refused() -> None:
    good = _stream([_table(2).to_batches()[0]])
    # the batch length is the first field of the RecordBatch table: patch the 2 into 2**40 in the flatbuffer
    at = good.index((2).to_bytes(8, "little"), 8 + good[4:8].__len__() + int.from_bytes(good[4:8], "little"))
    lying = good[:at] + (1 << 40).to_bytes(8, "little") + good[at + 8 :]
    with pytest.raises(CorruptSnapshotError, match="declares 1099511627776 rows"):
        read_snapshot(lying)


def test_a_flood_of_tiny_batches_is_refused_naming_the_limit() -> None:
    tiny = _table(1).to_batches()[0]
    flood = _stream([tiny] * 3000)
    with pytest.raises(LimitExceededError, match="3000 record batches|record batches in"):
        read_snapshot(flood)
    # the same rows in batches of 2,048 (as DuckDB writes) pass
    rows = _table(3000)
    assert read_snapshot(_stream(rows.to_batches(max_chunksize=2048))).table.num_rows == 3000
    # and a caller may allow more
    assert read_snapshot(flood, ReadLimits(base_batches=5000)).table.num_rows == 3000


def test_a_byte_limit_is_enforced_before_decoding() -> None:
    stream = _stream([_table(1000, b"x" * 100).to_batches()[0]])
    with pytest.raises(LimitExceededError, match="more than 10000 bytes"):
        read_snapshot(stream, ReadLimits(max_bytes=10_000))


def test_the_streaming_reader_checks_each_message_and_reads_lazily() -> None:
    plain = _table(5).to_batches()[0]
    reader = open_checked_stream(pa.BufferReader(_stream([plain] * 4)))
    assert sum(b.num_rows for b in reader) == 20
    source = pa.BufferReader(_stream([plain, plain], "zstd"))
    with pytest.raises(CorruptSnapshotError, match="compressed"):
        list(open_checked_stream(source))


def _experimental_compression_bomb(decoded_bytes: int) -> bytes:
    """Arrow 0.17's form: a V4 batch without the compression field, marked compressed in the message's custom metadata."""
    import struct

    cols = [pa.array([7], pa.uint64()), pa.array([b"\x05bomb"]), pa.array([b"\x00" * decoded_bytes])]
    sink = pa.BufferOutputStream()
    opts = ipc.IpcWriteOptions(compression="zstd", metadata_version=ipc.MetadataVersion.V4)
    with ipc.new_stream(sink, CANONICAL_SCHEMA.with_metadata(write_snapshot_metadata()), options=opts) as w:
        w.write_batch(pa.record_batch(cols, schema=CANONICAL_SCHEMA), custom_metadata={"ARROW:experimental_compression": "zstd"})
    data = bytearray(sink.getvalue().to_pybytes())
    pos = 0
    while True:  # in each record batch message, drop the RecordBatch.compression field from its vtable
        (length,) = struct.unpack_from("<i", data, pos + 4)
        if length == 0:
            return bytes(data)
        buf = memoryview(data)[pos + 8 : pos + 8 + length]
        (root,) = struct.unpack_from("<I", buf, 0)
        vt = root - struct.unpack_from("<i", buf, root)[0]
        at = struct.unpack_from("<H", buf, vt + 10)[0] if struct.unpack_from("<H", buf, vt)[0] > 10 else 0
        body = struct.unpack_from("<q", buf, root + at)[0] if at else 0  # a schema message has no body
        if buf[root + struct.unpack_from("<H", buf, vt + 6)[0]] == 3:
            header = root + struct.unpack_from("<H", buf, vt + 8)[0]
            batch = header + struct.unpack_from("<I", buf, header)[0]
            struct.pack_into("<H", buf, batch - struct.unpack_from("<i", buf, batch)[0] + 4 + 2 * 3, 0)
        del buf
        pos += 8 + length + body


def test_arrow_017_experimental_compression_is_refused_too() -> None:
    bomb = _experimental_compression_bomb(64 << 20)
    assert len(bomb) < 64 << 10
    before = pa.total_allocated_bytes()
    with pytest.raises(CorruptSnapshotError, match="compressed"):
        read_snapshot(bomb)
    assert pa.total_allocated_bytes() - before < 1 << 20
