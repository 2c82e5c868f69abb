"""A3b: LifecycleConfig.max_write_s says "a compaction or savepoint that takes longer publishes nothing", but savepoint()
never looks at the clock. A savepoint paused between writing its folded base and its _metadata for longer than
gc_min_age_s (a stop-the-world pause, a stalled connection) has its base deleted by GC as "an interrupted savepoint",
then publishes a _metadata naming it (compaction and commits check the clock right before publishing; savepoints did not).
"""

from __future__ import annotations

import snapshot as s
from pool.core import PoolCore
from pool.domain import KeyGroupRange
from pool.lifecycle import Lifecycle, LifecycleConfig
from snapshot.errors import ClinkError, UnavailableError
from store.memory import MemoryStore
from tests.hook_store import HookStore
from tests.pool_core_helpers import OP_IDS, commit, keyed

OP = OP_IDS["window"]
FULL = KeyGroupRange(0, 127)
now = {"s": 1_000_000.0}
clock = lambda: now["s"]  # noqa: E731
inner = MemoryStore("a3b", clock_ms=lambda: int(now["s"] * 1000))
store = HookStore(inner)
config = LifecycleConfig(gc_min_age_s=3600, max_write_s=1800)
core = PoolCore(inner, clock=clock)
e = core.acquire_writer("j", FULL)[0]
commit(core, "j", 1, 0, FULL, e, [(s.ROW_PUT, OP, keyed("k"), b"v")])


def paused() -> None:
    now["s"] += 7200
    print("GC while the savepoint is paused deleted:", Lifecycle(inner, config, clock=clock).gc().deleted)


store.on("put_if_absent", "savepoints/sp/data/", paused, when="after")
try:
    info = Lifecycle(store, config, clock=clock).savepoint("j", 1, "sp")
except UnavailableError as exc:  # refused: nothing published, the file is left to GC
    assert "savepoints/sp/_metadata" not in inner.objects, "a refused savepoint was published"
    print("refused:", str(exc)[:80])
    print("ok")
    raise SystemExit(0) from None
print("savepoint returned:", info.name, "files", info.files, "(expected: UnavailableError, nothing published)")
try:
    _, m, _ = Lifecycle(inner, config, clock=clock).open_savepoint("sp")
    print("read:", Lifecycle(inner, config, clock=clock).open_savepoint("sp")[0].read_manifest_table(m).num_rows, "rows")
    print("ok")
except ClinkError as exc:
    print("reading savepoint sp failed:", type(exc).__name__, str(exc)[:110])
    print("VIOLATION (I6 for savepoints: a published savepoint names a file GC deleted)")
