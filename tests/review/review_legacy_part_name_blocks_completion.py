"""A6: a part staged by the earlier version (named lo-hi.json, no epoch in the name) and the retry of the same commit on
the upgraded pool (named lo-hi-eE.json) are both "valid" (same range, same held epoch): the tiling check sees the range
twice and the checkpoint can never complete, whoever commits. The retry is not recognised as a repeat (I7) either:
_repeat only looks under the new name.
"""

from __future__ import annotations

import json

import snapshot as s
from pool.core import PoolCore
from pool.domain import CommitRequest, KeyGroupRange
from store.memory import MemoryStore
from tests.pool_core_helpers import OP_IDS, OPERATOR_PAIRS, changelog, commit, keyed, keys_in_range

OP = OP_IDS["window"]
LOW, HIGH = KeyGroupRange(0, 63), KeyGroupRange(64, 127)
kl, kh = keyed(keys_in_range(3, 3, 1)[0]), keyed(keys_in_range(100, 100, 1)[0])

store = MemoryStore("a6")
core = PoolCore(store)
el, eh = core.acquire_writer("j", LOW)[0], core.acquire_writer("j", HIGH)[0]
commit(core, "j", 1, 0, LOW, el, [(s.ROW_PUT, OP, kl, b"l1")])
commit(core, "j", 1, 0, HIGH, eh, [(s.ROW_PUT, OP, kh, b"h1")])

rows = [(s.ROW_PUT, OP, kl, b"l2")]
# the earlier version stages LOW's part of 2 under its old name, then the pool is upgraded before it replies
commit(core, "j", 2, 1, LOW, el, rows)
new_name = f"jobs/j/chk-2/parts/0-63-e{el}.json"
doc = json.loads(store.get(new_name))
doc["version"] = 1
store.delete(new_name)
store.put("jobs/j/chk-2/parts/0-63.json", json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())

upgraded = PoolCore(store)
retry = upgraded.commit_checkpoint(CommitRequest("j", 2, 1, LOW, el, "", OPERATOR_PAIRS, attempt=1), [changelog(rows)])
print("LOW's retried commit of 2: repeated =", retry.repeated, "(expected True: same checkpoint, range, epoch, delta)")
r = commit(upgraded, "j", 2, 1, HIGH, eh, [(s.ROW_PUT, OP, kh, b"h2")])
print("HIGH's commit of 2: complete =", r.checkpoint.complete, " expected True")
print("staged:", sorted(o.key.rsplit("/", 1)[-1] for o in store.list("jobs/j/chk-2/parts/")))
for attempt in (2, 3):
    again = upgraded.commit_checkpoint(CommitRequest("j", 2, 1, LOW, el, "", OPERATOR_PAIRS, attempt=attempt), [changelog(rows)])
    print(f"retry {attempt}: complete = {again.checkpoint.complete}")
print("VIOLATION (liveness: checkpoint 2 can never complete; I7: the retry was not a repeat)" if not r.checkpoint.complete else "ok")
