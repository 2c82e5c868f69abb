"""clink-pool import from every SRC clink reads (snapshot files, changelog files, Parquet exports, checkpoints, savepoints,
S3, a pool): the new job's checkpoint reads back as the source, JSON output, exit codes, and refusals that write nothing.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import snapshot as s
from clink.cli.common import EXIT_CONFLICT, EXIT_DATA, EXIT_NOT_FOUND, EXIT_USAGE
from clink.cli.pool import cli
from clink.cli.state import cli as clink_cli
from clink.tools.sources import load_source
from pool.core import PoolCore
from pool.lifecycle import Lifecycle
from snapshot.format import operators_metadata
from store.layout import metadata_key
from store.local import FileStore
from tests.client_fixtures import start_pool
from tests.lifecycle_helpers import build_job, file_job, scan_checkpoint, table_dict
from tests.pool_core_helpers import OP_IDS, Model, keys_in_range

SOURCE, WINDOW = OP_IDS["source"], OP_IDS["window"]
NAMED = {op: uid for uid, op in OP_IDS.items()}


def invoke(group, *args: str, env: dict | None = None):
    return CliRunner().invoke(group, list(args), env=env, catch_exceptions=False)


def run(*args: str, code: int = 0, env: dict | None = None) -> dict | str:
    result = invoke(cli, *args, env=env)
    assert result.exit_code == code, (result.stdout, result.stderr)
    if code:
        return result.stderr
    if "json" in args:
        return json.loads(result.stdout)
    return result.stdout


def model_of(rng: random.Random, keys: int = 300) -> Model:
    model: Model = {}
    users = [f"u{i}".encode() for i in range(keys)] + [k.encode() for k in keys_in_range(0, 0, 1) + keys_in_range(127, 127, 1)]
    for op in OP_IDS.values():
        for slot in ("count", "sum"):
            for u in rng.sample(users, len(users) // 2):
                model[(op, s.encode_keyed_key(slot, u))] = rng.randbytes(rng.randint(0, 40))
    for p in range(4):
        model[(SOURCE, s.encode_operator_key("offsets", f"p{p}".encode()))] = (1000 + p).to_bytes(8, "little")
    return model


def table_of(model: Model) -> pa.Table:
    return pa.table(
        {
            "op_id": pa.array([op for op, _ in model], pa.uint64()),
            "key_bytes": pa.array([k for _, k in model], pa.binary()),
            "value_bytes": pa.array(list(model.values()), pa.binary()),
        }
    )


def listing(root: Path) -> list[tuple[str, bytes]]:
    if not root.exists():
        return []
    return sorted((str(p.relative_to(root)), p.read_bytes()) for p in root.rglob("*") if p.is_file())


MODEL = model_of(random.Random(11))
VERSIONS = s.StateVersionMap({(WINDOW, "sum"): 3})


@pytest.fixture
def snap_file(tmp_path) -> Path:
    path = tmp_path / "state.snap"
    path.write_bytes(s.write_snapshot(table_of(MODEL), VERSIONS, operators_metadata(NAMED)))
    return path


@pytest.fixture
def job_store(tmp_path):
    return file_job(tmp_path / "pool", 6)


# ---- sources ----------------------------------------------------------------------------------------------------------


def test_import_a_snapshot_file_at_parallelism_4(tmp_path, snap_file):
    uri = f"file://{tmp_path / 'new'}"
    doc = run("import", "--store", uri, "orders-v2", "--from", str(snap_file), "-p", "4", "-o", "json")
    assert doc["job"] == "orders-v2" and doc["checkpoint_id"] == 1 and doc["rows"] == len(MODEL)
    assert (doc["parallelism"], doc["files"]) == (4, 4) and doc["bytes"] > 0
    assert doc["source"] == str(snap_file) and doc["source_kind"] == "file"
    imported = load_source(f"{uri}/jobs/orders-v2/chk-1")
    assert table_dict(imported.table) == MODEL
    assert imported.state_versions == VERSIONS and {op: imported.operators.get(op) for op in NAMED} == NAMED
    stored = json.loads((tmp_path / "new" / metadata_key("orders-v2", 1)).read_bytes())
    assert stored["anatomy"]["parallelism"] == 4 and {o["op_id"]: o["uid"] for o in stored["anatomy"]["operators"]} == NAMED
    origin = stored["restored_from"]
    assert origin["kind"] == "import" and origin["imported_from"] == str(snap_file) and origin["source_kind"] == "file"
    # state-cat shows the same entries for the file and the imported checkpoint
    cat = [
        json.loads(invoke(clink_cli, "state-cat", src, "-o", "json", "-n", "0").stdout)
        for src in (str(snap_file), f"{uri}/jobs/orders-v2/chk-1")
    ]
    assert cat[0]["total_rows"] == cat[1]["total_rows"] == len(MODEL) and cat[0]["rows"] == cat[1]["rows"]


def test_the_text_line_says_what_was_imported(tmp_path, snap_file):
    out = run("import", "--store", str(tmp_path / "new"), "j", "--from", str(snap_file))
    assert out.startswith(f"imported {snap_file} as checkpoint 1 of j: {len(MODEL)} rows, 1 subtask(s), 1 file(s), ")
    assert out.rstrip().endswith(" MB") and out.count("\n") == 1


def test_import_a_changelog_file_replays_it(tmp_path):
    from tests.pool_server_fixtures import changelog_bytes

    a, b, c = (s.encode_keyed_key("v", k) for k in (b"a", b"b", b"c"))
    offset = s.encode_operator_key("offsets", b"p0")
    rows = [
        (s.ROW_MATERIALISATION, SOURCE, a, b"a0"),
        (s.ROW_MATERIALISATION, SOURCE, b, b"b0"),
        (s.ROW_PUT, SOURCE, b, b"b1"),
        (s.ROW_PUT, WINDOW, c, b"c1"),
        (s.ROW_ERASE, SOURCE, a, b""),
        (s.ROW_PUT, SOURCE, offset, (7).to_bytes(8, "little")),
    ]
    path = tmp_path / "log.snap"
    path.write_bytes(changelog_bytes(rows))
    uri = f"file://{tmp_path / 'new'}"
    doc = run("import", "--store", uri, "j", "--from", str(path), "-p", "2", "-o", "json")
    expected = {(SOURCE, b): b"b1", (WINDOW, c): b"c1", (SOURCE, offset): (7).to_bytes(8, "little")}
    assert doc["rows"] == 3
    assert table_dict(load_source(f"{uri}/jobs/j/chk-1").table) == expected == table_dict(load_source(str(path)).table)
    origin = json.loads((tmp_path / "new" / metadata_key("j", 1)).read_bytes())["restored_from"]
    assert origin["source_was_changelog"] is True


def test_import_another_jobs_checkpoint_and_a_savepoint(job_store, tmp_path):
    store, uri, models = job_store
    doc = run("import", "--store", uri, "replay", "--from", f"{uri}/jobs/orders/chk-4", "-p", "3", "-o", "json")
    assert doc["rows"] == len(models[4]) and doc["parallelism"] == 3 and "checkpoint 4 of job orders" in doc["source"]
    assert scan_checkpoint(store, "replay", 1) == models[4]
    assert table_dict(load_source(f"{uri}/jobs/replay/chk-1").table) == table_dict(load_source(f"{uri}/jobs/orders/chk-4").table)
    origin = json.loads(store.get(metadata_key("replay", 1)))["restored_from"]
    assert (origin["source_job"], origin["source_checkpoint_id"], origin["source_kind"]) == ("orders", 4, "checkpoint")

    Lifecycle(store).savepoint("orders", 0, "sp")
    elsewhere = f"file://{tmp_path / 'elsewhere'}"
    doc = run("import", "--store", elsewhere, "from-sp", "--from", f"{uri}/savepoints/sp", "-p", "8", "-o", "json")
    assert doc["rows"] == len(models[6]) and doc["files"] == 8 and "savepoint 'sp'" in doc["source"]
    assert scan_checkpoint(FileStore(tmp_path / "elsewhere"), "from-sp", 1) == models[6]
    origin = json.loads(FileStore(tmp_path / "elsewhere").get(metadata_key("from-sp", 1)))["restored_from"]
    assert origin["source_kind"] == "savepoint" and origin["source_savepoint"] == "sp"


def test_import_a_parquet_export(tmp_path, snap_file):
    parquet = tmp_path / "state.parquet"
    assert invoke(clink_cli, "state-export", "--from", str(snap_file), "--out", str(parquet), "--format", "parquet").exit_code == 0
    uri = f"file://{tmp_path / 'new'}"
    doc = run("import", "--store", uri, "j", "--from", str(parquet), "-p", "5", "-o", "json")
    assert doc["rows"] == len(MODEL) and doc["parallelism"] == 5
    imported = load_source(f"{uri}/jobs/j/chk-1")
    assert table_dict(imported.table) == MODEL and imported.state_versions == VERSIONS


def test_a_parquet_file_clink_did_not_write_is_refused_naming_what_is_missing(tmp_path):
    foreign = tmp_path / "foreign.parquet"
    pq.write_table(pa.table({"op_id": pa.array([1], pa.uint64()), "key": [b"k"], "value": [b"v"]}), foreign)
    err = run("import", "--store", str(tmp_path / "new"), "j", "--from", str(foreign), code=EXIT_USAGE)
    assert "clink.projection" in err and err.count("\n") == 1
    assert not (tmp_path / "new").exists()


def test_import_from_s3_into_s3(make_s3_store, s3_cli_env):
    source = make_s3_store(prefix="old")
    models = build_job(PoolCore(source), "orders", 3, random.Random(5))
    target = make_s3_store(prefix="new")
    doc = run(
        "import", "--store", target.uri, "orders", "--from", f"{source.uri}/jobs/orders/chk-2", "-p", "2", "-o", "json", env=s3_cli_env
    )
    assert doc["rows"] == len(models[2])
    assert scan_checkpoint(target, "orders", 1) == models[2]


def test_import_from_a_pool(job_store, tmp_path):
    store, _, models = job_store
    server = start_pool(store)
    try:
        uri = f"file://{tmp_path / 'new'}"
        doc = run("import", "--store", uri, "j", "--from", f"grpc://{server.address}/orders/chk-5", "-p", "2", "-o", "json")
    finally:
        server.stop(0)
    assert doc["rows"] == len(models[5]) and doc["source_kind"] == "pool"
    assert scan_checkpoint(FileStore(tmp_path / "new"), "j", 1) == models[5]


# ---- refusals: exit codes, one line, nothing written -----------------------------------------------------------------


def test_a_taken_job_name_exits_4_and_writes_nothing(job_store, tmp_path, snap_file):
    store, uri, _ = job_store
    before = listing(tmp_path / "pool")
    err = run("import", "--store", uri, "orders", "--from", str(snap_file), code=EXIT_CONFLICT)
    assert "job orders already exists" in err and "give a new job name" in err
    # the name is checked before SRC is read: a missing source still says the name is taken
    run("import", "--store", uri, "orders", "--from", str(tmp_path / "missing.snap"), code=EXIT_CONFLICT)
    result = invoke(cli, "import", "--store", uri, "orders", "--from", str(snap_file), "-o", "json")
    error = json.loads(result.stderr)
    assert result.exit_code == EXIT_CONFLICT and error["exit_code"] == EXIT_CONFLICT and error["error"] == "ConflictError"
    assert listing(tmp_path / "pool") == before


@pytest.mark.parametrize(
    ("args", "code", "text"),
    [
        (["-p", "0"], EXIT_USAGE, "0 is not in the range 1<=x<=128"),
        (["-p", "129"], EXIT_USAGE, "129 is not in the range 1<=x<=128"),
        (["--parallelism", "x"], EXIT_USAGE, "is not a valid integer"),
    ],
)
def test_bad_parallelism_exits_2(tmp_path, snap_file, args, code, text):
    err = run("import", "--store", str(tmp_path / "new"), "j", "--from", str(snap_file), *args, code=code)
    assert text in err
    assert not (tmp_path / "new").exists()


def test_bad_sources_and_names_write_nothing(job_store, tmp_path, snap_file):
    _, uri, _ = job_store
    before = listing(tmp_path / "pool")
    garbage = tmp_path / "garbage.snap"
    garbage.write_bytes(b"not an arrow stream at all" * 10)
    key = s.encode_keyed_key("v", b"misplaced")
    wrong = tmp_path / "wrong.snap"
    wrong.write_bytes(s.write_snapshot(table_of({**MODEL, (SOURCE, bytes([(key[0] + 1) % 128]) + key[1:]): b"x"})))
    cases = [
        (["j", "--from", str(tmp_path / "missing.snap")], EXIT_NOT_FOUND, "no such file"),
        (["j", "--from", str(garbage)], EXIT_DATA, str(garbage)),
        (["j", "--from", str(wrong)], EXIT_USAGE, "1 keyed row(s) carry a key-group byte"),
        (["j", "--from", f"{uri}/jobs/orders/chk-99"], EXIT_NOT_FOUND, "99"),
        (["j", "--from", f"{uri}/jobs/nobody/chk-1"], EXIT_NOT_FOUND, "nobody"),
        (["j", "--from", f"{uri}/savepoints/none"], EXIT_NOT_FOUND, "none"),
        (["bad/job/name", "--from", str(snap_file)], EXIT_USAGE, "job id"),
        (["j", "--from", "gopher://x/y"], EXIT_USAGE, "unknown source scheme"),
    ]
    for args, code, text in cases:
        err = run("import", "--store", uri, *args, code=code)
        assert text in err and err.count("\n") == 1, (args, err)
        assert listing(tmp_path / "pool") == before, args
    # into a store that does not exist yet: a failed import leaves no folder behind
    run("import", "--store", str(tmp_path / "fresh"), "j", "--from", str(wrong), code=EXIT_USAGE)
    assert not (tmp_path / "fresh").exists()


def test_help_teaches_with_examples():
    out = invoke(cli, "import", "--help").stdout
    for text in ("--from SRC", "--parallelism", "[default: 1", "clink-pool import --store", "grpc://pool:7420/orders", "chk-42"):
        assert text in out, text
