"""PoolCore against a dict model: incremental checkpoints, several subtasks, rescale; on the file store and on moto S3."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import snapshot as s
from pool.core import PoolCore
from pool.domain import CommitRequest, KeyGroupRange, PoolConfig
from snapshot.errors import NotFoundError
from tests.pool_core_helpers import (
    OP_IDS,
    OPERATORS,
    apply,
    commit,
    filter_model,
    keyed,
    keys_in_range,
    op_key,
    random_delta,
    scan_dict,
)

FULL = KeyGroupRange(0, 127)
# tiny segments so every file has several and ranged, coalesced reads are exercised
SMALL = PoolConfig(segment_target_bytes=256, cache_bytes=1 << 20, resolved_index_after=-1)


def _check_checkpoint(core: PoolCore, job: str, cid: int, model: dict, universe: list[str], rng: random.Random) -> None:
    assert scan_dict(core, job, cid) == model
    lo = rng.randrange(0, 120)
    hi = rng.randrange(lo, 128)
    assert scan_dict(core, job, cid, KeyGroupRange(lo, hi)) == filter_model(model, lo, hi)
    op = OP_IDS["window"]
    assert scan_dict(core, job, cid, None, [op]) == filter_model(model, 0, 127, [op])
    probe = [(OP_IDS[o], keyed(u)) for o in OPERATORS for u in universe[:25]] + [
        (OP_IDS[o], op_key(f"o{i}")) for o in OPERATORS for i in range(3)
    ]
    found, values, answered = core.multi_get(job, cid, [p[0] for p in probe], [p[1] for p in probe])
    assert answered == cid
    assert found == [p in model for p in probe]
    assert values == [model.get(p, b"") for p in probe]
    # the same reads through the merged-view index a checkpoint gets once it is read often
    indexed = PoolCore(core.store, PoolConfig(resolved_index_after=0))
    assert indexed.multi_get(job, cid, [p[0] for p in probe], [p[1] for p in probe]) == (found, values, cid)


def test_twenty_incremental_checkpoints_match_the_model(store):
    rng = random.Random(7)
    job = "model-job"
    core = PoolCore(store, SMALL)
    epoch, latest = core.acquire_writer(job, FULL)
    assert latest == 0
    universe = [f"user-{i}" for i in range(60)]
    model: dict = {}
    history: dict[int, dict] = {}
    for cid in range(1, 23):
        rows = random_delta(rng, model, universe, ["o0", "o1", "o2"], 30 if cid > 1 else 120, cid)
        result = commit(core, job, cid, cid - 1, FULL, epoch, rows)
        apply(model, rows)
        history[cid] = dict(model)
        assert result.checkpoint.complete and result.checkpoint.checkpoint_id == cid
        # cost follows the delta: one new data file plus small JSON, never a copy of the parent's files
        assert result.checkpoint.num_files == cid
        assert result.bytes_written < 40_000
    assert core.acquire_writer(job, FULL)[1] == 22
    # every checkpoint, old and new, through a cold core (nothing from the writer's cache)
    cold = PoolCore(store, SMALL)
    for cid, expected in history.items():
        _check_checkpoint(cold, job, cid, expected, universe, rng)
    assert scan_dict(cold, job, 0) == history[22]
    assert [i.checkpoint_id for i in cold.list_checkpoints(job)] == list(range(1, 23))
    assert cold.list_jobs() == [job]
    stats = cold.stats()
    assert stats["cache_hits"] > 0 and stats["bytes_read"] > 0


def test_get_answers_newest_layer_and_erases_hide(file_store):
    core = PoolCore(file_store, SMALL)
    epoch, _ = core.acquire_writer("j", FULL)
    op = OP_IDS["source"]
    k = keyed("a")
    commit(core, "j", 1, 0, FULL, epoch, [(s.ROW_PUT, op, k, b"one")])
    commit(core, "j", 2, 1, FULL, epoch, [(s.ROW_PUT, op, k, b"two")])
    commit(core, "j", 3, 2, FULL, epoch, [(s.ROW_ERASE, op, k, b"")])
    commit(core, "j", 4, 3, FULL, epoch, [(s.ROW_PUT, op, keyed("b"), b"b")])
    assert core.get("j", 1, op, k) == (True, b"one", 1)
    assert core.get("j", 2, op, k) == (True, b"two", 2)
    assert core.get("j", 3, op, k) == (False, b"", 3)
    assert core.get("j", 0, op, k) == (False, b"", 4)
    assert core.get("j", 0, OP_IDS["sink"], k) == (False, b"", 4)  # same key, other operator


def test_empty_delta_commits_a_checkpoint_equal_to_its_parent(store):
    core = PoolCore(store)
    epoch, _ = core.acquire_writer("j", FULL)
    rows = [(s.ROW_PUT, OP_IDS["sink"], keyed("x"), b"1")]
    commit(core, "j", 1, 0, FULL, epoch, rows)
    result = core.commit_checkpoint(CommitRequest("j", 2, 1, FULL, epoch), [])
    assert result.checkpoint.complete and result.checkpoint.num_files == 1
    assert scan_dict(core, "j", 2) == scan_dict(core, "j", 1) == {(OP_IDS["sink"], keyed("x")): b"1"}


def test_scan_overlays_a_delta_and_filters_it(file_store):
    core = PoolCore(file_store)
    epoch, _ = core.acquire_writer("j", FULL)
    op = OP_IDS["window"]
    a, b = keys_in_range(0, 63, 2)
    far = keys_in_range(64, 127, 1)[0]
    commit(core, "j", 1, 0, FULL, epoch, [(s.ROW_PUT, op, keyed(a), b"a"), (s.ROW_PUT, op, keyed(b), b"b")])
    from tests.pool_core_helpers import changelog

    hot = changelog([(s.ROW_ERASE, op, keyed(a), b""), (s.ROW_PUT, op, keyed(far), b"far"), (s.ROW_PUT, op, op_key("z"), b"z")])
    got = scan_dict(core, "j", 1, KeyGroupRange(0, 63), delta=hot)
    assert got == {(op, keyed(b)): b"b", (op, op_key("z")): b"z"}
    got = scan_dict(core, "j", 1, None, delta=hot)
    assert got == {(op, keyed(b)): b"b", (op, keyed(far)): b"far", (op, op_key("z")): b"z"}


def test_scan_streams_in_bounded_chunks(file_store):
    core = PoolCore(file_store, PoolConfig(scan_chunk_bytes=4096))
    epoch, _ = core.acquire_writer("j", FULL)
    rows = [(s.ROW_PUT, OP_IDS["sink"], keyed(f"k{i}"), b"x" * 50) for i in range(2000)]
    commit(core, "j", 1, 0, FULL, epoch, rows)
    chunks = list(core.scan("j", 1, None, [], None))
    assert len(chunks) > 10 and all(len(c) <= 4096 for c in chunks)
    assert s.read_snapshot(b"".join(chunks)).table.num_rows == 2000


RANGES4 = [KeyGroupRange(0, 31), KeyGroupRange(32, 63), KeyGroupRange(64, 95), KeyGroupRange(96, 127)]


def _subtask_rows(rng: random.Random, model: dict, kg: KeyGroupRange, step: int, tag: str) -> list:
    universe = keys_in_range(kg.lo, kg.hi, 20)
    rows = random_delta(rng, {k: v for k, v in model.items() if k[1][0] < 128}, universe, [], 25, step)
    # operator state: each subtask keeps its own entries (like Flink list state split per subtask)
    rows.append((s.ROW_PUT, OP_IDS["source"], op_key(f"offset-{tag}"), f"{step}".encode()))
    return rows


def test_checkpoint_completes_only_when_parts_tile_all_key_groups(store):
    rng = random.Random(3)
    cores = [PoolCore(store, SMALL) for _ in RANGES4]  # one core per subtask, sharing the store
    epochs = [c.acquire_writer("job", r)[0] for c, r in zip(cores, RANGES4, strict=True)]
    assert len(set(epochs)) == 4
    model: dict = {}
    for cid in (1, 2, 3):
        for i, (core, kg, epoch) in enumerate(zip(cores, RANGES4, epochs, strict=True)):
            rows = _subtask_rows(rng, model, kg, cid, f"s{i}")
            result = commit(core, "job", cid, cid - 1, kg, epoch, rows)
            apply(model, rows)
            last = i == len(RANGES4) - 1
            assert result.checkpoint.complete == last
            if not last:
                # staged but invisible: not listed, not readable
                assert cid not in [c.checkpoint_id for c in cores[0].list_checkpoints("job")]
                with pytest.raises(NotFoundError):
                    list(cores[0].scan("job", cid, None, [], None))
                staged = [c for c in cores[0].list_checkpoints("job", include_incomplete=True) if c.checkpoint_id == cid]
                assert [r.lo for r in staged[0].committed_ranges] == [r.lo for r in RANGES4[: i + 1]]
                assert cores[0].acquire_writer("other", FULL)[1] == 0
        assert scan_dict(cores[1], "job", cid) == model
        info = cores[2].list_checkpoints("job")[-1]
        assert info.checkpoint_id == cid and info.committed_ranges == tuple(RANGES4)
        for i, kg in enumerate(RANGES4):
            assert scan_dict(cores[3], "job", cid, kg) == filter_model(model, kg.lo, kg.hi)
            assert model[(OP_IDS["source"], op_key(f"offset-s{i}"))] == str(cid).encode()


def test_operator_state_collisions_follow_the_merge_rule(file_store):
    core = PoolCore(file_store)
    halves = [KeyGroupRange(0, 63), KeyGroupRange(64, 127)]
    epochs = [core.acquire_writer("j", r)[0] for r in halves]
    src = OP_IDS["source"]
    big = (5).to_bytes(8, "little", signed=True)
    small = (3).to_bytes(8, "little", signed=True)
    commit(core, "j", 1, 0, halves[0], epochs[0], [(s.ROW_PUT, src, op_key("watermark"), small), (s.ROW_PUT, src, op_key("name"), b"low")])
    commit(core, "j", 1, 0, halves[1], epochs[1], [(s.ROW_PUT, src, op_key("watermark"), big), (s.ROW_PUT, src, op_key("name"), b"high")])
    got = scan_dict(core, "j", 1)
    assert got[(src, op_key("watermark"))] == big  # 8-byte operator values: the greater little-endian int64
    assert got[(src, op_key("name"))] == b"low"  # otherwise the part with the lowest key groups wins
    assert core.get("j", 1, src, op_key("watermark")) == (True, big, 1)


@pytest.mark.parametrize(
    "new_ranges",
    [[KeyGroupRange(0, 63), KeyGroupRange(64, 127)], [KeyGroupRange(i * 16, i * 16 + 15) for i in range(8)]],
    ids=["4to2", "4to8"],
)
def test_rescale_from_four_subtasks(store, new_ranges):
    rng = random.Random(11)
    core = PoolCore(store, SMALL)
    old_epochs = [core.acquire_writer("job", r)[0] for r in RANGES4]
    keyed_model: dict = {}
    for cid in (1, 2):
        for kg, epoch in zip(RANGES4, old_epochs, strict=True):
            rows = random_delta(rng, keyed_model, keys_in_range(kg.lo, kg.hi, 15), [], 20, cid)
            commit(core, "job", cid, cid - 1, kg, epoch, rows)
            apply(keyed_model, rows)
    assert scan_dict(core, "job", 2) == keyed_model
    # the new parallelism: every new writer fences the old ones it overlaps
    new_epochs = [core.acquire_writer("job", r)[0] for r in new_ranges]
    from snapshot.errors import FencedError

    with pytest.raises(FencedError):
        commit(core, "job", 3, 2, RANGES4[0], old_epochs[0], [])
    for cid in (3, 4):
        for kg, epoch in zip(new_ranges, new_epochs, strict=True):
            rows = random_delta(
                rng, {k: v for k, v in keyed_model.items() if kg.lo <= k[1][0] <= kg.hi}, keys_in_range(kg.lo, kg.hi, 15), [], 20, cid
            )
            commit(core, "job", cid, cid - 1, kg, epoch, rows)
            apply(keyed_model, rows)
        cold = PoolCore(store, SMALL)
        assert scan_dict(cold, "job", cid) == keyed_model
        for kg in new_ranges:
            assert scan_dict(cold, "job", cid, kg) == filter_model(keyed_model, kg.lo, kg.hi)
        probe = list(keyed_model)[:40]
        found, values, _ = cold.multi_get("job", cid, [p[0] for p in probe], [p[1] for p in probe])
        assert all(found) and values == [keyed_model[p] for p in probe]
    # a part of the rescaled checkpoint references parent files, it does not copy them
    info = core.list_checkpoints("job")[-1]
    assert info.num_files > len(new_ranges) * 2


_PARALLELISM = st.sampled_from([1, 2, 3, 4, 8])


def _ranges(p: int) -> list[KeyGroupRange]:
    bounds = [round(i * 128 / p) for i in range(p + 1)]
    return [KeyGroupRange(bounds[i], bounds[i + 1] - 1) for i in range(p)]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(plan=st.lists(st.tuples(_PARALLELISM, st.integers(0, 2**32)), min_size=2, max_size=6))
def test_random_rescales_match_the_model(tmp_path_factory, plan):
    """Checkpoints at randomly changing parallelism; every checkpoint scans and reads as the model says."""
    from store.local import FileStore

    store = FileStore(tmp_path_factory.mktemp("rescale"))
    core = PoolCore(store, SMALL)
    model: dict = {}
    history = {}
    for cid, (p, seed) in enumerate(plan, start=1):
        rng = random.Random(seed)
        for n, kg in enumerate(_ranges(p)):
            epoch, _ = core.acquire_writer("job", kg)
            own = {k: v for k, v in model.items() if k[1][0] < 128 and kg.lo <= k[1][0] <= kg.hi}
            rows = random_delta(rng, own, keys_in_range(kg.lo, kg.hi, 12), [], 15, cid)
            rows.append((s.ROW_PUT, OP_IDS["sink"], op_key(f"c{cid}-s{n}"), b"op"))  # operator rows of every part are kept
            commit(core, "job", cid, cid - 1, kg, epoch, rows)
            apply(model, rows)
        history[cid] = dict(model)
    cold = PoolCore(store, SMALL)
    for cid, expected in history.items():
        assert scan_dict(cold, "job", cid) == expected
        kg = _ranges(3)[1]
        assert scan_dict(cold, "job", cid, kg) == filter_model(expected, kg.lo, kg.hi)
        probe = list(expected)[:30] + [(OP_IDS["sink"], keyed("absent-key"))]
        for reader in (cold, PoolCore(store, PoolConfig(resolved_index_after=0))):
            found, values, _ = reader.multi_get("job", cid, [k[0] for k in probe], [k[1] for k in probe])
            assert found == [True] * (len(probe) - 1) + [False] and values == [expected[k] for k in probe[:-1]] + [b""]


def test_often_read_checkpoint_gets_a_merged_index_in_the_background(file_store):
    import time

    core = PoolCore(file_store, PoolConfig(resolved_index_after=2))
    epoch, _ = core.acquire_writer("j", FULL)
    rows = [(s.ROW_PUT, OP_IDS["source"], keyed(f"k{i}"), str(i).encode()) for i in range(500)] + [
        (s.ROW_PUT, OP_IDS["sink"], op_key("o"), b"op")
    ]
    commit(core, "j", 1, 0, FULL, epoch, rows)
    commit(
        core,
        "j",
        2,
        1,
        FULL,
        epoch,
        [(s.ROW_ERASE, OP_IDS["source"], keyed("k1"), b""), (s.ROW_PUT, OP_IDS["source"], keyed("k2"), b"two")],
    )
    ops = [OP_IDS["source"]] * 4 + [OP_IDS["sink"]]
    keys = [keyed("k0"), keyed("k1"), keyed("k2"), keyed("nope"), op_key("o")]
    expected = ([True, False, True, False, True], [b"0", b"", b"two", b"", b"op"], 2)
    reader = core.reader("j")
    manifest = reader.manifest(2)
    deadline = time.monotonic() + 20
    while reader.resolved_index(manifest) is None:  # bounded: the build is a background thread
        assert core.multi_get("j", 2, ops, keys) == expected
        assert time.monotonic() < deadline, "the merged index was never built"
        time.sleep(0.01)
    assert core.multi_get("j", 2, ops, keys) == expected  # now answered by the merged index
