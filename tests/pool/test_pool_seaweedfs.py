"""End to end against a real SeaweedFS S3 gateway started by the test: conditional writes, commits, scans, point reads."""

from __future__ import annotations

import grpc
import pytest

import snapshot
from pool.server import PoolServer, PoolServerConfig
from store.objects import StoreConfig
from tests.pool_server_fixtures import OPS, RawPool, apply, changelog_bytes, keyed_keys_in, random_delta

pytestmark = pytest.mark.seaweedfs


def test_seaweedfs_honours_conditional_writes(seaweed: StoreConfig) -> None:
    from store.s3 import S3Store

    store = S3Store("clink-conditional", "root", seaweed)
    store.create_bucket()
    first = store.put_if_absent("k", b"one")
    with pytest.raises(snapshot.ConflictError):
        store.put_if_absent("k", b"two")
    assert store.get("k") == b"one"
    second = store.compare_and_swap("k", b"three", first)
    with pytest.raises(snapshot.ConflictError):
        store.compare_and_swap("k", b"four", first)  # stale etag
    assert store.get("k") == b"three"
    assert store.compare_and_swap("k", b"five", second)
    with pytest.raises(snapshot.ConflictError):
        store.compare_and_swap("absent", b"x", second)


def test_pool_end_to_end_on_seaweedfs(seaweed: StoreConfig) -> None:
    from store.s3 import S3Store

    store = S3Store("clink-pool", "pool", seaweed)
    store.create_bucket()
    server = PoolServer(PoolServerConfig(store_uri=store.uri, listen="127.0.0.1:0", store=seaweed, grace_seconds=0.5), store=store).start()
    pool = RawPool(server.address)
    try:
        import random

        rng = random.Random(21)
        job = "seaweed-job"
        keys = keyed_keys_in(0, 127, 200, seed=21) + [snapshot.encode_operator_key("offsets", b"p0")]
        epoch = pool.acquire(job)
        model: dict = {}
        models = {}
        for cid in range(1, 5):
            rows = random_delta(model, keys, rng, 80, tag=f"sw{cid}")
            model = apply(model, rows)
            assert pool.commit(job, cid, cid - 1, epoch, changelog_bytes(rows), chunk=8192).checkpoint.complete
            models[cid] = model
        for cid, expect in models.items():
            assert pool.scan(job, cid) == expect
            got = pool.multi_get(job, cid, [OPS[i % 3] for i in range(len(keys))], keys)
            assert list(got.values) == [expect.get((OPS[i % 3], k), b"") for i, k in enumerate(keys)]
        (op, key), value = next(iter(models[4].items()))
        assert pool.get(job, 0, op, key).value == value
        # the same commit repeated (a lost reply) is answered again and writes nothing; another delta for it conflicts
        assert pool.commit(job, 4, 3, epoch, changelog_bytes(rows)).bytes_written == 0
        with pytest.raises(grpc.RpcError) as excinfo:
            pool.commit(job, 4, 3, epoch, changelog_bytes([(snapshot.ROW_PUT, OPS[0], keys[0], b"other")]))
        assert excinfo.value.code() == grpc.StatusCode.ABORTED
        # a stale writer is fenced
        pool.acquire(job, 0, 10)
        with pytest.raises(grpc.RpcError) as excinfo:
            pool.commit(job, 5, 4, epoch, changelog_bytes(rows))
        assert excinfo.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert [c.checkpoint_id for c in pool.checkpoints(job)] == [1, 2, 3, 4]
    finally:
        pool.close()
        server.stop(0)
