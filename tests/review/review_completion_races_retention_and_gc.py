"""A4: complete() checks "N is not being removed" once, BEFORE it reads the parts, and nothing re-checks after it
publishes. Retention can announce the removal of the (incomplete, old) checkpoint N, delete its parts, and GC can then
delete a data file only those parts named, all between the completer's reads and its put-if-absent of _metadata:
checkpoint N becomes complete naming a deleted file (and the commit is told it completed).

protocol.md I6 ("the parent check of completion" is the only check, and it is done before _metadata is written) and
I1/I3 ("N must not be being removed").

Story (all steps are ordinary operations):
  * checkpoint 1 complete (LOW + HIGH);
  * LOW stages its part of 2; its reply is lost, so its backend ships the same rows again in 3 on parent 1;
  * 3 completes (LOW and HIGH, both on parent 1): latest = 3; 2 stays incomplete;
  * two hours later HIGH's commit of 2 arrives (a late / retried request) ...
  * ... while retention (keep_last=3) and GC run.
"""

from __future__ import annotations

import threading

import snapshot as s
from pool.core import PoolCore
from pool.domain import KeyGroupRange
from pool.lifecycle import Lifecycle, LifecycleConfig
from snapshot.errors import ClinkError
from store.memory import MemoryStore
from tests.hook_store import HookStore
from tests.pool_core_helpers import OP_IDS, commit, keyed, keys_in_range, scan_dict

OP = OP_IDS["window"]
LOW, HIGH = KeyGroupRange(0, 63), KeyGroupRange(64, 127)
now = {"s": 1_000_000.0}
clock = lambda: now["s"]  # noqa: E731
inner = MemoryStore("a4", clock_ms=lambda: int(now["s"] * 1000))
store = HookStore(inner)
config = LifecycleConfig(gc_min_age_s=3600)
kl = keyed(keys_in_range(3, 3, 1)[0])
kh = keyed(keys_in_range(100, 100, 1)[0])


def put(key, value):
    return (s.ROW_PUT, OP, key, value)


core = PoolCore(inner, clock=clock)
el, eh = core.acquire_writer("j", LOW)[0], core.acquire_writer("j", HIGH)[0]
commit(core, "j", 1, 0, LOW, el, [put(kl, b"l1")])
commit(core, "j", 1, 0, HIGH, eh, [put(kh, b"h1")])
commit(core, "j", 2, 1, LOW, el, [put(kl, b"l2")])  # staged; reply lost
commit(core, "j", 3, 1, LOW, el, [put(kl, b"l3")])
print("checkpoint 3 complete:", commit(core, "j", 3, 1, HIGH, eh, [put(kh, b"h3")]).checkpoint.complete)
now["s"] += 7200

paused, release, result = threading.Event(), threading.Event(), {}


def pause_before_publish() -> None:
    paused.set()
    release.wait(10)


store.on("put_if_absent", "jobs/j/chk-2/_metadata", pause_before_publish)


def late_high_commit() -> None:
    try:
        r = commit(PoolCore(store, clock=clock), "j", 2, 1, HIGH, eh, [put(kh, b"h2")])
        result["r"] = f"complete={r.checkpoint.complete}"
    except ClinkError as exc:
        result["r"] = f"{type(exc).__name__}: {exc}"


def start_completer_after_listing() -> None:
    t = threading.Thread(target=late_high_commit)
    result["t"] = t
    t.start()
    paused.wait(10)  # the completer has checked the removal intents, read both parts and checked their parents


store.on("list", lambda key: key == "jobs/j/", start_completer_after_listing, when="after")
r = Lifecycle(store, config, clock=clock).retain("j", keep_last=3)
print("retention deleted", r.deleted, "kept", r.kept)
g = Lifecycle(inner, config, clock=clock).gc("j")
print("GC deleted", g.deleted)
release.set()
result["t"].join()
print("late HIGH commit of 2:", result["r"])

fresh = PoolCore(inner, clock=clock)
print("complete checkpoints:", [c.checkpoint_id for c in fresh.list_checkpoints("j")])
try:
    print("scan of checkpoint 2 =", scan_dict(fresh, "j", 2), " expected {kl: l2, kh: h2}")
    print("ok")
except ClinkError as exc:
    print("scan of checkpoint 2 failed:", type(exc).__name__, str(exc)[:120])
    print("expected: either checkpoint 2 not complete (removed), or readable as {kl: b'l2', kh: b'h2'}")
    print("VIOLATION (I6: a complete checkpoint names a file GC deleted; I3: completed while being removed)")
