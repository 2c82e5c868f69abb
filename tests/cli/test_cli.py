"""The clink CLI on real snapshot files: format vectors and generated snapshots, every command, errors and exit codes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import snapshot as s
from clink.cli.common import EXIT_CONFLICT, EXIT_DATA, EXIT_NOT_FOUND, EXIT_USAGE
from tests.cli_fixtures import (
    OP_IDS,
    STATE_VERSIONS,
    VECTORS,
    generated_table,
    one_line_error,
    rows_of,
    run,
    slot_counts,
    write_table,
)

EXPECTED = json.loads((VECTORS / "expected.json").read_text())
INVALID = sorted(name for name, case in EXPECTED["snapshots"].items() if not case["valid"])


def _expected_rows(name: str) -> dict[tuple[int, bytes], bytes]:
    case = EXPECTED["snapshots"][name]
    rows = case.get("canonical_rows", case.get("rows"))
    return {(r["op_id"], bytes.fromhex(r["key_bytes"])): bytes.fromhex(r["value_bytes"]) for r in rows}


@pytest.fixture
def snap(tmp_path: Path) -> tuple[Path, pa.Table]:
    table = generated_table(11, keyed_rows=500, operator_rows=6, raw_rows=2)
    return write_table(tmp_path / "state.snap", table), table


# --- state-cat ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["small.snap", "changelog.snap", "legacy-raw-key.snap", "unversioned.snap", "empty.snap"])
def test_cat_json_lists_exactly_the_vector_rows(name: str) -> None:
    result = run(["state-cat", str(VECTORS / name), "--limit", "0", "-o", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    got = {
        (r["op_id"], s.encode_keyed_key(r["slot"], bytes.fromhex(r["user_key_hex"])) if r["kind"] == "keyed" else None): r
        for r in doc["rows"]
    }
    expected = _expected_rows(name)
    assert doc["total_rows"] == len(expected) == len(doc["rows"])
    for (op, key), value in expected.items():
        ref = s.decode_key(key)
        match = [r for r in doc["rows"] if r["op_id"] == op and r["slot"] == ref.slot and bytes.fromhex(r["user_key_hex"]) == ref.user_key]
        assert len(match) == 1, (op, key)
        row = match[0]
        assert bytes.fromhex(row["value_hex"]) == value
        assert row["value_size"] == len(value)
        assert row["key_group"] == ref.key_group
        assert row["kind"] == ref.kind
    assert got is not None


def test_cat_text_renders_int_text_and_hex_keys(tmp_path: Path) -> None:
    table = pa.table(
        {
            "op_id": pa.array([7, 7, 7, 7], pa.uint64()),
            "key_bytes": pa.array(
                [
                    s.encode_keyed_key("count", (42).to_bytes(8, "little")),
                    s.encode_keyed_key("name", "ключ-α".encode()),
                    s.encode_keyed_key("bin", b"\x00\xff\x10"),
                    s.encode_operator_key("offsets", b"p-0"),
                ],
                pa.binary(),
            ),
            "value_bytes": pa.array([(-5).to_bytes(8, "little", signed=True), b"x" * 100, b"\x01\x02", b"\x09" + b"\x00" * 7], pa.binary()),
        }
    )
    path = write_table(tmp_path / "r.snap", table, None)
    result = run(["state-cat", str(path), "--width", "10"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "42" in out and "ключ-α" in out and "0x00ff10" in out and "p-0" in out
    assert "-5" in out and "xxxxxxxxxx…" in out and "0x0102" in out
    kg = s.key_group((42).to_bytes(8, "little"))
    assert f"│ {kg} │".replace(" ", "") in out.replace(" ", "")


def test_cat_slot_limit_and_filters(snap) -> None:
    path, table = snap
    counts = slot_counts(table)
    result = run(["state-cat", str(path), "--slot", "profile", "--limit", "0", "-o", "json"])
    doc = json.loads(result.stdout)
    assert doc["total_rows"] == counts["profile"] and {r["slot"] for r in doc["rows"]} == {"profile"}
    result = run(["state-cat", str(path), "--limit", "5", "-o", "json"])
    doc = json.loads(result.stdout)
    assert doc["shown"] == 5 and doc["total_rows"] == table.num_rows
    result = run(["state-cat", str(path), "--op", "uid:window", "--limit", "0", "-o", "json"])
    doc = json.loads(result.stdout)
    expected = sum(1 for op, _ in rows_of(table) if op == OP_IDS["window"])
    assert doc["total_rows"] == expected and {r["op_id"] for r in doc["rows"]} == {OP_IDS["window"]}
    result = run(["state-cat", str(path), "--key-groups", "10-20", "--limit", "0", "-o", "json"])
    doc = json.loads(result.stdout)
    expected = s.filter_key_groups(table, 10, 20).num_rows
    assert doc["total_rows"] == expected
    assert all(r["key_group"] is None or 10 <= r["key_group"] <= 20 for r in doc["rows"])
    result = run(["state-cat", str(path), "--limit", "3"])
    assert result.exit_code == 0 and f"showing 3 of {table.num_rows}" in result.stdout


# --- errors -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", INVALID)
def test_every_invalid_vector_is_one_error_line_and_exit_data(name: str) -> None:
    result = run(["state-cat", str(VECTORS / name)])
    assert result.exit_code == EXIT_DATA, result.output
    line = one_line_error(result)
    assert name in line
    assert result.stdout == ""


@pytest.mark.parametrize(
    "args, needle, code",
    [
        (["state-cat", "/nonexistent/x.snap"], "no such file", EXIT_NOT_FOUND),
        (["state-cat"], "Missing argument", EXIT_USAGE),
        (["state-cat", "x", "--limit", "-1"], "--limit", EXIT_USAGE),
        (["state-cat", "ftp://x/y"], "unknown source scheme", EXIT_USAGE),
        (["state-cat", "grpc://host-without-port/job"], "grpc://HOST:PORT/JOB", EXIT_USAGE),
        (["state-cat", str(VECTORS / "small.snap"), "--key-groups", "9-3"], "key groups", EXIT_USAGE),
        (["state-cat", str(VECTORS / "small.snap"), "--op", "nope"], "uid:NAME", EXIT_USAGE),
        (["state-query", str(VECTORS / "small.snap"), "SELEC 1"], "query failed", EXIT_USAGE),
        (["state-query", str(VECTORS / "small.snap"), "SELECT nope FROM state"], "nope", EXIT_USAGE),
        (["state-export", "--from", str(VECTORS / "small.snap")], "--out is required", EXIT_USAGE),
        (["state-export", "--from", str(VECTORS / "small.snap"), "--format", "iceberg"], "--catalog-uri", EXIT_USAGE),
        (["state-export", "--from", str(VECTORS / "small.snap"), "--out", "/nonexistent/dir/x.arrow"], "does not exist", EXIT_NOT_FOUND),
        (["check-savepoint", str(VECTORS / "small.snap"), "--expect-op", "zz"], "uid:NAME", EXIT_USAGE),
        (["no-such-command"], "No such command", EXIT_USAGE),
    ],
)
def test_errors_are_one_line_with_the_exit_code_of_their_kind(args: list[str], needle: str, code: int) -> None:
    result = run(args)
    assert result.exit_code == code, result.output
    assert needle in one_line_error(result)


def test_help_texts_teach_with_examples() -> None:
    for cmd in ["state-cat", "state-diff", "state-query", "state-export", "check-savepoint"]:
        result = run([cmd, "--help"])
        assert result.exit_code == 0
        assert "Examples" in result.stdout and "grpc://HOST:PORT/JOB" in result.stdout, cmd
    top = run(["--help"])
    assert top.exit_code == 0 and "Exit codes" in top.stdout


# --- state-diff ---------------------------------------------------------------------------------------------


def test_diff_counts_match_a_dict_model(tmp_path: Path) -> None:
    a = generated_table(21, keyed_rows=300)
    model_a = rows_of(a)
    model_b = dict(model_a)
    items = sorted(model_a)
    removed = items[:17]
    changed = items[17:40]
    for k in removed:
        del model_b[k]
    for k in changed:
        model_b[k] = model_b[k] + b"!"
    added = [(OP_IDS["sink"], s.encode_keyed_key("count", i.to_bytes(8, "little", signed=True))) for i in range(-9, 0)]
    for k in added:
        model_b[k] = b"new"
    b = pa.table(
        {
            "op_id": pa.array([k[0] for k in model_b], pa.uint64()),
            "key_bytes": pa.array([k[1] for k in model_b], pa.binary()),
            "value_bytes": pa.array(list(model_b.values()), pa.binary()),
        }
    )
    pa_, pb_ = write_table(tmp_path / "a.snap", a), write_table(tmp_path / "b.snap", b)
    result = run(["state-diff", str(pa_), str(pb_), "-o", "json", "--limit", "0"])
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    assert (doc["added"], doc["removed"], doc["changed"]) == (len(added), len(removed), len(changed))
    by_slot = Counter()
    for k in removed:
        by_slot[(k[0], s.decode_key(k[1]).slot, "removed")] += 1
    for k in changed:
        by_slot[(k[0], s.decode_key(k[1]).slot, "changed")] += 1
    for k in added:
        by_slot[(k[0], s.decode_key(k[1]).slot, "added")] += 1
    got = Counter()
    for row in doc["by_slot"]:
        for change in ("added", "removed", "changed"):
            if row[change]:
                got[(row["op_id"], row["slot"], change)] = row[change]
    assert got == by_slot
    assert len(doc["entries"]) == len(added) + len(removed) + len(changed)
    text = run(["state-diff", str(pa_), str(pb_)])
    assert text.exit_code == 1 and "removed" in text.stdout and "total" in text.stdout


def test_diff_equal_is_exit_0_and_ignores_row_order_and_variant(tmp_path: Path) -> None:
    table = generated_table(4)
    a = write_table(tmp_path / "a.snap", table)
    b = write_table(tmp_path / "b.snap", table.take(pa.array(list(range(table.num_rows))[::-1])))
    result = run(["state-diff", str(a), str(b)])
    assert result.exit_code == 0 and "equal" in result.stdout
    # the changelog vector and its expected canonical rows are the same state
    canon = pa.table(
        {
            "op_id": pa.array([k[0] for k in _expected_rows("changelog.snap")], pa.uint64()),
            "key_bytes": pa.array([k[1] for k in _expected_rows("changelog.snap")], pa.binary()),
            "value_bytes": pa.array(list(_expected_rows("changelog.snap").values()), pa.binary()),
        }
    )
    c = write_table(tmp_path / "c.snap", canon)
    assert run(["state-diff", str(VECTORS / "changelog.snap"), str(c)]).exit_code == 0


def test_diff_of_damaged_data_is_exit_data_not_a_difference(tmp_path: Path) -> None:
    result = run(["state-diff", str(VECTORS / "small.snap"), str(VECTORS / "truncated.snap")])
    assert result.exit_code == EXIT_DATA
    assert "truncated.snap" in one_line_error(result)


# --- state-query --------------------------------------------------------------------------------------------


def test_query_slot_counts_and_int_readings(snap) -> None:
    path, table = snap
    result = run(["state-query", str(path), "SELECT slot, count(*) AS n FROM state GROUP BY slot ORDER BY slot", "-o", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert {r["slot"]: r["n"] for r in doc["rows"]} == dict(slot_counts(table))
    result = run(["state-query", str(path), "SELECT sum(value_int64) AS total FROM state WHERE slot = 'count'", "-o", "json"])
    expected = sum(
        int.from_bytes(v, "little", signed=True) for (_, k), v in rows_of(table).items() if s.decode_key(k).slot == "count" and len(v) == 8
    )
    assert json.loads(result.stdout)["rows"][0]["total"] == expected
    result = run(["state-query", str(path), "SELECT count(*) AS n FROM state WHERE key_group IS NULL"])
    assert result.exit_code == 0
    operator_and_raw = sum(1 for k in table.column("key_bytes").to_pylist() if s.decode_key(k).key_group is None)
    assert f"│ {operator_and_raw} │" in result.stdout


# --- state-export -------------------------------------------------------------------------------------------


def test_export_parquet_read_by_duckdb_gives_the_snapshot_slot_counts(snap, tmp_path: Path) -> None:
    path, table = snap
    out = tmp_path / "state.parquet"
    result = run(["state-export", "--from", str(path), "--out", str(out), "--format", "parquet", "--row-group-rows", "100"])
    assert result.exit_code == 0, result.output
    con = duckdb.connect()
    got = dict(con.execute(f"SELECT slot, count(*) FROM '{out}' GROUP BY slot").fetchall())
    assert got == dict(slot_counts(table))
    pf = pq.ParquetFile(out)
    meta = pf.metadata.metadata
    assert meta[b"clink.format_version"] == b"1"
    assert s.StateVersionMap.unpack(meta[b"clink.state_versions"]) == STATE_VERSIONS
    assert pf.metadata.num_row_groups == -(-table.num_rows // 100)
    back = pq.read_table(out)
    assert back.schema.field("op_id").type == pa.uint64() and back.schema.field("key_group").type == pa.uint8()
    model = {}
    for row in back.to_pylist():
        kind = "raw" if row["slot"] == s.RAW_SLOT else ("keyed" if row["key_group"] is not None else "operator")
        if kind == "keyed":
            key = s.encode_keyed_key(row["slot"], row["user_key"])
        elif kind == "operator":
            key = s.encode_operator_key(row["slot"], row["user_key"])
        else:
            key = row["user_key"]
        model[(row["op_id"], key)] = row["value_bytes"]
    assert model == rows_of(table)


def test_export_arrow_with_selection_is_a_canonical_snapshot(snap, tmp_path: Path) -> None:
    path, table = snap
    out = tmp_path / "part.arrow"
    result = run(
        ["state-export", "--from", str(path), "--out", str(out), "--key-groups", "0-63", "--op", str(OP_IDS["window"]), "-o", "json"]
    )
    assert result.exit_code == 0, result.output
    back = s.read_snapshot(out.read_bytes())
    assert back.state_versions == STATE_VERSIONS and not back.is_changelog
    want = s.filter_key_groups(table, 0, 63)
    want_rows = {k: v for k, v in rows_of(want).items() if k[0] == OP_IDS["window"]}
    assert rows_of(back.table) == want_rows
    assert json.loads(result.stdout)["rows"] == len(want_rows)


def test_export_changelog_source_writes_the_replayed_canonical_stream(tmp_path: Path) -> None:
    out = tmp_path / "c.arrow"
    assert run(["state-export", "--from", str(VECTORS / "changelog.snap"), "--out", str(out)]).exit_code == 0
    back = s.read_snapshot(out.read_bytes())
    assert not back.is_changelog and rows_of(back.table) == _expected_rows("changelog.snap")


def test_failed_export_leaves_nothing_behind(tmp_path: Path) -> None:
    out = tmp_path / "x.parquet"
    result = run(["state-export", "--from", str(VECTORS / "null-value.snap"), "--out", str(out)])
    assert result.exit_code == EXIT_DATA
    one_line_error(result)
    assert list(tmp_path.iterdir()) == []
    out.write_bytes(b"keep me")
    result = run(["state-export", "--from", str(VECTORS / "not-arrow.snap"), "--out", str(out)])
    assert result.exit_code == EXIT_USAGE and out.read_bytes() == b"keep me"  # an existing --out is refused before reading
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.parquet"]


def test_export_iceberg_reads_back_equal_to_the_snapshot(snap, tmp_path: Path) -> None:
    from pyiceberg.catalog.sql import SqlCatalog

    from clink.tools.projections import unsigned_op_ids

    path, table = snap
    catalog_uri = f"sqlite:///{tmp_path / 'catalog.db'}"
    warehouse = (tmp_path / "warehouse").as_uri()
    args = [
        "state-export",
        "--from",
        str(path),
        "--format",
        "iceberg",
        "--catalog-uri",
        catalog_uri,
        "--warehouse",
        warehouse,
        "--table",
        "clink.state",
    ]
    result = run(args)
    assert result.exit_code == 0, result.output
    catalog = SqlCatalog("clink", uri=catalog_uri, warehouse=warehouse)
    ice = catalog.load_table("clink.state")
    assert [f.name for f in ice.schema().fields] == ["op_id", "key_group", "slot", "user_key", "value_bytes"]
    assert str(ice.schema().find_field("op_id").field_type) == "long"
    assert ice.properties["clink.state_versions"] == STATE_VERSIONS.pack()
    back = ice.scan().to_arrow()
    assert back.num_rows == table.num_rows
    back = back.set_column(0, "op_id", unsigned_op_ids(back.column("op_id")))
    from clink.tools.projections import parquet_projection

    want = parquet_projection(table)
    key = ["op_id", "slot", "user_key"]
    got_rows = sorted(back.to_pylist(), key=lambda r: [r[k] for k in key])
    want_rows = sorted(want.to_pylist(), key=lambda r: [r[k] for k in key])
    assert got_rows == want_rows
    # an existing table is refused by default and left as it was
    again = run(args)
    assert again.exit_code == EXIT_CONFLICT and "already exists" in one_line_error(again)
    assert catalog.load_table("clink.state").scan().to_arrow().num_rows == table.num_rows
    assert run([*args, "--if-exists", "append"]).exit_code == 0
    assert catalog.load_table("clink.state").scan().to_arrow().num_rows == 2 * table.num_rows
    assert run([*args, "--if-exists", "replace"]).exit_code == 0
    assert catalog.load_table("clink.state").scan().to_arrow().num_rows == table.num_rows


# --- check-savepoint on files -------------------------------------------------------------------------------


def test_check_file_passes_and_reports_layout(snap) -> None:
    path, _ = snap
    result = run(["check-savepoint", str(path), "--expect-uid", "source", "--expect-uid", "window", "--expect-uid", "sink", "-o", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["passed"] and {f["check"] for f in doc["findings"]} >= {"format version", "state versions", "key layout", "operators"}


def test_check_file_future_version_and_unexpected_operator(tmp_path: Path) -> None:
    result = run(["check-savepoint", str(VECTORS / "future-version.snap"), "-o", "json"])
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert any(f["check"] == "format version" and f["status"] == "fail" and "version 2" in f["detail"] for f in doc["findings"])
    result = run(["check-savepoint", str(VECTORS / "small.snap"), "--expect-op", "11", "--expect-uid", "enricher"])
    assert result.exit_code == 1
    assert "op_id 12 is present but not expected" in result.stdout
    assert f"'enricher' (op_id {s.operator_id('enricher')}) is expected but absent" in result.stdout.replace("\n", " ").replace("│", "")
    result = run(["check-savepoint", str(VECTORS / "bad-versions.snap"), "-o", "json"])
    assert result.exit_code == 1
    assert any(f["check"] == "state versions" and f["status"] == "fail" for f in json.loads(result.stdout)["findings"])


def test_check_file_catches_a_wrong_key_group_byte(tmp_path: Path) -> None:
    good = s.encode_keyed_key("count", b"abc")
    bad = bytes([(good[0] + 1) % 128]) + good[1:]
    table = pa.table({"op_id": pa.array([1, 1], pa.uint64()), "key_bytes": pa.array([good, bad]), "value_bytes": pa.array([b"1", b"2"])})
    path = write_table(tmp_path / "kg.snap", table)
    result = run(["check-savepoint", str(path), "-o", "json"])
    assert result.exit_code == 1
    fails = [f for f in json.loads(result.stdout)["findings"] if f["status"] == "fail"]
    assert len(fails) == 1 and fails[0]["check"] == "key layout" and bad.hex() in fails[0]["detail"]


def test_check_missing_source_is_exit_not_found(tmp_path: Path) -> None:
    result = run(["check-savepoint", str(tmp_path / "nothing.snap")])
    assert result.exit_code == EXIT_NOT_FOUND
    one_line_error(result)


# --- demo and the console script ----------------------------------------------------------------------------


def test_demo_without_client_demo_says_so_and_exits_1(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "clink.cli.demo", None)
    result = run(["demo"])
    assert result.exit_code == 1
    assert "clink.cli.demo is missing" in result.stderr


def _console_script() -> list[str]:
    exe = shutil.which("clink", path=os.path.dirname(sys.executable))
    assert exe, f"the clink console script is not installed next to {sys.executable}: run pip install -e ."
    return [exe]


def test_console_script_subprocess_exit_codes(snap, tmp_path: Path) -> None:
    path, table = snap
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    ok = subprocess.run(
        [*_console_script(), "state-cat", str(path), "-o", "json", "--limit", "2"], capture_output=True, text=True, env=env, timeout=120
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["total_rows"] == table.num_rows
    bad = subprocess.run(
        [*_console_script(), "state-cat", str(VECTORS / "truncated.snap")], capture_output=True, text=True, env=env, timeout=120
    )
    assert bad.returncode == EXIT_DATA
    assert bad.stdout == "" and len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr
    out = tmp_path / "o.arrow"
    with open(out, "wb") as fh:
        piped = subprocess.run(
            [*_console_script(), "state-export", "--from", str(path), "--out", "-"], stdout=fh, stderr=subprocess.PIPE, env=env, timeout=120
        )
    assert piped.returncode == 0, piped.stderr
    assert rows_of(s.read_snapshot(out.read_bytes()).table) == rows_of(table)


def test_progress_bars_draw_on_request_and_keep_stdout_clean(snap, tmp_path: Path) -> None:
    path, table = snap
    out = tmp_path / "p.parquet"
    result = run(["state-export", "--from", str(path), "--out", str(out), "--progress", "--row-group-rows", "50"])
    assert result.exit_code == 0, result.output
    assert "writing parquet" in result.stderr and "reading" in result.stderr
    assert result.stdout.count("\n") == 1 and f"exported {table.num_rows} entries" in result.stdout
    quiet = run(["state-export", "--from", str(path), "--out", str(out), "--no-progress", "--force"])
    assert quiet.exit_code == 0 and quiet.stderr == ""


def test_export_query_projection_matches_state_query(snap, tmp_path: Path) -> None:
    path, table = snap
    out = tmp_path / "q.parquet"
    result = run(["state-export", "--from", str(path), "--out", str(out), "--format", "query"])
    assert result.exit_code == 0, result.output
    sql = "SELECT slot, kind, count(*) AS n, sum(value_int64) AS s, count(key_int64) AS k FROM {} GROUP BY ALL ORDER BY ALL"
    from_file = duckdb.connect().execute(sql.format(f"'{out}'")).fetchall()
    via_cli = json.loads(run(["state-query", str(path), sql.format("state"), "-o", "json"]).stdout)["rows"]
    assert [tuple(r.values()) for r in via_cli] == [tuple(row) for row in from_file]
    assert sum(r[2] for r in from_file) == table.num_rows
    assert pq.ParquetFile(out).metadata.metadata[b"clink.projection"] == b"query/1"
