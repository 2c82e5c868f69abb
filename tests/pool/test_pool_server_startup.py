"""PoolServer.start: ports bound before the store is opened, a busy port refused, a store that fails its probe releases every port."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from pool.core import PoolCore
from pool.http_export import start_http_export
from pool.server import PoolServer, PoolServerConfig, address_problem
from snapshot.errors import InvalidArgumentError, UnavailableError
from store.local import FileStore


def _refuses_connections(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(2)
        return probe.connect_ex(("127.0.0.1", port)) != 0


def test_a_second_server_on_the_port_of_a_running_one_is_refused_and_the_first_serves_on(tmp_path: Path):
    first = PoolServer(PoolServerConfig(listen="127.0.0.1:0", grace_seconds=0), store=FileStore(tmp_path / "first")).start()
    try:
        second = PoolServer(PoolServerConfig(store_uri=(tmp_path / "second").as_uri(), listen=f"127.0.0.1:{first.port}"))
        with pytest.raises(UnavailableError, match=f"cannot listen on 127.0.0.1:{first.port}: address already in use"):
            second.start()
        assert not (tmp_path / "second").exists()
        assert address_problem("127.0.0.1", first.port) is not None and not _refuses_connections(first.port)
    finally:
        first.stop(0)
    assert address_problem("127.0.0.1", first.port) is None  # stopped: the port is free again


def test_a_store_that_fails_its_probe_releases_every_port_it_bound(s3_config, tmp_path: Path):
    bucket = f"missing-{uuid.uuid4().hex[:12]}"
    ports = []
    for _ in range(3):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    grpc_port, metrics_port, http_port = ports
    config = PoolServerConfig(
        store_uri=f"s3://{bucket}/pool", store=s3_config, listen=f"127.0.0.1:{grpc_port}", metrics_port=metrics_port, http_port=http_port
    )
    server = PoolServer(config)
    with pytest.raises(UnavailableError, match=f"bucket {bucket} does not exist at {s3_config.endpoint_url}"):
        server.start()
    assert all(address_problem("127.0.0.1", port) is None for port in ports)
    assert server.wait(0) and server.port is None


def test_the_export_answers_503_until_the_store_is_checked_then_serves(file_store):
    export = start_http_export(None, "127.0.0.1", 0)
    try:
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{export.url}/jobs/j/state.arrow", timeout=10)
        assert refused.value.code == 503 and b"starting" in refused.value.read()
        export.serve(PoolCore(file_store))
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"{export.url}/jobs/j/state.arrow", timeout=10)
        assert missing.value.code == 404  # served now: job j has no checkpoint
    finally:
        export.stop()


def test_a_stream_window_under_http2s_default_is_refused_by_name(tmp_path: Path):
    with pytest.raises(InvalidArgumentError, match="stream_window_bytes must be at least 64 KiB"):
        PoolServer(PoolServerConfig(store_uri=f"file://{tmp_path}", listen="127.0.0.1:0", stream_window_bytes=1024))
    assert list(tmp_path.iterdir()) == []
