"""The checkpoint layout in store/: segmented data files, strict manifests, and CheckpointReader without the pool."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import snapshot as s
from pool.core import PoolCore
from pool.domain import KeyGroupRange, PoolConfig
from snapshot.errors import ChecksumMismatchError, CorruptDataError
from snapshot.key_index import KeyIndex, hash_keys
from store.assembly import assemble, overlay_pieces
from store.checkpoint import CheckpointReader
from store.datafile import KIND_DELTA, decode_segment, encode_datafile, sort_for_layout, verify_file, verify_segment
from store.manifest import metadata_key, parse_manifest
from store.segment_cache import SegmentCache
from tests.pool_core_helpers import OP_IDS, commit, keyed, op_key, scan_dict

SRC = OP_IDS["source"]


def _table(n: int, value_size: int = 40, with_ops: bool = True) -> pa.Table:
    keys = [keyed(f"user-{i}") for i in range(n)]
    if with_ops:
        keys += [op_key(f"o{i}") for i in range(5)]
    return pa.table(
        {
            "row_kind": pa.array([s.ROW_PUT] * len(keys), pa.uint8()),
            "op_id": pa.array([SRC] * len(keys), pa.uint64()),
            "key_bytes": pa.array(keys, pa.binary()),
            "value_bytes": pa.array([b"x" * value_size] * len(keys), pa.binary()),
        }
    )


def test_big_file_gets_one_segment_per_key_group_and_tiny_delta_few():
    big = encode_datafile(_table(20_000), changelog=True, target_segment_bytes=4096)
    keyed_segs = [g for g in big.segments if not g.operator]
    assert len(keyed_segs) == 128 and all(g.kg_lo == g.kg_hi for g in keyed_segs)
    assert [g.kg_lo for g in keyed_segs] == list(range(128))
    assert sum(1 for g in big.segments if g.operator) == 1
    assert sum(g.rows for g in big.segments) == big.rows == 20_005
    ends = [g.offset + g.length for g in big.segments]
    assert [g.offset for g in big.segments[1:]] == ends[:-1] and ends[-1] < len(big.data)  # batches end to end, then the footer
    assert ipc.open_file(pa.py_buffer(big.data)).read_all().num_rows == big.rows  # any Arrow reader gets every row
    tiny = encode_datafile(_table(10), changelog=True)
    assert len(tiny.segments) == 2  # one keyed span, one operator-state segment
    assert tiny.segments[0].kg_lo <= tiny.segments[0].kg_hi
    empty = encode_datafile(_table(0, with_ops=False), changelog=True)
    assert empty.segments == () and ipc.open_file(pa.py_buffer(empty.data)).read_all().num_rows == 0


def test_each_segment_is_a_sorted_stream_of_its_key_groups():
    enc = encode_datafile(_table(3000), changelog=True, target_segment_bytes=2048)
    entry = enc.entry("data/x.arrow", KIND_DELTA, 0, 127)
    verify_file(entry, enc.data)
    for seg in entry.segments:
        blob = enc.data[seg.offset : seg.offset + seg.length]
        verify_segment(entry, seg, blob)
        table = decode_segment(entry, seg, blob)
        lead = s.leading_bytes(table.column("key_bytes"))
        if seg.operator:
            assert (lead >= 128).all()
        else:
            assert ((lead >= seg.kg_lo) & (lead <= seg.kg_hi)).all()
        keys = table.column("key_bytes").to_pylist()
        assert keys == sorted(keys)


def test_checksums_catch_flipped_bytes_and_name_the_file():
    enc = encode_datafile(_table(500), changelog=True, target_segment_bytes=1024)
    entry = enc.entry("data/abc.arrow", KIND_DELTA, 0, 127)
    damaged = bytearray(enc.data)
    damaged[len(damaged) // 2] ^= 0xFF
    with pytest.raises(ChecksumMismatchError, match="data/abc.arrow"):
        verify_file(entry, bytes(damaged))
    seg = next(g for g in entry.segments if g.offset <= len(damaged) // 2 < g.offset + g.length)
    with pytest.raises(ChecksumMismatchError, match="data/abc.arrow"):
        verify_segment(entry, seg, bytes(damaged[seg.offset : seg.offset + seg.length]))


@pytest.fixture
def committed(file_store):
    core = PoolCore(file_store, PoolConfig(segment_target_bytes=2048))
    epoch, _ = core.acquire_writer("j", KeyGroupRange(0, 127))
    rows = [(s.ROW_PUT, SRC, keyed(f"user-{i}"), f"value-{i}".encode() * 4) for i in range(8000)]
    rows.append((s.ROW_PUT, SRC, op_key("offsets"), b"o"))
    commit(core, "j", 1, 0, KeyGroupRange(0, 127), epoch, rows)
    commit(core, "j", 2, 1, KeyGroupRange(0, 127), epoch, [(s.ROW_ERASE, SRC, keyed("user-1"), b"")])
    return file_store, core


def test_reader_without_the_pool_reads_what_the_pool_scans(committed):
    store, core = committed
    reader = CheckpointReader(store, "j")
    assert reader.list_checkpoints() == [1, 2] and reader.latest() == 2
    for cid in (1, 2):
        table = reader.read_table(cid)
        got = dict(
            zip(
                zip(table.column("op_id").to_pylist(), table.column("key_bytes").to_pylist(), strict=True),
                table.column("value_bytes").to_pylist(),
                strict=True,
            )
        )
        assert got == scan_dict(core, "j", cid)
    part = reader.read_table(0, key_groups=(10, 20))
    lead = s.leading_bytes(part.column("key_bytes"))
    assert (((lead >= 10) & (lead <= 20)) | (lead >= 128)).all() and (lead >= 128).sum() == 1
    assert reader.read_table(2, op_ids=[OP_IDS["sink"]]).num_rows == 0


def test_an_eighth_of_the_key_groups_fetches_about_an_eighth_of_the_bytes(committed):
    store, _ = committed
    reader = CheckpointReader(store, "j", SegmentCache(0))  # no cache: count every byte
    manifest = reader.manifest(1)
    total = manifest.total_bytes
    store.counters.reset()
    table = reader.read_table(1, key_groups=(32, 47))
    fetched = store.counters.bytes_read
    assert table.num_rows > 0
    op_segment = sum(g.length for f in manifest.files for g in f.segments if g.operator)
    assert fetched <= 1.25 * total / 8 + op_segment, (fetched, total)
    # the ranged reads were coalesced: a handful of GETs, not one per segment
    assert store.counters.snapshot()["requests"].get("get_range", 0) <= 2


def test_cache_serves_repeated_reads(committed):
    store, _ = committed
    reader = CheckpointReader(store, "j", SegmentCache(64 << 20))
    reader.read_table(1, key_groups=(0, 7))
    store.counters.reset()
    reader.read_table(1, key_groups=(0, 7))
    # only the _metadata is read again (to be sure it is the current version); no data file
    assert store.counters.snapshot()["requests"] == {"get": 1} and reader.cache.hits > 0
    _, etag = store.get_with_etag("jobs/j/chk-1/_metadata")
    store.counters.reset()
    reader.read_manifest_table(reader.manifest(1, etag), (0, 7))  # with the etag known current: nothing is read
    assert store.counters.total_requests == 0


def test_cache_is_bounded():
    cache = SegmentCache(10_000)
    t = _table(50)
    size = t.get_total_buffer_size()
    for i in range(50):
        cache.put(i, t)
    assert cache.size_bytes <= 10_000 and cache.size_bytes >= size
    assert cache.get(0) is None and cache.get(49) is not None


def _mutate(store, key: str, fn) -> None:
    doc = json.loads(store.get(key))
    fn(doc)
    store.put(key, json.dumps(doc).encode())


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: d["files"][0].update(path="/etc/passwd"), "safe relative path"),
        (lambda d: d["files"][0].update(path="data/../../x.arrow"), "safe relative path"),
        (lambda d: d["files"][0].update(sha256="zz"), "sha256"),
        (lambda d: d["files"][0]["segments"][0].update(offset=10**9), "past the file size"),
        (lambda d: d["parts"][0].update(kg_hi=99), "tile"),
        (lambda d: d["parts"][0]["layers"].append(["data/missing.arrow"]), "missing.arrow"),
        (lambda d: d.update(version=9), "version 9"),
        (lambda d: d.update(checkpoint_id="2"), "checkpoint_id"),
        (lambda d: d.update(state_versions="1|x"), "state_versions"),
        (lambda d: d.pop("operators"), "operators is missing"),
    ],
)
def test_manifest_parsing_is_strict(committed, damage, message):
    store, _ = committed
    key = metadata_key("j", 2)
    _mutate(store, key, damage)
    with pytest.raises(CorruptDataError, match=message) as info:
        parse_manifest(store.get(key), key)
    assert key in str(info.value)


def test_manifest_json_has_only_relative_paths(committed):
    store, _ = committed
    doc = json.loads(store.get(metadata_key("j", 2)))
    paths = [f["path"] for f in doc["files"]] + [p for part in doc["parts"] for layer in part["layers"] for p in layer]
    assert paths and all(p.startswith("data/") and not p.startswith("/") for p in paths)
    assert str(store.root) not in json.dumps(doc)
    assert doc["format"] == "clink.checkpoint-manifest" and doc["parent_id"] == 1


@settings(max_examples=60, deadline=None)
@given(
    rows=st.dictionaries(st.tuples(st.integers(0, 3), st.binary(min_size=1, max_size=40)), st.binary(max_size=3), max_size=60),
    probes=st.lists(st.tuples(st.integers(0, 3), st.binary(min_size=1, max_size=40)), max_size=30),
)
def test_key_index_matches_a_dict(rows, probes):
    table = pa.table(
        {
            "op_id": pa.array([k[0] for k in rows], pa.uint64()),
            "key_bytes": pa.array([k[1] for k in rows], pa.binary()),
            "value_bytes": pa.array(list(rows.values()), pa.binary()),
        }
    )
    index = KeyIndex.build(sort_for_layout(table))
    queries = probes + list(rows)[:10]
    q_keys = pa.array([q[1] for q in queries], pa.binary())
    q_ops = np.array([q[0] for q in queries], dtype=np.uint64)
    pos = index.find(hash_keys(q_ops, q_keys), q_keys, q_ops)
    values = index.table.column("value_bytes").to_pylist()
    for q, p in zip(queries, pos.tolist(), strict=True):
        assert (p >= 0) == (q in rows)
        if p >= 0:
            assert values[p] == rows[q]


def test_key_index_survives_hash_collisions():
    """Every key given the same hash: the exact comparison still finds each one (and only it)."""
    keys = [b"\x01" + b"a" * 20 + bytes([c]) + b"b" * 20 for c in range(50)]
    table = pa.table(
        {
            "op_id": pa.array([7] * 50, pa.uint64()),
            "key_bytes": pa.array(keys, pa.binary()),
            "value_bytes": pa.array([bytes([c]) for c in range(50)], pa.binary()),
        }
    )
    index = KeyIndex(table, np.zeros(50, dtype=np.uint64), np.arange(50))
    q_keys = pa.array(keys[::-1] + [b"\x01" + b"a" * 20 + b"\xff" + b"b" * 20], pa.binary())
    q_ops = np.full(51, 7, dtype=np.uint64)
    pos = index.find(np.zeros(51, dtype=np.uint64), q_keys, q_ops)
    assert index.table.column("value_bytes").take(pa.array(pos[:50])).to_pylist() == [bytes([c]) for c in range(49, -1, -1)]
    assert pos[50] == -1
    # keys alike at both ends still hash apart: the hash covers every byte
    assert len(set(hash_keys(q_ops, q_keys).tolist())) == 51


_ROWS = st.lists(st.tuples(st.integers(0, 2), st.binary(min_size=1, max_size=6), st.binary(max_size=5)), max_size=40)


@settings(max_examples=60, deadline=None)
@given(
    base_rows=_ROWS,
    change=st.lists(
        st.tuples(st.sampled_from([0, 1, 2]), st.integers(0, 2), st.binary(min_size=1, max_size=6), st.binary(max_size=5)), max_size=30
    ),
    split=st.integers(0, 40),
)
def test_overlay_pieces_then_assemble_equals_snapshot_overlay(base_rows, change, split):
    base_map = {(o, k): v for o, k, v in base_rows}
    base = pa.table(
        {
            "op_id": pa.array([k[0] for k in base_map], pa.uint64()),
            "key_bytes": pa.array([k[1] for k in base_map], pa.binary()),
            "value_bytes": pa.array(list(base_map.values()), pa.binary()),
        }
    )
    base = pa.concat_tables([base.slice(0, split), base.slice(split)])  # several chunks, as segments are
    changelog = pa.table(
        {
            "row_kind": pa.array([c[0] for c in change], pa.uint8()),
            "op_id": pa.array([c[1] for c in change], pa.uint64()),
            "key_bytes": pa.array([c[2] for c in change], pa.binary()),
            "value_bytes": pa.array([c[3] for c in change], pa.binary()),
        }
    )
    expected = s.overlay(base, changelog)
    got = assemble(overlay_pieces([(base, None)], changelog))
    assert all(c.num_chunks <= 1 for c in got.columns)

    def as_dict(t: pa.Table) -> dict:
        return dict(
            zip(
                zip(t.column("op_id").to_pylist(), t.column("key_bytes").to_pylist(), strict=True),
                t.column("value_bytes").to_pylist(),
                strict=True,
            )
        )

    assert as_dict(got) == as_dict(expected) and got.num_rows == expected.num_rows
