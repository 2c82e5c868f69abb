"""A1: restore_job starts every new job's epochs at 2, so a job deleted and restored again under its old name hands out
the SAME epochs as its earlier life: a zombie writer of the earlier life is not fenced and its delta becomes visible.

Fencing.read promises: "A job's first table starts its epochs at the clock in microseconds, so a job deleted and
created again under its old name never hands out an epoch a process of its earlier life still holds."
restore_job writes WriterTable(2, ()) instead.
"""

from __future__ import annotations

import snapshot as s
from pool.core import PoolCore
from pool.domain import KeyGroupRange
from pool.lifecycle import Lifecycle, LifecycleConfig
from snapshot.errors import ClinkError
from store.memory import MemoryStore
from tests.pool_core_helpers import OP_IDS, commit, keyed, scan_dict

OP = OP_IDS["window"]
FULL = KeyGroupRange(0, 127)
K = keyed("k")


def put(key, value):
    return (s.ROW_PUT, OP, key, value)


store = MemoryStore("a1")
core = PoolCore(store)
life = Lifecycle(store, LifecycleConfig(gc_min_age_s=0))

# a source job with one checkpoint
e = core.acquire_writer("src", FULL)[0]
commit(core, "src", 1, 0, FULL, e, [put(K, b"from-source")])

# life 1 of job "x": restored from src:1, a worker acquires and commits checkpoint 2
life.restore_job("x", job="src", checkpoint_id=1)
zombie_epoch = core.acquire_writer("x", FULL, restore_from=1)[0]
commit(core, "x", 2, 1, FULL, zombie_epoch, [put(K, b"life-1")])
print("life 1 worker epoch:", zombie_epoch)

# the operator stops the job (the worker of life 1 hangs in a GC pause: a zombie), deletes its folder and restores again
for obj in list(store.list("jobs/x/")):
    store.delete(obj.key)
life.restore_job("x", job="src", checkpoint_id=1)
new_epoch = core.acquire_writer("x", FULL, restore_from=1)[0]
print("life 2 worker epoch:", new_epoch)

# the zombie of life 1 wakes up and commits its next checkpoint (parent 1) into life 2
try:
    r = commit(PoolCore(store), "x", 2, 1, FULL, zombie_epoch, [put(K, b"ZOMBIE-of-life-1")])
    print("zombie commit of checkpoint 2: complete =", r.checkpoint.complete, "(should have raised FencedError)")
except ClinkError as exc:
    print("zombie commit refused:", type(exc).__name__)

# the live worker of life 2 now commits its checkpoint 2
try:
    r = commit(PoolCore(store), "x", 2, 1, FULL, new_epoch, [put(K, b"life-2")])
    print("live commit of checkpoint 2: complete =", r.checkpoint.complete)
except ClinkError as exc:
    print("live commit of checkpoint 2 refused:", type(exc).__name__, str(exc)[:120])

got = scan_dict(PoolCore(store), "x", 0).get((OP, K))
print("latest of x reads k =", got, "  expected b'life-2' (or b'from-source'), never the zombie's value")
print("VIOLATION (I2: a fenced writer's data is visible)" if got == b"ZOMBIE-of-life-1" else "ok")
