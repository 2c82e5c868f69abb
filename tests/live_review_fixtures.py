"""Helpers of the live export reviews: pools on loopback, GETs that return the status, real and fake subtasks."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pyarrow as pa

import snapshot
from client.backend import RemoteReadBackend
from client.live_export import LiveExportConfig
from pool.domain import LiveExportConfig as PoolLiveConfig
from pool.domain import PoolConfig
from pool.server import PoolServer, PoolServerConfig
from store.memory import MemoryStore


def start(live: PoolLiveConfig | None = None, store: MemoryStore | None = None, port: int = 0) -> PoolServer:
    pool = PoolConfig(live=live) if live else PoolConfig()
    config = PoolServerConfig(listen=f"127.0.0.1:{port}", http_port=0, grace_seconds=0.2, pool=pool)
    return PoolServer(config, store=store or MemoryStore()).start()


def live_url(server: PoolServer, job: str, query: str = "live=1") -> str:
    return f"http://127.0.0.1:{server.http_port}/jobs/{job}/state.arrow?{query}"


def get(url: str, token: str | None = None, timeout: float = 30) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


@contextmanager
def subtasks(server: PoolServer, job: str, ranges: list[tuple[int, int]], **live: object) -> Iterator[list[RemoteReadBackend]]:
    with ExitStack() as stack:
        backends = [stack.enter_context(RemoteReadBackend.connect(server.address, job, r)) for r in ranges]
        for b in backends:
            b.restore()
            b.serve_live_export(config=LiveExportConfig(**live) if live else None)  # type: ignore[arg-type]
        yield backends


@contextmanager
def fake_subtask(behave: Callable[[BaseHTTPRequestHandler], None]) -> Iterator[str]:
    """http://127.0.0.1:PORT/state.arrow of an HTTP server answering every GET with ``behave(handler)``."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802
            try:
                behave(self)
            except OSError:
                pass

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/state.arrow"
    finally:
        server.shutdown()
        server.server_close()


def answer(h: BaseHTTPRequestHandler, body: bytes, job: str, kg: str = "0-127", extra: dict[str, str] | None = None) -> None:
    h.send_response(200)
    h.send_header("Content-Length", str(len(body)))
    h.send_header("X-Clink-Job", job)
    h.send_header("X-Clink-Key-Groups", kg)
    for k, v in (extra or {}).items():
        h.send_header(k, v)
    h.end_headers()
    h.wfile.write(body)


@contextmanager
def announced(
    server: PoolServer, job: str, url: str, token: str = "", key_groups: tuple[int, int] = (0, 127)
) -> Iterator[RemoteReadBackend]:
    """A real writer of ``key_groups`` whose announcement points the pool at ``url``."""
    with RemoteReadBackend.connect(server.address, job, key_groups) as b:
        b.restore()
        b.pool.announce_live_export(job, key_groups, b.epoch, url, token, 30)
        yield b


def canonical(rows: list[tuple[int, bytes, bytes]]) -> bytes:
    table = pa.table(
        {
            "op_id": pa.array([r[0] for r in rows], pa.uint64()),
            "key_bytes": pa.array([r[1] for r in rows], pa.binary()),
            "value_bytes": pa.array([r[2] for r in rows], pa.binary()),
        }
    )
    return snapshot.SnapshotArrowWriter().write(table)
