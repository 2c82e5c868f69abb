"""clink-pool retain on a store and through a real pool: set, show, clear, run now; JSON output, exit codes, bad input changing nothing."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from clink.cli.common import EXIT_DATA, EXIT_DENIED, EXIT_NOT_FOUND, EXIT_UNAVAILABLE, EXIT_USAGE
from clink.cli.pool import cli
from pool.core import PoolCore
from pool.job_policy import JobPolicy, job_policy_key, read_job_policy
from pool.lifecycle import LifecycleConfig
from pool.server import PoolServer, PoolServerConfig
from tests.cli_fixtures import one_line_error
from tests.client_fixtures import free_port
from tests.lifecycle_helpers import file_job, scan_checkpoint
from tests.security_fixtures import token_table


def invoke(*args: str, env: dict | None = None):
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def ok(*args: str) -> dict:
    result = invoke(*args, "-o", "json")
    assert result.exit_code == 0, (result.output, result.stderr)
    return json.loads(result.stdout)


def text(*args: str) -> str:
    result = invoke(*args)
    assert result.exit_code == 0, (result.output, result.stderr)
    return result.stdout


def keys(store) -> list[tuple[str, str]]:
    return sorted((o.key, o.etag) for o in store.list(""))


def complete(store) -> list[int]:
    return [c.checkpoint_id for c in PoolCore(store).list_checkpoints("orders")]


@pytest.fixture
def job_store(tmp_path):
    return file_job(tmp_path / "pool", 8)


@pytest.fixture
def pool(job_store):
    store, _, _ = job_store
    config = PoolServerConfig(listen="127.0.0.1:0", grace_seconds=0.2, lifecycle=LifecycleConfig(retain_last=2, gc_min_age_s=0))
    server = PoolServer(config, store=store).start()
    try:
        yield server.address
    finally:
        server.stop(0)


def test_on_the_store_a_policy_is_set_merged_shown_applied_and_cleared(job_store):
    store, uri, models = job_store
    doc = ok("retain", "orders", "--keep-last", "5", "--store", uri)
    assert doc["via"] == "store" and doc["effective"] is None
    assert doc["policy"] == {
        "keep_last": 5,
        "compact_max_layers": None,
        "compact_max_delta_bytes": None,
        "maintenance": True,
        "updated_ms": doc["policy"]["updated_ms"],
    }
    assert read_job_policy(store, "orders") == JobPolicy(keep_last=5, updated_ms=doc["policy"]["updated_ms"])
    assert ok("ls", "--store", uri) == {"jobs": ["orders"], "savepoints": []}  # maintenance/ is no job and no savepoint
    # settings not given keep their value; `pool` drops one
    doc = ok("retain", "orders", "--maintenance", "off", "--compact-max-delta-mb", "4", "--store", uri)
    assert (doc["policy"]["keep_last"], doc["policy"]["maintenance"], doc["policy"]["compact_max_delta_bytes"]) == (5, False, 4 << 20)
    assert text("retain", "orders", "--show", "--store", uri).strip() == (
        "job orders: keep_last 5, compact_max_layers (the pool's), compact_max_delta_bytes 4 MiB, maintenance off"
    )
    doc = ok("retain", "orders", "--compact-max-delta-mb", "pool", "--store", uri)
    assert doc["policy"]["compact_max_delta_bytes"] is None and doc["policy"]["keep_last"] == 5

    before = keys(store)
    dry = ok("retain", "orders", "--now", "--dry-run", "--store", uri)
    assert (dry["deleted"], dry["kept"], dry["keep_last"], dry["keep_last_from"], dry["dry_run"]) == (
        [1, 2, 3],
        [4, 5, 6, 7, 8],
        5,
        "job policy",
        True,
    )
    assert keys(store) == before
    out = text("retain", "orders", "--now", "--keep-last", "6", "--store", uri)
    assert out.strip() == "orders: removed checkpoints 1, 2; kept 3, 4, 5, 6, 7, 8 (keep_last 6, from --keep-last)"
    assert complete(store) == [3, 4, 5, 6, 7, 8]
    assert (read_job_policy(store, "orders") or JobPolicy()).keep_last == 5  # a depth given with --now is not stored

    assert ok("retain", "orders", "--clear", "--store", uri) == {"job": "orders", "via": "store", "cleared": True}
    assert not store.exists(job_policy_key("orders"))
    assert text("retain", "orders", "--clear", "--store", uri).strip() == "job orders had no policy of its own"
    assert ok("retain", "orders", "--show", "--store", uri) == {"job": "orders", "via": "store", "policy": None, "effective": None}
    run = ok("retain", "orders", "--now", "--store", uri)  # no policy: the default depth, 3
    assert (run["deleted"], run["keep_last"], run["keep_last_from"]) == ([3, 4, 5], 3, "pool")
    assert complete(store) == [6, 7, 8]
    for cid in (6, 7, 8):
        assert scan_checkpoint(store, "orders", cid) == models[cid]


def test_through_a_pool_the_same_commands_use_its_rpcs_and_settings(job_store, pool):
    store, _, _ = job_store
    shown = ok("retain", "orders", "--show", "--pool", pool)
    assert shown["via"] == "pool" and shown["policy"] is None
    assert shown["effective"] == {"keep_last": 2, "compact_max_layers": 8, "compact_max_delta_bytes": 256 << 20}
    doc = ok("retain", "orders", "--keep-last", "4", "--compact-max-layers", "3", "--pool", pool)
    assert (doc["policy"]["keep_last"], doc["policy"]["compact_max_layers"], doc["effective"]["compact_max_delta_bytes"]) == (
        4,
        3,
        256 << 20,
    )
    assert (read_job_policy(store, "orders") or JobPolicy()).compact_max_layers == 3
    out = text("retain", "orders", "--show", "--pool", pool).strip()
    assert out == "job orders: keep_last 4, compact_max_layers 3, compact_max_delta_bytes 256 MiB (the pool's), maintenance on"
    before = keys(store)
    assert ok("retain", "orders", "--now", "--dry-run", "--pool", pool)["deleted"] == [1, 2, 3, 4]
    assert keys(store) == before
    run = ok("retain", "orders", "--now", "--pool", pool)
    assert (run["deleted"], run["kept"], run["keep_last_from"], run["via"]) == ([1, 2, 3, 4], [5, 6, 7, 8], "job policy", "pool")
    assert complete(store) == [5, 6, 7, 8]
    assert ok("retain", "orders", "--clear", "--pool", pool)["cleared"] is True
    out = text("retain", "orders", "--now", "--pool", pool).strip()
    assert out == "orders: removed checkpoints 5, 6; kept 7, 8 (keep_last 2, from the pool's setting)"
    assert complete(store) == [7, 8]


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (["--keep-last", "0"], EXIT_USAGE, "positive integer"),
        (["--keep-last", "three"], EXIT_USAGE, "positive integer"),
        (["--compact-max-layers", "-1"], EXIT_USAGE, "positive integer"),
        (["--maintenance", "maybe"], EXIT_USAGE, "maybe"),
        (["--show", "--clear"], EXIT_USAGE, "do not go together"),
        (["--show", "--keep-last", "3"], EXIT_USAGE, "takes no settings"),
        (["--dry-run"], EXIT_USAGE, "--dry-run goes with --now"),
        (["--now", "--maintenance", "off"], EXIT_USAGE, "--now runs retention only"),
        (["--now", "--keep-last", "pool"], EXIT_USAGE, "takes a number"),
        ([], EXIT_USAGE, "nothing to do"),
    ],
)
def test_bad_input_is_one_line_and_changes_nothing(job_store, args, code, needle):
    store, uri, _ = job_store
    ok("retain", "orders", "--keep-last", "4", "--store", uri)
    before = keys(store)
    result = invoke("retain", "orders", *args, "--store", uri)
    assert result.exit_code == code
    assert needle in one_line_error(result)
    assert keys(store) == before


@pytest.mark.parametrize("via", ["store", "pool"])
@pytest.mark.parametrize(
    ("job", "args", "code", "needle"),
    [
        ("ordres", ["--keep-last", "2"], EXIT_NOT_FOUND, "ordres"),
        ("ordres", ["--show"], EXIT_NOT_FOUND, "ordres"),
        ("ordres", ["--clear"], EXIT_NOT_FOUND, "ordres"),
        ("ordres", ["--now"], EXIT_NOT_FOUND, "ordres"),
        ("a/b", ["--now"], EXIT_USAGE, "job id"),
    ],
)
def test_an_unknown_or_bad_job_exits_with_its_code_on_either_path(job_store, pool, via, job, args, code, needle):
    store, uri, _ = job_store
    before = keys(store)
    where = ["--store", uri] if via == "store" else ["--pool", pool]
    result = invoke("retain", job, *args, *where, "-o", "json")
    assert result.exit_code == code
    error = json.loads(one_line_error(result))
    assert needle in error["message"] and error["exit_code"] == code
    assert keys(store) == before


def test_a_corrupt_policy_is_damaged_data(job_store):
    store, uri, _ = job_store
    store.put(job_policy_key("orders"), b'{"format": "clink.job-policy", "version": 1, "job": "orders", "keep_lst": 2}')
    result = invoke("retain", "orders", "--show", "--store", uri)
    assert result.exit_code == EXIT_DATA
    line = one_line_error(result)
    assert "maintenance/policies/orders.json" in line and "keep_lst" in line


def test_a_token_without_access_to_the_job_is_denied(job_store):
    store, _, _ = job_store
    config = PoolServerConfig(listen="127.0.0.1:0", grace_seconds=0.2, tokens=token_table())
    server = PoolServer(config, store=store).start()
    try:
        before = keys(store)
        result = invoke("retain", "orders", "--keep-last", "1", "--pool", server.address, "--pool-token", "tok-a-rw")
        assert result.exit_code == EXIT_DENIED and "orders" in one_line_error(result)
        result = invoke("retain", "orders", "--now", "--pool", server.address)  # no token at all
        assert result.exit_code == EXIT_DENIED
        assert keys(store) == before
        assert ok("retain", "orders", "--now", "--pool", server.address, "--pool-token", "tok-admin")["deleted"] == [1, 2, 3, 4, 5]
    finally:
        server.stop(0)


def test_a_bad_or_dead_pool_address(job_store):
    store, _, _ = job_store
    before = keys(store)
    result = invoke("retain", "orders", "--show", "--pool", "pool-without-port")
    assert result.exit_code == EXIT_USAGE and "pool-without-port" in one_line_error(result)
    result = invoke("retain", "orders", "--show", "--pool", f"127.0.0.1:{free_port()}", "--pool-timeout", "2s")
    assert result.exit_code == EXIT_UNAVAILABLE
    one_line_error(result)
    assert keys(store) == before
