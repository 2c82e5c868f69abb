"""Benchmark of the CLI's hot paths: vectorised key decoding, rendering, FNV checks and diff, as ratios against per-row Python baselines."""

from __future__ import annotations

import argparse
import random
import struct
import time

import pyarrow as pa

import snapshot as s
from clink.tools.projections import decode_keys, key_groups_of, parquet_projection, render_bytes
from clink.tools.state_diff import diff_tables


def _table(n: int, seed: int) -> pa.Table:
    rng = random.Random(seed)
    ops, keys, values = [], [], []
    for i in range(n):
        ops.append(1 + i % 3)
        if i % 2:
            keys.append(s.encode_keyed_key("count", struct.pack("<q", i)))
            values.append(struct.pack("<q", rng.randrange(1 << 30)))
        else:
            keys.append(s.encode_keyed_key("profile", f"user-{i}".encode()))
            values.append(f'{{"v":{rng.randrange(1000)}}}'.encode())
    return pa.table(
        {"op_id": pa.array(ops, pa.uint64()), "key_bytes": pa.array(keys, pa.binary()), "value_bytes": pa.array(values, pa.binary())}
    )


def _time(fn, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _render_py(b: bytes) -> str:
    try:
        text = b.decode("utf-8")
        if text.strip(" ") and text.isprintable():
            return text
    except UnicodeDecodeError:
        pass
    return str(struct.unpack("<q", b)[0]) if len(b) == 8 else "0x" + b.hex()


def main() -> None:
    """Print one line per hot path: vectorised time, per-row baseline time, and the speed-up."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=200_000)
    args = parser.parse_args()
    n = args.rows
    a = _table(n, 1)
    keys = a.column("key_bytes").combine_chunks()
    keys_py = keys.to_pylist()
    decoded = decode_keys(keys)
    users = decoded.column("user_key").combine_chunks()
    users_py = users.to_pylist()
    # B: 5% of values changed, 1% removed, 1% added
    b_rows = dict(zip(zip(a.column("op_id").to_pylist(), keys_py, strict=True), a.column("value_bytes").to_pylist(), strict=True))
    items = list(b_rows)
    for k in items[: n // 20]:
        b_rows[k] = b_rows[k] + b"!"
    for k in items[n // 20 : n // 20 + n // 100]:
        del b_rows[k]
    for i in range(n // 100):
        b_rows[(9, s.encode_keyed_key("new", struct.pack("<q", i)))] = b"x"
    b = pa.table(
        {
            "op_id": pa.array([k[0] for k in b_rows], pa.uint64()),
            "key_bytes": pa.array([k[1] for k in b_rows], pa.binary()),
            "value_bytes": pa.array(list(b_rows.values()), pa.binary()),
        }
    )
    a_rows = dict(zip(zip(a.column("op_id").to_pylist(), keys_py, strict=True), a.column("value_bytes").to_pylist(), strict=True))

    def dict_diff() -> tuple[int, int, int]:
        added = len(b_rows.keys() - a_rows.keys())
        removed = len(a_rows.keys() - b_rows.keys())
        changed = sum(1 for k in a_rows.keys() & b_rows.keys() if a_rows[k] != b_rows[k])
        return added, removed, changed

    assert diff_tables(a, b).counts() == dict(zip(("added", "removed", "changed"), dict_diff(), strict=True))
    cases = [
        ("decode_keys", lambda: decode_keys(keys), lambda: [s.decode_key(k) for k in keys_py]),
        ("render user keys", lambda: render_bytes(users), lambda: [_render_py(k) for k in users_py]),
        ("fnv key groups", lambda: key_groups_of(users), lambda: [s.key_group(k) for k in users_py]),
        ("parquet projection", lambda: parquet_projection(a), lambda: [s.decode_key(k) for k in keys_py]),
        ("diff (dict baseline)", lambda: diff_tables(a, b), dict_diff),
    ]
    print(f"rows: {n}")
    print(f"{'path':<22} {'vectorised s':>13} {'per-row s':>11} {'speed-up':>9}")
    for name, fast, slow in cases:
        tf, ts = _time(fast), _time(slow, repeat=1)
        print(f"{name:<22} {tf:13.4f} {ts:11.4f} {ts / tf:8.1f}x")


if __name__ == "__main__":
    main()
