"""Lifecycle RPCs on a real loopback server over moto: Savepoint, Pin/Unpin, CompactCheckpoint, CollectGarbage and their statuses."""

from __future__ import annotations

import random

import grpc
import pytest

import snapshot as s
from pool.core import PoolCore
from pool.server import PoolServer, PoolServerConfig
from protos import remote_pool_pb2 as pb
from protos import remote_pool_pb2_grpc as pb_grpc
from tests.lifecycle_helpers import build_job, scan_savepoint


def table_of(chunks) -> dict:
    table = s.read_snapshot(b"".join(c.data for c in chunks)).table
    keys = zip(table.column("op_id").to_pylist(), table.column("key_bytes").to_pylist(), strict=True)
    return dict(zip(keys, table.column("value_bytes").to_pylist(), strict=True))


@pytest.fixture
def served(s3_store):
    server = PoolServer(PoolServerConfig(listen="127.0.0.1:0", grace_seconds=0.5), store=s3_store).start()
    channel = grpc.insecure_channel(server.address)
    try:
        yield s3_store, pb_grpc.RemotePoolStub(channel), server.address
    finally:
        channel.close()
        server.stop(0)


def test_lifecycle_rpcs(served):
    store, stub, _ = served
    models = build_job(PoolCore(store), "j", 10, random.Random(31))
    sp = stub.Savepoint(pb.SavepointRequest(job="j", checkpoint_id=7, name="rel"), timeout=30)
    assert (sp.checkpoint_id, sp.files, sp.rows) == (7, 2, len(models[7])) and sp.location == "savepoints/j/rel/"
    assert scan_savepoint(store, "j/rel") == models[7]
    pin = stub.PinCheckpoint(pb.PinCheckpointRequest(job="j", holder="backfill", ttl_seconds=60), timeout=10)
    assert pin.checkpoint_id == 10 and pin.expires_at_ms > 0
    before = table_of(stub.ScanCheckpoint(pb.ScanCheckpointRequest(job="j", checkpoint_id=10), timeout=30))
    assert before == models[10]
    res = stub.CompactCheckpoint(pb.CompactCheckpointRequest(job="j", force=True), timeout=30)
    assert res.checkpoint_id == 10 and [(r.lo, r.hi) for r in res.folded] == [(0, 63), (64, 127)] and res.files_written == 2
    # the server forgot its cached manifest: Describe shows one layer per part, and the scan answers the same
    desc = stub.DescribeCheckpoint(pb.DescribeCheckpointRequest(job="j", checkpoint_id=10), timeout=10)
    assert desc.checkpoint.num_files == 2
    assert table_of(stub.ScanCheckpoint(pb.ScanCheckpointRequest(job="j", checkpoint_id=10), timeout=30)) == before
    gc = stub.CollectGarbage(pb.CollectGarbageRequest(job="j", dry_run=True), timeout=30)
    assert list(gc.deleted) == [] and gc.referenced > 0 and gc.listed_objects > 0
    stub.UnpinCheckpoint(pb.UnpinCheckpointRequest(job="j", checkpoint_id=10, holder="backfill"), timeout=10)
    assert not list(store.list("jobs/j/pins/"))


@pytest.mark.parametrize(
    ("call", "request_", "code", "needle"),
    [
        ("Savepoint", pb.SavepointRequest(job="j", name="../up"), grpc.StatusCode.INVALID_ARGUMENT, "savepoint name"),
        ("Savepoint", pb.SavepointRequest(job="nope", name="x"), grpc.StatusCode.NOT_FOUND, "nope"),
        ("Savepoint", pb.SavepointRequest(job="j", name="taken"), grpc.StatusCode.ABORTED, "already exists"),
        ("PinCheckpoint", pb.PinCheckpointRequest(job="j", holder="h", ttl_seconds=0), grpc.StatusCode.INVALID_ARGUMENT, "ttl"),
        ("PinCheckpoint", pb.PinCheckpointRequest(job="j", checkpoint_id=99, holder="h", ttl_seconds=5), grpc.StatusCode.NOT_FOUND, "99"),
        ("UnpinCheckpoint", pb.UnpinCheckpointRequest(job="j", holder="h"), grpc.StatusCode.INVALID_ARGUMENT, "positive"),
        ("CompactCheckpoint", pb.CompactCheckpointRequest(job="a/b"), grpc.StatusCode.INVALID_ARGUMENT, "job id"),
        ("CollectGarbage", pb.CollectGarbageRequest(), grpc.StatusCode.INVALID_ARGUMENT, "job is required"),
    ],
)
def test_lifecycle_rpc_errors_map_to_status_codes(served, call, request_, code, needle):
    store, stub, _ = served
    build_job(PoolCore(store), "j", 2, random.Random(32))
    stub.Savepoint(pb.SavepointRequest(job="j", name="taken"), timeout=30)
    before = sorted(o.key for o in store.list(""))
    with pytest.raises(grpc.RpcError) as excinfo:
        getattr(stub, call)(request_, timeout=30)
    assert excinfo.value.code() == code and needle in excinfo.value.details()
    assert sorted(o.key for o in store.list("")) == before


def test_client_workers_restore_a_restored_job_at_another_parallelism(served):
    """clink-pool restore, then four RemoteReadBackend workers (the old job had two) restore, read, write and checkpoint."""
    from client.backend import RemoteReadBackend
    from pool.lifecycle import Lifecycle

    store, stub, target = served
    models = build_job(PoolCore(store), "old", 5, random.Random(33))
    life = Lifecycle(store)
    life.savepoint("old", 5, "sp")
    life.restore_job("new", savepoint="sp")
    model = dict(models[5])
    workers = [RemoteReadBackend.connect(target, "new", (32 * i, 32 * i + 31)) for i in range(4)]
    try:
        for i, w in enumerate(workers):
            w.restore()
            lo, hi = w.key_groups
            mine = [k for k in model if k[1][0] < 128 and lo <= k[1][0] <= hi]
            assert mine, "every quarter holds state"
            for op, key in mine[:5]:
                assert w.get(op, key) == model[(op, key)]  # read lazily from the restored checkpoint
            op, key = mine[0]
            w.put(op, key, f"new-{i}".encode())
            model[(op, key)] = f"new-{i}".encode()
            w.erase(*mine[1])
            model.pop(mine[1])
        for w in workers:
            w.snapshot(2)
    finally:
        for w in workers:
            w.close()
    assert table_of(stub.ScanCheckpoint(pb.ScanCheckpointRequest(job="new", checkpoint_id=2), timeout=30)) == model
