"""The clink CLI against a real pool: an in-process PoolServer on a loopback port, read over gRPC."""

from __future__ import annotations

import json
import socket
import time
from collections import Counter

import duckdb
import pytest

import snapshot as s
from clink.cli.common import EXIT_NOT_FOUND, EXIT_UNAVAILABLE
from pool.server import PoolServer, PoolServerConfig
from tests.cli_fixtures import OP_IDS, STATE_VERSIONS, commit_checkpoints, generated_table, one_line_error, rows_of, run, slot_counts

JOB = "orders"


@pytest.fixture
def pool(file_store):
    """A pool serving checkpoints 1 and 2 of JOB from a local store; yields (grpc base URL, store, t1, t2)."""
    t1, t2 = generated_table(71, keyed_rows=300), generated_table(72, keyed_rows=420, operator_rows=5)
    commit_checkpoints(file_store, JOB, [t1, t2])
    server = PoolServer(PoolServerConfig(store_uri=file_store.uri, listen="127.0.0.1:0"), file_store).start()
    try:
        yield f"grpc://127.0.0.1:{server.port}", file_store, t1, t2
    finally:
        server.stop(0)


def test_cat_latest_and_a_named_checkpoint(pool) -> None:
    base, _, t1, t2 = pool
    result = run(["state-cat", f"{base}/{JOB}", "--limit", "0", "-o", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["total_rows"] == t2.num_rows and "checkpoint 2" in doc["source"]
    assert Counter(r["slot"] for r in doc["rows"]) == slot_counts(t2)
    assert {r["uid"] for r in doc["rows"]} == {"source", "window", "sink"}
    result = run(["state-cat", f"{base}/{JOB}/chk-1", "--limit", "0", "-o", "json"])
    assert json.loads(result.stdout)["total_rows"] == t1.num_rows


def test_export_from_the_pool_pushes_the_selection_down(pool, tmp_path) -> None:
    base, _, _, t2 = pool
    out = tmp_path / "p.arrow"
    result = run(["state-export", "--from", f"{base}/{JOB}/chk-2", "--out", str(out), "--key-groups", "0-31", "--op", "uid:source"])
    assert result.exit_code == 0, result.output
    back = s.read_snapshot(out.read_bytes())
    want = {k: v for k, v in rows_of(s.filter_key_groups(t2, 0, 31)).items() if k[0] == OP_IDS["source"]}
    assert rows_of(back.table) == want and back.state_versions == STATE_VERSIONS
    pq_out = tmp_path / "state.parquet"
    assert run(["state-export", "--from", f"{base}/{JOB}", "--out", str(pq_out)]).exit_code == 0
    got = dict(duckdb.connect().execute(f"SELECT slot, count(*) FROM '{pq_out}' GROUP BY slot").fetchall())
    assert got == dict(slot_counts(t2))


def test_diff_pool_against_store_and_between_checkpoints(pool) -> None:
    base, store, t1, t2 = pool
    same = run(["state-diff", f"{base}/{JOB}/chk-2", f"{store.uri}/jobs/{JOB}/chk-2"])
    assert same.exit_code == 0, same.output
    result = run(["state-diff", f"{base}/{JOB}/chk-1", f"{base}/{JOB}", "-o", "json"])
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    a, b = rows_of(t1), rows_of(t2)
    assert (doc["added"], doc["removed"]) == (len(b.keys() - a.keys()), len(a.keys() - b.keys()))


def test_query_and_check_on_the_pool(pool) -> None:
    base, _, _, t2 = pool
    result = run(["state-query", f"{base}/{JOB}", "SELECT count(*) AS n FROM state WHERE kind = 'operator'", "-o", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["rows"][0]["n"] == sum(1 for _, k in rows_of(t2) if k[0] == 0xFF)
    ok = run(["check-savepoint", f"{base}/{JOB}", "--expect-uid", "source", "--expect-uid", "window", "--expect-uid", "sink"])
    assert ok.exit_code == 0, ok.output
    bad = run(["check-savepoint", f"{base}/{JOB}", "--expect-uid", "source", "-o", "json"])
    assert bad.exit_code == 1
    details = [f["detail"] for f in json.loads(bad.stdout)["findings"] if f["status"] == "fail"]
    assert len(details) == 2 and all("present but not expected" in d for d in details)


def test_unknown_job_and_checkpoint_are_one_line_errors(pool) -> None:
    base, _, _, _ = pool
    for src, needle in ((f"{base}/nobody", "nobody"), (f"{base}/{JOB}/chk-77", "77")):
        result = run(["state-cat", src])
        assert result.exit_code == EXIT_NOT_FOUND
        assert needle in one_line_error(result)


def test_unreachable_pool_fails_fast_with_one_line() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    started = time.monotonic()
    result = run(["--pool-timeout", "1", "state-cat", f"grpc://127.0.0.1:{port}/{JOB}"])
    assert result.exit_code == EXIT_UNAVAILABLE
    assert f"127.0.0.1:{port}" in one_line_error(result) or "unavailable" in one_line_error(result).lower()
    assert time.monotonic() - started < 60


def test_clink_demo_runs_end_to_end(tmp_path) -> None:
    result = run(["demo", "--workdir", str(tmp_path / "demo")])
    assert result.exit_code == 0, result.output
    assert "exactly-once" in result.stdout
