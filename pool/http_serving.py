"""One way to serve HTTP(S) from the pool: threads per connection, TLS handshakes off the accept loop, socket timeouts."""

from __future__ import annotations

import errno
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, TypeVar, overload

from snapshot.errors import UnavailableError

if TYPE_CHECKING:
    from pool.auth import TlsConfig

log = logging.getLogger("clink.pool.http")

# what a failed bind means, said for people: the same words for the gRPC, metrics and HTTP export ports
BIND_PROBLEMS = {
    errno.EADDRINUSE: "address already in use (is another pool serving there?)",
    errno.EADDRNOTAVAIL: "address not available on this machine",
    errno.EACCES: "permission denied (ports below 1024 need privileges)",
}


def bind_problem(exc: OSError) -> str:
    """Why a bind failed, in the words every port of the pool uses (lower case, no errno)."""
    return BIND_PROBLEMS.get(exc.errno or 0) or (exc.strerror or str(exc)).lower()


# seconds an idle or stalled connection (a TLS handshake included) may hold its thread between two reads
SOCKET_TIMEOUT_S = 60.0


# connections served at once per port: past it a new one gets a 503 and is closed (each holds a thread while open)
MAX_CONNECTIONS = 64
# seconds a connection gets to finish its TLS handshake and send a request's line and headers (trickling bytes is no help)
HEADER_DEADLINE_S = 10.0


class PoolRequestHandler(BaseHTTPRequestHandler):
    """A request handler whose connection is cut when a request's handshake and headers take longer than HEADER_DEADLINE_S."""

    timeout = SOCKET_TIMEOUT_S
    header_deadline_s = HEADER_DEADLINE_S

    def handle_one_request(self) -> None:
        deadlines = getattr(self.server, "header_deadlines", None)
        if deadlines is not None:
            deadlines.arm(self, self.header_deadline_s)
        try:
            super().handle_one_request()
        finally:
            if deadlines is not None:
                deadlines.disarm(self)

    def parse_request(self) -> bool:
        parsed = super().parse_request()  # reads the request's headers: still under the deadline
        deadlines = getattr(self.server, "header_deadlines", None)
        if deadlines is not None:
            deadlines.disarm(self)  # the headers are in: what follows is under the socket timeout
        return parsed

    def cut(self) -> None:
        """Shut the connection down (its thread's read fails at once)."""
        log.info("cutting a connection from %s: no request within %.0f s", self.client_address[0], self.header_deadline_s)
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class HeaderDeadlines:
    """One thread cutting every connection whose request has not arrived in time (not a timer thread per connection)."""

    def __init__(self) -> None:
        self._due: dict[PoolRequestHandler, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pool-http-deadlines", daemon=True)
        self._thread.start()

    def arm(self, handler: PoolRequestHandler, seconds: float) -> None:
        with self._lock:
            self._due[handler] = time.monotonic() + seconds

    def disarm(self, handler: PoolRequestHandler) -> None:
        with self._lock:
            self._due.pop(handler, None)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            now = time.monotonic()
            with self._lock:
                late = [h for h, due in self._due.items() if due < now]
                for h in late:
                    del self._due[h]
            for h in late:
                h.cut()

    def stop(self) -> None:
        self._stop.set()


class PoolHttpServer(ThreadingHTTPServer):
    """A threading HTTP server with a bounded number of connections, whose connection errors are one log line, not a traceback."""

    daemon_threads = True
    max_connections = MAX_CONNECTIONS

    def server_activate(self) -> None:
        super().server_activate()
        self._connections = threading.BoundedSemaphore(self.max_connections)
        self.header_deadlines = HeaderDeadlines()

    def process_request(self, request, client_address) -> None:  # noqa: ANN001 - the stdlib's signature
        if not self._connections.acquire(blocking=False):
            log.info("refusing a connection from %s: %d connections open", client_address[0], self.max_connections)
            try:
                request.settimeout(1.0)
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            except OSError:
                pass  # a TLS socket not yet shaken hands, or a client gone: closing is the answer
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address) -> None:  # noqa: ANN001 - the stdlib's signature
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._connections.release()

    def handle_error(self, request: object, client_address: tuple) -> None:
        # a failed TLS handshake or a dropped connection is the client's problem: one log line, no traceback
        log.info("connection from %s failed: %s", client_address[0], sys.exc_info()[1])


_Server = TypeVar("_Server", bound=PoolHttpServer)


@overload
def serve_http(
    host: str,
    port: int,
    handler: type[BaseHTTPRequestHandler],
    tls: TlsConfig | None = None,
    name: str = "pool-http",
    *,
    configure: Callable[[PoolHttpServer], None] | None = None,
    purpose: str = "HTTP",
) -> tuple[PoolHttpServer, threading.Thread]: ...


@overload
def serve_http(
    host: str,
    port: int,
    handler: type[BaseHTTPRequestHandler],
    tls: TlsConfig | None = None,
    name: str = "pool-http",
    *,
    server_class: type[_Server],
    configure: Callable[[_Server], None] | None = None,
    purpose: str = "HTTP",
) -> tuple[_Server, threading.Thread]: ...


def serve_http(
    host: str,
    port: int,
    handler: type[BaseHTTPRequestHandler],
    tls: TlsConfig | None = None,
    name: str = "pool-http",
    server_class: type[PoolHttpServer] = PoolHttpServer,
    configure: Callable[[Any], None] | None = None,
    purpose: str = "HTTP",
) -> tuple[PoolHttpServer, threading.Thread]:
    """Serve ``handler`` on host:port (0: a free port) from a background thread; HTTPS with a pool.auth.TlsConfig.

    The TLS handshake runs lazily in each connection's own thread under the handler's socket timeout, so a client that
    connects and sends nothing never stalls the accept loop (and with it every other client). A port that cannot be bound
    is UnavailableError "cannot listen on HOST:PORT for ``purpose``: why".
    """
    try:
        server = server_class((host, port), handler)
    except OSError as exc:
        raise UnavailableError(f"cannot listen on {host}:{port} for {purpose}: {bind_problem(exc)}") from exc
    if tls is not None:
        server.socket = tls.ssl_context().wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    if configure is not None:  # before the first request can arrive
        configure(server)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name=name, daemon=True)
    thread.start()
    return server, thread


def stop_http(server: PoolHttpServer, thread: threading.Thread) -> None:
    """Stop accepting, close the socket and join the serving thread."""
    server.header_deadlines.stop()
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)
