"""Benchmark rocksdb_checkpoint_to_arrow of a RocksDB checkpoint vs a raw pyarrow IPC write of the same table, in one run."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import snapshot  # noqa: E402
from bench.bench_client import VALUE_BYTES, bench_keys, binary_array  # noqa: E402
from client.rocksdb_backend import RocksDBStateBackend, rocksdb_checkpoint_to_arrow  # noqa: E402

TARGET_RATIO = 3.0
OPERATORS = ("source", "window", "join", "sink")
T = TypeVar("T")


def best_of(repeats: int, run: Callable[[], T]) -> tuple[float, T]:
    best, out = float("inf"), None
    for _ in range(repeats):
        started = time.perf_counter()
        out = run()
        best = min(best, time.perf_counter() - started)
    assert out is not None
    return best, out


def raw_ipc_write(table: pa.Table) -> pa.Buffer:
    """The baseline: plain pyarrow writing the table as an IPC stream into memory."""
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def operators_then_keys(table: pa.Table) -> bool:
    """Whether rows are sorted by op_id, then key bytes within an operator (the RocksDB export order), vectorised."""
    n = table.num_rows
    ops = table.column("op_id").to_numpy()
    keys = table.column("key_bytes")
    rising = pc.less(keys.slice(0, n - 1), keys.slice(1)).to_numpy(zero_copy_only=False)
    return bool(((ops[:-1] < ops[1:]) | ((ops[:-1] == ops[1:]) & rising)).all())


def read_all_pairs(path: Path) -> tuple[list[object], list[object]]:
    """Only the RocksDB iteration (every key, every value as Python bytes): the floor the binding sets."""
    from rocksdict import AccessType, Options, Rdict

    db = Rdict(str(path), Options(raw_mode=True), access_type=AccessType.read_only())
    try:
        return list(db.keys()), list(db.values())
    finally:
        db.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows in the RocksDB checkpoint (default 1M)")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of each measurement (best kept)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.rows < len(OPERATORS):
        parser.error(f"--rows must be at least {len(OPERATORS)}")
    with tempfile.TemporaryDirectory(prefix="bench-rocksdb-") as folder:
        keys = bench_keys(0, args.rows)
        values = binary_array(np.random.default_rng(1).integers(0, 256, args.rows * VALUE_BYTES, dtype=np.uint8), VALUE_BYTES)
        started = time.perf_counter()
        with RocksDBStateBackend(Path(folder) / "db") as backend:
            for i, uid in enumerate(OPERATORS):  # rows spread over 4 operators
                op = backend.register_operator(uid)
                mine = pa.array(np.arange(i, args.rows, len(OPERATORS)))
                backend.put_many(op, keys.take(mine), values.take(mine))
            checkpoint = backend.create_checkpoint(Path(folder) / "chk")
        load_s = time.perf_counter() - started
        render_s, blob = best_of(args.repeats, lambda: rocksdb_checkpoint_to_arrow(checkpoint))
        table = snapshot.read_snapshot(blob).table
        assert table.num_rows == args.rows, "the render lost or added rows"
        assert operators_then_keys(table), "the render is not operators ascending, keys in byte order"
        baseline_s, raw = best_of(args.repeats, lambda: raw_ipc_write(table))
        assert ipc.open_stream(raw).read_all().equals(table)
        iterate_s, _ = best_of(args.repeats, lambda: read_all_pairs(checkpoint))
    ratio = render_s / baseline_s
    result = {
        "rows": args.rows,
        "stream_bytes": len(blob),
        "load_s": round(load_s, 4),
        "rocksdb_checkpoint_to_arrow_s": round(render_s, 4),
        "raw_ipc_write_s": round(baseline_s, 4),
        "rocksdb_iteration_s": round(iterate_s, 4),
        "ratio": round(ratio, 3),
        "iteration_ratio": round(iterate_s / baseline_s, 3),
        "target": TARGET_RATIO,
        "met": ratio <= TARGET_RATIO,
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"RocksDB checkpoint: {args.rows:,} rows over {len(OPERATORS)} operators, {len(blob) / 1e6:.1f} MB as a stream")
        print(f"raw pyarrow IPC write of the same table:              {baseline_s * 1000:.0f} ms")
        print(f"rocksdb_checkpoint_to_arrow:                          {render_s * 1000:.0f} ms")
        print(f"  of which at least: RocksDB iteration (keys, values): {iterate_s * 1000:.0f} ms ({iterate_s / baseline_s:.2f}x)")
        print(
            f"rocksdb_checkpoint_to_arrow / raw IPC write: {ratio:.2f}x (target at most {TARGET_RATIO:g}x) {'met' if ratio <= TARGET_RATIO else 'MISSED'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
