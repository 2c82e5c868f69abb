"""Both command lines behave alike: one exit-code table, options before or after the command, the same environment, Ctrl-C 130."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner

import snapshot.errors as errors
from clink.cli import common
from clink.cli.common import (
    EXIT_CONFLICT,
    EXIT_DATA,
    EXIT_DENIED,
    EXIT_INTERRUPTED,
    EXIT_MEANINGS,
    EXIT_NOT_FOUND,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    exit_code_for,
)
from clink.cli.pool import cli as pool_cli
from clink.cli.state import cli as state_cli
from tests.cli_fixtures import commit_checkpoints, generated_table, rows_of

REPO = Path(__file__).resolve().parents[2]
JOB = "orders"
MOTO_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


def _all_error_classes() -> list[type[errors.ClinkError]]:
    found, pending = [], [errors.ClinkError]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return found


def test_every_domain_error_has_a_documented_exit_code_and_the_specific_ones_are_not_internal() -> None:
    documented = {code for code, _ in EXIT_MEANINGS}
    for cls in _all_error_classes():
        code = exit_code_for(errors.rebuilt(cls, "x"))
        assert code in documented, cls
        if cls is not errors.ClinkError:
            assert code != common.EXIT_INTERNAL, f"{cls.__name__} falls through to 'internal error'"
    expected = {
        errors.NotFoundError: EXIT_NOT_FOUND,
        errors.ConflictError: EXIT_CONFLICT,
        errors.FencedError: EXIT_CONFLICT,
        errors.ChecksumMismatchError: EXIT_DATA,
        errors.CorruptSnapshotError: EXIT_DATA,
        errors.UnauthenticatedError: EXIT_DENIED,
        errors.OverloadedError: EXIT_UNAVAILABLE,
        errors.LimitExceededError: EXIT_USAGE,
        errors.InvalidArgumentError: EXIT_USAGE,
    }
    assert {cls: exit_code_for(errors.rebuilt(cls, "x")) for cls in expected} == expected


@pytest.mark.parametrize("cli", [state_cli, pool_cli], ids=["clink", "clink-pool"])
def test_both_helps_print_the_same_exit_code_table(cli) -> None:
    text = " ".join(CliRunner().invoke(cli, ["--help"]).output.split())
    for code, meaning in EXIT_MEANINGS:
        assert f"{code} {meaning}" in text


@pytest.fixture
def checkpoint_on_moto(make_s3_store):
    store = make_s3_store()
    table = generated_table(5, keyed_rows=60)
    commit_checkpoints(store, JOB, [table])
    return store, table


@pytest.mark.parametrize("where", ["before", "after"])
def test_clink_takes_store_options_before_or_after_the_command(checkpoint_on_moto, s3_config, where) -> None:
    store, table = checkpoint_on_moto
    options = ["--s3-endpoint-url", s3_config.endpoint_url, "--s3-region", "us-east-1", "-o", "json"]
    command = ["state-cat", f"{store.uri}/jobs/{JOB}/chk-1", "--limit", "0"]
    args = [*options, *command] if where == "before" else [*command, *options]
    result = CliRunner().invoke(state_cli, args, env=MOTO_ENV)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["total_rows"] == table.num_rows


@pytest.mark.parametrize("where", ["before", "after"])
def test_clink_pool_takes_store_options_before_or_after_the_command(checkpoint_on_moto, s3_config, where) -> None:
    store, _ = checkpoint_on_moto
    options = ["--store", store.uri, "--s3-endpoint-url", s3_config.endpoint_url, "-o", "json"]
    args = [*options, "ls", JOB] if where == "before" else ["ls", JOB, *options]
    result = CliRunner().invoke(pool_cli, args, env=MOTO_ENV)
    assert result.exit_code == 0, result.output
    assert [c["checkpoint_id"] for c in json.loads(result.stdout)["checkpoints"]] == [1]


def test_the_option_after_the_command_wins_over_the_one_before(checkpoint_on_moto, s3_config) -> None:
    store, _ = checkpoint_on_moto
    args = ["--store", "file:///nonexistent-store", "ls", JOB, "--store", store.uri, "--s3-endpoint-url", s3_config.endpoint_url]
    result = CliRunner().invoke(pool_cli, args, env=MOTO_ENV)
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("endpoint_var", ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"])
@pytest.mark.parametrize("region_var", ["AWS_REGION", "AWS_DEFAULT_REGION"])
def test_both_commands_read_the_same_environment(checkpoint_on_moto, s3_config, endpoint_var, region_var) -> None:
    store, table = checkpoint_on_moto
    env = {**MOTO_ENV, endpoint_var: s3_config.endpoint_url, region_var: "us-east-1"}
    cat = CliRunner().invoke(state_cli, ["state-cat", f"{store.uri}/jobs/{JOB}/chk-1", "-n", "0", "-o", "json"], env=env)
    assert cat.exit_code == 0, cat.output
    assert json.loads(cat.stdout)["total_rows"] == table.num_rows
    ls = CliRunner().invoke(pool_cli, ["ls", JOB, "-o", "json"], env={**env, "CLINK_POOL_STORE": store.uri})
    assert ls.exit_code == 0, ls.output
    assert json.loads(ls.stdout)["checkpoints"][0]["checkpoint_id"] == 1


@pytest.mark.parametrize(
    "cli, args, code, error",
    [
        (state_cli, ["state-cat", "/nonexistent/x.snap"], EXIT_NOT_FOUND, "NotFoundError"),
        (pool_cli, ["inspect", "--store", "file:///nonexistent-store", "nojob"], EXIT_NOT_FOUND, "NotFoundError"),
        (pool_cli, ["gc", "--store", "file:///x", "--min-age", "soon"], EXIT_USAGE, "BadParameter"),
        (state_cli, ["state-cat"], EXIT_USAGE, "MissingParameter"),
    ],
)
def test_json_output_makes_errors_json_too(cli, args, code, error) -> None:
    result = CliRunner().invoke(cli, ["-o", "json", *args])
    assert result.exit_code == code, result.output
    assert result.stdout == ""
    doc = json.loads(result.stderr)
    assert doc["error"] == error and doc["exit_code"] == code and doc["message"]


def test_json_errors_carry_the_damaged_file(checkpoint_on_moto, s3_config) -> None:
    store, _ = checkpoint_on_moto
    victim = next(o.key for o in store.list(f"jobs/{JOB}/data/"))
    data = bytearray(store.get(victim))
    data[len(data) // 2] ^= 0xFF
    store.put(victim, bytes(data))
    result = CliRunner().invoke(
        state_cli, ["state-cat", f"{store.uri}/jobs/{JOB}/chk-1", "--s3-endpoint-url", s3_config.endpoint_url, "-o", "json"], env=MOTO_ENV
    )
    assert result.exit_code == EXIT_DATA, result.output
    doc = json.loads(result.stderr)
    assert doc["error"] == "ChecksumMismatchError" and victim.rsplit("/", 1)[-1] in doc["path"]


@pytest.mark.parametrize("cli, old, new", [(state_cli, "--max-rows", "--limit"), (pool_cli, "--gc-min-age-s", "--gc-min-age")])
def test_old_spellings_still_work_and_say_the_new_one(cli, old, new, tmp_path) -> None:
    if cli is state_cli:
        from tests.cli_fixtures import write_table

        snap = write_table(tmp_path / "s.snap", generated_table(3, keyed_rows=20))
        args = ["state-query", str(snap), "SELECT 1 AS one", old, "5", "-o", "json"]
    else:
        args = ["serve", "--help", old, "10"]  # --help answers before serving; the option must still parse
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert f"{old} is now {new}" in result.stderr


def _interrupt_once_waiting(args: list[str], env: dict[str, str], waiting: Callable[[int], bool]) -> subprocess.CompletedProcess:
    """Start ``args``, send SIGINT once ``waiting(pid)`` says it blocks where a user would press Ctrl-C, collect the outcome."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        deadline = time.monotonic() + 60
        while not waiting(proc.pid):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the command never reached the point where it waits"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


class _HangingPool(grpc.GenericRpcHandler):
    """A gRPC server whose every method is taken and never answered: a pool stuck behind a slow store."""

    def __init__(self) -> None:
        self.called = threading.Event()
        self.release = threading.Event()

    def service(self, handler_call_details):  # noqa: ANN001, D102 - grpc's signature
        def hang(request, context):  # noqa: ANN001
            self.called.set()
            self.release.wait(60)
            context.abort(grpc.StatusCode.UNAVAILABLE, "released")

        return grpc.unary_unary_rpc_method_handler(hang)


def test_ctrl_c_exits_130_with_one_line_in_clink() -> None:
    hanging = _HangingPool()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), handlers=[hanging])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        args = [sys.executable, "-m", "clink.cli.state", "--pool-timeout", "60", "state-cat", f"grpc://127.0.0.1:{port}/{JOB}"]
        done = _interrupt_once_waiting(args, env, lambda pid: hanging.called.is_set())
    finally:
        hanging.release.set()
        server.stop(0)
    assert done.returncode == EXIT_INTERRUPTED, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "clink: interrupted" and "Traceback" not in done.stderr


def test_ctrl_c_exits_130_with_one_line_in_clink_pool() -> None:
    env = {**os.environ, **MOTO_ENV, "PYTHONPATH": str(REPO), "AWS_REGION": "us-east-1"}
    with socket.socket() as silent:  # an S3 endpoint that takes the connection and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        silent.settimeout(0.05)
        port = silent.getsockname()[1]
        accepted: list[socket.socket] = []

        def connected(pid: int) -> bool:
            try:
                accepted.append(silent.accept()[0])
            except TimeoutError:
                pass
            return bool(accepted)

        args = [
            sys.executable,
            "-m",
            "clink.cli.pool",
            "ls",
            "--store",
            "s3://bucket/pool",
            "--s3-endpoint-url",
            f"http://127.0.0.1:{port}",
        ]
        done = _interrupt_once_waiting(args, env, connected)
        for conn in accepted:
            conn.close()
    assert done.returncode == EXIT_INTERRUPTED, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "clink-pool: interrupted" and "Traceback" not in done.stderr


def test_clink_reads_what_clink_pool_wrote_with_the_same_flags(checkpoint_on_moto, s3_config) -> None:
    store, table = checkpoint_on_moto
    flags = ["--s3-endpoint-url", s3_config.endpoint_url]
    saved = CliRunner().invoke(pool_cli, ["savepoint", "--store", store.uri, *flags, JOB, "sp", "-o", "json"], env=MOTO_ENV)
    assert saved.exit_code == 0, saved.output
    cat = CliRunner().invoke(state_cli, ["state-cat", f"{store.uri}/savepoints/sp", *flags, "-n", "0", "-o", "json"], env=MOTO_ENV)
    assert cat.exit_code == 0, cat.output
    assert json.loads(cat.stdout)["total_rows"] == table.num_rows == len(rows_of(table))
