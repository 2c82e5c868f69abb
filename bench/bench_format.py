"""Benchmark the snapshot format's hot paths against plain pyarrow baselines measured in the same run."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import snapshot  # noqa: E402

VALUE_BYTES = 100
SLOTS = ("count", "profile", "window")
OPERATORS = ("fraud-detector", "enricher")
TARGETS = {"overlay": 1.5, "write": 1.2, "write bytes": 1.2, "read": 1.2, "read memory": None}


def binary_array(data: np.ndarray, width: int) -> pa.Array:
    """A BinaryArray of equal-width values cut from one uint8 buffer (no per-row Python)."""
    n = data.size // width
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def make_keys(start: int, count: int, rng: np.random.Generator) -> tuple[pa.Array, pa.Array]:
    """Realistic keyed-state keys: encode_keyed_key over a few slots, 8-byte little-endian int user keys, two operators."""
    user_ints = np.arange(start, start + count, dtype="<i8")
    slots = rng.integers(0, len(SLOTS), count)
    ops = np.array([snapshot.operator_id(uid) for uid in OPERATORS], dtype=np.uint64)[rng.integers(0, len(OPERATORS), count)]
    raw = user_ints.tobytes()
    keys = [snapshot.encode_keyed_key(SLOTS[s], raw[8 * i : 8 * i + 8]) for i, s in enumerate(slots.tolist())]
    return pa.array(ops, pa.uint64()), pa.array(keys, pa.binary())


def make_data(rows: int, seed: int = 7) -> tuple[pa.Table, pa.Table]:
    """A canonical base of ``rows`` rows and a changelog delta of 10% of that: half overwrites, a quarter erases, a quarter new keys."""
    rng = np.random.default_rng(seed)
    ops, keys = make_keys(0, rows, rng)
    values = binary_array(rng.integers(0, 256, rows * VALUE_BYTES, dtype=np.uint8), VALUE_BYTES)
    base = pa.Table.from_arrays([ops, keys, values], schema=snapshot.CANONICAL_SCHEMA)

    delta_rows = max(rows // 10, 4)
    n_over, n_erase = delta_rows // 2, delta_rows // 4
    n_new = delta_rows - n_over - n_erase
    touched = rng.choice(rows, n_over + n_erase, replace=False)
    new_ops, new_keys = make_keys(rows, n_new, rng)
    d_ops = pa.concat_arrays([ops.take(pa.array(touched)), new_ops])
    d_keys = pa.concat_arrays([keys.take(pa.array(touched)), new_keys])
    kinds = np.concatenate(
        [np.full(n_over, snapshot.ROW_PUT), np.full(n_erase, snapshot.ROW_ERASE), np.full(n_new, snapshot.ROW_PUT)]
    ).astype(np.uint8)
    d_values = binary_array(rng.integers(0, 256, delta_rows * VALUE_BYTES, dtype=np.uint8), VALUE_BYTES)
    shuffle = pa.array(rng.permutation(delta_rows))
    delta = pa.Table.from_arrays([pa.array(kinds), d_ops, d_keys, d_values], schema=snapshot.CHANGELOG_SCHEMA).take(shuffle)
    return base, delta.combine_chunks()


def timed_pair(ours: Callable[[], object], baseline: Callable[[], object], repeats: int) -> tuple[list[float], list[float], object, object]:
    """Wall times of ``repeats`` calls of each, interleaved (alternating who goes first) so machine noise hits both alike."""
    times: dict[str, list[float]] = {"ours": [], "baseline": []}
    last: dict[str, object] = {}
    for i in range(repeats):
        order = (("ours", ours), ("baseline", baseline)) if i % 2 else (("baseline", baseline), ("ours", ours))
        for name, fn in order:
            start = time.perf_counter()
            last[name] = fn()
            times[name].append(time.perf_counter() - start)
    return times["ours"], times["baseline"], last["ours"], last["baseline"]


def baseline_overlay(base: pa.Table, delta: pa.Table) -> pa.Table:
    """Plain pyarrow: drop base rows whose key is in the delta, append the delta's puts."""
    drop = pc.is_in(base.column("key_bytes"), value_set=delta.column("key_bytes").combine_chunks())
    kept = base.filter(pc.invert(drop))
    puts = delta.filter(pc.not_equal(delta.column("row_kind"), snapshot.ROW_ERASE)).select(["op_id", "key_bytes", "value_bytes"])
    return pa.concat_tables([kept, puts])


def raw_write(table: pa.Table) -> pa.Buffer:
    """Plain pyarrow IPC stream writer into memory."""
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def raw_read(source: pa.Buffer | pa.NativeFile) -> pa.Table:
    """Plain pyarrow IPC stream reader."""
    return ipc.open_stream(source).read_all()


def ms(seconds: float) -> str:
    """A duration as a right-aligned millisecond figure."""
    return f"{seconds * 1e3:>8.2f}ms"


def same_rows(a: pa.Table, b: pa.Table) -> bool:
    """Cheap but real check that two results hold the same rows (sorted comparison of the key columns)."""
    if a.num_rows != b.num_rows:
        return False
    order_a = pc.sort_indices(a, sort_keys=[("key_bytes", "ascending")])
    order_b = pc.sort_indices(b, sort_keys=[("key_bytes", "ascending")])
    return a.take(order_a).equals(b.take(order_b))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--rows", type=int, default=1_000_000, help="rows in the base table (default 1,000,000; use e.g. 50000 for a quick run)"
    )
    parser.add_argument(
        "--repeats", type=int, default=9, help="timed repetitions per measurement, interleaved with the baseline (default 9)"
    )
    args = parser.parse_args(argv)

    t0 = time.perf_counter()
    base, delta = make_data(args.rows)
    versions = snapshot.StateVersionMap({(snapshot.operator_id(uid), "ValueState"): 1 for uid in OPERATORS})
    writer = snapshot.SnapshotArrowWriter(versions)
    print(
        f"data: {base.num_rows:,} base rows, {delta.num_rows:,} delta rows "
        f"({base.nbytes / 2**20:.0f} MiB + {delta.nbytes / 2**20:.0f} MiB), {VALUE_BYTES}-byte values; "
        f"built in {time.perf_counter() - t0:.1f}s; {args.repeats} interleaved repeats ({3 * args.repeats} for writes and reads); ratio = ours/baseline"
    )

    results: list[tuple[str, list[float], list[float]]] = []

    ours_t, base_t, got, expect = timed_pair(lambda: snapshot.overlay(base, delta), lambda: baseline_overlay(base, delta), args.repeats)
    if not same_rows(got, expect):
        print("ERROR: overlay result differs from the baseline's")
        return 1
    results.append(("overlay", ours_t, base_t))

    ours_t, base_t, our_buf, raw_buf = timed_pair(lambda: writer.write_buffer(base), lambda: raw_write(base), 3 * args.repeats)
    results.append(("write", ours_t, base_t))
    ours_t, base_t, our_bytes, _ = timed_pair(lambda: writer.write(base), lambda: raw_write(base).to_pybytes(), 3 * args.repeats)
    results.append(("write bytes", ours_t, base_t))
    if our_bytes != our_buf.to_pybytes() or abs(our_buf.size - raw_buf.size) > 4096:
        print("ERROR: writer output differs between write() and write_buffer(), or is far from raw size")
        return 1

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.snap"
        path.write_bytes(our_bytes)
        ours_t, base_t, snap, raw_table = timed_pair(
            lambda: snapshot.read_snapshot(pa.OSFile(str(path))), lambda: raw_read(pa.OSFile(str(path))), 3 * args.repeats
        )
    if not snap.table.equals(raw_table) or snap.state_versions != versions:
        print("ERROR: read_snapshot result differs from the raw reader's")
        return 1
    results.append(("read", ours_t, base_t))
    ours_t, base_t, snap, raw_table = timed_pair(lambda: snapshot.read_snapshot(our_buf), lambda: raw_read(our_buf), 3 * args.repeats)
    if not snap.table.equals(raw_table):
        print("ERROR: read_snapshot result differs from the raw reader's")
        return 1
    results.append(("read memory", ours_t, base_t))

    print(f"{'measure':<12} {'ours best':>10} {'base best':>10} {'ours med':>10} {'base med':>10} {'ratio':>7} {'target':>7}  verdict")
    all_met = True
    for name, ours_t, base_t in results:
        # each repeat times ours and the baseline back to back: the median of those paired ratios shrugs off load that comes and goes
        ratio = statistics.median(o / b for o, b in zip(ours_t, base_t, strict=True))
        target = TARGETS.get(name)
        met = target is None or ratio <= target
        all_met &= met
        verdict = "ok" if target is not None and met else "MISSED" if target is not None else "info"
        print(
            f"{name:<12} {ms(min(ours_t))} {ms(min(base_t))} {ms(statistics.median(ours_t))} {ms(statistics.median(base_t))} "
            f"{ratio:>6.2f}x {f'{target:.1f}x' if target else '-':>7}  {verdict}"
        )
    print("ratio = median over repeats of (ours / baseline) timed back to back in the same repeat, alternating who goes first.")
    print("baselines: overlay = pc.is_in + Table.filter + concat_tables (no op_id, no replay); write = ipc.new_stream into a")
    print("BufferOutputStream (write bytes adds .to_pybytes() on both sides); read = ipc.open_stream(OSFile).read_all() of the same file;")
    print("read memory = the same from an in-memory buffer: the raw read is zero-copy and does no per-row work, so this")
    extra = (min(results[-1][1]) - min(results[-1][2])) * 1e3
    print(f"shows the cost of our checks (schema, metadata, binary offsets in bounds: {extra:.2f} ms here), not a throughput ratio")
    scale = "" if args.rows >= 1_000_000 else f" (the targets are set for 1,000,000 rows; at {args.rows:,} fixed per-call costs weigh more)"
    print(f"all targets met: {'yes' if all_met else 'NO'}{scale}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
