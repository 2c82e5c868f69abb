"""bench/bench_scale.py --quick --output json runs end to end and reports every figure of issue 14 as a sane positive number."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120  # --quick takes ~10-20 s; the bound only stops a hang


def positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def test_quick_run_reports_every_figure() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_scale.py"), "--quick", "--output", "json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    # exit 1 is a target missed (timings at --quick sizes are noise); anything else is a failure of the run
    assert proc.returncode in (0, 1), f"exit {proc.returncode}:\n{proc.stderr[-4000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    out = json.loads(proc.stdout)
    assert out["exit"] == proc.returncode
    assert out["key_bytes"] == 40 and out["value_bytes"] == 32

    # 1. reads vs cache size: three states, each measured cold (single gets, get_many) and steady
    reads = out["reads"]
    assert positive(reads["cache_bytes"]) and positive(reads["bytes_per_row"])
    assert [s["label"] for s in reads["sizes"]] == ["0.5x", "2x", "10x"]
    for size in reads["sizes"]:
        for name in (
            "rows",
            "stored_bytes",
            "delta_bytes",
            "commit_s",
            "cold_gets_s",
            "cold_get_many_s",
            "steady_gets_s",
            "steady_get_many_s",
        ):
            assert positive(size[name]), (size["label"], name, size[name])
        assert size["factor"] / 2 <= size["state_over_cache"] <= size["factor"] * 2, size
        assert size["cold_get_store_bytes"] >= 0 and size["cold_get_store_requests"] >= 0
    for what in ("cold_gets_s", "cold_get_many_s", "steady_gets_s", "steady_get_many_s"):
        for big in ("10x", "2x"):
            assert positive(reads["ratios"][f"{what} {big}/0.5x"]), (what, big)

    # 2. store reads per cold get at 10x the cache
    cold = out["cold_get_store_reads"]
    assert cold["at"] == "10x"
    for name in ("block_bytes", "bytes_per_get", "blocks_per_get", "requests_per_get"):
        assert positive(cold[name]), (name, cold[name])
    assert sum(cold["requests_by_op"].values()) > 0

    # 3. full-commit peak memory in fresh pool processes, one per key count
    memory = out["commit_memory"]
    # each count twice: the delta in layout order (as RemoteReadBackend sends it) and in random order
    assert [(m["keys"], m["order"]) for m in memory] == [(n, o) for n in out["config"]["memory_keys"] for o in ("layout", "random")]
    for m in memory:
        for name in ("delta_bytes", "rss_before", "peak_rss", "growth_bytes", "ratio", "commit_s"):
            assert positive(m[name]), (m["keys"], name, m[name])
        assert m["peak_rss"] > m["rss_before"]

    # 4. store requests per commit on moto, by operation, and the 1% / full time ratio
    commits = out["commit_requests"]
    for name in ("keys", "full_bytes", "delta_bytes", "full_s", "delta_s", "ratio"):
        assert positive(commits[name]), (name, commits[name])
    for kind in ("full_requests", "delta_requests"):
        counts = commits[kind]
        assert counts and all(positive(n) for n in counts.values()), (kind, counts)
        assert any(op.startswith("PUT") for op in counts), (kind, counts)  # a commit writes its delta and its part

    # 5. side by side with SlateDB (the bench extra installs it): run when it is importable, else said so by name
    slate = out["slatedb"]
    if importlib.util.find_spec("slatedb") is None:  # CI installs the test extra only
        assert slate["ran"] is False and "pip install -e '.[bench]'" in slate["reason"], slate
    else:
        assert slate["ran"] is True, slate
        for name in ("keys", "slatedb_full_s", "slatedb_delta_s", "ours_full_s", "ours_delta_s", "full_speedup", "delta_ratio"):
            assert positive(slate[name]), (name, slate[name])

    # the ratio table: every targeted figure present, with a finite value and a pass/miss mark
    targets = out["targets"]
    expected = [
        "cold gets 10x / 0.5x",
        "cold get_many 10x / 0.5x",
        "cold gets 2x / 0.5x",
        "cold get_many 2x / 0.5x",
        "store bytes per cold get at 10x, in blocks",
    ]
    if slate["ran"]:
        expected += ["1% commit / SlateDB 1% write+flush (time)", "full checkpoint speedup vs SlateDB write+flush"]
    expected += [f"commit peak RSS growth / delta bytes ({m['keys']:,} keys)" for m in memory]
    expected.append(f"1% commit / full commit time (moto, {commits['keys']:,} keys)")
    for name in expected:
        assert name in targets, (name, sorted(targets))
        assert positive(targets[name]["value"]) and isinstance(targets[name]["ok"], bool), (name, targets[name])
    assert positive(targets["store requests per cold get at 10x"]["value"])
