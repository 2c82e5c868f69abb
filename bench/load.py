"""Load test: N worker processes drive one pool (puts, gets, get_many, checkpoints) for a bounded time; zero errors, state = model.

    python bench/load.py                          # 8 workers, 20 s, a pool on a temporary file:// store
    python bench/load.py --workers 4 --seconds 10 --store moto

Each worker is one subtask of one job (its own key-group range) using RemoteReadBackend; it checks every value it reads
against its own dict model. At the end every worker commits one final checkpoint; it is scanned through a fresh client
and compared with the union of the models. Exit code 0 only with zero errors and an exact match.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

JOB = "load"
FINAL_CHECKPOINT = 1_000_000
OP_UID = "load-counter"


def _ranges(n: int) -> list[tuple[int, int]]:
    edges = np.linspace(0, 128, n + 1).astype(int)
    return [(int(edges[i]), int(edges[i + 1]) - 1) for i in range(n)]


def _keys_in(lo: int, hi: int, count: int, seed: int) -> list[bytes]:
    import snapshot

    rng = random.Random(seed)
    out: list[bytes] = []
    while len(out) < count:
        user = f"w{seed}-{rng.getrandbits(40):x}".encode()
        if lo <= snapshot.key_group(user) <= hi:
            out.append(snapshot.encode_keyed_key("n", user))
    return out


def worker(
    index: int, address: str, key_groups: tuple[int, int], seconds: float, checkpoint_every_s: float, cache_bytes: int, results
) -> None:
    """One subtask: a loop of puts/erases, point gets, batched gets and periodic checkpoints until the deadline."""
    import snapshot
    from client import RemoteReadBackend
    from client.backend import BackendConfig

    op = snapshot.operator_id(OP_UID)
    lat: dict[str, list[float]] = {"put": [], "get": [], "get_many(50)": [], "checkpoint": []}
    errors: list[str] = []
    model: dict[bytes, bytes] = {}
    universe = _keys_in(*key_groups, 20000, seed=index)
    rng = random.Random(index)
    cid = 0
    rpcs = 0
    try:
        backend = RemoteReadBackend.connect(address, JOB, key_groups=key_groups, config=BackendConfig(cache_bytes=cache_bytes))
        backend.register_operator(OP_UID)
        # existing state: every key of the worker is written and checkpointed (untimed) before the load starts
        for key in universe:
            value = f"{index}-0-{rng.getrandbits(32)}".encode()
            backend.put(op, key, value)
            model[key] = value
        cid = 1
        backend.snapshot(cid)
        wait_until = time.monotonic() + 60
        while backend.refresh_completion() != cid and time.monotonic() < wait_until:
            time.sleep(0.05)  # the other subtasks commit their part of checkpoint 1
        rpcs_before = backend.pool.calls
        deadline = time.monotonic() + seconds
        next_checkpoint = time.monotonic() + checkpoint_every_s
        while time.monotonic() < deadline:
            hot = universe[(cid * 1500) % len(universe) :][:1500]  # writes move through the keys; reads spread over all of them
            for _ in range(5):
                key = rng.choice(hot)
                t = time.perf_counter()
                if key in model and rng.random() < 0.1:
                    backend.erase(op, key)
                    del model[key]
                else:
                    value = f"{index}-{cid}-{rng.getrandbits(32)}".encode()
                    backend.put(op, key, value)
                    model[key] = value
                lat["put"].append(time.perf_counter() - t)
            for _ in range(5):
                key = rng.choice(universe)
                t = time.perf_counter()
                got = backend.get(op, key)
                lat["get"].append(time.perf_counter() - t)
                if got != model.get(key):
                    errors.append(f"worker {index}: get {key!r} = {got!r}, model says {model.get(key)!r}")
            keys = rng.sample(universe, 50)
            t = time.perf_counter()
            got_many = backend.get_many(op, keys)
            lat["get_many(50)"].append(time.perf_counter() - t)
            if got_many != [model.get(k) for k in keys]:
                errors.append(f"worker {index}: get_many differs from the model")
            if time.monotonic() >= next_checkpoint:
                cid += 1
                t = time.perf_counter()
                backend.snapshot(cid)
                lat["checkpoint"].append(time.perf_counter() - t)
                backend.refresh_completion()  # once every subtask committed, reads go to the pool's checkpoint, not local layers
                next_checkpoint = time.monotonic() + checkpoint_every_s
        rpcs = backend.pool.calls - rpcs_before
        t = time.perf_counter()
        backend.snapshot(FINAL_CHECKPOINT)
        lat["checkpoint"].append(time.perf_counter() - t)
        backend.close()
    except Exception as exc:  # noqa: BLE001 - every failure is an error the report counts
        errors.append(f"worker {index}: {type(exc).__name__}: {exc}")
    results.put((index, {k: np.array(v) for k, v in lat.items()}, errors, model, cid, rpcs))


def _start_pool(store: str, tmp: Path) -> tuple[subprocess.Popen, str, object | None]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    moto = None
    if store == "moto":
        from moto.server import ThreadedMotoServer

        from store.objects import StoreConfig
        from store.s3 import S3Store

        moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        moto.start()
        host, port = moto.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        S3Store(
            "load", "pool", StoreConfig(endpoint_url=endpoint, region="us-east-1", access_key_id="testing", secret_access_key="testing")
        ).create_bucket()
        env.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_REGION="us-east-1", AWS_ENDPOINT_URL_S3=endpoint)
        uri = "s3://load/pool"
    else:
        uri = store if store.startswith(("file://", "s3://")) else f"file://{tmp / 'store'}"
    cmd = [
        sys.executable,
        "-m",
        "clink.cli.pool",
        "serve",
        "--store",
        uri,
        "--listen",
        "127.0.0.1:0",
        "--output",
        "json",
        "--log-level",
        "warning",
        "--max-workers",
        "32",
    ]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    if not line:
        raise SystemExit(f"load: the pool did not start (exit {proc.wait(10)})")
    return proc, json.loads(line)["address"], moto


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) * 1000 if values.size else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=8, help="worker processes (subtasks of one job)")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long the workers run")
    parser.add_argument("--checkpoint-every", type=float, default=1.0, help="seconds between checkpoints of one worker")
    parser.add_argument(
        "--cache-kb", type=int, default=0, help="each worker's read cache; 0 sends every read not in the hot delta to the pool"
    )
    parser.add_argument("--store", default="file", help="'file' (a temporary directory), 'moto' (an in-process S3), or a store URI")
    parser.add_argument("--output", choices=["text", "json"], default="text")
    args = parser.parse_args()
    if args.workers < 1 or args.workers > 128 or args.seconds <= 0:
        parser.error("--workers must be 1..128 and --seconds positive")

    tmp = Path(tempfile.mkdtemp(prefix="clink-load-"))
    proc, address, moto = _start_pool(args.store, tmp)
    ctx = mp.get_context("spawn")  # grpc channels must not cross a fork
    results = ctx.Queue()
    ranges = _ranges(args.workers)
    started = time.monotonic()
    procs = [
        ctx.Process(target=worker, args=(i, address, ranges[i], args.seconds, args.checkpoint_every, args.cache_kb << 10, results))
        for i in range(args.workers)
    ]
    try:
        for p in procs:
            p.start()
        collected = [results.get(timeout=args.seconds + 120) for _ in procs]
        for p in procs:
            p.join(30)
        wall = time.monotonic() - started

        from client.pool_client import PoolClient
        from snapshot import read_snapshot

        errors = [e for _, _, errs, _, _, _ in collected for e in errs]
        expected: dict[bytes, bytes] = {}
        for _, _, _, model, _, _ in collected:
            expected.update(model)
        with PoolClient(address) as client:
            infos = {c.checkpoint_id: c for c in client.list_checkpoints(JOB)}
            table = read_snapshot(client.scan_checkpoint(JOB, FINAL_CHECKPOINT)).table if FINAL_CHECKPOINT in infos else None
        state = dict(zip(table.column("key_bytes").to_pylist(), table.column("value_bytes").to_pylist(), strict=True)) if table else {}
        match = table is not None and state == expected
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        proc.terminate()
        proc.wait(15)
        if moto is not None:
            moto.stop()

    rows = []
    for op in ("put", "get", "get_many(50)", "checkpoint"):
        values = np.concatenate([lat[op] for _, lat, _, _, _, _ in collected]) if collected else np.array([])
        rows.append(
            {
                "op": op,
                "count": int(values.size),
                "per_s": values.size / args.seconds,
                "p50_ms": _pct(values, 50),
                "p99_ms": _pct(values, 99),
            }
        )
    checkpoints = sum(c[4] for c in collected) + len(collected)  # the preload checkpoint is counted, the timed loop's too
    rpcs = sum(c[5] for c in collected)
    summary = {
        "workers": args.workers,
        "seconds": args.seconds,
        "wall_s": round(wall, 1),
        "store": args.store,
        "ops": rows,
        "errors": len(errors),
        "complete_checkpoints": len(infos),
        "commits": checkpoints,
        "final_keys": len(expected),
        "pool_rpcs": rpcs,
        "final_state_matches_model": match,
    }
    if args.output == "json":
        print(json.dumps(summary))
    else:
        print(f"load: {args.workers} workers x {args.seconds:.0f} s against one pool ({args.store} store), wall {wall:.1f} s")
        print(f"{'operation':<14}{'count':>10}{'per s':>11}{'p50 ms':>10}{'p99 ms':>10}")
        for r in rows:
            print(f"{r['op']:<14}{r['count']:>10,d}{r['per_s']:>11,.0f}{r['p50_ms']:>10.3f}{r['p99_ms']:>10.2f}")
        print(
            f"pool RPCs from the workers {rpcs:,d} ({rpcs / args.seconds:,.0f}/s); commits {checkpoints} ({len(infos)} complete checkpoints); errors {len(errors)}; "
            f"final checkpoint {'matches' if match else 'DOES NOT match'} the model ({len(expected):,d} keys)"
        )
        for e in errors[:10]:
            print(f"  error: {e}")
    return 0 if not errors and match else 1


if __name__ == "__main__":
    sys.exit(main())
