"""bench/bench_rocksdb.py --rows small --json runs end to end and reports its ratios (and the native RocksDB scan's) as sane numbers."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 300  # a small run takes a few seconds (the probe's compile one more); the bound only stops a hang
# where the bench can compile its native RocksDB scan probe (gcc and Debian's librocksdb-dev)
NATIVE_POSSIBLE = shutil.which("gcc") is not None and Path("/usr/include/rocksdb/c.h").is_file()
NATIVE_VARIANTS = {
    "default",
    "no_fill_cache",
    "readahead_2m",
    "no_verify_checksums",
    "perf_off",
    "split_op_id",
    "fast",
    "iterate_only",
    "threads_2",
}


def run_bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_rocksdb.py"), *args], cwd=REPO, capture_output=True, text=True,
        timeout=TIMEOUT_S, check=False,
    )  # fmt: skip


def test_a_small_run_reports_the_ratio_against_the_raw_ipc_write() -> None:
    proc = run_bench("--rows", "20000", "--repeats", "1", "--json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout)
    assert out["rows"] == 20000 and out["target"] == 3.0
    for name in ("rocksdb_checkpoint_to_arrow_s", "raw_ipc_write_s", "rocksdb_iteration_s", "ratio", "iteration_ratio"):
        assert isinstance(out[name], float) and math.isfinite(out[name]) and out[name] > 0, (name, out)
    assert out["stream_bytes"] > 20000 * (8 + 11 + 32)  # every row's op_id, key and value are in the stream
    assert out["met"] == (out["ratio"] <= out["target"])  # timings at this size are noise: only the arithmetic is checked
    # the native probe runs wherever it can be built (the bench asserted its rows, bytes and buffers equal the render's)
    assert out["native_available"] is NATIVE_POSSIBLE, out.get("native_reason")
    if NATIVE_POSSIBLE:
        scans = out["native_scan_s"]
        assert set(scans) == NATIVE_VARIANTS
        assert all(isinstance(t, float) and math.isfinite(t) and t >= 0 for t in scans.values()), scans
        assert out["native_link"] in ("static", "shared")
        assert math.isclose(out["native_ratio"], scans["default"] / out["raw_ipc_write_s"], rel_tol=0.05)
        best = out["native_best_variant"]
        assert best not in ("iterate_only", "threads_2") and scans[best] == min(
            t for n, t in scans.items() if n not in ("iterate_only", "threads_2")
        )
        iteration = out.get("copy_rocksdb_iteration_s", out["rocksdb_iteration_s"])
        assert math.isclose(out["iteration_vs_native"], iteration / scans["default"], rel_tol=0.05)
        # the read is of the checkpoint itself, or (system RocksDB older than rocksdict's) of a copy, saying why
        assert out["native_read"] == "checkpoint" or ("format_version" in out["native_open_error"] and "copy_rocksdb_iteration_s" in out)


def test_without_a_compiler_the_bench_still_runs_and_says_why_in_one_line() -> None:
    proc = run_bench("--rows", "2000", "--repeats", "1", "--cc", "no-such-compiler-cc")
    assert proc.returncode == 0, proc.stderr[-4000:]
    native = [line for line in proc.stdout.splitlines() if "native" in line]
    assert native == ["native RocksDB scan: not measured (no C compiler 'no-such-compiler-cc' on PATH)"], proc.stdout
    assert "rocksdb_checkpoint_to_arrow / raw IPC write:" in proc.stdout


def test_rows_must_cover_the_operators() -> None:
    proc = run_bench("--rows", "2")
    assert proc.returncode == 2 and "--rows must be at least 4" in proc.stderr
