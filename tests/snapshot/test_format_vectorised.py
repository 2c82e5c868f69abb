"""No per-row Python: every whole-table path in snapshot/ executes the same Python lines for 300 rows as for 3,000."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import snapshot

SNAPSHOT_DIR = str(Path(snapshot.__file__).resolve().parent)


def _keys(ints: np.ndarray, lead: np.ndarray) -> pa.Array:
    """Keyed-layout keys ``[lead]count|[8-byte int]`` built without a Python loop."""
    raw = np.zeros((ints.size, 15), dtype=np.uint8)
    raw[:, 0] = lead
    raw[:, 1:7] = np.frombuffer(b"count|", dtype=np.uint8)
    raw[:, 7:] = ints.astype("<i8").view(np.uint8).reshape(-1, 8)
    offsets = np.arange(0, ints.size * 15 + 1, 15, dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), ints.size, [None, pa.py_buffer(offsets), pa.py_buffer(raw.tobytes())])


def _values(count: int, width: int, seed: int) -> pa.Array:
    data = np.random.default_rng(seed).integers(0, 256, count * width, dtype=np.uint8)
    offsets = np.arange(0, count * width + 1, width, dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), count, [None, pa.py_buffer(offsets), pa.py_buffer(data.tobytes())])


def workload(n: int) -> dict[str, Callable[[], object]]:
    """Each whole-table operation on inputs of n base rows; the shape (collisions, duplicates, kinds) does not depend on n."""
    ints = np.arange(n)
    lead = (ints % 128).astype(np.uint8)
    lead[: n // 10] = 0xFF  # a tenth is operator state
    ops = pa.array(np.where(ints % 2 == 0, 1, 2).astype(np.uint64))
    base = pa.Table.from_arrays([ops, _keys(ints, lead), _values(n, 8, 1)], schema=snapshot.CANONICAL_SCHEMA)

    m = n // 10
    touched = np.arange(0, n, 10)[:m]
    kinds = np.tile(np.array([1, 2, 0, 1], dtype=np.uint8), m)[:m]
    distinct = pa.Table.from_arrays(
        [pa.array(kinds), ops.take(pa.array(touched)), base.column("key_bytes").take(pa.array(touched)), _values(m, 12, 2)],
        schema=snapshot.CHANGELOG_SCHEMA,
    )
    repeated = pa.concat_tables([distinct, distinct.slice(0, m // 2)]).combine_chunks()  # same key twice: the replay sort path
    flipped = distinct.set_column(
        1, snapshot.CHANGELOG_SCHEMA.field("op_id"), pa.compute.subtract(pa.scalar(3, pa.uint64()), distinct.column("op_id"))
    )
    shared = pa.concat_tables([distinct, flipped]).combine_chunks()  # one key_bytes under two operators: the composite-key path
    single_op = distinct.filter(pa.compute.equal(distinct.column("op_id"), 1))
    other = base.take(pa.array(np.arange(0, n, 3)))  # collides with base: 8-byte operator offsets and keyed rows
    other = other.set_column(2, "value_bytes", _values(other.num_rows, 8, 3))
    odd = base.take(pa.array(np.arange(0, n, 5))).set_column(2, "value_bytes", _values(len(range(0, n, 5)), 5, 4))
    versions = snapshot.StateVersionMap({(1, "ValueState"): 2})
    blob = snapshot.write_snapshot(base, versions)
    log_blob = snapshot.write_snapshot(repeated, versions, changelog=True)
    return {
        "write": lambda: snapshot.write_snapshot(base, versions),
        "write changelog": lambda: snapshot.SnapshotArrowWriter(versions, changelog=True).write_buffer(repeated),
        "read": lambda: snapshot.read_snapshot(blob),
        "read changelog": lambda: snapshot.read_snapshot(log_blob),
        "canonicalise": lambda: snapshot.canonicalise_state_snapshot(log_blob),
        "overlay distinct": lambda: snapshot.overlay(base, distinct),
        "overlay repeated": lambda: snapshot.overlay(base, repeated),
        "overlay shared keys": lambda: snapshot.overlay(base, shared),
        "overlay single operator": lambda: snapshot.overlay(base, single_op),
        "merge": lambda: snapshot.merge_tables([base, other, odd]),
        "merge bytes": lambda: snapshot.merge_snapshot_bytes([blob, snapshot.write_snapshot(other)]),
        "filter": lambda: snapshot.filter_key_groups(base, 10, 90),
        "composite keys": lambda: snapshot.composite_keys(base.column("op_id"), base.column("key_bytes")),
        "leading bytes": lambda: snapshot.leading_bytes(base.column("key_bytes")),
    }


def snapshot_lines_executed(fn: Callable[[], object]) -> Counter:
    """How often each line of snapshot/ runs during fn()."""
    counts: Counter = Counter()

    def tracer(frame, event, arg):
        if not frame.f_code.co_filename.startswith(SNAPSHOT_DIR):
            return None
        if event == "line":
            counts[(frame.f_code.co_filename, frame.f_lineno)] += 1
        return tracer

    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
    return counts


SMALL, LARGE = workload(300), workload(3000)


@pytest.mark.parametrize("name", list(SMALL))
def test_python_work_does_not_grow_with_rows(name: str) -> None:
    small = snapshot_lines_executed(SMALL[name])
    large = snapshot_lines_executed(LARGE[name])
    assert small, "the tracer saw no snapshot/ code: the check would be vacuous"
    grown = {f"{Path(f).name}:{line}": (small[(f, line)], count) for (f, line), count in large.items() if count > small[(f, line)]}
    assert not grown, f"{name}: Python lines that run more often with 10x the rows (per-row work): {grown}"


def test_the_tracer_catches_a_per_row_loop() -> None:
    keys = [snapshot.encode_keyed_key("count", bytes([i % 256]) * 8) for i in range(50)]
    small = snapshot_lines_executed(lambda: [snapshot.decode_key(k) for k in keys[:5]])
    large = snapshot_lines_executed(lambda: [snapshot.decode_key(k) for k in keys])
    assert sum(large.values()) > sum(small.values())
