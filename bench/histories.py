"""Random job histories through a real `clink-pool serve` and RemoteReadBackend, against a model, over many seeds.

python bench/histories.py --seeds 200              # seeds 0..199, one pool process
python bench/histories.py --start 4711 --seeds 1   # replay one seed
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    from tests.protocol.histories import History, ServePool

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    failed, totals = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        pool = ServePool(Path(tmp) / "store", Path(tmp) / "serve.log")
        try:
            for seed in range(args.start, args.start + args.seeds):
                try:
                    stats = History(pool.address, Path(tmp) / "store", seed).run(args.steps)
                    for k, v in stats.items():
                        totals[k] = totals.get(k, 0) + v
                except AssertionError as exc:
                    failed.append(seed)
                    print(f"FAILED {exc}", file=sys.stderr)
        finally:
            pool.stop()
    print(
        f"{args.seeds} seeds, {len(failed)} failed, {args.steps} steps each, {time.perf_counter() - started:.1f} s; "
        + ", ".join(f"{k} {v}" for k, v in sorted(totals.items()))
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
