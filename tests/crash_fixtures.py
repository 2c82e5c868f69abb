"""Helpers for the crash tests: a pool in a killable subprocess, deterministic deltas, orphan accounting, and a worker process.

Run as ``python -m tests.crash_fixtures worker ADDRESS JOB ROWS`` to start a worker that checkpoints once, then prints
``streaming`` and checkpoints a large delta (the test kills or pauses it there).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa

import snapshot
from store.manifest import job_prefix, parse_manifest
from store.objects import ObjectStore

REPO = Path(__file__).resolve().parents[1]
OP = snapshot.operator_id("crash-op")
Model = dict[bytes, bytes]


class PoolProcess:
    """`python -m clink.cli.pool serve` on a store URI, killable with SIGKILL."""

    def __init__(self, store_uri: str, extra: tuple[str, ...] = (), env: dict[str, str] | None = None) -> None:
        cmd = [
            sys.executable,
            "-m",
            "clink.cli.pool",
            "serve",
            "--store",
            store_uri,
            "--listen",
            "127.0.0.1:0",
            "--output",
            "json",
            "--log-level",
            "warning",
            "--grace",
            "0",
            # the crash runs read back every acknowledged checkpoint: retention by the pool itself would remove them
            "--maintenance",
            "off",
            *extra,
        ]
        self.proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
        line = self.proc.stdout.readline()
        if not line:
            self.proc.kill()
            raise RuntimeError(f"pool did not start: exit {self.proc.wait(10)}")
        self.address = json.loads(line)["address"]

    def kill9(self) -> None:
        """SIGKILL: no shutdown hooks, no flushing, no goodbye."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


def delta_rows(cid: int, half: int, n: int) -> list[tuple[int, int, bytes, bytes]]:
    """Deterministic changelog rows of checkpoint cid for one half (key groups 0-63 or 64-127): puts and some erases."""
    rows = []
    for i in range(n):
        user = f"u{(cid * 7919 + i * 104729) % (n * 4)}-{half}".encode()
        kg = snapshot.key_group(user)
        if (kg < 64) != (half == 0):
            continue
        key = snapshot.encode_keyed_key("v", user)
        if i % 11 == 0 and cid > 1:
            rows.append((snapshot.ROW_ERASE, OP, key, b""))
        else:
            rows.append((snapshot.ROW_PUT, OP, key, f"c{cid}-i{i}".encode() * 4))
    return rows


def changelog(rows: list[tuple[int, int, bytes, bytes]]) -> bytes:
    """A changelog stream of the rows."""
    table = pa.table(
        {
            "row_kind": pa.array([r[0] for r in rows], pa.uint8()),
            "op_id": pa.array([r[1] for r in rows], pa.uint64()),
            "key_bytes": pa.array([r[2] for r in rows], pa.binary()),
            "value_bytes": pa.array([r[3] for r in rows], pa.binary()),
        }
    )
    return snapshot.write_snapshot(table, changelog=True)


def apply(model: Model, rows: list[tuple[int, int, bytes, bytes]]) -> Model:
    """The model after the rows (a copy)."""
    out = dict(model)
    for kind, _op, key, value in rows:
        if kind == snapshot.ROW_ERASE:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def scan_model(blob: bytes) -> Model:
    """A scanned canonical stream as {key: value} (op ids are all OP)."""
    table = snapshot.read_snapshot(blob).table
    return dict(zip(table.column("key_bytes").to_pylist(), table.column("value_bytes").to_pylist(), strict=True))


def orphans(store: ObjectStore, job: str) -> tuple[set[str], set[str]]:
    """(data files no complete manifest names, data files complete manifests name) under the job's prefix."""
    prefix = job_prefix(job)
    data = {o.key[len(prefix) :] for o in store.list(prefix + "data/")}
    referenced: set[str] = set()
    for o in store.list(prefix):
        if o.key.endswith("/_metadata"):
            referenced |= {f.path for f in parse_manifest(store.get(o.key), o.key).files}
    return data - referenced, referenced


def worker(address: str, job: str, rows: int) -> int:
    """Checkpoint 1 small, then a large checkpoint 2 (killed or paused by the test while it streams)."""
    from client import RemoteReadBackend
    from client.backend import BackendConfig
    from client.errors import FencedError
    from client.pool_client import RetryPolicy

    config = BackendConfig(retry=RetryPolicy(max_attempts=1), commit_chunk_bytes=64 << 10)
    backend = RemoteReadBackend.connect(address, job, config=config)
    for i in range(100):
        backend.put(OP, snapshot.encode_keyed_key("v", f"first-{i}".encode()), f"one-{i}".encode())
    backend.snapshot(1)
    for i in range(rows):
        backend.put(OP, snapshot.encode_keyed_key("v", f"second-{i}".encode()), os.urandom(64))
    print("streaming", flush=True)
    try:
        backend.snapshot(2)
    except FencedError as exc:
        print(f"fenced: {exc}", flush=True)
        return 3
    print("committed", flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "worker":
        sys.exit(worker(sys.argv[2], sys.argv[3], int(sys.argv[4])))
    sys.exit("usage: python -m tests.crash_fixtures worker ADDRESS JOB ROWS")
