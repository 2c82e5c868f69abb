"""RemoteReadBackend end to end through a real pool on loopback over moto: subtasks, rescale, fencing, failures, export."""

from __future__ import annotations

import dataclasses
import json
import struct
import threading
import time
import uuid

import duckdb
import grpc
import polars as pl
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

import snapshot
from client import (
    BackendConfig,
    ConflictError,
    FencedError,
    InvalidArgumentError,
    KeyedInt64State,
    MissingOperatorsError,
    NotFoundError,
    OperatorInt64State,
    PoolClient,
    RemoteReadBackend,
    RetryPolicy,
    TtlState,
    UnavailableError,
)
from tests.client_fixtures import (
    EIGHT,
    FOUR,
    OFFSET_KEY,
    OP_COUNT,
    OP_SOURCE,
    TWO,
    Model,
    free_port,
    in_range,
    keyed_keys,
    owner,
    start_pool,
    table_model,
)

KEYS = keyed_keys(400, seed=11)
FAST = BackendConfig(call_deadline_s=5, commit_deadline_s=10, retry=RetryPolicy(max_attempts=8, initial_backoff_s=0.05, max_backoff_s=0.5))


def _job() -> str:
    return f"job-{uuid.uuid4().hex[:10]}"


def _offset(i: int) -> bytes:
    return struct.pack("<q", i)


def _four_subtasks_write(address: str, job: str, tag: str, model: Model) -> list[RemoteReadBackend]:
    backends = [RemoteReadBackend.connect(address, job, r, FAST) for r in FOUR]
    for key in KEYS:
        v = f"{tag}:{key.hex()}".encode()
        backends[owner(FOUR, key)].put(OP_COUNT, key, v)
        model[(OP_COUNT, key)] = v
    backends[0].put(OP_SOURCE, OFFSET_KEY, _offset(100))
    model[(OP_SOURCE, OFFSET_KEY)] = _offset(100)
    return backends


def _check_sees_exactly(b: RemoteReadBackend, model: Model) -> None:
    lo, hi = b.key_groups
    mine = [k for k in KEYS if lo <= k[0] <= hi]
    assert b.get_many(OP_COUNT, mine) == [model.get((OP_COUNT, k)) for k in mine]
    assert b.get(OP_SOURCE, OFFSET_KEY) == model.get((OP_SOURCE, OFFSET_KEY))
    other = next(k for k in KEYS if not lo <= k[0] <= hi)
    with pytest.raises(InvalidArgumentError, match="outside this backend's range"):
        b.get(OP_COUNT, other)
    exported = table_model(snapshot.read_snapshot(b.export_arrow_snapshot()).table)
    assert exported == in_range(model, lo, hi)


def test_four_subtasks_commit_side_by_side_without_fencing_each_other(pool_address: str) -> None:
    job, model = _job(), {}
    backends = _four_subtasks_write(pool_address, job, "a", model)
    results = []
    for i, b in enumerate(backends):
        results.append(b.snapshot(1))
        # own writes stay readable while the checkpoint is still incomplete (served from the pending delta)
        k = next(k for k in KEYS if owner(FOUR, k) == i)
        assert b.get(OP_COUNT, k) == model[(OP_COUNT, k)]
    assert [r.checkpoint.complete for r in results] == [False, False, False, True]
    # checkpoint 2: only some keys change, every subtask commits again with parent 1
    for k in KEYS[::7]:
        backends[owner(FOUR, k)].erase(OP_COUNT, k)
        model.pop((OP_COUNT, k))
    backends[0].put(OP_SOURCE, OFFSET_KEY, _offset(250))
    model[(OP_SOURCE, OFFSET_KEY)] = _offset(250)
    r2 = [b.snapshot(2) for b in backends]
    assert r2[-1].checkpoint.complete and r2[-1].checkpoint.parent_id in (0, 1)
    assert all(not b.fenced and b.delta_rows == 0 for b in backends)
    for b in backends:
        b.refresh_completion()
        assert b.read_checkpoint == 2
        _check_sees_exactly(b, model)
    with RemoteReadBackend.connect(pool_address, job, (0, 127), FAST) as whole:
        whole.restore()
        assert table_model(snapshot.read_snapshot(whole.export_arrow_snapshot()).table) == model
    for b in backends:
        b.close()


@pytest.mark.parametrize("layout", [TWO, EIGHT], ids=["4-to-2", "4-to-8"])
def test_rescale_from_four_subtasks(pool_address: str, layout: list[tuple[int, int]]) -> None:
    job, model = _job(), {}
    old = _four_subtasks_write(pool_address, job, "a", model)
    for b in old:
        b.snapshot(1)
    new = [RemoteReadBackend.connect(pool_address, job, r, FAST) for r in layout]
    for b in new:
        info = b.restore(expected_operators={"word-count": OP_COUNT})
        assert info.checkpoint_id == 1 and b.delta_rows == 0
        _check_sees_exactly(b, model)  # exactly its key groups plus all operator state
    # the old layout is fenced by the new writers of overlapping ranges
    old[1].put(OP_COUNT, next(k for k in KEYS if owner(FOUR, k) == 1), b"zombie")
    with pytest.raises(FencedError):
        old[1].snapshot(2)
    # the new layout writes and completes checkpoint 2 on its own ranges
    for k in KEYS[::5]:
        new[owner(layout, k)].put(OP_COUNT, k, b"after-rescale")
        model[(OP_COUNT, k)] = b"after-rescale"
    results = [b.snapshot(2) for b in new]
    assert results[-1].checkpoint.complete
    for b in new:
        b.refresh_completion()
        _check_sees_exactly(b, model)
    blobs = [b.export_arrow_snapshot() for b in new]
    assert table_model(snapshot.read_snapshot(snapshot.merge_snapshot_bytes(blobs)).table) == model
    for b in old + new:
        b.close()


def test_writer_fenced_by_a_newer_overlapping_writer_keeps_its_delta_and_publishes_nothing(pool_address: str) -> None:
    job = _job()
    with PoolClient(pool_address) as pool:
        older = RemoteReadBackend.connect(pool, job, (0, 63), FAST)
        mine = [k for k in KEYS if k[0] <= 63][:20]
        for k in mine:
            older.put(OP_COUNT, k, b"old")
        newer = RemoteReadBackend.connect(pool, job, (32, 95), FAST)  # overlaps 32..63
        assert newer.epoch > older.epoch
        with pytest.raises(FencedError):
            older.snapshot(1)
        assert older.fenced and older.delta_rows == len(mine)  # delta kept
        assert all(older.get(OP_COUNT, k) == b"old" for k in mine)
        assert pool.list_checkpoints(job, include_incomplete=True) == []  # nothing it sent is visible
        with pytest.raises(FencedError):  # never retried into success
            older.snapshot(1)
        # a disjoint writer of the same job is not fenced by either
        other = RemoteReadBackend.connect(pool, job, (96, 127), FAST)
        assert not other.snapshot(1).checkpoint.complete
        for b in (older, newer, other):
            b.close()


def test_failed_commit_keeps_the_delta_and_the_next_checkpoint_carries_it(pool_store) -> None:
    port = free_port()
    server = start_pool(pool_store, port)
    job, model = _job(), {}
    b = RemoteReadBackend.connect(server.address, job, (0, 127), FAST)
    for k in KEYS[:50]:
        b.put(OP_COUNT, k, b"one")
        model[(OP_COUNT, k)] = b"one"
    b.snapshot(1)
    for k in KEYS[50:100]:
        b.put(OP_COUNT, k, b"two")
        model[(OP_COUNT, k)] = b"two"
    server.stop(0)
    with pytest.raises(UnavailableError):
        b.snapshot(2)
    assert b.delta_rows == 50  # kept
    b.put(OP_COUNT, KEYS[50], b"newer")  # a newer write wins over the merged-back one
    model[(OP_COUNT, KEYS[50])] = b"newer"
    assert b.get(OP_COUNT, KEYS[50]) == b"newer" and b.delta_rows == 50
    server = start_pool(pool_store, port)  # the pool comes back on the same address
    try:
        assert b.snapshot(2).checkpoint.complete
        with RemoteReadBackend.connect(server.address, job, (0, 127), FAST) as reader:
            reader.restore()
            assert reader.read_checkpoint == 2
            assert table_model(snapshot.read_snapshot(reader.export_arrow_snapshot()).table) == model
    finally:
        b.close()
        server.stop(0)


def test_writes_during_an_upload_go_to_a_fresh_delta_and_are_kept(pool_address: str) -> None:
    job = _job()
    cfg = BackendConfig(commit_chunk_bytes=64 * 1024)
    b = RemoteReadBackend.connect(pool_address, job, (0, 127), cfg)
    big = [snapshot.encode_keyed_key("big", i.to_bytes(4, "little")) for i in range(20_000)]
    for k in big:
        b.put(OP_COUNT, k, b"x" * 40)
    during: list[bytes] = []
    result: list[object] = []
    t = threading.Thread(target=lambda: result.append(b.snapshot(1)))
    t.start()
    while t.is_alive() and len(during) < 2000:
        k = KEYS[len(during) % len(KEYS)]
        b.put(OP_COUNT, k, b"during")
        during.append(k)
    t.join(30)
    assert result and result[0].checkpoint.complete
    assert all(b.get(OP_COUNT, k) == b"during" for k in set(during))
    b.snapshot(2)
    with RemoteReadBackend.connect(pool_address, job, (0, 127), FAST) as reader:
        reader.restore()
        got = reader.get_many(OP_COUNT, big[:100] + sorted(set(during)))
        assert got == [b"x" * 40] * 100 + [b"during"] * len(set(during))
    b.close()


def test_unavailable_is_retried_until_a_late_pool_comes_up(pool_store) -> None:
    port = free_port()
    servers = []
    first_failure = threading.Event()  # the pool starts only once the client has failed and backs off: no race on wall time

    def start_late() -> None:
        if first_failure.wait(30):
            servers.append(start_pool(pool_store, port))

    timer = threading.Thread(target=start_late, daemon=True)
    timer.start()
    sleeps: list[float] = []
    # a budget (~200 x up to 0.3 s) far above a pool start on a loaded box; bounded all the same
    cfg = BackendConfig(
        retry=RetryPolicy(max_attempts=200, initial_backoff_s=0.05, max_backoff_s=0.3),
        sleep=lambda s: (sleeps.append(s), first_failure.set(), time.sleep(s)),
    )
    try:
        b = RemoteReadBackend.connect(f"127.0.0.1:{port}", _job(), (0, 127), cfg)
        assert b.epoch >= 1 and b.pool.retries >= 1 and len(sleeps) == b.pool.retries
        b.put(OP_COUNT, KEYS[0], b"v")
        assert b.snapshot(1).checkpoint.complete
        b.close()
    finally:
        timer.join()
        for s in servers:
            s.stop(0)


def test_a_commit_whose_answer_was_lost_is_retried_safely_and_lands_once(
    pool_store, pool_address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = _job()
    b = RemoteReadBackend.connect(pool_address, job, (0, 127), FAST)
    b.put(OP_COUNT, KEYS[0], b"v")
    real = b.pool._stub.CommitCheckpoint
    calls = []

    class LostAnswer(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.UNAVAILABLE

        def details(self) -> str:
            return "connection reset after the request was sent"

    def lands_then_loses_the_answer(chunks, **kw):
        calls.append(1)
        response = real(chunks, **kw)
        if len(calls) == 1:
            raise LostAnswer()  # the pool committed, the client never heard
        return response

    monkeypatch.setattr(b.pool._stub, "CommitCheckpoint", lands_then_loses_the_answer)
    result = b.snapshot(1)
    # the repeat either finds the pool's idempotent answer or, on a conflict, this writer's epoch in the manifest
    assert result.attempts == 2 and result.checkpoint.complete and len(calls) == 2 and result.recovered
    assert b.delta_rows == 0 and b.read_checkpoint == 1
    _, manifest_json = b.pool.describe_checkpoint(job, 1)
    assert len(json.loads(manifest_json)["files"]) == 1  # landed once (the repeat's upload is garbage, left to GC)

    # a conflict is never taken for success: the pool answers an identical repeat as a repeat, so a conflict is real
    class Conflict(LostAnswer):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.ALREADY_EXISTS

    # ...but a conflict on a first attempt is never taken for success
    b.put(OP_COUNT, KEYS[2], b"x")
    monkeypatch.setattr(b.pool._stub, "CommitCheckpoint", lambda chunks, **kw: (_ for _ in ()).throw(Conflict()))
    with pytest.raises(ConflictError):
        b.snapshot(3)
    assert b.delta_rows == 1
    b.close()


def test_restore_is_lazy_and_reports_missing_operators_before_changing_anything(pool_address: str) -> None:
    job = _job()
    b = RemoteReadBackend.connect(pool_address, job, (0, 127), FAST)
    with pytest.raises(NotFoundError, match="no complete checkpoint"):
        b.restore(required=True)
    counts = KeyedInt64State(b, "word-count", "count")
    for i, k in enumerate(KEYS):
        counts.put(k[5:], i)
    b.snapshot(1)
    # warm-up off: this is about lazy reads (tests/client/test_warm_async_bulk.py covers the warm table)
    fresh = RemoteReadBackend.connect(pool_address, job, (0, 127), dataclasses.replace(FAST, warm_up="off"))
    fresh.put(OP_COUNT, KEYS[0], b"unsaved")
    epoch = fresh.epoch
    with pytest.raises(MissingOperatorsError, match="'dedup'"):
        fresh.restore(expected_operators={"word-count": OP_COUNT, "dedup": snapshot.operator_id("dedup")})
    assert fresh.delta_rows == 1 and fresh.epoch == epoch and fresh.read_checkpoint is None  # nothing changed
    calls = fresh.pool.calls
    fresh.restore(expected_operators={"word-count": OP_COUNT})
    assert fresh.pool.calls - calls <= 3  # metadata only: list + describe
    assert fresh.cache_stats["entries"] == 0 and fresh.delta_rows == 0
    fresh_counts = KeyedInt64State(fresh, "word-count", "count")
    assert fresh_counts.get(KEYS[3][5:]) == 3  # fetched lazily
    calls = fresh.pool.calls
    assert fresh_counts.get_many([k[5:] for k in KEYS[:10]]) == list(range(10))
    assert fresh.pool.calls - calls == 1  # nine misses (KEYS[3] is cached), one MultiGet
    fresh.put(fresh_counts.op_id, fresh_counts.key(KEYS[20][5:]), (-1).to_bytes(8, "little", signed=True))
    calls = fresh.pool.calls
    assert fresh_counts.get_many([k[5:] for k in KEYS[:10]] + [KEYS[20][5:]]) == [*range(10), -1]
    assert fresh.pool.calls == calls  # all served by the cache and the delta
    b.close()
    fresh.close()


def test_ttl_values_expire_on_read_and_are_left_out_of_exports(pool_address: str) -> None:
    now = [1_000_000]
    cfg = BackendConfig(clock_ms=lambda: now[0])
    b = RemoteReadBackend.connect(pool_address, _job(), (0, 127), cfg)
    sessions = TtlState(b, "sessions", "last-seen", ttl_ms=1000)
    plain = OperatorInt64State(b, "source", "offset")
    sessions.put(b"alice", b"A")
    sessions.put(b"bob", b"B", ttl_ms=5000)
    plain.set(42)
    b.snapshot(1)
    sessions.put(b"carol", b"C")  # in the hot delta
    assert sessions.get_many([b"alice", b"bob", b"carol"]) == [b"A", b"B", b"C"]
    now[0] += 2000
    assert sessions.get_many([b"alice", b"bob", b"carol"]) == [None, b"B", None]
    rows = table_model(snapshot.read_snapshot(b.export_arrow_snapshot()).table)
    assert set(rows) == {(sessions.op_id, sessions.key(b"bob")), (plain.op_id, plain.key())}
    assert plain.get() == 42
    b.close()


def test_export_stream_opens_in_pyarrow_duckdb_and_polars_without_clink(pool_address: str) -> None:
    job, model = _job(), {}
    backends = _four_subtasks_write(pool_address, job, "a", model)
    for b in backends:
        b.set_state_version(OP_COUNT, "ValueState", 2)
        b.snapshot(1)
    backends[0].set_state_version(OP_SOURCE, "ListState", 1)  # set after the checkpoint: still stamped on the export
    for k in KEYS[:30]:  # hot delta on top of the checkpoint
        backends[owner(FOUR, k)].put(OP_COUNT, k, b"hot")
        model[(OP_COUNT, k)] = b"hot"
    backends[2].erase(OP_COUNT, next(k for k in KEYS[30:] if owner(FOUR, k) == 2))
    model.pop((OP_COUNT, next(k for k in KEYS[30:] if owner(FOUR, k) == 2)))
    blob = snapshot.merge_snapshot_bytes([b.export_arrow_snapshot() for b in backends])

    table = ipc.open_stream(pa.BufferReader(blob)).read_all()  # plain pyarrow
    assert table.schema.metadata[b"clink.format_version"] == b"1"
    assert table.schema.metadata[b"clink.state_versions"].decode() == f"{OP_COUNT}|ValueState|2\n{OP_SOURCE}|ListState|1"
    assert table_model(table) == model

    con = duckdb.connect()
    con.register("arrow_in", table)  # DuckDB scans the Arrow table in place
    rows = con.execute("SELECT op_id, key_bytes, value_bytes FROM arrow_in").fetchall()
    assert {(o, bytes(k)): bytes(v) for o, k, v in rows} == model
    assert con.execute("SELECT count(*) FROM arrow_in WHERE value_bytes = 'hot'::BLOB").fetchone()[0] == 30

    frame = pl.read_ipc_stream(blob)
    assert frame.height == len(model)
    assert {(o, k): v for o, k, v in frame.select(["op_id", "key_bytes", "value_bytes"]).iter_rows()} == model
    for b in backends:
        b.close()


def test_connect_refuses_bad_arguments_clearly(pool_address: str) -> None:
    with pytest.raises(InvalidArgumentError, match="key-group range"):
        RemoteReadBackend.connect(pool_address, _job(), (10, 200), FAST)
    with pytest.raises(InvalidArgumentError, match="job"):
        RemoteReadBackend.connect(pool_address, "", (0, 127), FAST)
    b = RemoteReadBackend.connect(pool_address, _job(), (0, 127), FAST)
    b.snapshot(1)
    with pytest.raises(InvalidArgumentError, match="greater than the parent"):
        b.snapshot(1)
    b.close()
    with pytest.raises(InvalidArgumentError, match="closed"):
        b.put(OP_COUNT, KEYS[0], b"v")


def test_a_damaged_data_file_reaches_the_worker_as_corrupt_data_naming_the_file(pool_store, pool_address: str) -> None:
    from client import CorruptDataError

    job = _job()
    b = RemoteReadBackend.connect(pool_address, job, (0, 127), FAST)
    for k in KEYS[:50]:
        b.put(OP_COUNT, k, b"value-" + k)
    b.snapshot(1)
    data_files = [o.key for o in pool_store.list(f"jobs/{job}/data/")]
    assert len(data_files) == 1
    blob = bytearray(pool_store.get(data_files[0]))
    blob[len(blob) // 2] ^= 0xFF
    pool_store.put(data_files[0], bytes(blob))
    with RemoteReadBackend.connect(pool_address, job, (0, 127), FAST) as reader:
        reader.restore()
        with pytest.raises(CorruptDataError, match=data_files[0].rsplit("/", 1)[-1]) as raised:
            reader.get_many(OP_COUNT, KEYS[:50])
        assert reader.cache_stats["entries"] == 0  # nothing damaged was cached
    # the pool named the exact class and its attributes: the worker sees what the pool saw, not just DATA_LOSS
    from snapshot.errors import ChecksumMismatchError

    assert isinstance(raised.value, ChecksumMismatchError)
    assert data_files[0].rsplit("/", 1)[-1] in raised.value.path and raised.value.expected != raised.value.actual
    b.close()


def test_after_rewinding_a_newer_checkpoint_outside_the_lineage_is_never_read(pool_address: str) -> None:
    job = _job()
    a = RemoteReadBackend.connect(pool_address, job, (0, 63), FAST)
    b = RemoteReadBackend.connect(pool_address, job, (64, 127), FAST)
    k1, k2 = [k for k in KEYS if k[0] <= 63][:2]
    a.put(OP_COUNT, k1, b"one")
    a.snapshot(1), b.snapshot(1)
    a.put(OP_COUNT, k2, b"two")
    a.snapshot(2), b.snapshot(2)
    for x in (a, b):
        x.restore(1)  # the job rewinds to checkpoint 1; checkpoint 2 stays in the pool
    assert a.get(OP_COUNT, k2) is None
    a.put(OP_COUNT, k1, b"three")
    assert not a.snapshot(3).checkpoint.complete
    assert a.read_checkpoint == 1  # not 2, although 2 is complete and older than 3
    assert a.get_many(OP_COUNT, [k1, k2]) == [b"three", None]
    assert b.snapshot(3).checkpoint.complete
    assert a.refresh_completion() == 3
    assert a.get_many(OP_COUNT, [k1, k2]) == [b"three", None]
    a.close(), b.close()


def test_an_export_overlays_a_large_local_delta_itself_as_the_pool_would(pool_address: str, monkeypatch) -> None:
    import client.backend as backend_mod

    job, model = _job(), {}
    backends = _four_subtasks_write(pool_address, job, "a", model)
    for b in backends:
        b.snapshot(1)
    for b in backends:
        b.refresh_completion()
    b = backends[0]
    lo, hi = b.key_groups
    for key in [k for k in KEYS if lo <= k[0] <= hi][:5]:  # local changes since the checkpoint: puts and an erase
        b.put(OP_COUNT, key, b"local")
    b.erase(OP_SOURCE, OFFSET_KEY)
    by_pool = b.export_arrow_snapshot()
    monkeypatch.setattr(backend_mod, "INLINE_SCAN_DELTA_BYTES", 0)  # every delta now "too large" to send
    by_backend = b.export_arrow_snapshot()
    assert snapshot.read_snapshot(by_backend).table.equals(snapshot.read_snapshot(by_pool).table)
    assert snapshot.read_snapshot(by_backend).state_versions == snapshot.read_snapshot(by_pool).state_versions
    for x in backends:
        x.close()


def test_multi_get_batches_respect_both_bounds() -> None:
    import random

    from client.pool_client import _batches

    rng = random.Random(5)
    for _ in range(200):
        sizes = [rng.choice([0, 1, 7, 100, 5000]) for _ in range(rng.randrange(0, 60))]
        max_items, max_bytes = rng.randrange(1, 10), rng.randrange(1, 12000)
        runs = list(_batches(sizes, max_items, max_bytes))
        assert [i for lo, hi in runs for i in range(lo, hi)] == list(range(len(sizes)))  # every key once, in order
        for lo, hi in runs:
            assert 0 < hi - lo <= max_items or (not sizes and (lo, hi) == (0, 0))
            assert sum(sizes[lo:hi]) <= max_bytes or hi - lo == 1  # one key larger than the bound goes alone
