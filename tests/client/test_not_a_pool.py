"""A client pointed at a port that answers but does not speak gRPC (the pool's HTTP export) says so at once, no retries."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from client import BackendConfig, PoolClient, PoolClientConfig, RemoteReadBackend, UnavailableError
from client.pool_client import not_a_pool
from pool.server import PoolServer, PoolServerConfig
from store.memory import MemoryStore


@pytest.fixture(scope="module")
def http_port() -> Iterator[int]:
    """The HTTP export port of a real pool (its gRPC port is elsewhere)."""
    server = PoolServer(PoolServerConfig(listen="127.0.0.1:0", http_port=0, grace_seconds=0.2), store=MemoryStore()).start()
    try:
        assert server.http_port
        yield server.http_port
    finally:
        server.stop(0)


@pytest.fixture
def http11_port() -> Iterator[int]:
    """A bare HTTP/1.1 server answering every connection with a status line."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    conn.recv(4096)
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def test_the_pools_http_port_is_named_as_not_a_grpc_pool_without_retrying(http_port: int) -> None:
    address = f"127.0.0.1:{http_port}"
    started = time.monotonic()
    with PoolClient(address, PoolClientConfig(call_deadline_s=5)) as client:
        with pytest.raises(UnavailableError, match=r"is not a gRPC pool \(HTTP/1 answered\): is it the pool's --http-port\?") as err:
            client.list_checkpoints("orders")
        assert client.calls == 1 and client.retries == 0
    assert "gave up" not in str(err.value) and "SETTINGS" not in str(err.value)
    assert time.monotonic() - started < 5


def test_connect_and_wait_ready_fail_at_once_on_an_http1_server(http11_port: int) -> None:
    address = f"127.0.0.1:{http11_port}"
    started = time.monotonic()
    with pytest.raises(UnavailableError, match=r"not a gRPC pool \(HTTP/1 answered\)"):
        RemoteReadBackend.connect(address, "orders", config=BackendConfig(call_deadline_s=5))
    with PoolClient(address) as client, pytest.raises(UnavailableError, match=r"not a gRPC pool \(HTTP/1 answered\)"):
        client.wait_ready(timeout_s=20)
    assert time.monotonic() - started < 10


def test_other_protocols_and_ordinary_failures_are_told_apart() -> None:
    ssh = "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:22: Failed parsing HTTP/2 (Expected SETTINGS frame as the first frame, got frame type 45)"
    assert "it answered, but not in HTTP/2" in (not_a_pool(ssh, "h:22") or "")
    refused = "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:1: Connection refused"
    assert not_a_pool(refused, "h:1") is None and not_a_pool(None, "h:1") is None
