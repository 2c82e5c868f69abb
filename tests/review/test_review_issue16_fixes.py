"""Second review of issue 16: attacks on the fixes of e394be1/d2dcd96 (GC at any depth, --to refusals, restore, anatomy, CLI)."""

from __future__ import annotations

import json
import os
import random
import time
from collections import Counter
from pathlib import Path

import pytest

import snapshot as s
from client import BackendConfig, RemoteReadBackend
from pool.core import PoolCore
from pool.domain import KeyGroupRange
from pool.lifecycle import Lifecycle, LifecycleConfig
from protos import remote_pool_pb2 as pb
from snapshot.errors import InvalidArgumentError, NonRestoredStateError, NotFoundError, UnavailableError
from store.layout import metadata_key
from store.local import FileStore
from store.locations import open_directory
from store.memory import MemoryStore
from store.views import PrefixStore
from tests.cli_fixtures import commit_checkpoints, generated_table, rows_of
from tests.client_fixtures import serving
from tests.hook_store import HookStore
from tests.lifecycle_helpers import HALVES, build_job, delta_for, fresh, scan_checkpoint, table_dict
from tests.pool_core_helpers import OP_IDS, Model, apply, commit, keyed, keys_in_range, op_key
from tests.savepoint_review_helpers import NO_AGE, backend_checkpoint, orders_job, pool_json, savepoint_rows, verify_json


def _raw_put(s3_store, key: str, data: bytes) -> None:
    """A put as any S3 tool makes it (aws s3 cp): no key rules of ours."""
    s3_store._client.put_object(Bucket=s3_store.bucket, Key=s3_store.prefix + key, Body=data)


def _copy_tree_raw(root: Path, s3_store, prefix: str) -> list[str]:
    """Copy every file under ``root`` into ``prefix`` of the bucket, as `aws s3 cp --recursive` does; the keys."""
    keys = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        key = prefix + path.relative_to(root).as_posix()
        _raw_put(s3_store, key, path.read_bytes())
        keys.append(key)
    return keys


# ---- GC of savepoints at any depth, and the .clink- names reserved at every depth -------------------------------------


def test_a_file_savepoint_directory_holds_the_file_stores_lock_file(file_store, tmp_path):
    orders_job(file_store)
    fresh(file_store).savepoint("orders", to=FileStore(tmp_path / "sp"))
    assert (tmp_path / "sp" / ".clink-lock").exists()  # what a copy by any tool carries along


def test_gc_of_an_s3_store_holding_a_savepoint_copied_from_a_file_directory_completes(s3_store, file_store, tmp_path):
    models = orders_job(s3_store)
    orders_job(file_store)
    fresh(file_store).savepoint("orders", to=FileStore(tmp_path / "sp"))
    keys = _copy_tree_raw(tmp_path / "sp", s3_store, "savepoints/copied/")
    assert "savepoints/copied/.clink-lock" in keys
    fresh(s3_store, NO_AGE).gc()
    assert savepoint_rows(PrefixStore(s3_store, "savepoints/copied/")) == models[3]
    assert scan_checkpoint(s3_store, "orders", 3) == models[3]


def test_gc_removes_a_stale_temp_file_a_killed_to_savepoint_left_inside_the_store(file_store):
    orders_job(file_store)
    fresh(file_store).savepoint("orders", to=FileStore(file_store.root / "savepoints" / "orders" / "r7"))
    stale = file_store.root / "savepoints" / "orders" / "r7" / ".clink-tmp" / "0123abcd"
    stale.parent.mkdir(exist_ok=True)
    stale.write_bytes(b"x" * 4096)  # a put killed between write and rename
    old = time.time() - 3600
    os.utime(stale, (old, old))
    fresh(file_store, NO_AGE).gc()
    assert not stale.exists()


@pytest.mark.parametrize(
    "metadata",
    [
        b"[1, 2, 3]",
        b'{"version": 4, "files": "x"}',
        b"\xff\xfe not json",
        b'{"format": "clink.manifest", "version": 4, "files": [{"path": "../../../jobs/orders/data/x.arrow"}]}',
    ],
)
def test_gc_and_ls_with_a_hostile_metadata_under_savepoints_complete_and_keep_everything_else(file_store, clink_pool_run, metadata):
    models = orders_job(file_store)
    life = fresh(file_store, NO_AGE)
    good = life.savepoint("orders", name="good")
    file_store.put("savepoints/evil/_metadata", metadata)
    file_store.put("savepoints/evil/data/junk.arrow", b"junk")
    life.gc()
    assert scan_checkpoint(file_store, "orders", 3) == models[3]
    assert savepoint_rows(PrefixStore(file_store, f"savepoints/{good.name}/")) == models[3]
    assert file_store.exists("savepoints/evil/_metadata")  # never GC's to delete
    listed = pool_json(clink_pool_run, "savepoint", "ls", "--store", file_store.uri)["savepoints"]
    assert sorted((sp["name"], sp["complete"]) for sp in listed) == [("evil", False), ("good", True)]


def test_gc_deletes_an_interrupted_savepoint_nested_in_a_published_one(file_store):
    models = orders_job(file_store)
    life = fresh(file_store, NO_AGE)
    life.savepoint("orders", to=PrefixStore(file_store, "savepoints/outer/"))
    file_store.put("savepoints/outer/inner/data/orphan.arrow", b"never published")
    result = life.gc()
    assert "savepoints/outer/inner/data/orphan.arrow" in result.deleted
    assert savepoint_rows(PrefixStore(file_store, "savepoints/outer/")) == models[3]


def test_gc_keeps_a_young_file_of_a_savepoint_being_written_nested_in_a_published_one(file_store):
    orders_job(file_store)
    life = fresh(file_store, LifecycleConfig(gc_min_age_s=3600))
    life.savepoint("orders", to=PrefixStore(file_store, "savepoints/outer/"))
    file_store.put("savepoints/outer/inner/data/young.arrow", b"being written")
    result = life.gc()
    assert file_store.exists("savepoints/outer/inner/data/young.arrow") and not result.deleted


def test_gc_keeps_the_files_of_a_folder_whose_metadata_vanished_between_its_list_and_get(file_store):
    models = orders_job(file_store)
    fresh(file_store).savepoint("orders", to=PrefixStore(file_store, "savepoints/a/b/c/"))
    meta = file_store.get("savepoints/a/b/c/_metadata")
    hooked = HookStore(file_store)
    hooked.on("get", "savepoints/a/b/c/_metadata", lambda: file_store.delete("savepoints/a/b/c/_metadata"))
    result = fresh(hooked, NO_AGE).gc()
    assert not file_store.exists("savepoints/a/b/c/_metadata")
    assert not [k for k in result.deleted if k.startswith("savepoints/")], result.deleted
    file_store.put("savepoints/a/b/c/_metadata", meta)
    assert savepoint_rows(PrefixStore(file_store, "savepoints/a/b/c/")) == models[3]


def test_gc_keeps_the_files_of_a_savepoint_whose_metadata_appeared_after_the_list_when_young(file_store):
    orders_job(file_store)
    fresh(file_store).savepoint("orders", to=PrefixStore(file_store, "savepoints/late/"))
    meta = file_store.get("savepoints/late/_metadata")
    file_store.delete("savepoints/late/_metadata")
    hooked = HookStore(file_store)
    hooked.on("list", "", lambda: file_store.put("savepoints/late/_metadata", meta), when="after")
    result = fresh(hooked, LifecycleConfig(gc_min_age_s=3600)).gc()
    assert not result.deleted and savepoint_rows(PrefixStore(file_store, "savepoints/late/"))


def test_savepoint_ls_lists_nested_published_savepoints_and_an_unpublished_folder(file_store, clink_pool_run):
    orders_job(file_store)
    life = fresh(file_store)
    life.savepoint("orders", to=PrefixStore(file_store, "savepoints/outer/"))
    life.savepoint("orders", to=PrefixStore(file_store, "savepoints/outer/inner/"))
    file_store.put("savepoints/broken/x/data/orphan.arrow", b"never published")
    listed = pool_json(clink_pool_run, "savepoint", "ls", "--store", file_store.uri)["savepoints"]
    by_location = {sp["location"].removeprefix(file_store.uri + "/"): sp["complete"] for sp in listed}
    assert by_location == {"savepoints/outer": True, "savepoints/outer/inner": True, "savepoints/broken/x": False}


# ---- --to refused in the store's own layout ---------------------------------------------------------------------------


def test_refusals_are_invalid_argument_errors_for_each_managed_place(file_store):
    orders_job(file_store)
    life = fresh(file_store)
    for rel in ("", "jobs/", "jobs/orders/", "gc/", "savepoints/"):
        with pytest.raises(InvalidArgumentError):
            life.savepoint("orders", to=FileStore(file_store.root / rel) if rel else FileStore(file_store.root))


FILE_SPELLINGS = {
    "trailing slash": "{uri}/jobs/orders/",
    "double slashes": "{uri}//jobs//orders",
    "dot": "{uri}/./jobs/x",
    "dot-dot": "{uri}/savepoints/../jobs/x",
    "percent-encoded": "{uri}/j%6Fbs/x",
    "gc with slash": "{uri}/gc/",
    "savepoints with slash": "{uri}/savepoints/",
    "savepoints with dot": "{uri}/savepoints/./",
    "root with slash": "{uri}/",
    "root dot-dot": "{uri}/jobs/..",
    "relative path": "store/jobs/x",
    "relative file uri": "file://./store/gc",
    "bare absolute path": "{root}/jobs/x",
    "symlink to the root": "{tmp}/link/jobs/x",
    "symlink to jobs": "{tmp}/alias/x",
}


@pytest.mark.parametrize("spelling", list(FILE_SPELLINGS))
def test_every_spelling_of_a_managed_place_of_a_file_store_is_refused(file_store, tmp_path, monkeypatch, clink_pool_run, spelling):
    models = orders_job(file_store)
    (tmp_path / "link").symlink_to(file_store.root)
    (tmp_path / "alias").symlink_to(file_store.root / "jobs")
    monkeypatch.chdir(tmp_path)
    before = sorted((o.key, o.etag) for o in file_store.list(""))
    to = FILE_SPELLINGS[spelling].format(uri=file_store.uri, root=file_store.root, tmp=tmp_path)
    pool_json(clink_pool_run, "savepoint", "--store", file_store.uri, "orders", "--to", to, code=2)
    assert sorted((o.key, o.etag) for o in file_store.list("")) == before
    assert scan_checkpoint(file_store, "orders", 3) == models[3]


def test_a_relative_store_and_an_absolute_to_in_its_jobs_are_refused(file_store, tmp_path, monkeypatch, clink_pool_run):
    orders_job(file_store)
    monkeypatch.chdir(tmp_path)
    pool_json(clink_pool_run, "savepoint", "--store", "store", "orders", "--to", f"{file_store.uri}/jobs/x", code=2)
    pool_json(clink_pool_run, "savepoint", "--store", "./store/", "orders", "--to", f"{file_store.uri}/gc", code=2)


S3_SPELLINGS = ["{uri}/jobs/orders/", "{uri}/", "{uri}/savepoints/", "{uri}/gc", "{uri}/jobs"]


@pytest.mark.parametrize("spelling", S3_SPELLINGS)
def test_every_spelling_of_a_managed_place_of_an_s3_store_is_refused(s3_store, clink_pool_run, s3_cli_env, spelling):
    orders_job(s3_store)
    before = sorted((o.key, o.etag) for o in s3_store.list(""))
    to = spelling.format(uri=s3_store.uri)
    pool_json(clink_pool_run, "savepoint", "--store", s3_store.uri, "orders", "--to", to, code=2, env=s3_cli_env)
    assert sorted((o.key, o.etag) for o in s3_store.list("")) == before


@pytest.mark.parametrize("to", ["s3://{bucket}/jobs/orders", "s3://{bucket}/", "s3://{bucket}/savepoints", "s3://{bucket}/gc/"])
def test_a_bucket_root_stores_managed_places_are_refused(make_s3_store, clink_pool_run, s3_cli_env, to):
    root = make_s3_store()
    orders_job(root)
    pool_json(clink_pool_run, "savepoint", "--store", root.uri, "orders", "--to", to.format(bucket=root.bucket), code=2, env=s3_cli_env)


def test_a_to_that_is_the_parent_of_the_store_leaves_the_store_and_its_gc_intact(tmp_path, clink_pool_run):
    store = FileStore(tmp_path / "outer" / "pool")
    models = orders_job(store)
    doc = pool_json(clink_pool_run, "savepoint", "--store", store.uri, "orders", "--to", f"file://{tmp_path}/outer")
    parent = FileStore(tmp_path / "outer")
    assert savepoint_rows(parent) == models[3]
    gc = clink_pool_run("gc", "--store", store.uri, "--min-age", "0s")
    assert gc.exit_code == 0, gc.stderr
    assert scan_checkpoint(store, "orders", 3) == models[3]
    pool_json(clink_pool_run, "savepoint", "delete", "--store", store.uri, doc["location"])
    assert scan_checkpoint(store, "orders", 3) == models[3]
    assert not parent.exists("_metadata")


def test_a_to_parent_of_a_store_named_data_puts_savepoint_files_loose_in_the_store_root(tmp_path, clink_pool_run):
    store = FileStore(tmp_path / "outer" / "data")
    models = orders_job(store)
    pool_json(clink_pool_run, "savepoint", "--store", store.uri, "orders", "--to", f"file://{tmp_path}/outer")
    loose = [o.key for o in store.list("") if "/" not in o.key]
    gc = clink_pool_run("gc", "--store", store.uri, "--min-age", "0s")
    assert gc.exit_code == 0, gc.stderr
    assert savepoint_rows(FileStore(tmp_path / "outer")) == models[3]
    assert loose  # the savepoint's data/ is the store's root: its files lie loose there, where GC never looks


# ---- anatomy: operator state counted once after compaction ------------------------------------------------------------


def _live_per_operator(model: Model) -> dict[int, int]:
    counts = Counter(op for op, _ in model)
    return {op: counts.get(op, 0) for op in OP_IDS.values()}


def _anatomy(store, job: str, cid: int) -> dict:
    return json.loads(store.get(metadata_key(job, cid)))["anatomy"]


def _two_subtasks_compacted_at_different_checkpoints(store) -> Model:
    """Checkpoints 1-2 by both subtasks, compacted; checkpoint 3: the low subtask changes nothing, the high one puts an
    operator-state key and a keyed row; compacted again (only the high part has layers to fold). The model of checkpoint 3.
    """
    core, rng, model = PoolCore(store), random.Random(3), {}
    epochs = [core.acquire_writer("orders", kg)[0] for kg in HALVES]
    for cid in (1, 2):
        for i, kg in enumerate(HALVES):
            rows = delta_for(rng, model, kg, 30, cid, op_rows=i == 0)
            apply(model, rows)
            commit(core, "orders", cid, cid - 1, kg, epochs[i], rows)
    fresh(store).compact("orders", 2, force=True)
    commit(core, "orders", 3, 2, HALVES[0], epochs[0], [])
    late = [(s.ROW_PUT, OP_IDS["source"], op_key("late"), b"3"), (s.ROW_PUT, OP_IDS["sink"], keyed(keys_in_range(64, 127, 1)[0]), b"3")]
    apply(model, late)
    commit(core, "orders", 3, 2, HALVES[1], epochs[1], late)
    fresh(store).compact("orders", 3, force=True)
    return model


def test_parts_compacted_at_different_checkpoints_read_the_model(file_store):
    model = _two_subtasks_compacted_at_different_checkpoints(file_store)
    assert scan_checkpoint(file_store, "orders", 3) == model
    _, manifest, _ = fresh(file_store).open_checkpoint("orders", 3)
    assert sorted(manifest.file(p.layers[0][0]).as_of for p in manifest.parts) == [2, 3]
    assert all(len(p.layers) == 1 for p in manifest.parts)


def test_anatomy_of_parts_compacted_at_different_checkpoints_counts_the_live_operator_state(file_store):
    model = _two_subtasks_compacted_at_different_checkpoints(file_store)
    doc = _anatomy(file_store, "orders", 3)
    assert doc["rows_counted"] == "live"
    assert {o["op_id"]: o["rows"] for o in doc["operators"]} == _live_per_operator(model)
    assert sum(t["rows"] for t in doc["subtasks"]) == len(model)


@pytest.mark.parametrize("parallelism", [1, 3, 4])
def test_anatomy_of_an_import_at_parallelism_p_counts_live_rows(file_store, tmp_path, clink_pool_run, parallelism):
    models = orders_job(file_store, checkpoints=3)
    fresh(file_store).savepoint("orders", to=FileStore(tmp_path / "sp"))
    pool_json(clink_pool_run, "import", "--store", file_store.uri, "imported", "--from", f"file://{tmp_path}/sp", "-p", str(parallelism))
    doc = _anatomy(file_store, "imported", 1)
    assert scan_checkpoint(file_store, "imported", 1) == models[3]
    assert doc["rows_counted"] == "live"
    assert {o["op_id"]: o["rows"] for o in doc["operators"]} == _live_per_operator(models[3])
    assert sum(t["rows"] for t in doc["subtasks"]) == len(models[3])


def test_anatomy_of_a_four_part_compacted_checkpoint_counts_live_rows(file_store):
    core, rng, model = PoolCore(file_store), random.Random(9), {}
    quarters = [KeyGroupRange(0, 31), KeyGroupRange(32, 63), KeyGroupRange(64, 95), KeyGroupRange(96, 127)]
    epochs = [core.acquire_writer("orders", kg)[0] for kg in quarters]
    for cid in (1, 2, 3):
        for i, kg in enumerate(quarters):
            rows = delta_for(rng, model, kg, 20, cid, op_rows=i == 2)  # a writer of operator state not first
            apply(model, rows)
            commit(core, "orders", cid, cid - 1, kg, epochs[i], rows)
    fresh(file_store).compact("orders", 3, force=True)
    doc = _anatomy(file_store, "orders", 3)
    assert scan_checkpoint(file_store, "orders", 3) == model
    assert doc["rows_counted"] == "live"
    assert {o["op_id"]: o["rows"] for o in doc["operators"]} == _live_per_operator(model)
    assert sum(t["rows"] for t in doc["subtasks"]) == len(model)


def test_anatomy_of_a_restore_that_drops_an_operator_of_a_compacted_checkpoint_counts_live_rows(file_store):
    models = orders_job(file_store, checkpoints=3)
    life = fresh(file_store)
    life.compact("orders", 3, force=True)
    life.restorer.restore("orders-v2", life.checkpoint_location("orders"), ["source", "sink"], allow_non_restored_state=True)
    expected = {k: v for k, v in models[3].items() if k[0] != OP_IDS["window"]}
    doc = _anatomy(file_store, "orders-v2", 1)
    assert scan_checkpoint(file_store, "orders-v2", 1) == expected
    assert doc["rows_counted"] == "live"
    assert {o["op_id"]: o["rows"] for o in doc["operators"]} == {k: v for k, v in _live_per_operator(expected).items() if v}


# ---- verify: what a damaged file with operator state costs -------------------------------------------------------------


def _readable(store, job: str, cid: int, lo: int, hi: int) -> bool:
    life = fresh(store)
    try:
        life.read_table(*life.open_checkpoint(job, cid)[:2], (lo, hi))
    except NotFoundError:
        return False
    return True


def test_verify_loses_only_the_ranges_that_read_a_damaged_base_whose_operator_state_is_superseded(file_store, clink_run):
    _two_subtasks_compacted_at_different_checkpoints(file_store)
    _, manifest, _ = fresh(file_store).open_checkpoint("orders", 3)
    stale = next(p for p in manifest.parts if p.kg_lo == 0).layers[0][0]
    file_store.delete(f"jobs/orders/{stale}")
    code, doc = verify_json(clink_run, f"{file_store.uri}/jobs/orders/chk-3")
    assert code == 1 and [d["path"] for d in doc["damaged_files"]] == [stale]
    assert _readable(file_store, "orders", 3, 64, 127) and not _readable(file_store, "orders", 3, 0, 63)
    assert doc["restorable_key_groups"] == [[64, 127]] and doc["lost_key_groups"] == [[0, 63]]


@pytest.mark.parametrize("how", ["missing", "truncated"])
def test_verify_of_a_savepoint_whose_operator_state_file_is_damaged_loses_every_range_and_says_so(file_store, clink_run, how):
    orders_job(file_store)
    info = fresh(file_store).savepoint("orders", name="rel")
    loc = open_directory(PrefixStore(file_store, "savepoints/rel/"))
    holder = next(f.path for f in loc.manifest.files if any(seg.operator for seg in f.segments))
    data = file_store.get(f"savepoints/rel/{holder}")
    file_store.delete(f"savepoints/rel/{holder}") if how == "missing" else file_store.put(f"savepoints/rel/{holder}", data[:100])
    code, doc = verify_json(clink_run, info.location)
    assert code == 1 and doc["restorable_key_groups"] == [] and doc["lost_key_groups"] == [[0, 63], [64, 127]]
    text = clink_run("savepoint", "verify", info.location)
    assert "operator state is lost" in text.stdout + text.stderr


# ---- restore: clock checks, the drop path's state versions, live operators -------------------------------------------


def _slow_world(drop: bool, step_s: float):
    """A memory store with job orders (3 checkpoints); a lifecycle on it whose every copy into orders-v2 takes ``step_s``
    while a GC with the configured minimum age runs after each; (lifecycle, store, models, gc runs).
    """
    now = {"s": 1_000_000.0}
    clock = lambda: now["s"]  # noqa: E731
    inner = MemoryStore("slow", clock_ms=lambda: int(now["s"] * 1000))
    config = LifecycleConfig(gc_min_age_s=3600, max_write_s=1800)
    models = build_job(PoolCore(inner, clock=clock), "orders", 3, random.Random(5))
    hooked, runs = HookStore(inner), []

    def slow() -> None:
        now["s"] += step_s
        runs.append(Lifecycle(inner, config, clock=clock).gc())

    hooked.on("put_if_absent", "jobs/orders-v2/data/", slow, when="after", times=10**6)
    return Lifecycle(hooked, config, clock=clock), inner, models, runs


@pytest.mark.parametrize(("drop", "step_s"), [(False, 700), (False, 1700), (True, 700)], ids=["copies", "copies 1700 s", "drops state"])
def test_a_restore_whose_every_copy_is_slow_but_within_the_limits_succeeds(drop, step_s):
    life, inner, models, runs = _slow_world(drop, step_s=step_s)
    uids = ["source", "sink"] if drop else None
    life.restorer.restore("orders-v2", life.checkpoint_location("orders"), uids, allow_non_restored_state=drop)
    expected = {k: v for k, v in models[3].items() if not drop or k[0] != OP_IDS["window"]}
    assert runs and not [k for r in runs for k in r.deleted if k.startswith("jobs/orders-v2/")]
    assert scan_checkpoint(inner, "orders-v2", 1) == expected


def test_a_restore_with_one_copy_slower_than_max_write_is_refused_and_undone():
    life, inner, models, runs = _slow_world(False, step_s=1900)
    with pytest.raises(UnavailableError, match="took longer than 1800 s"):
        life.restorer.restore("orders-v2", life.checkpoint_location("orders"))
    assert not list(inner.list("jobs/orders-v2/"))


def test_a_drop_keeps_every_state_version_of_every_kept_operator_and_none_of_the_dropped(file_store):
    versions = s.StateVersionMap(
        {
            (OP_IDS["window"], "ValueState"): 3,
            (OP_IDS["window"], "MapState"): 2,
            (OP_IDS["sink"], "MapState"): 1,
            (OP_IDS["source"], "ListState"): 5,
        }
    )
    commit_checkpoints(file_store, "orders", [generated_table(1), generated_table(2)], versions)
    life = fresh(file_store)
    res = life.restorer.restore("orders-v2", life.checkpoint_location("orders"), ["window", "sink"], allow_non_restored_state=True)
    assert res.dropped == {OP_IDS["source"]: "source"}
    _, manifest, _ = fresh(file_store).open_checkpoint("orders-v2", 1)
    kept = {k: v for k, v in versions.items() if k[0] != OP_IDS["source"]}
    assert dict(s.StateVersionMap.unpack(manifest.state_versions).items()) == kept
    table = fresh(file_store).read_table(*fresh(file_store).open_checkpoint("orders-v2", 1)[:2])
    expected = {k: v for k, v in rows_of(generated_table(2)).items() if k[0] != OP_IDS["source"]}
    assert table_dict(table) == expected


def test_an_undeclared_operator_with_live_rows_only_in_a_later_layer_is_refused(file_store):
    k = _erased_source_job(file_store)
    life = fresh(file_store)
    with pytest.raises(NonRestoredStateError) as err:
        life.restorer.restore("orders-v2", life.checkpoint_location("orders"), ["source"])
    assert OP_IDS["window"] in err.value.operators
    res = life.restorer.restore("orders-v3", life.checkpoint_location("orders"), ["window"])  # source's rows are all erased
    assert res.dropped == {} and scan_checkpoint(file_store, "orders-v3", 1) == {(OP_IDS["window"], k): b"2"}


@pytest.mark.parametrize("drop", [False, True], ids=["copies", "drops state"])
def test_a_restore_whose_every_copy_takes_more_than_half_of_max_write_succeeds(drop):
    life, inner, models, runs = _slow_world(drop, step_s=1000)
    uids = ["source", "sink"] if drop else None
    life.restorer.restore("orders-v2", life.checkpoint_location("orders"), uids, allow_non_restored_state=drop)
    expected = {k: v for k, v in models[3].items() if not drop or k[0] != OP_IDS["window"]}
    assert not [k for r in runs for k in r.deleted if k.startswith("jobs/orders-v2/")]
    assert scan_checkpoint(inner, "orders-v2", 1) == expected


# ---- the backend's check with OperatorInfo.without_state, from this pool and from one before it -------------------------


@pytest.fixture
def address(file_store):
    with serving(file_store) as served:
        yield served


@pytest.fixture
def old_pool(monkeypatch):
    """Pools serve CheckpointInfo as one before OperatorInfo.without_state did: the field is never set."""
    import pool.wire

    real = pb.OperatorInfo
    monkeypatch.setattr(pool.wire.pb, "OperatorInfo", lambda op_id, uid, without_state=False: real(op_id=op_id, uid=uid))


def _restore(address: str, job: str, declared: list[str]):
    with RemoteReadBackend.connect(address, job, config=BackendConfig(warm_up="off")) as b:
        for uid in declared:
            b.register_operator(uid)
        return b.restore()


@pytest.mark.parametrize("pool_age", ["this pool", "older pool"])
def test_a_backend_never_restores_without_declaring_an_operator_that_holds_state(address, request, pool_age):
    if pool_age == "older pool":
        request.getfixturevalue("old_pool")
    backend_checkpoint(address, "named", ["agg", "sideline"], ["agg"])
    with pytest.raises(NonRestoredStateError) as err:
        _restore(address, "named", ["sideline"])
    assert s.operator_id("agg") in err.value.operators
    assert _restore(address, "named", ["agg", "sideline"]).non_restored == {}


def test_a_backend_of_an_older_pool_refuses_an_undeclared_operator_named_without_state_as_before(address, old_pool):
    backend_checkpoint(address, "named", ["agg", "sideline"], ["agg"])
    with pytest.raises(NonRestoredStateError) as err:
        _restore(address, "named", ["agg"])
    assert set(err.value.operators) == {s.operator_id("sideline")}


# ---- information fields of another shape, and damaged _metadata under savepoints/ ------------------------------------


def _edit_savepoint_info(store, key: str, **fields) -> None:
    doc = json.loads(store.get(key))
    doc["savepoint"].update(fields)
    store.put(key, json.dumps(doc).encode())


@pytest.mark.parametrize("created", [10**20, -(10**20)])
def test_savepoint_ls_of_a_savepoint_whose_created_at_is_out_of_range_lists_it(file_store, clink_pool_run, created):
    orders_job(file_store)
    info = fresh(file_store).savepoint("orders", name="rel")
    _edit_savepoint_info(file_store, "savepoints/rel/_metadata", created_at_ms=created)
    listed = pool_json(clink_pool_run, "savepoint", "ls", "--store", file_store.uri)["savepoints"]
    assert [(sp["location"], sp["created_at"]) for sp in listed] == [(info.location, None)]


def test_a_damaged_metadata_of_a_job_folder_savepoint_does_not_keep_other_savepoints_garbage_forever(file_store):
    models = orders_job(file_store)
    life = fresh(file_store, NO_AGE)
    life.savepoint("orders", to=PrefixStore(file_store, "savepoints/orders/"))
    meta = file_store.get("savepoints/orders/_metadata")
    file_store.put("savepoints/orders/_metadata", meta[: len(meta) // 2])  # a copy cut short
    file_store.put("savepoints/orders/savepoint-9-abcdef/data/orphan.arrow", b"an interrupted savepoint")
    life.gc()
    life.gc()
    assert not file_store.exists("savepoints/orders/savepoint-9-abcdef/data/orphan.arrow")
    assert scan_checkpoint(file_store, "orders", 3) == models[3]


def test_a_damaged_metadata_keeps_the_data_files_of_its_own_folder(file_store):
    orders_job(file_store)
    life = fresh(file_store, NO_AGE)
    life.savepoint("orders", to=PrefixStore(file_store, "savepoints/orders/"))
    named = sorted(o.key for o in file_store.list("savepoints/orders/data/"))
    meta = file_store.get("savepoints/orders/_metadata")
    file_store.put("savepoints/orders/_metadata", meta[: len(meta) // 2])
    life.gc()
    assert named and sorted(o.key for o in file_store.list("savepoints/orders/data/")) == named


# ---- the savepoint group: options the group does not know go to create ------------------------------------------------


def test_an_unknown_option_before_the_job_is_refused_naming_it_and_writes_nothing(file_store, clink_pool_run):
    orders_job(file_store)
    before = sorted(o.key for o in file_store.list(""))
    result = clink_pool_run("savepoint", "--store", file_store.uri, "--bogus", "orders")
    assert result.exit_code == 2 and "--bogus" in result.stderr
    assert sorted(o.key for o in file_store.list("")) == before


def test_ls_refuses_a_checkpoint_option(file_store, clink_pool_run):
    orders_job(file_store)
    result = clink_pool_run("savepoint", "ls", "-c", "2", "--store", file_store.uri)
    assert result.exit_code == 2 and "-c" in result.stderr


def test_store_and_checkpoint_before_the_job_and_to_after_it_take_that_checkpoint_there(file_store, tmp_path, clink_pool_run):
    models = orders_job(file_store)
    doc = pool_json(clink_pool_run, "savepoint", "--store", file_store.uri, "-c", "2", "orders", "--to", f"file://{tmp_path}/sp")
    assert doc["checkpoint_id"] == 2 and savepoint_rows(FileStore(tmp_path / "sp")) == models[2]


@pytest.mark.parametrize("args", [["--help"], ["--store", "S", "--help"]])
def test_savepoint_help_is_the_groups_and_names_its_commands(clink_pool_run, args):
    result = clink_pool_run("savepoint", *args)
    assert result.exit_code == 0 and "ls" in result.stdout and "delete" in result.stdout and "COMMAND" in result.stdout


@pytest.mark.parametrize("typo", ["lss", "delet", "LS"])
def test_a_typo_of_a_savepoint_command_writes_nothing_and_fails(file_store, clink_pool_run, typo):
    orders_job(file_store)
    before = sorted(o.key for o in file_store.list(""))
    result = clink_pool_run("savepoint", "--store", file_store.uri, typo, "x")
    assert result.exit_code != 0
    assert sorted(o.key for o in file_store.list("")) == before


@pytest.mark.parametrize(
    "inside",
    ["jobs/orders", "jobs", "jobs/orders/chk-2", "jobs/orders/chk-9", "jobs/orders/data"],
)
def test_a_target_store_inside_the_stores_jobs_is_refused_or_its_savepoint_survives_gc(file_store, clink_pool_run, inside):
    models = orders_job(file_store)
    made = clink_pool_run("savepoint", "--store", file_store.uri, "orders", "rel", "--target-store", f"{file_store.uri}/{inside}")
    if made.exit_code == 2:
        return  # refused: the property holds
    assert made.exit_code == 0, made.stderr
    gc = clink_pool_run("gc", "--store", file_store.uri, "--keep-last", "1", "--min-age", "0s")
    assert gc.exit_code == 0, gc.stderr
    assert savepoint_rows(PrefixStore(file_store, f"{inside}/savepoints/rel/")) == models[3]


def test_a_version_3_checkpoint_marks_no_operator_without_state(tmp_path):
    import shutil

    from pool.protocol import info_of
    from tests.pool_core_helpers import OLD_STORE_FIXTURE

    shutil.copytree(OLD_STORE_FIXTURE, tmp_path / "old")
    old = FileStore(tmp_path / "old")
    job = next(o.key.split("/")[1] for o in old.list("jobs/") if o.key.endswith("/_metadata"))
    _, manifest, _ = fresh(old).open_checkpoint(job)
    assert any(f.operators is None for f in manifest.files)
    info = info_of(job, manifest)
    assert info.operators and info.operators_without_state == ()


def _rescaled_after_compaction(store) -> Model:
    """Job orders: 3 checkpoints by two subtasks, compacted; checkpoint 4 by four subtasks that changed nothing (each part
    names the base of the half it lies in, so two parts share each base). The model of checkpoint 4.
    """
    models = orders_job(store, checkpoints=3)
    fresh(store).compact("orders", 3, force=True)
    core = PoolCore(store)
    for lo in (0, 32, 64, 96):
        kg = KeyGroupRange(lo, lo + 31)
        epoch, _ = core.acquire_writer("orders", kg)
        commit(core, "orders", 4, 3, kg, epoch, [])
    return models[3]


def test_a_rescale_after_compaction_shares_each_base_between_two_parts_and_reads_the_model(file_store):
    model = _rescaled_after_compaction(file_store)
    assert scan_checkpoint(file_store, "orders", 4) == model
    _, manifest, _ = fresh(file_store).open_checkpoint("orders", 4)
    assert len(manifest.parts) == 4 and len({p.layers[0][0] for p in manifest.parts}) == 2
    assert all(len(p.layers) == 1 and manifest.file(p.layers[0][0]).kind == "base" for p in manifest.parts)


def test_anatomy_of_a_rescale_after_compaction_counts_the_operator_state_once(file_store):
    model = _rescaled_after_compaction(file_store)
    doc = _anatomy(file_store, "orders", 4)
    assert doc["rows_counted"] == "live"
    assert {o["op_id"]: o["rows"] for o in doc["operators"]} == _live_per_operator(model)
    assert sum(t["rows"] for t in doc["subtasks"]) == len(model)


def test_every_savepoint_name_clink_pool_ls_lists_restores_with_from_savepoint(file_store, clink_pool_run):
    models = orders_job(file_store)
    life = fresh(file_store)
    life.savepoint("orders", name="rel")
    life.savepoint("orders", to=PrefixStore(file_store, "savepoints/orders/releases/r7/"))
    names = pool_json(clink_pool_run, "ls", "--store", file_store.uri)["savepoints"]
    assert sorted(names) == ["orders/releases/r7", "rel"]
    for i, name in enumerate(sorted(names)):
        pool_json(clink_pool_run, "restore", "--store", file_store.uri, f"copy{i}", "--from-savepoint", name)
        assert scan_checkpoint(file_store, f"copy{i}", 1) == models[3]


def test_per_key_group_sums_equal_a_segment_by_segment_model(tmp_path):
    from types import SimpleNamespace

    from store.anatomy import _per_key_group

    rng = random.Random(16)
    files = []
    model_rows, model_bytes = [0.0] * 128, [0.0] * 128
    for _ in range(300):
        segments = []
        for _ in range(rng.randrange(1, 9)):
            lo = rng.randrange(128)
            hi = rng.randrange(lo, 128)
            rows, length, operator = rng.randrange(10**9), rng.randrange(10**12), rng.random() < 0.1
            segments.append(SimpleNamespace(kg_lo=lo, kg_hi=hi, rows=rows, length=length, operator=operator))
            if not operator:
                for kg in range(lo, hi + 1):
                    model_rows[kg] += rows / (hi - lo + 1)
                    model_bytes[kg] += length / (hi - lo + 1)
        files.append(SimpleNamespace(segments=segments))
    rows, size = _per_key_group(SimpleNamespace(files=files))
    for lo, hi in ((0, 127), (0, 0), (5, 77), (127, 127), (64, 127)):
        assert round(float(rows[lo : hi + 1].sum())) == round(sum(model_rows[lo : hi + 1]))
        assert abs(float(size[lo : hi + 1].sum()) - sum(model_bytes[lo : hi + 1])) < 1
    assert min(rows) >= 0 and min(size) >= 0


@pytest.mark.parametrize("rescaled", [False, True], ids=["compacted", "compacted then rescaled"])
def test_verify_of_a_compacted_checkpoint_calls_lost_exactly_the_ranges_a_missing_base_makes_unreadable(file_store, clink_run, rescaled):
    cid = 4 if rescaled else 3
    if rescaled:
        _rescaled_after_compaction(file_store)
    else:
        orders_job(file_store, checkpoints=3)
        fresh(file_store).compact("orders", 3, force=True)
    _, manifest, _ = fresh(file_store).open_checkpoint("orders", cid)
    for entry in manifest.files:
        key = f"jobs/orders/{entry.path}"
        data = file_store.get(key)
        file_store.delete(key)
        code, doc = verify_json(clink_run, f"{file_store.uri}/jobs/orders/chk-{cid}")
        readable = [(lo, hi) for lo, hi in ((p.kg_lo, p.kg_hi) for p in manifest.parts) if _readable(file_store, "orders", cid, lo, hi)]
        assert code == 1 and [tuple(r) for r in doc["restorable_key_groups"]] == readable, entry.path
        file_store.put(key, data)


def _erased_source_job(store) -> bytes:
    """Job orders: checkpoint 1 puts a source row, checkpoint 2 erases it and puts a window row (layers, erases); the key."""
    core = PoolCore(store)
    epochs = [core.acquire_writer("orders", kg)[0] for kg in HALVES]
    k = keyed(keys_in_range(0, 63, 1)[0])
    commit(core, "orders", 1, 0, HALVES[0], epochs[0], [(s.ROW_PUT, OP_IDS["source"], k, b"1")])
    commit(core, "orders", 1, 0, HALVES[1], epochs[1], [])
    commit(core, "orders", 2, 1, HALVES[0], epochs[0], [(s.ROW_ERASE, OP_IDS["source"], k, b""), (s.ROW_PUT, OP_IDS["window"], k, b"2")])
    commit(core, "orders", 2, 1, HALVES[1], epochs[1], [])
    return k


def test_workers_of_a_job_restored_with_uids_restore_it_declaring_the_same_uids(file_store, address):
    k = _erased_source_job(file_store)
    life = fresh(file_store)
    life.restorer.restore("orders-v2", life.checkpoint_location("orders"), ["window"])
    with RemoteReadBackend.connect(address, "orders-v2", config=BackendConfig(warm_up="off")) as b:
        b.register_operator("window")
        assert b.restore().non_restored == {}
        assert b.get(OP_IDS["window"], k) == b"2"


def test_a_refused_cli_restore_lists_the_undeclared_operators_in_its_json_error(file_store, clink_pool_run):
    orders_job(file_store)
    result = clink_pool_run("restore", "--store", file_store.uri, "orders-v2", "--from-job", "orders", "--uid", "source", "-o", "json")
    assert result.exit_code == 2 and not file_store.exists(metadata_key("orders-v2", 1))
    doc = json.loads(result.stderr)
    assert {(o["op_id"], o["uid"]) for o in doc["operators"]} == {(OP_IDS["window"], "window"), (OP_IDS["sink"], "sink")}
