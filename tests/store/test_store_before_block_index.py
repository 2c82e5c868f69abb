"""A store written before block indexes (manifest version 2, one record batch per segment) still reads, and a job on it goes on."""

from __future__ import annotations

import json
import random
import shutil

import pytest

from pool.core import PoolCore
from pool.domain import KeyGroupRange, PoolConfig
from pool.lifecycle import Lifecycle
from store.manifest import MANIFEST_VERSION, metadata_key
from store.objects import open_store
from tests.pool_core_helpers import OLD_STORE_FIXTURE, apply, commit, old_store_expected, random_delta, scan_dict

FULL = KeyGroupRange(0, 127)


@pytest.fixture
def old_store(tmp_path):
    shutil.copytree(OLD_STORE_FIXTURE / "jobs", tmp_path / "jobs")
    return open_store(tmp_path.as_uri())


def test_the_fixture_really_is_the_old_layout(old_store):
    for cid in range(1, 6):
        raw = json.loads(old_store.get(metadata_key("legacy", cid)))
        assert raw["version"] == 2
        assert all("index" not in seg for f in raw["files"] for seg in f["segments"])


@pytest.mark.parametrize("cache_bytes", [2048, 256 << 20], ids=["tiny-cache", "big-cache"])
def test_old_checkpoints_scan_and_read_by_key(old_store, cache_bytes):
    core = PoolCore(old_store, PoolConfig(cache_bytes=cache_bytes, resolved_index_after=-1))
    for cid, model in old_store_expected().items():
        assert scan_dict(core, "legacy", cid) == model
        queries = sorted(model) + [(op, key + b"-absent") for op, key in sorted(model)[:30]]
        found, values, _ = core.multi_get("legacy", cid, [q[0] for q in queries], [q[1] for q in queries])
        assert list(found) == [q in model for q in queries]
        assert [v for v, f in zip(values, found, strict=True) if f] == [model[q] for q in queries if q in model]
        for op, key in queries[::17]:
            assert core.get("legacy", cid, op, key)[:2] == ((True, model[(op, key)]) if (op, key) in model else (False, b""))


def test_a_job_restored_from_an_old_checkpoint_writes_block_indexed_files_over_old_ones(old_store):
    model = dict(old_store_expected()[5])
    core = PoolCore(old_store, PoolConfig(segment_target_bytes=2048, block_target_bytes=512))
    epoch, _ = core.acquire_writer("legacy", FULL, restore_from=5)
    rng = random.Random(5)
    universe = sorted({key.decode("latin-1") for _, key in model})
    for cid in (6, 7):
        rows = random_delta(rng, model, [f"new-{i}" for i in range(200)] + universe[:50], ["offsets"], 300, cid)
        last = {(r[1], r[2]): r for r in rows}  # one row per key in a delta
        rows = list(last.values())
        apply(model, rows)
        commit(core, "legacy", cid, cid - 1, FULL, epoch, rows)
    raw = json.loads(old_store.get(metadata_key("legacy", 7)))
    assert raw["version"] == MANIFEST_VERSION
    assert {o["rows"] for o in raw["anatomy"]["operators"]} == {None}  # old files: their operators are not counted
    kinds = {("index" in f["segments"][0]) if f["segments"] else None for f in raw["files"]}
    assert kinds == {True, False}  # old files (no index) and new ones (indexed) in one checkpoint
    for cache_bytes in (2048, 256 << 20):
        reader = PoolCore(old_store, PoolConfig(cache_bytes=cache_bytes, resolved_index_after=-1))
        assert scan_dict(reader, "legacy", 7) == model
        queries = sorted(model)
        found, values, _ = reader.multi_get("legacy", 7, [q[0] for q in queries], [q[1] for q in queries])
        assert all(found) and list(values) == [model[q] for q in queries]
    Lifecycle(old_store).compact("legacy", 7, force=True)  # folds old and new files into a new base
    assert scan_dict(PoolCore(old_store), "legacy", 7) == model
