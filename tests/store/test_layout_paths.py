"""Paths naming a checkpoint or a savepoint are parsed by store/layout.py alone, for the CLI's sources as for the pool."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from clink.cli.state import cli
from clink.tools.sources import parse_source
from pool.lifecycle import Lifecycle
from store.layout import StateFolder, find_state_folder, parse_checkpoint_dir
from store.local import FileStore
from tests.cli_fixtures import commit_checkpoints, generated_table


@pytest.mark.parametrize(
    "path, found",
    [
        ("root/jobs/orders/chk-7", StateFolder(1, job="orders", checkpoint_id=7)),
        ("root/jobs/orders/chk-7/_metadata", StateFolder(1, job="orders", checkpoint_id=7)),
        ("a/b/savepoints/release-1", StateFolder(2, savepoint="release-1")),
        ("a/savepoints/release-1/_metadata", StateFolder(1, savepoint="release-1")),
        ("savepoints/orders/nightly", StateFolder(0, savepoint="orders/nightly")),
        ("savepoints/orders/nightly/_metadata", StateFolder(0, savepoint="orders/nightly")),
        ("root/jobs/orders/chk-0", None),
        ("root/jobs/orders/chk-x", None),
        ("root/jobs/orders", None),
        ("savepoints/release-1/data", None),  # inside a savepoint, not one
        ("root/state.snap", None),
    ],
)
def test_state_folders_are_found_at_the_end_of_a_path(path: str, found: StateFolder | None) -> None:
    assert find_state_folder(path.split("/")) == found


def test_checkpoint_folder_names() -> None:
    assert [parse_checkpoint_dir(n) for n in ("chk-1", "chk-42", "chk-0", "chk-01", "chk-", "chk-1/x", "x")] == [
        1,
        42,
        None,
        None,
        None,
        None,
        None,
    ]


def test_sources_use_the_layout_for_every_scheme(tmp_path) -> None:
    assert parse_source("s3://bkt/pre/fix/jobs/j/chk-3").store_uri == "s3://bkt/pre/fix"
    assert parse_source("s3://bkt/savepoints/j/sp").savepoint == "j/sp"
    ref = parse_source("grpc://127.0.0.1:7420/some/job/chk-9")
    assert (ref.job, ref.checkpoint_id) == ("some/job", 9)
    local = parse_source(f"file://{tmp_path}/store/jobs/j/chk-2/_metadata")
    assert (local.kind, local.store_uri, local.job, local.checkpoint_id) == ("checkpoint", (tmp_path / "store").as_uri(), "j", 2)


def test_clink_reads_a_savepoint_written_under_its_job(tmp_path) -> None:
    store = FileStore(tmp_path / "pool")
    table = generated_table(9, keyed_rows=40)
    commit_checkpoints(store, "orders", [table])
    Lifecycle(store).savepoint("orders", 1, "nightly", under_job=True)
    assert (tmp_path / "pool" / "savepoints" / "orders" / "nightly" / "_metadata").is_file()
    result = CliRunner().invoke(cli, ["state-cat", f"file://{tmp_path}/pool/savepoints/orders/nightly", "-n", "0", "-o", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["total_rows"] == table.num_rows
