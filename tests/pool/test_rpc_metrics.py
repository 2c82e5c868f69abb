"""The RPC metrics (pool.metrics.RpcStats) scrape exactly as prometheus_client's Counter and Histogram would."""

from __future__ import annotations

import re

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from pool.metrics import LATENCY_BUCKETS, PoolMetrics

CALLS = [
    ("Get", grpc.StatusCode.OK, 0.0004, 64, 68),
    ("Get", grpc.StatusCode.OK, 0.0005, 64, 68),  # on a bucket's bound: that bucket, as Histogram counts it
    ("Get", grpc.StatusCode.NOT_FOUND, 0.003, 70, 0),
    ("MultiGet", grpc.StatusCode.OK, 0.02, 22_000, 35_000),
    ("CommitCheckpoint", grpc.StatusCode.OK, 75.0, 1 << 20, 40),  # past the last bound: +Inf only
]


def _without_created(text: str) -> str:
    return re.sub(r"(_created\{[^}]*\}) \S+", r"\1 T", text)


def test_the_scrape_is_what_prometheus_client_series_would_give() -> None:
    metrics = PoolMetrics()
    reference = CollectorRegistry()
    requests = Counter("clink_pool_requests", "Finished RPCs by method and status code", ["method", "code"], registry=reference)
    latency = Histogram("clink_pool_request_seconds", "RPC latency by method", ["method"], buckets=LATENCY_BUCKETS, registry=reference)
    bytes_in = Counter("clink_pool_received_bytes", "Serialized request bytes by method", ["method"], registry=reference)
    bytes_out = Counter("clink_pool_sent_bytes", "Serialized response bytes by method", ["method"], registry=reference)
    for method, code, seconds, received, sent in CALLS:
        metrics.received(method, received)
        metrics.rpcs.sent(method, sent)
        metrics.observe(method, code, seconds)
        bytes_in.labels(method).inc(received)
        bytes_out.labels(method).inc(sent)
        requests.labels(method, code.name).inc()
        latency.labels(method).observe(seconds)
    ours = metrics.render().decode()
    theirs = generate_latest(reference).decode()
    assert _without_created(ours).startswith(_without_created(theirs))  # then the HTTP export and core families follow
    value = metrics.registry.get_sample_value
    assert value("clink_pool_requests_total", {"method": "Get", "code": "OK"}) == 2
    assert value("clink_pool_request_seconds_bucket", {"method": "Get", "le": "0.0005"}) == 2
    assert value("clink_pool_request_seconds_count", {"method": "Get"}) == 3
    assert value("clink_pool_received_bytes_total", {"method": "Get"}) == 198
    assert value("clink_pool_requests_created", {"method": "Get", "code": "OK"}) > 0
