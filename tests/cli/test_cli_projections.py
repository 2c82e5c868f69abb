"""The vectorised projections against per-row models: key decoding, UTF-8 validity, rendering, FNV key groups."""

from __future__ import annotations

import json
import struct

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import snapshot as s
from clink.tools import projections as p
from tests.cli_fixtures import VECTORS, generated_table

slot_names = st.text(st.characters(blacklist_characters="|\n", blacklist_categories=("Cs",)), min_size=0, max_size=6).filter(
    lambda x: x != s.RAW_SLOT
)
user_keys = st.binary(max_size=20)


@st.composite
def key_bytes(draw) -> bytes:
    kind = draw(st.sampled_from(["keyed", "operator", "raw", "raw-bytes", "pipe-kg"]))
    if kind == "keyed":
        return s.encode_keyed_key(draw(slot_names), draw(user_keys))
    if kind == "operator":
        return s.encode_operator_key(draw(slot_names), draw(user_keys))
    if kind == "pipe-kg":
        # key group 124 is the byte '|': the split must start after the prefix byte
        return bytes([0x7C]) + draw(slot_names).encode() + b"|" + draw(user_keys)
    return draw(st.binary(max_size=12))


def _model_render(b: bytes) -> str:
    # printable UTF-8 (not empty, not only spaces) as text whatever its length, else 8 bytes as int64, else hex
    try:
        text = b.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and text.strip(" ") and pa.compute.utf8_is_printable(pa.array([text])).to_pylist()[0]:
        return text
    if len(b) == 8:
        return str(struct.unpack("<q", b)[0])
    return "0x" + b.hex()


@settings(max_examples=150, deadline=None)
@given(st.lists(key_bytes(), max_size=40), st.integers(0, 5))
def test_decode_keys_matches_decode_key_row_by_row(keys: list[bytes], offset: int) -> None:
    arr = pa.array([b"pad"] * offset + keys, pa.binary()).slice(offset)  # sliced input exercises buffer offsets
    decoded = p.decode_keys(arr).to_pydict()
    for i, key in enumerate(keys):
        ref = s.decode_key(key)
        assert decoded["kind"][i] == ref.kind, key
        assert decoded["slot"][i] == ref.slot, key
        assert decoded["user_key"][i] == ref.user_key, key
        assert decoded["key_group"][i] == ref.key_group, key


def test_decode_keys_crosses_chunk_boundaries(monkeypatch) -> None:
    monkeypatch.setattr(p, "DECODE_CHUNK_ROWS", 7)
    table = generated_table(3, keyed_rows=100, operator_rows=5, raw_rows=3)
    chunked = pa.chunked_array([table.column("key_bytes").slice(0, 50), table.column("key_bytes").slice(50)])
    decoded = p.decode_keys(chunked)
    refs = [s.decode_key(k) for k in table.column("key_bytes").to_pylist()]
    assert decoded.column("slot").to_pylist() == [r.slot for r in refs]
    assert decoded.column("user_key").to_pylist() == [r.user_key for r in refs]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=10), st.text(max_size=6).map(lambda t: t.encode("utf-8", "surrogatepass"))), max_size=30))
def test_utf8_valid_mask_matches_python(values: list[bytes]) -> None:
    mask = p.utf8_valid_mask(pa.array(values, pa.binary()))
    for v, ok in zip(values, mask.tolist(), strict=True):
        try:
            v.decode("utf-8")
            expected = True
        except UnicodeDecodeError:
            expected = False
        assert ok == expected, v


@pytest.mark.parametrize(
    "raw",
    [b"\xed\xa0\x80", b"\xe0\x80\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf", b"abc\xc3", b"\x80", b"\xf0\x9f\x98\x80", "ключ".encode()],
)
def test_utf8_valid_mask_known_edge_cases(raw: bytes) -> None:
    try:
        raw.decode("utf-8")
        expected = True
    except UnicodeDecodeError:
        expected = False
    assert p.utf8_valid_mask(pa.array([raw])).tolist() == [expected]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=12), st.text(max_size=8).map(lambda t: t.encode("utf-8", "surrogatepass"))), max_size=30))
def test_render_bytes_matches_model(values: list[bytes]) -> None:
    text, ints = p.render_bytes(pa.array(values, pa.binary()))
    assert text.to_pylist() == [_model_render(v) for v in values]
    assert ints.to_pylist() == [struct.unpack("<q", v)[0] if len(v) == 8 else None for v in values]


def test_key_groups_of_agrees_with_every_vector() -> None:
    cases = json.loads((VECTORS / "expected.json").read_text())["key_groups"]
    keys = pa.array([bytes.fromhex(c["user_key"]) for c in cases], pa.binary())
    assert p.key_groups_of(keys).tolist() == [c["key_group"] for c in cases]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=50))
def test_key_groups_of_matches_fnv_row_by_row(keys: list[bytes]) -> None:
    assert p.key_groups_of(pa.array(keys, pa.binary())).tolist() == [s.key_group(k) for k in keys]


def test_parquet_and_iceberg_projections_carry_every_row() -> None:
    table = generated_table(5, operator_rows=4, raw_rows=2)
    proj = p.parquet_projection(table, 1, s.StateVersionMap({(1, "ValueState"): 2}))
    assert proj.schema.equals(p.PARQUET_SCHEMA)
    assert proj.schema.metadata[b"clink.state_versions"] == b"1|ValueState|2"
    refs = [s.decode_key(k) for k in table.column("key_bytes").to_pylist()]
    assert proj.column("key_group").to_pylist() == [r.key_group for r in refs]
    ice = p.iceberg_projection(table)
    assert p.unsigned_op_ids(ice.column("op_id")).to_pylist() == table.column("op_id").to_pylist()
    assert ice.column("op_id").to_pylist() == [int(np.uint64(o).view(np.int64)) for o in table.column("op_id").to_pylist()]


def test_query_projection_columns() -> None:
    table = generated_table(9, keyed_rows=60)
    q = p.query_projection(table)
    assert q.schema.equals(p.QUERY_SCHEMA)
    for row, key in zip(q.to_pylist(), table.column("key_bytes").to_pylist(), strict=True):
        ref = s.decode_key(key)
        assert row["key_text"] == _model_render(ref.user_key)
        assert row["value_text"] == _model_render(row["value_bytes"])
        assert row["value_size"] == len(row["value_bytes"])
