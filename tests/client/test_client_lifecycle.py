"""PoolClient's lifecycle calls end to end against a real in-process pool over moto: savepoint, pin, compact, GC."""

from __future__ import annotations

import random
import uuid

import pytest

import snapshot as s
from client.errors import ConflictError, InvalidArgumentError, NotFoundError, UnavailableError
from client.pool_client import CompactionInfo, GcInfo, PinInfo, PoolClient, PoolClientConfig, RetryPolicy, SavepointInfo
from pool.core import PoolCore
from pool.lifecycle import Lifecycle, LifecycleConfig
from pool.server import PoolServer, PoolServerConfig
from tests.client_fixtures import free_port
from tests.lifecycle_helpers import build_job, scan_savepoint, table_dict

JOB = "j"


@pytest.fixture
def served(s3_store):
    """(store, client, checkpoint models): a job of 8 checkpoints behind a pool whose GC minimum age is 0."""
    models = build_job(PoolCore(s3_store), JOB, 8, random.Random(41))
    config = PoolServerConfig(listen="127.0.0.1:0", grace_seconds=0.2, lifecycle=LifecycleConfig(gc_min_age_s=0))
    server = PoolServer(config, store=s3_store).start()
    client = PoolClient(server.address)
    try:
        yield s3_store, client, models
    finally:
        client.close()
        server.stop(0)


def _scan(client: PoolClient, checkpoint_id: int, key_groups: tuple[int, int] | None = None) -> dict:
    return table_dict(s.read_snapshot(client.scan_checkpoint(JOB, checkpoint_id, key_groups)).table)


def test_savepoint_scans_back_through_the_store_reader(served):
    store, client, models = served
    info = client.savepoint(JOB, "sp-5", checkpoint_id=5)
    assert isinstance(info, SavepointInfo)
    # written under the job's own prefix, and located relative to the store (whose URI is the operator's, not the caller's)
    assert (info.name, info.checkpoint_id, info.files, info.rows) == (f"{JOB}/sp-5", 5, 2, len(models[5]))
    assert info.location == f"savepoints/{JOB}/sp-5/" and info.bytes > 0
    assert scan_savepoint(store, f"{JOB}/sp-5") == models[5]
    latest = client.savepoint(JOB, "sp-latest")  # 0: the newest complete checkpoint
    assert latest.checkpoint_id == 8 and scan_savepoint(store, f"{JOB}/sp-latest") == models[8]
    before = sorted(o.key for o in store.list(""))
    with pytest.raises(ConflictError, match="sp-5"):
        client.savepoint(JOB, "sp-5", checkpoint_id=3)
    with pytest.raises(InvalidArgumentError, match="savepoint name"):
        client.savepoint(JOB, "../up")
    with pytest.raises(NotFoundError, match="nope"):
        client.savepoint("nope", "x")
    assert sorted(o.key for o in store.list("")) == before  # refused requests wrote nothing
    assert scan_savepoint(store, f"{JOB}/sp-5") == models[5]


def test_a_pin_protects_a_checkpoint_from_retention_until_unpinned(served):
    store, client, models = served
    pin = client.pin_checkpoint(JOB, "backfill", ttl_s=600, checkpoint_id=3)
    assert isinstance(pin, PinInfo) and pin.checkpoint_id == 3 and pin.expires_at_ms > 0
    renewed = client.pin_checkpoint(JOB, "backfill", ttl_s=1200, checkpoint_id=3)
    assert renewed.expires_at_ms > pin.expires_at_ms
    retention = Lifecycle(store, LifecycleConfig(retain_last=1))
    res = retention.retain(JOB)
    assert 3 in res.pinned and 3 not in res.deleted and set(res.deleted) == {1, 2, 4, 5, 6, 7}
    assert [c.checkpoint_id for c in client.list_checkpoints(JOB)] == [3, 8]
    assert _scan(client, 3) == models[3]  # the pinned checkpoint still reads whole after its neighbours went
    client.unpin_checkpoint(JOB, 3, "backfill")
    client.unpin_checkpoint(JOB, 3, "backfill")  # idempotent
    assert retention.retain(JOB).deleted == (3,)
    assert [c.checkpoint_id for c in client.list_checkpoints(JOB)] == [8]
    with pytest.raises(NotFoundError, match="99"):
        client.pin_checkpoint(JOB, "h", ttl_s=5, checkpoint_id=99)
    with pytest.raises(InvalidArgumentError, match="ttl"):
        client.pin_checkpoint(JOB, "h", ttl_s=0)


def test_compaction_keeps_every_answer_equal(served):
    _, client, models = served
    ranges = [None, (0, 63), (64, 127), (10, 20), (100, 100)]
    before = {kg: _scan(client, 8, kg) for kg in ranges}
    assert before[None] == models[8]
    (op, key), value = sorted(models[8].items())[0]
    layers_before = client.describe_checkpoint(JOB, 8)[0].num_files
    res = client.compact_checkpoint(JOB, force=True)
    assert isinstance(res, CompactionInfo) and res.checkpoint_id == 8
    assert res.folded == ((0, 63), (64, 127)) and res.files_written == 2 and res.bytes_written > 0
    assert client.describe_checkpoint(JOB, 8)[0].num_files == 2 < layers_before
    assert {kg: _scan(client, 8, kg) for kg in ranges} == before
    assert client.get(JOB, 8, op, key) == value
    keys = sorted(models[8])[:50]
    assert client.multi_get(JOB, 8, [o for o, _ in keys], [k for _, k in keys]) == [models[8][k] for k in keys]
    again = client.compact_checkpoint(JOB, force=True)  # a repeat (as after a lost reply) folds nothing
    assert again.folded == () and again.files_written == 0
    assert _scan(client, 8) == models[8]


def test_gc_dry_run_lists_the_orphan_and_a_real_run_deletes_only_it(served):
    store, client, models = served
    orphan = f"jobs/{JOB}/data/{uuid.uuid4().hex}.arrow"  # what a commit killed before its part named its delta leaves
    store.put(orphan, b"left by a crashed commit")
    data = {o.key for o in store.list(f"jobs/{JOB}/data/")}
    dry = client.collect_garbage(JOB, dry_run=True)
    assert isinstance(dry, GcInfo) and dry.dry_run
    assert dry.deleted == (orphan,) and dry.deleted_bytes == len(b"left by a crashed commit") and dry.referenced == len(data) - 1
    assert store.exists(orphan)  # a dry run deletes nothing
    real = client.collect_garbage(JOB)
    assert real.deleted == (orphan,) and not real.dry_run
    assert {o.key for o in store.list(f"jobs/{JOB}/data/")} == data - {orphan}
    assert client.collect_garbage(JOB).deleted == ()
    for cid in sorted(models):
        assert _scan(client, cid) == models[cid]
    with pytest.raises(InvalidArgumentError, match="job"):
        client.collect_garbage("a/b")


def test_lifecycle_calls_against_a_dead_pool_give_up_as_unavailable_after_the_retry_budget():
    sleeps: list[float] = []
    config = PoolClientConfig(call_deadline_s=2, commit_deadline_s=2, retry=RetryPolicy(max_attempts=3), sleep=sleeps.append, seed=1)
    with PoolClient(f"127.0.0.1:{free_port()}", config) as client:
        for call in (
            lambda: client.savepoint(JOB, "x"),
            lambda: client.pin_checkpoint(JOB, "h", 5),
            lambda: client.unpin_checkpoint(JOB, 1, "h"),
            lambda: client.compact_checkpoint(JOB),
            lambda: client.collect_garbage(JOB, dry_run=True),
        ):
            before = client.calls
            with pytest.raises(UnavailableError, match="gave up after 3 attempt"):
                call()
            assert client.calls - before == 3
    assert len(sleeps) == 10
