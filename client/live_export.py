"""A subtask's live export: GET /state.arrow serves its live state over HTTP(S), announced to the pool until it closes."""

from __future__ import annotations

import hmac
import logging
import secrets
import socket
import ssl
import tempfile
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING

from client.errors import ClinkError, FencedError, InvalidArgumentError, UnavailableError
from snapshot.names import is_loopback

if TYPE_CHECKING:
    from client.backend import RemoteReadBackend

log = logging.getLogger("clink.client.live")

ARROW_STREAM_TYPE = "application/vnd.apache.arrow.stream"
ROUTE = "/state.arrow"
# a connection that sends no complete request line and headers within this long is cut (a slow client cannot hold a thread)
SOCKET_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class LiveExportConfig:
    """Where and how a subtask serves its live state.

    ``token``: the bearer every reader (the pool included) must send; None makes a random one. TLS with both PEMs.
    ``advertise_host``: the host put in the announced URL when the bind host is not what the pool should dial.
    """

    host: str = "127.0.0.1"
    port: int = 0
    token: str | None = None
    tls_cert_pem: bytes | None = None
    tls_key_pem: bytes | None = None
    ttl_s: int = 30
    advertise_host: str | None = None

    def __post_init__(self) -> None:
        if (self.tls_cert_pem is None) != (self.tls_key_pem is None):
            raise InvalidArgumentError("a live export's TLS needs both tls_cert_pem and tls_key_pem")
        if isinstance(self.ttl_s, bool) or not isinstance(self.ttl_s, int) or not 3 <= self.ttl_s <= 300:
            raise InvalidArgumentError(f"live export ttl_s {self.ttl_s!r} must be 3..300 seconds")
        if self.token is not None and (not self.token or any(not 0x21 <= ord(c) <= 0x7E for c in self.token)):
            raise InvalidArgumentError("a live export token must be non-empty visible ASCII (no spaces or controls)")
        for what, host in (("on", self.host), ("advertised at", self.advertise_host)):
            if host is not None and self.tls_cert_pem is None and not is_loopback(host):
                raise InvalidArgumentError(
                    f"a live export {what} {host} would send its state and take its token in clear text: use 127.0.0.1, or give TLS"
                )


# connections open at once; past it the oldest one still sending its request is cut to make room (idle ones cannot lock out)
MAX_CONNECTIONS = 32


class _HeaderDeadlines:
    """One thread cutting every connection whose request line and headers have not arrived in time.

    A compact copy of pool.http_serving.HeaderDeadlines: the worker client may not import the pool.
    """

    def __init__(self) -> None:
        self._due: dict[_Handler, float] = {}  # insertion order: the first is the oldest connection still sending
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="live-export-deadlines", daemon=True)
        self._thread.start()

    def arm(self, handler: _Handler, seconds: float) -> None:
        with self._lock:
            self._due[handler] = time.monotonic() + seconds

    def disarm(self, handler: _Handler) -> None:
        with self._lock:
            self._due.pop(handler, None)

    def cut_oldest(self) -> bool:
        """Cut the connection that has waited longest for its request; whether there was one."""
        with self._lock:
            oldest = next(iter(self._due), None)
            if oldest is not None:
                del self._due[oldest]
        if oldest is not None:
            oldest.cut()
        return oldest is not None

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            now = time.monotonic()
            with self._lock:
                late = [h for h, due in self._due.items() if due < now]
                for h in late:
                    del self._due[h]
            for h in late:
                h.cut()

    def stop(self) -> None:
        self._stop.set()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    backend: RemoteReadBackend
    export: LiveExport

    def server_activate(self) -> None:
        super().server_activate()
        self._connections = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.header_deadlines = _HeaderDeadlines()
        self.stopped = False
        self._open: set[_Handler] = set()
        self._open_lock = threading.Lock()

    def opened(self, handler: _Handler) -> bool:
        """Track a connection until it ends; False (the caller closes it) once the export stopped."""
        with self._open_lock:
            if not self.stopped:
                self._open.add(handler)
            return not self.stopped

    def ended(self, handler: _Handler) -> None:
        with self._open_lock:
            self._open.discard(handler)

    def cut_all(self) -> None:
        """Stop answering: every open connection (a kept-alive one included) is cut at once."""
        with self._open_lock:
            self.stopped = True
            handlers = list(self._open)
        for h in handlers:
            h.cut()

    def process_request(self, request, client_address) -> None:  # noqa: ANN001 - the stdlib's signature
        if not self._connections.acquire(blocking=False):
            # full: make room by cutting the oldest connection that has not sent its request yet (its thread ends at once)
            if not (self.header_deadlines.cut_oldest() and self._connections.acquire(timeout=1.0)):
                self.shutdown_request(request)
                return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address) -> None:  # noqa: ANN001 - the stdlib's signature
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._connections.release()

    def server_close(self) -> None:
        super().server_close()
        self.header_deadlines.stop()

    def handle_error(self, request: object, client_address: tuple) -> None:
        log.info("live export connection from %s failed", client_address[0])  # a failed handshake or a dropped reader


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "clink-live-export"
    timeout = SOCKET_TIMEOUT_S
    server: _Server

    def setup(self) -> None:
        super().setup()
        if not self.server.opened(self):
            self.close_connection = True
            self.cut()

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.ended(self)

    def handle_one_request(self) -> None:
        if self.server.stopped:  # a kept-alive connection of a stopped export gets nothing more
            self.close_connection = True
            return
        # the request line and headers (a TLS handshake included) within ``timeout`` in all: trickling bytes is no help
        self.server.header_deadlines.arm(self, self.timeout)
        try:
            super().handle_one_request()
        finally:
            self.server.header_deadlines.disarm(self)

    def parse_request(self) -> bool:
        parsed = super().parse_request()  # reads the request's headers: still under the deadline
        self.server.header_deadlines.disarm(self)  # the headers are in: what follows is under the socket timeout
        return parsed

    def cut(self) -> None:
        """Shut the connection down (its thread's read fails at once)."""
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's signature
        log.debug("%s %s", self.address_string(), format % args)

    def _plain(self, status: int, text: str) -> None:
        body = (" ".join(text.split()) + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        if status == 401:
            self.send_header("WWW-Authenticate", "Bearer")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        if self.path.split("?", 1)[0] != ROUTE:
            self._plain(404, f"no route {self.path.split('?', 1)[0]}; the live state is at {ROUTE}")
            return
        given = self.headers.get("Authorization") or ""
        token = given[len("Bearer ") :] if given.startswith("Bearer ") else ""
        if not hmac.compare_digest(token.encode(), self.server.export.token.encode()):
            self._plain(401, "this live export needs 'Authorization: Bearer <token>' with its token")
            return
        backend, export = self.server.backend, self.server.export
        try:
            if backend.closed:
                raise UnavailableError(f"the backend of job {backend.job} is closed")
            if backend.fenced or export.fenced_epoch == backend.epoch:
                raise FencedError(
                    f"the writer of key groups {backend.key_groups[0]}-{backend.key_groups[1]} of job {backend.job} is fenced"
                )
            before = (backend.key_groups, backend.epoch)
            blob = backend.export_arrow_snapshot()
            checkpoint = backend.read_checkpoint
            if (backend.key_groups, backend.epoch) != before:  # restored meanwhile: the rows may be of the old range
                raise UnavailableError("the subtask restored while exporting; retry")
        except FencedError as exc:
            self._plain(409, str(exc))
            return
        except ClinkError as exc:
            self._plain(503, str(exc))
            return
        except Exception as exc:  # noqa: BLE001 - the worker stays up; the reader gets a status line
            log.exception("live export of job %s failed", backend.job)
            self._plain(500, f"internal error: {type(exc).__name__}")
            return
        lo, hi = before[0]
        self.send_response(200)
        self.send_header("Content-Type", ARROW_STREAM_TYPE)
        self.send_header("Content-Length", str(len(blob)))
        self.send_header("X-Clink-Job", backend.job)
        self.send_header("X-Clink-Key-Groups", f"{lo}-{hi}")
        self.send_header("X-Clink-Checkpoint", str(checkpoint or 0))
        self.end_headers()
        try:
            self.wfile.write(blob)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _not_allowed(self) -> None:
        self._plain(405, f"method {self.command} not allowed; use GET")

    do_POST = do_PUT = do_DELETE = do_PATCH = _not_allowed  # noqa: N815


class LiveExport:
    """A running live export of one backend: its ``url`` and ``token``; it re-announces itself until ``stop()``."""

    def __init__(self, backend: RemoteReadBackend, config: LiveExportConfig) -> None:
        self.backend = backend
        self.config = config
        self.token = config.token or secrets.token_urlsafe(32)
        self.fenced_epoch: int | None = None  # the epoch the pool called fenced (the endpoint then answers 409)
        self.last_error: BaseException | None = None
        try:
            self._server = _Server((config.host, config.port), _Handler)
        except OSError as exc:
            raise UnavailableError(f"cannot listen on {config.host}:{config.port} for the live export: {exc.strerror or exc}") from exc
        if config.tls_cert_pem is not None and config.tls_key_pem is not None:
            self._server.socket = _tls_context(config.tls_cert_pem, config.tls_key_pem).wrap_socket(
                self._server.socket, server_side=True, do_handshake_on_connect=False
            )
        self._server.backend, self._server.export = backend, self
        host = config.advertise_host or config.host
        host = f"[{host}]" if ":" in host else host
        self.url = f"{'https' if config.tls_cert_pem else 'http'}://{host}:{self._server.server_address[1]}{ROUTE}"
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._announced: tuple[tuple[int, int], int] | None = None
        self._serving = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2}, name="live-export", daemon=True)
        self._serving.start()
        try:
            self.announce()  # the first announcement in the caller's thread: a refusal (fenced, no access) is raised here
        except BaseException:
            self._close_server()
            raise
        self._renewing = threading.Thread(target=self._renew, name="live-export-renew", daemon=True)
        self._renewing.start()

    def announce(self) -> None:
        """Announce (or renew) the backend's current range and epoch to its pool: to every pool of a comma list or dns:/// name
        (each keeps announcements in its own memory); one that missed it is told at the next renewal.
        """
        backend = self.backend
        with backend._lock:  # one attempt's range and epoch: a restore in between would pair the old range with the new epoch
            key_groups, epoch = backend.key_groups, backend.epoch
        try:
            backend.pool.announce_live_export(backend.job, key_groups, epoch, self.url, self.token, self.config.ttl_s)
        except FencedError:
            self.fenced_epoch = epoch
            raise
        if self._stop.is_set():  # stop() withdrew while this renewal was on its way: withdraw what it just announced
            self._withdraw(key_groups, epoch)
            return
        if self._announced is not None and self._announced != (key_groups, epoch):
            self._withdraw(*self._announced)  # the range it restored from (the pool also drops it by URL)
        self._announced = (key_groups, epoch)

    def wake(self) -> None:
        """Announce now (the backend's range or epoch changed)."""
        self._wake.set()

    def _renew(self) -> None:
        interval = self.config.ttl_s / 3
        while not self._stop.is_set():
            self._wake.wait(interval)
            self._wake.clear()
            if self._stop.is_set() or self.backend.closed:
                return
            if self.fenced_epoch == self.backend.epoch:
                continue  # fenced: nothing to announce until a restore takes a new epoch
            try:
                self.announce()
                self.last_error = None
            except ClinkError as exc:  # the pool is away or refuses: keep serving, try again next period
                self.last_error = exc
                log.warning("live export of job %s: announcement failed: %s", self.backend.job, exc)

    def _withdraw(self, key_groups: tuple[int, int], epoch: int) -> None:
        try:
            self.backend.pool.withdraw_live_export(self.backend.job, key_groups, epoch)
        except ClinkError as exc:  # it expires by itself
            log.info("live export of job %s: withdraw failed (it expires by itself): %s", self.backend.job, exc)

    def _close_server(self) -> None:
        self._server.shutdown()
        self._server.cut_all()  # kept-alive connections too: a stopped export serves nothing
        self._server.server_close()
        self._serving.join(timeout=10)

    def stop(self, withdraw: bool = True) -> None:
        """Withdraw the announcement (unless the channel is gone), stop serving and join the threads."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._wake.set()
        if withdraw and self._announced is not None:
            self._withdraw(*self._announced)
        self._close_server()
        if self._renewing.is_alive():
            self._renewing.join(timeout=10)


def _tls_context(cert_pem: bytes, key_pem: bytes) -> ssl.SSLContext:
    """A server-side TLS 1.2+ context from PEM bytes (ssl loads chains from files only, so via a private temporary folder)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    with tempfile.TemporaryDirectory(prefix="clink-live-tls-") as folder:
        cert, key = Path(folder, "cert.pem"), Path(folder, "key.pem")
        cert.write_bytes(cert_pem)
        key.touch(mode=0o600)
        key.write_bytes(key_pem)
        try:
            ctx.load_cert_chain(str(cert), str(key))
        except (ssl.SSLError, OSError) as exc:
            raise InvalidArgumentError(f"the live export's TLS certificate or key cannot be loaded: {exc}") from None
    return ctx
