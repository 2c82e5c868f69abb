"""The small ones of issue 13: each mistake gets one clear line and its exit code, each quiet success says what it did."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import snapshot as s
from clink.cli.common import EXIT_NEGATIVE, EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE
from pool.core import PoolCore
from store.local import FileStore
from tests.cli_fixtures import commit_checkpoints, generated_table, one_line_error, rows_of, write_table
from tests.client_fixtures import start_pool
from tests.lifecycle_helpers import build_job

JOB = "orders"
TABLE = generated_table(13, keyed_rows=60, operator_rows=4, raw_rows=2)


@pytest.fixture
def pool_dir(tmp_path):
    """tmp_path/pool: checkpoints 1 and 2 of JOB (the second is TABLE)."""
    commit_checkpoints(FileStore(tmp_path / "pool"), JOB, [generated_table(12, keyed_rows=30), TABLE])
    return tmp_path / "pool"


@pytest.fixture
def grpc_pool(pool_dir) -> Iterator[str]:
    """grpc://ADDRESS of a pool serving pool_dir."""
    server = start_pool(FileStore(pool_dir))
    try:
        yield f"grpc://{server.address}"
    finally:
        server.stop(0)


def said_once(line: str) -> str:
    """``line``, asserted to say no run of three words twice ('checkpoint 1 of job j: checkpoint 1 of job j not found')."""
    words = [w.strip("'\":,()") for w in line.split()]
    trigrams = [tuple(words[i : i + 3]) for i in range(len(words) - 2)]
    repeated = {t for t in trigrams if trigrams.count(t) > 1}
    assert not repeated, f"{line!r} repeats {repeated}"
    assert line.count("not found") <= 1, line
    return line


# --- not-found messages say each thing once -------------------------------------------------------------------


@pytest.mark.parametrize("command", ["state-cat", "check-savepoint"])
@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("jobs/nojob/chk-1", "checkpoint 1 of job"),
        ("jobs/orders/chk-99", "checkpoint 99 of job"),
        ("savepoints/nope", "savepoint 'nope' not found"),
    ],
)
def test_stored_not_found_says_it_once(cwd_tmp, pool_dir, tmp_tree, clink_run, command, path, says) -> None:
    before = tmp_tree()
    result = clink_run(command, f"pool/{path}")
    assert result.exit_code == EXIT_NOT_FOUND, result.output
    line = said_once(one_line_error(result))
    assert says in line and "not found" in line
    assert tmp_tree() == before


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("nojob", "job nojob not found"),
        ("nojob/chk-1", "job nojob not found"),
        ("orders/chk-99", "checkpoint 99 of job orders not found"),
    ],
)
def test_pool_not_found_says_it_once(cwd_tmp, grpc_pool, tmp_tree, clink_run, path, says) -> None:
    before = tmp_tree()
    result = clink_run("state-cat", f"{grpc_pool}/{path}")
    assert result.exit_code == EXIT_NOT_FOUND, result.output
    line = said_once(one_line_error(result))
    assert says in line
    if "chk-99" in path:
        assert "(complete checkpoints: 1, 2)" in line
    assert tmp_tree() == before


# --- chk-x is not a checkpoint number, not a '/' in a job id -------------------------------------------------------


@pytest.mark.parametrize(
    "src", ["grpc://127.0.0.1:7420/orders/chk-x", "grpc://127.0.0.1:7420/orders/chk-0", "pool/jobs/orders/chk-x", "s3://bkt/p/jobs/o/chk-"]
)
def test_a_bad_checkpoint_name_is_named(cwd_tmp, tmp_tree, clink_run, src) -> None:
    before = tmp_tree()
    result = clink_run("state-cat", src)
    assert result.exit_code == EXIT_USAGE, result.output
    line = one_line_error(result)
    assert "is not a checkpoint number; write chk-N" in line and "'/'" not in line and "job id" not in line
    assert tmp_tree() == before


def test_a_job_called_chk_something_is_still_a_job() -> None:
    from clink.tools.sources import parse_source

    assert parse_source("grpc://127.0.0.1:7420/chk-jobs").job == "chk-jobs"


# --- filters that match nothing say so on stderr ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--op", "uid:nope"], "--op uid:nope"),
        (["--key-groups", "5"], None),  # decided below from the table: a key group with no keyed row
        (["--slot", "nope"], "--slot nope"),
        (["--op", "uid:nope", "--slot", "count"], "--op uid:nope and --slot count"),
    ],
)
def test_state_cat_says_when_a_filter_matches_nothing(cwd_tmp, pool_dir, tmp_tree, clink_run, args, names) -> None:
    if names is None:
        empty = next(kg for kg in range(128) if not _keyed_in(kg))
        args, names = ["--key-groups", str(empty)], f"--key-groups {empty} (no keyed entry)"
    before = tmp_tree()
    src = f"pool/jobs/{JOB}/chk-2"
    result = clink_run("state-cat", src, *args, "-o", "json")
    assert result.exit_code == EXIT_OK, result.output
    doc = json.loads(result.stdout)  # stdout is the result as ever, maybe empty
    assert doc["shown"] == len(doc["rows"])
    assert result.stderr.count("\n") == 1
    note = json.loads(result.stderr)
    assert note["note"].startswith(f"nothing matches {names} in checkpoint 2 of job orders")
    text = clink_run("state-cat", src, *args)
    assert text.stderr.strip().startswith(f"clink: note: nothing matches {names}") and "note" not in text.stdout
    assert tmp_tree() == before


def _keyed_in(kg: int) -> bool:
    """Whether TABLE has a row in key group ``kg`` (its leading byte)."""
    return bool((s.leading_bytes(TABLE.column("key_bytes")) == kg).any())


@pytest.mark.parametrize("command", ["state-query", "state-diff", "state-export"])
def test_every_filtering_command_says_when_nothing_matches(cwd_tmp, pool_dir, clink_run, command) -> None:
    src = f"pool/jobs/{JOB}/chk-2"
    args = {
        "state-query": [src, "SELECT count(*) AS n FROM state"],
        "state-diff": [src, src],
        "state-export": ["--from", src, "--out", "empty.arrow"],
    }[command]
    result = clink_run(command, *args, "--op", "uid:nope")
    assert result.exit_code == EXIT_OK, result.output
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert "note: nothing matches --op uid:nope" in result.stderr
    quiet = clink_run(command, *args, "--op", "uid:window", *(["--force"] if command == "state-export" else []))
    assert quiet.exit_code == EXIT_OK and "note" not in quiet.stderr


# --- pins say when, not how many milliseconds -------------------------------------------------------------------


def test_pin_expiry_is_an_iso_time(tmp_path, clink_pool_run) -> None:
    build_job(PoolCore(FileStore(tmp_path / "lp")), JOB, 3, random.Random(5))
    store = str(tmp_path / "lp")
    text = clink_pool_run("pin", "--store", store, JOB, "2", "backfill", "--ttl", "2h")
    assert text.exit_code == EXIT_OK, text.output
    iso = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"
    assert re.fullmatch(rf"pinned checkpoint 2 of orders for backfill until {iso}\n", text.stdout)
    doc = json.loads(clink_pool_run("pin", "--store", store, JOB, "2", "backfill", "-o", "json").stdout)
    assert isinstance(doc["expires_at_ms"], int) and re.fullmatch(iso, doc["expires_at"])
    listing = clink_pool_run("ls", "--store", store, JOB).stdout
    assert re.search(rf"pin: checkpoint 2 held by backfill until {iso}\n", listing) and " ms" not in listing
    pins = json.loads(clink_pool_run("ls", "--store", store, JOB, "-o", "json").stdout)["pins"]
    assert isinstance(pins[0]["expires_at_ms"], int) and re.fullmatch(iso, pins[0]["expires_at"])


# --- Parquet exports read back; other Parquet files are refused ----------------------------------------------------


@pytest.mark.parametrize("fmt", ["parquet", "query"])
def test_state_cat_reads_a_parquet_export(cwd_tmp, pool_dir, clink_run, fmt) -> None:
    src = f"pool/jobs/{JOB}/chk-2"
    assert clink_run("state-export", "--from", src, "--out", f"{fmt}.parquet", "--format", fmt).exit_code == EXIT_OK
    result = clink_run("state-cat", f"{fmt}.parquet", "-n", "0", "-o", "json")
    assert result.exit_code == EXIT_OK, result.output
    assert json.loads(result.stdout)["total_rows"] == TABLE.num_rows
    assert clink_run("state-diff", f"{fmt}.parquet", src).exit_code == EXIT_OK  # the same entries, byte for byte
    assert clink_run("state-export", "--from", f"{fmt}.parquet", "--out", "back.arrow").exit_code == EXIT_OK
    assert rows_of(s.read_snapshot((cwd_tmp / "back.arrow").read_bytes()).table) == rows_of(TABLE)


def test_a_parquet_file_clink_did_not_write_is_refused(cwd_tmp, tmp_tree, clink_run) -> None:
    pq.write_table(pa.table({"a": [1, 2]}), "other.parquet")
    before = tmp_tree()
    result = clink_run("state-cat", "other.parquet")
    assert result.exit_code == EXIT_USAGE
    assert "a Parquet file `clink state-export` did not write" in one_line_error(result)
    assert tmp_tree() == before


def test_check_savepoint_says_a_parquet_export_is_not_restorable(cwd_tmp, pool_dir, clink_run) -> None:
    clink_run("state-export", "--from", f"pool/jobs/{JOB}/chk-2", "--out", "s.parquet")
    result = clink_run("check-savepoint", "s.parquet", "-o", "json")
    assert result.exit_code == EXIT_NEGATIVE
    details = [f["detail"] for f in json.loads(result.stdout)["findings"] if f["status"] == "fail"]
    assert len(details) == 1 and "derived projection, not restorable" in details[0]


# --- --out's suffix names the format, or is refused ----------------------------------------------------------------


@pytest.mark.parametrize("name", ["out.csv", "out.json", "out"])
def test_an_out_suffix_naming_no_format_is_refused(cwd_tmp, tmp_tree, clink_run, name) -> None:
    write_table(cwd_tmp / "in.snap", TABLE)
    before = tmp_tree()
    result = clink_run("state-export", "--from", "in.snap", "--out", name)
    assert result.exit_code == EXIT_USAGE
    line = one_line_error(result)
    assert f"--out {name}:" in line and "--format" in line
    assert tmp_tree() == before
    result = clink_run("state-export", "--from", "missing.snap", "--out", name)  # refused before the source is read
    assert result.exit_code == EXIT_USAGE


@pytest.mark.parametrize(
    ("name", "fmt"), [("a.arrow", "arrow"), ("a.arrows", "arrow"), ("a.IPC", "arrow"), ("a.snap", "arrow"), ("a.pq", "parquet")]
)
def test_an_out_suffix_names_the_format(cwd_tmp, clink_run, name, fmt) -> None:
    write_table(cwd_tmp / "in.snap", TABLE)
    result = clink_run("state-export", "--from", "in.snap", "--out", name, "-o", "json")
    assert result.exit_code == EXIT_OK, result.output
    assert json.loads(result.stdout)["format"] == fmt
    explicit = clink_run("state-export", "--from", "in.snap", "--out", "x.csv", "--format", "parquet")
    assert explicit.exit_code == EXIT_OK and pq.read_table(cwd_tmp / "x.csv").num_rows == TABLE.num_rows


# --- restore says which checkpoint it restored -----------------------------------------------------------------------


def test_restore_names_the_checkpoint_latest_resolved_to(tmp_path, clink_pool_run) -> None:
    build_job(PoolCore(FileStore(tmp_path / "lp")), JOB, 4, random.Random(6))
    store = str(tmp_path / "lp")
    text = clink_pool_run("restore", "--store", store, "copy", "--from-job", JOB)
    assert text.exit_code == EXIT_OK, text.output
    assert text.stdout.startswith("restored checkpoint 4 of orders as checkpoint 1 of copy") and "latest" not in text.stdout
    doc = json.loads(clink_pool_run("restore", "--store", store, "copy2", "--from-job", JOB, "-c", "2", "-o", "json").stdout)
    assert (doc["source"], doc["source_checkpoint_id"]) == ("checkpoint 2 of orders", 2)


# --- compact + gc that frees nothing says why ---------------------------------------------------------------------


def test_gc_after_compaction_names_the_checkpoints_holding_the_files(tmp_path, clink_pool_run) -> None:
    build_job(PoolCore(FileStore(tmp_path / "lp")), JOB, 6, random.Random(7))
    store = str(tmp_path / "lp")
    assert clink_pool_run("compact", "--store", store, JOB, "--force").exit_code == EXIT_OK
    text = clink_pool_run("gc", "--store", store, "--min-age", "0s")
    assert text.exit_code == EXIT_OK, text.output
    assert "deleted 0 object(s)" in text.stdout
    assert re.search(
        r"orders: 12 file\(s\), .* that checkpoint 6 no longer reads are still named by the manifests of checkpoint\(s\) 1-6", text.stdout
    )
    doc = json.loads(clink_pool_run("gc", "--store", store, "--min-age", "0s", "--keep-last", "1", "-o", "json").stdout)
    assert doc["deleted"] == [] and doc["retention"][0]["deleted"] == [1, 2, 3, 4, 5]
    assert doc["held"] == [{"job": JOB, "newest_checkpoint": 6, "files": 12, "bytes": doc["held"][0]["bytes"], "checkpoints": [6]}]
    freed = json.loads(clink_pool_run("gc", "--store", store, "--min-age", "0s", "-o", "json").stdout)
    assert freed["held"] and freed["held"][0]["checkpoints"] == [6]  # the compacted checkpoint keeps what it folded


# --- help texts name what exists ---------------------------------------------------------------------------------------


def _every_help(group) -> str:
    from click.testing import CliRunner

    runner = CliRunner()
    texts = [runner.invoke(group, ["--help"]).stdout]
    for name in group.list_commands(None):
        texts.append(runner.invoke(group, [name, "--help"]).stdout)
    return "\n".join(texts)


def test_help_examples_use_the_real_port_command_and_duckdb() -> None:
    from clink.cli.pool import cli as pool_cli
    from clink.cli.state import cli as state_cli

    text = _every_help(state_cli) + _every_help(pool_cli)
    assert ":7070" not in text and ":7420" in text
    assert not re.search(r"clink cat\b", text) and "clink state-cat" in text
    assert "duckdb -c" not in text and 'python -c "import duckdb;' in text
