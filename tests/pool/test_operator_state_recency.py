"""Operator state across parts by recency: the newest checkpoint that put or erased a key decides (rescale, compaction, savepoints)."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import snapshot as s
from pool.core import PoolCore
from pool.domain import KeyGroupRange, PoolConfig
from pool.lifecycle import Lifecycle, LifecycleConfig
from store.checkpoint import CheckpointReader
from store.local import FileStore
from store.segment_cache import SegmentCache
from tests.pool_core_helpers import OP_IDS, commit, keyed, keys_in_range, op_key, scan_dict

A, B = KeyGroupRange(0, 63), KeyGroupRange(64, 127)
QUARTERS = [KeyGroupRange(0, 31), KeyGroupRange(32, 63), KeyGroupRange(64, 95), KeyGroupRange(96, 127)]
OP = OP_IDS["window"]
K = op_key("K")
CONFIG = PoolConfig(segment_target_bytes=256, cache_bytes=1 << 20, resolved_index_after=-1)


def put(key: bytes, value: bytes, op: int = OP) -> tuple:
    return (s.ROW_PUT, op, key, value)


def erase(key: bytes, op: int = OP) -> tuple:
    return (s.ROW_ERASE, op, key, b"")


def keyed_rows(kg: KeyGroupRange, tag: str) -> list[tuple]:
    """A keyed put inside kg, so a subtask that leaves K alone still writes a layer."""
    return [put(keyed(keys_in_range(kg.lo, kg.hi, 1, tag)[0]), tag.encode())]


def views(store, job: str, cid: int) -> list[tuple[bool, bytes]]:
    """K as every read path sees it: scans (whole, a range, op filter), Get, MultiGet, merged index, and the CLI's reader."""
    out = []
    for cfg in (CONFIG, PoolConfig(resolved_index_after=0)):
        core = PoolCore(store, cfg)
        for kg, ops in ((None, ()), (KeyGroupRange(70, 80), ()), (None, [OP])):
            d = scan_dict(core, job, cid, kg, ops)
            out.append(((OP, K) in d, d.get((OP, K), b"")))
        found, value, _ = core.get(job, cid, OP, K)
        out.append((found, value))
        found_many, values, _ = core.multi_get(job, cid, [OP, OP], [K, keyed("x")])
        out.append((found_many[0], values[0]))
    reader = CheckpointReader(store, job)  # what clink/tools/stored.py (the CLI) opens
    table = reader.read_manifest_table(reader.manifest(cid))
    d = dict(
        zip(
            zip(table.column("op_id").to_pylist(), table.column("key_bytes").to_pylist(), strict=True),
            table.column("value_bytes").to_pylist(),
            strict=True,
        )
    )
    out.append(((OP, K) in d, d.get((OP, K), b"")))
    return out


def assert_k(store, job: str, cid: int, expected: bytes | None) -> None:
    want = (expected is not None, expected or b"")
    assert views(store, job, cid) == [want] * len(views(store, job, cid))


def two_subtask_history(core: PoolCore, job: str) -> tuple[int, int]:
    """Checkpoint 1: both subtasks put K=v1; checkpoint 2: only B puts K=v2. Returns the epochs of A and B."""
    ea, _ = core.acquire_writer(job, A)
    eb, _ = core.acquire_writer(job, B)
    commit(core, job, 1, 0, A, ea, [put(K, b"v1"), *keyed_rows(A, "a1")])
    commit(core, job, 1, 0, B, eb, [put(K, b"v1"), *keyed_rows(B, "b1")])
    commit(core, job, 2, 1, A, ea, keyed_rows(A, "a2"))
    commit(core, job, 2, 1, B, eb, [put(K, b"v2"), *keyed_rows(B, "b2")])
    return ea, eb


@pytest.mark.parametrize("backend", ["file_store", "s3_store"])
def test_newest_put_and_erase_of_one_subtask_win_over_the_others_inherited_copy(backend, request):
    store = request.getfixturevalue(backend)
    core = PoolCore(store, CONFIG)
    ea, eb = two_subtask_history(core, "j")
    assert_k(store, "j", 1, b"v1")
    assert_k(store, "j", 2, b"v2")
    commit(core, "j", 3, 2, A, ea, [erase(K), *keyed_rows(A, "a3")])
    commit(core, "j", 3, 2, B, eb, keyed_rows(B, "b3"))
    assert_k(store, "j", 3, None)
    commit(core, "j", 4, 3, A, ea, keyed_rows(A, "a4"))
    commit(core, "j", 4, 3, B, eb, [put(K, b"v4"), *keyed_rows(B, "b4")])
    assert_k(store, "j", 4, b"v4")
    # keyed state is untouched by the rule: every subtask's keyed puts are there
    d = scan_dict(core, "j", 4)
    for tag, kg in (("a1", A), ("a4", A), ("b1", B), ("b4", B)):
        assert d[(OP, keyed(keys_in_range(kg.lo, kg.hi, 1, tag)[0]))] == tag.encode()


def test_same_checkpoint_collisions_keep_the_formats_merge_rule(file_store):
    core = PoolCore(file_store, CONFIG)
    ea, eb = two_subtask_history(core, "j")
    n8 = op_key("n8")
    commit(core, "j", 3, 2, A, ea, [put(K, b"a3"), put(n8, (5).to_bytes(8, "little")), erase(op_key("gone"))])
    commit(core, "j", 3, 2, B, eb, [put(K, b"b3"), put(n8, (9).to_bytes(8, "little")), put(op_key("gone"), b"kept")])
    d = scan_dict(core, "j", 3)
    assert d[(OP, K)] == b"a3"  # non-8-byte values: the lowest key groups win
    assert d[(OP, n8)] == (9).to_bytes(8, "little")  # 8-byte values: the greater int64
    assert d[(OP, op_key("gone"))] == b"kept"  # a put in the same checkpoint beats an erase, as the merged views did


@pytest.mark.parametrize("backend", ["file_store", "s3_store"])
def test_recency_survives_a_rescale_from_two_subtasks_to_four(backend, request):
    store = request.getfixturevalue(backend)
    core = PoolCore(store, CONFIG)
    two_subtask_history(core, "j")
    epochs = [core.acquire_writer("j", kg)[0] for kg in QUARTERS]
    for kg, e in zip(QUARTERS, epochs, strict=True):
        commit(core, "j", 3, 2, kg, e, keyed_rows(kg, f"q3-{kg.lo}"))
    assert_k(store, "j", 3, b"v2")  # every quarter inherits both parents' layers; B's newer put still wins
    for kg, e in zip(QUARTERS, epochs, strict=True):
        commit(core, "j", 4, 3, kg, e, [erase(K)] if kg.lo == 32 else keyed_rows(kg, f"q4-{kg.lo}"))
    assert_k(store, "j", 4, None)
    for kg, e in zip(QUARTERS, epochs, strict=True):
        commit(core, "j", 5, 4, kg, e, [put(K, b"v5")] if kg.lo == 96 else [])
    assert_k(store, "j", 5, b"v5")


@pytest.mark.parametrize("backend", ["file_store", "s3_store"])
def test_compacting_one_part_does_not_resurrect_older_operator_state(backend, request):
    store = request.getfixturevalue(backend)
    core = PoolCore(store, CONFIG)
    ea, eb = two_subtask_history(core, "j")
    commit(core, "j", 3, 2, A, ea, keyed_rows(A, "a3"))
    commit(core, "j", 3, 2, B, eb, [])  # B's part keeps 2 layers, A's has 3: only A's is over the threshold
    life = Lifecycle(
        store, LifecycleConfig(compact_max_layers=2), cache=SegmentCache(8 << 20), on_manifest_replaced=lambda *_: core.cache.clear()
    )
    before = scan_dict(PoolCore(store, CONFIG), "j", 3)
    result = life.compact("j", 3)
    assert [(lo, hi) for lo, hi, _ in result.folded] == [(0, 63)]
    assert scan_dict(PoolCore(store, CONFIG), "j", 3) == before
    assert_k(store, "j", 3, b"v2")
    # later checkpoints on top of A's base: nobody touches K, then B erases it, then A puts it again
    commit(core, "j", 4, 3, A, ea, keyed_rows(A, "a4"))
    commit(core, "j", 4, 3, B, eb, keyed_rows(B, "b4"))
    assert_k(store, "j", 4, b"v2")
    commit(core, "j", 5, 4, A, ea, [])
    commit(core, "j", 5, 4, B, eb, [erase(K)])
    assert_k(store, "j", 5, None)
    commit(core, "j", 6, 5, A, ea, [put(K, b"v6")])
    commit(core, "j", 6, 5, B, eb, [])
    assert_k(store, "j", 6, b"v6")


def test_savepoint_fold_and_restore_keep_the_newest_operator_state(file_store):
    core = PoolCore(file_store, CONFIG)
    ea, eb = two_subtask_history(core, "j")
    life = Lifecycle(file_store, cache=SegmentCache(8 << 20))
    life.savepoint("j", 2, "sp")
    reader, manifest, _ = life.open_savepoint("sp")
    folded = life.read_table(reader, manifest)
    assert (
        dict(
            zip(
                zip(folded.column("op_id").to_pylist(), folded.column("key_bytes").to_pylist(), strict=True),
                folded.column("value_bytes").to_pylist(),
                strict=True,
            )
        )[(OP, K)]
        == b"v2"
    )
    for source in ({"savepoint": "sp"}, {"job": "j", "checkpoint_id": 2}):
        new = f"r-{len(source)}"
        life.restore_job(new, **source)
        assert_k(file_store, new, 1, b"v2")
        na, _ = core.acquire_writer(new, A)
        nb, _ = core.acquire_writer(new, B)
        commit(core, new, 2, 1, A, na, [erase(K)])  # a commit after the restore is newer than everything restored
        commit(core, new, 2, 1, B, nb, [])
        assert_k(file_store, new, 2, None)
        commit(core, new, 3, 2, A, na, [])
        commit(core, new, 3, 2, B, nb, [put(K, b"v3")])
        assert_k(file_store, new, 3, b"v3")


def _merge_rule(values: list[bytes]) -> bytes:
    """The format's collision rule over puts in key-group order."""
    if all(len(v) == 8 for v in values):
        return max(values, key=lambda v: int.from_bytes(v, "little", signed=True))
    return values[0]


OP_KEYS = [op_key(f"o{i}") for i in range(4)]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    plan=st.lists(
        st.tuples(st.lists(st.integers(1, 127), max_size=3), st.integers(0, 2**16), st.booleans()),
        min_size=2,
        max_size=6,
    ),
)
def test_operator_state_matches_a_model_applied_in_checkpoint_order(tmp_path_factory, plan):
    store = FileStore(tmp_path_factory.mktemp("rec"))
    core = PoolCore(store, CONFIG)
    life = Lifecycle(
        store, LifecycleConfig(compact_max_layers=2), cache=SegmentCache(8 << 20), on_manifest_replaced=lambda *_: core.cache.clear()
    )
    model: dict[tuple[int, bytes], bytes] = {}
    ranges: list[KeyGroupRange] = []
    epochs: dict[KeyGroupRange, int] = {}
    for cid, (cuts, seed, compact) in enumerate(plan, start=1):
        rng = random.Random(seed)
        bounds = [0, *sorted(set(cuts)), 128]
        new_ranges = [KeyGroupRange(a, b - 1) for a, b in zip(bounds, bounds[1:], strict=False)]
        if new_ranges != ranges:  # a rescale: new writers fence the old ones
            ranges = new_ranges
            epochs = {kg: core.acquire_writer("j", kg)[0] for kg in ranges}
        changes: list[dict[tuple[int, bytes], bytes | None]] = []
        for kg in ranges:
            rows, mine = [], {}
            for _ in range(rng.randint(0, 4)):
                op, key = rng.choice([OP_IDS["window"], OP_IDS["sink"]]), rng.choice(OP_KEYS)
                if rng.random() < 0.3:
                    rows.append(erase(key, op))
                    mine[(op, key)] = None
                else:
                    value = rng.randint(-50, 50).to_bytes(8, "little", signed=True) if rng.random() < 0.5 else f"c{cid}-{kg.lo}".encode()
                    rows.append(put(key, value, op))
                    mine[(op, key)] = value
            commit(core, "j", cid, cid - 1, kg, epochs[kg], rows)
            changes.append(mine)
        for key in {k for c in changes for k in c}:
            puts = [c[key] for c in changes if c.get(key) is not None]
            if puts:
                model[key] = _merge_rule(puts)
            else:
                model.pop(key, None)
        if compact:
            life.compact("j", cid)
        d = scan_dict(PoolCore(store, CONFIG), "j", cid)
        assert {k: v for k, v in d.items() if k[1][0] >= 128} == model
        probe = [(op, k) for op in (OP_IDS["window"], OP_IDS["sink"]) for k in OP_KEYS]
        for cfg in (CONFIG, PoolConfig(resolved_index_after=0)):
            found, values, _ = PoolCore(store, cfg).multi_get("j", cid, [p[0] for p in probe], [p[1] for p in probe])
            assert found == [p in model for p in probe]
            assert values == [model.get(p, b"") for p in probe]
