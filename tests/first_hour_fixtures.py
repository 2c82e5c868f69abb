"""Fixtures for the user's-mistake tests (issue 13): both command lines run in a scratch working directory, and a tree watch.

- ``cwd_tmp``: the working directory is ``tmp_path`` for the test (a relative folder a command creates lands there).
- ``tmp_tree``: ``tmp_tree()`` lists every path under ``tmp_path`` (relative, sorted), to compare before and after a command.
- ``clink_run`` / ``clink_pool_run``: ``clink_run(*args, env=None)`` runs the command line in process through click's runner,
  its group's own handler mapping errors to exit codes; the result has ``exit_code``, ``stdout`` and ``stderr``.
- ``s3_cli_env``: the environment a command line needs to reach the session's moto server (dummy credentials).
- ``silent_endpoint``: ``http://127.0.0.1:PORT`` of a socket that accepts connections and never answers.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result


@pytest.fixture
def cwd_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run the test with ``tmp_path`` as the working directory."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def tmp_tree(tmp_path: Path) -> Callable[[], list[str]]:
    """A function listing every file and folder under tmp_path (relative paths, sorted)."""

    def listing() -> list[str]:
        out = []
        for dirpath, dirnames, filenames in os.walk(tmp_path):
            rel = os.path.relpath(dirpath, tmp_path)
            out += [os.path.normpath(os.path.join(rel, name)) for name in dirnames + filenames]
        return sorted(out)

    return listing


def _runner(group_path: str) -> Callable[..., Result]:
    def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
        module, _, name = group_path.rpartition(".")
        group = getattr(__import__(module, fromlist=[name]), name)
        return CliRunner().invoke(group, list(args), env=env, catch_exceptions=False)

    return invoke


@pytest.fixture
def clink_run() -> Callable[..., Result]:
    """Run `clink ARGS...` in process."""
    return _runner("clink.cli.state.cli")


@pytest.fixture
def clink_pool_run() -> Callable[..., Result]:
    """Run `clink-pool ARGS...` in process."""
    return _runner("clink.cli.pool.cli")


@pytest.fixture
def s3_cli_env(moto_endpoint: str) -> dict[str, str]:
    """Dummy credentials, region and the moto endpoint, as a user's shell would hold them."""
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": moto_endpoint,
    }


@pytest.fixture
def silent_endpoint():
    """http://127.0.0.1:PORT of a socket that accepts connections (in its backlog) and never answers."""
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        yield f"http://127.0.0.1:{silent.getsockname()[1]}"
