"""The RemotePool gRPC server: servicer, health, reflection, status interceptor and metrics around one PoolCore."""

from __future__ import annotations

import errno
import ipaddress
import json
import logging
import re
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from pool.admission import Admission, AdmissionConfig, LaneExecutor
from pool.auth import OPEN_METHODS, AuthInterceptor, TlsConfig, TokenTable
from pool.core import PoolCore
from pool.domain import PoolConfig
from pool.errors import store_redactor
from pool.health import PoolHealth
from pool.http_serving import bind_problem
from pool.interceptor import StatusInterceptor
from pool.job_policy import JobPolicy
from pool.lifecycle import Lifecycle, LifecycleConfig
from pool.maintenance import Maintainer, MaintenanceConfig
from pool.metrics import PoolMetrics
from pool.servicer import SERVICE_NAME, RemotePoolServicer, add_to_server
from snapshot.errors import (
    ClinkError,
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    UnauthenticatedError,
    UnavailableError,
)
from store.layout import STORE_MARKER, STORE_MARKER_FORMAT, holds_a_store
from store.objects import ObjectStore, StoreConfig, open_store
from store.retry import RetryingStore, StoreRetryConfig

if TYPE_CHECKING:
    from pool.http_export import HttpExport

log = logging.getLogger("clink.pool")

# 64 MiB each way: a CommitChunk or ScanChunk is ~1 MiB, so this leaves room for a large MultiGet
# (1,000 values of up to ~60 KiB) or an overlay delta in one ScanCheckpoint request, while still
# bounding what one message can make the server allocate.
DEFAULT_MAX_MESSAGE_BYTES = 64 << 20
# 16 MiB in: a CommitChunk is ~1 MiB and clients split MultiGets (50,000 keys, 4 MiB) and large scan overlays, so no honest
# request comes near it, while a caller cannot make the pool buffer more than this per call before it is refused
DEFAULT_MAX_REQUEST_BYTES = 16 << 20


@dataclass(frozen=True)
class PoolServerConfig:
    """Everything a pool server needs; the CLI builds it from flags and environment, tests build it directly."""

    store_uri: str = "file://./pool-data"
    listen: str = "127.0.0.1:7420"
    # None: no metrics endpoint; 0: a free port (see PoolServer.metrics_port).
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    # None: no HTTP export; 0: a free port (see PoolServer.http_port). Serves GET /jobs/JOB/state.arrow on metrics_host.
    http_port: int | None = None
    max_http_exports: int = 4  # exports streamed at once; more get 503
    max_workers: int = 16
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    # the largest request message taken (grpc buffers a whole message before any handler can refuse it)
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    grace_seconds: float = 5.0
    store: StoreConfig = field(default_factory=StoreConfig)
    pool: PoolConfig = field(default_factory=PoolConfig)
    # None: store calls are not retried; by default transient store errors on safe calls are retried with backoff
    store_retry: StoreRetryConfig | None = field(default_factory=StoreRetryConfig)
    # access control (pool/auth.py): TLS on the gRPC and HTTP ports, bearer tokens scoped to jobs; None: off
    tls: TlsConfig | None = None
    tokens: TokenTable | None = None
    # calls admitted at once (in all, per token), idle and overall deadlines of every call (pool/admission.py)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    # None: grpc's default (HTTP/2 streams per connection)
    max_concurrent_streams: int | None = None
    # each stream's fixed HTTP/2 receive window: what grpc takes in for a call nobody reads (a refused one) is at most this;
    # grpc's default, a window grown by bandwidth probes, let 100 refused 4 MiB calls on one connection hold ~240 MB
    stream_window_bytes: int = 1 << 20
    # the lifecycle RPCs' thresholds (GC minimum age, compaction, retention)
    lifecycle: LifecycleConfig = field(default_factory=LifecycleConfig)
    # the address the HTTP export binds to (the metrics endpoint binds to metrics_host)
    http_host: str = "127.0.0.1"
    # create the S3 bucket at start when it does not exist (an S3 store only)
    create_bucket: bool = False
    # list the store once at start, so a missing bucket or refused credentials stop the server before it serves
    check_store: bool = True
    # the pool's own maintenance (pool/maintenance.py): compaction, retention and GC per job under a lease; None: off
    maintenance: MaintenanceConfig | None = None


_HOST_PORT = re.compile(r"^(?:\[(?P<ipv6>[^\]]*)\]|(?P<host>[^:\[\]]+)):(?P<port>[0-9]+)$")
_HOST_NAME = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_.])?$")


def parse_listen(address: str) -> tuple[str, int]:
    """(host, port) of a HOST:PORT address (an IPv6 host in brackets, port 0..65535, 0: a free one); InvalidArgumentError naming it."""
    m = _HOST_PORT.match(address or "")
    if m is None:
        scheme, sep, rest = (address or "").partition("://")
        if sep and scheme:
            bare = rest.split("/", 1)[0] or "127.0.0.1:7420"
            raise InvalidArgumentError(f"{address!r}: a listen address takes no scheme ({scheme}://); write HOST:PORT, e.g. {bare}")
        if address and address.isdigit():
            raise InvalidArgumentError(
                f"{address!r} is a port alone; give HOST:PORT, e.g. 127.0.0.1:{address} (0.0.0.0:{address} for every interface)"
            )
        if address and address.count(":") > 1 and not address.startswith("["):
            raise InvalidArgumentError(f"{address!r}: an IPv6 address goes in brackets, e.g. [::1]:7420")
        if address and ":" not in address:
            raise InvalidArgumentError(f"{address!r} has no port; give HOST:PORT, e.g. {address}:7420")
        raise InvalidArgumentError(f"{address!r} is not HOST:PORT, e.g. 127.0.0.1:7420, [::1]:7420 or 0.0.0.0:7420 for every interface")
    port = int(m.group("port"))
    if port > 65535:
        raise InvalidArgumentError(f"{address!r}: port {port} is outside 0..65535 (0 picks a free one)")
    if m.group("ipv6") is not None:
        try:
            ipaddress.IPv6Address(m.group("ipv6"))
        except ValueError:
            raise InvalidArgumentError(f"{address!r}: {m.group('ipv6')!r} in brackets is not an IPv6 address") from None
        return m.group("ipv6"), port
    host = m.group("host")
    if not _HOST_NAME.match(host):
        raise InvalidArgumentError(f"{address!r}: {host!r} is not a host name or IPv4 address")
    return host, port


# the addresses a host binds to that take every other one's connections too
_WILDCARDS = frozenset({"0.0.0.0", "::", ""})


def _bound_addresses(host: str) -> frozenset[str]:
    """The addresses a listener on ``host`` binds (a name resolved; the name itself when it does not resolve)."""
    try:
        infos = socket.getaddrinfo(host or None, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return frozenset({host.lower()})
    return frozenset(str(info[4][0]) for info in infos)


def port_clashes(config: PoolServerConfig) -> list[tuple[str, str, int]]:
    """Pairs of the server's ports (``listen``, ``metrics_port``, ``http_port``) given one port on overlapping hosts: (a, b, port).

    Port 0 (a free one each) never clashes; hosts overlap when they share an address or either is a wildcard.
    """
    host, port = parse_listen(config.listen)
    ports = [
        ("listen", host, port),
        ("metrics_port", config.metrics_host, config.metrics_port),
        ("http_port", config.http_host, config.http_port),
    ]
    given = [(name, h, p) for name, h, p in ports if p]
    clashes = []
    for i, (a, a_host, a_port) in enumerate(given):
        for b, b_host, b_port in given[i + 1 :]:
            if a_port != b_port:
                continue  # hosts are resolved only for ports given twice
            a_hosts, b_hosts = _bound_addresses(a_host), _bound_addresses(b_host)
            if a_hosts & _WILDCARDS or b_hosts & _WILDCARDS or a_hosts & b_hosts:
                clashes.append((a, b, a_port))
    return clashes


def address_problem(host: str, port: int) -> str | None:
    """Why host:port cannot be listened on ("address already in use", ...), or None when a plain bind succeeds.

    A probe socket takes SO_REUSEADDR (as grpc does) but not SO_REUSEPORT, so a port another process listens on is in use.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"unknown host {host!r} ({exc.strerror})"
    problems: list[str] = []
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(sockaddr)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return bind_problem(exc)
                problems.append(bind_problem(exc))
    # grpc serves on the addresses it can bind: only when none binds is the address unusable
    return problems[0] if len(problems) == len(infos) else None


def probe_store(store: ObjectStore) -> None:
    """List the store's top level once; UnavailableError naming the bucket or the endpoint when it fails.

    A missing bucket, refused credentials or an unreadable directory stop the server before it says it serves; a
    credentials problem stays UnauthenticatedError / PermissionDeniedError (exit 6, as in every command).
    """
    inner = store.inner if isinstance(store, RetryingStore) else store  # one attempt: a retried listing reads every page
    create = getattr(inner, "create", None)
    if callable(create):  # a local store is made by the pool that serves it, so `clink-pool ls` finds it at once
        create()  # its UnavailableError names the directory
    try:
        inner.probe()  # S3: one attempt with StoreConfig.probe_timeout_s, so a silent endpoint stops serve in seconds
    except (UnauthenticatedError, PermissionDeniedError):
        raise  # exit 6 as in every other command, its message naming the store, the endpoint and where credentials come from
    except (ClinkError, OSError) as exc:
        raise UnavailableError(_store_problem(inner, exc)) from exc
    mark_store(inner)


def mark_store(store: ObjectStore) -> None:
    """Write the store marker (store.layout.STORE_MARKER) into a store that holds nothing of a store yet.

    Readers call a prefix or folder that holds no jobs/, savepoints/ or marker "no such store" (a typo); a pool that serves
    a new store marks it, so `clink-pool ls` lists it as empty. A marker it cannot write (read-only credentials) is a warning.
    """
    try:
        if holds_a_store(store):
            return
        body = {"format": STORE_MARKER_FORMAT, "version": 1, "created_at_ms": int(time.time() * 1000), "created_by": "clink-pool serve"}
        store.put_if_absent(STORE_MARKER, json.dumps(body, sort_keys=True).encode())
        log.info("marked %s as a new store (%s)", store.uri, STORE_MARKER)
    except ConflictError:
        pass  # another pool marked it meanwhile
    except ClinkError as exc:
        log.warning(
            "could not write %s into the new store %s (%s); readers call it no such store until a job commits", STORE_MARKER, store.uri, exc
        )


def _store_problem(store: ObjectStore, exc: BaseException) -> str:
    """One line saying why ``store`` cannot be used, naming the directory, or the bucket, the endpoint and the credentials."""
    bucket = getattr(store, "bucket", None)
    if bucket is None:
        reason = f"{exc.strerror}: {exc.filename}" if isinstance(exc, OSError) and exc.filename else str(exc)
        return f"store {store.uri} cannot be read: {reason}"
    config = getattr(store, "config", None) or StoreConfig()
    endpoint = config.endpoint_url or "AWS's default endpoint"
    if isinstance(exc, NotFoundError):
        return f"store {store.uri}: bucket {bucket} does not exist at {endpoint}; create it, or pass --create-bucket"
    return f"store {store.uri}: {exc}" if endpoint in str(exc) else f"store {store.uri} at {endpoint}: {exc}"


def grpc_options(max_message_bytes: int, max_request_bytes: int | None = None) -> list[tuple[str, int]]:
    """Channel/server options: messages sent up to max_message_bytes, received up to max_request_bytes (default: the same)."""
    received = max_message_bytes if max_request_bytes is None else min(max_message_bytes, max_request_bytes)
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", received),
    ]


class PoolServer:
    """A running RemotePool: ``start()``, then ``port``; ``stop(grace)`` drains in-flight calls."""

    def __init__(self, config: PoolServerConfig, store: ObjectStore | None = None, clock: Callable[[], float] = time.time) -> None:
        """``clock``: the maintainer's and its lifecycle's time (tests drive maintenance with one of their own)."""
        if config.max_workers < 1:
            raise InvalidArgumentError(f"max_workers must be at least 1, got {config.max_workers}")
        if config.stream_window_bytes < 64 << 10:
            raise InvalidArgumentError(
                f"stream_window_bytes must be at least 64 KiB (HTTP/2's default window), got {config.stream_window_bytes}"
            )
        if config.max_message_bytes < 1 << 20:
            raise InvalidArgumentError(f"max_message_bytes must be at least 1 MiB (chunks are ~1 MiB), got {config.max_message_bytes}")
        for a, b, port in port_clashes(config):
            raise InvalidArgumentError(f"{a} and {b} both name port {port}: give each its own port (0 picks a free one)")
        if config.maintenance is not None:
            config.maintenance.check_writes(config.lifecycle.max_write_s, config.pool.max_commit_s)
        self.config = config
        self._clock = clock
        # made by start() once the gRPC port is bound (its holder id names the address); None while maintenance is off
        self.maintainer: Maintainer | None = None
        # a store not handed in is opened by start() once the ports are bound: a port in use leaves no store folder behind
        self._store: ObjectStore | None = self._retrying(store) if store is not None else None
        self._core: PoolCore | None = None
        self._store_redactor: Callable[[str], str] = str if self._store is None else store_redactor(self._store.uri)
        self.metrics = PoolMetrics()
        self.metrics.watch_core(self._core_stats)
        self.health = PoolHealth()
        self.admission = Admission(config.admission)
        self._executor: LaneExecutor | None = None
        self._server: grpc.Server | None = None
        self._stopped = threading.Event()
        self._done = threading.Event()
        self.port: int | None = None
        self.http_export: HttpExport | None = None

    def _retrying(self, store: ObjectStore) -> ObjectStore:
        return RetryingStore(store, self.config.store_retry) if self.config.store_retry is not None else store

    @property
    def store(self) -> ObjectStore:
        """The object store: the one handed in, else opened from ``config.store_uri`` (by start(), or here on first use)."""
        if self._store is None:
            self._store = self._retrying(open_store(self.config.store_uri, self.config.store))
            self._store_redactor = store_redactor(self._store.uri)
        return self._store

    def _redact(self, message: str) -> str:
        """``message`` without the store's location (known once the store is open), for clients."""
        return self._store_redactor(message)

    @property
    def core(self) -> PoolCore:
        """The PoolCore over ``store``."""
        if self._core is None:
            self._core = PoolCore(self.store, self.config.pool)
        return self._core

    def _core_stats(self) -> dict[str, float]:
        if self._core is None:  # a scrape before start() opened the store
            return {"calls_in_flight": self.admission.in_flight()}
        stats = getattr(self.core, "stats", None)
        if callable(stats):
            stats = stats()
        if stats is None:
            stats = {}
        if not isinstance(stats, dict):
            stats = {k: getattr(stats, k) for k in dir(stats) if not k.startswith("_") and isinstance(getattr(stats, k), int | float)}
        budget = getattr(self.core, "budget", None)
        extra = {"calls_in_flight": self.admission.in_flight()}
        if budget is not None:
            extra["request_memory_reserved"] = budget.reserved
        return {**stats, **extra}

    @property
    def address(self) -> str:
        """host:port the server listens on (after start)."""
        host = self.config.listen.rsplit(":", 1)[0]
        return f"{host}:{self.port}"

    @property
    def metrics_port(self) -> int | None:
        """The bound metrics HTTP port, None when metrics are off."""
        return self.metrics.http_port

    @property
    def http_port(self) -> int | None:
        """The bound HTTP export port, None when the export is off."""
        return self.http_export.port if self.http_export is not None else None

    def start(self) -> PoolServer:
        """Bind the ports, open and probe the store, then serve; UnavailableError naming the address or the store otherwise.

        The ports are bound before the store is opened, so a port in use leaves no store folder behind; whatever was
        bound is released when a later step fails.
        """
        # the token and the limits are checked on grpc's serving thread, before a call is queued or its request decoded
        auth = AuthInterceptor(self.config.tokens) if self.config.tokens else None
        status = StatusInterceptor(
            self.metrics.rpcs,
            admit=auth.authenticate if auth else None,
            admission=self.admission,
            open_methods=OPEN_METHODS,
            redact=self._redact,
        )
        self._executor = LaneExecutor(self.config.max_workers, self.config.admission)
        server = grpc.server(
            self._executor,
            interceptors=[status, auth] if auth else [status],
            options=grpc_options(self.config.max_message_bytes, self.config.max_request_bytes)
            # without it a second server binds a port another already serves, and clients alternate between the two
            + [("grpc.so_reuseport", 0)]
            + [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", self.config.stream_window_bytes)]
            + ([("grpc.max_concurrent_streams", self.config.max_concurrent_streams)] if self.config.max_concurrent_streams else []),
        )
        try:
            self.port = self._bind(server)
            self.maintainer = self._make_maintainer()
            self._bind_http()
            self._check_store()
            add_to_server(RemotePoolServicer(self.core, lifecycle_config=self.config.lifecycle, pool_policy=self._pool_policy()), server)
            health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
            reflection.enable_server_reflection(
                (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME), server
            )
            if self.http_export is not None:
                self.http_export.serve(self.core)
            server.start()
        except BaseException:
            self._release(server)
            raise
        self._server = server
        if self.maintainer is not None:
            self.maintainer.start()
        self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        self.health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
        metrics = f", metrics on http://{self.config.metrics_host}:{self.metrics_port}/metrics" if self.metrics_port else ""
        log.info("RemotePool serving on %s (store %s%s)", self.address, self.store.uri, metrics)
        return self

    def _pool_policy(self) -> JobPolicy | None:
        """What a job's unset policy settings (and RetainCheckpoints' keep_last 0) fall back to: the maintenance settings (None: the lifecycle's)."""
        m = self.config.maintenance
        return None if m is None else JobPolicy(m.keep_last, m.compact_max_layers, m.compact_max_delta_bytes or None)

    def _make_maintainer(self) -> Maintainer | None:
        """The pool's maintainer (not started) when maintenance is on: its lifecycle shares the core's cache and manifests."""
        config = self.config.maintenance
        if config is None or not config.enabled:
            return None
        lifecycle = Lifecycle(
            self.store, self.config.lifecycle, clock=self._clock, cache=self.core.cache, on_manifest_replaced=self.core.forget_manifest
        )
        holder = f"{uuid.uuid4().hex[:12]}@{self.address}"  # a fresh id per process: a restarted pool waits out its old leases
        return Maintainer(
            self.store,
            lifecycle,
            config,
            holder,
            clock=self._clock,
            metrics=self.metrics.maintenance,
            max_commit_s=self.config.pool.max_commit_s,
        )

    def _bind(self, server: grpc.Server) -> int:
        """Bind the gRPC port; UnavailableError saying why not in one line (before grpc logs its own lines, when it can)."""
        listen = self.config.listen
        host, port = parse_listen(listen)
        problem = address_problem(host, port) if port else None
        if problem is None:
            tls = self.config.tls
            try:
                bound = server.add_secure_port(listen, tls.grpc_credentials()) if tls else server.add_insecure_port(listen)
            except RuntimeError:
                bound = 0
            if bound:
                return bound
            problem = address_problem(host, port) or "grpc could not bind it"
        raise UnavailableError(f"cannot listen on {listen}: {problem}")

    def _bind_http(self) -> None:
        """Serve the metrics endpoint and the HTTP export (the export answers 503 until the store is checked)."""
        if self.config.metrics_port is not None:
            self.metrics.serve_http(self.config.metrics_host, self.config.metrics_port, tls=self.config.tls)
        if self.config.http_port is not None:
            from pool.http_export import start_http_export

            self.http_export = start_http_export(
                None,
                self.config.http_host,
                self.config.http_port,
                tls=self.config.tls,
                tokens=self.config.tokens,
                max_exports=self.config.max_http_exports,
                redact=self._redact,
                metrics=self.metrics,
                maintainer=lambda: self.maintainer,  # resolved per status request: the maintainer starts after binding
            )

    def _check_store(self) -> None:
        """Open the store (a local one creates its directory), create the bucket when asked, and probe it (check_store)."""
        store = self.store
        if self.config.create_bucket:
            inner = store.inner if isinstance(store, RetryingStore) else store
            make = getattr(inner, "create_bucket", None)
            if make is None:
                raise InvalidArgumentError(f"create_bucket needs an s3:// store, not {store.uri}")
            try:
                inner.check_exists()  # one quick attempt first: a silent endpoint is named in seconds, not after every retry
            except NotFoundError:
                make()
        if self.config.check_store:
            probe_store(store)

    def _release(self, server: grpc.Server) -> None:
        """Give back what a failed start() bound: the gRPC port, the metrics and export ports, the workers."""
        if self.port is not None:
            server.start()  # grpc closes a bound listener only when a started server stops (stop(None) refuses every call)
        server.stop(None).wait()
        self.metrics.close()
        if self.http_export is not None:
            self.http_export.stop()
            self.http_export = None
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        self.port = None

    def stop(self, grace: float | None = None) -> None:
        """Report NOT_SERVING, refuse new calls, let in-flight ones finish for ``grace`` seconds, then close."""
        if self._server is None or self._stopped.is_set():
            return
        self._stopped.set()
        grace = self.config.grace_seconds if grace is None else grace
        log.info("RemotePool on %s stopping (grace %.1fs)", self.address, grace)
        self.health.enter_graceful_shutdown()
        if self.maintainer is not None:
            self.maintainer.stop()  # a clean stop gives its leases back, so another pool takes the jobs over at once
        self._server.stop(grace).wait()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        self.metrics.close()
        if self.http_export is not None:
            self.http_export.stop()
        log.info("RemotePool on %s stopped", self.address)
        self._done.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the server has terminated (or ``timeout``); True once it has, including the end of ``stop``."""
        if self._server is None:
            return True
        if self._stopped.is_set():  # stopping: wait for stop() to finish closing metrics and exports too
            return self._done.wait(timeout)
        # grpc returns True when the wait timed out
        if self._server.wait_for_termination(timeout):
            return False
        return self._done.wait(timeout) if self._stopped.is_set() else True

    def __enter__(self) -> PoolServer:
        return self.start() if self._server is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop(0)


def stop_on_signals(server: PoolServer, grace: float | None = None) -> None:
    """Make SIGTERM and SIGINT stop ``server`` gracefully (call from the main thread)."""

    def handle(signum: int, _frame: object) -> None:
        log.info("received %s", signal.Signals(signum).name)
        threading.Thread(target=server.stop, args=(grace,), name="pool-stop", daemon=True).start()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
