"""Benchmark several pools on one SeaweedFS bucket: the same 8-worker load against 1 pool and 3 pools, and 3 with one killed.

    python bench/bench_multi_pool.py                   # 8 workers x 20 rounds x 1,000 keys each
    python bench/bench_multi_pool.py --quick           # small: seconds, for CI
    python bench/bench_multi_pool.py --workers 8 --rounds 40 --keys 4000 --repeats 3 --output json

Every run starts fresh `clink-pool serve` processes on a fresh bucket of one SeaweedFS (started here, on loopback) and the
same workload: each worker process is one subtask of one job (its own key-group range) writing rounds of puts, overwrites,
erases and re-puts through RemoteReadBackend, checkpointing each round. It prints checkpoints/s and rows/s against 1 pool
and against 3, and their ratio (the pools share the machine's cores with SeaweedFS and the workers: on 2 cores expect
about 1x; more pools buy availability there, throughput only with cores or hosts to spread over). The third run kills
one of the 3 pools with SIGKILL mid-run and restarts it: no error beyond retries, and every checkpoint left equals the
workers' models. With --repeats N the 1-pool and 3-pool runs alternate N times and the fastest of each is compared.
Maintenance runs in every pool (each second; --maintenance off to compare without). Exit 0 only when no run loses anything.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from store.objects import StoreConfig  # noqa: E402
from tests.multi_pool_fixtures import MAINTENANCE_ARGS, SeaweedServer, pool_group  # noqa: E402
from tests.multi_pool_workload import Chaos, LoadResult, Workload, run_load  # noqa: E402

QUICK = {"workers": 4, "rounds": 4, "keys": 40}
RUNS = ("1 pool", "3 pools", "3 pools, 1 killed")
_RUN_NUMBERS = itertools.count(1)


def run_one(s3: StoreConfig, name: str, args: argparse.Namespace, root: Path, say: Any) -> LoadResult:
    """One run on fresh pools (1, or 3 with ``killed`` in the name) and a fresh bucket; its result."""
    pools = 1 if name == "1 pool" else 3
    folder = root / "runs" / f"{next(_RUN_NUMBERS)}-{name.replace(' ', '-').replace(',', '')}"
    serve_args = MAINTENANCE_ARGS if args.maintenance == "on" else ("--maintenance", "off")
    group = pool_group(s3, f"bench-multi-{uuid.uuid4().hex[:10]}", folder / "logs", pools, serve_args)
    with group:
        workload = Workload(job="bench-multi", workers=args.workers, rounds=args.rounds, keys=args.keys, seed=0)
        chaos = Chaos(kill_index=1) if "killed" in name else None
        say(f"{name}: {args.workers} workers on {group.address_list}")
        result = run_load(group, workload, group.address_list, folder / "reports", chaos, check="all" if chaos else "final", on_phase=say)
        stopping = time.monotonic()
        codes = group.stop()
        say(f"pools stopped in {time.monotonic() - stopping:.1f}s")
        if any(codes):
            result.driver_errors.append(f"pools exited {codes} on SIGTERM (0 expected):\n{group.logs()}")
    return result


def run_all(args: argparse.Namespace, root: Path, say: Any) -> dict[str, list[LoadResult]]:
    """1 pool and 3 pools in turn ``--repeats`` times, then 3 with one killed, on one SeaweedFS; every run's result by name."""
    results: dict[str, list[LoadResult]] = {name: [] for name in RUNS}
    with SeaweedServer(root / "seaweed") as s3:
        for _ in range(args.repeats):
            for name in RUNS[:2]:  # alternated, so a slower spell of the machine falls on both
                results[name].append(run_one(s3, name, args, root, say))
        results[RUNS[2]].append(run_one(s3, RUNS[2], args, root, say))
    return results


def best(runs: list[LoadResult]) -> LoadResult:
    """The run of the highest checkpoints/s (the least disturbed by the rest of the machine)."""
    return max(runs, key=lambda r: r.figures()["checkpoints_per_s"])


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n", 1)[1]
    )
    parser.add_argument("--workers", type=int, default=8, help="worker processes, one key-group range each (default 8)")
    parser.add_argument("--rounds", type=int, default=20, help="checkpoints each worker commits (default 20)")
    parser.add_argument("--keys", type=int, default=1000, help="keys each worker writes over (default 1,000)")
    parser.add_argument("--maintenance", choices=["on", "off"], default="on", help="run the pools with maintenance on (default) or off")
    parser.add_argument(
        "--quick", action="store_true", help=f"{QUICK['workers']} workers x {QUICK['rounds']} rounds x {QUICK['keys']} keys"
    )
    parser.add_argument(
        "--repeats", type=int, default=1, help="runs of 1 pool and of 3 pools, alternated; the fastest of each is compared (default 1)"
    )
    parser.add_argument("--output", choices=["text", "json"], default="text")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (pool logs, SeaweedFS data)")
    args = parser.parse_args(argv)
    if args.quick:
        args.workers, args.rounds, args.keys = QUICK["workers"], QUICK["rounds"], QUICK["keys"]
    if not 1 <= args.workers <= 128 or args.rounds < 2 or args.keys < 8 or args.repeats < 1:
        parser.error("--workers must be 1..128, --rounds at least 2, --keys at least 8 and --repeats at least 1")

    root = Path(tempfile.mkdtemp(prefix="bench-multi-pool-"))
    started = time.monotonic()
    say = (lambda msg: print(f"  {msg}", file=sys.stderr, flush=True)) if args.output == "text" else (lambda _msg: None)
    try:
        results = run_all(args, root, say)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    chosen = {name: best(runs) for name, runs in results.items()}
    one, three, killed = (chosen[name].figures() for name in RUNS)
    ratio = {
        "checkpoints_per_s": _ratio(three["checkpoints_per_s"], one["checkpoints_per_s"]),
        "rows_per_s": _ratio(three["rows_per_s"], one["rows_per_s"]),
    }
    repeat_ratios = [
        _ratio(t.figures()["checkpoints_per_s"], o.figures()["checkpoints_per_s"])
        for o, t in zip(results[RUNS[0]], results[RUNS[1]], strict=True)
    ]
    every = [r for runs in results.values() for r in runs]
    ok = all(r.ok for r in every)
    code = 0 if ok else 1
    if args.output == "json":
        doc = {
            "config": {
                "workers": args.workers,
                "rounds": args.rounds,
                "keys": args.keys,
                "maintenance": args.maintenance,
            },
            "runs": {"one_pool": one, "three_pools": three, "three_pools_one_killed": killed},
            "ratio_3_over_1": ratio,
            "repeats": args.repeats,
            "ratios_of_each_repeat": repeat_ratios,
            "errors": [e for r in every for e in r.errors + r.read_mismatches + r.differences][:20],
            "wall_s": round(time.monotonic() - started, 1),
            "ok": ok,
            "exit": code,
        }
        print(json.dumps(doc, indent=2))
        return code
    print(
        f"bench_multi_pool: {args.workers} workers x {args.rounds} rounds x {args.keys:,} keys each, SeaweedFS on 127.0.0.1, "
        f"maintenance {args.maintenance}; every worker given every pool (a comma list)"
    )
    print(
        f"{'run':<20}{'pools':>6}{'phase s':>9}{'checkpoints/s':>15}{'commits/s':>11}{'rows/s':>10}{'retries':>9}{'errors':>8}"
        f"{'S3 KiB read/commit':>20}  state"
    )
    for name in RUNS:
        f = chosen[name].figures()
        state = "= model" if chosen[name].ok else "DIFFERS / FAILED"
        print(
            f"{name:<20}{f['pools']:>6}{f['phase_s']:>9.2f}{f['checkpoints_per_s']:>15.2f}{f['commits_per_s']:>11.1f}"
            f"{f['rows_per_s']:>10,.0f}{f['retries']:>9}{f['errors'] + f['read_mismatches']:>8}"
            f"{f['store_read_bytes_per_commit'] / 1024:>20,.1f}  {state}"
        )
    each = ", ".join(f"{r:.2f}x" for r in repeat_ratios)
    print(
        f"ratio 3 pools / 1 pool: checkpoints/s {ratio['checkpoints_per_s']:.2f}x, rows/s {ratio['rows_per_s']:.2f}x "
        f"(one machine: pools, workers and SeaweedFS share its cores{'; each repeat: ' + each if args.repeats > 1 else ''})"
    )
    k = killed.get("kill")
    if k:
        print(
            f"kill and restart: pool {k['pool']} ({k['address']}) SIGKILLed after {k['progress_at_kill']} of {killed['commits']} commits, "
            f"serving again {k['down_s']:.1f}s later; it served {k['served_before']} calls before and {k['served_after']} after; "
            f"{killed['retries']} retries ({killed['commit_retries']} of commits, {killed['recovered_commits']} answered as repeats), "
            f"{killed['errors']} errors; {killed['compared_checkpoints']} checkpoints compared "
            f"({killed['retired_checkpoints']} retired by maintenance first), {killed['differences']} differences"
        )
    for name in RUNS:
        m = chosen[name].maintenance
        runs = sum(v for key, v in m.items() if key.startswith("runs_") and key.endswith("_ok"))
        print(
            f"maintenance beside the commits ({name}): {runs} task runs ok, {m.get('layers_folded', 0)} layers folded, "
            f"{m.get('checkpoints_deleted', 0)} checkpoints deleted, {m.get('bytes_reclaimed', 0):,} bytes reclaimed, {m.get('errors', 0)} errors"
        )
    if not ok:
        print(f"{sum(not r.ok for r in every)} of {len(every)} runs lost or failed something:")
    for result in every:
        for line in (result.errors + result.read_mismatches + result.differences)[:10]:
            print(f"  error: {line}")
    print(f"wall {time.monotonic() - started:.1f}s; exit {code}")
    return code


if __name__ == "__main__":
    sys.exit(main())
