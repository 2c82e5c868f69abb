"""A7: restore records only ever abandon ids ABOVE their base, and an older record is never lifted. After a rewind that
reused ids (2 -> 3', 4'), an operator restores the job from the first attempt's checkpoint 5 (still retained). The
writer's own base 5 stays "abandoned" and latest is 4' - the attempt the operator just rolled back - so a failover
before the next checkpoint completes (restore(None) = latest) silently resumes the rolled-back lineage.

protocol.md I3: "checkpoints a rewind left behind are never latest" / "a record never abandons what the new attempt makes";
here the new attempt's base is abandoned and the lineage it left behind is latest.
"""

from __future__ import annotations

import snapshot as s
from pool.core import PoolCore
from pool.domain import KeyGroupRange
from store.memory import MemoryStore
from tests.pool_core_helpers import OP_IDS, commit, keyed

OP = OP_IDS["window"]
FULL = KeyGroupRange(0, 127)
K = keyed("k")
store = MemoryStore("a7")
core = PoolCore(store)


def put(v):
    return [(s.ROW_PUT, OP, K, v)]


e1 = core.acquire_writer("j", FULL)[0]
for cid in range(1, 6):
    commit(core, "j", cid, cid - 1, FULL, e1, put(f"attempt1-{cid}".encode()))
e2 = core.acquire_writer("j", FULL, restore_from=2)[0]  # rewind to 2: attempt 2 reuses ids 3 and 4
commit(core, "j", 3, 2, FULL, e2, put(b"attempt2-3"))
commit(core, "j", 4, 3, FULL, e2, put(b"attempt2-4 (rolled back by the operator)"))
print("before: latest =", core.reader("j").latest())

e3 = core.acquire_writer("j", FULL, restore_from=5)[0]  # the operator goes back to attempt 1's checkpoint 5
listed = {c.checkpoint_id: c.abandoned for c in PoolCore(store).list_checkpoints("j")}
latest = PoolCore(store).reader("j").latest()
print("after restoring from 5: abandoned flags =", listed)
print("latest =", latest, " expected 5 (the checkpoint the only live writer restored from)")
found, value, cid = PoolCore(store).get("j", 0, OP, K)
print(f"a failover now restores from latest = {cid} and reads k = {value!r}; expected b'attempt1-5'")
print("VIOLATION (I3: latest is a lineage the restore left behind; the live writer's base is flagged abandoned)" if latest != 5 else "ok")

print("\n-- variant without id reuse (Flink keeps counting ids after a restore) --")
store = MemoryStore("a7b")
core = PoolCore(store)
e1 = core.acquire_writer("j", FULL)[0]
for cid in range(1, 6):
    commit(core, "j", cid, cid - 1, FULL, e1, put(f"attempt1-{cid}".encode()))
e2 = core.acquire_writer("j", FULL, restore_from=2)[0]  # rewind to 2; attempt 2 makes 6 and 7
commit(core, "j", 6, 2, FULL, e2, put(b"attempt2-6"))
commit(core, "j", 7, 6, FULL, e2, put(b"attempt2-7"))
e3 = core.acquire_writer("j", FULL, restore_from=5)[0]  # the operator restores attempt 1's retained checkpoint 5
listed = {c.checkpoint_id: c.abandoned for c in PoolCore(store).list_checkpoints("j")}
latest = PoolCore(store).reader("j").latest()
print("abandoned flags =", listed)
print("latest =", latest, " expected 5")
found, value, cid = PoolCore(store).get("j", 0, OP, K)
print(f"a failover now restores from latest = {cid} and reads k = {value!r}; expected b'attempt1-5'")
print("VIOLATION (I3)" if latest != 5 else "ok")
