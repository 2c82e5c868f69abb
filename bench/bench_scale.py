"""The pool at scale (issue 14): reads vs cache size, store bytes per cold Get, commit peak memory, store requests per commit, SlateDB."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pyarrow as pa

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import snapshot  # noqa: E402
import store.datafile as datafile  # noqa: E402
from bench.bench_pool import (  # noqa: E402
    MAX_MESSAGE,
    OPERATORS,
    SLOT,
    binary_array,
    changelog,
    commit_chunks,
    keyed_keys,
    make_delta,
    random_values,
)
from bench.bench_pool import VALUE_BYTES as POOL_BENCH_VALUE_BYTES  # noqa: E402
from bench.bench_vs_slatedb import CREDENTIALS, POOL_BUCKET, SLATE_BUCKET, open_slatedb, ours_write, timed  # noqa: E402
from client import BackendConfig, RemoteReadBackend  # noqa: E402
from pool.domain import PoolConfig  # noqa: E402
from pool.server import PoolServer, PoolServerConfig, grpc_options  # noqa: E402
from protos import remote_pool_pb2 as pb  # noqa: E402
from protos import remote_pool_pb2_grpc as pb_grpc  # noqa: E402
from store.objects import ObjectStore, StoreConfig, open_store  # noqa: E402
from store.s3 import S3Store  # noqa: E402

KEY_BYTES, VALUE_BYTES = 40, 32  # as in the issue
assert POOL_BENCH_VALUE_BYTES == VALUE_BYTES, "bench_pool.random_values must give 32-byte values"
OP = OPERATORS[0]  # the read states hold one operator, so get_many(op, keys) asks for every key at once
FULL_RANGE = (0, snapshot.NUM_KEY_GROUPS - 1)
# the block of block-granular reads (store/datafile.py); 32 KiB until that constant lands
BLOCK_BYTES = int(getattr(datafile, "DEFAULT_BLOCK_TARGET_BYTES", 32 << 10))
SIZE_FACTORS = (("0.5x", 0.5), ("2x", 2.0), ("10x", 10.0))  # state bytes / pool cache bytes
READS_JOB = "scale-reads-{}"
SCALE_BUCKET = "bench-scale"
READY_TIMEOUT_S = 60

# (comparison, target) per figure; None: printed only. The names with a count are filled in by kind (see Results.add).
TARGETS: dict[str, tuple[str, float] | None] = {
    "cold gets 10x / 0.5x": ("<=", 2.0),
    "cold gets 2x / 0.5x": ("<=", 2.0),
    "cold get_many 10x / 0.5x": ("<=", 2.0),
    "cold get_many 2x / 0.5x": ("<=", 2.0),
    "steady gets 10x / 0.5x": None,
    "steady gets 2x / 0.5x": None,
    "steady get_many 10x / 0.5x": None,
    "steady get_many 2x / 0.5x": None,
    "store bytes per cold get at 10x, in blocks": ("<=", 4.0),
    "store requests per cold get at 10x": None,
    "commit peak RSS growth / delta bytes": ("<=", 2.0),
    "commit peak RSS growth, random order": None,
    "1% commit / full commit time (moto)": ("<=", 0.02),
    "full checkpoint speedup vs SlateDB write+flush": (">=", 10.0),
    "1% commit / SlateDB 1% write+flush (time)": ("<=", 0.5),
}


# -- state ------------------------------------------------------------------------------------------


def keys40(user_ints: np.ndarray) -> pa.Array:
    """40-byte keyed keys: keyed_keys' 11 bytes ([kg][v|][8-byte user int]) and a 29-byte tail mixed from the int, vectorised.

    The key group is keyed_keys' FNV-1a over the leading 8 user bytes; the pool routes and sorts by the key's bytes alone.
    """
    head = keyed_keys(user_ints)
    head_width = 1 + len(SLOT) + 8
    heads = np.frombuffer(head.buffers()[2], dtype=np.uint8, count=len(head) * head_width).reshape(-1, head_width)
    with np.errstate(over="ignore"):
        mixed = user_ints.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    tail = np.tile(mixed.astype("<u8").view(np.uint8).reshape(-1, 8), (1, 4))[:, : KEY_BYTES - head_width]
    return binary_array(np.concatenate([heads, tail], axis=1).reshape(-1), KEY_BYTES)


def full_state(rows: int, rng: np.random.Generator, ops: np.ndarray | None = None) -> tuple[np.ndarray, pa.Array, pa.Array, bytes]:
    """(user ints, keys, values, the full-state changelog of puts) of ``rows`` distinct keys (one operator unless ``ops``)."""
    user_ints = rng.permutation(rows).astype(np.uint64)
    keys, values = keys40(user_ints), random_values(rng, rows)
    ops = np.full(rows, OP, np.uint64) if ops is None else ops
    return user_ints, keys, values, changelog(np.full(rows, snapshot.ROW_PUT, np.uint8), ops, keys, values)


# -- pools ------------------------------------------------------------------------------------------


class Pool:
    """An in-process PoolServer on 127.0.0.1 over a freshly opened store (new counters, nothing cached) and a raw stub."""

    def __init__(self, uri: str, config: StoreConfig, cache_bytes: int, store: ObjectStore | None = None) -> None:
        self.store = store if store is not None else open_store(uri, config)
        server_config = PoolServerConfig(
            store_uri=uri, listen="127.0.0.1:0", store=config, pool=PoolConfig(cache_bytes=cache_bytes), grace_seconds=0
        )
        self.server = PoolServer(server_config, store=self.store).start()
        self.channel = grpc.insecure_channel(self.server.address, options=grpc_options(MAX_MESSAGE))
        self.stub = pb_grpc.RemotePoolStub(self.channel)

    @property
    def address(self) -> str:
        return self.server.address

    def counters(self) -> dict[str, Any]:
        return self.store.counters.snapshot()

    def close(self) -> None:
        self.channel.close()
        self.server.stop(0)


@contextmanager
def pool(uri: str, config: StoreConfig, cache_bytes: int, store: ObjectStore | None = None) -> Iterator[Pool]:
    p = Pool(uri, config, cache_bytes, store)
    try:
        yield p
    finally:
        p.close()


def acquire(stub: pb_grpc.RemotePoolStub, job: str) -> int:
    return stub.AcquireWriter(pb.AcquireWriterRequest(job=job, key_groups=pb.KeyGroupRange(lo=0, hi=127)), timeout=60).epoch


def commit(stub: pb_grpc.RemotePoolStub, job: str, cid: int, parent: int, epoch: int, delta: bytes) -> tuple[float, Any]:
    """Seconds and the CommitCheckpointResponse of one commit of the whole key-group range (a single writer)."""
    seconds, resp = timed(lambda: stub.CommitCheckpoint(commit_chunks(job, cid, parent, epoch, delta), timeout=1800))
    assert resp.checkpoint.complete, f"checkpoint {cid} of {job} should complete (one writer holds key groups 0..127)"
    return seconds, resp


def reader(address: str, job: str) -> RemoteReadBackend:
    """A worker backend restored at checkpoint 1 whose own caches are off, so every read reaches the pool."""
    config = BackendConfig(warm_up="off", cache_bytes=0, call_deadline_s=600.0)
    backend = RemoteReadBackend.connect(address, job, FULL_RANGE, config)
    backend.restore(1)
    return backend


def request_counts(before: dict[str, Any], after: dict[str, Any]) -> dict[str, int]:
    """Store requests per operation between two counter snapshots, upper-case names (GET, GET_RANGE, PUT, LIST, HEAD, ...)."""
    ops = set(before["requests"]) | set(after["requests"])
    counts = {op.upper(): after["requests"].get(op, 0) - before["requests"].get(op, 0) for op in sorted(ops)}
    return {op: n for op, n in counts.items() if n}


# -- 1 and 2: reads vs cache size -------------------------------------------------------------------


def read_figures(backend: RemoteReadBackend, keys: list[bytes], expected: list[bytes]) -> tuple[float, float]:
    """Seconds of len(keys) single gets, then of one get_many of the same count of other keys (keys is twice as long)."""
    half = len(keys) // 2
    gc.collect()
    t0 = time.perf_counter()
    got = [backend.get(OP, k) for k in keys[:half]]
    t1 = time.perf_counter()
    assert got == expected[:half], "single gets returned other values"
    seconds_many, got = timed(lambda: backend.get_many(OP, keys[half:]))
    assert got == expected[half:], "get_many returned other values"
    return t1 - t0, seconds_many


def reads_vs_cache(root: Path, args: argparse.Namespace, rng: np.random.Generator, say: Callable[[str], None]) -> dict[str, Any]:
    """Per state size (0.5x, 2x, 10x the pool cache): cold gets and get_many on fresh pools, then steady state after a warm-up."""
    cache = args.cache_mb << 20
    uri, config = f"file://{root}/reads", StoreConfig()
    reads = args.reads
    with pool(uri, config, cache) as p:  # bytes per stored row from a trial commit
        _, _, _, trial = full_state(args.trial_rows, rng)
        _, resp = commit(p.stub, "scale-trial", 1, 0, acquire(p.stub, "scale-trial"), trial)
        per_row = resp.checkpoint.total_bytes / args.trial_rows
    say(f"  trial commit of {args.trial_rows:,} rows: {per_row:.1f} stored bytes per row")
    sizes = []
    for label, factor in SIZE_FACTORS:
        rows = max(int(factor * cache / per_row), 4 * reads + 1)
        job = READS_JOB.format(label.replace(".", "_"))
        t0 = time.perf_counter()
        _, keys, values, full = full_state(rows, rng)
        with pool(uri, config, cache) as p:
            commit_s, resp = commit(p.stub, job, 1, 0, acquire(p.stub, job), full)
        stored = resp.checkpoint.total_bytes
        delta_bytes = len(full)
        del full
        pick = rng.choice(rows, 4 * reads, replace=False)  # cold singles, cold get_many, steady singles, steady get_many
        probe = keys.take(pa.array(pick)).to_pylist()
        want = values.take(pa.array(pick)).to_pylist()
        cold_keys, cold_want = probe[: 2 * reads], want[: 2 * reads]
        steady_keys, steady_want = probe[2 * reads :], want[2 * reads :]
        warm = keys.take(pa.array(rng.integers(0, rows, args.warmup))).to_pylist()
        entry: dict[str, Any] = {
            "label": label,
            "factor": factor,
            "rows": rows,
            "stored_bytes": stored,
            "state_over_cache": stored / cache,
            "delta_bytes": delta_bytes,
            "commit_s": commit_s,
        }
        # (a) single gets on a fresh pool: nothing cached
        with pool(uri, config, cache) as p, reader(p.address, job) as backend:
            before = p.counters()
            t1 = time.perf_counter()
            got = [backend.get(OP, k) for k in cold_keys[:reads]]
            entry["cold_gets_s"] = time.perf_counter() - t1
            after = p.counters()
        assert got == cold_want[:reads], f"cold gets at {label} returned other values"
        requests = request_counts(before, after)
        entry["cold_get_store_bytes"] = (after["bytes_read"] - before["bytes_read"]) / reads
        entry["cold_get_store_requests"] = sum(requests.values()) / reads
        entry["cold_get_requests_by_op"] = requests
        # (b) one get_many on another fresh pool, then (c) the steady state on that pool after the warm-up
        with pool(uri, config, cache) as p, reader(p.address, job) as backend:
            before = p.counters()
            gc.collect()
            t1 = time.perf_counter()
            got = backend.get_many(OP, cold_keys[reads:])
            entry["cold_get_many_s"] = time.perf_counter() - t1
            after = p.counters()
            assert got == cold_want[reads:], f"cold get_many at {label} returned other values"
            entry["cold_get_many_store_bytes"] = after["bytes_read"] - before["bytes_read"]
            entry["cold_get_many_requests_by_op"] = request_counts(before, after)
            for k in warm:
                backend.get(OP, k)
            entry["steady_gets_s"], entry["steady_get_many_s"] = read_figures(backend, steady_keys, steady_want)
            entry["cache_after_warm_up_bytes"] = p.server.core.stats()["cache_bytes"]
        sizes.append(entry)
        say(
            f"  {label:>4}: {rows:,} rows, {stored / 1e6:.1f} MB stored ({stored / cache:.2f}x the cache), commit {commit_s * 1e3:.0f} ms; "
            f"cold gets {entry['cold_gets_s'] * 1e3:.0f} ms, cold get_many {entry['cold_get_many_s'] * 1e3:.0f} ms, "
            f"steady {entry['steady_gets_s'] * 1e3:.0f} / {entry['steady_get_many_s'] * 1e3:.0f} ms "
            f"({time.perf_counter() - t0:.1f}s)"
        )
    by = {s["label"]: s for s in sizes}
    ratios = {}
    for what in ("cold_gets_s", "cold_get_many_s", "steady_gets_s", "steady_get_many_s"):
        for big in ("10x", "2x"):
            ratios[f"{what} {big}/0.5x"] = by[big][what] / by["0.5x"][what]
    return {"cache_bytes": cache, "reads": reads, "warmup": args.warmup, "bytes_per_row": per_row, "sizes": sizes, "ratios": ratios}


# -- 3: full-commit peak memory in a fresh pool process --------------------------------------------


def proc_status(pid: int, field: str) -> int:
    """A kB figure of /proc/<pid>/status (VmRSS, VmHWM) in bytes; 0 when missing."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def reset_peak(pid: int) -> bool:
    """Reset the process's VmHWM to its current RSS (clear_refs 5); False when not allowed."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class ServeProcess:
    """`python -m clink.cli.pool serve` on a store, port 0; the ready line (--output json) names the bound address."""

    def __init__(self, store_uri: str, cache_mb: int, delta_bytes: int, log_path: Path) -> None:
        mib = (delta_bytes >> 20) + 1
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
            "--grace",
            "1",
            "--log-level",
            "warning",
            "--cache-mb",
            str(cache_mb),
            "--max-commit-mb",
            str(max(1024, 2 * mib)),
            "--request-memory-mb",
            str(max(1024, 5 * mib)),  # a commit reserves 4x its delta
        ]
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.log_path = log_path
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=dict(os.environ, PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE, stderr=self._log)
        lines: queue.Queue[bytes] = queue.Queue()
        stdout = self.proc.stdout
        assert stdout is not None

        def pump() -> None:
            for line in stdout:
                lines.put(line)

        threading.Thread(target=pump, daemon=True).start()
        try:
            line = lines.get(timeout=READY_TIMEOUT_S)
        except queue.Empty:
            self.stop()
            raise SystemExit(f"clink-pool serve did not get ready in {READY_TIMEOUT_S}s:\n{log_path.read_text()}") from None
        try:
            ready = json.loads(line)
        except ValueError:
            self.stop()
            raise SystemExit(f"clink-pool serve printed {line!r}, not its ready line:\n{log_path.read_text()}") from None
        self.address = ready["address"]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()


def commit_memory(root: Path, args: argparse.Namespace, rng: np.random.Generator, say: Callable[[str], None]) -> list[dict[str, Any]]:
    """Per key count: a fresh `clink-pool serve` process takes one full commit; its peak RSS growth over the delta's bytes."""
    out = []
    _, _, _, warm_up = full_state(1000, rng)
    for n, order in ((n, order) for n in args.memory_keys for order in ("layout", "random")):
        _, _, _, full = full_state(n, rng)
        if order == "layout":  # as RemoteReadBackend sends it: sorted for the data file, so the pool only checks the order
            snap = snapshot.read_snapshot(full)
            full = snapshot.SnapshotArrowWriter(None, changelog=True).write(snapshot.sort_for_layout(snap.table))
            del snap
        gc.collect()
        proc = ServeProcess(f"file://{root}/memory-{n}", args.cache_mb, len(full), root / f"serve-{n}.log")
        channel = grpc.insecure_channel(proc.address, options=grpc_options(MAX_MESSAGE))
        try:
            stub = pb_grpc.RemotePoolStub(channel)
            # connection, serving threads and the commit path's lazily loaded code up before the baseline: a 1,000-row commit
            commit(stub, "scale-memory-warm-up", 1, 0, acquire(stub, "scale-memory-warm-up"), warm_up)
            epoch = acquire(stub, "scale-memory")
            time.sleep(0.2)
            before = proc_status(proc.pid, "VmRSS")
            hwm_reset = reset_peak(proc.pid)
            sampled = [before]
            stop = threading.Event()

            def sample(stop: threading.Event = stop, sampled: list[int] = sampled, pid: int = proc.pid) -> None:
                while not stop.is_set():
                    sampled[0] = max(sampled[0], proc_status(pid, "VmRSS"))
                    time.sleep(0.005)

            thread = threading.Thread(target=sample, daemon=True)
            thread.start()
            try:
                seconds, _ = commit(stub, "scale-memory", 1, 0, epoch, full)
            finally:
                stop.set()
                thread.join()
            peak = max(proc_status(proc.pid, "VmHWM"), sampled[0])  # VmHWM covers peaks between samples
        finally:
            channel.close()
            proc.stop()
        entry = {
            "keys": n,
            "order": order,
            "delta_bytes": len(full),
            "rss_before": before,
            "peak_rss": peak,
            "growth_bytes": peak - before,
            "ratio": (peak - before) / len(full),
            "hwm_reset": hwm_reset,
            "commit_s": seconds,
        }
        out.append(entry)
        say(
            f"  full commit of {n:,} keys ({len(full) / 1e6:.1f} MB delta, {order} order) in a fresh pool process: {seconds:.1f}s, RSS "
            f"{before / 1e6:.0f} MB before, peak {peak / 1e6:.0f} MB: growth {entry['ratio']:.2f}x the delta"
            f"{'' if hwm_reset else ' (VmHWM not reset: the peak may include start-up)'}"
        )
        del full
    return out


# -- 4: store requests per commit on moto -----------------------------------------------------------


def commit_requests(uri: str, config: StoreConfig, args: argparse.Namespace, rng: np.random.Generator) -> dict[str, Any]:
    """A full and a 1% commit of one writer over key groups 0..127 on moto: store requests by operation and time."""
    n = args.moto_keys
    ops = np.array(OPERATORS, dtype=np.uint64)[rng.integers(0, len(OPERATORS), n)]
    user_ints, _, _, full = full_state(n, rng, ops)
    store = open_store(uri, config)
    store.create_bucket()  # type: ignore[attr-defined]
    out: dict[str, Any] = {"keys": n, "full_bytes": len(full)}
    with pool(uri, config, args.cache_mb << 20, store) as p:
        full_times = []
        for attempt in range(2):  # two jobs: the faster full commit counts (the first also warms connections)
            job = f"scale-commit-{attempt}"
            epoch = acquire(p.stub, job)
            before = p.counters()
            seconds, _ = commit(p.stub, job, 1, 0, epoch, full)
            full_times.append(seconds)
            out["full_requests"] = request_counts(before, p.counters())
        job = "scale-commit-0"
        epoch = acquire(p.stub, job)
        delta_times = []
        next_new = n + 1
        for cid in range(2, 5):
            delta = make_delta(user_ints, ops, 0.01, rng, next_new, keys_of=keys40)
            next_new += n
            before = p.counters()
            seconds, _ = commit(p.stub, job, cid, cid - 1, epoch, delta)
            delta_times.append(seconds)
            out["delta_requests"] = request_counts(before, p.counters())
            out["delta_bytes"] = len(delta)
    out["full_s"], out["delta_s"] = min(full_times), min(delta_times)
    out["ratio"] = out["delta_s"] / out["full_s"]
    return out


# -- 5: side by side with SlateDB -------------------------------------------------------------------


async def slatedb_writes(
    slatedb: Any, endpoint: str, keys: list[bytes], values: list[bytes], rewrite_idx: np.ndarray, new_values: list[bytes]
) -> dict[str, float]:
    """As bench_vs_slatedb: every key put (awaited) then a durable flush; then 1% rewritten and flushed."""
    db = await open_slatedb(slatedb, endpoint, "bench-scale-db")
    try:
        gc.collect()
        t0 = time.perf_counter()
        for k, v in zip(keys, values, strict=True):
            await db.put(k, v)
        await db.flush()
        full = time.perf_counter() - t0
        gc.collect()
        t0 = time.perf_counter()
        for i, v in zip(rewrite_idx.tolist(), new_values, strict=True):
            await db.put(keys[i], v)
        await db.flush()
        delta = time.perf_counter() - t0
    finally:
        await db.shutdown()
    return {"full": full, "delta": delta}


def versus_slatedb(endpoint: str, config: StoreConfig, args: argparse.Namespace, rng: np.random.Generator) -> dict[str, Any]:
    """Our full checkpoint and 1% commit (put_many + snapshot) against SlateDB's write + flush of the same rows, one moto server."""
    try:
        import slatedb.uniffi as slatedb  # type: ignore[import-untyped]
    except ImportError as exc:
        return {"ran": False, "reason": f"slatedb is not importable ({exc}); pip install -e '.[bench]'"}
    n = args.slatedb_keys
    _, keys, values, _ = full_state(n, rng)
    rewrite_idx = np.sort(rng.choice(n, max(1, n // 100), replace=False))
    new_values = random_values(rng, len(rewrite_idx))
    S3Store(SLATE_BUCKET, "", config).create_bucket()
    slate = asyncio.run(slatedb_writes(slatedb, endpoint, keys.to_pylist(), values.to_pylist(), rewrite_idx, new_values.to_pylist()))
    uri = f"s3://{POOL_BUCKET}/pool"
    store = open_store(uri, config)
    store.create_bucket()  # type: ignore[attr-defined]
    with pool(uri, config, args.cache_mb << 20, store) as p:
        ours = ours_write(p.address, keys, values, rewrite_idx, new_values)
    return {
        "ran": True,
        "keys": n,
        "rewritten": len(rewrite_idx),
        "slatedb_full_s": slate["full"],
        "slatedb_delta_s": slate["delta"],
        "ours_full_s": ours["full"],
        "ours_full_commit_s": ours["full commit"],
        "ours_delta_s": ours["delta"],
        "full_speedup": slate["full"] / ours["full"],
        "delta_ratio": ours["delta"] / slate["delta"],
    }


# -- the run ----------------------------------------------------------------------------------------


def figure(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cache-mb", type=int, default=16, help="the pool's cache (PoolConfig.cache_bytes) in MiB (default 16)")
    parser.add_argument("--reads", type=int, default=1000, help="keys per read figure: single gets, one get_many (default 1,000)")
    parser.add_argument("--warmup", type=int, default=3000, help="random single gets before the steady-state figures (default 3,000)")
    parser.add_argument("--trial-rows", type=int, default=20_000, help="rows of the trial commit sizing the states (default 20,000)")
    parser.add_argument(
        "--memory-keys", type=int, nargs="+", default=[1_000_000, 5_000_000], help="keys of each full commit measured for peak memory"
    )
    parser.add_argument("--moto-keys", type=int, default=300_000, help="keys of the commits on moto (default 300,000)")
    parser.add_argument("--slatedb-keys", type=int, default=None, help="keys of the SlateDB comparison (default: --moto-keys)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run of every figure in well under a minute")
    parser.add_argument("--output", choices=["text", "json"], default="text", help="json: one JSON document on stdout, progress on stderr")
    args = parser.parse_args(argv)
    if args.quick:
        args.cache_mb, args.reads, args.warmup, args.trial_rows = 1, 100, 200, 5_000
        args.memory_keys, args.moto_keys, args.slatedb_keys = [50_000, 200_000], 10_000, 10_000
    if args.slatedb_keys is None:
        args.slatedb_keys = args.moto_keys
    if args.cache_mb < 1 or args.reads < 1 or args.warmup < 0 or args.trial_rows < 100 or args.moto_keys < 1000 or args.slatedb_keys < 100:
        parser.error("--cache-mb and --reads at least 1, --warmup at least 0, --trial-rows 100, --moto-keys 1,000, --slatedb-keys 100")
    as_json = args.output == "json"

    def say(line: str) -> None:
        print(line, file=sys.stderr if as_json else sys.stdout, flush=True)

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto logs every request otherwise
    rng = np.random.default_rng(42)
    started = time.perf_counter()
    say(
        f"bench_scale: {KEY_BYTES} B keys, {VALUE_BYTES} B values; pool cache {args.cache_mb} MiB, {args.reads:,} keys per read figure, "
        f"block {BLOCK_BYTES >> 10} KiB{' (--quick)' if args.quick else ''}"
    )
    results: dict[str, Any] = {"config": dict(vars(args)), "key_bytes": KEY_BYTES, "value_bytes": VALUE_BYTES}
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        root = Path(tmp)
        say("1. reads vs cache size (fresh in-process pool per cold figure, file store; worker caches off)")
        reads = reads_vs_cache(root, args, rng, say)
        results["reads"] = reads
        big = reads["sizes"][-1]
        results["cold_get_store_reads"] = {
            "at": big["label"],
            "block_bytes": BLOCK_BYTES,
            "bytes_per_get": big["cold_get_store_bytes"],
            "blocks_per_get": big["cold_get_store_bytes"] / BLOCK_BYTES,
            "requests_per_get": big["cold_get_store_requests"],
            "requests_by_op": big["cold_get_requests_by_op"],
        }
        say("3. full-commit peak memory (a fresh `clink-pool serve` process per count, file store)")
        results["commit_memory"] = commit_memory(root, args, rng, say)

    from moto.server import ThreadedMotoServer

    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    try:
        host, port = moto.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        config = StoreConfig(
            endpoint_url=endpoint,
            region=CREDENTIALS["region"],
            access_key_id=CREDENTIALS["access_key_id"],
            secret_access_key=CREDENTIALS["secret_access_key"],
        )
        say(f"4. store requests per commit (moto at {endpoint}, {args.moto_keys:,} keys, one writer over key groups 0..127)")
        t0 = time.perf_counter()
        results["commit_requests"] = commit_requests(f"s3://{SCALE_BUCKET}/pool", config, args, rng)
        say(f"  done in {time.perf_counter() - t0:.1f}s")
        say(f"5. side by side with SlateDB (same moto server, {args.slatedb_keys:,} keys)")
        t0 = time.perf_counter()
        results["slatedb"] = versus_slatedb(endpoint, config, args, rng)
        say(f"  done in {time.perf_counter() - t0:.1f}s" if results["slatedb"]["ran"] else f"  NOT RUN: {results['slatedb']['reason']}")
    finally:
        moto.stop()

    # -- the tables
    cache = reads["cache_bytes"]
    say(f"\nreads vs cache size: pool cache {cache >> 20} MiB; ms for {args.reads:,} single gets / one get_many of {args.reads:,} keys")
    say(
        f"  {'state':<6} {'rows':>10} {'stored MB':>10} {'x cache':>8} {'cold gets':>10} {'cold many':>10} {'steady gets':>12} "
        f"{'steady many':>12} {'B/cold get':>11} {'req/cold get':>13} {'MB/cold many':>13} {'req/cold many':>14}"
    )
    for s in reads["sizes"]:
        say(
            f"  {s['label']:<6} {s['rows']:>10,} {s['stored_bytes'] / 1e6:>10.1f} {s['state_over_cache']:>8.2f} "
            f"{s['cold_gets_s'] * 1e3:>10.1f} {s['cold_get_many_s'] * 1e3:>10.1f} {s['steady_gets_s'] * 1e3:>12.1f} "
            f"{s['steady_get_many_s'] * 1e3:>12.1f} {s['cold_get_store_bytes']:>11,.0f} {s['cold_get_store_requests']:>13.2f} "
            f"{s['cold_get_many_store_bytes'] / 1e6:>13.2f} {sum(s['cold_get_many_requests_by_op'].values()):>14}"
        )
    store_reads = results["cold_get_store_reads"]
    say(
        f"  cold get at {store_reads['at']}: {store_reads['bytes_per_get']:,.0f} B read from the store = "
        f"{store_reads['blocks_per_get']:.1f} blocks of {BLOCK_BYTES >> 10} KiB; {store_reads['requests_per_get']:.2f} store requests "
        f"({', '.join(f'{op} {n}' for op, n in store_reads['requests_by_op'].items()) or 'none'} for {args.reads:,} gets)"
    )
    cr = results["commit_requests"]
    say(
        f"\nstore requests per commit (moto, {cr['keys']:,} keys, {cr['full_bytes'] / 1e6:.1f} MB full delta, {cr['delta_bytes'] / 1e6:.2f} MB 1%)"
    )
    for name, counts, seconds in (("full commit", cr["full_requests"], cr["full_s"]), ("1% commit", cr["delta_requests"], cr["delta_s"])):
        listed = ", ".join(f"{op} {n}" for op, n in counts.items())
        say(f"  {name:<12} {sum(counts.values()):>3} requests ({listed}); {seconds * 1e3:,.0f} ms")
    sd = results["slatedb"]
    if sd["ran"]:
        say(f"\nSlateDB side by side (moto, {sd['keys']:,} keys, {sd['rewritten']:,} rewritten)")
        say(
            f"  full: ours {sd['ours_full_s'] * 1e3:,.0f} ms (put_many + snapshot; commit alone {sd['ours_full_commit_s'] * 1e3:,.0f} ms), "
            f"SlateDB write + flush {sd['slatedb_full_s'] * 1e3:,.0f} ms"
        )
        say(f"  1%:   ours {sd['ours_delta_s'] * 1e3:,.0f} ms, SlateDB write + flush {sd['slatedb_delta_s'] * 1e3:,.0f} ms")
    else:
        say(f"\nSlateDB side by side: NOT RUN ({sd['reason']})")

    figures: list[tuple[str, str, float]] = []  # (name shown, TARGETS kind, value)
    for what, kind in (("cold_gets_s", "cold gets"), ("cold_get_many_s", "cold get_many"), ("steady_gets_s", "steady gets")):
        for big_label in ("10x", "2x"):
            figures.append((f"{kind} {big_label} / 0.5x", f"{kind} {big_label} / 0.5x", reads["ratios"][f"{what} {big_label}/0.5x"]))
    for big_label in ("10x", "2x"):
        name = f"steady get_many {big_label} / 0.5x"
        figures.append((name, name, reads["ratios"][f"steady_get_many_s {big_label}/0.5x"]))
    figures.append(
        ("store bytes per cold get at 10x, in blocks", "store bytes per cold get at 10x, in blocks", store_reads["blocks_per_get"])
    )
    figures.append(("store requests per cold get at 10x", "store requests per cold get at 10x", store_reads["requests_per_get"]))
    for m in results["commit_memory"]:
        if m["order"] == "layout":  # what the worker client sends: the target
            figures.append(
                (f"commit peak RSS growth / delta bytes ({m['keys']:,} keys)", "commit peak RSS growth / delta bytes", m["ratio"])
            )
        else:  # a client that sends rows unsorted: the pool sorts them (a copy)
            figures.append((f"  same, delta in random order ({m['keys']:,} keys)", "commit peak RSS growth, random order", m["ratio"]))
    figures.append((f"1% commit / full commit time (moto, {cr['keys']:,} keys)", "1% commit / full commit time (moto)", cr["ratio"]))
    if sd["ran"]:
        figures.append(
            ("full checkpoint speedup vs SlateDB write+flush", "full checkpoint speedup vs SlateDB write+flush", sd["full_speedup"])
        )
        figures.append(("1% commit / SlateDB 1% write+flush (time)", "1% commit / SlateDB 1% write+flush (time)", sd["delta_ratio"]))
    say(f"\n{'ratio':<64} {'value':>12}   target")
    failed = False
    targets: dict[str, Any] = {}
    for name, kind, value in figures:
        target = TARGETS[kind]
        if target is None:
            say(f"  {name:<62} {figure(value):>12}")
            targets[name] = {"value": value, "op": None, "target": None, "ok": None}
            continue
        op, bound = target
        ok = value <= bound if op == "<=" else value >= bound
        failed |= not ok
        targets[name] = {"value": value, "op": op, "target": bound, "ok": ok}
        say(f"  {name:<62} {figure(value):>12}   {op} {figure(bound):<8} {'pass' if ok else 'MISS'}")
    if not sd["ran"]:
        say(f"  {'SlateDB comparison':<62} {'not run':>12}   ({sd['reason']})")
    results["targets"] = targets
    results["seconds"] = time.perf_counter() - started
    results["exit"] = 1 if failed else 0
    say(f"\ntotal {results['seconds']:.1f}s; exit {results['exit']}")
    if as_json:
        print(json.dumps(results, indent=2, sort_keys=True))
    return results["exit"]


if __name__ == "__main__":
    sys.exit(main())
