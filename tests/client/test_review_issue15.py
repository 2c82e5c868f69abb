"""Review of issue 15 (put_many, the warm table, asynchronous reads): each test fails on the reviewed code for its defect."""

from __future__ import annotations

import asyncio
import time
import uuid

from client import BackendConfig, PoolClient, RemoteReadBackend
from tests.client_fixtures import OP_COUNT, counted, held_first_call, keyed_keys

KEYS = keyed_keys(40, seed=1515)
# 5120 small rows spread over every key group: two-byte keys, so a row's fixed Arrow overhead dominates its bytes
SMALL_KEYS = [bytes([g, i]) for g in range(128) for i in range(40)]


def _job() -> str:
    return f"r15-{uuid.uuid4().hex[:10]}"


def _checkpoint_one(address: str, job: str, keys: list[bytes], value: bytes) -> None:
    with RemoteReadBackend.connect(address, job, config=BackendConfig(warm_up="off")) as b:
        b.put_many(OP_COUNT, keys, [value] * len(keys))
        assert b.snapshot(1).checkpoint.complete


def _range_bytes(address: str, job: str) -> int:
    with PoolClient(address) as pool:
        total = pool.list_checkpoints(job)[0].range_bytes(0, 127)
    assert total
    return total


# -- 1. the read cache keeps a value that a put_many run (or a write folded into a run) replaced ------------------------


def test_a_key_rewritten_by_put_many_is_not_read_stale_from_the_cache_after_its_checkpoint(memory_pool_address: str) -> None:
    with RemoteReadBackend.connect(memory_pool_address, _job(), config=BackendConfig(warm_up="off")) as b:
        b.put(OP_COUNT, KEYS[0], b"v1")
        assert b.snapshot(1).checkpoint.complete  # a per-key write: folded into the read cache on completion
        b.put_many(OP_COUNT, [KEYS[0]], [b"v2"])
        assert b.snapshot(2).checkpoint.complete and b.read_checkpoint == 2
        got = b.get(OP_COUNT, KEYS[0])
        assert got == b"v2", f"a put_many value checkpointed by this backend reads as {got!r}, the value it replaced"


def test_an_erase_that_a_later_put_many_pushed_into_a_run_is_not_undone_by_the_cache(memory_pool_address: str) -> None:
    job = _job()
    _checkpoint_one(memory_pool_address, job, KEYS[:10], b"v1")
    with RemoteReadBackend.connect(memory_pool_address, job, config=BackendConfig(warm_up="off")) as b:
        b.restore()
        assert b.get(OP_COUNT, KEYS[1]) == b"v1"  # read from the pool: now in the read cache
        b.erase(OP_COUNT, KEYS[1])  # a per-key erase...
        b.put_many(OP_COUNT, [KEYS[2]], [b"other"])  # ...that this bulk write turns into a run beneath it
        assert b.snapshot(2).checkpoint.complete and b.read_checkpoint == 2
        got = b.get(OP_COUNT, KEYS[1])
        assert got is None, f"a key this backend erased (and checkpointed) reads as {got!r} from the read cache"


# -- 2. a cancelled get_async future kills the one fetch thread: every later read hangs ------------------------------


def test_a_cancelled_get_async_future_does_not_stop_other_reads(memory_pool_address: str) -> None:
    job = _job()
    _checkpoint_one(memory_pool_address, job, KEYS[:10], b"v1")
    b = RemoteReadBackend.connect(memory_pool_address, job, config=BackendConfig(warm_up="off", read_batch_window_s=0.05))
    try:
        b.restore()
        abandoned = b.get_async(OP_COUNT, KEYS[0])
        assert abandoned.cancel()  # the caller gave up on it (a timeout, say) before it was answered
        other = b.get_async(OP_COUNT, KEYS[1])
        try:
            got = other.result(timeout=3)
        except TimeoutError:
            got = "never answered"
        assert got == b"v1", f"a read batched with a cancelled one: {got!r} (the fetch thread died setting the cancelled future)"
        later = b.get_async(OP_COUNT, KEYS[2])
        try:
            got = later.result(timeout=3)
        except TimeoutError:
            got = "never answered"
        assert got == b"v1", f"a read after the cancellation: {got!r}"
    finally:
        b.close()


# -- 3. asynchronous reads are answered at the read checkpoint of their fetch, not of their issue -----------------------


def test_aget_does_not_see_a_write_checkpointed_after_it_was_issued(memory_pool_address: str) -> None:
    job = _job()
    _checkpoint_one(memory_pool_address, job, KEYS[:10], b"v1")
    with RemoteReadBackend.connect(memory_pool_address, job, config=BackendConfig(warm_up="off")) as b:
        b.restore()

        async def scenario() -> bytes | None:
            issued = b.aget(OP_COUNT, KEYS[3])  # no local layer holds it: batched for the pool
            b.put(OP_COUNT, KEYS[3], b"written after the read")
            assert b.snapshot(2).checkpoint.complete and b.read_checkpoint == 2
            return await issued

        got = asyncio.run(scenario())
        assert got == b"v1", f"aget issued before a write answered {got!r}: the write made after it"


def test_get_async_does_not_see_a_write_checkpointed_after_it_was_issued(memory_pool_address: str) -> None:
    job = _job()
    _checkpoint_one(memory_pool_address, job, KEYS[:10], b"v1")
    with RemoteReadBackend.connect(memory_pool_address, job, config=BackendConfig(warm_up="off")) as b:
        b.restore()
        with held_first_call(b, "multi_get_at") as (gate, entered, _):
            busy = b.get_async(OP_COUNT, KEYS[4])  # the fetch thread is busy with this one
            assert entered.wait(10)
            issued = b.get_async(OP_COUNT, KEYS[5])  # queued behind it
            b.put(OP_COUNT, KEYS[5], b"written after the read")
            assert b.snapshot(2).checkpoint.complete and b.read_checkpoint == 2
            gate.set()
            assert busy.result(timeout=10) == b"v1"
            got = issued.result(timeout=10)
        assert got == b"v1", f"get_async issued before a write answered {got!r}: the write made after it"


# -- 4. the warm table of small rows holds far more than 1.5x the stored bytes, and more than the cache ------------------


def test_the_warm_table_of_small_rows_stays_within_one_and_a_half_times_the_stored_bytes(memory_pool_address: str) -> None:
    job = _job()
    _checkpoint_one(memory_pool_address, job, SMALL_KEYS, b"")
    stored = _range_bytes(memory_pool_address, job)
    budget = 2 * stored  # room for the rows and their index: a full warm-up
    with RemoteReadBackend.connect(memory_pool_address, job, config=BackendConfig(warm_up="eager", cache_bytes=budget)) as b:
        b.restore()
        stats = b.cache_stats
        assert stats["warm_state"] == "full", stats
        ratio = stats["warm_bytes"] / stats["warm_range_bytes"]
        assert ratio <= 1.5, (
            f"the warm table holds {ratio:.2f}x the range's stored bytes ({stats['warm_bytes']} of {stats['warm_range_bytes']})"
        )
        assert stats["warm_bytes"] <= budget, f"cache_bytes={budget} but the warm table holds {stats['warm_bytes']}"
    with RemoteReadBackend.connect(memory_pool_address, job, config=BackendConfig(warm_up="eager", cache_bytes=stored)) as b:
        b.restore()  # the stored bytes alone: the rows and their index do not all fit, and the table stays within the cache
        stats = b.cache_stats
        assert stats["warm_state"] == "partial" and 0 < stats["warm_bytes"] <= stored, stats


# -- 5. a partial warm-up trusts per-key-group bytes split evenly over a segment: one hot group blows the cache ------------


def test_a_partial_warm_up_stays_within_the_cache_when_one_key_group_holds_most_bytes(memory_pool_address: str) -> None:
    job = _job()
    with RemoteReadBackend.connect(memory_pool_address, job, config=BackendConfig(warm_up="off")) as b:
        b.put_many(OP_COUNT, [bytes([0]) + i.to_bytes(4, "big") for i in range(60)], [b"x" * 1000] * 60)  # ~60 KB in group 0
        b.put(OP_COUNT, bytes([127, 1]), b"y")  # one small row in group 127: one segment spans 0..127
        assert b.snapshot(1).checkpoint.complete
    budget = 4096
    with RemoteReadBackend.connect(memory_pool_address, job, config=BackendConfig(warm_up="eager", cache_bytes=budget)) as b:
        b.restore()
        stats = b.cache_stats
        assert stats["warm_state"] in ("partial", "none"), stats  # group 0's scan is larger than the cache: dropped
        assert stats["warm_bytes"] <= budget, (
            f"cache_bytes={budget}, but the partial warm table of key groups {stats['warm_key_groups']} holds {stats['warm_bytes']}"
        )


# -- 6. the reload rule counts stale keys against the rows loaded so far, and keys the table never held ------------------


def test_a_warm_table_still_loading_is_not_restarted_by_a_checkpoint_that_changed_two_percent(memory_pool_address: str) -> None:
    job = _job()
    _checkpoint_one(memory_pool_address, job, SMALL_KEYS, b"v" * 20)
    b = RemoteReadBackend.connect(memory_pool_address, job, config=BackendConfig(warm_up="auto"))
    try:
        with held_first_call(b, "scan_checkpoint") as (gate, entered, scans):
            b.restore()
            assert entered.wait(10)
            loading = b._warm
            b.put_many(OP_COUNT, SMALL_KEYS[:100], [b"w"] * 100)  # 100 of 5120 rows
            assert b.snapshot(2).checkpoint.complete
            restarted = b._warm is not loading
            gate.set()
            assert b.wait_warm(10)
        assert not restarted, (
            f"a checkpoint changing 100 of {len(SMALL_KEYS)} rows threw the loading warm table away and started over "
            f"({scans[0]} scans): with checkpoints faster than a load the table never finishes"
        )
    finally:
        b.close()


def test_writes_outside_the_partial_warm_tables_key_groups_do_not_reload_it(memory_pool_address: str) -> None:
    job = _job()
    _checkpoint_one(memory_pool_address, job, SMALL_KEYS, b"v" * 20)
    budget = _range_bytes(memory_pool_address, job) // 16
    b = RemoteReadBackend.connect(memory_pool_address, job, config=BackendConfig(warm_up="eager", cache_bytes=budget))
    try:
        b.restore()
        assert b.cache_stats["warm_state"] == "partial"
        loaded = set(b._warm.loaded_groups)
        cold = [k for k in SMALL_KEYS if k[0] not in loaded]
        with counted(b, "scan_checkpoint") as scans:
            for cid in (2, 3, 4):
                b.put_many(OP_COUNT, cold[:100], [b"new-%d" % cid] * 100)  # only key groups the warm table does not hold
                assert b.snapshot(cid).checkpoint.complete
                assert b.wait_warm(10)
        assert scans[0] == 0, f"writes to key groups the warm table never held rescanned it {scans[0]} times in 3 checkpoints"
    finally:
        b.close()


# -- 7. an eager warm-up swallows KeyboardInterrupt ---------------------------------------------------------------------


def test_an_eager_warm_up_lets_keyboard_interrupt_through(memory_pool_address: str) -> None:
    job = _job()
    _checkpoint_one(memory_pool_address, job, KEYS[:10], b"v1")
    b = RemoteReadBackend.connect(memory_pool_address, job, config=BackendConfig(warm_up="eager"))

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    b.pool.scan_checkpoint = interrupted  # type: ignore[method-assign]
    try:
        raised = None
        try:
            b.restore()
        except KeyboardInterrupt:
            raised = "KeyboardInterrupt"
        assert raised == "KeyboardInterrupt", (
            f"Ctrl-C during an eager warm-up was swallowed (warm_error={b.cache_stats.get('warm_error')!r})"
        )
    finally:
        b.close()


# -- 8. close() blocks while an asynchronous read is in flight --------------------------------------------------------


def test_close_returns_promptly_while_an_async_read_is_in_flight(memory_pool_address: str) -> None:
    job = _job()
    _checkpoint_one(memory_pool_address, job, KEYS[:10], b"v1")
    b = RemoteReadBackend.connect(memory_pool_address, job, config=BackendConfig(warm_up="off"))
    b.restore()
    with held_first_call(b, "multi_get_at") as (gate, entered, _):
        b.get_async(OP_COUNT, KEYS[0])
        assert entered.wait(10)
        started = time.monotonic()
        b.close()
        took = time.monotonic() - started
        gate.set()
    assert took < 1.0, f"close() took {took:.1f} s waiting for an asynchronous read in flight"


# -- 9. a read window of infinity is accepted, and kills the fetch thread ---------------------------------------------


def test_an_infinite_read_batch_window_is_refused(memory_pool_address: str) -> None:
    job = _job()
    _checkpoint_one(memory_pool_address, job, KEYS[:10], b"v1")
    try:
        b = RemoteReadBackend.connect(memory_pool_address, job, config=BackendConfig(warm_up="off", read_batch_window_s=float("inf")))
    except Exception:  # noqa: BLE001 - refusing the setting is the fix
        return
    try:
        b.restore()
        future = b.get_async(OP_COUNT, KEYS[0])
        try:
            got = future.result(timeout=2)
        except TimeoutError:
            got = "never answered"
        assert got == b"v1", f"read_batch_window_s=inf was accepted and a get_async was {got!r} (the fetch thread died)"
    finally:
        b.close()


# -- 10. the simulation's pool drops the per-key-group bytes: its warm-ups always take the old-pool fallback ---------------


def test_the_simulated_pool_reports_stored_bytes_per_key_group() -> None:
    from pool.domain import CheckpointInfo as PoolCheckpointInfo
    from tests.sim.adapter import client_info

    info = PoolCheckpointInfo("job", 1, 0, True, (), 0, 1, 300, 3, (), "", key_group_bytes=tuple(range(128)), operator_state_bytes=42)
    seen = client_info(info)
    assert (seen.key_group_bytes, seen.operator_state_bytes) == (info.key_group_bytes, 42), (
        "tests/sim/adapter.py client_info drops key_group_bytes/operator_state_bytes: the simulated warm-ups never plan by key group"
    )
