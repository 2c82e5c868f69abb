"""Prometheus metrics of one pool server: requests, latency, bytes in and out, cache and store counters, its own maintenance."""

from __future__ import annotations

import bisect
import itertools
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

import grpc
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

if TYPE_CHECKING:
    from pool.http_serving import PoolHttpServer

# Latency buckets from 0.5 ms (a cached Get) to 60 s (a large commit or scan).
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

# Counters the pool core exposes (name in its stats mapping -> metric name and help).
CORE_COUNTERS: dict[str, tuple[str, str]] = {
    "cache_hits": ("clink_pool_cache_hits", "Data-file cache hits"),
    "cache_misses": ("clink_pool_cache_misses", "Data-file cache misses"),
    "bytes_read": ("clink_pool_store_read_bytes", "Bytes read from the object store"),
    "bytes_written": ("clink_pool_store_written_bytes", "Bytes written to the object store"),
}

# Levels the server exposes (name in its stats mapping -> metric name and help), read at scrape time like the counters.
CORE_GAUGES: dict[str, tuple[str, str]] = {
    "request_memory_reserved": ("clink_pool_request_memory_bytes", "Working memory reserved by commits and scan overlays in flight"),
    "calls_in_flight": ("clink_pool_calls_in_flight", "RemotePool calls admitted and not yet finished"),
}


class _CoreStatsCollector(Collector):
    """Reads the core's counters at scrape time, so the core needs no Prometheus dependency."""

    def __init__(self, stats: Callable[[], Mapping[str, float]]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        values = self._stats()
        for key, (name, help_text) in CORE_COUNTERS.items():
            if key in values:
                yield CounterMetricFamily(name, help_text, value=float(values[key]))
        for key, (name, help_text) in CORE_GAUGES.items():
            if key in values:
                yield GaugeMetricFamily(name, help_text, value=float(values[key]))


class RpcStats(Collector):
    """Each RPC's count, latency and bytes by method: plain numbers under one lock, made metric families at scrape time.

    A prometheus_client series takes several calls and a lock of its own per update, and every RPC makes four updates; the
    families scraped are the same (names, labels, buckets, _created) as those of a Counter and Histogram would be.
    """

    BOUNDS = (*LATENCY_BUCKETS, float("inf"))

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, grpc.StatusCode], list[float]] = {}  # [count, created]
        self._latency: dict[str, list[float]] = {}  # [a count per bucket..., sum, created]
        self._received: dict[str, list[float]] = {}  # [bytes, created]
        self._sent: dict[str, list[float]] = {}

    def observe(self, method: str, code: grpc.StatusCode, seconds: float) -> None:
        """Record one finished RPC."""
        bucket = bisect.bisect_left(self.BOUNDS, seconds)  # the first bound >= seconds, as Histogram.observe picks it
        with self._lock:
            requests = self._requests.get((method, code))
            if requests is None:
                requests = self._requests[(method, code)] = [0.0, time.time()]
            requests[0] += 1
            latency = self._latency.get(method)
            if latency is None:
                latency = self._latency[method] = [0.0] * len(self.BOUNDS) + [0.0, time.time()]
            latency[bucket] += 1
            latency[-2] += seconds

    def _add(self, totals: dict[str, list[float]], method: str, nbytes: int) -> None:
        with self._lock:
            total = totals.get(method)
            if total is None:
                total = totals[method] = [0.0, time.time()]
            total[0] += nbytes

    def received(self, method: str, nbytes: int) -> None:
        """Record one request message of ``nbytes`` serialized bytes."""
        self._add(self._received, method, nbytes)

    def sent(self, method: str, nbytes: int) -> None:
        """Record one response message of ``nbytes`` serialized bytes."""
        self._add(self._sent, method, nbytes)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            requests = [(key, list(v)) for key, v in self._requests.items()]
            latency = [(method, list(v)) for method, v in self._latency.items()]
            received = [(method, list(v)) for method, v in self._received.items()]
            sent = [(method, list(v)) for method, v in self._sent.items()]
        family = CounterMetricFamily("clink_pool_requests", "Finished RPCs by method and status code", labels=["method", "code"])
        for (method, code), (count, created) in requests:
            family.add_metric([method, code.name], count, created=created)
        yield family
        histogram = HistogramMetricFamily("clink_pool_request_seconds", "RPC latency by method", labels=["method"])
        for method, values in latency:
            counts = itertools.accumulate(values[: len(self.BOUNDS)])
            histogram.add_metric([method], [(floatToGoString(b), c) for b, c in zip(self.BOUNDS, counts, strict=True)], values[-2])
            histogram.add_sample("clink_pool_request_seconds_created", {"method": method}, values[-1])
        yield histogram
        for name, help_text, totals in (
            ("clink_pool_received_bytes", "Serialized request bytes by method", received),
            ("clink_pool_sent_bytes", "Serialized response bytes by method", sent),
        ):
            family = CounterMetricFamily(name, help_text, labels=["method"])
            for method, (nbytes, created) in totals:
                family.add_metric([method], nbytes, created=created)
            yield family


# Maintenance task durations: from a GC of a small job (10 ms) to a compaction of a large checkpoint (30 min).
MAINTENANCE_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0)


class MaintenanceMetrics:
    """The pool's own maintenance (pool/maintenance.py): runs, what they freed and folded, durations, errors, leases held."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.runs = Counter(
            "clink_pool_maintenance_runs",
            "Maintenance task runs by task and outcome (ok, error, skipped)",
            ["task", "outcome"],
            registry=registry,
        )
        self.errors = Counter(
            "clink_pool_maintenance_errors",
            "Maintenance task runs that failed, by task ('round': listing the jobs)",
            ["task"],
            registry=registry,
        )
        self.reclaimed = Counter(
            "clink_pool_maintenance_reclaimed_bytes", "Bytes of data files maintenance GC deleted", ["task"], registry=registry
        )
        self.folded = Counter(
            "clink_pool_maintenance_layers_folded", "Layers maintenance compaction folded into bases", ["task"], registry=registry
        )
        self.deleted = Counter(
            "clink_pool_maintenance_checkpoints_deleted", "Checkpoints maintenance retention deleted", ["task"], registry=registry
        )
        self.seconds = Histogram(
            "clink_pool_maintenance_seconds", "Maintenance task duration by task", ["task"], buckets=MAINTENANCE_BUCKETS, registry=registry
        )
        self.leases = Gauge("clink_pool_maintenance_leases_held", "Jobs whose maintenance lease this pool holds", registry=registry)

    def task_finished(
        self, task: str, outcome: str, seconds: float, bytes_reclaimed: int, layers_folded: int, checkpoints_deleted: int
    ) -> None:
        """Record one finished task run."""
        self.runs.labels(task, outcome).inc()
        if outcome == "error":
            self.errors.labels(task).inc()
        if outcome != "skipped":
            self.seconds.labels(task).observe(seconds)
        self.reclaimed.labels(task).inc(bytes_reclaimed)
        self.folded.labels(task).inc(layers_folded)
        self.deleted.labels(task).inc(checkpoints_deleted)

    def round_failed(self) -> None:
        """Record a round that could not list the jobs."""
        self.errors.labels("round").inc()

    def watch_leases(self, held: Callable[[], int]) -> None:
        """Read the number of leases held at scrape time."""
        self.leases.set_function(lambda: float(held()))


class PoolMetrics:
    """One registry per server (tests run several servers in one process); implements the interceptor's RpcObserver."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        # requests, latency and bytes of every RPC (the interceptor's observer): the hot path, so not prometheus_client series
        self.rpcs = RpcStats()
        self.registry.register(self.rpcs)
        self.http_exports = Counter(
            "clink_pool_http_exports",
            "Finished HTTP state exports by HTTP status ('aborted': cut after the headers went out)",
            ["code"],
            registry=self.registry,
        )
        self.http_export_bytes = Counter(
            "clink_pool_http_export_bytes", "Arrow stream bytes sent by HTTP state exports", registry=self.registry
        )
        self.http_export_latency = Histogram(
            "clink_pool_http_export_seconds",
            "HTTP state export duration, refusals included",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.maintenance = MaintenanceMetrics(self.registry)
        self._http: PoolHttpServer | None = None
        self._http_thread: threading.Thread | None = None
        self.http_port: int | None = None

    def observe(self, method: str, code: grpc.StatusCode, seconds: float) -> None:
        """Record one finished RPC (the server hands the interceptor ``rpcs`` itself: a call less per RPC)."""
        self.rpcs.observe(method, code, seconds)

    def received(self, method: str, nbytes: int) -> None:
        """Record one request message as received on the wire."""
        self.rpcs.received(method, nbytes)

    def sent(self, method: str, nbytes: int) -> None:
        """Record one response message as sent on the wire."""
        self.rpcs.sent(method, nbytes)

    def http_export_finished(self, code: str, nbytes: int, seconds: float) -> None:
        """Record one finished HTTP state export: its status (or 'aborted'), the stream bytes sent, its duration."""
        self.http_exports.labels(code).inc()
        self.http_export_bytes.inc(nbytes)
        self.http_export_latency.observe(seconds)

    def watch_core(self, stats: Callable[[], Mapping[str, float]]) -> None:
        """Export the core's cache and store counters, read at scrape time."""
        self.registry.register(_CoreStatsCollector(stats))

    def render(self) -> bytes:
        """The exposition text, as the HTTP endpoint serves it."""
        return generate_latest(self.registry)

    def serve_http(self, host: str, port: int, tls=None) -> int:
        """Start the /metrics HTTP endpoint (HTTPS with a pool.auth.TlsConfig); returns the bound port (port 0 picks a free one)."""
        from pool.http_serving import PoolRequestHandler, serve_http

        registry = self.registry

        class Handler(PoolRequestHandler):  # the TLS handshake runs in this connection's thread, under its deadlines
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's signature
                pass

            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                found = self.path.split("?", 1)[0] in ("/", "/metrics")
                body = generate_latest(registry) if found else b"not found\n"
                self.send_response(200 if found else 404)
                self.send_header("Content-Type", CONTENT_TYPE_LATEST)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        server, thread = serve_http(host, port, Handler, tls, name="pool-metrics", purpose="metrics")
        self._http, self._http_thread = server, thread
        self.http_port = server.server_address[1]
        return self.http_port

    def close(self) -> None:
        """Stop the HTTP endpoint if it runs."""
        if self._http is not None and self._http_thread is not None:
            from pool.http_serving import stop_http

            stop_http(self._http, self._http_thread)
            self._http = None
