"""rocksdb:///path as SRC: clink state-export / state-cat / state-diff / state-query / check-savepoint, clink-pool import into a pool job, bad paths."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner

import snapshot as s
from client.rocksdb_backend import RocksDBStateBackend
from clink.cli.common import EXIT_NOT_FOUND, EXIT_USAGE
from clink.cli.pool import cli as pool_cli
from clink.cli.state import cli as clink_cli
from clink.tools.sources import load_source
from store.local import FileStore
from tests.cli_fixtures import OP_IDS, STATE_VERSIONS, generated_table, one_line_error, rows_of
from tests.client_fixtures import start_pool
from tests.lifecycle_helpers import scan_checkpoint, table_dict

Model = dict[tuple[int, bytes], bytes]


def invoke(group, *args: str):
    return CliRunner().invoke(group, list(args), catch_exceptions=False)


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


@pytest.fixture
def rocks_checkpoint(tmp_path: Path) -> tuple[Path, Model]:
    """A RocksDB checkpoint of three named operators (keyed rows with true key groups, operator state), some erased."""
    table = generated_table(3, keyed_rows=300, operator_rows=6)
    model = rows_of(table)
    with RocksDBStateBackend(tmp_path / "db") as backend:
        for uid in OP_IDS:
            backend.register_operator(uid)
        for (op, state_type), version in STATE_VERSIONS.items():
            backend.set_state_version(op, state_type, version)
        for op in OP_IDS.values():
            mine = [(k, v) for (o, k), v in model.items() if o == op]
            backend.put_many(op, pa.array([k for k, _ in mine], pa.binary()), pa.array([v for _, v in mine], pa.binary()))
        gone = random.Random(4).sample(sorted(model), 20)
        for op, key in gone:  # erased before the checkpoint: must not come back anywhere
            backend.erase(op, key)
            del model[(op, key)]
        checkpoint = backend.create_checkpoint(tmp_path / "chk")
        backend.put(OP_IDS["sink"], s.encode_keyed_key("late", b"x"), b"after the checkpoint")
    return checkpoint, model


def test_state_export_cat_diff_and_check_read_a_rocksdb_checkpoint(tmp_path: Path, rocks_checkpoint) -> None:
    checkpoint, model = rocks_checkpoint
    src = f"rocksdb://{checkpoint}"
    out = tmp_path / "state.arrow"
    result = invoke(clink_cli, "state-export", "--from", src, "--out", str(out))
    assert result.exit_code == 0, result.stderr
    snap = s.read_snapshot(out.read_bytes())
    assert table_dict(snap.table) == model and snap.state_versions == STATE_VERSIONS
    ops = snap.table.column("op_id").to_pylist()
    assert ops == sorted(ops)  # operators ascending, as RocksDB's byte order gives them

    cat = json.loads(invoke(clink_cli, "state-cat", src, "-o", "json", "-n", "0").stdout)
    assert cat["total_rows"] == len(model) and len(cat["rows"]) == len(model)

    same = invoke(clink_cli, "state-diff", src, str(out), "-o", "json")
    assert same.exit_code == 0, same.stdout + same.stderr

    one_op = invoke(clink_cli, "state-cat", src, "--op", "uid:window", "-o", "json", "-n", "0")
    assert one_op.exit_code == 0, one_op.stderr
    assert json.loads(one_op.stdout)["total_rows"] == sum(1 for o, _ in model if o == OP_IDS["window"])

    expect = [arg for uid in OP_IDS for arg in ("--expect-uid", uid)]
    check = invoke(clink_cli, "check-savepoint", src, *expect, "-o", "json")
    assert check.exit_code == 0, check.stdout + check.stderr

    query = invoke(clink_cli, "state-query", src, "SELECT count(*) AS n FROM state", "-o", "json")
    assert query.exit_code == 0, query.stderr
    assert str(len(model)) in query.stdout
    assert load_source(src).operators == {op: uid for uid, op in OP_IDS.items()}


def test_clink_pool_import_moves_rocksdb_state_into_a_pool_job(tmp_path: Path, rocks_checkpoint) -> None:
    checkpoint, model = rocks_checkpoint
    uri = f"file://{tmp_path / 'pool'}"
    result = invoke(pool_cli, "import", "--store", uri, "orders", "--from", f"rocksdb://{checkpoint}", "-p", "4", "-o", "json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert (doc["rows"], doc["parallelism"], doc["source_kind"]) == (len(model), 4, "rocksdb")
    store = FileStore(tmp_path / "pool")
    assert scan_checkpoint(store, "orders", 1) == model
    imported = load_source(f"{uri}/jobs/orders/chk-1")
    assert imported.state_versions == STATE_VERSIONS
    assert {op: imported.operators.get(op) for op in OP_IDS.values()} == {op: uid for uid, op in OP_IDS.items()}
    server = start_pool(store)  # a worker's view: the pool serves the imported job
    try:
        assert table_dict(load_source(f"grpc://{server.address}/orders").table) == model
    finally:
        server.stop(0)


def _bad_paths(tmp_path: Path) -> list[tuple[Path, int, str]]:
    empty = tmp_path / "empty"
    empty.mkdir()
    a_file = tmp_path / "a.snap"
    a_file.write_bytes(b"x")
    return [
        (tmp_path / "missing", EXIT_NOT_FOUND, "no such RocksDB directory"),
        (empty, EXIT_USAGE, "not a RocksDB directory (an empty directory)"),
        (a_file, EXIT_USAGE, "is a file, not a RocksDB directory"),
    ]


def test_a_path_that_is_not_a_rocksdb_directory_is_one_line_an_exit_code_and_creates_nothing(tmp_path: Path) -> None:
    cases = _bad_paths(tmp_path)
    before = listing(tmp_path)
    for path, code, message in cases:
        src = f"rocksdb://{path}"
        for group, args in (
            (clink_cli, ("state-export", "--from", src, "--out", str(tmp_path / "out.arrow"))),
            (clink_cli, ("state-cat", src)),
            (pool_cli, ("import", "--store", f"file://{tmp_path / 'pool'}", "j", "--from", src)),
        ):
            result = invoke(group, *args)
            assert result.exit_code == code, (args, result.stdout, result.stderr)
            line = one_line_error(result)
            assert message in line and str(path) in line
    assert listing(tmp_path) == before  # no database, no export file, no pool store


def test_a_rocksdb_source_without_a_path_is_a_usage_error() -> None:
    result = invoke(clink_cli, "state-cat", "rocksdb://")
    assert result.exit_code == EXIT_USAGE
    assert "no directory named" in one_line_error(result)
