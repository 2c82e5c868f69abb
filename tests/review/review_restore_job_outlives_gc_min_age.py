"""A3: restore_job copies every file of the source into the new job's data/ and writes parts and _metadata only at the
end, with no clock check. A restore that takes longer than gc_min_age_s (copying a big job) has its first copies deleted
by an ordinary GC run (they are unreferenced and old enough), and then publishes checkpoint 1 naming them.

protocol.md I6: "GC never deletes a file a checkpoint names"; the time bound covers commits (max_commit_s) and
compactions (max_write_s) but restore_job has none.
"""

from __future__ import annotations

import snapshot as s
from pool.core import PoolCore
from pool.domain import KeyGroupRange
from pool.lifecycle import Lifecycle, LifecycleConfig
from snapshot.errors import ClinkError, UnavailableError
from store.memory import MemoryStore
from tests.hook_store import HookStore
from tests.pool_core_helpers import OP_IDS, commit, keyed, scan_dict

OP = OP_IDS["window"]
FULL = KeyGroupRange(0, 127)
now = {"s": 1_000_000.0}
clock = lambda: now["s"]  # noqa: E731
inner = MemoryStore("a3", clock_ms=lambda: int(now["s"] * 1000))
store = HookStore(inner)
config = LifecycleConfig(gc_min_age_s=3600)

core = PoolCore(inner, clock=clock)
e = core.acquire_writer("src", FULL)[0]
for cid in (1, 2, 3):  # three files to copy
    commit(core, "src", cid, cid - 1, FULL, e, [(s.ROW_PUT, OP, keyed(f"k{cid}"), f"v{cid}".encode())])
expected = scan_dict(PoolCore(inner, clock=clock), "src", 3)


def copying_is_slow() -> None:  # the copy of a big job takes 2 hours; meanwhile the usual GC runs
    now["s"] += 7200
    r = Lifecycle(inner, config, clock=clock).gc()
    print("GC during the restore deleted:", r.deleted)


store.on("put_if_absent", "jobs/new/data/", copying_is_slow, when="before", skip=2)  # before the third copy
try:
    m = Lifecycle(store, config, clock=clock).restore_job("new", job="src", checkpoint_id=3)
except UnavailableError as exc:  # refused: the copies too old to trust are undone, nothing is published
    assert not inner.objects.get("jobs/new/chk-1/_metadata"), "a refused restore published a checkpoint"
    print("refused:", str(exc)[:80])
    print("ok")
    raise SystemExit(0) from None
print("restore_job returned checkpoint", m.checkpoint_id, "of job new naming", sorted(f.path for f in m.files))
try:
    got = scan_dict(PoolCore(inner, clock=clock), "new", 1)
    print("scan of new:1 =", got)
    print("expected     =", expected)
    print("ok" if got == expected else "VIOLATION (wrong answer)")
except ClinkError as exc:
    print("scan of new:1 failed:", type(exc).__name__, str(exc)[:140])
    print("expected     =", expected)
    print("VIOLATION (I6: a complete checkpoint names a file GC deleted)")
