"""3 `clink-pool serve` processes on one SeaweedFS bucket, 8 worker processes on all three, one pool SIGKILLed and restarted.

No error beyond the client's retries, every checkpoint left equals the union of the workers' models, maintenance runs
beside the commits, and the benchmark's quick mode prints its 3-pools / 1-pool ratio.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from store.objects import StoreConfig
from tests.multi_pool_fixtures import MAINTENANCE_ARGS, PoolGroup, pool_group
from tests.multi_pool_workload import Chaos, Workload, run_load

pytestmark = pytest.mark.seaweedfs

REPO = Path(__file__).resolve().parents[2]
BENCH_TIMEOUT_S = 240  # --quick takes ~30 s alone; the bound only stops a hang
# small enough for CI beside the whole suite: 8 workers x 8 rounds x 120 keys, a few seconds of load
WORKLOAD = Workload(job="multi-pool-load", workers=8, rounds=8, keys=120)
KILLED = 1  # pool b: the comma list's second address


@pytest.fixture
def three_pools(seaweed: StoreConfig, tmp_path: Path) -> Iterator[PoolGroup]:
    group = pool_group(seaweed, f"multi-load-{uuid.uuid4().hex[:12]}", tmp_path / "logs", 3, MAINTENANCE_ARGS)
    with group:
        yield group


def test_a_pool_killed_and_restarted_mid_run_loses_nothing(three_pools: PoolGroup, tmp_path: Path) -> None:
    group = three_pools
    chaos = Chaos(kill_index=KILLED, await_maintenance=True)
    result = run_load(group, WORKLOAD, group.address_list, tmp_path / "reports", chaos, check="all")
    logs = group.logs()
    # no error beyond retries: every worker ran all its rounds, and every exception it saw is listed here
    assert not result.errors, "\n".join(result.errors) + "\n" + logs
    assert [len(r.changes) for r in result.reports] == [WORKLOAD.rounds] * WORKLOAD.workers
    assert not result.read_mismatches, result.read_mismatches[:10]
    assert result.retries > 0, "the kill cost no retry: it missed the run"  # the kill landed among calls in flight
    # the final checkpoint, read through every pool, and every other checkpoint still listed equal the models
    assert not result.differences, "\n".join(result.differences)
    assert WORKLOAD.rounds in result.compared
    assert sorted(result.compared + result.retired) == result.complete
    assert result.final_keys == len({k for r in result.reports for k in r.model()}) > 0
    # the kill was mid-run (commits before and after it) and the pool served calls before the kill and after the restart
    kill = result.kill
    assert kill is not None and kill.exit_code == -9
    assert 0 < kill.progress_at_kill < WORKLOAD.workers * WORKLOAD.rounds
    assert kill.served_before.get("CommitCheckpoint", 0) > 0, kill.served_before
    assert sum(kill.served_after.values()) > 0, f"the restarted pool served nothing: {kill.served_after}\n{logs}"
    assert group.pools[KILLED].exit_codes[0] == -9 and all(p.running for p in group.pools)
    # the workers spread over all three pools
    assert sorted(result.served_by_pool) == ["a", "b", "c"] and all(n > 0 for n in result.served_by_pool.values()), result.served_by_pool
    # maintenance changed the job beside the commits (the last rounds commit on top of its work) and failed nowhere
    done = result.maintenance
    assert done.get("layers_folded", 0) + done.get("checkpoints_deleted", 0) > 0 and done.get("errors", 0) == 0, done
    # every pool, the restarted one too, drains and exits 0 on SIGTERM, and none logged an error
    assert group.stop() == [0, 0, 0], logs
    logged = [(pool.name, r) for pool in group.pools for r in pool.log_records() if r["level"] in ("error", "critical", "raw")]
    assert not logged, logged


def test_the_benchmark_quick_mode_prints_its_ratio() -> None:
    # its own session: a hung bench is killed with its SeaweedFS, pools and workers, not only itself
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "bench" / "bench_multi_pool.py"), "--quick"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=BENCH_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{stdout}\n{stderr[-4000:]}"
    assert "Traceback" not in stderr, stderr[-4000:]
    ratio = re.search(r"^ratio 3 pools / 1 pool: checkpoints/s (\d+\.\d\d)x, rows/s (\d+\.\d\d)x", stdout, re.M)
    assert ratio is not None, stdout
    assert float(ratio.group(1)) > 0 and float(ratio.group(2)) > 0
    rows = re.findall(r"^(1 pool|3 pools|3 pools, 1 killed) +(\d) .* = model$", stdout, re.M)
    assert rows == [("1 pool", "1"), ("3 pools", "3"), ("3 pools, 1 killed", "3")], stdout
    assert re.search(r"^kill and restart: pool b .* SIGKILLed after \d+ of 16 commits", stdout, re.M), stdout
