"""The deterministic simulation, on a bounded budget: every seed clean, and replayable by the command it prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # seconds of simulated seeds in subprocesses


REPO = Path(__file__).resolve().parents[2]


def _simulate(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONHASHSEED="0")
    return subprocess.run([sys.executable, "bench/simulate.py", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def test_seeds_run_clean_within_the_budget():
    # about 25 s of seeds on one core, beside the rest of the suite; bench/simulate.py --seeds 10000 runs the long sweep
    done = _simulate("--seeds", "400", "--jobs", "1", "--budget-s", "25", "--json", timeout=180)
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert done.returncode == 0, done.stderr[-3000:]
    assert summary["failed"] == [] and summary["seeds"] >= 25, summary  # about 80 seeds on an idle core
    totals = summary["totals"]
    # the run exercised what the invariants are about, not an idle store
    assert totals["complete_versions"] > 0 and totals["zombie_commits"] > 0 and totals["rescales"] > 0 and totals["gc_runs"] > 0


def test_a_failing_seed_prints_the_command_that_replays_it():
    done = _simulate("--start", "7", "--seeds", "3", "--mutant", "restore_keeps_its_epoch", "--steps", "400")
    assert done.returncode == 1
    assert "FAILED seed" in done.stderr and "replay: PYTHONHASHSEED=0 python bench/simulate.py --start" in done.stderr
    replay = done.stderr.split("replay: ", 1)[1].splitlines()[0].split("python ", 1)[1].split()
    again = _simulate(*replay[1:])
    first = done.stderr.split("FAILED seed", 1)[1].splitlines()[0]
    assert again.returncode == 1 and first in again.stderr  # the same violation at the same step
