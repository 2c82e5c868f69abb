"""Get's single-key path (pool.point_read, KeyIndex.find_one) gives MultiGet's answers: every layer, erase, part and index."""

from __future__ import annotations

import random
import time

import numpy as np
import pyarrow as pa
import pytest

import snapshot as s
from pool.core import PoolCore
from pool.domain import KeyGroupRange, PoolConfig
from pool.lifecycle import Lifecycle
from pool.servicer import RemotePoolServicer
from protos import remote_pool_pb2 as pb
from snapshot.errors import InvalidArgumentError, LimitExceededError, NotFoundError
from snapshot.key_index import KeyIndex, hash_key, hash_keys
from store.memory import MemoryStore
from tests.pool_core_helpers import OP_IDS, OPERATORS, apply, commit, keyed, keys_in_range, op_key, random_delta

QUARTERS = [KeyGroupRange(i * 32, i * 32 + 31) for i in range(4)]
HALVES = [KeyGroupRange(0, 63), KeyGroupRange(64, 127)]
READERS = {
    "layer by layer": PoolConfig(resolved_index_after=-1),
    "merged resolved index": PoolConfig(resolved_index_after=0),
    "a block at a time": PoolConfig(cache_bytes=4096, resolved_index_after=-1),
}


def _history(store: MemoryStore) -> tuple[dict[int, dict], list[tuple[int, bytes]]]:
    """Checkpoints of four writers, then two after a rescale, then compacted: the model of each, and every key to probe."""
    rng = random.Random(5)
    writer = PoolCore(store, PoolConfig(segment_target_bytes=256))  # tiny segments: several per file
    model: dict = {}
    history: dict[int, dict] = {}
    universe = [u for kg in QUARTERS for u in keys_in_range(kg.lo, kg.hi, 12, tag=f"q{kg.lo}-")]
    op_keys = ["offset", "watermark"]
    epochs = [writer.acquire_writer("j", kg)[0] for kg in QUARTERS]
    for cid in (1, 2, 3):
        for kg, epoch in zip(QUARTERS, epochs, strict=True):
            mine = [u for u in universe if kg.lo <= s.key_group(u.encode()) <= kg.hi]
            # operator state from one writer only: several writers' rows of one checkpoint merge by the format's rule
            rows = random_delta(rng, model, mine, op_keys if kg.lo == 0 else [], 40 if cid == 1 else 12, cid)
            commit(writer, "j", cid, cid - 1, kg, epoch, rows)
            apply(model, rows)
        history[cid] = dict(model)
    epochs = [writer.acquire_writer("j", kg)[0] for kg in HALVES]  # a rescale: parts whose layers come from several parents
    for cid in (4, 5):
        for kg, epoch in zip(HALVES, epochs, strict=True):
            mine = [u for u in universe if kg.lo <= s.key_group(u.encode()) <= kg.hi]
            held = {k: v for k, v in model.items() if k[1][0] >= s.NUM_KEY_GROUPS or kg.lo <= k[1][0] <= kg.hi}
            rows = random_delta(rng, held, mine, [], 12, cid)
            commit(writer, "j", cid, cid - 1, kg, epoch, rows)
            apply(model, rows)
        history[cid] = dict(model)
    Lifecycle(store).compact("j", 5, force=True)  # checkpoint 5 again: one base per part
    probe = [(OP_IDS[o], keyed(u)) for o in OPERATORS for u in universe]
    probe += [(OP_IDS[o], op_key(k)) for o in OPERATORS for k in op_keys]
    probe += [(OP_IDS["source"], keyed("never-written")), (OP_IDS["source"], op_key("never-written")), (OP_IDS["source"], b"")]
    return history, probe


@pytest.mark.parametrize("reader", list(READERS))
def test_get_answers_as_multi_get_and_the_model_at_every_checkpoint(reader: str) -> None:
    store = MemoryStore()
    history, probe = _history(store)
    assert any(p in history[1] and p not in history[3] for p in probe), "some keys were erased"
    core = PoolCore(store, READERS[reader])
    for cid, model in history.items():
        found, values, answered = core.multi_get("j", cid, [p[0] for p in probe], [p[1] for p in probe])
        assert (found, values) == ([p in model for p in probe], [model.get(p, b"") for p in probe])
        assert [core.get("j", cid, op, key) for op, key in probe] == list(zip(found, values, [answered] * len(probe), strict=True))


def test_get_takes_and_refuses_the_inputs_multi_get_takes_and_refuses() -> None:
    store = MemoryStore()
    history, probe = _history(store)
    core = PoolCore(store)
    op, key = next(p for p in probe if p in history[5])
    expected = (True, history[5][(op, key)], 5)
    assert core.get("j", 5, np.uint64(op), bytearray(key)) == expected  # type: ignore[arg-type]
    assert core.get_with_etag("j", 5, op, key)[:3] == expected
    text = key.decode("latin-1")  # str keys: encoded as multi_get's pa.array encodes them
    found, values, _ = core.multi_get("j", 5, [op], [text])  # type: ignore[list-item]
    assert core.get("j", 5, op, text)[:2] == (found[0], values[0])  # type: ignore[arg-type]
    for bad_op in (True, -1, 1 << 64, 1.0):
        with pytest.raises(InvalidArgumentError, match="must be a uint64"):
            core.get("j", 5, bad_op, key)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="keys must be bytes"):
        core.get("j", 5, op, None)  # type: ignore[arg-type]
    small = PoolCore(store, PoolConfig(max_multiget_key_bytes=16))
    with pytest.raises(LimitExceededError):
        small.get("j", 5, op, b"\x01" + bytes(16))
    for job in ("", "a b", "../j", 7):
        with pytest.raises(InvalidArgumentError):
            core.get(job, 5, op, key)  # type: ignore[arg-type]
    with pytest.raises(NotFoundError):
        core.get("j", 99, op, key)


def test_the_get_rpc_refuses_an_oversized_key_before_it_looks_for_the_job() -> None:
    servicer = RemotePoolServicer(PoolCore(MemoryStore(), PoolConfig(max_multiget_key_bytes=16)))
    with pytest.raises(LimitExceededError):
        servicer.Get(pb.GetRequest(job="nobody", checkpoint_id=1, op_id=1, key_bytes=b"\x01" + bytes(16)), None)  # type: ignore[arg-type]
    with pytest.raises(NotFoundError):
        servicer.Get(pb.GetRequest(job="nobody", checkpoint_id=1, op_id=1, key_bytes=b"\x01k"), None)  # type: ignore[arg-type]


def test_hash_key_equals_hash_keys_for_every_length() -> None:
    rng = np.random.default_rng(3)
    ops = [0, 1, (1 << 64) - 1] + [int(x) for x in rng.integers(0, 2**63, 20, dtype=np.uint64)]
    for length in [*range(0, 70), 255, 256, 257, 1000]:  # across the short-key (Python int) path and numpy's
        for op in ops[:: 1 if length < 40 else 7]:
            key = rng.integers(0, 256, length, dtype=np.uint8).tobytes()
            assert hash_key(op, key) == int(hash_keys(np.array([op], np.uint64), pa.array([key], pa.binary()))[0]), (length, op)


@pytest.mark.parametrize("compact", [False, True])
def test_find_one_and_value_at_agree_with_find(compact: bool) -> None:
    rng = random.Random(9)
    keys = [bytes([rng.randrange(128)]) + rng.randbytes(rng.randrange(0, 40)) for _ in range(500)]
    ops = [rng.choice([1, 2, (1 << 64) - 1]) for _ in keys]
    rows = list(zip(ops, keys, strict=True)) + [(ops[3], keys[3])]  # one key written twice: find_one(last=True) takes the later row
    values = [f"value-{i}".encode() for i in range(len(rows))]
    table = pa.table(
        {
            "op_id": pa.array([r[0] for r in rows], pa.uint64()),
            "key_bytes": pa.array([r[1] for r in rows], pa.binary()),
            "value_bytes": pa.array(values, pa.binary()),
        }
    )
    index = KeyIndex.build_compact(table) if compact else KeyIndex.build(table)
    queries = rows + [(1, b"\x05absent"), (3, keys[0])]
    q_ops = np.array([q[0] for q in queries], np.uint64)
    q_keys = pa.array([q[1] for q in queries], pa.binary())
    found = index.find(hash_keys(q_ops, q_keys), q_keys, q_ops)
    indexed_values = index.table.column("value_bytes").to_pylist()
    for (op, key), row in zip(queries, found.tolist(), strict=True):
        assert index.find_one(op, key) == row
        assert index.find_one(op, key, hash_key(op, key)) == row
        if row >= 0:
            assert index.value_at(row) == indexed_values[row]
    twice = [index.find_one(ops[3], keys[3]), index.find_one(ops[3], keys[3], last=True)]
    assert sorted(indexed_values[r] for r in twice) == [values[3], values[-1]] and twice[0] != twice[1]


def test_gets_use_and_count_toward_the_merged_index() -> None:
    """A Get counts as a read by key like a MultiGet batch; once the merged index is built, Gets answer from it, unchanged."""
    store = MemoryStore()
    history, probe = _history(store)
    core = PoolCore(store, PoolConfig(resolved_index_after=2))
    manifest = core.reader("j").manifest(4)
    for op, key in probe[:2]:
        assert core.get("j", 4, op, key)[:2] == ((op, key) in history[4], history[4].get((op, key), b""))
    assert core.reader("j")._lookups.get(manifest.identity, 0) == 2
    for _ in range(200):  # bounded: the build is a background thread
        if core.reader("j").resolved_index(manifest) is not None:
            break
        time.sleep(0.01)
    assert core.reader("j").resolved_index(manifest) is not None
    for op, key in probe:
        assert core.get("j", 4, op, key)[:2] == ((op, key) in history[4], history[4].get((op, key), b""))
