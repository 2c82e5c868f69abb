"""Benchmark RemoteReadBackend: restore-to-first-read at 1x vs 10x state, and get_many vs single gets, in one run."""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import snapshot  # noqa: E402
from client import BackendConfig, PoolClient, RemoteReadBackend  # noqa: E402
from pool.server import PoolServer, PoolServerConfig  # noqa: E402
from store.local import FileStore  # noqa: E402

OP = snapshot.operator_id("bench-operator")
VALUE_BYTES = 32
TARGET_RESTORE_RATIO = 1.5


def binary_array(data: np.ndarray, width: int) -> pa.Array:
    """A BinaryArray of equal-width values cut from one uint8 buffer (no per-row Python)."""
    n = data.size // width
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def bench_keys(start: int, count: int) -> pa.Array:
    """Keyed keys [kg]v|[8-byte index], key group = index mod 128 (the pool routes by the leading byte)."""
    idx = np.arange(start, start + count, dtype="<u8")
    raw = np.empty((count, 11), dtype=np.uint8)
    raw[:, 0] = (idx % 128).astype(np.uint8)
    raw[:, 1:3] = np.frombuffer(b"v|", dtype=np.uint8)
    raw[:, 3:] = idx.view(np.uint8).reshape(count, 8)
    return binary_array(raw.ravel(), 11)


def key_of(i: int) -> bytes:
    """The key bench_keys gives index i."""
    return bytes([i % 128]) + b"v|" + i.to_bytes(8, "little")


def load_state(address: str, job: str, rows: int) -> None:
    """Commit ``rows`` keys as checkpoint 1 of ``job``, the changelog built column-wise (no per-row Python)."""
    rng = np.random.default_rng(rows)
    table = pa.table(
        {
            "row_kind": pa.array(np.full(rows, snapshot.ROW_PUT, dtype=np.uint8)),
            "op_id": pa.array(np.full(rows, OP, dtype=np.uint64)),
            "key_bytes": bench_keys(0, rows),
            "value_bytes": binary_array(rng.integers(0, 256, rows * VALUE_BYTES, dtype=np.uint8), VALUE_BYTES),
        }
    )
    blob = snapshot.SnapshotArrowWriter(changelog=True).write_buffer(table)
    with PoolClient(address) as pool:
        lease = pool.acquire_writer(job, (0, 127))
        result = pool.commit_checkpoint(job, 1, 0, (0, 127), lease.epoch, memoryview(blob))
        assert result.checkpoint.complete


def restore_to_first_read(store_root: Path, jobs: dict[str, int], trials: int, warm_up: str) -> dict[str, list[tuple[float, float]]]:
    """Seconds of restore() and of the first served read after it, per trial and job, with the given warm-up setting.

    Every trial starts a fresh (cold) pool; the jobs' trials are interleaved so drift hits both alike; one warm-up is dropped.
    """
    times: dict[str, list[tuple[float, float]]] = {job: [] for job in jobs}
    for trial in range(trials + 1):
        for job, rows in jobs.items():
            server = PoolServer(PoolServerConfig(listen="127.0.0.1:0", grace_seconds=0), store=FileStore(store_root)).start()
            try:
                with RemoteReadBackend.connect(server.address, job, (0, 127), BackendConfig(warm_up=warm_up)) as backend:
                    probe = (trial * 7919 + 13) % rows
                    gc.collect()
                    gc.disable()  # a collection inside the timed window would be noise, not restore cost
                    t0 = time.perf_counter()
                    backend.restore()
                    t1 = time.perf_counter()
                    value = backend.get(OP, key_of(probe))
                    t2 = time.perf_counter()
                    gc.enable()
                    assert value is not None and len(value) == VALUE_BYTES
                    if trial:
                        times[job].append((t1 - t0, t2 - t1))
            finally:
                server.stop(0)
    return times


def get_many_vs_gets(address: str, job: str, rows: int, keys: int, repeats: int) -> dict[str, float]:
    """1,000 keys: get_many against single get calls, from the read cache and cold from the pool.

    Warm-up off: this compares the read cache and the pool's point reads (a warm table would answer the cold rounds).
    """
    picks = np.random.default_rng(1).choice(rows, size=keys, replace=False)
    probe = [key_of(int(i)) for i in picks]
    out: dict[str, list[float]] = {"cached get x N": [], "cached get_many": [], "cold get x N": [], "cold get_many": []}
    for _ in range(repeats):
        with RemoteReadBackend.connect(address, job, (0, 127), BackendConfig(warm_up="off")) as singles:
            singles.restore()
            t0 = time.perf_counter()
            a = [singles.get(OP, k) for k in probe]
            out["cold get x N"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            a2 = [singles.get(OP, k) for k in probe]
            out["cached get x N"].append(time.perf_counter() - t0)
        with RemoteReadBackend.connect(address, job, (0, 127), BackendConfig(warm_up="off")) as batched:
            batched.restore()
            t0 = time.perf_counter()
            b = batched.get_many(OP, probe)
            out["cold get_many"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            b2 = batched.get_many(OP, probe)
            out["cached get_many"].append(time.perf_counter() - t0)
            assert batched.cache_stats["hits"] >= keys
        assert a == b == a2 == b2 and all(v is not None for v in a)
    return {k: statistics.median(v) for k, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=100_000, help="rows of the 1x state (the 10x state has ten times as many)")
    parser.add_argument("--keys", type=int, default=1_000, help="keys per get_many / single-get round")
    parser.add_argument("--trials", type=int, default=15, help="restores per state size (median reported)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="clink-bench-client-") as tmp:
        root = Path(tmp) / "pool-data"
        server = PoolServer(PoolServerConfig(listen="127.0.0.1:0", grace_seconds=0), store=FileStore(root)).start()
        try:
            t0 = time.perf_counter()
            load_state(server.address, "state-1x", args.rows)
            load_state(server.address, "state-10x", args.rows * 10)
            print(f"loaded {args.rows:,} and {args.rows * 10:,} rows ({VALUE_BYTES} B values) in {time.perf_counter() - t0:.1f}s")
            reads = get_many_vs_gets(server.address, "state-1x", args.rows, args.keys, repeats=3)
        finally:
            server.stop(0)
        states = {"state-1x": args.rows, "state-10x": args.rows * 10}
        timed_by_mode = {mode: restore_to_first_read(root, states, args.trials, mode) for mode in ("auto", "off")}

    ratio = 0.0
    for mode, timed in timed_by_mode.items():
        # auto (the default): the first read races the background warm-up, which this in-process pool serves beside it
        print(f"\nrestore -> first served read, warm_up={mode} (fresh cold pool per trial, trials interleaved, {args.trials} trials)")
        ratios = {}
        for stat_name, stat in (("median", statistics.median), ("min", min)):
            total = {job: stat(r + g for r, g in ts) for job, ts in timed.items()}
            parts = {job: (stat(r for r, _ in ts), stat(g for _, g in ts)) for job, ts in timed.items()}
            ratios[stat_name] = total["state-10x"] / total["state-1x"]
            for job, rows in states.items():
                r, g = parts[job]
                print(
                    f"  {stat_name:<6} {job[6:]:>3} state ({rows:>10,} rows): {total[job] * 1000:8.2f} ms  "
                    f"(restore {r * 1000:.2f} + first get {g * 1000:.2f})"
                )
        ratio = max(ratio, ratios["median"])
        verdict = "OK" if ratios["median"] <= TARGET_RESTORE_RATIO else "OVER TARGET"
        print(
            f"  ratio 10x/1x: {ratios['median']:.2f} by median, {ratios['min']:.2f} by min  (target <= {TARGET_RESTORE_RATIO})  {verdict}"
        )

    print(f"\nreads of {args.keys:,} keys (median of 3)")
    for name in ("cached get x N", "cached get_many", "cold get x N", "cold get_many"):
        print(f"  {name:<16} {reads[name] * 1000:9.2f} ms  ({args.keys / reads[name]:>12,.0f} keys/s)")
    print(f"  cached: {args.keys:,} single gets / one get_many = {reads['cached get x N'] / reads['cached get_many']:.2f}x")
    print(
        f"  cold:   {args.keys:,} single gets / one get_many = {reads['cold get x N'] / reads['cold get_many']:.2f}x (one MultiGet vs {args.keys:,} Get RPCs)"
    )
    return 0 if ratio <= TARGET_RESTORE_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
