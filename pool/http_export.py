"""HTTP port of a pool: GET /jobs/JOB/state.arrow streams the canonical snapshot (curl, any Arrow reader); / and /api/ the status page."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, quote, unquote, urlsplit

import pyarrow as pa
import pyarrow.compute as pc

from pool.core import PoolCore
from pool.domain import KeyGroupRange
from pool.http_serving import SOCKET_TIMEOUT_S, PoolHttpServer, PoolRequestHandler, serve_http, stop_http
from pool.metrics import PoolMetrics
from pool.status_page import (
    MaintainerStatus,
    StatusPage,
    StatusPageConfig,
    StatusRoute,
    document,
    is_api_path,
    is_status_path,
    parse_status_route,
    render,
    render_failure,
)
from pool.streaming import stream_chunks
from snapshot import SnapshotArrowWriter, StateVersionMap
from snapshot.errors import (
    ClinkError,
    ConflictError,
    CorruptDataError,
    FencedError,
    InvalidArgumentError,
    LimitExceededError,
    NotFoundError,
    OverloadedError,
    PermissionDeniedError,
    ResourceExhaustedError,
    UnauthenticatedError,
    UnavailableError,
    lookup_by_class,
)
from snapshot.format import operators_metadata
from snapshot.state_selectors import LATEST_CHECKPOINT, parse_checkpoint, parse_key_groups, parse_op

if TYPE_CHECKING:
    from pool.auth import TokenTable

log = logging.getLogger("clink.pool.http")

ARROW_STREAM_TYPE = "application/vnd.apache.arrow.stream"
_ROUTE = re.compile(r"^/jobs/(?P<job>[^/]+)/state\.arrow$")
_PARAMS = {"checkpoint", "key_groups", "op_id", "live", "partial"}

# seconds an export may stream in all (a reader slower than this is cut off)
EXPORT_MAX_S = 3600.0
# the outcome counted and logged for an export cut after its headers went out (its status line already said 200)
ABORTED = "aborted"

# Domain errors to HTTP status, looked up along the exception's MRO as pool/errors.py does for gRPC.
STATUS_BY_ERROR: dict[type[ClinkError], int] = {
    NotFoundError: 404,
    InvalidArgumentError: 400,
    OverloadedError: 503,
    LimitExceededError: 413,
    ResourceExhaustedError: 503,
    UnavailableError: 503,
    UnauthenticatedError: 401,
    PermissionDeniedError: 403,
    ConflictError: 409,
    FencedError: 409,
    CorruptDataError: 502,  # the store holds damaged data: the pool is a gateway to it, and says which file
}


def status_for(exc: BaseException) -> int:
    """The HTTP status of an error raised before the first byte of a response (500 for anything unmapped)."""
    return lookup_by_class(STATUS_BY_ERROR, exc, 500)


@dataclass(frozen=True)
class ExportRequest:
    """A parsed state.arrow request."""

    job: str
    checkpoint_id: int  # 0: newest complete
    key_groups: KeyGroupRange | None
    op_ids: tuple[int, ...]
    live: bool = False  # the running subtasks' merged live state, not a checkpoint
    allow_partial: bool = False  # live only: serve what answered, naming the missing ranges in a header


def _one(params: dict[str, list[str]], name: str) -> str | None:
    values = params.get(name)
    if not values:
        return None
    if len(values) > 1:
        raise InvalidArgumentError(f"parameter {name} given {len(values)} times")
    return values[0]


def parse_request(path: str) -> ExportRequest | None:
    """The export request a URL asks for; None when the path is not the state.arrow route; InvalidArgumentError for bad parameters."""
    url = urlsplit(path)
    m = _ROUTE.match(url.path)
    if not m:
        return None
    job = unquote(m.group("job"))
    try:
        params = parse_qs(url.query, keep_blank_values=True, strict_parsing=bool(url.query))
    except ValueError:
        raise InvalidArgumentError(f"query string {url.query!r} is malformed") from None
    unknown = sorted(set(params) - _PARAMS)
    if unknown:
        raise InvalidArgumentError(f"unknown parameter(s) {', '.join(unknown)} (known: {', '.join(sorted(_PARAMS))})")
    # the CLI's selectors, parsed by the same functions: checkpoint 0 or absent is the newest complete one
    checkpoint_id = parse_checkpoint(_one(params, "checkpoint"), "checkpoint")
    raw = _one(params, "key_groups")
    key_groups = KeyGroupRange(*parse_key_groups(raw, "key_groups")) if raw else None
    op_ids = tuple(parse_op(text, "op_id") for text in params.get("op_id", []))
    live = _flag(_one(params, "live"), "live", ("0", "1")) == "1"  # live=0 is the checkpoint export, as if absent
    partial = _one(params, "partial")
    if partial is not None and partial != "allow":
        raise InvalidArgumentError(f"partial={partial!r}: the only value is partial=allow")
    if partial is not None and not live:
        raise InvalidArgumentError("partial=allow applies to live exports only (add live=1)")
    if live and _one(params, "checkpoint") is not None:
        raise InvalidArgumentError("live=1 serves the running subtasks' state: it takes no checkpoint")
    return ExportRequest(job, checkpoint_id, key_groups, op_ids, live=live, allow_partial=partial is not None)


def _flag(value: str | None, name: str, allowed: tuple[str, ...]) -> str | None:
    if value is not None and value not in allowed:
        raise InvalidArgumentError(f"{name}={value!r}: use {name}={' or '.join(allowed)}")
    return value


class _ExportServer(PoolHttpServer):
    core: PoolCore | None = None  # None until the pool's store is open and checked: exports get 503 until then
    tokens: TokenTable | None = None  # a pool.auth.TokenTable: every route but /healthz needs a bearer token with read access to the job
    exports: threading.BoundedSemaphore  # exports streamed at once
    max_exports = 0
    redact = staticmethod(str)  # takes the store's location out of messages sent to clients
    metrics: PoolMetrics | None = None  # counts every finished export by status
    status_config = StatusPageConfig()
    status_requests: threading.BoundedSemaphore  # status pages built at once (each reads the store)
    maintainer: Callable[[], MaintainerStatus | None] = staticmethod(lambda: None)  # resolved per request: it starts after binding
    _status: StatusPage | None = None

    def status_page(self, core: PoolCore) -> StatusPage:
        """The status page over ``core`` (made on first use; the core is set once the store is checked)."""
        page = self._status
        if page is None or page.core is not core:
            page = self._status = StatusPage(core, self.status_config, lambda: self.maintainer())
        return page


class _Handler(PoolRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "clink-pool-http"
    timeout = SOCKET_TIMEOUT_S
    server: _ExportServer

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's signature
        log.debug("%s %s", self.address_string(), format % args)

    def _plain(self, status: int, text: str, error: BaseException | None = None) -> None:
        body = (" ".join(self.server.redact(text).split()) + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("X-Content-Type-Options", "nosniff")
        if status == 405:  # HEAD answers only the status paths; the export streams are GET alone
            path = urlsplit(self.path).path
            self.send_header("Allow", "GET, HEAD" if path == "/healthz" or is_status_path(path) else "GET")
        if error is not None:
            self.send_header("X-Clink-Error", type(error).__name__)  # the domain error's class, as the gRPC trailer names it
        if status == 503:
            self.send_header("Retry-After", "1")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send(self, status: int, content_type: str, body: bytes) -> None:
        """A status-page answer: the body with its length, never cached, never framed, sniffed or run as script."""
        from pool.status_html import CONTENT_SECURITY_POLICY

        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        if status == 401:
            self.send_header("WWW-Authenticate", 'Bearer realm="clink-pool"')
        if status == 503:
            self.send_header("Retry-After", "1")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _status_failed(self, api: bool, status: int, error: BaseException) -> None:
        message = (
            self.server.redact(" ".join(str(error).split())) if isinstance(error, ClinkError) else f"internal error: {type(error).__name__}"
        )
        log.info("status %s -> %d: %s", urlsplit(self.path).path, status, message)
        self._send(status, *render_failure(api, status, error, message, int(time.time() * 1000)))

    def _status(self) -> None:
        """Answer a status-page request (/, /status/..., /api/...): the token's jobs only, bounded work, HTML or JSON."""
        api = is_api_path(urlsplit(self.path).path)
        try:
            route = parse_status_route(self.path, self.server.status_config.max_per_page)
        except InvalidArgumentError as exc:
            self._status_failed(api, 400, exc)
            return
        assert route is not None  # do_GET routes only status paths here
        visible: Callable[[str], bool] = lambda job: True  # noqa: E731 - no tokens: every job, as the export serves every job
        if self.server.tokens is not None:
            try:
                visible = self._status_grant(route)
            except ClinkError as exc:
                self._status_failed(api, status_for(exc), exc)
                return
        core = self.server.core
        if core is None:
            self._status_failed(api, 503, UnavailableError("the pool is starting (its store is being checked); retry"))
            return
        if not self.server.status_requests.acquire(blocking=False):
            busy = OverloadedError(f"the pool is building {self.server.status_config.max_requests} status pages, its limit; retry")
            self._status_failed(api, 503, busy)
            return
        try:
            doc = document(self.server.status_page(core), route, visible)
            content_type, body = render(route, doc)
            # errors quoted in the documents (a job's listing, the maintainer's runs) may name the store's bucket and prefix
            body = self.server.redact(body.decode()).encode()
        except Exception as exc:  # noqa: BLE001 - every failure is a status line and a page saying it, the server stays up
            status = status_for(exc)
            if status == 500:
                log.exception("status page %s failed", route.path)
            self._status_failed(api, status, exc)
            return
        finally:
            self.server.status_requests.release()
        self._send(200, content_type, body)

    def _status_grant(self, route: StatusRoute) -> Callable[[str], bool]:
        """Which jobs the request's token may see; UnauthenticatedError or PermissionDeniedError (a job page: read access to it)."""
        from pool.auth import READ, bearer_token

        tokens = self.server.tokens
        assert tokens is not None  # called only when the pool checks tokens
        token = bearer_token(self.headers.get("Authorization"))
        if route.job is not None:
            tokens.authorize(token, route.job, READ)
        grant = tokens.grant_for(token)
        if READ not in grant.access:
            raise PermissionDeniedError(f"token {grant.name} may not read jobs")
        return grant.allows_job

    def do_HEAD(self) -> None:  # noqa: N802 - the stdlib's name
        path = urlsplit(self.path).path
        if path == "/healthz" or is_status_path(path):
            self.do_GET()  # the same status line and headers; _send and _plain write no body for HEAD
            return
        self._plain(405, f"method HEAD not allowed on {path}; use GET (HEAD answers / , /status/..., /api/... and /healthz)")

    def _refuse(self, what: str, started: float, status: int, text: str, error: BaseException | None = None) -> None:
        """Answer an export with an error line, counted and logged."""
        self._plain(status, text, error)
        _finished(self.server.metrics, what, str(status), started, detail=text)

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        path = urlsplit(self.path).path
        if path == "/healthz":
            self._plain(200, "ok")
            return
        if is_status_path(path):
            self._status()
            return
        started = time.monotonic()
        try:
            request = parse_request(self.path)
        except InvalidArgumentError as exc:
            self._refuse(path, started, 400, str(exc), exc)
            return
        if request is None:
            self._plain(
                404,
                f"no route {path}; try /jobs/JOB/state.arrow?checkpoint=N&key_groups=LO-HI&op_id=ID, /jobs/JOB/state.arrow?live=1, "
                "/ (the status page), /api/jobs or /healthz",
            )
            return
        what = f"of job {request.job}"
        if self.server.tokens is not None:
            from pool.auth import READ, bearer_token

            try:
                self.server.tokens.authorize(bearer_token(self.headers.get("Authorization")), request.job, READ)
            except ClinkError as exc:
                self._refuse(what, started, status_for(exc), str(exc), exc)
                return
        if self.server.core is None:
            starting = UnavailableError("the pool is starting (its store is being checked); retry")
            self._refuse(what, started, 503, str(starting), starting)
            return
        if not self.server.exports.acquire(blocking=False):
            busy = OverloadedError(f"the pool is streaming {self.server.max_exports} exports, its limit (--max-http-exports); retry later")
            self._refuse(what, started, 503, str(busy), busy)
            return
        try:
            self._export(request, started)
        finally:
            self.server.exports.release()

    def _export(self, request: ExportRequest, started: float) -> None:
        core = self.server.core
        assert core is not None  # checked by do_GET
        what = f"of job {request.job}"
        headers: list[tuple[str, str]] = []
        try:
            checkpoint_id = request.checkpoint_id
            if request.live:
                what = f"of job {request.job} live"
                state = core.live_state(request.job, request.key_groups, request.allow_partial)
                table, writer = state.table, state.writer
                if request.op_ids:
                    table = table.filter(pc.is_in(table.column("op_id"), value_set=pa.array(request.op_ids, pa.uint64())))
                headers.append(("X-Clink-Subtasks", state.subtasks_header()))
                if state.missing:
                    headers.append(("X-Clink-Missing-Key-Groups", state.missing_header()))
                filename = f"{quote(request.job, safe='')}-live.arrow"
            else:
                if checkpoint_id == LATEST_CHECKPOINT:
                    # pin "latest" once, so the header names exactly the checkpoint streamed
                    checkpoint_id = core.reader(request.job).latest()
                what = f"of job {request.job} checkpoint {checkpoint_id or 'latest'}"
                # the table rather than core.scan's stream, so the log can say how many rows went out
                table, manifest = core.scan_table(request.job, checkpoint_id, request.key_groups, list(request.op_ids), None)
                # the uids travel with the rows, so a reader of the export names operators as a reader of the store does
                names = operators_metadata(dict(manifest.operators))
                writer = SnapshotArrowWriter(StateVersionMap.unpack(manifest.state_versions), names)
                filename = f"{quote(request.job, safe='')}-chk-{checkpoint_id}.arrow"
                if checkpoint_id:
                    headers.append(("X-Clink-Checkpoint", str(checkpoint_id)))
            chunks = stream_chunks(writer, table, max(1, core.config.scan_chunk_bytes))
            first = next(chunks, b"")
        except Exception as exc:  # noqa: BLE001 - every failure before the first byte becomes a status line, the server stays up
            status = status_for(exc)
            if status == 500:
                log.exception("export %s failed", what)
            self._refuse(what, started, status, str(exc) if isinstance(exc, ClinkError) else f"internal error: {type(exc).__name__}", exc)
            return
        self.send_response(200)
        self.send_header("Content-Type", ARROW_STREAM_TYPE)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Content-Disposition", f'attachment; filename="{filename}"')
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        deadline = started + EXPORT_MAX_S
        sent = 0
        outcome, detail = "200", ""
        try:
            for chunk in _prepend(first, chunks):
                if time.monotonic() > deadline:
                    outcome, detail = ABORTED, f"cut off after {EXPORT_MAX_S:.0f} s"
                    self.close_connection = True
                    return
                if chunk:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    sent += len(chunk)
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            outcome, detail = ABORTED, "the client went away"
            self.close_connection = True
        except Exception as exc:  # noqa: BLE001 - after the headers the only honest signal is a cut stream (no final chunk)
            log.exception("export %s failed mid-stream", what)
            outcome, detail = ABORTED, f"failed mid-stream: {type(exc).__name__}"
            self.close_connection = True
        finally:
            _finished(self.server.metrics, what, outcome, started, sent, table.num_rows, detail)

    def _not_allowed(self) -> None:
        self._plain(405, f"method {self.command} not allowed; use GET or HEAD")

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = _not_allowed  # noqa: N815


def _finished(
    metrics: PoolMetrics | None, what: str, outcome: str, started: float, nbytes: int = 0, rows: int | None = None, detail: str = ""
) -> None:
    """Count one finished export in /metrics and log it at info: what, status, rows, bytes, seconds, and why when it failed."""
    seconds = time.monotonic() - started
    counted = f", {rows} rows, {nbytes} bytes" if rows is not None else ""
    log.info("export %s -> %s%s in %.3f s%s", what, outcome, counted, seconds, f": {' '.join(detail.split())}" if detail else "")
    if metrics is not None:  # after the log line: whoever sees the count can find the line
        metrics.http_export_finished(outcome, nbytes, seconds)


def _prepend(first: bytes, rest):
    yield first
    yield from rest


@dataclass
class HttpExport:
    """A running HTTP export: ``port``, ``url``, and ``stop()``."""

    server: _ExportServer
    thread: threading.Thread
    host: str
    port: int
    tls: bool = False

    @property
    def url(self) -> str:
        """Base URL, e.g. http://127.0.0.1:8080, or https://... when the export serves TLS."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    def serve(self, core: PoolCore) -> None:
        """Start answering exports from ``core`` (an export started without one answers 503 until then)."""
        self.server.core = core

    def stop(self) -> None:
        """Stop accepting, close the socket and join the serving thread."""
        stop_http(self.server, self.thread)


def start_http_export(
    core: PoolCore | None,
    host: str = "127.0.0.1",
    port: int = 0,
    tls=None,
    tokens=None,
    max_exports: int = 4,
    redact=str,
    metrics: PoolMetrics | None = None,
    maintainer: Callable[[], MaintainerStatus | None] | None = None,
    status: StatusPageConfig | None = None,
) -> HttpExport:
    """Serve the export routes and the status page over ``core`` on host:port (0 picks a free port) from a background
    thread; HTTPS with ``tls``.

    Without ``core`` exports and status pages get 503 until ``serve(core)``. Every finished export is logged at info and,
    with ``metrics``, counted in /metrics. ``maintainer`` is called per status request (None: maintenance off).
    """

    def configure(server: _ExportServer) -> None:
        server.core = core
        server.tokens = tokens
        server.exports = threading.BoundedSemaphore(max_exports)
        server.max_exports = max_exports
        server.redact = redact
        server.metrics = metrics
        server.status_config = status or StatusPageConfig()
        server.status_requests = threading.BoundedSemaphore(server.status_config.max_requests)
        if maintainer is not None:
            server.maintainer = maintainer

    server, thread = serve_http(
        host, port, _Handler, tls, name="pool-http-export", server_class=_ExportServer, configure=configure, purpose="the HTTP export"
    )
    export = HttpExport(server, thread, host, server.server_address[1], tls=tls is not None)
    log.info("HTTP export on %s/jobs/JOB/state.arrow, status page on %s/", export.url, export.url)
    return export
