"""A mistyped or missing store on either command line: one clear line, the exit code of its kind, and no folder made."""

from __future__ import annotations

import json

import pytest

from clink.cli.common import EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE
from store.local import FileStore
from tests.cli_fixtures import commit_checkpoints, generated_table, one_line_error

JOB = "orders"
TABLE = generated_table(5, keyed_rows=40)


@pytest.fixture
def pool_dir(tmp_path):
    """tmp_path/pool holding checkpoint 1 of JOB."""
    commit_checkpoints(FileStore(tmp_path / "pool"), JOB, [TABLE])
    return tmp_path / "pool"


MISTYPED = [
    ("file://tmp/x", "names the host 'tmp', and a file URI takes none: write file:///tmp/x"),
    ("s3:/bkt/p", "is not an S3 URI: write s3://BUCKET/PREFIX"),
    ("s3://", "names no bucket"),
    ("file:tmp/x", "is not an absolute file URI"),
    ("gs://bkt/p", "unknown scheme 'gs://'"),
]


@pytest.mark.parametrize(("uri", "says"), MISTYPED)
@pytest.mark.parametrize("command", [["ls"], ["ls", JOB], ["inspect", JOB], ["gc", "--dry-run"], ["pin", JOB, "1", "me"]])
def test_clink_pool_refuses_a_mistyped_store(cwd_tmp, tmp_tree, clink_pool_run, uri, says, command) -> None:
    before = tmp_tree()
    result = clink_pool_run(*command, "--store", uri)
    assert result.exit_code == EXIT_USAGE, result.output
    assert says in one_line_error(result)
    assert result.stdout == ""
    assert tmp_tree() == before


@pytest.mark.parametrize("command", [["ls"], ["ls", JOB], ["inspect", JOB], ["gc"], ["compact", JOB], ["savepoint", JOB, "sp"]])
def test_clink_pool_on_a_missing_store_says_no_such_store(cwd_tmp, tmp_tree, clink_pool_run, command) -> None:
    before = tmp_tree()
    for uri in (f"file://{cwd_tmp}/nope", f"file:{cwd_tmp}/nope", "nope", "file://./nope"):
        result = clink_pool_run(*command, "--store", uri)
        assert result.exit_code == EXIT_NOT_FOUND, (uri, result.output)
        assert f"no such store: file://{cwd_tmp}/nope" in one_line_error(result)
    assert tmp_tree() == before


def test_clink_pool_json_error_names_the_missing_store(cwd_tmp, tmp_tree, clink_pool_run) -> None:
    result = clink_pool_run("ls", "--store", "file:///nonexistent-i13", "-o", "json")
    assert result.exit_code == EXIT_NOT_FOUND
    doc = json.loads(result.stderr)
    assert doc["error"] == "NotFoundError" and doc["message"].startswith("no such store: file:///nonexistent-i13")
    assert not __import__("os").path.exists("/nonexistent-i13")


def test_every_rfc_8089_spelling_opens_the_same_store(cwd_tmp, pool_dir, clink_pool_run, tmp_tree) -> None:
    before = tmp_tree()
    for uri in (f"file://{pool_dir}", f"file:{pool_dir}", f"file://localhost{pool_dir}", "pool", "file://./pool", str(pool_dir)):
        result = clink_pool_run("ls", "--store", uri, "-o", "json")
        assert result.exit_code == EXIT_OK, (uri, result.output)
        assert json.loads(result.stdout)["jobs"] == [JOB]
    assert tmp_tree() == before


def test_restore_may_start_a_new_store_only_from_another(cwd_tmp, pool_dir, clink_pool_run, tmp_tree) -> None:
    before = tmp_tree()
    result = clink_pool_run("restore", "--store", "file://./new-pool", "copy", "--from-job", JOB)
    assert result.exit_code == EXIT_NOT_FOUND and "no such store" in one_line_error(result)
    assert tmp_tree() == before
    result = clink_pool_run("restore", "--store", "new-pool", "copy", "--from-job", JOB, "--source-store", f"file:{pool_dir}")
    assert result.exit_code == EXIT_OK, result.output
    assert (cwd_tmp / "new-pool" / "jobs" / "copy" / "chk-1" / "_metadata").is_file()


READERS = [
    lambda src, out: ["state-cat", src],
    lambda src, out: ["state-diff", src, src],
    lambda src, out: ["state-query", src, "SELECT count(*) FROM state"],
    lambda src, out: ["check-savepoint", src],
    lambda src, out: ["state-export", "--from", src, "--out", out],
]


@pytest.mark.parametrize("reader", READERS, ids=["cat", "diff", "query", "check", "export"])
def test_clink_readers_on_a_missing_store_say_no_such_store(cwd_tmp, tmp_tree, clink_run, reader) -> None:
    before = tmp_tree()
    for src in (f"file:{cwd_tmp}/x/jobs/j/chk-1", f"file://{cwd_tmp}/x/jobs/j/chk-1", "x/jobs/j/chk-1", f"file:{cwd_tmp}/x/savepoints/s"):
        result = clink_run(*reader(src, "out.arrow"))
        assert result.exit_code == EXIT_NOT_FOUND, (src, result.output)
        assert f"no such store: file://{cwd_tmp}/x " in one_line_error(result)
        assert result.stdout == ""
    assert tmp_tree() == before  # no ./file:, no ./file%3A, no ./x, no out.arrow


@pytest.mark.parametrize("reader", READERS, ids=["cat", "diff", "query", "check", "export"])
@pytest.mark.parametrize(
    ("src", "says"), [("file://tmp/x/jobs/j/chk-1", "names the host 'tmp'"), ("s3:/bkt/jobs/j/chk-1", "not an S3 URI")]
)
def test_clink_readers_refuse_a_mistyped_source(cwd_tmp, tmp_tree, clink_run, reader, src, says) -> None:
    before = tmp_tree()
    result = clink_run(*reader(src, "out.arrow"))
    assert result.exit_code == EXIT_USAGE, result.output
    assert says in one_line_error(result)
    assert tmp_tree() == before


def test_clink_reads_a_checkpoint_by_every_spelling(cwd_tmp, pool_dir, clink_run, tmp_tree) -> None:
    before = tmp_tree()
    for src in (f"file:{pool_dir}/jobs/{JOB}/chk-1", f"file://localhost{pool_dir}/jobs/{JOB}/chk-1", f"pool/jobs/{JOB}/chk-1/_metadata"):
        result = clink_run("state-cat", src, "-o", "json", "-n", "1")
        assert result.exit_code == EXIT_OK, (src, result.output)
        assert json.loads(result.stdout)["total_rows"] == TABLE.num_rows
    assert tmp_tree() == before


def test_a_store_folder_with_a_space_and_a_percent_reads_back(cwd_tmp, clink_run) -> None:
    odd = cwd_tmp / "my pool%41"
    commit_checkpoints(FileStore(odd), JOB, [generated_table(6, keyed_rows=10)])
    result = clink_run("state-cat", f"my pool%41/jobs/{JOB}/chk-1", "-o", "json")  # through Path.as_uri and back
    assert result.exit_code == EXIT_OK, result.output
    assert not (cwd_tmp / "my poolA").exists()


def test_a_missing_bucket_is_no_such_bucket(cwd_tmp, tmp_tree, clink_run, clink_pool_run, s3_cli_env) -> None:
    before = tmp_tree()
    result = clink_run("state-cat", "s3://missing-bucket-i13/jobs/j/chk-1", env=s3_cli_env)
    assert result.exit_code == EXIT_NOT_FOUND, result.output
    line = one_line_error(result)
    assert "no such bucket: missing-bucket-i13" in line and "checkpoint" not in line
    result = clink_pool_run("ls", "--store", "s3://missing-bucket-i13/pool", env=s3_cli_env)
    assert result.exit_code == EXIT_NOT_FOUND and "no such bucket: missing-bucket-i13" in one_line_error(result)
    assert tmp_tree() == before


def test_gc_runs_on_a_store_whose_temp_folder_is_gone(tmp_path, pool_dir, clink_pool_run) -> None:
    import shutil

    shutil.rmtree(pool_dir / ".clink-tmp")  # a store copied without it, or made by hand
    result = clink_pool_run("gc", "--store", str(pool_dir), "--min-age", "0s", "-o", "json")
    assert result.exit_code == EXIT_OK, result.output
