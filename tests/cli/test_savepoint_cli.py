"""Issue 16 from the command line, on the file store and moto: bad locations, savepoint ls/delete, default names, RPC tokens, safe restore."""

from __future__ import annotations

import json
import random
import re

import grpc
import pytest

import snapshot as s
from clink.cli.common import EXIT_CONFLICT, EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE
from pool.core import PoolCore
from pool.domain import CommitRequest, KeyGroupRange
from store.local import FileStore
from tests.lifecycle_helpers import build_job, scan_checkpoint
from tests.pool_core_helpers import Model, changelog, keys_in_range

# ---- helpers -----------------------------------------------------------------------------------------------------------


def listing(store) -> list[tuple[str, bytes]]:
    """Every object of a store, names and bytes."""
    return [(info.key, store.get(info.key)) for info in store.list("")]


def stat_listing(store) -> list[tuple[str, int, str]]:
    """Every object of a store, names, sizes and etags: one LIST, for checks after each of many commands."""
    return [(info.key, info.size, info.etag) for info in store.list("")]


def tree(*stores) -> list[list[str]]:
    """Every path (folders too) under each FileStore's root; [] for a store that is no folder."""
    return [sorted(str(p) for p in st.root.rglob("*")) if isinstance(st, FileStore) else [] for st in stores]


def other_store(store, make_file_store, make_s3_store):
    """A second store of the same kind as ``store`` (another folder, another bucket)."""
    return make_file_store("target") if isinstance(store, FileStore) else make_s3_store(prefix="target")


@pytest.fixture
def world(store, make_file_store, make_s3_store, clink_pool_run, s3_cli_env):
    """A store holding job orders (3 checkpoints, a dict model) and its savepoint at good/sp/, and an unrelated target store."""
    models = build_job(PoolCore(store), "orders", 3, random.Random(16))
    target = other_store(store, make_file_store, make_s3_store)
    build_job(PoolCore(target), "other", 1, random.Random(61))
    result = clink_pool_run("savepoint", "--store", store.uri, "orders", "--to", f"{store.uri}/good/sp", env=s3_cli_env)
    assert result.exit_code == EXIT_OK, result.output
    return store, target, models[3]


# the four ways a location is not a savepoint, and a word each error must say
BAD = {"nometa": "no _metadata", "future": "version 99", "truncated": "truncated", "datafile": "Arrow data file"}


def plant_bad_locations(store) -> None:
    """bad/<case>/ for each BAD case, made from the real savepoint at good/sp/ (bad/nothing/ stays empty)."""
    meta = store.get("good/sp/_metadata")
    data = [info.key for info in store.list("good/sp/data/")]
    assert data
    for key in data:
        store.put(f"bad/nometa/{key.removeprefix('good/sp/')}", store.get(key))
    doc = json.loads(meta)
    assert doc["version"] < 99
    store.put("bad/future/_metadata", json.dumps({**doc, "version": 99}).encode())
    store.put("bad/truncated/_metadata", meta[: len(meta) // 2])
    store.put("bad/datafile/_metadata", store.get(data[0]))


COMMANDS = {
    "inspect": lambda loc, target: ("clink", ["savepoint", "inspect", loc]),
    "verify": lambda loc, target: ("clink", ["savepoint", "verify", loc]),
    "restore": lambda loc, target: ("pool", ["restore", "--store", target, "newjob", "--from", loc]),
    "delete": lambda loc, target: ("pool", ["savepoint", "delete", "--store", target, loc]),
    "import": lambda loc, target: ("pool", ["import", "--store", target, "newjob", "--from", loc]),
}


# ---- 1. bad input ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", list(COMMANDS))
def test_each_bad_location_is_one_line_exit_2_naming_which_and_nothing_changes(world, command, clink_run, clink_pool_run, s3_cli_env):
    store, target, _ = world
    plant_bad_locations(store)
    runners = {"clink": clink_run, "pool": clink_pool_run}
    before, stats, folders = (listing(store), listing(target)), (stat_listing(store), stat_listing(target)), tree(store, target)
    for case, word in BAD.items():
        for loc in (f"{store.uri}/bad/{case}", f"{store.uri}/bad/{case}/_metadata"):
            which, args = COMMANDS[command](loc, target.uri)
            result = runners[which](*args, env=s3_cli_env)
            assert result.exit_code == EXIT_USAGE, (loc, result.output)
            lines = result.stderr.strip().splitlines()
            assert len(lines) == 1 and "error" in lines[0], (loc, result.stderr)
            assert [w for w in BAD.values() if w in lines[0]] == [word], (loc, lines[0])  # says which, and only that
            assert "Traceback" not in result.output and result.stdout == ""
            assert (stat_listing(store), stat_listing(target)) == stats, loc
    for loc in (f"{store.uri}/bad/nothing", f"{store.uri}/bad/nothing/_metadata"):
        which, args = COMMANDS[command](loc, target.uri)
        result = runners[which](*args, env=s3_cli_env)
        assert result.exit_code == EXIT_NOT_FOUND, (loc, result.output)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert (stat_listing(store), stat_listing(target)) == stats, loc
    assert (listing(store), listing(target)) == before and tree(store, target) == folders


def test_the_good_savepoint_passes_every_command(world, clink_run, clink_pool_run, s3_cli_env):
    """The control for the bad-input test: the location the bad ones were made from is accepted by each command."""
    store, target, model = world
    loc = f"{store.uri}/good/sp"
    assert clink_run("savepoint", "inspect", loc, env=s3_cli_env).exit_code == EXIT_OK
    assert clink_run("savepoint", "verify", f"{loc}/_metadata", env=s3_cli_env).exit_code == EXIT_OK
    assert clink_pool_run("restore", "--store", target.uri, "r", "--from", loc, env=s3_cli_env).exit_code == EXIT_OK
    assert clink_pool_run("import", "--store", target.uri, "i", "--from", f"{loc}/_metadata", env=s3_cli_env).exit_code == EXIT_OK
    assert scan_checkpoint(target, "r", 1) == scan_checkpoint(target, "i", 1) == model


def test_import_of_an_s3_directory_without_metadata_says_which(s3_store, make_s3_store, clink_pool_run, s3_cli_env):
    build_job(PoolCore(s3_store), "orders", 1, random.Random(3))
    assert clink_pool_run("savepoint", "--store", s3_store.uri, "orders", "--to", f"{s3_store.uri}/good/sp", env=s3_cli_env).exit_code == 0
    plant_bad_locations(s3_store)
    target = make_s3_store(prefix="target")
    before = listing(s3_store)
    result = clink_pool_run("import", "--store", target.uri, "newjob", "--from", f"{s3_store.uri}/bad/nometa", env=s3_cli_env)
    assert listing(s3_store) == before and listing(target) == []
    assert result.exit_code == EXIT_USAGE and "no _metadata" in result.stderr, result.stderr


# ---- 2. savepoint ls | delete ------------------------------------------------------------------------------------------


@pytest.fixture
def jobs(store):
    """A store holding job orders (3 checkpoints): (store, models by checkpoint)."""
    return store, build_job(PoolCore(store), "orders", 3, random.Random(26))


def take(clink_pool_run, env, *args: str) -> str:
    """Run `clink-pool savepoint ARGS -o json` and return the location it prints."""
    result = clink_pool_run("savepoint", *args, "-o", "json", env=env)
    assert result.exit_code == EXIT_OK, result.output
    return json.loads(result.stdout)["location"]


def test_ls_lists_the_default_location_savepoints_with_job_checkpoint_and_location(jobs, clink_pool_run, s3_cli_env):
    store, _ = jobs
    latest = take(clink_pool_run, s3_cli_env, "--store", store.uri, "orders")
    second = take(clink_pool_run, s3_cli_env, "--store", store.uri, "orders", "-c", "2")
    named = take(clink_pool_run, s3_cli_env, "--store", store.uri, "orders", "release-1", "-c", "1")
    take(clink_pool_run, s3_cli_env, "--store", store.uri, "orders", "--to", f"{store.uri}/elsewhere/sp")  # not under savepoints/
    result = clink_pool_run("savepoint", "ls", "--store", store.uri, "-o", "json", env=s3_cli_env)
    assert result.exit_code == EXIT_OK, result.output
    found = {(sp["job"], sp["checkpoint_id"], sp["location"]) for sp in json.loads(result.stdout)["savepoints"]}
    assert found == {("orders", 3, latest), ("orders", 2, second), ("orders", 1, named)}
    text = clink_pool_run("savepoint", "ls", "--store", store.uri, env=s3_cli_env).stdout.splitlines()
    assert sorted(line.split()[0] for line in text) == sorted([latest, second, named])
    assert all("job orders checkpoint" in line for line in text)


def test_ls_names_each_broken_savepoint_folder_and_what_is_wrong(world, clink_pool_run, s3_cli_env):
    store, _, _ = world
    plant_bad_locations(store)
    for key, data in listing(store):  # the four bad locations again, as folders under savepoints/
        if key.startswith("bad/") and "/" in key.removeprefix("bad/"):
            store.put(f"savepoints/{key.removeprefix('bad/')}", data)
    good = take(clink_pool_run, s3_cli_env, "--store", store.uri, "orders", "fine")
    result = clink_pool_run("savepoint", "ls", "--store", store.uri, "-o", "json", env=s3_cli_env)
    assert result.exit_code == EXIT_OK, result.output
    found = {sp["name"]: sp for sp in json.loads(result.stdout)["savepoints"]}
    assert set(found) == {*BAD, "fine"} and found["fine"]["complete"] and found["fine"]["location"] == good
    for case, word in BAD.items():
        assert found[case]["complete"] is False and word in found[case]["problem"], found[case]
    for job, complete in (("orders", ["fine"]), ("nobody", [])):
        args = ("savepoint", "ls", "--store", store.uri, "--job", job, "-o", "json")
        only = json.loads(clink_pool_run(*args, env=s3_cli_env).stdout)["savepoints"]
        assert [sp["name"] for sp in only if sp["complete"]] == complete  # a broken folder names no job: always listed


def test_delete_never_follows_a_tampered_path_out_of_the_savepoint(jobs, clink_pool_run, s3_cli_env):
    store, models = jobs
    sp = take(clink_pool_run, s3_cli_env, "--store", store.uri, "orders", "sp")
    victim = next(info.key for info in store.list("jobs/orders/data/"))
    doc = json.loads(store.get("savepoints/sp/_metadata"))
    for path in (f"../../{victim}", f"data/../../../{victim}", f"/{victim}"):
        doc["files"][0]["path"] = path
        store.put("savepoints/sp/_metadata", json.dumps(doc).encode())
        before = listing(store)
        result = clink_pool_run("savepoint", "delete", "--store", store.uri, sp, "--force", env=s3_cli_env)
        assert result.exit_code != EXIT_OK and "not a safe relative path" in result.stderr, (path, result.output)
        assert listing(store) == before
    assert scan_checkpoint(store, "orders", 3) == models[3]


def _gone(before, after, prefix: str) -> None:
    """``after`` is ``before`` without exactly the objects under ``prefix``, and some were there."""
    assert any(key.startswith(prefix) for key, _ in before)
    assert after == [(key, data) for key, data in before if not key.startswith(prefix)]


def test_delete_removes_every_object_of_the_savepoint_and_nothing_else_not_a_prefix_sibling(jobs, clink_pool_run, s3_cli_env):
    store, models = jobs
    sp = take(clink_pool_run, s3_cli_env, "--store", store.uri, "orders", "--to", f"{store.uri}/archive/sp")
    sp2 = take(clink_pool_run, s3_cli_env, "--store", store.uri, "orders", "-c", "2", "--to", f"{store.uri}/archive/sp2")
    before = listing(store)
    result = clink_pool_run("savepoint", "delete", "--store", store.uri, sp, env=s3_cli_env)
    assert result.exit_code == EXIT_OK, result.output
    _gone(before, listing(store), "archive/sp/")
    assert clink_pool_run("restore", "--store", store.uri, "from-sp2", "--from", sp2, env=s3_cli_env).exit_code == EXIT_OK
    assert scan_checkpoint(store, "from-sp2", 1) == models[2]


def test_delete_of_a_default_location_savepoint_leaves_its_sibling(jobs, clink_pool_run, clink_run, s3_cli_env):
    store, models = jobs
    sp = take(clink_pool_run, s3_cli_env, "--store", store.uri, "orders", "sp")
    sp2 = take(clink_pool_run, s3_cli_env, "--store", store.uri, "orders", "sp2", "-c", "2")
    before = listing(store)
    result = clink_pool_run("savepoint", "delete", "--store", store.uri, f"{sp}/_metadata", "-o", "json", env=s3_cli_env)
    assert result.exit_code == EXIT_OK, result.output
    deleted = json.loads(result.stdout)["deleted"]
    assert deleted[0] == "_metadata" and len(deleted) == 3
    _gone(before, listing(store), "savepoints/sp/")
    assert clink_run("savepoint", "verify", sp2, env=s3_cli_env).exit_code == EXIT_OK
    assert clink_run("savepoint", "inspect", sp, env=s3_cli_env).exit_code == EXIT_NOT_FOUND
    ls = json.loads(clink_pool_run("savepoint", "ls", "--store", store.uri, "-o", "json", env=s3_cli_env).stdout)
    assert [x["location"] for x in ls["savepoints"]] == [sp2]
    assert scan_checkpoint(store, "orders", 3) == models[3]


def test_delete_is_refused_while_a_restored_job_holds_it_dry_run_deletes_nothing_force_deletes(jobs, clink_pool_run, s3_cli_env):
    store, models = jobs
    sp = take(clink_pool_run, s3_cli_env, "--store", store.uri, "orders", "keep")
    restored = clink_pool_run("restore", "--store", store.uri, "orders-v2", "--from", f"{sp}/_metadata", env=s3_cli_env)
    assert restored.exit_code == EXIT_OK, restored.output
    before = listing(store)
    for form in (sp, f"{sp}/_metadata", f"{sp}/"):
        refused = clink_pool_run("savepoint", "delete", "--store", store.uri, form, env=s3_cli_env)
        assert refused.exit_code == EXIT_CONFLICT, (form, refused.output)
        assert "orders-v2" in refused.stderr and "--force" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
        assert listing(store) == before
    dry = clink_pool_run("savepoint", "delete", "--store", store.uri, sp, "--dry-run", "--force", "-o", "json", env=s3_cli_env)
    assert dry.exit_code == EXIT_OK, dry.output
    doc = json.loads(dry.stdout)
    expected = sorted(key.removeprefix("savepoints/keep/") for key, _ in before if key.startswith("savepoints/keep/"))
    assert doc["deleted"] == [] and sorted(doc["would_delete"]) == expected
    assert listing(store) == before
    text = clink_pool_run("savepoint", "delete", "--store", store.uri, sp, "--dry-run", "--force", env=s3_cli_env)
    assert text.exit_code == EXIT_OK and "would delete" in text.stdout and listing(store) == before
    forced = clink_pool_run("savepoint", "delete", "--store", store.uri, sp, "--force", env=s3_cli_env)
    assert forced.exit_code == EXIT_OK, forced.output
    _gone(before, listing(store), "savepoints/keep/")
    assert scan_checkpoint(store, "orders-v2", 1) == models[3]  # the restored job copied its files: it still reads


# ---- 3. default names; the pool's RPC writes only under the token's job ------------------------------------------------


def test_savepoint_without_to_writes_under_savepoints_job_and_prints_where(jobs, clink_pool_run, s3_cli_env):
    store, models = jobs
    text = clink_pool_run("savepoint", "--store", store.uri, "orders", env=s3_cli_env)
    assert text.exit_code == EXIT_OK, text.output
    printed = re.fullmatch(rf"location: ({re.escape(store.uri)}/savepoints/orders/savepoint-3-[0-9a-f]{{6}})", text.stdout.splitlines()[-1])
    assert printed, text.stdout
    doc = json.loads(clink_pool_run("savepoint", "--store", store.uri, "orders", "-c", "2", "-o", "json", env=s3_cli_env).stdout)
    assert re.fullmatch(rf"{re.escape(store.uri)}/savepoints/orders/savepoint-2-[0-9a-f]{{6}}", doc["location"]), doc
    for location, cid in ((printed.group(1), 3), (doc["location"], 2)):
        prefix = location.removeprefix(f"{store.uri}/") + "/"
        keys = [key for key, _ in listing(store) if key.startswith(prefix)]
        assert f"{prefix}_metadata" in keys and any(k.startswith(f"{prefix}data/") for k in keys)
        restored = clink_pool_run("restore", "--store", store.uri, f"from-{cid}", "--from", location, env=s3_cli_env)
        assert restored.exit_code == EXIT_OK, restored.output
        assert scan_checkpoint(store, f"from-{cid}", 1) == models[cid]


@pytest.fixture
def token_pool(store):
    """A real gRPC pool over ``store`` wanting the tokens of tests/security_fixtures.py; job-a and job-b hold checkpoint 1."""
    from client import BackendConfig, RemoteReadBackend
    from client.pool_client import RetryPolicy
    from pool.server import PoolServer, PoolServerConfig
    from tests.security_fixtures import token_table

    retry = RetryPolicy(max_attempts=2, initial_backoff_s=0.001, max_backoff_s=0.01)
    config = PoolServerConfig(listen="127.0.0.1:0", grace_seconds=0.2, http_port=0, tokens=token_table())
    server = PoolServer(config, store=store).start()
    try:
        for job, token in (("job-a", "tok-a-rw"), ("job-b", "tok-b-rw")):
            with RemoteReadBackend.connect(server.address, job, config=BackendConfig(token=token, retry=retry, warm_up="off")) as b:
                b.put(b.register_operator("agg"), s.encode_keyed_key("v", job.encode()), f"state of {job}".encode())
                assert b.snapshot(1).checkpoint.complete
        yield server, store, retry
    finally:
        server.stop(0)


def _client(token_pool, token: str):
    from client.pool_client import PoolClient, PoolClientConfig

    server, _, retry = token_pool
    return PoolClient(server.address, PoolClientConfig(token=token, retry=retry, call_deadline_s=10))


ESCAPES = ["../other", "a/../../x", "..", "job-b/x", "savepoints/job-b/x", "../job-b/x", "s3://bkt/x", "file:///tmp/x", "/abs", "data"]


def test_a_jobs_token_savepoints_only_under_its_own_job(token_pool):
    from client.errors import InvalidArgumentError, PermissionDeniedError

    _, store, _ = token_pool
    with _client(token_pool, "tok-a-rw") as a:
        default = a.savepoint("job-a")
        named = a.savepoint("job-a", "release-1")
        assert re.fullmatch(r"savepoints/job-a/savepoint-1-[0-9a-f]{6}/", default.location), default
        assert named.location == "savepoints/job-a/release-1/" and named.name == "job-a/release-1"
        before = listing(store)
        assert {key.split("/")[1] for key, _ in before if key.startswith("savepoints/")} == {"job-a"}
        for name in ESCAPES:
            with pytest.raises(InvalidArgumentError, match="savepoint name"):
                a.savepoint("job-a", name)
            assert listing(store) == before, name
        with pytest.raises(PermissionDeniedError, match="job-b"):
            a.savepoint("job-b")
        with pytest.raises(PermissionDeniedError, match="job-b"):
            a.savepoint("job-b", "x")
    with _client(token_pool, "tok-a-ro") as read_only, pytest.raises(PermissionDeniedError):
        read_only.savepoint("job-a")
    assert listing(store) == before


def test_the_pool_itself_refuses_escaping_names_the_client_did_not_check(token_pool):
    """The raw RPC, past PoolClient's own checks: every escaping name is INVALID_ARGUMENT and writes nothing."""
    from protos import remote_pool_pb2 as pb
    from protos import remote_pool_pb2_grpc as pb_grpc

    server, store, _ = token_pool
    before = listing(store)
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.RemotePoolStub(channel)
        auth = [("authorization", "Bearer tok-a-rw")]
        for name in [*ESCAPES, "_metadata", ".clink-lock", "a\\..\\..\\x"]:
            with pytest.raises(grpc.RpcError) as refused:
                stub.Savepoint(pb.SavepointRequest(job="job-a", name=name), metadata=auth, timeout=10)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "savepoint name" in refused.value.details(), name
        with pytest.raises(grpc.RpcError) as denied:
            stub.Savepoint(pb.SavepointRequest(job="job-b", name="x"), metadata=auth, timeout=10)
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
        ok = stub.Savepoint(pb.SavepointRequest(job="job-a", name="fine"), metadata=auth, timeout=10)
    assert ok.location == "savepoints/job-a/fine/"
    after = listing(store)
    added = [key for key, data in after if (key, data) not in before]
    assert all(obj in after for obj in before) and added
    assert all(key.startswith("savepoints/job-a/fine/") for key in added), added


# ---- 4. safe restore from the command line -----------------------------------------------------------------------------

A, B, C = "enricher", "dedup", "renamed-agg"
OP_A, OP_B = s.operator_id(A), s.operator_id(B)


@pytest.fixture
def two_operators(store, clink_pool_run, s3_cli_env):
    """Job ab: one checkpoint holding state of uids A and B (keyed rows over all key groups, an operator row each); its savepoint."""
    rows = [
        (s.ROW_PUT, op, s.encode_keyed_key("v", k.encode()), f"{uid}|{k}".encode())
        for uid, op in ((A, OP_A), (B, OP_B))
        for k in keys_in_range(0, 127, 40, tag=uid)
    ]
    rows += [(s.ROW_PUT, op, s.encode_operator_key("offsets", b"p0"), uid.encode()) for uid, op in ((A, OP_A), (B, OP_B))]
    model: Model = {(op, key): value for _, op, key, value in rows}
    core = PoolCore(store)
    full = KeyGroupRange(0, s.NUM_KEY_GROUPS - 1)
    epoch, _ = core.acquire_writer("ab", full)
    core.commit_checkpoint(CommitRequest("ab", 1, 0, full, epoch, "", ((OP_A, A), (OP_B, B))), [changelog(rows)])
    loc = take(clink_pool_run, s3_cli_env, "--store", store.uri, "ab", "--to", f"{store.uri}/archive/ab-1")
    return store, loc, model


def test_restore_declaring_only_a_fails_naming_b_and_writes_nothing(two_operators, clink_pool_run, s3_cli_env):
    store, loc, _ = two_operators
    before = listing(store)
    result = clink_pool_run("restore", "--store", store.uri, "new", "--from", loc, "--uid", A, env=s3_cli_env)
    assert result.exit_code == EXIT_USAGE, result.output
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1 and B in line and (str(OP_B) in line or f"{OP_B:016x}" in line), line
    assert A not in line.replace(loc, "") and "--allow-non-restored-state" in line
    assert listing(store) == before
    as_json = clink_pool_run("restore", "--store", store.uri, "new", "--from", loc, "--uid", A, "-o", "json", env=s3_cli_env)
    doc = json.loads(as_json.stderr)
    assert (as_json.exit_code, doc["error"], doc["operators"]) == (
        EXIT_USAGE,
        "NonRestoredStateError",
        [{"op_id": OP_B, "op_id_hex": f"0x{OP_B:016x}", "uid": B}],
    )
    assert listing(store) == before


def test_allow_non_restored_state_restores_exactly_a(two_operators, clink_pool_run, clink_run, s3_cli_env):
    store, loc, model = two_operators
    result = clink_pool_run(
        "restore", "--store", store.uri, "new", "--from", loc, "--uid", A, "--allow-non-restored-state", "-o", "json", env=s3_cli_env
    )
    assert result.exit_code == EXIT_OK, result.output
    doc = json.loads(result.stdout)
    assert doc["dropped_operators"] == {f"0x{OP_B:016x}": B} and doc["declared_without_state"] == {}
    assert scan_checkpoint(store, "new", 1) == {(op, key): v for (op, key), v in model.items() if op == OP_A}
    inspected = clink_run("savepoint", "inspect", f"{store.uri}/jobs/new/chk-1", "-o", "json", env=s3_cli_env)
    assert inspected.exit_code == EXIT_OK, inspected.output
    operators = json.loads(inspected.stdout)["operators"]
    assert [(o["uid"], o["op_id"]) for o in operators] == [(A, OP_A)]
    assert operators[0]["rows"] == sum(1 for op, _ in model if op == OP_A)
    text = clink_run("savepoint", "inspect", f"{store.uri}/jobs/new/chk-1", env=s3_cli_env).stdout
    assert A in text and B not in text


def test_a_declared_uid_without_state_is_reported_and_the_restore_succeeds(two_operators, clink_pool_run, s3_cli_env):
    store, loc, model = two_operators
    result = clink_pool_run("restore", "--store", store.uri, "new", "--from", loc, "--uid", A, "--uid", B, "--uid", C, env=s3_cli_env)
    assert result.exit_code == EXIT_OK, result.output
    assert f"operator {C!r}" in result.output and "no state" in result.output
    assert scan_checkpoint(store, "new", 1) == model
    args = ("--uid", A, "--uid", C, "--allow-non-restored-state", "-o", "json")
    doc = json.loads(clink_pool_run("restore", "--store", store.uri, "new2", "--from", loc, *args, env=s3_cli_env).stdout)
    assert doc["declared_without_state"] == {C: s.operator_id(C)} and doc["dropped_operators"] == {f"0x{OP_B:016x}": B}


def test_a_declared_uid_without_state_warns_on_stderr(two_operators, clink_pool_run, s3_cli_env):
    store, loc, _ = two_operators
    result = clink_pool_run("restore", "--store", store.uri, "new", "--from", loc, "--uid", A, "--uid", B, "--uid", C, env=s3_cli_env)
    assert result.exit_code == EXIT_OK, result.output
    assert C in result.stderr and "no state" in result.stderr and C not in result.stdout


# ---- where --to may write: a savepoint the command accepted survives GC -----------------------------------------------


@pytest.mark.parametrize("inside", ["archive/release-1", "jobs/orders", "savepoints"])
def test_a_savepoint_to_accepted_is_never_destroyed_by_gc(jobs, inside, clink_pool_run, clink_run, s3_cli_env):
    store, models = jobs
    loc = f"{store.uri}/{inside}"
    result = clink_pool_run("savepoint", "--store", store.uri, "orders", "--to", loc, env=s3_cli_env)
    if result.exit_code == EXIT_USAGE:  # refusing such a place is as good: then nothing may have been written
        assert not [key for key, _ in listing(store) if key.startswith(f"{inside}/_metadata")]
        return
    assert result.exit_code == EXIT_OK, result.output
    assert clink_pool_run("gc", "--store", store.uri, "--min-age", "0s", env=s3_cli_env).exit_code == EXIT_OK
    assert clink_run("savepoint", "verify", loc, env=s3_cli_env).exit_code == EXIT_OK
    assert clink_pool_run("restore", "--store", store.uri, "back", "--from", loc, env=s3_cli_env).exit_code == EXIT_OK
    assert scan_checkpoint(store, "back", 1) == models[3]


def test_savepoint_to_a_checkpoint_folder_of_the_store_is_refused(jobs, clink_pool_run, s3_cli_env):
    store, _ = jobs
    before = listing(store)
    result = clink_pool_run("savepoint", "--store", store.uri, "orders", "--to", f"{store.uri}/jobs/orders/chk-9", env=s3_cli_env)
    assert (result.exit_code, listing(store)) == (EXIT_USAGE, before), result.output
