"""Helpers of the operating-tier review (issue 18): pools on loopback, raw HTTP requests, a store that fails like S3 does."""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable
from typing import Any

import snapshot
from client.pool_client import PoolClient
from snapshot.errors import UnavailableError
from store.memory import MemoryStore
from tests.call_store import CallStore
from tests.pool_server_fixtures import changelog_bytes, keyed_keys_in

OP = snapshot.operator_id("counter")
SECRET_URI = "s3://secret-bucket-7f3a/tenant-prefix"  # where a store lives: the operator's, never a reader's


def commit(client: PoolClient, job: str, cid: int, epoch: int, kg: tuple[int, int] = (0, 127), seed: int = 0) -> None:
    """Commit checkpoint ``cid`` of ``job`` (parent cid-1) over ``kg`` with a few puts."""
    keys = keyed_keys_in(kg[0], kg[1], 5, seed * 1000 + cid)
    client.commit_checkpoint(job, cid, cid - 1, kg, epoch, changelog_bytes([(snapshot.ROW_PUT, OP, k, b"v%d" % cid) for k in keys]))


def build(client: PoolClient, job: str, checkpoints: int) -> int:
    """``checkpoints`` complete checkpoints of ``job`` by one writer over every key group; the writer's epoch."""
    lease = client.acquire_writer(job, (0, 127))
    for cid in range(1, checkpoints + 1):
        commit(client, job, cid, lease.epoch)
    return lease.epoch


def http_get(port: int, path: str, token: str | None = None, method: str = "GET", timeout: float = 30) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one request on a fresh connection; http.client errors propagate (a dropped connection)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, headers={"Authorization": f"Bearer {token}"} if token else {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def api(port: int, path: str, token: str | None = None) -> Any:
    """The JSON of a 200 /api answer."""
    status, _, body = http_get(port, path, token)
    assert status == 200, (path, status, body[:300])
    return json.loads(body)


class S3LikeStore(CallStore):
    """A MemoryStore that says it is ``SECRET_URI`` and fails chosen calls as store/s3.py does: naming the store's URI."""

    def __init__(self, fail: Callable[[str, str], bool] | None = None) -> None:
        self.inner = MemoryStore()
        self.uri = SECRET_URI
        self.counters = self.inner.counters
        self.coalesce_gap_bytes = self.inner.coalesce_gap_bytes
        self.fail = fail or (lambda op, key: False)

    def _call(self, op: str, key: str, fn: Callable[[], object]):
        if self.fail(op, key):
            raise UnavailableError(f"{self.uri} failed on {op} {key}: An error occurred (InternalError): We encountered an internal error")
        return fn()
