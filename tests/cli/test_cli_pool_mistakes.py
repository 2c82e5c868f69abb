"""clink pointed at the wrong pool port, or without the token a pool wants: one line naming the fix, the right exit code."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from clink.cli.common import EXIT_DENIED, EXIT_UNAVAILABLE
from clink.cli.state import pool_auth_hint
from pool.server import PoolServer, PoolServerConfig
from snapshot.errors import UnauthenticatedError
from store.memory import MemoryStore
from tests.cli_fixtures import one_line_error, run
from tests.security_fixtures import token_table


@pytest.fixture(scope="module")
def guarded_pool() -> Iterator[tuple[str, int]]:
    """A pool that wants a token (tests/security_fixtures.py TOKENS_TEXT), with its HTTP export: (gRPC address, HTTP port)."""
    config = PoolServerConfig(listen="127.0.0.1:0", http_port=0, grace_seconds=0.2, tokens=token_table())
    server = PoolServer(config, store=MemoryStore()).start()
    try:
        assert server.http_port
        yield server.address, server.http_port
    finally:
        server.stop(0)


def _nothing_written(folder: Path) -> None:
    assert list(folder.iterdir()) == []


def test_state_cat_on_the_http_port_says_it_is_not_a_grpc_pool(guarded_pool, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    _, http_port = guarded_pool
    result = run(["state-cat", f"grpc://127.0.0.1:{http_port}/job-a"])
    assert result.exit_code == EXIT_UNAVAILABLE
    line = one_line_error(result)
    assert "is not a gRPC pool (HTTP/1 answered)" in line and "gave up" not in line
    assert result.stdout == ""
    _nothing_written(tmp_path)


@pytest.mark.parametrize(
    ("env", "args", "hint"),
    [
        ({}, [], "the pool wants a token: pass it with --pool-token TOKEN or $CLINK_POOL_TOKEN"),
        ({}, ["--pool-token", "not-a-token"], "refused the token given with --pool-token or $CLINK_POOL_TOKEN"),
        ({"CLINK_POOL_TOKEN": "tok-b-rw"}, [], "the token given with --pool-token or $CLINK_POOL_TOKEN is not allowed this"),
    ],
)
@pytest.mark.parametrize("over", ["grpc", "http"])
def test_a_pools_refusal_names_the_token_option_and_variable(guarded_pool, tmp_path, monkeypatch, env, args, hint, over) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CLINK_POOL_TOKEN", raising=False)
    address, http_port = guarded_pool
    src = f"grpc://{address}/job-a" if over == "grpc" else f"http://127.0.0.1:{http_port}/jobs/job-a/state.arrow"
    result = run([*args, "state-cat", src], env=env)
    assert result.exit_code == EXIT_DENIED, result.output
    line = one_line_error(result)
    assert hint in line
    assert result.stdout == ""
    _nothing_written(tmp_path)


def test_a_store_refusal_gets_no_token_hint() -> None:
    try:
        try:
            raise OSError("AccessDenied from S3")
        except OSError as cause:
            raise UnauthenticatedError("s3://bkt: credentials refused") from cause
    except UnauthenticatedError as exc:
        assert pool_auth_hint(exc, token_given=False) is None
