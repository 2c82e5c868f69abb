"""A8: removal intents have no owner. When one retention (or delete) run ends - or fails part way - its
`unretire(chosen)` drops EVERY intent on those ids, including the one a concurrent retention announced and is still
acting on. A restore then passes the "not being removed" check, registers its base, and the other retention deletes it.

(Found by the project's own simulation: PYTHONHASHSEED=0 python bench/simulate.py --start 50104 --seeds 1 -v,
"checkpoint 4, which live subtask 6 restored from, is gone"; two retention runs at steps 756 and 758.)

protocol.md I3: "A restore acquires only if its base exists and is not being removed ... Retention keeps every current
writer's base"; simulation check "live writers' bases survive".
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
inner = MemoryStore("a8")
core = PoolCore(inner)
e = core.acquire_writer("j", FULL)[0]
for cid in range(1, 6):
    commit(core, "j", cid, cid - 1, FULL, e, [(s.ROW_PUT, OP, keyed("k"), f"v{cid}".encode())])
config = LifecycleConfig(gc_min_age_s=0)

store_a, store_b = HookStore(inner), HookStore(inner)
outcome = {}


def transient_error() -> None:
    raise UnavailableError("injected: the store throttled a delete")


store_a.on("delete", "jobs/j/chk-", transient_error)


def meanwhile() -> None:  # B has announced {1, 2, 3} and is about to delete them
    try:
        Lifecycle(store_a, config).retain("j", keep_last=2)  # a second retention run (another pool, a cron job) fails
    except ClinkError as exc:
        outcome["A"] = f"{type(exc).__name__}"
    print("intents after A gave up:", inner.get("jobs/j/writers").decode().split('"retiring"')[1:] or "none")
    try:
        outcome["epoch"] = core.acquire_writer("j", FULL, restore_from=3)[0]  # the job rewinds to 3
        outcome["restore"] = "acquired"
    except ClinkError as exc:
        outcome["restore"] = f"refused: {type(exc).__name__}"


store_b.on("delete", "jobs/j/chk-1/_metadata", meanwhile)
rb = Lifecycle(store_b, config).retain("j", keep_last=2)
print("retention A:", outcome.get("A"), "| restore from 3:", outcome["restore"], "| retention B deleted", rb.deleted)
complete = [c.checkpoint_id for c in PoolCore(inner).list_checkpoints("j")]
print("complete checkpoints now:", complete, " writers:", inner.get("jobs/j/writers").decode())
if outcome["restore"] == "acquired":
    try:
        commit(PoolCore(inner), "j", 4, 3, FULL, outcome["epoch"], [(s.ROW_PUT, OP, keyed("k"), b"after-rewind")])
        print("the rewound writer's commit of 4 on parent 3: ok")
    except ClinkError as exc:
        print("the rewound writer's commit of 4 on parent 3:", type(exc).__name__, str(exc)[:100])
print("expected: the restore refused (3 is being removed) or checkpoint 3 kept")
print("VIOLATION (I3: a live writer's base was deleted)" if outcome["restore"] == "acquired" and 3 not in complete else "ok")
