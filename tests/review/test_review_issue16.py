"""Hostile review of issue 16 (savepoint locations, delete, GC, safe restore, anatomy): each finding kept as the property it broke."""

from __future__ import annotations

import json
import random
import shutil

import grpc
import pyarrow as pa
import pytest

import snapshot as s
from client import BackendConfig, RemoteReadBackend
from pool.core import PoolCore
from pool.domain import KeyGroupRange
from pool.importer import Importer
from pool.lifecycle import Lifecycle, LifecycleConfig
from protos import remote_pool_pb2 as pb
from protos import remote_pool_pb2_grpc as pb_grpc
from snapshot.errors import InvalidArgumentError, NonRestoredStateError, NotFoundError, UnavailableError
from store.checkpoint import CheckpointReader
from store.layout import metadata_key
from store.local import FileStore
from store.locations import open_location
from store.memory import MemoryStore
from store.segment_cache import SegmentCache
from store.views import PrefixStore
from tests.client_fixtures import serving, start_pool
from tests.hook_store import HookStore
from tests.lifecycle_helpers import build_job, delta_for, fresh, scan_checkpoint, table_dict
from tests.pool_core_helpers import OP_IDS, Model, apply, commit, keyed, keys_in_range
from tests.savepoint_review_helpers import NO_AGE, backend_checkpoint, orders_job, pool_json, savepoint_rows, verify_json

SOURCE, WINDOW, SINK = OP_IDS["source"], OP_IDS["window"], OP_IDS["sink"]


# ---- GC and savepoints written with --to inside the store ---------------------------------------------------------


def test_gc_keeps_an_auto_named_savepoint_and_a_to_savepoint_one_level_under_savepoints(file_store):
    models = orders_job(file_store)
    life = fresh(file_store, NO_AGE)
    auto = life.savepoint("orders")
    life.savepoint("orders", to=PrefixStore(file_store, "savepoints/archive/"))
    life.gc()
    assert savepoint_rows(PrefixStore(file_store, auto.location.split(file_store.uri.rstrip("/") + "/")[1] + "/")) == models[3]
    assert savepoint_rows(PrefixStore(file_store, "savepoints/archive/")) == models[3]


@pytest.mark.parametrize("where", ["savepoints/orders/releases/r7/", "savepoints/orders/data/"])
def test_gc_keeps_a_to_savepoint_three_levels_under_savepoints(file_store, where):
    models = orders_job(file_store)
    life = fresh(file_store, NO_AGE)
    nested = PrefixStore(file_store, where)
    life.savepoint("orders", to=nested)
    result = life.gc()
    assert not [k for k in result.deleted if k.startswith("savepoints/")], result.deleted
    assert savepoint_rows(nested) == models[3]


def test_a_to_savepoint_in_a_job_folder_is_refused_or_survives_gc(file_store):
    models = orders_job(file_store)
    life = fresh(file_store, NO_AGE)
    inside = PrefixStore(file_store, "jobs/orders/")
    try:
        life.savepoint("orders", to=inside)
    except InvalidArgumentError:
        return  # refused: the property holds
    life.gc()
    assert savepoint_rows(inside) == models[3]


def test_a_to_savepoint_in_a_checkpoint_folder_does_not_become_a_checkpoint(file_store, clink_pool_run):
    models = orders_job(file_store)
    made = clink_pool_run("savepoint", "--store", file_store.uri, "orders", "--to", f"{file_store.uri}/jobs/orders/chk-9")
    if made.exit_code == 2:
        return  # refused: the property holds
    gc = clink_pool_run("gc", "--store", file_store.uri, "--keep-last", "1", "--min-age", "0s")
    assert gc.exit_code == 0, gc.stderr
    assert scan_checkpoint(file_store, "orders", 3) == models[3]


def test_savepoint_ls_lists_a_to_savepoint_three_levels_under_savepoints(file_store, clink_pool_run):
    orders_job(file_store)
    nested = PrefixStore(file_store, "savepoints/orders/releases/r7/")
    fresh(file_store).savepoint("orders", to=nested)
    listed = pool_json(clink_pool_run, "savepoint", "ls", "--store", file_store.uri)["savepoints"]
    assert [(sp["location"], sp["complete"]) for sp in listed] == [(nested.uri, True)]


def test_gc_and_delete_keep_a_savepoint_nested_in_another_and_the_one_around_it(file_store, clink_pool_run):
    models = orders_job(file_store)
    life = fresh(file_store, NO_AGE)
    outer, inner = PrefixStore(file_store, "savepoints/orders/"), PrefixStore(file_store, "savepoints/orders/inner/")
    life.savepoint("orders", 2, to=outer)
    life.savepoint("orders", 3, to=inner)
    life.gc()
    assert savepoint_rows(outer) == models[2] and savepoint_rows(inner) == models[3]
    pool_json(clink_pool_run, "savepoint", "delete", "--store", file_store.uri, inner.uri)
    assert savepoint_rows(outer) == models[2]
    life.gc()
    assert savepoint_rows(outer) == models[2]


# ---- clink-pool savepoint delete ------------------------------------------------------------------------------------


def _objects(store, prefix: str) -> list[str]:
    """Keys under ``prefix``, without a file store's own lock files."""
    return sorted(o.key for o in store.list(prefix) if not o.key.rsplit("/", 1)[-1].startswith(".clink-"))


def test_delete_of_one_savepoint_leaves_one_whose_name_it_prefixes(file_store, clink_pool_run):
    models = orders_job(file_store)
    life = fresh(file_store)
    short = PrefixStore(file_store, "savepoints/orders/savepoint-3-abc/")
    long = PrefixStore(file_store, "savepoints/orders/savepoint-3-abcd/")
    life.savepoint("orders", to=short)
    life.savepoint("orders", to=long)
    before = _objects(file_store, "savepoints/orders/savepoint-3-abcd/")
    pool_json(clink_pool_run, "savepoint", "delete", "--store", file_store.uri, short.uri)
    assert not _objects(file_store, "savepoints/orders/savepoint-3-abc/")
    assert _objects(file_store, "savepoints/orders/savepoint-3-abcd/") == before
    assert savepoint_rows(long) == models[3]


def test_delete_dry_run_deletes_nothing_and_names_every_object(file_store, clink_pool_run):
    orders_job(file_store)
    info = fresh(file_store).savepoint("orders")
    before = sorted((o.key, o.size) for o in file_store.list(""))
    doc = pool_json(clink_pool_run, "savepoint", "delete", "--store", file_store.uri, info.location, "--dry-run")
    assert sorted((o.key, o.size) for o in file_store.list("")) == before
    under = _objects(file_store, "savepoints/")
    assert sorted(f"savepoints/{info.name}/{k}" for k in doc["would_delete"]) == under and doc["deleted"] == []


@pytest.mark.parametrize("form", ["dir", "dir/", "_metadata"])
def test_delete_is_refused_while_a_job_restored_from_it_holds_its_checkpoint(file_store, clink_pool_run, form):
    models = orders_job(file_store)
    info = fresh(file_store).savepoint("orders", name="rel7")
    pool_json(clink_pool_run, "restore", "--store", file_store.uri, "orders-v2", "--from-savepoint", "rel7")
    location = {"dir": info.location, "dir/": info.location + "/", "_metadata": info.location + "/_metadata"}[form]
    pool_json(clink_pool_run, "savepoint", "delete", "--store", file_store.uri, location, code=4)
    assert savepoint_rows(PrefixStore(file_store, "savepoints/rel7/")) == models[3]
    doc = pool_json(clink_pool_run, "savepoint", "delete", "--store", file_store.uri, location, "--force")
    assert doc["restored_jobs"] == [{"job": "orders-v2", "checkpoint_id": 1}]
    assert not _objects(file_store, "savepoints/rel7/")
    assert scan_checkpoint(file_store, "orders-v2", 1) == models[3]  # the restored job copied its files


def test_delete_refusal_holds_when_restore_and_delete_name_the_savepoint_differently(file_store, clink_pool_run, tmp_path, monkeypatch):
    orders_job(file_store)
    fresh(file_store).savepoint("orders", name="rel7")
    pool_json(clink_pool_run, "restore", "--store", file_store.uri, "orders-v2", "--from", f"{file_store.uri}/savepoints/rel7/_metadata")
    monkeypatch.chdir(file_store.root)
    pool_json(clink_pool_run, "savepoint", "delete", "--store", file_store.uri, "savepoints/rel7", code=4)
    pool_json(clink_pool_run, "savepoint", "delete", "--store", file_store.uri, "./savepoints//rel7/", code=4)
    assert file_store.exists("savepoints/rel7/_metadata")


def test_a_deleted_savepoint_is_no_longer_listed(file_store, clink_pool_run):
    orders_job(file_store)
    info = fresh(file_store).savepoint("orders")
    pool_json(clink_pool_run, "savepoint", "delete", "--store", file_store.uri, info.location)
    assert pool_json(clink_pool_run, "savepoint", "ls", "--store", file_store.uri)["savepoints"] == []


# ---- the savepoint group and jobs named like its commands -----------------------------------------------------------


@pytest.mark.parametrize("job", ["ls", "delete", "create"])
def test_a_job_named_like_a_savepoint_command_can_be_saved_with_create(file_store, clink_pool_run, job):
    build_job(PoolCore(file_store), job, 1, random.Random(1))
    doc = pool_json(clink_pool_run, "savepoint", "create", "--store", file_store.uri, job)
    assert doc["job"] == job and file_store.exists(f"savepoints/{job}/{doc['location'].rsplit('/', 1)[-1]}/_metadata")
    listed = pool_json(clink_pool_run, "savepoint", "ls", "--store", file_store.uri, "--job", job)
    assert [sp["location"] for sp in listed["savepoints"]] == [doc["location"]]


def test_options_before_the_job_still_take_a_savepoint(file_store, clink_pool_run):
    orders_job(file_store)
    doc = pool_json(clink_pool_run, "savepoint", "--store", file_store.uri, "-c", "2", "orders")
    assert doc["checkpoint_id"] == 2


# ---- safe restore: the drop path against a dict model ----------------------------------------------------------------


def test_restore_dropping_an_operator_holds_exactly_the_declared_operators_live_rows(store):
    models = orders_job(store, checkpoints=4)
    life = fresh(store)
    source = life.checkpoint_location("orders", 4)
    res = life.restorer.restore("orders-v2", source, ["source", "sink"], allow_non_restored_state=True)
    assert res.dropped == {WINDOW: "window"}
    expected = {k: v for k, v in models[4].items() if k[0] != WINDOW}
    assert scan_checkpoint(store, "orders-v2", 1) == expected
    assert any(k[1][0] >= 128 for k in expected)  # operator-state rows are part of the comparison


def test_restore_dropping_an_operator_from_a_savepoint_and_rescaled_reads(store):
    models = orders_job(store, checkpoints=3)
    life = fresh(store)
    info = life.savepoint("orders", name="rel")
    source = life.context.savepoint_location("rel")
    life.restorer.restore("orders-v2", source, ["window"], allow_non_restored_state=True)
    expected = {k: v for k, v in models[3].items() if k[0] == WINDOW}
    assert info.rows == len(models[3])
    for lo, hi in ((0, 127), (0, 40), (41, 127)):
        got = scan_checkpoint(store, "orders-v2", 1, (lo, hi))
        assert got == {k: v for k, v in expected.items() if k[1][0] >= 128 or lo <= k[1][0] <= hi}


def test_undeclared_state_fails_the_restore_and_writes_nothing(store):
    orders_job(store)
    life = fresh(store)
    before = sorted(o.key for o in store.list(""))
    with pytest.raises(NonRestoredStateError, match="window"):
        life.restorer.restore("orders-v2", life.checkpoint_location("orders"), ["source", "sink"])
    assert sorted(o.key for o in store.list("")) == before


# ---- safe restore from sources written before version 4, and the operators a drop leaves behind ---------------------

RAW = s.operator_id("never-named")  # written by op_id only: no committer ever registered a uid for it


def _with_raw_operator(store) -> Model:
    """Job ``legacy``: checkpoint 1 holds rows of the three named operators and of the unnamed RAW operator."""
    core = PoolCore(store)
    epoch, _ = core.acquire_writer("legacy", KeyGroupRange(0, 127))
    rows = [(s.ROW_PUT, op, keyed(f"k{i}"), f"{op}-{i}".encode()) for op in (*OP_IDS.values(), RAW) for i in range(5)]
    commit(core, "legacy", 1, 0, KeyGroupRange(0, 127), epoch, rows)
    model: Model = {}
    apply(model, rows)
    return model


def _as_version_3(store, job: str, cid: int) -> None:
    """Rewrite a checkpoint's _metadata as a version-3 writer would have: no per-file operator counts, no anatomy."""
    key = metadata_key(job, cid)
    doc = json.loads(store.get(key))
    doc["version"] = 3
    doc.pop("anatomy", None)
    for f in doc["files"]:
        f.pop("operators", None)
    store.put(key, json.dumps(doc).encode())


def test_a_version_4_source_names_state_of_an_unnamed_operator_when_undeclared(store):
    _with_raw_operator(store)
    life = fresh(store)
    with pytest.raises(NonRestoredStateError, match=f"op_id 0x{RAW:016x}"):
        life.restorer.restore("legacy-v2", life.checkpoint_location("legacy"), list(OP_IDS))


def test_a_version_3_source_with_state_of_an_unnamed_operator_fails_an_undeclared_restore(store):
    model = _with_raw_operator(store)
    _as_version_3(store, "legacy", 1)
    life = fresh(store)
    try:
        life.restorer.restore("legacy-v2", life.checkpoint_location("legacy"), list(OP_IDS))
    except NonRestoredStateError:
        return
    assert {k: v for k, v in scan_checkpoint(store, "legacy-v2", 1).items() if k[0] == RAW} == {}, "undeclared state restored"
    assert any(k[0] == RAW for k in model)


def test_a_version_3_drop_reports_every_operator_whose_state_it_drops(store):
    model = _with_raw_operator(store)
    _as_version_3(store, "legacy", 1)
    life = fresh(store)
    res = life.restorer.restore("legacy-v2", life.checkpoint_location("legacy"), ["source", "sink"], allow_non_restored_state=True)
    got = scan_checkpoint(store, "legacy-v2", 1)
    assert got == {k: v for k, v in model.items() if k[0] in (SOURCE, SINK)}
    assert set(res.dropped) == {WINDOW, RAW}


def test_a_version_3_source_restores_every_row_when_all_named_operators_are_declared_and_none_dropped(store):
    model = _with_raw_operator(store)
    _as_version_3(store, "legacy", 1)
    life = fresh(store)
    life.restorer.restore("legacy-v2", life.checkpoint_location("legacy"))
    assert scan_checkpoint(store, "legacy-v2", 1) == model


def test_a_dropped_operator_is_gone_from_the_new_jobs_anatomy(file_store):
    table = pa.table(
        {
            "op_id": pa.array([SOURCE, WINDOW], pa.uint64()),
            "key_bytes": pa.array([keyed("a"), keyed("b")], pa.binary()),
            "value_bytes": pa.array([b"1", b"2"], pa.binary()),
        }
    )
    Importer.on_store(file_store).import_table("imp", table, {SOURCE: "source", WINDOW: "window"}, s.StateVersionMap({(WINDOW, "v"): 2}))
    life = fresh(file_store)
    life.restorer.restore("imp-v2", life.checkpoint_location("imp"), ["source"], allow_non_restored_state=True)
    doc = json.loads(file_store.get(metadata_key("imp-v2", 1)))
    assert [o["op_id"] for o in doc["anatomy"]["operators"]] == [SOURCE]


def test_an_operator_whose_state_was_all_erased_does_not_block_a_restore(store):
    core = PoolCore(store)
    kg = KeyGroupRange(0, 127)
    epoch, _ = core.acquire_writer("erased", kg)
    commit(core, "erased", 1, 0, kg, epoch, [(s.ROW_PUT, op, keyed("k"), b"v") for op in (SOURCE, WINDOW)])
    commit(core, "erased", 2, 1, kg, epoch, [(s.ROW_ERASE, WINDOW, keyed("k"), b"")])
    assert scan_checkpoint(store, "erased", 2) == {(SOURCE, keyed("k")): b"v"}
    life = fresh(store)
    res = life.restorer.restore("erased-v2", life.checkpoint_location("erased", 2), ["source"])
    assert res.dropped == {} and scan_checkpoint(store, "erased-v2", 1) == {(SOURCE, keyed("k")): b"v"}


# ---- verify: a missing, a corrupt and a truncated file, and the ranges still restorable -------------------------------


def _damage(store, key: str, how: str) -> None:
    data = store.get(key)
    if how == "missing":
        store.delete(key)
    elif how == "corrupt":
        store.put(key, data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
    else:
        store.put(key, data[: len(data) // 2])


@pytest.mark.parametrize("how", ["missing", "corrupt", "truncated"])
def test_verify_of_a_savepoint_names_the_damaged_file_and_the_ranges_still_restorable(file_store, clink_run, how):
    orders_job(file_store)
    info = fresh(file_store).savepoint("orders", name="rel")
    loc = open_location(info.location)
    upper = next(p for p in loc.manifest.parts if p.kg_lo == 64).layers[0][0]
    code, doc = verify_json(clink_run, info.location)
    assert code == 0 and doc["restorable_key_groups"] == [[0, 63], [64, 127]] and doc["lost_key_groups"] == []
    _damage(file_store, f"savepoints/rel/{upper}", how)
    code, doc = verify_json(clink_run, info.location + "/_metadata")
    assert code == 1
    assert [d["path"] for d in doc["damaged_files"]] == [upper]
    assert doc["restorable_key_groups"] == [[0, 63]] and doc["lost_key_groups"] == [[64, 127]]


def test_verify_of_a_rescaled_checkpoint_loses_every_range_that_reads_a_shared_file(file_store, clink_run):
    orders_job(file_store)
    core = PoolCore(file_store)
    quarters = [KeyGroupRange(32 * i, 32 * i + 31) for i in range(4)]
    for kg in quarters:
        epoch, _ = core.acquire_writer("orders", kg)
        commit(core, "orders", 4, 3, kg, epoch, [(s.ROW_PUT, SOURCE, keyed(keys_in_range(kg.lo, kg.hi, 1)[0]), b"q")])
    m = open_location(f"{file_store.uri}/jobs/orders/chk-4").manifest
    first = next(p for p in m.parts if p.kg_lo == 0)
    shared = next(x for layer in first.layers for x in layer if sum(x in {y for ly in p.layers for y in ly} for p in m.parts) == 2)
    file_store.delete(f"jobs/orders/{shared}")
    code, doc = verify_json(clink_run, f"{file_store.uri}/jobs/orders/chk-4")
    assert code == 1 and [d["path"] for d in doc["damaged_files"]] == [shared]
    if doc["damaged_files"][0]["operator_state"]:  # every range reads the operator state: all of them are lost
        assert doc["lost_key_groups"] == [[32 * i, 32 * i + 31] for i in range(4)] and doc["restorable_key_groups"] == []
    else:
        assert doc["lost_key_groups"] == [[0, 31], [32, 63]] and doc["restorable_key_groups"] == [[64, 95], [96, 127]]
    life = fresh(file_store)
    for lo, hi in doc["restorable_key_groups"]:
        life.read_table(*life.open_checkpoint("orders", 4)[:2], (lo, hi))
    for lo, hi in doc["lost_key_groups"]:  # what verify calls lost cannot be read
        with pytest.raises(NotFoundError):
            life.read_table(*life.open_checkpoint("orders", 4)[:2], (lo, hi))


# ---- anatomy against the data, and info-only fields never used -------------------------------------------------------


def _live_per_operator(model: Model) -> dict[int, int]:
    return {op: sum(1 for o, _ in model if o == op) for op in OP_IDS.values()}


def _counts(model: Model, lo: int, hi: int, with_operator_state: bool) -> int:
    return sum(1 for _, k in model if (lo <= k[0] <= hi) or (with_operator_state and k[0] >= 128))


def test_savepoint_anatomy_counts_each_subtasks_and_operators_live_rows(store):
    models = orders_job(store, checkpoints=4)
    info = fresh(store).savepoint("orders")
    doc = json.loads(store.get(f"savepoints/{info.name}/_metadata"))["anatomy"]
    assert doc["rows_counted"] == "live"
    subtasks = {(t["kg_lo"], t["kg_hi"]): t["rows"] for t in doc["subtasks"]}
    assert subtasks == {(0, 63): _counts(models[4], 0, 63, True), (64, 127): _counts(models[4], 64, 127, False)}
    assert {o["op_id"]: o["rows"] for o in doc["operators"]} == _live_per_operator(models[4])


def test_anatomy_of_a_job_restored_from_a_savepoint_counts_live_rows(file_store):
    models = orders_job(file_store, checkpoints=4)
    life = fresh(file_store)
    life.savepoint("orders", name="rel")
    life.restorer.restore("orders-v2", life.context.savepoint_location("rel"))
    doc = json.loads(file_store.get(metadata_key("orders-v2", 1)))["anatomy"]
    assert doc["rows_counted"] == "live" and doc["rows"] == len(models[4])
    assert {o["op_id"]: o["rows"] for o in doc["operators"]} == _live_per_operator(models[4])
    assert sum(t["rows"] for t in doc["subtasks"]) == len(models[4])


def test_anatomy_of_a_compacted_checkpoint_with_two_parts_counts_live_rows(file_store):
    models = orders_job(file_store, checkpoints=4)
    fresh(file_store).compact("orders", 4, force=True)
    doc = json.loads(file_store.get(metadata_key("orders", 4)))["anatomy"]
    assert doc["rows_counted"] == "live"
    assert {o["op_id"]: o["rows"] for o in doc["operators"]} == _live_per_operator(models[4])
    assert sum(t["rows"] for t in doc["subtasks"]) == len(models[4])


def test_info_only_fields_of_a_copied_savepoint_are_never_used(file_store, tmp_path, clink_run):
    models = orders_job(file_store)
    info = fresh(file_store).savepoint("orders", name="rel")
    copy = tmp_path / "copied" / "release 7"
    shutil.copytree(file_store.root / "savepoints" / "rel", copy)
    doc = json.loads((copy / "_metadata").read_text())
    doc["savepoint"].update(written_to="s3://nowhere/else", source_store="s3://nowhere/pool")
    doc["anatomy"]["operators"] = [{"op_id": 1, "rows": 999}]
    (copy / "_metadata").write_text(json.dumps(doc))
    (file_store.root / "savepoints" / "rel").rename(tmp_path / "moved-away")  # the original is gone
    loc = open_location(str(copy))
    assert savepoint_rows(loc.directory) == models[3] and info.rows == len(models[3])
    result = clink_run("savepoint", "inspect", copy.as_uri(), "-o", "json")
    assert result.exit_code == 0, result.stderr
    shown = json.loads(result.stdout)
    assert {o["op_id"]: o["rows"] for o in shown["operators"]} == _live_per_operator(models[3])


# ---- locations: every way of naming one savepoint opens it, and only it ----------------------------------------------


@pytest.mark.parametrize("form", ["path", "path/", "path/_metadata", "uri", "uri/_metadata/", "relative", "dotdot"])
def test_every_spelling_of_a_local_savepoint_location_opens_the_same_savepoint(file_store, tmp_path, monkeypatch, form):
    models = orders_job(file_store)
    target = tmp_path / "arch ive" / "rel7"
    target.mkdir(parents=True)
    fresh(file_store).savepoint("orders", to=FileStore(target))
    monkeypatch.chdir(tmp_path)
    spelled = {
        "path": str(target),
        "path/": f"{target}/",
        "path/_metadata": f"{target}/_metadata",
        "uri": target.as_uri(),
        "uri/_metadata/": target.as_uri() + "/_metadata/",
        "relative": "arch ive/rel7",
        "dotdot": "arch ive/../arch ive/rel7/_metadata",
    }[form]
    loc = open_location(spelled)
    assert (loc.kind, loc.uri) == ("savepoint", FileStore(target).uri)
    assert savepoint_rows(loc.directory) == models[3]


def test_a_savepoint_at_an_s3_bucket_root_opens_by_bucket_uri_and_by_its_metadata(make_s3_store, s3_config):
    source = make_s3_store(prefix="pool")
    models = orders_job(source)
    bucket_root = make_s3_store(prefix="")
    fresh(source).savepoint("orders", to=bucket_root)
    bucket = bucket_root.uri.removeprefix("s3://").strip("/").split("/")[0]
    for spelled in (f"s3://{bucket}", f"s3://{bucket}/", f"s3://{bucket}/_metadata"):
        loc = open_location(spelled, s3_config)
        assert loc.kind == "savepoint" and savepoint_rows(loc.directory) == models[3], spelled


def test_a_savepoint_written_to_a_directory_named_like_a_checkpoint_opens_as_that_savepoint(file_store, tmp_path):
    models = orders_job(file_store)
    target = tmp_path / "archive" / "jobs" / "orders" / "chk-3"
    target.mkdir(parents=True)
    fresh(file_store).savepoint("orders", to=FileStore(target))
    loc = open_location(str(target))
    assert savepoint_rows(loc.directory) == models[3]


# ---- the RPC: a job's savepoint stays under savepoints/<job>/ ----------------------------------------------------------


@pytest.fixture
def stub(file_store):
    server = start_pool(file_store)
    channel = grpc.insecure_channel(server.address)
    try:
        yield pb_grpc.RemotePoolStub(channel)
    finally:
        channel.close()
        server.stop(0)


@pytest.mark.parametrize("name", ["../up", "a/b", "/abs", "data", "_metadata", "..", "s3://b/x", "x\\..\\y", " "])
def test_an_rpc_savepoint_name_cannot_leave_its_jobs_folder(file_store, stub, name):
    orders_job(file_store)
    build_job(PoolCore(file_store), "other", 1, random.Random(2))
    with pytest.raises(grpc.RpcError) as raised:
        stub.Savepoint(pb.SavepointRequest(job="orders", name=name), timeout=30)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert not _objects(file_store, "savepoints/")


def test_an_unnamed_rpc_savepoint_lands_under_its_job_and_reads_back(file_store, stub):
    models = orders_job(file_store)
    sp = stub.Savepoint(pb.SavepointRequest(job="orders"), timeout=30)
    assert sp.location.startswith("savepoints/orders/savepoint-3-") and sp.location.endswith("/")
    assert savepoint_rows(PrefixStore(file_store, sp.location)) == models[3]


# ---- import: parallelism out of range writes nothing ------------------------------------------------------------------


@pytest.mark.parametrize("parallelism", [0, -1, 129, True, 2.0])
def test_import_refuses_a_parallelism_out_of_range_and_writes_nothing(file_store, parallelism):
    table = pa.table(
        {"op_id": pa.array([SOURCE], pa.uint64()), "key_bytes": pa.array([keyed("a")], pa.binary()), "value_bytes": pa.array([b"1"])}
    )
    with pytest.raises(InvalidArgumentError, match="parallelism"):
        Importer.on_store(file_store).import_table("imp", table, {SOURCE: "source"}, None, parallelism)
    assert not _objects(file_store, "")


# ---- the drop path and GC: a pause between the folded files and the parts naming them ---------------------------------


@pytest.mark.parametrize("drop", [True, False], ids=["drops state", "copies"])
def test_a_paused_restore_publishes_nothing_gc_may_have_deleted(drop):
    now = {"s": 1_000_000.0}
    clock = lambda: now["s"]  # noqa: E731
    inner = MemoryStore("pause", clock_ms=lambda: int(now["s"] * 1000))
    config = LifecycleConfig(gc_min_age_s=3600, max_write_s=1800)
    models = build_job(PoolCore(inner, clock=clock), "orders", 2, random.Random(5))
    hooked = HookStore(inner)

    def paused() -> None:
        now["s"] += 7200
        Lifecycle(inner, config, clock=clock).gc()

    hooked.on("put_if_absent", "jobs/orders-v2/data/", paused, when="after")
    life = Lifecycle(hooked, config, clock=clock)
    with pytest.raises(UnavailableError, match="took longer than 1800 s"):
        if drop:
            life.restorer.restore("orders-v2", life.checkpoint_location("orders"), ["source", "sink"], allow_non_restored_state=True)
        else:
            life.restorer.restore("orders-v2", life.checkpoint_location("orders"))
    assert not inner.exists(metadata_key("orders-v2", 1)), "a refused restore was published"
    assert not list(inner.list("jobs/orders-v2/")), "a refused restore left objects behind"
    again = Lifecycle(inner, config, clock=clock)  # the name is free again: no pause this time
    again.restorer.restore("orders-v2", again.checkpoint_location("orders"))
    assert scan_checkpoint(inner, "orders-v2", 1) == models[2]


# ---- verify and open_location: spellings of a checkpoint folder ---------------------------------------------------------


def test_verify_accepts_a_checkpoint_metadata_uri_with_a_trailing_slash_as_inspect_does(file_store, clink_run):
    orders_job(file_store)
    location = f"{file_store.uri}/jobs/orders/chk-3/_metadata/"
    assert clink_run("savepoint", "inspect", location).exit_code == 0
    code, doc = verify_json(clink_run, location)
    assert code == 0 and doc["passed"]


def test_a_checkpoint_folder_spelled_with_a_double_slash_opens_that_checkpoint(file_store):
    models = orders_job(file_store)
    loc = open_location(f"{file_store.uri}/jobs/orders//chk-3")
    assert loc.uri == f"{file_store.uri}/jobs/orders/chk-3"
    assert table_dict(fresh(file_store).read_table(CheckpointReader(loc.store, loc.job, SegmentCache(1 << 20)), loc.manifest)) == models[3]


# ---- more guards: uneven ranges, an empty restore, a crafted _metadata -------------------------------------------------


def test_savepoint_and_drop_of_a_job_with_uneven_ranges_committed_out_of_order_equal_the_model(file_store):
    core = PoolCore(file_store)
    ranges = [KeyGroupRange(100, 127), KeyGroupRange(0, 63), KeyGroupRange(64, 99)]
    epochs = [core.acquire_writer("odd", kg)[0] for kg in ranges]
    rng, model = random.Random(3), {}
    for cid in (1, 2, 3):
        for i, kg in enumerate(ranges):
            rows = delta_for(rng, model, kg, 40, cid, op_rows=i == 0)
            apply(model, rows)
            commit(core, "odd", cid, cid - 1, kg, epochs[i], rows)
    life = fresh(file_store)
    info = life.savepoint("odd", name="sp")
    assert info.parallelism == 3 and savepoint_rows(PrefixStore(file_store, "savepoints/sp/")) == model
    life.restorer.restore("odd-v2", life.context.savepoint_location("sp"), ["window"], allow_non_restored_state=True)
    assert scan_checkpoint(file_store, "odd-v2", 1) == {k: v for k, v in model.items() if k[0] == WINDOW}


def test_a_restore_that_drops_every_operator_starts_empty_and_takes_commits(file_store):
    orders_job(file_store)
    life = fresh(file_store)
    res = life.restorer.restore("blank", life.checkpoint_location("orders"), ["renamed"], allow_non_restored_state=True)
    assert set(res.dropped) == set(OP_IDS.values()) and res.declared_without_state == {"renamed": s.operator_id("renamed")}
    assert scan_checkpoint(file_store, "blank", 1) == {}
    core = PoolCore(file_store)
    kg = KeyGroupRange(0, 127)
    epoch, latest = core.acquire_writer("blank", kg)
    assert latest == 1
    commit(core, "blank", 2, 1, kg, epoch, [(s.ROW_PUT, SOURCE, keyed("k"), b"v")])
    assert scan_checkpoint(file_store, "blank", 2) == {(SOURCE, keyed("k")): b"v"}


@pytest.mark.parametrize("path", ["data/../../../jobs/orders/writers", "../../jobs/orders/writers", "/etc/passwd"])
def test_delete_of_a_savepoint_whose_metadata_names_a_file_outside_it_deletes_nothing(file_store, clink_pool_run, path):
    orders_job(file_store)
    info = fresh(file_store).savepoint("orders", name="rel")
    doc = json.loads(file_store.get("savepoints/rel/_metadata"))
    doc["files"][0]["path"] = path
    file_store.put("savepoints/rel/_metadata", json.dumps(doc).encode())
    before = _objects(file_store, "")
    result = clink_pool_run("savepoint", "delete", "--store", file_store.uri, info.location)
    assert result.exit_code != 0
    assert _objects(file_store, "") == before


# ---- the client's restore check and the pool's agree on what "holds state" means --------------------------------------


@pytest.fixture
def address(file_store):
    with serving(file_store) as served:
        yield served


def test_the_pool_restores_a_job_that_omits_an_operator_named_without_state(file_store, address):
    backend_checkpoint(address, "named", ["agg", "sideline"], ["agg"])
    life = fresh(file_store)
    res = life.restorer.restore("named-v2", life.checkpoint_location("named"), ["agg"])
    assert res.dropped == {} and scan_checkpoint(file_store, "named-v2", 1) == {(s.operator_id("agg"), keyed("agg")): b"agg"}


def test_a_backend_restores_a_job_that_omits_an_operator_named_without_state(address):
    backend_checkpoint(address, "named", ["agg", "sideline"], ["agg"])
    with RemoteReadBackend.connect(address, "named", config=BackendConfig(warm_up="off")) as b:
        b.register_operator("agg")
        restored = b.restore()
        assert restored.non_restored == {} and b.get(s.operator_id("agg"), keyed("agg")) == b"agg"


# ---- a damaged or newer savepoint named by NAME is said to be damaged or newer, not missing ---------------------------


@pytest.mark.parametrize("damage", ["truncated", "newer"])
def test_inspect_of_a_named_savepoint_with_a_damaged_or_newer_metadata_says_so(file_store, clink_pool_run, damage):
    orders_job(file_store)
    fresh(file_store).savepoint("orders", name="rel")
    data = file_store.get("savepoints/rel/_metadata")
    if damage == "truncated":
        file_store.put("savepoints/rel/_metadata", data[: len(data) // 2])
    else:
        file_store.put("savepoints/rel/_metadata", json.dumps({**json.loads(data), "version": 99}).encode())
    restored = clink_pool_run("restore", "--store", file_store.uri, "rel-v2", "--from-savepoint", "rel")
    assert restored.exit_code == 2 and ("truncated" in restored.stderr or "newer" in restored.stderr), restored.stderr
    inspected = clink_pool_run("inspect", "--store", file_store.uri, "--savepoint", "rel")
    assert inspected.exit_code == 2 and ("truncated" in inspected.stderr or "newer" in inspected.stderr), inspected.stderr


# ---- a failed restore leaves nothing behind, so it can be run again ----------------------------------------------------


def _fail() -> None:
    raise UnavailableError("injected: the store went away")


@pytest.mark.parametrize(
    "drop",
    [False, True],
)
def test_a_restore_failing_after_its_first_file_can_be_run_again(file_store, drop):
    models = orders_job(file_store)
    hooked = HookStore(file_store)
    hooked.on("put_if_absent", "jobs/orders-v2/data/", _fail, skip=1)
    uids = ["source", "sink"] if drop else None
    life = Lifecycle(hooked)
    with pytest.raises(UnavailableError, match="injected"):
        life.restorer.restore("orders-v2", life.checkpoint_location("orders"), uids, allow_non_restored_state=drop)
    assert _objects(file_store, "jobs/orders-v2/") == []
    life = fresh(file_store)
    life.restorer.restore("orders-v2", life.checkpoint_location("orders"), uids, allow_non_restored_state=drop)
    expected = {k: v for k, v in models[3].items() if not drop or k[0] != WINDOW}
    assert scan_checkpoint(file_store, "orders-v2", 1) == expected


def test_an_s3_location_is_not_satisfied_by_a_sibling_prefix_that_extends_its_name(make_s3_store, s3_config):
    source = make_s3_store(prefix="pool")
    orders_job(source)
    sibling = make_s3_store(prefix="archive/rel72")
    bucket = sibling.uri.removeprefix("s3://").split("/")[0]
    fresh(source).savepoint("orders", to=sibling)
    with pytest.raises((NotFoundError, InvalidArgumentError)):
        open_location(f"s3://{bucket}/archive/rel7", s3_config)
    assert open_location(f"s3://{bucket}/archive/rel72/", s3_config).kind == "savepoint"


def test_import_refuses_rows_in_the_wrong_key_group_and_writes_nothing(file_store):
    good = keyed("a")
    wrong = bytes([(good[0] + 1) % 128]) + good[1:]
    table = pa.table(
        {
            "op_id": pa.array([SOURCE, SOURCE], pa.uint64()),
            "key_bytes": pa.array([good, wrong], pa.binary()),
            "value_bytes": pa.array([b"1", b"2"]),
        }
    )
    with pytest.raises(InvalidArgumentError):
        Importer.on_store(file_store).import_table("imp", table, {SOURCE: "source"}, None, 4)
    assert not _objects(file_store, "")


def test_target_store_without_a_name_writes_there_or_is_refused(file_store, make_file_store, clink_pool_run):
    orders_job(file_store)
    archive = make_file_store("archive")
    result = clink_pool_run("savepoint", "--store", file_store.uri, "orders", "--target-store", archive.uri)
    if result.exit_code == 2:
        return  # refused: the property holds
    assert result.exit_code == 0, result.stderr
    assert _objects(archive, "savepoints/") and not _objects(file_store, "savepoints/")
