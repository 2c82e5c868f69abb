"""bench/bench_rocksdb.py --rows small --json runs end to end and reports its ratio as sane positive numbers."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120  # a small run takes a few seconds; the bound only stops a hang


def test_a_small_run_reports_the_ratio_against_the_raw_ipc_write() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_rocksdb.py"), "--rows", "20000", "--repeats", "1", "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout)
    assert out["rows"] == 20000 and out["target"] == 3.0
    for name in ("rocksdb_checkpoint_to_arrow_s", "raw_ipc_write_s", "rocksdb_iteration_s", "ratio", "iteration_ratio"):
        assert isinstance(out[name], float) and math.isfinite(out[name]) and out[name] > 0, (name, out)
    assert out["stream_bytes"] > 20000 * (8 + 11 + 32)  # every row's op_id, key and value are in the stream
    assert out["met"] == (out["ratio"] <= out["target"])  # timings at this size are noise: only the arithmetic is checked


def test_rows_must_cover_the_operators() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_rocksdb.py"), "--rows", "2"], cwd=REPO, capture_output=True, text=True,
        timeout=TIMEOUT_S, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and "--rows must be at least 4" in proc.stderr
