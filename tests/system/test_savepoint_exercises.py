"""The seed's three savepoint exercises end to end (issue 16) on the file store and moto S3: inspect, damage, rescale, relocate."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable

import pytest

import snapshot as s
from clink.cli.common import EXIT_DATA, EXIT_NOT_FOUND
from pool.core import PoolCore
from pool.domain import CommitRequest, KeyGroupRange
from snapshot.errors import ClinkError
from store.checkpoint import CheckpointReader
from store.locations import open_directory
from store.objects import ObjectStore, StoreConfig, open_store
from store.segment_cache import SegmentCache
from store.views import PrefixStore
from tests.lifecycle_helpers import scan_checkpoint, table_dict
from tests.pool_core_helpers import OP_IDS, OPERATOR_PAIRS, Model, Row, apply, changelog, filter_model, keyed, keys_in_range, op_key

RANGES = ((0, 31), (32, 63), (64, 95), (96, 127))
SOURCE, KEYED = OP_IDS["source"], (OP_IDS["window"], OP_IDS["sink"])
CHECKPOINTS = 4
TARGET_RATIO = 1.25
VERSIONS = s.StateVersionMap({(OP_IDS["window"], "ValueState<Profile>"): 3, (OP_IDS["sink"], "MapState<Order>"): 2})


# ---- the parallelism-4 job and its model ----------------------------------------------------------------------------


def delta(rng: random.Random, model: Model, subtask: int, universe: list[str], n: int, cid: int) -> list[Row]:
    """Puts, overwrites and erases of keyed state of two operators; subtask 0 also writes the source's operator state."""
    rows: list[Row] = []
    for j in range(n):
        if subtask == 0 and rng.random() < 0.1:
            op, key = SOURCE, op_key(f"partition-{rng.randrange(6)}")
        else:
            op, key = rng.choice(KEYED), keyed(rng.choice(universe))
        if (op, key) in model and rng.random() < 0.3:
            rows.append((s.ROW_ERASE, op, key, b""))
        else:
            rows.append((s.ROW_PUT, op, key, f"c{cid}-{j}-".encode() + rng.randbytes(rng.randint(60, 140))))
    return rows


def build_p4(store: ObjectStore, job: str = "orders", seed: int = 4, rows: int = 250) -> Model:
    """Four subtasks (0-31, 32-63, 64-95, 96-127) commit CHECKPOINTS incremental checkpoints; the model of the last."""
    rng = random.Random(seed)
    core = PoolCore(store)
    epochs = [core.acquire_writer(job, KeyGroupRange(lo, hi))[0] for lo, hi in RANGES]
    universes = [keys_in_range(lo, hi, 160) for lo, hi in RANGES]
    model: Model = {}
    for cid in range(1, CHECKPOINTS + 1):
        for i, (lo, hi) in enumerate(RANGES):
            rows_ = delta(rng, model, i, universes[i], rows, cid)
            apply(model, rows_)
            request = CommitRequest(job, cid, cid - 1, KeyGroupRange(lo, hi), epochs[i], VERSIONS.pack(), OPERATOR_PAIRS)
            core.commit_checkpoint(request, [changelog(rows_)])
    return model


def operator_rows(model: Model) -> int:
    return sum(1 for _, k in model if k[0] >= 128)


def in_range(model: Model, lo: int, hi: int, first: bool) -> int:
    """Rows a subtask of lo..hi holds: its keyed rows, and the operator state when it is the first subtask."""
    return len(filter_model(model, lo, hi)) - (0 if first else operator_rows(model))


def rows_of(model: Model, op: int) -> int:
    return sum(1 for o, _ in model if o == op)


# ---- the command lines ----------------------------------------------------------------------------------------------


@pytest.fixture
def cli(clink_run, clink_pool_run, s3_cli_env) -> Callable[..., dict | str]:
    """cli("clink"|"clink-pool", *args, code=0): run it with moto's endpoint in the environment; JSON parsed with -o json."""

    def run(tool: str, *args: str, code: int = 0) -> dict | str:
        result = (clink_run if tool == "clink" else clink_pool_run)(*args, env=s3_cli_env)
        assert result.exit_code == code, (args, result.stdout, result.stderr)
        return json.loads(result.stdout) if "json" in args else result.stdout

    return run


@pytest.fixture
def p4(store, cli):
    """(store, model, location): the parallelism-4 job 'orders' and a savepoint of its last checkpoint at the default place."""
    model = build_p4(store)
    location = cli("clink-pool", "savepoint", "--store", store.uri, "orders", "-c", str(CHECKPOINTS), "-o", "json")["location"]
    return store, model, location


def key_of(store: ObjectStore, location: str, path: str) -> str:
    """The store key of a file of a savepoint that lies inside ``store``."""
    assert location.startswith(store.uri.rstrip("/") + "/"), location
    return f"{location[len(store.uri.rstrip('/')) + 1 :]}/{path}"


# ---- exercise 1: inspect --------------------------------------------------------------------------------------------


def test_inspect_shows_operators_subtasks_files_and_provenance_of_a_parallelism_4_savepoint(p4, cli, s3_config: StoreConfig):
    store, model, location = p4
    assert operator_rows(model) > 0 and len({op for op, k in model if k[0] < 128}) == 2
    assert read_range(open_store(location, s3_config), 0, 127)[0] == model
    assert re.fullmatch(rf"{re.escape(store.uri)}/savepoints/orders/savepoint-{CHECKPOINTS}-[0-9a-f]{{6}}", location)
    assert store.exists(key_of(store, location, "_metadata"))
    doc = cli("clink", "savepoint", "inspect", location, "-o", "json")
    assert (doc["kind"], doc["job"], doc["checkpoint_id"]) == ("savepoint", "orders", CHECKPOINTS)
    assert (doc["parallelism"], doc["max_parallelism"], doc["rows"], doc["rows_counted"]) == (4, 128, len(model), "live")

    ops = {o["uid"]: o for o in doc["operators"]}
    assert set(ops) == {"source", "window", "sink"}
    for uid, o in ops.items():
        assert (o["op_id"], o["parallelism"], o["max_parallelism"]) == (OP_IDS[uid], 4, 128)
        assert o["rows"] == rows_of(model, OP_IDS[uid]) > 0, uid
    assert [(x["slot"], x["kind"], x["rows"]) for x in ops["source"]["states"]] == [("o", "operator", rows_of(model, SOURCE))]
    for uid in ("window", "sink"):
        assert [(x["slot"], x["kind"], x["rows"]) for x in ops[uid]["states"]] == [("v", "keyed", rows_of(model, OP_IDS[uid]))]
    assert {uid: [(v["state_type"], v["version"]) for v in o["state_versions"]] for uid, o in ops.items()} == {
        "source": [],
        "window": [("ValueState<Profile>", 3)],
        "sink": [("MapState<Order>", 2)],
    }

    assert [(t["subtask"], t["kg_lo"], t["kg_hi"]) for t in doc["subtasks"]] == [(i, lo, hi) for i, (lo, hi) in enumerate(RANGES)]
    assert [t["rows"] for t in doc["subtasks"]] == [in_range(model, lo, hi, i == 0) for i, (lo, hi) in enumerate(RANGES)]

    files = sorted(doc["files"], key=lambda f: f["kg_lo"])
    assert [(f["kg_lo"], f["kg_hi"], f["subtasks"]) for f in files] == [(lo, hi, [i]) for i, (lo, hi) in enumerate(RANGES)]
    assert [f["rows"] for f in files] == [t["rows"] for t in doc["subtasks"]]
    for f in files:
        assert f["size"] == store.head(key_of(store, location, f["path"])).size, f["path"]
    assert doc["bytes"] == sum(f["size"] for f in files)

    sp = doc["provenance"]["savepoint"]
    assert (sp["source_job"], sp["source_checkpoint_id"], sp["source_store"]) == ("orders", CHECKPOINTS, store.uri)
    assert doc["provenance"]["created_at"].endswith("Z")

    text = cli("clink", "savepoint", "inspect", location)
    assert "parallelism 4 (max parallelism 128)" in text and f"checkpoint {CHECKPOINTS} of job orders" in text
    for uid in ops:
        assert re.search(rf"^  {uid}\s+0x{OP_IDS[uid]:016x}\s+4\s+128\s+{ops[uid]['rows']}\s", text, re.M), uid
    assert "ValueState<Profile>=v3" in text and "MapState<Order>=v2" in text
    for i, (lo, hi) in enumerate(RANGES):
        assert re.search(rf"^  {i}\s+{lo}-{hi}\s+{doc['subtasks'][i]['rows']}\s", text, re.M), (i, text)
    for f in files:
        assert f["path"] in text


# ---- exercise 2: damage ---------------------------------------------------------------------------------------------


def flip(store: ObjectStore, key: str) -> None:
    data = bytearray(store.get(key))
    for i in range(len(data) // 2, len(data) // 2 + 16):
        data[i] ^= 0xFF
    store.put(key, bytes(data))


@pytest.mark.parametrize(("harm", "subtask"), [("flip bytes", 2), ("delete", 0)])
def test_verify_names_the_damaged_file_what_it_holds_and_what_still_restores(p4, cli, clink_pool_run, s3_cli_env, harm, subtask):
    store, model, location = p4
    assert cli("clink", "savepoint", "verify", location).rstrip().endswith("PASS")
    healthy = cli("clink", "savepoint", "verify", location, "-o", "json")
    assert healthy["passed"] is True and healthy["damaged_files"] == [] and healthy["lost_key_groups"] == []
    assert healthy["restorable_key_groups"] == [list(r) for r in RANGES]
    inspected = cli("clink", "savepoint", "inspect", location, "-o", "json")
    path = next(f["path"] for f in inspected["files"] if f["subtasks"] == [subtask])
    lo, hi = RANGES[subtask]
    if harm == "delete":
        store.delete(key_of(store, location, path))
    else:
        flip(store, key_of(store, location, path))

    doc = cli("clink", "savepoint", "verify", location, "-o", "json", code=1)
    assert doc["passed"] is False and [d["path"] for d in doc["damaged_files"]] == [path]
    damaged = doc["damaged_files"][0]
    assert damaged["key_groups"] == [[lo, hi]] and damaged["operator_state"] is (subtask == 0)
    held = filter_model(model, lo, hi) if subtask == 0 else {k: v for k, v in filter_model(model, lo, hi).items() if k[1][0] < 128}
    expected_ops = {op: rows_of(held, op) for op in {op for op, _ in held}}
    assert {o["op_id"]: o["rows"] for o in damaged["operators"]} == expected_ops
    assert {o["uid"] for o in damaged["operators"]} == ({"window", "sink", "source"} if subtask == 0 else {"window", "sink"})
    # subtask 0's file holds the operator state too, which every subtask reads: then nothing restores from this savepoint
    lost = list(RANGES) if subtask == 0 else [(lo, hi)]
    assert doc["lost_key_groups"] == [list(r) for r in lost]
    assert doc["restorable_key_groups"] == [list(r) for r in RANGES if r not in lost]
    check = "presence" if harm == "delete" else "checksum"
    assert any(f["status"] == "fail" and f["check"] == check and f.get("path") == path for f in doc["findings"]), doc["findings"]

    text = cli("clink", "savepoint", "verify", location, code=1)
    assert re.search(rf"^DAMAGED {re.escape(path)} \({check}: .*\): holds key groups {lo}-{hi}", text, re.M), text
    others = ", ".join(f"{a}-{b}" for a, b in RANGES if (a, b) not in lost) or "none"
    assert f"restorable key groups: {others}; lost: {', '.join(f'{a}-{b}' for a, b in lost)}" in text
    assert ("the operator state is lost" in text) is (subtask == 0)

    # a whole restore refuses the damaged savepoint, naming the file, and writes nothing
    failed = clink_pool_run("restore", "--store", store.uri, "orders-v2", "--from", location, env=s3_cli_env)
    assert failed.exit_code == (EXIT_NOT_FOUND if harm == "delete" else EXIT_DATA) and path in failed.stderr
    assert list(store.list("jobs/orders-v2/")) == []


# subtask 0's file holds the operator state too, which every range reads: with it gone no range restores
@pytest.mark.parametrize(("harm", "subtask", "ranges_left"), [("flip bytes", 2, 3), ("delete", 0, 0), ("flip bytes", 0, 0)])
def test_the_ranges_verify_calls_restorable_do_restore(p4, cli, s3_config: StoreConfig, harm, subtask, ranges_left):
    store, model, location = p4
    path = next(f["path"] for f in cli("clink", "savepoint", "inspect", location, "-o", "json")["files"] if f["subtasks"] == [subtask])
    if harm == "delete":
        store.delete(key_of(store, location, path))
    else:
        flip(store, key_of(store, location, path))
    report = cli("clink", "savepoint", "verify", location, "-o", "json", code=1)
    restorable = report["restorable_key_groups"]
    assert len(restorable) == ranges_left and len(report["lost_key_groups"]) == 4 - ranges_left
    if harm == "delete" and not ranges_left:  # verify is sure (a flipped byte may spare the operator state: it says lost)
        with pytest.raises(ClinkError):
            read_range(open_store(location, s3_config), 32, 63)
    for lo, hi in restorable:  # a subtask of the old parallelism restoring its own key groups from this savepoint
        assert read_range(open_store(location, s3_config), lo, hi)[0] == filter_model(model, lo, hi), (lo, hi)


# ---- exercise 3: rescale --------------------------------------------------------------------------------------------


def share_of(doc: dict, model: Model, lo: int, hi: int) -> float:
    """A new subtask's share of a savepoint's bytes: each file's size times the part of its model rows the subtask needs
    (its key groups, and all operator state, which every subtask reads).
    """
    total = 0.0
    for i, f in enumerate(sorted(doc["files"], key=lambda f: f["kg_lo"])):
        a, b = max(lo, f["kg_lo"]), min(hi, f["kg_hi"])
        keyed_rows = len({k: v for k, v in filter_model(model, a, b).items() if k[1][0] < 128}) if a <= b else 0
        needed = keyed_rows + (operator_rows(model) if i == 0 else 0)
        total += f["size"] * needed / f["rows"]
    return total


def read_range(directory: ObjectStore, lo: int, hi: int, checkpoint: tuple[str, int] | None = None) -> tuple[Model, int]:
    """(rows, bytes fetched) of key groups lo..hi on a cold cache: of the savepoint rooted at ``directory``, or of a job's checkpoint."""
    if checkpoint is None:
        loc = open_directory(directory)
        reader, manifest = CheckpointReader(loc.store, loc.job, SegmentCache(64 << 20)), loc.manifest
    else:
        reader = CheckpointReader(directory, checkpoint[0], SegmentCache(64 << 20))
        manifest = reader.manifest(checkpoint[1])
    directory.counters.reset()
    table = reader.read_manifest_table(manifest, (lo, hi))
    return table_dict(table), directory.counters.bytes_read


def tiling(subtasks: list[dict]) -> list[tuple[int, int]]:
    ranges = [(t["kg_lo"], t["kg_hi"]) for t in subtasks]
    assert ranges[0][0] == 0 and ranges[-1][1] == 127 and all(b[0] == a[1] + 1 for a, b in zip(ranges, ranges[1:], strict=False))
    return ranges


@pytest.mark.parametrize("parallelism", [2, 8, 3])
def test_rescale_a_parallelism_4_savepoint_spreads_state_and_reads_only_each_subtasks_key_groups(
    p4, cli, s3_config: StoreConfig, parallelism
):
    store, model, location = p4
    job = f"orders-p{parallelism}"
    done = cli("clink-pool", "import", "--store", store.uri, job, "--from", location, "--parallelism", str(parallelism), "-o", "json")
    assert (done["job"], done["checkpoint_id"], done["rows"], done["parallelism"]) == (job, 1, len(model), parallelism)
    doc = cli("clink", "savepoint", "inspect", f"{store.uri}/jobs/{job}/chk-1", "-o", "json")
    assert (doc["kind"], doc["parallelism"], len(doc["subtasks"])) == ("checkpoint", parallelism, parallelism)
    ranges = tiling(doc["subtasks"])
    assert max(hi - lo for lo, hi in ranges) - min(hi - lo for lo, hi in ranges) <= 1  # even ranges
    assert [t["rows"] for t in doc["subtasks"]] == [in_range(model, lo, hi, i == 0) for i, (lo, hi) in enumerate(ranges)]
    assert sum(t["rows"] for t in doc["subtasks"]) == len(model) == doc["rows"]
    assert {o["uid"]: o["rows"] for o in doc["operators"]} == {uid: rows_of(model, op) for uid, op in OP_IDS.items()}
    assert {(o["op_id"], v["state_type"], v["version"]) for o in doc["operators"] for v in o["state_versions"]} == set(VERSIONS.entries())
    sizes = [t["bytes"] for t in doc["subtasks"]]  # the seed's point: state evenly spread whatever the parallelism
    assert min(sizes) > 0 and max(sizes) <= 1.5 * min(sizes), sizes
    files = sorted(doc["files"], key=lambda f: f["kg_lo"])
    assert [(f["kg_lo"], f["kg_hi"]) for f in files] == ranges and sum(sizes) <= doc["bytes"] == sum(f["size"] for f in files)

    saved = cli("clink", "savepoint", "inspect", location, "-o", "json")
    directory = open_store(location, s3_config)
    for lo, hi in ranges:
        assert scan_checkpoint(store, job, 1, (lo, hi)) == filter_model(model, lo, hi)
        rows, fetched = read_range(directory, lo, hi)  # a new subtask restoring its key groups from the savepoint itself
        assert rows == filter_model(model, lo, hi)
        share = share_of(saved, model, lo, hi)
        assert fetched <= TARGET_RATIO * share, (lo, hi, fetched, share, fetched / share)


def test_a_job_restored_from_the_savepoint_is_read_at_2_8_and_3_by_key_groups(p4, cli):
    store, model, location = p4
    done = cli("clink-pool", "restore", "--store", store.uri, "orders-v2", "--from", location, "--uid", "source", "--uid", "window",
               "--uid", "sink", "-o", "json")  # fmt: skip
    assert (done["parallelism"], done["source_location"], done["declared_without_state"]) == (4, location, {})
    doc = cli("clink", "savepoint", "inspect", f"{store.uri}/jobs/orders-v2/chk-1", "-o", "json")
    assert doc["provenance"]["restored_from"]["location"] == location
    assert [(t["kg_lo"], t["kg_hi"], t["rows"]) for t in doc["subtasks"]] == [
        (lo, hi, in_range(model, lo, hi, i == 0)) for i, (lo, hi) in enumerate(RANGES)
    ]
    for parallelism in (2, 8, 3):
        ranges = [(i * 128 // parallelism, (i + 1) * 128 // parallelism - 1) for i in range(parallelism)]
        for lo, hi in ranges:
            rows, fetched = read_range(store, lo, hi, ("orders-v2", 1))
            assert rows == filter_model(model, lo, hi)
            assert fetched <= TARGET_RATIO * share_of(doc, model, lo, hi), (parallelism, lo, hi)


# ---- relocation: a savepoint copied anywhere, by plain object copies -------------------------------------------------


def copy_tree(source: ObjectStore, prefix: str, target: ObjectStore) -> list[str]:
    """Copy every object under ``prefix`` of ``source`` to the same relative key of ``target`` (what `aws s3 cp --recursive` does)."""
    copied = []
    for info in source.list(prefix):
        rel = info.key[len(prefix) :]
        if rel.startswith(".clink-"):  # a file store's own lock file (docs/layout.md), not part of the savepoint
            continue
        target.put(rel, source.get(info.key))
        copied.append(rel)
    return sorted(copied)


@pytest.fixture(params=["s3", "file"])
def elsewhere(request, make_s3_store, make_file_store) -> ObjectStore:
    """Somewhere unrelated: a new moto bucket under a deep prefix, or another local directory."""
    if request.param == "s3":
        return make_s3_store(prefix="unrelated/archive/2026")
    return make_file_store("unrelated/archive/2026")


def without_location(doc: dict) -> dict:
    return {k: v for k, v in doc.items() if k != "location"}


def test_a_savepoint_copied_to_another_bucket_or_scheme_inspects_verifies_and_restores_unchanged(store, elsewhere, cli):
    model = build_p4(store)
    to = f"{store.uri}/exports/release-1"
    assert cli("clink-pool", "savepoint", "--store", store.uri, "orders", "--to", to, "-o", "json")["location"] == to
    copied = copy_tree(store, "exports/release-1/", elsewhere)
    assert "_metadata" in copied and len(copied) == 5
    moved = elsewhere.uri

    original = cli("clink", "savepoint", "inspect", to, "-o", "json")
    relocated = cli("clink", "savepoint", "inspect", moved, "-o", "json")
    assert relocated["location"] == moved and without_location(relocated) == without_location(original)
    assert cli("clink", "savepoint", "inspect", f"{moved}/_metadata", "-o", "json") == relocated
    verified = cli("clink", "savepoint", "verify", moved, "-o", "json")
    assert verified["passed"] is True and verified["files_checked"] >= 4 and verified["lost_key_groups"] == []

    done = cli("clink-pool", "restore", "--store", store.uri, "orders-moved", "--from", moved, "-o", "json")
    assert done["source_location"] == moved
    assert scan_checkpoint(store, "orders-moved", 1) == model
    origin = json.loads(store.get("jobs/orders-moved/chk-1/_metadata"))["restored_from"]
    assert origin["location"] == moved
    cli("clink-pool", "import", "--store", store.uri, "orders-moved-p3", "--from", f"{moved}/_metadata", "--parallelism", "3")
    assert scan_checkpoint(store, "orders-moved-p3", 1) == model


def test_info_only_uris_edited_to_garbage_change_nothing_that_opens_inspects_or_restores(store, elsewhere, cli):
    model = build_p4(store)
    to = f"{store.uri}/exports/release-1"
    cli("clink-pool", "savepoint", "--store", store.uri, "orders", "--to", to)
    copy_tree(store, "exports/release-1/", elsewhere)
    before = cli("clink", "savepoint", "inspect", elsewhere.uri, "-o", "json")
    meta = json.loads(elsewhere.get("_metadata"))
    meta["savepoint"]["source_store"] = "s3://no-such-bucket-anywhere/gone"
    meta["savepoint"]["written_to"] = "file:///nowhere/at/all/../../etc"
    meta["savepoint"]["name"] = "not-the-name"
    elsewhere.put("_metadata", json.dumps(meta).encode())  # nothing else re-checksummed

    after = cli("clink", "savepoint", "inspect", elsewhere.uri, "-o", "json")
    assert after["provenance"]["savepoint"]["source_store"] == "s3://no-such-bucket-anywhere/gone"  # shown, as information
    assert {k: after[k] for k in ("operators", "subtasks", "files")} == {k: before[k] for k in ("operators", "subtasks", "files")}
    assert cli("clink", "savepoint", "verify", elsewhere.uri, "-o", "json")["passed"] is True
    cli("clink-pool", "restore", "--store", store.uri, "orders-edited", "--from", elsewhere.uri)
    assert scan_checkpoint(store, "orders-edited", 1) == model


def test_a_savepoint_written_straight_to_another_scheme_restores_back(store, elsewhere, cli):
    model = build_p4(store)
    to = f"{elsewhere.uri}/direct/release-2"
    assert cli("clink-pool", "savepoint", "--store", store.uri, "orders", "--to", to, "-o", "json")["location"] == to
    doc = cli("clink", "savepoint", "inspect", to, "-o", "json")
    assert (doc["parallelism"], doc["rows"], doc["provenance"]["savepoint"]["source_store"]) == (4, len(model), store.uri)
    for f in doc["files"]:
        assert f["size"] == elsewhere.head(f"direct/release-2/{f['path']}").size
    assert cli("clink", "savepoint", "verify", to, "-o", "json")["passed"] is True
    cli("clink-pool", "restore", "--store", store.uri, "orders-back", "--from", f"{to}/_metadata")
    assert scan_checkpoint(store, "orders-back", 1) == model


def test_a_savepoint_copied_under_a_path_shaped_like_a_checkpoint_folder_still_opens_as_itself(store, cli):
    model = build_p4(store)
    cli("clink-pool", "savepoint", "--store", store.uri, "orders", "--to", f"{store.uri}/exports/release-1")
    copy_tree(store, "exports/release-1/", PrefixStore(store, "mirror/jobs/other/chk-9/"))
    moved = f"{store.uri}/mirror/jobs/other/chk-9"
    doc = cli("clink", "savepoint", "inspect", moved, "-o", "json")
    assert (doc["kind"], doc["job"], doc["checkpoint_id"]) == ("savepoint", "orders", CHECKPOINTS)
    assert cli("clink", "savepoint", "verify", moved, "-o", "json")["passed"] is True
    cli("clink-pool", "restore", "--store", store.uri, "orders-mirrored", "--from", moved)
    assert scan_checkpoint(store, "orders-mirrored", 1) == model


@pytest.mark.parametrize("inside", ["jobs/orders-archive", "jobs/orders/chk-2/kept"])
def test_a_savepoint_written_into_the_stores_jobs_folder_is_refused_or_survives_gc(store, clink_pool_run, s3_cli_env, cli, inside):
    """Either outcome keeps the user's state: the location is refused up front (exit 2, nothing written) or GC leaves it whole."""
    model = build_p4(store)
    to = f"{store.uri}/{inside}"
    taken = clink_pool_run("savepoint", "--store", store.uri, "orders", "--to", to, env=s3_cli_env)
    if taken.exit_code != 0:
        assert taken.exit_code == 2 and list(store.list(f"{inside}/")) == []
        return
    cli("clink-pool", "gc", "--store", store.uri, "--keep-last", "1", "--min-age", "0s")
    assert cli("clink", "savepoint", "verify", to, "-o", "json")["passed"] is True
    cli("clink-pool", "restore", "--store", store.uri, "orders-kept", "--from", to)
    assert scan_checkpoint(store, "orders-kept", 1) == model


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda meta: meta.__setitem__("savepoint", "garbage"), id="savepoint-a-string"),
        pytest.param(lambda meta: meta["savepoint"].__setitem__("created_at_ms", "yesterday"), id="created-at-a-string"),
    ],
)
def test_info_fields_of_the_wrong_type_never_crash_inspect_or_restore(store, clink_run, clink_pool_run, s3_cli_env, edit):
    """Information is never needed to open a savepoint: each command succeeds, or refuses in one line (exit 2); never exit 70."""
    model = build_p4(store)
    to = f"{store.uri}/exports/release-1"
    assert clink_pool_run("savepoint", "--store", store.uri, "orders", "--to", to, env=s3_cli_env).exit_code == 0
    meta = json.loads(store.get("exports/release-1/_metadata"))
    edit(meta)
    store.put("exports/release-1/_metadata", json.dumps(meta).encode())
    for args in (("savepoint", "inspect", to), ("savepoint", "inspect", to, "-o", "json"), ("savepoint", "verify", to)):
        result = clink_run(*args, env=s3_cli_env)
        assert result.exit_code in (0, 2) and result.stderr.count("\n") <= 1, (args, result.stderr)
    restored = clink_pool_run("restore", "--store", store.uri, "orders-v2", "--from", to, env=s3_cli_env)
    assert restored.exit_code in (0, 2), restored.stderr
    if restored.exit_code == 0:
        assert scan_checkpoint(store, "orders-v2", 1) == model
