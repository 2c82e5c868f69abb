"""clink-pool savepoint/restore/compact/gc/pin/ls/inspect on a local store and on moto: JSON output, exit codes, one-line errors."""

from __future__ import annotations

import json
import random

import pytest
from click.testing import CliRunner

from clink.cli.common import EXIT_CONFLICT
from clink.cli.pool import cli
from pool.core import PoolCore
from pool.lifecycle import Lifecycle
from store.local import FileStore
from tests.lifecycle_helpers import build_job, file_job, scan_checkpoint, scan_savepoint


def run(*args: str, code: int = 0, env: dict | None = None) -> dict | str:
    result = CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)
    assert result.exit_code == code, (result.output, result.stderr if hasattr(result, "stderr") else "")
    if "json" in args and code == 0:
        return json.loads(result.stdout)
    return result.output


@pytest.fixture
def job_store(tmp_path):
    return file_job(tmp_path / "pool", 10)


def test_savepoint_restore_ls_inspect_round_trip(job_store, tmp_path):
    store, uri, models = job_store
    sp = run("savepoint", "--store", uri, "orders", "rel-1", "-c", "7", "--target-store", f"file://{tmp_path / 'archive'}", "-o", "json")
    assert (sp["checkpoint_id"], sp["files"]) == (7, 2) and sp["rows"] == len(models[7])
    archive = FileStore(tmp_path / "archive")
    assert scan_savepoint(archive, "rel-1") == models[7]
    listed = run("ls", "--store", f"file://{tmp_path / 'archive'}", "-o", "json")
    assert listed == {"jobs": [], "savepoints": ["rel-1"]}
    out = run(
        "restore",
        "--store",
        uri,
        "orders-v2",
        "--from-savepoint",
        "rel-1",
        "--source-store",
        f"file://{tmp_path / 'archive'}",
        "-o",
        "json",
    )
    assert out["job"] == "orders-v2" and out["checkpoint_id"] == 1
    assert out["source_job"] == "orders" and "of job orders (checkpoint 7)" in out["source"]  # whose state it is, said before use
    assert scan_checkpoint(store, "orders-v2", 1) == models[7]
    jobs = run("ls", "--store", uri, "-o", "json")
    assert jobs["jobs"] == ["orders", "orders-v2"]
    detail = run("ls", "--store", uri, "orders", "-o", "json")
    assert [c["checkpoint_id"] for c in detail["checkpoints"]] == list(range(1, 11))
    assert detail["checkpoints"][-1]["max_layers"] == 10
    text = run("ls", "--store", uri, "orders")
    assert "complete" in text and "data file(s)" in text
    insp = run("inspect", "--store", f"file://{tmp_path / 'archive'}", "--savepoint", "rel-1", "-o", "json")
    assert insp["checkpoint_id"] == 7 and insp["parts"][0]["layers"] == 1 and insp["file_entries"][0]["kind"] == "base"
    text = run("inspect", "--store", uri, "orders", "-c", "3")
    assert "part 0-63" in text and "[2] delta" in text


def test_compact_gc_and_pins_from_the_command_line(job_store):
    store, uri, models = job_store
    res = run("compact", "--store", uri, "orders", "--max-layers", "4", "-o", "json")
    assert sorted((f["kg_lo"], f["layers_before"]) for f in res["folded"]) == [(0, 10), (64, 10)]
    assert scan_checkpoint(store, "orders", 10) == models[10]
    assert "nothing to fold" in run("compact", "--store", uri, "orders", "--max-layers", "4")
    run("pin", "--store", uri, "orders", "2", "backfill", "--ttl", "2h")
    store.put("jobs/orders/data/orphan.arrow", b"a commit that lost its race")
    dry = run("gc", "--store", uri, "--keep-last", "2", "--min-age", "0s", "--dry-run", "-o", "json")
    assert dry["retention"][0]["deleted"] == [1, 3, 4, 5, 6, 7, 8] and dry["retention"][0]["pinned"] == [2]
    assert dry["deleted"] == ["jobs/orders/data/orphan.arrow"] and store.exists("jobs/orders/data/orphan.arrow")
    assert len(PoolCore(store).list_checkpoints("orders")) == 10  # a dry run changes nothing
    done = run("gc", "--store", uri, "--keep-last", "2", "--min-age", "0s", "-o", "json")
    assert [c.checkpoint_id for c in PoolCore(store).list_checkpoints("orders")] == [2, 9, 10]
    # incremental checkpoints name every older delta (and 10's parts keep its pre-compaction layers): only the orphan goes
    assert done["deleted"] == ["jobs/orders/data/orphan.arrow"]
    for cid in (2, 9, 10):
        assert scan_checkpoint(store, "orders", cid) == models[cid]
    run("unpin", "--store", uri, "orders", "2", "backfill")
    run("gc", "--store", uri, "--keep-last", "1", "--min-age", "0s")
    assert [c.checkpoint_id for c in PoolCore(store).list_checkpoints("orders")] == [10]
    assert scan_checkpoint(store, "orders", 10) == models[10]


def test_errors_are_one_line_with_exit_codes(job_store, tmp_path):
    _, uri, _ = job_store
    out = run("savepoint", "--store", uri, "orders", "../evil", code=2)
    assert out.count("\n") == 1 and "clink-pool: error: savepoint name" in out
    assert "job nojob has no complete checkpoint" in run("savepoint", "--store", uri, "nojob", "x", code=3)
    assert "checkpoint 99" in run("inspect", "--store", uri, "orders", "-c", "99", code=3)
    run("savepoint", "--store", uri, "orders", "dup")
    assert "already exists" in run("savepoint", "--store", uri, "orders", "dup", code=EXIT_CONFLICT)
    assert "already exists" in run("restore", "--store", uri, "orders", "--from-savepoint", "dup", code=EXIT_CONFLICT)
    assert "duration" in run("gc", "--store", uri, "--min-age", "soon", code=2)
    assert "JOB or --savepoint" in run("inspect", "--store", uri, code=2)
    assert "unknown scheme" in run("ls", "--store", "ftp://x", code=2)


def test_commands_work_against_moto(s3_store, s3_config):
    models = build_job(PoolCore(s3_store), "j", 4, random.Random(22))
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}
    uri = s3_store.uri
    common = ("--store", uri, "--s3-endpoint-url", s3_config.endpoint_url)
    run("savepoint", *common, "j", "sp", env=env)
    run("restore", *common, "k", "--from-job", "j", "-c", "3", env=env)
    assert scan_savepoint(s3_store, "sp") == models[4]
    assert scan_checkpoint(s3_store, "k", 1) == models[3]
    res = run("gc", *common, "--min-age", "0s", "-o", "json", env=env)
    assert res["deleted"] == [] and res["referenced"] > 0
    assert Lifecycle(s3_store).list_savepoints() == ["sp"]
