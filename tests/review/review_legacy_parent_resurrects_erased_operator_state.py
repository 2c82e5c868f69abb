"""A5: after an upgrade, a checkpoint built on a legacy parent (files without as_of, written by the earlier version)
reads operator state with the old per-part merge as long as ANY legacy file is still carried: an operator-state erase
committed by the new code in one part is overridden by the other part's carried copy of the legacy value.

operator_view(): `if any(e.as_of is None ...)`: the old per-part merge for the whole checkpoint, although every file the
new code wrote has as_of and the legacy files are all older than them (I4: "files without as_of ... first").
Control: the same history with checkpoint 1 written by the current code answers correctly.
"""

from __future__ import annotations

import json

import snapshot as s
from pool.core import PoolCore
from pool.domain import KeyGroupRange
from store.memory import MemoryStore
from tests.pool_core_helpers import OP_IDS, commit, keyed, keys_in_range, op_key, scan_dict

OP = OP_IDS["window"]
LOW, HIGH = KeyGroupRange(0, 63), KeyGroupRange(64, 127)
OFFSET = op_key("offset")
K = keyed(keys_in_range(100, 100, 1)[0])


def legacyize(store: MemoryStore, job: str, cid: int) -> None:
    """Rewrite checkpoint cid as the earlier version wrote it: manifest version 1, no as_of, parts named lo-hi.json."""
    for info in list(store.list(f"jobs/{job}/chk-{cid}/")):
        doc = json.loads(store.get(info.key))
        doc["version"] = 1
        for f in doc["files"]:
            f.pop("as_of", None)
            f.pop("encoding", None) if f.get("encoding") == "streams" else None
        key = info.key
        if "/parts/" in key:
            store.delete(key)
            key = key.rsplit("-e", 1)[0] + ".json"
        store.put(key, json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())


def run(legacy: bool) -> dict:
    store = MemoryStore()
    core = PoolCore(store)
    el, eh = core.acquire_writer("j", LOW)[0], core.acquire_writer("j", HIGH)[0]
    commit(core, "j", 1, 0, LOW, el, [(s.ROW_PUT, OP, OFFSET, b"1")])  # operator state o = 1 (broadcast state: both subtasks write it)
    commit(core, "j", 1, 0, HIGH, eh, [(s.ROW_PUT, OP, K, b"h1"), (s.ROW_PUT, OP, OFFSET, b"1")])  # every subtask holds o
    if legacy:
        legacyize(store, "j", 1)
    core = PoolCore(store)  # the upgraded pool
    commit(core, "j", 2, 1, LOW, el, [(s.ROW_ERASE, OP, OFFSET, b"")])  # LOW erases o at checkpoint 2
    r = commit(core, "j", 2, 1, HIGH, eh, [(s.ROW_PUT, OP, K, b"h2")])
    assert r.checkpoint.complete
    fresh = PoolCore(store)
    found, value, _ = fresh.get("j", 2, OP, OFFSET)
    return {"get": value if found else None, "scan": scan_dict(fresh, "j", 2).get((OP, OFFSET))}


print("control (checkpoint 1 written by this version): o at checkpoint 2 =", run(False), " expected None")
got = run(True)
print("legacy parent (checkpoint 1 written by version 1): o at checkpoint 2 =", got, " expected None")
print("VIOLATION (I4 / wrong answer: an erased operator-state key is back)" if any(v is not None for v in got.values()) else "ok")
