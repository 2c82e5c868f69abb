"""Run the deterministic protocol simulation over many seeds; a failing seed prints the command that replays it.

python bench/simulate.py --seeds 10000 --jobs 2          # many seeds, two processes
python bench/simulate.py --start 4711 --seeds 1 -v       # replay one seed, printing its actions
python bench/simulate.py --seeds 500 --maintainers on     # every seed with the pools' own maintainers competing for leases
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


# --maintainers: "mixed" lets each seed draw whether the pools run their own maintenance (about half do)
MAINTAINERS = {"mixed": None, "on": True, "off": False}


def run_seed(seed: int, steps: int, faults: bool = True, mutant: str | None = None, maintainers: str = "mixed") -> dict:
    """One seed: its stats, or the violation it found (with ``mutant``: one known defect put back)."""
    from tests.sim.mutants import mutant as apply_mutant
    from tests.sim.world import World

    started = time.perf_counter()
    world = World(seed, faults=faults, maintainers=MAINTAINERS[maintainers])
    try:
        with apply_mutant(mutant):
            stats = world.run(steps)
        return {"seed": seed, "ok": True, "steps": world.sched.steps, "seconds": time.perf_counter() - started, "stats": stats}
    except Exception as exc:  # noqa: BLE001 - a violation or a crash of the harness: both are reported with the seed
        return {
            "seed": seed,
            "ok": False,
            "steps": world.sched.steps,
            "seconds": time.perf_counter() - started,
            "error": f"{type(exc).__name__}: {exc}",
            "actions": world.actions[-60:],
        }


def replay_command(seed: int, steps: int, mutant: str | None = None, maintainers: str = "mixed") -> str:
    """The shell command that runs exactly this seed again."""
    extra = (f" --mutant {mutant}" if mutant else "") + (f" --maintainers {maintainers}" if maintainers != "mixed" else "")
    return f"PYTHONHASHSEED=0 python bench/simulate.py --start {seed} --seeds 1 --steps {steps}{extra} -v"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=100, help="how many seeds to run")
    parser.add_argument("--start", type=int, default=0, help="first seed")
    parser.add_argument("--steps", type=int, default=400, help="scheduler steps per seed (before the final drain)")
    parser.add_argument("--jobs", type=int, default=1, help="processes running seeds in parallel")
    parser.add_argument("--budget-s", type=float, default=None, help="stop starting new seeds after this many seconds")
    parser.add_argument("--no-faults", action="store_true", help="no injected errors, lost replies or crashes")
    parser.add_argument("--mutant", default=None, help="put one known defect back (tests/sim/mutants.py): the run must fail")
    parser.add_argument("--mutants", action="store_true", help="run every mutant over the seeds and report which ones the simulation kills")
    parser.add_argument(
        "--maintainers", choices=sorted(MAINTAINERS), default="mixed", help="the pools' own maintenance: per seed (mixed), always, never"
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each failing seed's last actions")
    args = parser.parse_args(argv)
    if os.environ.get("PYTHONHASHSEED") != "0":  # set iteration order must repeat for a seed to replay exactly
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, *sys.argv])
    if args.mutants:
        return run_mutants(args)
    started = time.perf_counter()
    results: list[dict] = []
    seeds = range(args.start, args.start + args.seeds)
    faults = not args.no_faults
    if args.jobs <= 1:
        for seed in seeds:
            if args.budget_s is not None and time.perf_counter() - started > args.budget_s:
                break
            results.append(run_seed(seed, args.steps, faults, args.mutant, args.maintainers))
            if not results[-1]["ok"]:
                report(results[-1], args)
    else:
        with ProcessPoolExecutor(args.jobs) as pool:
            pending = {}
            it = iter(seeds)
            for seed in it:
                pending[pool.submit(run_seed, seed, args.steps, faults, args.mutant, args.maintainers)] = seed
                if len(pending) >= args.jobs * 4:
                    break
            while pending:
                done = next(as_completed(pending))
                pending.pop(done)
                results.append(done.result())
                if not results[-1]["ok"]:
                    report(results[-1], args)
                over = args.budget_s is not None and time.perf_counter() - started > args.budget_s
                nxt = None if over else next(it, None)
                if nxt is not None:
                    pending[pool.submit(run_seed, nxt, args.steps, faults, args.mutant, args.maintainers)] = nxt
    wall = time.perf_counter() - started
    failed = [r for r in results if not r["ok"]]
    totals: dict[str, int] = {}
    for r in results:
        for k, v in r.get("stats", {}).items():
            totals[k] = totals.get(k, 0) + v
    summary = {
        "seeds": len(results),
        "failed": [r["seed"] for r in failed],
        "steps_per_seed": round(sum(r["steps"] for r in results) / max(1, len(results)), 1),
        "wall_s": round(wall, 1),
        "seconds_per_seed": round(sum(r["seconds"] for r in results) / max(1, len(results)), 3),
        "totals": totals,
    }
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        print(
            f"{summary['seeds']} seeds, {len(failed)} failed, {summary['steps_per_seed']} steps per seed, "
            f"{summary['wall_s']} s wall ({summary['seconds_per_seed']} s per seed)"
        )
        print("totals: " + ", ".join(f"{k} {v}" for k, v in sorted(totals.items())))
    return 1 if failed else 0


def run_mutants(args: argparse.Namespace) -> int:
    """Every mutant over the seeds: how many seeds kill it (a mutant no seed kills is a blind spot)."""
    from tests.sim.mutants import MUTANTS

    survivors = []
    for name in sorted(MUTANTS):
        started = time.perf_counter()
        killed, first = 0, None
        with ProcessPoolExecutor(max(1, args.jobs)) as pool:
            futures = [
                pool.submit(run_seed, seed, args.steps, not args.no_faults, name, args.maintainers)
                for seed in range(args.start, args.start + args.seeds)
            ]
            for f in futures:
                r = f.result()
                if not r["ok"]:
                    killed += 1
                    first = first if first is not None else r
        print(
            f"{name:40s} killed by {killed:4d} of {args.seeds} seeds ({time.perf_counter() - started:5.1f} s)"
            + (f"  first: seed {first['seed']}: {first['error'][:110]}" if first else "")
        )
        if not killed:
            survivors.append(name)
    if survivors:
        print(f"SURVIVED (blind spots): {', '.join(survivors)}")
    return 1 if survivors else 0


def report(result: dict, args: argparse.Namespace) -> None:
    """Print one failing seed and how to replay it."""
    print(f"FAILED seed {result['seed']}: {result['error']}", file=sys.stderr)
    print(f"  replay: {replay_command(result['seed'], args.steps, args.mutant, args.maintainers)}", file=sys.stderr)
    if args.verbose:
        for line in result.get("actions", []):
            print(f"    {line}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
