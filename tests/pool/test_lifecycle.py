"""Lifecycle on moto S3: savepoints, restore at another parallelism, pins, retention, compaction and GC against dict models."""

from __future__ import annotations

import random
import time

import pytest

import snapshot as s
from pool.core import PoolCore
from pool.domain import KeyGroupRange
from pool.lifecycle import Lifecycle, LifecycleConfig
from snapshot.errors import ConflictError, InvalidArgumentError, NotFoundError
from store.layout import GC_MARKER, savepoint_prefix
from store.manifest import job_prefix, parse_manifest
from tests.lifecycle_helpers import HALVES, OP_KEYS, UNIVERSE, build_job, delta_for, fresh, scan_checkpoint, scan_savepoint
from tests.pool_core_helpers import OP_IDS, Model, apply, commit, keyed, op_key


class Clock:
    """Real time plus a settable offset, so GC can see files as old without sleeping."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


def in_range(model: Model, lo: int, hi: int) -> Model:
    return {k: v for k, v in model.items() if k[1][0] >= 128 or lo <= k[1][0] <= hi}


def copy_prefix(src, dst, prefix: str, dst_prefix: str | None = None) -> int:
    n = 0
    for info in src.list(prefix):
        dst.put((dst_prefix or prefix) + info.key[len(prefix) :], src.get(info.key))
        n += 1
    return n


# ---- savepoints and restore ---------------------------------------------------------------------------------------


def test_savepoint_is_self_contained_and_restores_a_new_job_at_another_parallelism(s3_store):
    core = PoolCore(s3_store)
    life = Lifecycle(s3_store)
    rng = random.Random(1)
    models = build_job(core, "orders", 8, rng)
    info = life.savepoint("orders", 6, "release-1")
    # one folded file per part of the checkpoint (two subtasks wrote it): the parallelism it was taken at is kept
    assert (info.job, info.checkpoint_id, info.files, info.parallelism) == ("orders", 6, 2, 2)
    assert scan_savepoint(s3_store, "release-1") == models[6]
    keys = [o.key for o in s3_store.list(savepoint_prefix("release-1"))]
    assert "savepoints/release-1/_metadata" in keys and len(keys) == 3
    assert all(k.startswith("savepoints/release-1/data/") for k in keys if not k.endswith("/_metadata"))
    meta = parse_manifest(s3_store.get("savepoints/release-1/_metadata"), "sp")
    assert all(f.path.startswith("data/") for f in meta.files)

    life.restore_job("orders-v2", savepoint="release-1")
    assert scan_checkpoint(s3_store, "orders-v2", 1) == models[6]
    # four workers take the key groups the old job split in two, and commit on top of the restored checkpoint
    quarters = [KeyGroupRange(32 * i, 32 * i + 31) for i in range(4)]
    epochs = [core.acquire_writer("orders-v2", kg)[0] for kg in quarters]
    model = dict(models[6])
    for cid in (2, 3):
        for i, kg in enumerate(quarters):
            rows = delta_for(rng, model, kg, 20, 100 + cid, op_rows=i == 0, op_erase=False)
            apply(model, rows)
            commit(core, "orders-v2", cid, cid - 1, kg, epochs[i], rows)
    assert scan_checkpoint(s3_store, "orders-v2", 3) == model
    for lo in (0, 32, 64, 96):
        assert scan_checkpoint(s3_store, "orders-v2", 3, (lo, lo + 31)) == in_range(model, lo, lo + 31)

    # restore from a checkpoint too: files are copied, so deleting the old job's data never harms the new one
    life.restore_job("orders-v3", job="orders", checkpoint_id=8)
    for o in list(s3_store.list(job_prefix("orders"))):
        s3_store.delete(o.key)
    assert scan_checkpoint(s3_store, "orders-v3", 1) == models[8]
    assert scan_savepoint(s3_store, "release-1") == models[6]


def test_relocated_savepoint_restores_and_scans_equal(s3_store, make_s3_store, make_file_store):
    core = PoolCore(s3_store)
    models = build_job(core, "j", 5, random.Random(2))
    archive = make_s3_store(prefix="cold/archive")
    Lifecycle(s3_store).savepoint("j", 5, "nightly", target_store=archive)  # archival straight into another bucket
    assert not list(s3_store.list("savepoints/"))
    other_bucket = make_s3_store(prefix="elsewhere")
    local = make_file_store("copied")
    assert copy_prefix(archive, other_bucket, "savepoints/nightly/") == 3
    copy_prefix(archive, local, "savepoints/nightly/")
    for where in (archive, other_bucket, local):
        assert scan_savepoint(where, "nightly") == models[5]
        assert scan_savepoint(where, "nightly", (10, 20)) == in_range(models[5], 10, 20)
        target = make_file_store(f"restored-{len(list(local.list('')))}-{id(where)}")
        Lifecycle(target).restore_job("j2", savepoint="nightly", source_store=where)
        assert scan_checkpoint(target, "j2", 1) == models[5]


def test_bad_savepoint_and_restore_requests_change_nothing(s3_store):
    core = PoolCore(s3_store)
    build_job(core, "j", 2, random.Random(3))
    life = Lifecycle(s3_store)
    before = sorted(o.key for o in s3_store.list(""))
    for name in ("../x", "a/b", "", "x" * 200, "bad\nname"):
        with pytest.raises(InvalidArgumentError, match="savepoint name"):
            life.savepoint("j", 1, name)
    with pytest.raises(NotFoundError, match="checkpoint 9"):
        life.savepoint("j", 9, "sp")
    with pytest.raises(NotFoundError, match="savepoint 'nope'"):
        life.restore_job("k", savepoint="nope")
    with pytest.raises(InvalidArgumentError, match="exactly one source"):
        life.restore_job("k")
    assert sorted(o.key for o in s3_store.list("")) == before
    life.savepoint("j", 2, "sp")
    with pytest.raises(ConflictError, match="already exists"):
        life.savepoint("j", 1, "sp")
    with pytest.raises(ConflictError, match="already exists"):
        life.restore_job("j", savepoint="sp")


def test_restore_reports_a_damaged_savepoint_file_by_name(s3_store):
    build_job(PoolCore(s3_store), "j", 2, random.Random(4))
    life = Lifecycle(s3_store)
    life.savepoint("j", 2, "sp")
    key = next(o.key for o in s3_store.list("savepoints/sp/data/"))
    data = bytearray(s3_store.get(key))
    data[len(data) // 2] ^= 0xFF
    s3_store.put(key, bytes(data))
    with pytest.raises(s.ChecksumMismatchError, match=key.split("/")[-1]):
        life.restore_job("k", savepoint="sp")
    assert not list(s3_store.list("jobs/k/"))


# ---- clipped reads ------------------------------------------------------------------------------------------------


def test_an_eighth_of_a_savepoint_fetches_about_an_eighth_of_its_bytes(s3_store):
    core = PoolCore(s3_store)
    epoch = core.acquire_writer("big", KeyGroupRange(0, 127))[0]
    names = [f"user-{i}" for i in range(30000)]
    rows = [(s.ROW_PUT, OP_IDS["window"], keyed(n), b"x" * 40) for n in names]
    commit(core, "big", 1, 0, KeyGroupRange(0, 127), epoch, rows)
    Lifecycle(s3_store).savepoint("big", 1, "sp")
    data_size = sum(o.size for o in s3_store.list("savepoints/sp/data/"))
    meta_size = s3_store.head("savepoints/sp/_metadata").size
    life = fresh(s3_store)
    reader, manifest, _ = life.open_savepoint("sp")
    s3_store.counters.reset()
    table = life.read_table(reader, manifest, (16, 31))
    fetched = s3_store.counters.bytes_read
    assert table.num_rows == sum(1 for n in names if 16 <= s.key_group(n.encode()) <= 31)
    assert fetched <= 1.25 * data_size / 8 + 4096, (fetched, data_size)
    assert s3_store.counters.requests.get("get_range") == 1  # one coalesced ranged GET for the contiguous segments
    del meta_size


# ---- pins and retention -------------------------------------------------------------------------------------------


def test_retention_keeps_the_newest_and_pinned_checkpoints_never_savepoints(s3_store):
    clock = Clock()
    core = PoolCore(s3_store)
    models = build_job(core, "j", 7, random.Random(5))
    life = Lifecycle(s3_store, LifecycleConfig(retain_last=2, gc_min_age_s=60), clock=clock)
    life.savepoint("j", 1, "first")
    life.pin("j", 3, "reader-a", ttl_s=30)
    life.pin("j", 4, "reader-b", ttl_s=1000)
    clock.offset = 100  # reader-a's pin has expired
    dry = life.retain("j", dry_run=True)
    assert dry.deleted == (1, 2, 3, 5) and dry.pinned == (4,)
    assert [c.checkpoint_id for c in core.list_checkpoints("j")] == list(range(1, 8))
    res = life.retain("j")
    assert (res.deleted, res.kept, res.pinned) == ((1, 2, 3, 5), (6, 7), (4,))
    assert [c.checkpoint_id for c in PoolCore(s3_store).list_checkpoints("j")] == [4, 6, 7]
    gc = life.gc("j")
    assert any(k.endswith("pins/3/reader-a.json") for k in gc.deleted)
    for cid in (4, 6, 7):
        assert scan_checkpoint(s3_store, "j", cid) == models[cid]
    assert scan_savepoint(s3_store, "first") == models[1]
    life.unpin("j", 4, "reader-b")
    assert life.retain("j").deleted == (4,)
    with pytest.raises(InvalidArgumentError, match="pin holder"):
        life.pin("j", 7, "../x", 10)
    with pytest.raises(InvalidArgumentError, match="ttl"):
        life.pin("j", 7, "r", 0)
    with pytest.raises(NotFoundError):
        life.pin("j", 2, "r", 10)


# ---- compaction ---------------------------------------------------------------------------------------------------


def test_compaction_folds_layers_and_every_read_answers_the_same(s3_store):
    core = PoolCore(s3_store)
    rng = random.Random(6)
    models = build_job(core, "j", 12, rng)
    life = Lifecycle(s3_store, LifecycleConfig(compact_max_layers=8), on_manifest_replaced=lambda j, c: core.reader(j).forget(c))
    reader, before_m, _ = fresh(s3_store).open_checkpoint("j", 12)
    ranges = [(0, 127), (0, 63), (64, 127), (10, 90), (100, 101)]
    before = {r: scan_checkpoint(s3_store, "j", 12, r) for r in ranges}
    probe_keys = [keyed(k) for k in UNIVERSE[:100]] + [op_key(k) for k in OP_KEYS]
    probe_ops = [OP_IDS["window"]] * 100 + [OP_IDS["source"]] * len(OP_KEYS)
    gets_before = core.multi_get("j", 12, probe_ops, probe_keys)
    result = life.compact("j")
    assert result.checkpoint_id == 12 and sorted(r[:2] for r in result.folded) == [(0, 63), (64, 127)]
    assert all(n == 12 for *_, n in result.folded)
    _, after_m, _ = fresh(s3_store).open_checkpoint("j", 12)
    assert all(len(p.layers) == 1 for p in after_m.parts) and after_m.created_at_ms == before_m.created_at_ms
    assert {r: scan_checkpoint(s3_store, "j", 12, r) for r in ranges} == before
    assert before[(0, 127)] == models[12]
    assert PoolCore(s3_store).multi_get("j", 12, probe_ops, probe_keys) == gets_before
    assert life.compact("j").folded == ()  # nothing over the threshold any more
    # the next commit builds on the base
    model = dict(models[12])
    epochs = [core.acquire_writer("j", kg)[0] for kg in HALVES]
    for i, kg in enumerate(HALVES):
        rows = delta_for(rng, model, kg, 10, 13, op_rows=i == 0)
        apply(model, rows)
        commit(core, "j", 13, 12, kg, epochs[i], rows)
    _, m13, _ = fresh(s3_store).open_checkpoint("j", 13)
    assert all(len(p.layers) == 2 and m13.file(p.layers[0][0]).kind == "base" for p in m13.parts)
    assert scan_checkpoint(s3_store, "j", 13) == model
    assert scan_checkpoint(s3_store, "j", 11) == models[11]  # older checkpoints still read their own layers
    # once the pre-compaction checkpoints leave retention, GC frees their layers: 13 names the base and its delta only
    clock = Clock()
    clock.offset = 120
    cleaner = Lifecycle(s3_store, LifecycleConfig(retain_last=1, gc_min_age_s=60), clock=clock)
    assert cleaner.retain("j").deleted == tuple(range(1, 13))
    freed = cleaner.gc("j")
    assert len(freed.deleted) == 24  # the twelve deltas of each half
    assert {o.key for o in s3_store.list("jobs/j/data/")} == {f"jobs/j/{f.path}" for f in m13.files}
    assert scan_checkpoint(s3_store, "j", 13) == model


def test_a_compaction_that_races_a_change_replaces_nothing(s3_store):
    build_job(PoolCore(s3_store), "j", 4, random.Random(7))
    life = Lifecycle(s3_store)
    key = "jobs/j/chk-4/_metadata"
    original = s3_store.get(key)
    real_cas = s3_store.compare_and_swap

    def racing_cas(k, data, etag):
        s3_store.put(k, original + b" ")  # another writer replaced the manifest (new etag) first
        return real_cas(k, data, etag)

    s3_store.compare_and_swap = racing_cas
    with pytest.raises(ConflictError, match="while compacting"):
        life.compact("j", 4, force=True)
    del s3_store.compare_and_swap
    assert s3_store.get(key) == original + b" "


# ---- garbage collection -------------------------------------------------------------------------------------------


def referenced_keys(store, job: str) -> set[str]:
    """Every data file a manifest or staged part of the job names (computed independently of the GC)."""
    out = set()
    for o in store.list(job_prefix(job)):
        if o.key.endswith("/_metadata") or "/parts/" in o.key:
            out |= {job_prefix(job) + f.path for f in parse_manifest(store.get(o.key), o.key).files}
    return out


def test_gc_resumes_after_interruption_and_lists_once_per_run(s3_store):
    clock = Clock()
    core = PoolCore(s3_store)
    models = build_job(core, "j", 6, random.Random(8))
    life = Lifecycle(s3_store, LifecycleConfig(retain_last=1, gc_min_age_s=60), clock=clock)
    life.retain("j")
    orphans = [f"jobs/j/data/orphan-{i}.arrow" for i in range(6)]
    for key in orphans:
        s3_store.put(key, b"left by a lost commit race")
    data_keys = {o.key for o in s3_store.list("jobs/j/data/")}
    young = life.gc("j")
    assert young.deleted == [] and young.too_young == len(data_keys - referenced_keys(s3_store, "j"))
    clock.offset = 120
    dry = life.gc("j", dry_run=True)
    expected = sorted(data_keys - referenced_keys(s3_store, "j"))
    assert dry.deleted == expected and set(orphans) <= set(expected)
    assert {o.key for o in s3_store.list("jobs/j/data/")} == data_keys  # a dry run deletes nothing
    s3_store.counters.reset()
    part = life.gc("j", max_deletes=2)  # interrupted after two deletions
    assert s3_store.counters.requests["list"] == 1 and len(part.deleted) == 2 and s3_store.exists("jobs/j/gc-progress.json")
    again = life.gc("j", max_deletes=1)  # interrupted again: it saw the first run's marker
    assert again.resumed is not None and again.resumed["planned"] == len(expected) and len(again.deleted) == 1
    s3_store.counters.reset()
    rest = life.gc()  # a store-wide run picks up where they stopped
    assert s3_store.counters.requests["list"] == 1
    assert rest.resumed is not None and rest.resumed["planned"] == len(expected) - 2
    assert sorted(part.deleted + again.deleted + rest.deleted) == expected
    assert not s3_store.exists(GC_MARKER) and not s3_store.exists("jobs/j/gc-progress.json")
    assert {o.key for o in s3_store.list("jobs/j/data/")} == referenced_keys(s3_store, "j")
    assert scan_checkpoint(s3_store, "j", 6) == models[6]


def test_gc_clears_an_interrupted_savepoint_and_keeps_complete_ones(s3_store):
    clock = Clock()
    build_job(PoolCore(s3_store), "j", 2, random.Random(9))
    life = Lifecycle(s3_store, LifecycleConfig(gc_min_age_s=60), clock=clock)
    life.savepoint("j", 2, "good")
    s3_store.put("savepoints/half/data/x.arrow", b"no manifest was ever written")
    s3_store.put("savepoints/good/data/stray.arrow", b"not named by its manifest")
    clock.offset = 120
    res = life.gc()
    assert sorted(res.deleted) == ["savepoints/good/data/stray.arrow", "savepoints/half/data/x.arrow"]
    assert life.list_savepoints() == ["good"]
    assert scan_savepoint(s3_store, "good") == scan_checkpoint(s3_store, "j", 2)


# ---- the randomized lifecycle ---------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [11, 12])
def test_randomized_commits_retention_compaction_savepoints_and_gc(seed):
    from store.memory import MemoryStore

    store = MemoryStore()  # many steps: the store contract suite holds S3 to what this store does
    rng = random.Random(seed)
    clock = Clock()
    core = PoolCore(store)
    config = LifecycleConfig(retain_last=3, compact_max_layers=4, gc_min_age_s=60)
    life = Lifecycle(store, config, clock=clock, on_manifest_replaced=lambda j, c: core.reader(j).forget(c))
    epochs = [core.acquire_writer("j", kg)[0] for kg in HALVES]
    model: Model = {}
    models: dict[int, Model] = {}
    savepoints: dict[str, Model] = {}
    cid = 0
    counts = {"commit": 0, "retain": 0, "compact": 0, "savepoint": 0, "gc": 0, "pin": 0, "orphan": 0}
    for step in range(60):
        action = rng.choices(["commit", "retain", "compact", "savepoint", "gc", "pin", "orphan"], [10, 2, 2, 1, 2, 1, 1])[0]
        if action == "commit" or cid == 0:
            cid += 1
            for i, kg in enumerate(HALVES):
                rows = delta_for(rng, model, kg, rng.randint(0, 25), cid, op_rows=i == 0)
                apply(model, rows)
                commit(core, "j", cid, cid - 1, kg, epochs[i], rows)
            models[cid] = dict(model)
            action = "commit"
        elif action == "retain":
            for gone in life.retain("j").deleted:
                models.pop(gone, None)
        elif action == "compact":
            life.compact("j", rng.choice(sorted(models)))
        elif action == "savepoint":
            name = f"sp-{step}"
            life.savepoint("j", rng.choice(sorted(models)), name)
            savepoints[name] = models[parse_manifest(store.get(f"savepoints/{name}/_metadata"), name).checkpoint_id]
        elif action == "pin":
            target = rng.choice(sorted(models))
            life.pin("j", target, f"r{step}", ttl_s=rng.choice([30, 3000]))
        elif action == "orphan":
            store.put(f"jobs/j/data/orphan-{step}.arrow", b"lost race")
        else:
            clock.offset += rng.choice([0, 90])
            store.counters.reset()
            life.gc(rng.choice(["j", None]))
            assert store.counters.requests["list"] == 1
            # nothing referenced was deleted: every referenced file is still there
            present = {o.key for o in store.list("jobs/j/data/")}
            assert referenced_keys(store, "j") <= present
        counts[action] += 1
    clock.offset += 90
    life.gc()
    present = {o.key for o in store.list("jobs/j/data/")}
    assert present == referenced_keys(store, "j")  # every unreferenced file older than the minimum age is gone
    listed = [c.checkpoint_id for c in PoolCore(store).list_checkpoints("j")]
    assert listed == sorted(models)
    for c in listed:
        assert scan_checkpoint(store, "j", c) == models[c]
        assert scan_checkpoint(store, "j", c, (40, 80)) == in_range(models[c], 40, 80)
    for name, expected in savepoints.items():
        assert scan_savepoint(store, name) == expected
    assert counts["commit"] >= 20 and counts["gc"] >= 3, counts


def test_the_minimum_age_protects_a_commit_in_flight(s3_store):
    """GC runs between a commit's data-file upload and its part: with a minimum age the commit lands whole."""
    core = PoolCore(s3_store)
    models = build_job(core, "j", 2, random.Random(13))
    rng = random.Random(14)

    def commit_with_gc_midway(life: Lifecycle, cid: int) -> Model:
        real = s3_store.put_if_absent

        def put_if_absent(key, data):
            if "/parts/" in key:
                life.gc("j")  # the delta file is uploaded and not yet named by any part
            return real(key, data)

        s3_store.put_if_absent = put_if_absent
        try:
            model = dict(models[cid - 1])
            for i, kg in enumerate(HALVES):
                rows = delta_for(rng, model, kg, 10, cid, op_rows=i == 0)
                apply(model, rows)
                commit(core, "j", cid, cid - 1, kg, core.acquire_writer("j", kg)[0], rows)
        finally:
            del s3_store.put_if_absent
        return model

    models[3] = commit_with_gc_midway(Lifecycle(s3_store, LifecycleConfig(gc_min_age_s=60)), 3)
    assert scan_checkpoint(s3_store, "j", 3) == models[3]
    # without a minimum age the same interleaving loses the in-flight delta: the age rule is what keeps it
    commit_with_gc_midway(Lifecycle(s3_store, LifecycleConfig(gc_min_age_s=0)), 4)
    with pytest.raises(NotFoundError, match="missing"):
        scan_checkpoint(s3_store, "j", 4)


def test_savepoint_and_compaction_of_an_empty_state(s3_store):
    core = PoolCore(s3_store)
    epoch = core.acquire_writer("e", KeyGroupRange(0, 127))[0]
    key = keyed(UNIVERSE[0])
    commit(core, "e", 1, 0, KeyGroupRange(0, 127), epoch, [(s.ROW_PUT, OP_IDS["sink"], key, b"x")])
    commit(core, "e", 2, 1, KeyGroupRange(0, 127), epoch, [(s.ROW_ERASE, OP_IDS["sink"], key, b"")])
    life = Lifecycle(s3_store)
    assert life.savepoint("e", 2, "empty").rows == 0
    assert scan_savepoint(s3_store, "empty") == {}
    assert life.compact("e", force=True).folded == ((0, 127, 2),)
    assert scan_checkpoint(s3_store, "e", 2) == {} and scan_checkpoint(s3_store, "e", 1) == {(OP_IDS["sink"], key): b"x"}


def test_retention_removes_abandoned_incomplete_checkpoints_once_old(s3_store):
    clock = Clock()
    core = PoolCore(s3_store)
    rng = random.Random(15)
    epochs = [core.acquire_writer("j", kg)[0] for kg in HALVES]
    model: Model = {}
    commit(core, "j", 1, 0, HALVES[0], epochs[0], delta_for(rng, model, HALVES[0], 5, 1, op_rows=False))  # the other half never comes
    for cid, parent in ((2, 0), (3, 2)):
        for i, kg in enumerate(HALVES):
            rows = delta_for(rng, model, kg, 5, cid, op_rows=False)
            apply(model, rows)
            commit(core, "j", cid, parent, kg, epochs[i], rows)
    life = Lifecycle(s3_store, LifecycleConfig(retain_last=5, gc_min_age_s=60), clock=clock)
    assert life.retain("j").deleted == ()  # young: it may still be in flight
    clock.offset = 120
    assert life.retain("j").deleted == (1,)
    assert not list(s3_store.list("jobs/j/chk-1/"))
    assert [c.checkpoint_id for c in core.list_checkpoints("j", include_incomplete=True)] == [2, 3]
    assert scan_checkpoint(s3_store, "j", 3) == model
