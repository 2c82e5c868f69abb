"""Helpers for the lifecycle tests of pool, client and cli: a two-subtask job built against a dict model, and
checkpoints and savepoints scanned back into dicts through a fresh Lifecycle.
"""

from __future__ import annotations

import random

import snapshot as s
from pool.core import PoolCore
from pool.domain import KeyGroupRange
from pool.lifecycle import Lifecycle, LifecycleConfig
from store.local import FileStore
from store.segment_cache import SegmentCache
from tests.pool_core_helpers import OP_IDS, Model, Row, apply, commit, keyed, keys_in_range, op_key

HALVES = (KeyGroupRange(0, 63), KeyGroupRange(64, 127))
UNIVERSE = keys_in_range(0, 127, 400)
OP_KEYS = [f"o{i}" for i in range(6)]


def delta_for(rng: random.Random, model: Model, kg: KeyGroupRange, n: int, step: int, op_rows: bool, op_erase: bool = True) -> list[Row]:
    """Puts, overwrites and erases of keys in kg; operator-state rows only when op_rows (one writer of them per job)."""
    rows: list[Row] = []
    inside = [k for k in UNIVERSE if kg.lo <= s.key_group(k.encode()) <= kg.hi]
    for j in range(n):
        op = OP_IDS[rng.choice(list(OP_IDS))]
        key = op_key(rng.choice(OP_KEYS)) if op_rows and rng.random() < 0.15 else keyed(rng.choice(inside))
        if (op, key) in model and rng.random() < 0.3 and (op_erase or key[0] < 128):
            rows.append((s.ROW_ERASE, op, key, b""))
        else:
            rows.append((s.ROW_PUT, op, key, f"v{step}-{j}-{rng.random():.5f}".encode()))
    return rows


def table_dict(table) -> Model:
    keys = zip(table.column("op_id").to_pylist(), table.column("key_bytes").to_pylist(), strict=True)
    out = dict(zip(keys, table.column("value_bytes").to_pylist(), strict=True))
    assert len(out) == table.num_rows, "a key appears twice"
    return out


def fresh(store, config: LifecycleConfig | None = None) -> Lifecycle:
    """A lifecycle with an empty cache, so every read goes to the store."""
    return Lifecycle(store, config, cache=SegmentCache(64 << 20))


def scan_checkpoint(store, job: str, cid: int, kg: tuple[int, int] | None = None) -> Model:
    life = fresh(store)
    reader, manifest, _ = life.open_checkpoint(job, cid)
    return table_dict(life.read_table(reader, manifest, kg))


def scan_savepoint(store, name: str, kg: tuple[int, int] | None = None) -> Model:
    life = fresh(store)
    reader, manifest, _ = life.open_savepoint(name)
    return table_dict(life.read_table(reader, manifest, kg))


def build_job(core: PoolCore, job: str, checkpoints: int, rng: random.Random, rows: int = 30) -> dict[int, Model]:
    """Two subtasks commit `checkpoints` incremental checkpoints; returns the model of each."""
    epochs = [core.acquire_writer(job, kg)[0] for kg in HALVES]
    model: Model = {}
    models = {}
    for cid in range(1, checkpoints + 1):
        for i, kg in enumerate(HALVES):
            rows_ = delta_for(rng, model, kg, rows, cid, op_rows=i == 0)
            apply(model, rows_)
            commit(core, job, cid, cid - 1, kg, epochs[i], rows_)
        models[cid] = dict(model)
    return models


def file_job(root, checkpoints: int, seed: int = 21) -> tuple[FileStore, str, dict[int, Model]]:
    """A file store at ``root`` holding job orders (two subtasks, ``checkpoints`` checkpoints): (store, its URI, models)."""
    store = FileStore(root)
    return store, f"file://{root}", build_job(PoolCore(store), "orders", checkpoints, random.Random(seed))
