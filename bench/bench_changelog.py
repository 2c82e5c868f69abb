"""Benchmark export_changelog_snapshot: its bytes / export_arrow_snapshot's bytes for one state with a small hot delta, in one run."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import snapshot  # noqa: E402
from bench.bench_client import OP, VALUE_BYTES, bench_keys, binary_array  # noqa: E402
from client import RemoteReadBackend  # noqa: E402
from pool.server import PoolServer, PoolServerConfig  # noqa: E402
from store.handles import StoreHandleResolver  # noqa: E402
from store.local import FileStore  # noqa: E402

TARGET_RATIO = 0.02
JOB = "bench-changelog"


def timed(run) -> tuple[float, bytes]:
    started = time.perf_counter()
    out = run()
    return time.perf_counter() - started, out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, default=1_000_000, help="keys in the state (default 1M)")
    parser.add_argument("--delta-fraction", type=float, default=0.01, help="share of the keys rewritten or erased since the checkpoint")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-changelog-") as folder:
        store = FileStore(Path(folder))
        server = PoolServer(PoolServerConfig(listen="127.0.0.1:0", grace_seconds=0.2), store=store).start()
        backend = RemoteReadBackend.connect(server.address, JOB)
        try:
            keys = bench_keys(0, args.keys)
            values = binary_array(np.random.default_rng(1).integers(0, 256, args.keys * VALUE_BYTES, dtype=np.uint8), VALUE_BYTES)
            backend.put_many(OP, keys, values)
            backend.snapshot(1)
            changed = max(2, int(args.keys * args.delta_fraction))
            rewritten = pa.array(np.arange(0, changed, 2))  # half the delta rewrites keys, half erases them
            backend.put_many(OP, keys.take(rewritten), values.take(pa.array(np.arange(changed, 0, -2) - 1)))
            for i in range(1, changed, 2):
                backend.erase(OP, keys[i].as_py())
            changelog_s, changelog = timed(backend.export_changelog_snapshot)
            full_s, full = timed(backend.export_arrow_snapshot)
            resolve_s, resolved = timed(lambda: snapshot.canonicalise_state_snapshot(changelog, store=StoreHandleResolver(store)))
            got, want = snapshot.read_snapshot(resolved).table, snapshot.read_snapshot(full).table
            assert got.num_rows == want.num_rows == args.keys - changed // 2, "the canonicalised changelog lost or added rows"
            assert snapshot.sort_for_layout(got).equals(snapshot.sort_for_layout(want)), "the canonicalised changelog differs"
        finally:
            backend.close()
            server.stop(0)
    ratio = len(changelog) / len(full)
    result = {
        "keys": args.keys,
        "delta_rows": changed,
        "changelog_bytes": len(changelog),
        "full_export_bytes": len(full),
        "ratio": round(ratio, 5),
        "target": TARGET_RATIO,
        "met": ratio <= TARGET_RATIO,
        "changelog_export_s": round(changelog_s, 4),
        "full_export_s": round(full_s, 4),
        "canonicalise_s": round(resolve_s, 4),
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"state: {args.keys:,} keys of checkpoint 1, {changed:,} rewritten or erased since ({args.delta_fraction:.1%})")
        print(f"export_arrow_snapshot:     {len(full):>13,} bytes in {full_s * 1000:.0f} ms")
        print(f"export_changelog_snapshot: {len(changelog):>13,} bytes in {changelog_s * 1000:.0f} ms")
        print(f"canonicalised through the store: {resolve_s * 1000:.0f} ms, equal to the full export")
        print(
            f"changelog / full export bytes: {ratio:.4f} (target at most {TARGET_RATIO:g}) {'met' if ratio <= TARGET_RATIO else 'MISSED'}"
        )
    return 0 if ratio <= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
