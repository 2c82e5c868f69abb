"""Hostile review of issue 18: the pools' own maintenance, its leases, job policies and several pool addresses.

Each strict xfail demonstrates a defect (it fails today and passes once fixed); the plain tests pin attacks that held.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterator

import pytest

import snapshot
from client.pool_client import PoolClient, PoolClientConfig
from pool.core import PoolCore
from pool.domain import KeyGroupRange
from pool.job_listing import JobListing
from pool.job_policy import JobPolicy, job_policy_key, write_job_policy
from pool.maintenance import MaintenanceConfig
from pool.maintenance_lease import lease_key
from store.layout import job_prefix
from store.memory import MemoryStore
from tests.hook_store import HookStore
from tests.lifecycle_helpers import build_job, delta_for, scan_checkpoint
from tests.pool_core_helpers import apply, commit
from tests.pool_server_fixtures import changelog_bytes
from tests.review.maintenance_review_fixtures import Clock, TwoPools, complete_ids, data_keys, maintainer_of, referenced_keys

JOB = "orders"


# ---- leases and clocks ---------------------------------------------------------------------------------------


def test_review_a_dead_holder_with_a_fast_clock_is_taken_over_within_a_few_ttls() -> None:
    clock = Clock()
    fast = Clock(offset_s=86_400.0)  # a pool whose clock is a day ahead
    store = MemoryStore(clock_ms=clock.ms)
    build_job(PoolCore(store, clock=clock), JOB, 6, random.Random(1))
    config = MaintenanceConfig(interval_s=10, lease_ttl_s=30, gc_min_age_s=60)
    ahead = maintainer_of(store, config, "ahead", fast)
    ahead.run_once()
    assert json.loads(store.get(lease_key(JOB)))["holder"] == "ahead"
    ahead.stop(release=False)  # killed: the lease stays as it was written
    survivor = maintainer_of(store, config, "survivor", clock)
    took = False
    for _ in range(30):  # 300 s of the survivor's clock: ten lease TTLs
        clock.advance(10)
        fast.advance(10)
        runs = survivor.run_once().get(JOB, [])
        if any(r.outcome != "skipped" for r in runs):
            took = True
            break
    assert took, f"after 10 TTLs the dead holder's lease still blocks the job: {store.get(lease_key(JOB))!r}"


def test_a_live_holder_keeps_its_lease_against_a_pool_with_the_same_clock() -> None:
    """Held: with agreeing clocks a second pool never starts a task while the holder renews every round."""
    clock = Clock()
    store = MemoryStore(clock_ms=clock.ms)
    build_job(PoolCore(store, clock=clock), JOB, 6, random.Random(2))
    config = MaintenanceConfig(interval_s=10, lease_ttl_s=30, gc_min_age_s=60)
    one, two = maintainer_of(store, config, "one", clock), maintainer_of(store, config, "two", clock)
    for _ in range(12):
        clock.advance(10)
        one.run_once()
        assert two.run_once().get(JOB, []) == []
    assert json.loads(store.get(lease_key(JOB)))["holder"] == "one"


# ---- metrics and status --------------------------------------------------------------------------------------


def test_review_a_gc_stopped_by_the_lease_margin_reports_the_bytes_it_freed() -> None:
    clock = Clock()
    inner = MemoryStore(clock_ms=clock.ms)
    core = PoolCore(inner, clock=clock)
    build_job(core, JOB, 8, random.Random(3))
    for n in range(4):  # files a crashed commit left behind: nothing names them
        inner.put(f"{job_prefix(JOB)}data/{uuid.UUID(int=n)}.arrow", b"x" * (100 + n))
    config = MaintenanceConfig(interval_s=10, lease_ttl_s=40, gc_min_age_s=60)
    store = HookStore(inner)
    m = maintainer_of(store, config, "pool-a", clock)
    clock.advance(120)  # past the minimum age
    before = {i.key: i.size for i in inner.list(job_prefix(JOB))}
    # the first GC delete takes long: the lease passes its margin and the run stops after it
    store.on("delete", "/data/", lambda: clock.advance(35), when="after")
    gc_run = next(r for r in m.run_once()[JOB] if r.task == "gc")
    after = {i.key for i in inner.list(job_prefix(JOB))}
    freed = sum(size for key, size in before.items() if key not in after and "/data/" in key)
    assert freed > 0 and "stopped after" in gc_run.detail, gc_run
    assert gc_run.bytes_reclaimed == freed, gc_run


# ---- job policies across lives of a job ----------------------------------------------------------------------


def test_review_a_job_created_again_under_its_old_name_does_not_inherit_the_old_policy() -> None:
    clock = Clock()
    store = MemoryStore(clock_ms=clock.ms)
    build_job(PoolCore(store, clock=clock), JOB, 4, random.Random(4))
    write_job_policy(store, JOB, JobPolicy(keep_last=1))  # the old life's operator wanted a single checkpoint
    for info in list(store.list(job_prefix(JOB))):  # the operator deletes the job's folder
        store.delete(info.key)
    assert store.exists(job_policy_key(JOB))
    clock.advance(1)
    models = build_job(PoolCore(store, clock=clock), JOB, 4, random.Random(5))  # a new job, same name
    config = MaintenanceConfig(interval_s=10, gc_min_age_s=60, keep_last=3)
    maintainer_of(store, config, "pool-a", clock).run_once()
    assert complete_ids(store, JOB) == [2, 3, 4]  # the pool's keep_last
    for cid in (2, 3, 4):
        assert scan_checkpoint(store, JOB, cid) == models[cid]


# ---- GC and job policies: the minimum age is not the policy's to lower ----------------------------------------


def test_a_job_policy_object_naming_a_gc_minimum_age_is_refused_and_nothing_is_collected() -> None:
    """Held: a hand-written policy with gc_min_age_s: 0 is not a policy; the maintainer leaves the job alone."""
    clock = Clock()
    store = MemoryStore(clock_ms=clock.ms)
    build_job(PoolCore(store, clock=clock), JOB, 6, random.Random(6))
    body = {"format": "clink.job-policy", "version": 1, "job": JOB, "keep_last": 1, "gc_min_age_s": 0, "maintenance": True, "updated_ms": 0}
    store.put(job_policy_key(JOB), json.dumps(body).encode())
    before = sorted(data_keys(store, JOB))
    runs = maintainer_of(store, MaintenanceConfig(interval_s=10, gc_min_age_s=3600, keep_last=1), "p", clock).run_once()[JOB]
    assert [r.outcome for r in runs] == ["error"] and "gc_min_age_s" in runs[0].detail
    assert sorted(data_keys(store, JOB)) == before and complete_ids(store, JOB) == [1, 2, 3, 4, 5, 6]


def test_maintenance_objects_never_count_as_a_job() -> None:
    """Held: a lease and a policy of a job with no folder do not make the maintainer (or a listing) see a job."""
    clock = Clock()
    store = MemoryStore(clock_ms=clock.ms)
    build_job(PoolCore(store, clock=clock), JOB, 3, random.Random(7))
    maintainer_of(store, MaintenanceConfig(interval_s=10, gc_min_age_s=60), "p", clock).run_once()
    write_job_policy(store, "ghost", JobPolicy(keep_last=2))
    assert store.exists(lease_key(JOB))
    assert sorted(store.list_prefixes("jobs/")) == [JOB]
    runs = maintainer_of(store, MaintenanceConfig(interval_s=10, gc_min_age_s=60), "q", clock).run_once()
    assert set(runs) == {JOB}
    assert JobListing.of(JOB, list(store.list(job_prefix(JOB)))).complete


# ---- GC under clock skew between pools -----------------------------------------------------------------------


def test_review_gc_on_a_pool_with_a_fast_clock_never_deletes_a_delta_a_commit_is_about_to_name() -> None:
    store_clock = Clock()
    inner = MemoryStore(clock_ms=store_clock.ms)
    store = HookStore(inner)
    core = PoolCore(store, clock=store_clock)  # the committing pool agrees with the store
    kg = KeyGroupRange(0, 127)
    epoch = core.acquire_writer(JOB, kg)[0]
    rng = random.Random(8)
    model: dict[tuple[int, bytes], bytes] = {}
    for cid in (1, 2):
        rows = delta_for(rng, model, kg, 20, cid, op_rows=True)
        apply(model, rows)
        commit(core, JOB, cid, cid - 1, kg, epoch, rows)
    fast = Clock(offset_s=180.0)  # another pool's clock, three minutes ahead of the store's
    ahead = maintainer_of(inner, MaintenanceConfig(interval_s=10, gc_min_age_s=60), "ahead", fast)
    # the maintainer's round comes between the commit's delta upload and its part
    store.on("put_if_absent", "/parts/", lambda: None if ahead.run_once() else None)
    rows = delta_for(rng, model, kg, 20, 3, op_rows=True)
    apply(model, rows)
    commit(core, JOB, 3, 2, kg, epoch, rows)
    assert complete_ids(inner, JOB)[-1] == 3
    present = set(data_keys(inner, JOB))
    missing = [k for k in referenced_keys(inner, JOB) if k not in present]
    assert not missing, f"checkpoint 3 names deleted files {missing}"
    assert scan_checkpoint(inner, JOB, 3) == model


# ---- several pool addresses: calls retried on another pool ---------------------------------------------------


@pytest.fixture
def two_pools() -> Iterator[TwoPools]:
    clock = Clock()
    inner = MemoryStore(clock_ms=clock.ms)
    build_job(PoolCore(inner, clock=clock), JOB, 4, random.Random(9))
    pools = TwoPools(inner)
    try:
        yield pools
    finally:
        pools.close()


def test_review_a_delete_whose_reply_was_lost_is_not_reported_as_not_found_by_the_other_pool(two_pools: TwoPools) -> None:
    # the delete's second CAS of the writers table withdraws its removal intent: everything is deleted by then
    two_pools.lose_reply_after("compare_and_swap", f"{JOB}/writers", skip=1)
    with PoolClient(two_pools.addresses, PoolClientConfig(seed=0)) as client:
        client.delete_checkpoint(JOB, 2)
    assert two_pools.lost, "no reply was lost: the attack did not happen"
    assert complete_ids(two_pools.inner, JOB) == [1, 3, 4]


def test_review_clearing_a_policy_whose_reply_was_lost_still_says_it_cleared_one(two_pools: TwoPools) -> None:
    write_job_policy(two_pools.inner, JOB, JobPolicy(keep_last=2))
    two_pools.lose_reply_after("delete", "maintenance/policies/")
    with PoolClient(two_pools.addresses, PoolClientConfig(seed=0)) as client:
        cleared = client.clear_job_policy(JOB)
    assert two_pools.lost and not two_pools.inner.exists(job_policy_key(JOB))
    assert cleared is True


def test_a_commit_whose_reply_was_lost_on_one_pool_lands_once_through_the_other(two_pools: TwoPools) -> None:
    """Held: the retry of a commit on the other pool is answered as the repeat; the state is the model's, once."""
    inner = two_pools.inner
    two_pools.lose_reply_after("put_if_absent", "/chk-5/_metadata")
    with PoolClient(two_pools.addresses, PoolClientConfig(seed=0)) as client:
        lease = client.acquire_writer(JOB, (0, 127), restore_from=4)
        model = scan_checkpoint(inner, JOB, 4)
        key = snapshot.encode_keyed_key("v", b"only-once")
        op = snapshot.operator_id("counter")
        rows = [(snapshot.ROW_PUT, op, key, b"1")]
        result = client.commit_checkpoint(JOB, 5, 4, (0, 127), lease.epoch, changelog_bytes(rows), operators={op: "counter"})
    assert two_pools.lost and result.checkpoint.complete and result.attempts >= 2
    model[(op, key)] = b"1"
    assert scan_checkpoint(inner, JOB, 5) == model
    parts = [i.key for i in inner.list(f"{job_prefix(JOB)}chk-5/")]
    assert len([p for p in parts if "/parts/" in p]) == 1, parts


# ---- a job deleted while its maintenance runs ----------------------------------------------------------------


def test_review_a_job_deleted_during_its_compaction_stays_deleted() -> None:
    clock = Clock()
    inner = MemoryStore(clock_ms=clock.ms)
    build_job(PoolCore(inner, clock=clock), JOB, 6, random.Random(10))
    store = HookStore(inner)

    def operator_deletes_the_job() -> None:
        for info in list(inner.list(job_prefix(JOB))):
            inner.delete(info.key)

    store.on("put_if_absent", "/data/", operator_deletes_the_job)  # the compaction's first base file
    config = MaintenanceConfig(interval_s=10, gc_min_age_s=60, compact_max_layers=2)
    runs = maintainer_of(store, config, "p", clock).run_once()[JOB]
    assert runs[0].task == "compaction" and runs[0].outcome == "error", runs
    assert [i.key for i in inner.list(job_prefix(JOB))] == []
    assert inner.list_prefixes("jobs/") == []
