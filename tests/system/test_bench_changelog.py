"""bench/bench_changelog.py --keys 5000 --json runs end to end: the canonicalised changelog equals the full export, the sizes are sane."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120  # a small run takes a few seconds; the bound only stops a hang


def test_small_run_reports_a_ratio() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_changelog.py"), "--keys", "5000", "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    # exit 1 is the target missed (a small state's fixed overhead weighs more); anything else is a failure of the run
    assert proc.returncode in (0, 1), f"exit {proc.returncode}:\n{proc.stderr[-4000:]}"
    out = json.loads(proc.stdout)
    assert out["keys"] == 5000 and out["delta_rows"] == 50
    assert 0 < out["changelog_bytes"] < out["full_export_bytes"]
    assert out["ratio"] == round(out["changelog_bytes"] / out["full_export_bytes"], 5)
    assert out["met"] == (out["ratio"] <= out["target"]) and (proc.returncode == 0) == out["met"]
