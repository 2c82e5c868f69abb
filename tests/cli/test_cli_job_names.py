"""A job id the pool refuses is refused by both command lines too: one line, exit 2, nothing sent or written."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from clink.cli.common import EXIT_USAGE
from clink.cli.pool import cli as pool_cli
from tests.cli_fixtures import commit_checkpoints, generated_table, one_line_error, run


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_state_cat_refuses_a_job_id_with_a_space_before_calling_the_pool(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = run(["--pool-timeout", "2s", "state-cat", "grpc://127.0.0.1:1/my job"])  # nothing listens there: refused first
    assert result.exit_code == EXIT_USAGE
    line = one_line_error(result)
    assert "job id 'my job' contains a forbidden character ' '" in line and "gave up" not in line
    assert result.stdout == "" and _files(tmp_path) == []


def test_clink_pool_refuses_a_new_job_id_with_a_space_and_writes_nothing(file_store, tmp_path) -> None:
    commit_checkpoints(file_store, "orders", [generated_table(5, keyed_rows=20)])
    root = Path(file_store.uri.removeprefix("file://"))
    before = _files(root)
    for args in (
        ["restore", "--store", file_store.uri, "new orders", "--from-job", "orders", "-c", "1"],
        ["ls", "--store", file_store.uri, "my job"],
        ["savepoint", "--store", file_store.uri, "orders", "before upgrade"],
    ):
        result = CliRunner().invoke(pool_cli, args)
        assert result.exit_code == EXIT_USAGE, (args, result.output)
        assert "forbidden character ' '" in one_line_error(result)
        assert result.stdout == ""
    assert _files(root) == before
