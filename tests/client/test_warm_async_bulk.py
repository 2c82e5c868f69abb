"""Issue 15 on a real pool: put_many into the delta, the warm table after a restore, and batched asynchronous reads."""

from __future__ import annotations

import asyncio
import threading
import uuid

import numpy as np
import pyarrow as pa
import pytest

import snapshot
from client import BackendConfig, ClinkError, InvalidArgumentError, PoolClient, RemoteReadBackend, UnavailableError
from client.warm import plan_warm_up
from tests.client_fixtures import OFFSET_KEY, OP_COUNT, OP_SOURCE, OP_WINDOW, TWO, counted, held_first_call, keyed_keys

KEYS = keyed_keys(600, seed=15)


def _job() -> str:
    return f"i15-{uuid.uuid4().hex[:10]}"


def _binary(values: list[bytes]) -> pa.Array:
    return pa.array(values, pa.binary())


def _load(address: str, job: str, model: dict[tuple[int, bytes], bytes], rows: int = 400) -> None:
    """Checkpoint 1 of ``job``: ``rows`` keys of OP_COUNT and an operator-state offset, recorded in ``model``."""
    with RemoteReadBackend.connect(address, job, (0, 127), BackendConfig(warm_up="off")) as b:
        b.register_operator("word-count")
        values = [f"v1-{i}".encode() * 3 for i in range(rows)]
        b.put_many(OP_COUNT, KEYS[:rows], values)
        b.put(OP_SOURCE, OFFSET_KEY, b"offset-1")
        model.update({(OP_COUNT, k): v for k, v in zip(KEYS[:rows], values, strict=True)})
        model[(OP_SOURCE, OFFSET_KEY)] = b"offset-1"
        assert b.snapshot(1).checkpoint.complete


# -- put_many ---------------------------------------------------------------------------------------


def test_put_many_from_arrow_and_lists_reads_back_everywhere(memory_pool_address: str) -> None:
    job = _job()
    with RemoteReadBackend.connect(memory_pool_address, job) as b:
        assert b.put_many(OP_COUNT, _binary(KEYS[:300]), _binary([b"a%d" % i for i in range(300)])) == 300
        b.put(OP_COUNT, KEYS[5], b"put after")  # a later put wins over the run
        b.put_many(OP_COUNT, KEYS[290:310], [b"second run"] * 20)  # a later run wins over earlier writes
        b.erase(OP_COUNT, KEYS[0])
        b.put_many(OP_WINDOW, [KEYS[1], KEYS[1]], [b"first", b"last"])  # a key twice in one call: the last row wins
        want = {k: b"a%d" % i for i, k in enumerate(KEYS[:300])}
        want.update({KEYS[5]: b"put after", **{k: b"second run" for k in KEYS[290:310]}})
        del want[KEYS[0]]
        assert b.get_many(OP_COUNT, KEYS[:320]) == [want.get(k) for k in KEYS[:320]]
        assert b.get(OP_WINDOW, KEYS[1]) == b"last"
        exported = snapshot.read_snapshot(b.export_arrow_snapshot()).table
        assert exported.num_rows == len(want) + 1
        b.snapshot(1)
    with RemoteReadBackend.connect(memory_pool_address, job, config=BackendConfig(warm_up="off")) as fresh:
        fresh.restore()
        assert fresh.get_many(OP_COUNT, KEYS[:320]) == [want.get(k) for k in KEYS[:320]]
        assert fresh.get(OP_WINDOW, KEYS[1]) == b"last"


def test_many_put_many_calls_keep_few_runs_and_the_newest_value(memory_pool_address: str) -> None:
    with RemoteReadBackend.connect(memory_pool_address, _job()) as b:
        for round_ in range(40):
            b.put_many(OP_COUNT, KEYS[:50], [b"r%d" % round_] * 50)
            b.put(OP_COUNT, KEYS[60], b"p%d" % round_)
        assert len(b._delta.runs) <= 8  # size-tiered: a read walks few runs
        assert b.get_many(OP_COUNT, KEYS[:50]) == [b"r39"] * 50 and b.get(OP_COUNT, KEYS[60]) == b"p39"


@pytest.mark.parametrize(
    ("keys", "values", "message"),
    [
        ([KEYS[0], b""], [b"x", b"y"], "keys[1] is empty"),
        ([KEYS[0]], [b"x", b"y"], "1 keys and 2 values"),
        (pa.array([KEYS[0], None], pa.binary()), [b"x", b"y"], "keys[1] is null"),
        ([KEYS[0], KEYS[1]], pa.array([b"x", None], pa.binary()), "values[1] is null"),
        (["text"], [b"x"], "must all be bytes"),
        (pa.array([1, 2]), [b"x", b"y"], "Arrow binary array"),
        (b"one key", [b"x"], "not one bytes value"),
    ],
)
def test_put_many_refuses_bad_input_naming_it_and_writes_nothing(memory_pool_address: str, keys, values, message: str) -> None:
    with RemoteReadBackend.connect(memory_pool_address, _job()) as b:
        b.put(OP_COUNT, KEYS[0], b"kept")
        with pytest.raises(InvalidArgumentError, match=message.replace("[", r"\[").replace("]", r"\]")):
            b.put_many(OP_COUNT, keys, values)
        assert b.delta_rows == 1 and b.get(OP_COUNT, KEYS[0]) == b"kept"


def test_put_many_refuses_a_key_of_another_range(memory_pool_address: str) -> None:
    with RemoteReadBackend.connect(memory_pool_address, _job(), (0, 63)) as b:
        outside = next(k for k in KEYS if k[0] >= 64)
        with pytest.raises(InvalidArgumentError, match=rf"keys\[1\] .* is in key group {outside[0]}, outside this backend's range 0-63"):
            b.put_many(OP_COUNT, [next(k for k in KEYS if k[0] < 64), outside], [b"a", b"b"])
        assert b.delta_rows == 0


def test_a_failed_snapshot_keeps_put_many_runs_under_newer_writes(memory_pool_address: str) -> None:
    job = _job()
    b = RemoteReadBackend.connect(memory_pool_address, job)
    try:
        b.put_many(OP_COUNT, KEYS[:10], [b"old"] * 10)
        RemoteReadBackend.connect(memory_pool_address, job).close()  # a newer writer of the range fences this one
        with pytest.raises(ClinkError):
            b.snapshot(1)
        b.put_many(OP_COUNT, KEYS[5:8], [b"new"] * 3)
        assert b.get_many(OP_COUNT, KEYS[:10]) == [b"old"] * 5 + [b"new"] * 3 + [b"old"] * 2
    finally:
        b.close()


# -- warm-up ----------------------------------------------------------------------------------------


def test_checkpoint_info_reports_stored_bytes_per_key_group(memory_pool_address: str) -> None:
    job = _job()
    _load(memory_pool_address, job, {})
    with PoolClient(memory_pool_address) as pool:
        info = pool.list_checkpoints(job)[0]
    assert len(info.key_group_bytes) == 128 and info.operator_state_bytes > 0
    total = info.range_bytes(0, 127)
    assert total is not None and 0 < total <= info.total_bytes
    assert info.range_bytes(0, 63) + info.range_bytes(64, 127) == total + info.operator_state_bytes
    assert sum(info.key_group_bytes) + info.operator_state_bytes <= info.total_bytes  # segments, not file footers


def test_eager_warm_up_answers_every_read_of_the_range_without_the_pool(memory_pool_address: str) -> None:
    job, model = _job(), {}
    _load(memory_pool_address, job, model)
    with RemoteReadBackend.connect(memory_pool_address, job, (0, 63), BackendConfig(warm_up="eager")) as b:
        b.restore()
        stats = b.cache_stats
        assert stats["warm_state"] == "full" and stats["warm_key_groups"] == "0-63"
        mine = [k for k in KEYS if k[0] < 64]
        with counted(b, "multi_get_at") as calls:
            assert [b.get(OP_COUNT, k) for k in mine] == [model.get((OP_COUNT, k)) for k in mine]  # absent keys too
            assert b.get(OP_SOURCE, OFFSET_KEY) == b"offset-1"
            assert b.get_many(OP_WINDOW, mine[:20]) == [None] * 20
        assert calls[0] == 0
        assert b.cache_stats["warm_hits"] >= len(mine)
        assert b.cache_stats["warm_bytes"] <= 1.5 * b.cache_stats["warm_range_bytes"]


def test_auto_warm_up_returns_from_restore_at_once_and_reads_go_to_the_pool_meanwhile(memory_pool_address: str) -> None:
    job, model = _job(), {}
    _load(memory_pool_address, job, model)
    b = RemoteReadBackend.connect(memory_pool_address, job, config=BackendConfig(warm_up="auto"))
    try:
        with held_first_call(b, "scan_checkpoint") as (gate, entered, _):
            b.restore()  # returns while the scan is held
            assert entered.wait(10) and b.cache_stats["warm_state"] == "loading"
            with counted(b, "multi_get_at") as calls:
                assert b.get(OP_COUNT, KEYS[3]) == model[(OP_COUNT, KEYS[3])]
            assert calls[0] == 1
            gate.set()
            assert b.wait_warm(10) and b.cache_stats["warm_state"] == "full"
        with counted(b, "multi_get_at") as calls:
            assert b.get_many(OP_COUNT, KEYS[:400]) == [model[(OP_COUNT, k)] for k in KEYS[:400]]
        assert calls[0] == 0
    finally:
        b.close()


def test_warm_up_off_never_scans(memory_pool_address: str) -> None:
    job = _job()
    _load(memory_pool_address, job, {})
    with RemoteReadBackend.connect(memory_pool_address, job, config=BackendConfig(warm_up="off")) as b:
        with counted(b, "scan_checkpoint") as scans:
            b.restore()
            b.get(OP_COUNT, KEYS[0])
        assert scans[0] == 0 and b.cache_stats["warm_state"] == "off"
    with pytest.raises(InvalidArgumentError, match="warm_up must be one of auto, off, eager"):
        RemoteReadBackend.connect(memory_pool_address, job, config=BackendConfig(warm_up="lazy"))


def test_a_range_larger_than_the_cache_warms_what_fits_and_says_which(memory_pool_address: str) -> None:
    job, model = _job(), {}
    _load(memory_pool_address, job, model)
    with PoolClient(memory_pool_address) as pool:
        info = pool.list_checkpoints(job)[0]
    budget = info.range_bytes(0, 127) // 3
    with RemoteReadBackend.connect(memory_pool_address, job, config=BackendConfig(warm_up="eager", cache_bytes=budget)) as b:
        b.restore()
        stats = b.cache_stats
        assert stats["warm_state"] == "partial" and stats["warm_key_groups"]
        assert 0 < stats["warm_bytes"] <= 1.5 * budget
        assert b.get_many(OP_COUNT, KEYS[:400]) == [model[(OP_COUNT, k)] for k in KEYS[:400]]
    with RemoteReadBackend.connect(memory_pool_address, job, config=BackendConfig(warm_up="eager", cache_bytes=16)) as b:
        b.restore()
        assert b.cache_stats["warm_state"] == "none" and b.cache_stats["warm_rows"] == 0
        assert b.get(OP_COUNT, KEYS[7]) == model[(OP_COUNT, KEYS[7])]


def test_the_plan_prefers_the_most_read_key_groups() -> None:
    group_bytes = [100] * 128
    reads = [0] * 128
    reads[70], reads[3], reads[90] = 50, 40, 30
    plan = plan_warm_up(0, 127, group_bytes, 0, budget=250, reads_by_group=reads)
    assert plan.state == "partial" and plan.groups == (3, 70) and plan.expected_bytes == 200
    assert plan_warm_up(0, 127, group_bytes, 0, budget=12_800, reads_by_group=reads).state == "full"
    assert plan_warm_up(0, 127, group_bytes, 0, budget=50, reads_by_group=reads).state == "none"
    big = plan_warm_up(0, 127, [1 << 20] * 128, 0, budget=1 << 40, reads_by_group=reads)
    assert len(big.chunks) == 8 and big.chunks[0] == (0, 15)  # eight scans, each a slice of the range


def test_keys_a_later_checkpoint_changed_are_never_answered_from_the_warm_table(memory_pool_address: str) -> None:
    """The warm table holds checkpoint 1; after checkpoint 2 completes, an evicted key must not read as its old value."""
    job, model = _job(), {}
    _load(memory_pool_address, job, model)
    with PoolClient(memory_pool_address) as pool:
        budget = pool.list_checkpoints(job)[0].range_bytes(0, 127) * 2
    with RemoteReadBackend.connect(memory_pool_address, job, config=BackendConfig(warm_up="eager", cache_bytes=budget)) as b:
        b.restore()
        assert b.cache_stats["warm_state"] == "full"
        changed = KEYS[:60]
        for i, k in enumerate(changed):
            if i % 3 == 0:
                b.erase(OP_COUNT, k)
                model.pop((OP_COUNT, k))
            else:
                b.put(OP_COUNT, k, b"v2" * 200)  # big values: the LRU cannot keep them all
                model[(OP_COUNT, k)] = b"v2" * 200
        new = KEYS[400:420]
        b.put_many(OP_COUNT, new, [b"fresh"] * 20)
        model.update({(OP_COUNT, k): b"fresh" for k in new})
        assert b.snapshot(2).checkpoint.complete and b.read_checkpoint == 2
        assert b.cache_stats["warm_stale_keys"] >= 80
        assert b.get_many(OP_COUNT, KEYS[:420]) == [model.get((OP_COUNT, k)) for k in KEYS[:420]]
        assert [b.get(OP_COUNT, k) for k in KEYS[:420]] == [model.get((OP_COUNT, k)) for k in KEYS[:420]]


def test_operator_state_is_not_answered_from_the_warm_table_once_the_checkpoint_moved(memory_pool_address: str) -> None:
    job, model = _job(), {}
    _load(memory_pool_address, job, model)
    low = RemoteReadBackend.connect(memory_pool_address, job, TWO[0], BackendConfig(warm_up="eager"))
    high = RemoteReadBackend.connect(memory_pool_address, job, TWO[1], BackendConfig(warm_up="eager"))
    try:
        low.restore()
        high.restore()
        assert high.get(OP_SOURCE, OFFSET_KEY) == b"offset-1"
        low.put(OP_SOURCE, OFFSET_KEY, b"offset-2")  # operator state: another subtask's write
        low.snapshot(2)
        assert high.snapshot(2).checkpoint.complete
        assert high.get(OP_SOURCE, OFFSET_KEY) == b"offset-2"  # what the pool merged, not checkpoint 1's
    finally:
        low.close()
        high.close()


def test_rewriting_a_quarter_of_the_range_loads_the_warm_table_again(memory_pool_address: str) -> None:
    job, model = _job(), {}
    _load(memory_pool_address, job, model, rows=600)
    with RemoteReadBackend.connect(memory_pool_address, job, config=BackendConfig(warm_up="eager")) as b:
        b.restore()
        b.put_many(OP_COUNT, KEYS[:200], [b"v2"] * 200)
        model.update({(OP_COUNT, k): b"v2" for k in KEYS[:200]})
        b.snapshot(2)
        assert b.wait_warm(10)
        assert b._warm is not None and b._warm.base == 2 and b.cache_stats["warm_state"] == "full"
        assert b.cache_stats["warm_stale_keys"] == 0
        with counted(b, "multi_get_at") as calls:
            assert b.get_many(OP_COUNT, KEYS[:600]) == [model[(OP_COUNT, k)] for k in KEYS[:600]]
        assert calls[0] == 0


def test_a_failed_warm_up_says_why_and_reads_still_answer(memory_pool_address: str) -> None:
    job, model = _job(), {}
    _load(memory_pool_address, job, model)
    b = RemoteReadBackend.connect(memory_pool_address, job, config=BackendConfig(warm_up="eager"))

    def failing_scan(*args, **kwargs):
        raise UnavailableError("the pool went away mid-scan")

    b.pool.scan_checkpoint = failing_scan  # type: ignore[method-assign]
    try:
        assert b.restore().checkpoint_id == 1  # the restore itself stands
        stats = b.cache_stats
        assert stats["warm_state"] == "failed" and "went away mid-scan" in str(stats["warm_error"])
        assert b.get(OP_COUNT, KEYS[9]) == model[(OP_COUNT, KEYS[9])]
    finally:
        b.close()


def test_a_restore_during_a_warm_up_drops_the_older_load(memory_pool_address: str) -> None:
    job, model = _job(), {}
    _load(memory_pool_address, job, model)
    b = RemoteReadBackend.connect(memory_pool_address, job, config=BackendConfig(warm_up="auto"))
    try:
        with held_first_call(b, "scan_checkpoint") as (gate, entered, _):
            b.restore()
            first = b._warm
            assert entered.wait(10)  # the first attempt's scan is held...
            b.restore(key_groups=(0, 63))  # ...while a second restore starts a load of its own
            gate.set()
            assert b.wait_warm(10)
        assert b._warm is not first and b.cache_stats["warm_key_groups"] == "0-63"
        assert first is not None and first.rows == 0  # the older attempt's scan was never taken in
    finally:
        b.close()


# -- asynchronous reads -----------------------------------------------------------------------------


def test_a_thousand_concurrent_agets_are_one_multiget(memory_pool_address: str) -> None:
    job, model = _job(), {}
    _load(memory_pool_address, job, model, rows=600)
    with RemoteReadBackend.connect(memory_pool_address, job, config=BackendConfig(warm_up="off")) as b:
        b.restore()
        probe = [KEYS[i % 600] for i in range(1000)]

        async def read_all() -> list[bytes | None]:
            return await asyncio.gather(*(b.aget(OP_COUNT, k) for k in probe))

        with counted(b, "multi_get_at") as calls:
            got = asyncio.run(read_all())
        assert calls[0] == 1
        assert got == [model[(OP_COUNT, k)] for k in probe]


def test_tasks_that_each_await_one_read_share_a_multiget(memory_pool_address: str) -> None:
    job, model = _job(), {}
    _load(memory_pool_address, job, model)
    with RemoteReadBackend.connect(memory_pool_address, job, config=BackendConfig(warm_up="off")) as b:
        b.restore()

        async def one(k: bytes) -> bytes | None:
            return await b.aget(OP_COUNT, k)

        async def main() -> list[bytes | None]:
            return await asyncio.gather(*(asyncio.create_task(one(k)) for k in KEYS[:200]))

        with counted(b, "multi_get_at") as calls:
            got = asyncio.run(main())
        assert got == [model[(OP_COUNT, k)] for k in KEYS[:200]] and calls[0] <= 2


def test_get_async_from_many_threads_coalesces_and_answers_each(memory_pool_address: str) -> None:
    job, model = _job(), {}
    _load(memory_pool_address, job, model)
    config = BackendConfig(warm_up="off", read_batch_window_s=0.02)
    with RemoteReadBackend.connect(memory_pool_address, job, config=config) as b:
        b.restore()
        results: dict[bytes, bytes | None] = {}
        start = threading.Barrier(8)

        def worker(part: list[bytes]) -> None:
            start.wait()
            futures = [(k, b.get_async(OP_COUNT, k)) for k in part]
            for k, f in futures:
                results[k] = f.result(timeout=10)

        with counted(b, "multi_get_at") as calls:
            threads = [threading.Thread(target=worker, args=(KEYS[i * 50 : i * 50 + 50],)) for i in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(20)
        assert results == {k: model[(OP_COUNT, k)] for k in KEYS[:400]}
        assert calls[0] < 400 // 4  # batched: far fewer MultiGets than reads


def test_an_async_read_sees_every_earlier_write_and_none_after_it(memory_pool_address: str) -> None:
    job, model = _job(), {}
    _load(memory_pool_address, job, model)
    with RemoteReadBackend.connect(memory_pool_address, job, config=BackendConfig(warm_up="off")) as b:
        b.restore()
        k = KEYS[11]

        async def scenario() -> tuple:
            before = b.aget(OP_COUNT, k)  # goes to the pool: checkpoint 1's value
            b.put(OP_COUNT, k, b"later")
            after_put = b.aget(OP_COUNT, k)
            b.erase(OP_COUNT, k)
            after_erase = b.aget(OP_COUNT, k)
            return await before, await after_put, await after_erase

        assert asyncio.run(scenario()) == (model[(OP_COUNT, k)], b"later", None)


def test_async_read_errors_reach_the_awaiter_and_close_fails_queued_reads(memory_pool_address: str) -> None:
    job = _job()
    _load(memory_pool_address, job, {})
    b = RemoteReadBackend.connect(memory_pool_address, job, config=BackendConfig(warm_up="off"))
    b.restore()

    def broken(*args, **kwargs):
        raise UnavailableError("pool unreachable")

    b.pool.multi_get_at = broken  # type: ignore[method-assign]
    with pytest.raises(UnavailableError, match="pool unreachable"):
        b.get_async(OP_COUNT, KEYS[0]).result(timeout=10)

    async def failing() -> None:
        await b.aget(OP_COUNT, KEYS[1])

    with pytest.raises(UnavailableError):
        asyncio.run(failing())
    with pytest.raises(InvalidArgumentError, match="outside this backend's range|op_id"):
        b.get_async(-1, KEYS[0])
    b.close()
    with pytest.raises(InvalidArgumentError, match="closed"):
        b.get_async(OP_COUNT, KEYS[0])


def test_put_many_of_arrow_arrays_makes_no_python_object_per_row(memory_pool_address: str) -> None:
    """The Arrow path keeps the caller's buffers: the delta references them instead of copying row by row."""
    n = 50_000
    raw = np.zeros((n, 9), dtype=np.uint8)
    raw[:, 0] = np.arange(n) % 128
    raw[:, 1:] = np.arange(n, dtype="<u8").view(np.uint8).reshape(n, 8)
    offsets = pa.py_buffer(np.arange(0, (n + 1) * 9, 9, dtype=np.int32))
    keys = pa.Array.from_buffers(pa.binary(), n, [None, offsets, pa.py_buffer(raw.ravel())])
    values = pa.Array.from_buffers(pa.binary(), n, [None, offsets, pa.py_buffer(raw.ravel()[::-1].copy())])
    with RemoteReadBackend.connect(memory_pool_address, _job()) as b:
        b.put_many(OP_COUNT, keys, values)
        run = b._delta.runs[-1]
        assert run.changelog.column("key_bytes").chunk(0).buffers()[2].address == keys.buffers()[2].address
        assert b.delta_rows == n and b.delta_bytes == 18 * n
        assert b.get(OP_COUNT, keys[777].as_py()) == values[777].as_py()


def test_a_checkpoint_of_per_key_writes_and_put_many_runs_under_a_warm_table(memory_pool_address: str) -> None:
    """Found by the simulation: the keys of a released delta holding both kinds of write are marked in the warm table."""
    job, model = _job(), {}
    _load(memory_pool_address, job, model)
    with RemoteReadBackend.connect(memory_pool_address, job, config=BackendConfig(warm_up="eager")) as b:
        b.restore()
        b.put(OP_COUNT, KEYS[0], b"per-key")
        b.put_many(OP_COUNT, KEYS[1:4], [b"bulk"] * 3)
        b.erase(OP_COUNT, KEYS[4])
        assert b.snapshot(2).checkpoint.complete
        model.update({(OP_COUNT, KEYS[0]): b"per-key", **{(OP_COUNT, k): b"bulk" for k in KEYS[1:4]}})
        model.pop((OP_COUNT, KEYS[4]))
        assert b.cache_stats["warm_stale_keys"] == 5
        assert b.get_many(OP_COUNT, KEYS[:400]) == [model.get((OP_COUNT, k)) for k in KEYS[:400]]


def test_async_reads_issued_before_a_write_or_a_new_attempt_answer_as_of_their_issue(memory_pool_address: str) -> None:
    """An aget batch is looked up at its flush, or earlier: a write, a completion or a restore first looks up what was issued."""
    job, model = _job(), {}
    _load(memory_pool_address, job, model)
    with RemoteReadBackend.connect(memory_pool_address, job, config=BackendConfig(warm_up="off")) as b:
        b.restore()
        b.put(OP_COUNT, KEYS[20], b"local")

        async def scenario() -> tuple:
            local_then_overwritten = b.aget(OP_COUNT, KEYS[20])
            pooled = b.aget(OP_COUNT, KEYS[21])
            b.put_many(OP_COUNT, [KEYS[20], KEYS[21]], [b"later", b"later"])
            assert b.snapshot(2).checkpoint.complete  # both writes are in checkpoint 2 now
            before_fresh = b.aget(OP_COUNT, KEYS[22])
            b.start_fresh()  # a new attempt with nothing in it
            after_fresh = b.aget(OP_COUNT, KEYS[22])
            return await local_then_overwritten, await pooled, await before_fresh, await after_fresh

        assert asyncio.run(scenario()) == (b"local", model[(OP_COUNT, KEYS[21])], model[(OP_COUNT, KEYS[22])], None)
