"""The collection value codecs (snapshot/collections.py): documented bytes, round trips, one encoding, strict bounded decoders."""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st

from snapshot.collections import decode_list, decode_map, encode_list, encode_map
from snapshot.errors import CorruptDataError, InvalidArgumentError


def u32(n: int) -> bytes:
    return struct.pack("<I", n)


def test_list_bytes_are_the_documented_layout() -> None:
    # the spec vector of docs/format.md: count, then (length, bytes) per element in list order
    assert encode_list([b"ab", b"", b"\x00"]) == u32(3) + u32(2) + b"ab" + u32(0) + u32(1) + b"\x00"
    assert encode_list([]) == u32(0)


def test_map_bytes_are_the_documented_layout_sorted_by_unsigned_key_bytes() -> None:
    entries = {b"b": b"2", b"\x80": b"", b"a": b"1", b"ab": b"3"}
    expected = u32(4)
    for key in [b"a", b"ab", b"b", b"\x80"]:  # unsigned bytes: 0x80 after ASCII, a prefix before its extensions
        expected += u32(len(key)) + key + u32(len(entries[key])) + entries[key]
    assert encode_map(entries) == expected
    assert list(decode_map(expected)) == [b"a", b"ab", b"b", b"\x80"]


@given(st.lists(st.binary(max_size=40), max_size=30))
def test_list_round_trip(values: list[bytes]) -> None:
    raw = encode_list(values)
    assert decode_list(raw) == values
    assert decode_list(memoryview(raw)) == values
    assert encode_list(bytearray(v) for v in values) == raw  # any bytes-like element, any iterable


@given(st.dictionaries(st.binary(max_size=20), st.binary(max_size=40), max_size=30))
def test_map_round_trip_in_key_order(entries: dict[bytes, bytes]) -> None:
    raw = encode_map(entries)
    decoded = decode_map(raw)
    assert decoded == entries
    assert list(decoded) == sorted(entries)
    assert encode_map(dict(reversed(list(entries.items())))) == raw  # insertion order does not change the bytes


@given(st.binary(max_size=60))
def test_an_accepted_value_has_exactly_one_encoding(raw: bytes) -> None:
    """Whatever bytes a decoder accepts re-encode to the same bytes (no second spelling of one collection)."""
    try:
        as_list = decode_list(raw)
    except CorruptDataError:
        pass
    else:
        assert encode_list(as_list) == raw
    try:
        as_map = decode_map(raw)
    except CorruptDataError:
        pass
    else:
        assert encode_map(as_map) == raw


@given(st.lists(st.binary(max_size=8), min_size=1, max_size=8), st.data())
def test_every_truncation_and_every_extension_of_a_list_is_rejected(values: list[bytes], data: st.DataObject) -> None:
    raw = encode_list(values)
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(CorruptDataError, match="truncated|count says"):
        decode_list(raw[:cut])
    with pytest.raises(CorruptDataError, match="trailing bytes"):
        decode_list(raw + data.draw(st.binary(min_size=1, max_size=6)))


@given(st.dictionaries(st.binary(max_size=6), st.binary(max_size=6), min_size=1, max_size=6), st.data())
def test_every_truncation_and_every_extension_of_a_map_is_rejected(entries: dict[bytes, bytes], data: st.DataObject) -> None:
    raw = encode_map(entries)
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(CorruptDataError, match="truncated|count says"):
        decode_map(raw[:cut])
    with pytest.raises(CorruptDataError, match="trailing bytes"):
        decode_map(raw + data.draw(st.binary(min_size=1, max_size=6)))


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", r"truncated: 0 bytes, too short for the 4-byte element count"),
        (b"\x01\x00\x00", r"truncated: 3 bytes, too short for the 4-byte element count"),
        (u32(2) + u32(3) + b"abc" + b"\x00\x00", r"truncated in element 1 of 2: 2 bytes left at offset 11, the length needs 4"),
        (u32(1) + u32(5) + b"abc", r"truncated in element 0 of 1: length 5 at offset 4 but 3 bytes left"),
        (u32(1) + u32(1) + b"a" + b"zz", r"2 trailing bytes at offset 9 after the 1 elements the count says"),
        (u32(0) + u32(0), r"4 trailing bytes at offset 4 after the 0 elements"),
        (u32(3) + u32(0) + u32(0), r"count says 3 elements but the 8 bytes left can hold at most 2"),
    ],
    ids=["empty", "short-count", "short-length", "short-element", "trailing", "count-too-small", "count-too-large"],
)
def test_each_malformed_list_is_named(raw: bytes, message: str) -> None:
    with pytest.raises(CorruptDataError, match=f"^list of slot 'buf' key b'k': {message}"):
        decode_list(raw, "list of slot 'buf' key b'k'")


def entry(key: bytes, value: bytes) -> bytes:
    return u32(len(key)) + key + u32(len(value)) + value


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"\x00", r"truncated: 1 bytes, too short for the 4-byte entry count"),
        (u32(2) + entry(b"b", b"1") + entry(b"a", b"2"), r"entry 1 of 2: key b'a' is not after the key before it b'b'"),
        (u32(2) + entry(b"a", b"1") + entry(b"a", b"2"), r"entry 1 of 2: key b'a' repeats the key before it"),
        (u32(2) + entry(b"a", b"1") + entry(b"", b"2"), r"entry 1 of 2: key b'' is not after"),
        (u32(1) + u32(1) + b"a" + u32(4) + b"xy", r"truncated in value of entry 0 of 1 \(key b'a'\): length 4 at offset 9"),
        (u32(1) + u32(9) + b"a" + u32(0), r"truncated in key of entry 0 of 1: length 9 at offset 4 but 5 bytes left"),
        (u32(1) + entry(b"a", b"1") + b"\x00", r"1 trailing bytes at offset 14 after the 1 entries"),
        (u32(2) + entry(b"a", b"1"), r"count says 2 entries but the 10 bytes left can hold at most 1"),
    ],
    ids=["short-count", "unsorted", "duplicate", "empty-key-after", "short-value", "short-key", "trailing", "count-too-large"],
)
def test_each_malformed_map_is_named(raw: bytes, message: str) -> None:
    with pytest.raises(CorruptDataError, match=f"^map of slot 'm' key b'u': {message}"):
        decode_map(raw, "map of slot 'm' key b'u'")


@pytest.mark.parametrize("decode", [decode_list, decode_map])
def test_a_huge_count_is_refused_before_reading_entries(decode) -> None:
    """A 4-byte header claiming 2^32-1 entries over a few bytes fails on the header: the bound, not a long loop."""
    raw = u32(0xFFFF_FFFF) + bytes(64)
    with pytest.raises(CorruptDataError, match="count says 4294967295 .* 64 bytes left can hold at most"):
        decode(raw)


class KeyTwice(Mapping[bytes, bytes]):
    """A mapping whose iteration repeats a key, as a careless Mapping implementation may."""

    def __getitem__(self, key: bytes) -> bytes:
        return b"v"

    def __iter__(self) -> Iterator[bytes]:
        return iter([b"k", b"k"])

    def __len__(self) -> int:
        return 2


def test_bad_input_to_the_encoders_is_named() -> None:
    with pytest.raises(InvalidArgumentError, match=r"^my list: element 1 must be bytes, got str"):
        encode_list([b"a", "b"], "my list")  # type: ignore[list-item]
    with pytest.raises(InvalidArgumentError, match=r"elements must be an iterable of bytes, got a single bytes"):
        encode_list(b"abc")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=r"^map value: key 'k' must be bytes, got str"):
        encode_map({"k": b"v"})  # type: ignore[dict-item]
    with pytest.raises(InvalidArgumentError, match=r"^map value: value of key b'k' must be bytes, got int"):
        encode_map({b"k": 1})  # type: ignore[dict-item]
    with pytest.raises(InvalidArgumentError, match=r"entries must be a mapping"):
        encode_map([(b"k", b"v")])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=r"^map value: key b'k' given twice"):
        encode_map(KeyTwice())
    with pytest.raises(InvalidArgumentError, match=r"a collection value must be bytes, got str"):
        decode_list("abc")  # type: ignore[arg-type]
