"""Block-granular data files: block indexes in the footer, bloom filters, point reads a block at a time, checked on read."""

from __future__ import annotations

import base64
import json
import random
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import snapshot as s
from pool.core import PoolCore
from pool.domain import KeyGroupRange, PoolConfig
from snapshot.errors import ChecksumMismatchError, CorruptDataError, FencedError
from store.block_index import FOOTER_KEY, BlockIndex, build_bloom, parse_block_index
from store.datafile import decode_blocks, decode_segment, encode_datafile, segment_index, verify_block
from store.manifest import metadata_key, parse_manifest
from store.memory import MemoryStore
from tests.pool_core_helpers import OP_IDS, OPERATORS, Model, apply, commit, keyed, op_key, scan_dict

FULL = KeyGroupRange(0, 127)
SRC = OP_IDS["source"]


def _changelog_table(rows: list[tuple[int, int, bytes, bytes]]) -> pa.Table:
    kinds, ops, keys, values = zip(*rows, strict=True) if rows else ((), (), (), ())
    return pa.table(
        {
            "row_kind": pa.array(kinds, pa.uint8()),
            "op_id": pa.array(ops, pa.uint64()),
            "key_bytes": pa.array(keys, pa.binary()),
            "value_bytes": pa.array(values, pa.binary()),
        }
    )


def _rows(n: int, value: bytes = b"v" * 32, seed: int = 0) -> list[tuple[int, int, bytes, bytes]]:
    rng = random.Random(seed)
    ops = [OP_IDS[o] for o in OPERATORS]
    return [(s.ROW_PUT, rng.choice(ops), keyed(f"user-{i}"), value + str(i).encode()) for i in range(n)]


def _indexes(encoded, entry) -> list[BlockIndex]:
    """Each segment's blocks as one BlockIndex (its partitions joined), checked as a reader checks them."""
    out = []
    for seg in encoded.segments:
        _, parts = segment_index(entry, seg, encoded.data)
        out.append(
            BlockIndex(
                np.concatenate([p.offsets for p in parts]),
                np.concatenate([p.lengths for p in parts]),
                np.concatenate([p.rows for p in parts]),
                np.concatenate([p.crcs for p in parts]),
                np.concatenate([p.first_ops for p in parts]),
                tuple(k for p in parts for k in p.first_keys),
                parts[0].bloom,
                parts[0].bloom_bits,
            )
        )
    return out


def _partition(encoded_or_bytes, entry, seg, p: int = 0) -> BlockIndex:
    data = encoded_or_bytes.data if hasattr(encoded_or_bytes, "data") else encoded_or_bytes
    return segment_index(entry, seg, data)[1][p]


def test_blocks_tile_each_segment_and_every_reader_sees_every_row():
    rows = _rows(20_000) + [(s.ROW_PUT, SRC, op_key(f"o{i}"), b"op") for i in range(50)]
    encoded = encode_datafile(_changelog_table(rows), changelog=True, target_block_bytes=4096)
    entry = encoded.entry("data/a.arrow", "delta", 0, 127, 1)
    whole = ipc.open_file(encoded.data)
    assert whole.read_all().num_rows == len(rows)  # any Arrow reader: every block is a record batch
    footer = whole.metadata[FOOTER_KEY.encode()]
    assert base64.b64decode(footer)  # the indexes are base64 text in the footer's metadata, nothing an Arrow reader trips on
    blocks = 0
    for seg, index in zip(encoded.segments, _indexes(encoded, entry), strict=True):
        segment_rows = decode_segment(entry, seg, encoded.data[seg.offset : seg.offset + seg.length])
        pieces = []
        for b in range(len(index.first_keys)):
            data = encoded.data[int(index.offsets[b]) : int(index.offsets[b] + index.lengths[b])]
            verify_block(entry, index, b, data)
            block = decode_blocks(entry, int(index.offsets[b]), data, int(index.rows[b]))
            assert block.column("key_bytes")[0].as_py() == index.first_keys[b]
            assert block.column("op_id")[0].as_py() == int(index.first_ops[b])
            assert block.get_total_buffer_size() < 4096 + 1024  # a block closes at the first row past the target
            pieces.append(block)
        assert pa.concat_tables(pieces).equals(segment_rows)
        blocks += len(pieces)
    assert blocks > len(encoded.segments) * 2  # segments really are split


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 3000), st.integers(0, 2**32))
def test_bloom_has_no_false_negatives_and_few_false_positives(n, seed):
    rng = np.random.default_rng(seed)
    present = rng.integers(0, 2**63, n, dtype=np.uint64) * np.uint64(2)
    bloom, bits = build_bloom(present)
    index = BlockIndex(
        np.zeros(1, np.int64),
        np.ones(1, np.int64),
        np.ones(1, np.int64),
        np.zeros(1, np.uint32),
        np.zeros(1, np.uint64),
        (b"",),
        bloom,
        bits,
    )
    assert index.may_hold(present).all()
    absent = rng.integers(0, 2**63, 20_000, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    assert index.may_hold(absent).mean() < 0.03  # ~0.8% at 10 bits a key


def _block_core(store, tiny: bool) -> PoolCore:
    """A core whose cache is so small next to the files that every point read goes a block at a time (or a big one: whole files)."""
    return PoolCore(store, PoolConfig(cache_bytes=2048 if tiny else 256 << 20, resolved_index_after=-1))


def test_tiny_cache_reads_by_block_and_a_cold_get_reads_an_index_and_one_block():
    store = MemoryStore()
    writer = PoolCore(store, PoolConfig(segment_target_bytes=64 << 10))
    epoch, _ = writer.acquire_writer("j", FULL)
    rows = _rows(60_000)
    commit(writer, "j", 1, 0, FULL, epoch, rows)
    cold = PoolCore(store, PoolConfig(cache_bytes=4 << 20, resolved_index_after=-1))
    manifest = cold.reader("j").manifest(1)
    (entry,) = manifest.files
    assert cold.reader("j").reads_by_block(entry)
    manifest_bytes = len(store.get(metadata_key("j", 1)))
    for _, op, key, value in rows[::6007]:
        store.counters.reset()
        assert cold.get("j", 1, op, key)[:2] == (True, value)
        # beside the manifest (read again: no etag is sent here), one segment's block index and one block
        assert store.counters.snapshot()["bytes_read"] - manifest_bytes <= 2 * (32 << 10)
    store.counters.reset()
    probe = [r[2] for r in rows[1::2999]]
    found, values, _ = cold.multi_get("j", 1, [r[1] for r in rows[1::2999]], probe)
    assert list(found) == [True] * len(probe) and values == [r[3] for r in rows[1::2999]]
    # a block per key (and the indexes, already cached by the gets above or read in one go), not whole segments
    assert store.counters.snapshot()["bytes_read"] <= len(probe) * (36 << 10) < entry.size // 2


def test_cold_get_bytes_stay_flat_as_the_file_grows():
    """The bytes one cold Get reads do not grow with the state: an index and a block, at 10k and at 80k rows."""
    per_get = {}
    for n in (10_000, 80_000):
        store = MemoryStore()
        writer = PoolCore(store)
        epoch, _ = writer.acquire_writer("j", FULL)
        rows = _rows(n)
        commit(writer, "j", 1, 0, FULL, epoch, rows)
        cold = PoolCore(store, PoolConfig(cache_bytes=64 << 10, resolved_index_after=-1))
        cold.reader("j").manifest(1)
        sample = rows[:: n // 50]
        store.counters.reset()
        for _, op, key, value in sample:
            assert cold.get("j", 1, op, key)[1] == value
        manifest_bytes = len(store.get(metadata_key("j", 1)))
        per_get[n] = store.counters.snapshot()["bytes_read"] / len(sample) - manifest_bytes
    assert per_get[80_000] < per_get[10_000] * 2, per_get


def _history(seed: int, steps: int) -> tuple[MemoryStore, list[Model]]:
    """Checkpoints of puts, overwrites and erases over two writers (several delta layers, a shared operator state)."""
    rng = random.Random(seed)
    store = MemoryStore()
    core = PoolCore(store, PoolConfig(segment_target_bytes=4096, block_target_bytes=rng.choice([128, 512, 32 << 10])))
    halves = (KeyGroupRange(0, 63), KeyGroupRange(64, 127))
    epochs = [core.acquire_writer("j", kg)[0] for kg in halves]
    model: Model = {}
    models = []
    universe = [f"u{i}" for i in range(rng.randint(50, 900))]
    for cid in range(1, steps + 1):
        rows = []
        for _ in range(rng.randint(1, 400)):
            op = OP_IDS[rng.choice(OPERATORS)]
            key = op_key(f"o{rng.randint(0, 8)}") if rng.random() < 0.05 else keyed(rng.choice(universe))
            if (op, key) in model and rng.random() < 0.3:
                rows.append((s.ROW_ERASE, op, key, b""))
            else:
                rows.append((s.ROW_PUT, op, key, f"{cid}-{rng.random():.5f}".encode() * rng.randint(1, 4)))
        last: dict[tuple[int, bytes], tuple[int, int, bytes, bytes]] = {}
        for r in rows:
            last[(r[1], r[2])] = r
        rows = list(last.values())
        apply(model, rows)
        for kg, epoch in zip(halves, epochs, strict=True):
            mine = [r for r in rows if (r[2][0] >= 128 and kg.lo == 0) or (r[2][0] < 128 and kg.lo <= r[2][0] <= kg.hi)]
            commit(core, "j", cid, cid - 1, kg, epoch, mine)
        models.append(dict(model))
    return store, models


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32), st.integers(1, 5))
def test_block_reads_agree_with_the_model_whole_file_reads_and_the_scan(seed, steps):
    store, models = _history(seed, steps)
    tiny, big = _block_core(store, True), _block_core(store, False)
    rng = random.Random(seed)
    for cid, model in enumerate(models, start=1):
        assert scan_dict(big, "j", cid) == model
        seen = sorted(model)
        # keys never written, keys erased at some point, keys of other operators: absences must be right too
        absent = [(OP_IDS[o], keyed(f"never-{i}")) for i, o in enumerate(OPERATORS)]
        absent += [(op, key) for m in models for (op, key) in m if (op, key) not in model][:50]
        absent += [
            (OP_IDS["sink"] if op != OP_IDS["sink"] else OP_IDS["source"], key)
            for op, key in seen[:20]
            if (OP_IDS["sink"], key) not in model
        ]
        queries = seen + absent
        rng.shuffle(queries)
        ops = [op for op, _ in queries]
        keys = [key for _, key in queries]
        for core in (tiny, big):
            found, values, _ = core.multi_get("j", cid, ops, keys)
            assert [(k in model) for k in queries] == list(found)
            assert [model.get(k, b"") for k in queries] == [v if f else b"" for v, f in zip(values, found, strict=True)]
        for op, key in queries[:40]:
            assert tiny.get("j", cid, op, key)[:2] == ((True, model[(op, key)]) if (op, key) in model else (False, b""))


def _one_file_store(n: int = 5000) -> tuple[MemoryStore, str, list[tuple[int, int, bytes, bytes]]]:
    store = MemoryStore()
    core = PoolCore(store)
    epoch, _ = core.acquire_writer("j", FULL)
    rows = _rows(n)
    commit(core, "j", 1, 0, FULL, epoch, rows)
    (entry,) = core.reader("j").manifest(1).files
    return store, f"jobs/j/{entry.path}", rows


def test_a_flipped_byte_in_a_block_is_named_and_returns_nothing():
    store, key, rows = _one_file_store()
    manifest = parse_manifest(store.get(metadata_key("j", 1)), "m")
    (entry,) = manifest.files
    seg = entry.segments[3]
    index = _partition(store.get(key), entry, seg)
    blob = bytearray(store.get(key))
    blob[int(index.offsets[1]) + 40] ^= 1
    store.put(key, bytes(blob))
    target = next(r for r in rows if seg.kg_lo <= r[2][0] <= seg.kg_hi and index.block_of(r[2], r[1]) == 1)
    with pytest.raises(ChecksumMismatchError, match=rf"{entry.path} \(block at offset {int(index.offsets[1])}\)"):
        _block_core(store, True).get("j", 1, target[1], target[2])


def test_a_damaged_block_index_is_named():
    store, key, rows = _one_file_store()
    (entry,) = parse_manifest(store.get(metadata_key("j", 1)), "m").files
    seg = entry.segments[0]
    assert seg.index is not None
    blob = bytearray(store.get(key))
    blob[seg.index[0] + 10] = ord("A") if blob[seg.index[0] + 10] != ord("A") else ord("B")
    store.put(key, bytes(blob))
    target = next(r for r in rows if seg.kg_lo <= r[2][0] <= seg.kg_hi)
    with pytest.raises(ChecksumMismatchError, match="block index of the segment"):
        _block_core(store, True).get("j", 1, target[1], target[2])


def test_an_index_that_does_not_tile_its_segment_is_corrupt_data():
    encoded = encode_datafile(_changelog_table(_rows(3000)), changelog=True, target_block_bytes=2048)
    seg = encoded.segments[0]
    entry = encoded.entry("data/x.arrow", "delta", 0, 127, 1)
    index = _partition(encoded, entry, seg)
    top, _ = segment_index(entry, seg, encoded.data)
    offset = seg.index[0] + int(top.text_offsets[0])  # type: ignore[index]
    length, crc = int(top.text_lengths[0]), int(top.crcs[0])
    shifted = BlockIndex(
        index.offsets + 1, index.lengths, index.rows, index.crcs, index.first_ops, index.first_keys, index.bloom, index.bloom_bits
    )
    text = base64.b64encode(shifted.encode())
    with pytest.raises(CorruptDataError, match="does not tile its segment"):
        parse_block_index(text, "data/x.arrow", zlib.crc32(text), int(top.starts[0]), int(top.ends[0]), int(top.rows[0]))
    with pytest.raises(CorruptDataError, match="does not tile its segment"):  # rows that do not add up
        parse_block_index(encoded.data[offset : offset + length], "x", crc, int(top.starts[0]), int(top.ends[0]), int(top.rows[0]) + 1)


def test_manifest_refuses_an_index_outside_its_file():
    store, _, _ = _one_file_store(200)
    raw = json.loads(store.get(metadata_key("j", 1)))
    raw["files"][0]["segments"][0]["index"] = [raw["files"][0]["size"], 10, 0, 10]
    with pytest.raises(CorruptDataError, match=r"segments\[0\]\.index"):
        parse_manifest(json.dumps(raw).encode(), "chk-1/_metadata")
    raw["files"][0]["segments"][0]["index"] = [1, 20, 0, 10]  # a top longer than the whole index
    with pytest.raises(CorruptDataError, match=r"segments\[0\]\.index"):
        parse_manifest(json.dumps(raw).encode(), "chk-1/_metadata")
    raw["files"][0]["segments"][0]["index"] = [1, 2, 3]
    with pytest.raises(CorruptDataError, match=r"index must be \[offset, top length, crc32, total length\]"):
        parse_manifest(json.dumps(raw).encode(), "chk-1/_metadata")


def test_same_key_under_several_operators_in_one_block():
    """Rows sorted by key then op_id: a key held by three operators is three adjacent rows, each answered for its own op."""
    ops = sorted(OP_IDS.values())
    rows = [(s.ROW_PUT, op, keyed(f"k{i}"), f"{op}-{i}".encode()) for i in range(3000) for op in ops if (i + op) % 3]
    store = MemoryStore()
    core = PoolCore(store)
    epoch, _ = core.acquire_writer("j", FULL)
    commit(core, "j", 1, 0, FULL, epoch, rows)
    tiny = _block_core(store, True)
    queries = [(op, keyed(f"k{i}")) for i in range(0, 3000, 7) for op in ops]
    found, values, _ = tiny.multi_get("j", 1, [q[0] for q in queries], [q[1] for q in queries])
    expected = {(r[1], r[2]): r[3] for r in rows}
    assert list(found) == [q in expected for q in queries]
    assert [v for v, f in zip(values, found, strict=True) if f] == [expected[q] for q in queries if q in expected]


def test_a_commit_spools_its_data_file_and_leaves_no_spool_behind(file_store):
    """The delta's data file is written to the store's temp folder and linked into place; success or failure, no spool stays."""
    core = PoolCore(file_store)
    epoch, _ = core.acquire_writer("j", FULL)
    commit(core, "j", 1, 0, FULL, epoch, _rows(3000))
    assert not list((file_store.root / ".clink-tmp").glob("*.spool"))
    rival, _ = core.acquire_writer("j", FULL)  # fences epoch
    with pytest.raises(FencedError):
        commit(core, "j", 2, 1, FULL, epoch, _rows(10))
    assert not list((file_store.root / ".clink-tmp").glob("*.spool"))
    assert scan_dict(core, "j", 1) == {(op, key): value for _, op, key, value in _rows(3000)}
