"""`clink-pool serve` mistakes at startup: a busy port, a bad --listen, a store it cannot use; one line, the exit code, nothing written."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import clink.cli.pool
import pool.server
from clink.cli.common import EXIT_DENIED, EXIT_UNAVAILABLE, EXIT_USAGE
from pool.server import parse_listen
from snapshot.errors import InvalidArgumentError, NotFoundError
from store.objects import StoreConfig

REPO = Path(__file__).resolve().parents[2]
EXIT_TIMEOUT_S = 60  # a serve that should refuse to start but serves instead is killed after this


def serve_args(store: str, *flags: str) -> list[str]:
    return [sys.executable, "-m", "clink.cli.pool", "serve", "--store", store, "--grace", "0", *flags]


def run_serve(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[int | None, str, str]:
    """Run a serve expected to exit at once: (exit code, stdout, stderr); exit code None when it was still running."""
    proc = subprocess.Popen(args, cwd=cwd, env=env or _env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=EXIT_TIMEOUT_S)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=10)
        return None, out, err


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", **extra}


def the_error_line(stderr: str) -> str:
    """The one line stderr holds (no traceback, no grpc log lines)."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one error line, got: {stderr!r}"
    assert lines[0].startswith("clink-pool: error: ")
    return lines[0]


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


class ServingPool:
    """A `clink-pool serve` subprocess on free loopback ports, its ready line parsed; stopped with SIGTERM."""

    def __init__(self, store: Path, cwd: Path) -> None:
        flags = ("--listen", "127.0.0.1:0", "--metrics-port", "0", "--http-port", "0", "--output", "json", "--log-level", "warning")
        self.proc = subprocess.Popen(
            serve_args(store.as_uri(), *flags), cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: lines.put(self.proc.stdout.readline()), daemon=True).start()  # type: ignore[union-attr]
        try:
            line = lines.get(timeout=EXIT_TIMEOUT_S)
        except queue.Empty:
            line = ""
        if not line:
            self.stop()
            raise AssertionError("the first pool did not get ready")
        self.ready = json.loads(line)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


@pytest.fixture
def first_pool(tmp_path: Path) -> Iterator[ServingPool]:
    serving = ServingPool(tmp_path / "first-store", tmp_path)
    try:
        yield serving
    finally:
        serving.stop()


# --- 1. two pools on one port ------------------------------------------------------------------------------------


@pytest.mark.parametrize("taken", ["port", "metrics_port", "http_port"])
def test_a_second_pool_on_a_busy_port_exits_69_with_one_line_and_creates_no_store(first_pool: ServingPool, tmp_path: Path, taken: str):
    port = first_pool.ready[taken]
    flags = {
        "port": ["--listen", f"127.0.0.1:{port}"],
        "metrics_port": ["--listen", "127.0.0.1:0", "--metrics-port", str(port)],
        "http_port": ["--listen", "127.0.0.1:0", "--http-port", str(port)],
    }[taken]
    second = tmp_path / "second-store"
    code, out, err = run_serve(serve_args(second.as_uri(), *flags), tmp_path)
    assert code == EXIT_UNAVAILABLE, (code, out, err)
    line = the_error_line(err)
    assert "address already in use" in line.lower() and f"127.0.0.1:{port}" in line
    assert "serving" not in out
    assert not second.exists()  # the ports are bound before the store is opened
    assert first_pool.proc.poll() is None  # the first pool serves on


# --- 7. --listen takes HOST:PORT only ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "listen, needle",
    [
        ("127.0.0.1:99999", "port 99999 is outside 0..65535"),
        ("127.0.0.1:65536", "outside 0..65535"),
        ("localhost", "has no port"),
        ("localhost:", "is not HOST:PORT"),
        (":7420", "is not HOST:PORT"),
        ("127.0.0.1:-1", "is not HOST:PORT"),
        ("127.0.0.1:http", "is not HOST:PORT"),
        ("::1:7420", "IPv6 address goes in brackets"),
        ("[::zz]:7420", "not an IPv6 address"),
        ("my host:7420", "not a host name"),
        ("", "is not HOST:PORT"),
    ],
)
def test_a_bad_listen_address_is_a_usage_error_before_anything_starts(monkeypatch, tmp_path: Path, listen: str, needle: str):
    started = []
    monkeypatch.setattr(pool.server, "PoolServer", lambda *a, **k: started.append(a))
    monkeypatch.setattr(clink.cli.pool, "setup_logging", lambda level, output: None)  # keep pytest's log handlers
    store = tmp_path / "store"
    result = CliRunner().invoke(clink.cli.pool.cli, ["serve", "--store", store.as_uri(), "--listen", listen])
    assert result.exit_code == EXIT_USAGE, result.output
    line = the_error_line(result.stderr)
    assert "--listen" in line and needle in line
    assert started == [] and not store.exists() and result.stdout == ""


@pytest.mark.parametrize(
    "listen, parsed",
    [
        ("127.0.0.1:7420", ("127.0.0.1", 7420)),
        ("127.0.0.1:0", ("127.0.0.1", 0)),
        ("localhost:65535", ("localhost", 65535)),
        ("0.0.0.0:7420", ("0.0.0.0", 7420)),
        ("[::1]:7420", ("::1", 7420)),
        ("[::]:0", ("::", 0)),
        ("pool-1.example.internal:7420", ("pool-1.example.internal", 7420)),
    ],
)
def test_good_listen_addresses_parse(listen: str, parsed: tuple[str, int]):
    assert parse_listen(listen) == parsed


def test_the_server_refuses_a_bad_listen_address_too():
    with pytest.raises(InvalidArgumentError, match="outside 0..65535"):
        pool.server.PoolServer(pool.server.PoolServerConfig(listen="127.0.0.1:99999"))


def test_create_bucket_on_a_local_store_is_a_usage_error_that_writes_nothing(tmp_path: Path):
    store = tmp_path / "store"
    code, out, err = run_serve(serve_args(store.as_uri(), "--listen", "127.0.0.1:0", "--create-bucket"), tmp_path)
    assert code == EXIT_USAGE
    assert "--create-bucket needs an s3:// store" in the_error_line(err)
    assert files_under(tmp_path) == []


# --- 6. serve checks its store -----------------------------------------------------------------------------------


def _s3_env(**extra: str) -> dict[str, str]:
    env = _env(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", **extra)
    env.pop("AWS_PROFILE", None)
    return env


def _no_credentials_env(tmp_path: Path) -> dict[str, str]:
    """An environment where boto3's chain finds nothing: no variables, no files, no instance metadata."""
    env = {k: v for k, v in _env().items() if not k.startswith("AWS_")}
    missing = tmp_path.parent / f"no-aws-{uuid.uuid4().hex}"
    env.update(AWS_SHARED_CREDENTIALS_FILE=str(missing / "credentials"), AWS_CONFIG_FILE=str(missing / "config"))
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    return env


def _bucket_exists(s3_config: StoreConfig, bucket: str) -> bool:
    from store.s3 import S3Store

    try:
        S3Store(bucket, "", s3_config).list_prefixes("")
    except NotFoundError:
        return False
    return True


def test_a_missing_bucket_stops_serve_naming_bucket_endpoint_and_create_bucket(moto_endpoint: str, s3_config, tmp_path: Path):
    bucket = f"missing-{uuid.uuid4().hex[:12]}"
    args = serve_args(f"s3://{bucket}/pool", "--listen", "127.0.0.1:0", "--s3-endpoint-url", moto_endpoint, "--s3-region", "us-east-1")
    code, out, err = run_serve(args, tmp_path, _s3_env())
    assert code == EXIT_UNAVAILABLE, (code, out, err)
    line = the_error_line(err)
    assert f"bucket {bucket} does not exist at {moto_endpoint}" in line and "--create-bucket" in line
    assert "serving" not in out
    assert not _bucket_exists(s3_config, bucket) and files_under(tmp_path) == []


def test_create_bucket_makes_the_missing_bucket_and_serves(moto_endpoint: str, s3_config, tmp_path: Path):
    bucket = f"created-{uuid.uuid4().hex[:12]}"
    args = serve_args(f"s3://{bucket}/pool", "--listen", "127.0.0.1:0", "--s3-endpoint-url", moto_endpoint, "--s3-region", "us-east-1")
    proc = subprocess.Popen(
        [*args, "--create-bucket", "--output", "json"],
        cwd=tmp_path,
        env=_s3_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: lines.put(proc.stdout.readline()), daemon=True).start()  # type: ignore[union-attr]
        ready = json.loads(lines.get(timeout=EXIT_TIMEOUT_S))
        assert ready["event"] == "serving" and ready["store"] == f"s3://{bucket}/pool"
        assert _bucket_exists(s3_config, bucket)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == 0


def test_missing_credentials_stop_serve_naming_the_credential_variables(moto_endpoint: str, make_s3_store, tmp_path: Path):
    store = make_s3_store()  # the bucket exists: only the credentials are missing
    args = serve_args(store.uri, "--listen", "127.0.0.1:0", "--s3-endpoint-url", moto_endpoint, "--s3-region", "us-east-1")
    code, out, err = run_serve(args, tmp_path, _no_credentials_env(tmp_path))
    assert code == EXIT_DENIED, (code, out, err)  # as every other command says it (review 13, finding 5)
    line = the_error_line(err)
    assert "no credentials" in line and "AWS_ACCESS_KEY_ID" in line and "AWS_SECRET_ACCESS_KEY" in line and moto_endpoint in line
    assert "UNAUTHENTICATED" not in line and "token" not in line.lower()
    assert "serving" not in out and files_under(tmp_path) == []
    assert list(store.list()) == []


def test_a_local_store_that_cannot_be_created_stops_serve(tmp_path: Path):
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"not a directory")
    store = blocker / "store"
    code, out, err = run_serve(serve_args(store.as_uri(), "--listen", "127.0.0.1:0"), tmp_path)
    assert code == EXIT_UNAVAILABLE, (code, out, err)
    line = the_error_line(err)
    assert "cannot create store directory" in line and str(store) in line
    assert files_under(tmp_path) == ["a-file"] and blocker.read_bytes() == b"not a directory"
