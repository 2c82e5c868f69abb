"""Codecs of collection state values (ListState, MapState): a whole collection in one value_bytes, strict and bounded.

Collection state keeps one row per (slot, user key) whose value holds the whole collection (the seed's rule), so a
reader of a snapshot decodes it from ``value_bytes`` alone. All integers are unsigned 32-bit little-endian (u32).

List value::

    u32 count, then count x ( u32 length, length bytes )        elements in list order

Map value::

    u32 count, then count x ( u32 key length, key bytes, u32 value length, value bytes )
    entries sorted by key bytes (unsigned byte order, a prefix before its extensions), keys unique

Each collection has exactly one encoding, so ``encode(decode(raw)) == raw`` for every value a decoder accepts.
The decoders are strict: truncated data, trailing bytes, a count that does not match the entries, and (maps) keys
out of order or repeated are a CorruptDataError naming the value (``what``), the entry and the byte offset. They are
bounded: every element costs at least 4 bytes (every entry 8), so a count larger than the remaining bytes could hold
is rejected before anything is allocated. An empty collection encodes to the 4 bytes of a zero count; the typed views
never store one (they erase the key: absent and empty are the same state), but a decoder accepts it.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping

from snapshot.errors import CorruptDataError, InvalidArgumentError

__all__ = ["MAX_COLLECTION_LENGTH", "append_to_list", "decode_list", "decode_map", "encode_list", "encode_map"]

_U32 = struct.Struct("<I")
_U32_SIZE = _U32.size
MAX_COLLECTION_LENGTH = (1 << 32) - 1  # a u32 bounds the count and every element's length

BytesLike = bytes | bytearray | memoryview


def _element(data: object, what: str, where: str) -> bytes:
    """``data`` as bytes, or an InvalidArgumentError naming it (a str is not bytes: its encoding is the caller's choice)."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise InvalidArgumentError(f"{what}: {where} must be bytes, got {type(data).__name__}")
    raw = bytes(data)
    if len(raw) > MAX_COLLECTION_LENGTH:
        raise InvalidArgumentError(f"{what}: {where} is {len(raw)} bytes, more than a u32 length can hold")
    return raw


def _count(count: int, what: str) -> bytes:
    if count > MAX_COLLECTION_LENGTH:
        raise InvalidArgumentError(f"{what}: {count} entries, more than a u32 count can hold")
    return _U32.pack(count)


def encode_list(values: Iterable[BytesLike], what: str = "list value") -> bytes:
    """The list value of ``values``: u32 LE count, then per element u32 LE length and its bytes."""
    if isinstance(values, bytes | bytearray | memoryview | str):
        raise InvalidArgumentError(f"{what}: elements must be an iterable of bytes, got a single {type(values).__name__}")
    parts: list[bytes] = []
    for i, value in enumerate(values):
        raw = _element(value, what, f"element {i}")
        parts.append(_U32.pack(len(raw)))
        parts.append(raw)
    return _count(len(parts) // 2, what) + b"".join(parts)


def encode_map(entries: Mapping[bytes, BytesLike], what: str = "map value") -> bytes:
    """The map value of ``entries``: u32 LE count, then entries by ascending key bytes (u32 LE key length, key, u32 LE value length, value)."""
    if not isinstance(entries, Mapping):
        raise InvalidArgumentError(f"{what}: entries must be a mapping of bytes to bytes, got {type(entries).__name__}")
    pairs = sorted((_element(key, what, f"key {key!r}"), _element(value, what, f"value of key {key!r}")) for key, value in entries.items())
    parts: list[bytes] = [_count(len(pairs), what)]
    for i in range(1, len(pairs)):
        if pairs[i][0] == pairs[i - 1][0]:  # b"k" and bytearray(b"k") are two dict keys but one encoded key
            raise InvalidArgumentError(f"{what}: key {pairs[i][0]!r} given twice")
    for key, value in pairs:
        parts += (_U32.pack(len(key)), key, _U32.pack(len(value)), value)
    return b"".join(parts)


def _plural(entry: str) -> str:
    return "entries" if entry == "entry" else f"{entry}s"


class _Reader:
    """Reads u32 LE lengths and byte runs from one value, naming the value and entry in every error."""

    def __init__(self, raw: BytesLike, what: str) -> None:
        if not isinstance(raw, bytes | bytearray | memoryview):
            raise InvalidArgumentError(f"{what}: a collection value must be bytes, got {type(raw).__name__}")
        self.view = memoryview(raw).cast("B")
        self.what = what
        self.pos = 0

    def left(self) -> int:
        return len(self.view) - self.pos

    def fail(self, message: str) -> CorruptDataError:
        return CorruptDataError(f"{self.what}: {message} (value of {len(self.view)} bytes)")

    def count(self, entry: str, min_entry_bytes: int) -> int:
        if self.left() < _U32_SIZE:
            raise self.fail(f"truncated: {self.left()} bytes, too short for the 4-byte {entry} count")
        (count,) = _U32.unpack_from(self.view, self.pos)
        self.pos += _U32_SIZE
        if count * min_entry_bytes > self.left():  # bounded: refuse before allocating anything for ``count`` entries
            raise self.fail(
                f"count says {count} {_plural(entry)} but the {self.left()} bytes left can hold at most {self.left() // min_entry_bytes}"
            )
        return count

    def run(self, where: str) -> bytes:
        if self.left() < _U32_SIZE:
            raise self.fail(f"truncated in {where}: {self.left()} bytes left at offset {self.pos}, the length needs 4")
        (length,) = _U32.unpack_from(self.view, self.pos)
        start = self.pos + _U32_SIZE
        if length > len(self.view) - start:
            raise self.fail(f"truncated in {where}: length {length} at offset {self.pos} but {len(self.view) - start} bytes left")
        self.pos = start + length
        return bytes(self.view[start : self.pos])

    def end(self, count: int, entry: str) -> None:
        if self.left():
            raise self.fail(f"{self.left()} trailing bytes at offset {self.pos} after the {count} {_plural(entry)} the count says")


def decode_list(raw: BytesLike, what: str = "list value") -> list[bytes]:
    """The elements of a list value (see the module docstring); a malformed value is a CorruptDataError naming ``what``."""
    reader = _Reader(raw, what)
    count = reader.count("element", _U32_SIZE)
    out = [reader.run(f"element {i} of {count}") for i in range(count)]
    reader.end(count, "element")
    return out


def append_to_list(stored: BytesLike, added: BytesLike, what: str = "list value") -> bytes:
    """The list value of ``stored``'s elements then ``added``'s (both list values), by concatenation: no element re-encoded.

    ``stored`` is decoded first (a malformed one is a CorruptDataError naming ``what``); a total past a u32 count is refused.
    """
    count = len(decode_list(stored, what)) + len(decode_list(added, what))
    if count > MAX_COLLECTION_LENGTH:
        raise InvalidArgumentError(f"{what}: {count} elements, more than a u32 count can hold")
    return _U32.pack(count) + bytes(stored)[_U32_SIZE:] + bytes(added)[_U32_SIZE:]


def decode_map(raw: BytesLike, what: str = "map value") -> dict[bytes, bytes]:
    """The entries of a map value in key order; keys out of order or repeated are a CorruptDataError naming ``what``."""
    reader = _Reader(raw, what)
    count = reader.count("entry", 2 * _U32_SIZE)
    out: dict[bytes, bytes] = {}
    previous: bytes | None = None
    for i in range(count):
        key = reader.run(f"key of entry {i} of {count}")
        if previous is not None and key <= previous:
            problem = "repeats the key before it" if key == previous else f"is not after the key before it {previous!r}"
            raise reader.fail(f"entry {i} of {count}: key {key!r} {problem}; map keys must be unique and ascending")
        out[key] = reader.run(f"value of entry {i} of {count} (key {key!r})")
        previous = key
    reader.end(count, "entry")
    return out
