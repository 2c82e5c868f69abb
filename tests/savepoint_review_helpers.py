"""Helpers of the issue 16 review tests: job orders against a dict model, savepoints read back, CLI JSON results."""

from __future__ import annotations

import json
import random

import snapshot as s
from client import BackendConfig, RemoteReadBackend
from pool.core import PoolCore
from pool.lifecycle import LifecycleConfig
from store.checkpoint import CheckpointReader
from store.locations import open_directory
from tests.lifecycle_helpers import build_job, fresh, table_dict
from tests.pool_core_helpers import Model, keyed

NO_AGE = LifecycleConfig(gc_min_age_s=0)


def orders_job(store, checkpoints: int = 3, seed: int = 16) -> dict[int, Model]:
    """Job ``orders``: two subtasks, ``checkpoints`` incremental checkpoints with erases and operator state."""
    return build_job(PoolCore(store), "orders", checkpoints, random.Random(seed))


def savepoint_rows(directory) -> Model:
    """The rows of the savepoint at ``directory`` (a store rooted at it), read back through a fresh lifecycle."""
    loc = open_directory(directory)
    life = fresh(directory)
    return table_dict(life.read_table(CheckpointReader(loc.store, loc.job, life.context.cache), loc.manifest))


def pool_json(clink_pool_run, *args: str, code: int = 0, env=None) -> dict:
    """``clink-pool ARGS -o json``: its result when ``code`` is 0, after checking the exit code."""
    result = clink_pool_run(*args, "-o", "json", env=env)
    assert result.exit_code == code, (result.stdout, result.stderr)
    return json.loads(result.stdout) if code == 0 else {}


def verify_json(clink_run, location: str) -> tuple[int, dict]:
    """``clink savepoint verify LOCATION -o json``: (exit code, report)."""
    result = clink_run("savepoint", "verify", location, "-o", "json")
    return result.exit_code, json.loads(result.stdout)


def backend_checkpoint(address: str, job: str, named: list[str], with_rows: list[str]) -> None:
    """Checkpoint 1 of ``job`` by a backend that registers ``named`` operators and writes one row of each in ``with_rows``."""
    with RemoteReadBackend.connect(address, job, config=BackendConfig(warm_up="off")) as writer:
        for uid in named:
            writer.register_operator(uid)
        for uid in with_rows:
            writer.put(s.operator_id(uid), keyed(uid), uid.encode())
        assert writer.snapshot(1).checkpoint.complete
