"""Store requests on a commit's critical path, counted by operation, and the races the shortcuts must survive (issue 14).

Before issue 14 a commit of a single writer owning 0..127 made 10 requests (GET writers, GET parent _metadata, PUT delta,
PUT part, LIST parts, GET writers, HEAD parent, GET part, GET parent _metadata, PUT _metadata); with four writers a
non-last committer made 7 and the last 16 (a GET of each part and of the parent once per part). Each shortcut is argued
in docs/protocol.md next to the invariant it touches; the tests below pin the counts and the cases where a pool's view
is stale: another pool fenced the writer, compacted or deleted the parent, or removed the checkpoint.
"""

from __future__ import annotations

import pytest

import snapshot as s
from pool.core import PoolCore
from pool.domain import KeyGroupRange
from pool.lifecycle import Lifecycle, LifecycleConfig
from pool.protocol import remove_checkpoint
from snapshot.errors import ClinkError, FencedError, NotFoundError
from store.layout import checkpoint_prefix
from store.memory import MemoryStore
from tests.hook_store import HookStore
from tests.pool_core_helpers import OP_IDS, commit, keyed, keys_in_range, scan_dict
from tests.sim.mutants import mutant

OP = OP_IDS["window"]
FULL = KeyGroupRange(0, 127)
LOW, HIGH = KeyGroupRange(0, 63), KeyGroupRange(64, 127)
QUARTERS = [KeyGroupRange(32 * i, 32 * i + 31) for i in range(4)]
GC = LifecycleConfig(gc_min_age_s=3600)


class Clock:
    """A settable clock (seconds) for the pool, the lifecycle and the store's modification times alike."""

    def __init__(self) -> None:
        self.s = 1_800_000_000.0

    def __call__(self) -> float:
        return self.s


def row(kg: KeyGroupRange, value: bytes, tag: str = "k") -> tuple[int, int, bytes, bytes]:
    return (s.ROW_PUT, OP, keyed(keys_in_range(kg.lo, kg.hi, 1, tag)[0]), value)


def counted(store: HookStore, fn) -> tuple[dict[str, int], list[tuple[str, str]], object]:
    """The requests ``fn`` made by operation (answered or not; a hook's own are not its), their sequence, and its result."""
    store.log.clear()
    result = fn()
    ops: dict[str, int] = {}
    for op, _ in store.log:
        ops[op] = ops.get(op, 0) + 1
    return ops, list(store.log), result


def stores(clock: Clock | None = None) -> tuple[MemoryStore, HookStore]:
    inner = MemoryStore(clock_ms=(lambda: int(clock() * 1000)) if clock else None)
    return inner, HookStore(inner)


def parts_of(core: PoolCore, job: str, cid: int) -> list[tuple[int, int, int]]:
    return [(p.kg_lo, p.kg_hi, p.epoch) for p in core.resolve(job, cid)[0].parts]


# ---- the counts ------------------------------------------------------------------------------------------------------


def test_a_single_writer_commit_makes_five_requests():
    _, store = stores()
    core = PoolCore(store)
    e = core.acquire_writer("j", FULL)[0]
    commit(core, "j", 1, 0, FULL, e, [row(FULL, b"1")])
    for cid in (2, 3):
        ops, log, result = counted(store, lambda cid=cid: commit(core, "j", cid, cid - 1, FULL, e, [row(FULL, str(cid).encode())]))
        assert result.checkpoint.complete
        assert ops == {"get": 2, "put_if_absent": 3}, log  # was get 5, head 1, list 1, put_if_absent 3
        assert [(op, key.split("/", 2)[2].split("/")[-1]) for op, key in log] == [
            ("get", "_metadata"),  # the parent, read fresh: its first commit of this checkpoint in this pool (I5)
            ("put_if_absent", log[1][1].rsplit("/", 1)[1]),  # the delta
            ("put_if_absent", log[2][1].rsplit("/", 1)[1]),  # the part
            ("get", "writers"),  # after the part: decides fencing (I2) and, unchanged, stands for the listing (I1)
            ("put_if_absent", "_metadata"),
        ]


def test_a_pool_that_never_saw_the_job_reads_the_writers_table_first():
    inner, store = stores()
    e = PoolCore(inner).acquire_writer("j", FULL)[0]
    commit(PoolCore(inner), "j", 1, 0, FULL, e, [row(FULL, b"1")])
    ops, _, result = counted(store, lambda: commit(PoolCore(store), "j", 2, 1, FULL, e, [row(FULL, b"2")]))
    assert result.checkpoint.complete and ops == {"get": 3, "put_if_absent": 3}


def test_four_writers_commit_with_four_or_five_requests_each():
    _, store = stores()
    core = PoolCore(store)
    epochs = [core.acquire_writer("j", q)[0] for q in QUARTERS]
    for q, e in zip(QUARTERS, epochs, strict=True):
        commit(core, "j", 1, 0, q, e, [row(q, b"1")])
    for cid in (2, 3):
        seen = [
            counted(store, lambda q=q, e=e, cid=cid: commit(core, "j", cid, cid - 1, q, e, [row(q, b"v")]))
            for q, e in zip(QUARTERS, epochs, strict=True)
        ]
        assert [ops for ops, _, _ in seen] == [
            {"get": 2, "list": 1, "put_if_absent": 2},  # the first reads the parent (was get 3, head 1, list 1, put 2)
            {"get": 1, "list": 1, "put_if_absent": 2},  # the others build on that version while the table is unchanged
            {"get": 1, "list": 1, "put_if_absent": 2},
            {"get": 1, "put_if_absent": 3},  # the last wrote none of the parts it lacks to read (was get 11, head 1, list 1, put 3)
        ]
        assert [r.checkpoint.complete for _, _, r in seen] == [False, False, False, True]
        assert parts_of(core, "j", cid) == [(q.lo, q.hi, e) for q, e in zip(QUARTERS, epochs, strict=True)]


def test_a_last_committer_in_another_pool_reads_the_parts_it_did_not_write():
    inner, store = stores()
    writer_pool, last_pool = PoolCore(inner), PoolCore(store)
    epochs = [writer_pool.acquire_writer("j", q)[0] for q in QUARTERS]
    for q, e in zip(QUARTERS, epochs, strict=True):
        commit(writer_pool, "j", 1, 0, q, e, [row(q, b"1")])
    for q, e in zip(QUARTERS[:3], epochs[:3], strict=True):
        commit(writer_pool, "j", 2, 1, q, e, [row(q, b"2")])
    ops, log, result = counted(store, lambda: commit(last_pool, "j", 2, 1, QUARTERS[3], epochs[3], [row(QUARTERS[3], b"2")]))
    assert result.checkpoint.complete
    # writers (its first look), parent, delta, part, list, writers, the three parts, their parent once, _metadata; was 16
    assert ops == {"get": 7, "list": 1, "put_if_absent": 3}
    assert sum(1 for op, key in log if op == "get" and "/parts/" in key) == 3


# ---- stale views ------------------------------------------------------------------------------------------------------


def test_a_writer_fenced_through_another_pool_is_still_fenced_and_its_part_never_counts():
    inner, store = stores()
    pool_a, pool_b = PoolCore(store), PoolCore(inner)
    zombie = pool_a.acquire_writer("j", FULL)[0]
    commit(pool_a, "j", 1, 0, FULL, zombie, [row(FULL, b"1")])
    successor = pool_b.acquire_writer("j", FULL, restore_from=1)[0]  # pool A's table is stale from here on
    ops, log, _ = counted(store, lambda: pytest.raises(FencedError, commit, pool_a, "j", 2, 1, FULL, zombie, [row(FULL, b"zombie")]))
    # the stale table let the zombie upload (the documented cost); the table read after its part refused it
    assert ops == {"get": 2, "put_if_absent": 2} and log[-1] == ("get", "jobs/j/writers")
    assert not inner.exists("jobs/j/chk-2/_metadata")
    ops, _, _ = counted(store, lambda: pytest.raises(FencedError, commit, pool_a, "j", 2, 1, FULL, zombie, [row(FULL, b"zombie")]))
    assert ops == {"get": 1}  # pool A has seen the fence now: its next attempt uploads nothing
    for pool in (pool_a, pool_b):  # either pool completes checkpoint 2 from the successor's part alone
        done = commit(pool, "j", 2, 1, FULL, successor, [row(FULL, b"current")])
        assert done.checkpoint.complete and parts_of(pool, "j", 2) == [(0, 127, successor)]
    assert scan_dict(PoolCore(inner), "j", 2) == {(OP, row(FULL, b"")[2]): b"current"}


def test_a_part_this_pool_holds_of_a_writer_fenced_meanwhile_never_completes_a_checkpoint():
    """The HIGH commit predicts from a stale table that this pool wrote every part; the table read after its part says no."""
    inner, store = stores()
    pool_a = PoolCore(store)
    low, high = pool_a.acquire_writer("j", LOW)[0], pool_a.acquire_writer("j", HIGH)[0]
    commit(pool_a, "j", 1, 0, LOW, low, [row(LOW, b"1")])
    commit(pool_a, "j", 1, 0, HIGH, high, [row(HIGH, b"1")])
    PoolCore(inner).acquire_writer("j", LOW, restore_from=1)  # another pool fences LOW
    outcome = {}

    def high_commits() -> None:  # after the zombie's part landed, before pool A read the table again
        outcome["high"] = commit(pool_a, "j", 2, 1, HIGH, high, [row(HIGH, b"2")]).checkpoint.complete

    store.on("get", lambda key: key == "jobs/j/writers", high_commits)  # the zombie's read after its part
    with pytest.raises(FencedError):
        commit(pool_a, "j", 2, 1, LOW, low, [row(LOW, b"zombie")])
    assert outcome == {"high": False} and not inner.exists("jobs/j/chk-2/_metadata")


# ---- the parent changed by another pool --------------------------------------------------------------------------------


def test_a_parent_compacted_by_another_pool_before_the_commit_is_the_one_built_on():
    inner, store = stores()
    core = PoolCore(store)
    e = core.acquire_writer("j", FULL)[0]
    for cid in (1, 2, 3):
        commit(core, "j", cid, cid - 1, FULL, e, [row(FULL, str(cid).encode(), f"k{cid}")])
    Lifecycle(inner).compact("j", 3, force=True)  # this pool is not told
    ops, _, result = counted(store, lambda: commit(core, "j", 4, 3, FULL, e, []))
    assert result.checkpoint.complete and ops == {"get": 2, "put_if_absent": 2}
    assert core.describe_checkpoint("j", 4)[0].num_files == 1  # the compacted base, not the three layers before it


def test_a_parent_compacted_while_the_commit_carries_its_files_completes_and_keeps_them():
    clock = Clock()
    inner, store = stores(clock)
    core = PoolCore(store, clock=clock)
    e = core.acquire_writer("j", FULL)[0]
    values = {}
    for cid in (1, 2, 3):
        r = row(FULL, str(cid).encode(), f"k{cid}")
        values[(OP, r[2])] = r[3]
        commit(core, "j", cid, cid - 1, FULL, e, [r])
    clock.s += 7200  # everything written so far is past GC's minimum age
    store.on("put_if_absent", "chk-4/parts/", lambda: Lifecycle(inner, GC, clock=clock).compact("j", 3, force=True))
    ops, _, result = counted(store, lambda: commit(core, "j", 4, 3, FULL, e, []))
    # the writers table did not change, so the parent was not deleted: no HEAD; compaction keeps what it replaced (retired)
    assert result.checkpoint.complete and "head" not in ops
    clock.s += 7200
    Lifecycle(inner, GC, clock=clock).gc("j")
    assert scan_dict(PoolCore(inner), "j", 4) == values


def test_a_parent_deleted_by_another_pool_while_the_commit_carries_its_files_is_noticed():
    clock = Clock()
    inner, store = stores(clock)
    core = PoolCore(store, clock=clock)
    e = core.acquire_writer("j", FULL)[0]
    commit(core, "j", 1, 0, FULL, e, [row(FULL, b"1", "a")])
    commit(core, "j", 2, 1, FULL, e, [row(FULL, b"2", "b")])
    clock.s += 7200

    def delete_parent_then_gc() -> None:
        other = PoolCore(inner, clock=clock)
        other.delete_checkpoint("j", 2)
        other.delete_checkpoint("j", 1)
        assert Lifecycle(inner, GC, clock=clock).gc("j").deleted

    store.on("put_if_absent", "chk-3/parts/", delete_parent_then_gc)
    ops, _, _ = counted(store, lambda: pytest.raises(NotFoundError, commit, core, "j", 3, 2, FULL, e, [row(FULL, b"3", "c")]))
    assert ops["head"] == 1  # the table changed (the deletes announced themselves): the parent is looked at again
    assert not inner.exists("jobs/j/chk-3/_metadata")


# ---- two pools racing ------------------------------------------------------------------------------------------------------


def test_two_pools_racing_complete_each_checkpoint_from_parts_the_table_held_at_once():
    """Each pool holds only the parts it wrote; whichever completes lists the other's part, and a rescale through one pool
    between the two commits leaves the other's cached parts out.
    """
    inner = MemoryStore()
    pool_a, pool_b = PoolCore(inner), PoolCore(inner)
    low, high = pool_a.acquire_writer("j", LOW)[0], pool_a.acquire_writer("j", HIGH)[0]
    for cid, (first, second) in enumerate([(pool_a, pool_b), (pool_b, pool_a), (pool_a, pool_b)], start=1):
        commit(first, "j", cid, cid - 1, LOW, low, [row(LOW, f"l{cid}".encode())])
        assert commit(second, "j", cid, cid - 1, HIGH, high, [row(HIGH, f"h{cid}".encode())]).checkpoint.complete
        assert parts_of(PoolCore(inner), "j", cid) == [(0, 63, low), (64, 127, high)]
    # pool A stages LOW of 4; pool B rescales to one writer; HIGH's commit through pool A (stale) must not complete 4
    commit(pool_a, "j", 4, 3, LOW, low, [row(LOW, b"l4")])
    full = pool_b.acquire_writer("j", FULL, restore_from=3)[0]
    with pytest.raises(FencedError):
        commit(pool_a, "j", 4, 3, HIGH, high, [row(HIGH, b"h4")])
    assert not inner.exists("jobs/j/chk-4/_metadata")
    assert commit(pool_a, "j", 4, 3, FULL, full, [row(FULL, b"f4", "f")]).checkpoint.complete
    assert parts_of(pool_b, "j", 4) == [(0, 127, full)]


# ---- safeguards: each fails with its mutant (tests/sim/mutants.py) put back -------------------------------------------------


def test_safeguard_a_part_of_a_checkpoint_removed_meanwhile_is_read_not_remembered():
    """Another pool deletes incomplete checkpoint 2 (LOW's part goes) and GC frees LOW's delta; HIGH's commit through the
    pool that wrote LOW's part must not complete 2 from its memory of that part.
    """
    clock = Clock()
    inner, store = stores(clock)
    core = PoolCore(store, clock=clock)
    low, high = core.acquire_writer("j", LOW)[0], core.acquire_writer("j", HIGH)[0]
    commit(core, "j", 1, 0, LOW, low, [row(LOW, b"1")])
    commit(core, "j", 1, 0, HIGH, high, [row(HIGH, b"1")])
    commit(core, "j", 2, 1, LOW, low, [row(LOW, b"2", "two")])
    clock.s += 7200
    PoolCore(inner, clock=clock).delete_checkpoint("j", 2)
    assert Lifecycle(inner, GC, clock=clock).gc("j").deleted  # LOW's delta of 2: nothing names it any more
    try:
        complete = commit(core, "j", 2, 1, HIGH, high, [row(HIGH, b"2")]).checkpoint.complete
    except ClinkError:
        complete = False
    assert not complete or len(scan_dict(PoolCore(inner), "j", 2)) == 2


def test_safeguard_a_parent_whose_removal_is_under_way_is_looked_at_after_the_part():
    """A removal of checkpoint 2 was announced before the commit saw the table and deletes 2 while the commit carries its
    files (the table does not change meanwhile); GC frees them before the part names them.
    """
    clock = Clock()
    inner, store = stores(clock)
    core = PoolCore(store, clock=clock)
    e = core.acquire_writer("j", FULL)[0]
    commit(core, "j", 1, 0, FULL, e, [row(FULL, b"1", "a")])
    commit(core, "j", 2, 1, FULL, e, [row(FULL, b"2", "b")])
    clock.s += 7200
    remover = PoolCore(inner, clock=clock)
    with remover.fencing.removing("j", lambda table: {1, 2}, 600_000, "delete") as (_, stop_at):
        core.fencing.read("j")  # this pool has seen the announcement

        def delete_parent_then_gc() -> None:
            for cid in (2, 1):
                keys = [o.key for o in inner.list(checkpoint_prefix("j", cid))]
                assert remove_checkpoint(inner, "j", cid, keys, None, stop_at, clock)
            assert Lifecycle(inner, GC, clock=clock).gc("j").deleted

        store.on("put_if_absent", "chk-3/parts/", delete_parent_then_gc)
        try:
            complete = commit(core, "j", 3, 2, FULL, e, [row(FULL, b"3", "c")]).checkpoint.complete
        except ClinkError:
            complete = False
    assert not complete or len(scan_dict(PoolCore(inner), "j", 3)) == 3


@pytest.mark.parametrize(
    ("name", "test"),
    [
        ("staged_parts_trusted_across_removals", test_safeguard_a_part_of_a_checkpoint_removed_meanwhile_is_read_not_remembered),
        ("parent_check_skipped_during_its_removal", test_safeguard_a_parent_whose_removal_is_under_way_is_looked_at_after_the_part),
        ("known_parts_not_confirmed", test_a_part_this_pool_holds_of_a_writer_fenced_meanwhile_never_completes_a_checkpoint),
        ("writers_table_trusted_after_the_part", test_a_writer_fenced_through_another_pool_is_still_fenced_and_its_part_never_counts),
    ],
)
def test_a_safeguard_fails_with_its_shortcut_unguarded(name: str, test) -> None:
    test()  # passes on the code as it is
    with mutant(name), pytest.raises((Exception, pytest.fail.Exception)):
        test()
