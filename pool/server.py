"""The RemotePool gRPC server: servicer, health, reflection, status interceptor and metrics around one PoolCore."""

from __future__ import annotations

import logging
import signal
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from pool.admission import Admission, AdmissionConfig, LaneExecutor
from pool.auth import OPEN_METHODS, AuthInterceptor, TlsConfig, TokenTable
from pool.core import PoolCore
from pool.domain import PoolConfig
from pool.errors import store_redactor
from pool.interceptor import StatusInterceptor
from pool.lifecycle import LifecycleConfig
from pool.metrics import PoolMetrics
from pool.servicer import SERVICE_NAME, RemotePoolServicer, add_to_server
from snapshot.errors import InvalidArgumentError, UnavailableError
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
    # the lifecycle RPCs' thresholds (GC minimum age, compaction, retention)
    lifecycle: LifecycleConfig = field(default_factory=LifecycleConfig)


def grpc_options(max_message_bytes: int, max_request_bytes: int | None = None) -> list[tuple[str, int]]:
    """Channel/server options: messages sent up to max_message_bytes, received up to max_request_bytes (default: the same)."""
    received = max_message_bytes if max_request_bytes is None else min(max_message_bytes, max_request_bytes)
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", received),
    ]


class PoolServer:
    """A running RemotePool: ``start()``, then ``port``; ``stop(grace)`` drains in-flight calls."""

    def __init__(self, config: PoolServerConfig, store: ObjectStore | None = None) -> None:
        if config.max_workers < 1:
            raise InvalidArgumentError(f"max_workers must be at least 1, got {config.max_workers}")
        if config.max_message_bytes < 1 << 20:
            raise InvalidArgumentError(f"max_message_bytes must be at least 1 MiB (chunks are ~1 MiB), got {config.max_message_bytes}")
        self.config = config
        store = store if store is not None else open_store(config.store_uri, config.store)
        self.store = RetryingStore(store, config.store_retry) if config.store_retry is not None else store
        self.core = PoolCore(self.store, config.pool)
        self.metrics = PoolMetrics()
        self.metrics.watch_core(self._core_stats)
        self.health = health.HealthServicer(experimental_non_blocking=True)
        self.admission = Admission(config.admission)
        self._executor: LaneExecutor | None = None
        self._server: grpc.Server | None = None
        self._stopped = threading.Event()
        self._done = threading.Event()
        self.port: int | None = None
        self.http_export: HttpExport | None = None

    def _core_stats(self) -> dict[str, float]:
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
        """Bind, register the services and start serving; UnavailableError if the address cannot be bound."""
        # the token and the limits are checked on grpc's serving thread, before a call is queued or its request decoded
        auth = AuthInterceptor(self.config.tokens) if self.config.tokens else None
        status = StatusInterceptor(
            self.metrics,
            admit=auth.authenticate if auth else None,
            admission=self.admission,
            open_methods=OPEN_METHODS,
            redact=store_redactor(self.store.uri),
        )
        self._executor = LaneExecutor(self.config.max_workers, self.config.admission)
        server = grpc.server(
            self._executor,
            interceptors=[status, auth] if auth else [status],
            options=grpc_options(self.config.max_message_bytes, self.config.max_request_bytes)
            + ([("grpc.max_concurrent_streams", self.config.max_concurrent_streams)] if self.config.max_concurrent_streams else []),
        )
        add_to_server(RemotePoolServicer(self.core, lifecycle_config=self.config.lifecycle), server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME), server
        )
        try:
            tls = self.config.tls
            port = (
                server.add_secure_port(self.config.listen, tls.grpc_credentials()) if tls else server.add_insecure_port(self.config.listen)
            )
        except RuntimeError as exc:
            raise UnavailableError(f"cannot listen on {self.config.listen}: {exc}") from exc
        if not port:
            raise UnavailableError(f"cannot listen on {self.config.listen} (address in use or not local)")
        self.port = port
        if self.config.metrics_port is not None:
            try:
                self.metrics.serve_http(self.config.metrics_host, self.config.metrics_port, tls=self.config.tls)
            except OSError as exc:
                raise UnavailableError(f"cannot serve metrics on {self.config.metrics_host}:{self.config.metrics_port}: {exc}") from exc
        if self.config.http_port is not None:
            from pool.http_export import start_http_export

            self.http_export = start_http_export(
                self.core,
                self.config.metrics_host,
                self.config.http_port,
                tls=self.config.tls,
                tokens=self.config.tokens,
                max_exports=self.config.max_http_exports,
                redact=store_redactor(self.store.uri),
            )
        server.start()
        self._server = server
        self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        self.health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
        metrics = f", metrics on http://{self.config.metrics_host}:{self.metrics_port}/metrics" if self.metrics_port else ""
        log.info("RemotePool serving on %s (store %s%s)", self.address, self.store.uri, metrics)
        return self

    def stop(self, grace: float | None = None) -> None:
        """Report NOT_SERVING, refuse new calls, let in-flight ones finish for ``grace`` seconds, then close."""
        if self._server is None or self._stopped.is_set():
            return
        self._stopped.set()
        grace = self.config.grace_seconds if grace is None else grace
        log.info("RemotePool on %s stopping (grace %.1fs)", self.address, grace)
        self.health.enter_graceful_shutdown()
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
