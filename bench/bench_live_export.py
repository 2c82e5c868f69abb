"""Benchmark the live export: the pool's GET ?live=1 over 4 running subtasks vs one pool scan of the same state, in one run."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import snapshot  # noqa: E402
from bench.bench_client import OP, VALUE_BYTES, bench_keys, binary_array  # noqa: E402
from client import RemoteReadBackend  # noqa: E402
from pool.server import PoolServer, PoolServerConfig  # noqa: E402
from store.local import FileStore  # noqa: E402

TARGET_RATIO = 2.0
RANGES = [(0, 31), (32, 63), (64, 95), (96, 127)]


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=600) as response:
        return response.read()


def best_of(repeats: int, run) -> tuple[float, bytes]:
    best, out = float("inf"), b""
    for _ in range(repeats):
        started = time.perf_counter()
        out = run()
        best = min(best, time.perf_counter() - started)
    return best, out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000, help="keys in the state (default 1M)")
    parser.add_argument("--delta-fraction", type=float, default=0.01, help="share of the keys each subtask rewrote since the checkpoint")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of each export (best kept)")
    parser.add_argument("--quick", action="store_true", help="100,000 rows, 2 repeats")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.repeats = 100_000, 2
    with tempfile.TemporaryDirectory(prefix="bench-live-") as folder:
        config = PoolServerConfig(listen="127.0.0.1:0", http_port=0, grace_seconds=0.2)
        server = PoolServer(config, store=FileStore(Path(folder))).start()
        backends = [RemoteReadBackend.connect(server.address, "bench-live", r) for r in RANGES]
        try:
            keys = bench_keys(0, args.rows)
            values = binary_array(np.random.default_rng(1).integers(0, 256, args.rows * VALUE_BYTES, dtype=np.uint8), VALUE_BYTES)
            lead = snapshot.leading_bytes(keys)
            for b, (lo, hi) in zip(backends, RANGES, strict=True):
                mine = pa.array(np.flatnonzero((lead >= lo) & (lead <= hi)))
                b.put_many(OP, keys.take(mine), values.take(mine))
            for b in backends:
                b.snapshot(1)
            for b in backends:
                b.refresh_completion()
            changed = max(1, int(args.rows * args.delta_fraction))
            for b, (lo, hi) in zip(backends, RANGES, strict=True):  # a hot delta in every subtask: rewrites not yet checkpointed
                idx = np.flatnonzero((lead[: changed * 4] >= lo) & (lead[: changed * 4] <= hi))
                b.put_many(OP, keys.take(pa.array(idx)), values.take(pa.array(idx[::-1])))
                b.serve_live_export()
            # the baseline: the same state (checkpoint 1 with every subtask's changes overlaid) in one pool scan
            changes = snapshot.SnapshotArrowWriter(changelog=True).write(pa.concat_tables([b._local_changes() for b in backends]))
            scan_s, scan_blob = best_of(args.repeats, lambda: backends[0].pool.scan_checkpoint("bench-live", 1, delta=changes))
            base = f"http://127.0.0.1:{server.http_port}/jobs/bench-live/state.arrow"
            live_s, live_blob = best_of(args.repeats, lambda: fetch(f"{base}?live=1"))
            got, expected = snapshot.read_snapshot(live_blob).table, snapshot.read_snapshot(scan_blob).table
            assert got.num_rows == expected.num_rows == args.rows, "the live export lost or added rows"
            assert got.sort_by("key_bytes").equals(expected.sort_by("key_bytes")), "the live export differs from the pool's scan"
        finally:
            for b in backends:
                b.close()
            server.stop(0)
    ratio = live_s / scan_s
    result = {
        "rows": args.rows,
        "live_s": round(live_s, 4),
        "pool_scan_s": round(scan_s, 4),
        "ratio": round(ratio, 3),
        "target": TARGET_RATIO,
        "met": ratio <= TARGET_RATIO,
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"state: {args.rows:,} keys in 4 subtasks, each with {args.delta_fraction:.0%} of its keys rewritten since checkpoint 1")
        print(f"one pool scan of checkpoint 1 with every change overlaid (ScanCheckpoint): {scan_s * 1000:.0f} ms")
        print(f"live export of the 4 subtasks (GET ?live=1):                              {live_s * 1000:.0f} ms")
        print(f"live / pool scan: {ratio:.2f}x (target at most {TARGET_RATIO:g}x) {'met' if ratio <= TARGET_RATIO else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
