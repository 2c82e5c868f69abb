"""A job's policy object in the store: round trip, strict parsing, validation naming the field, corrupt objects named."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pool.core import PoolCore
from pool.gc import GarbageCollector
from pool.job_policy import (
    POLICY_PREFIX,
    JobPolicies,
    JobPolicy,
    clear_job_policy,
    effective_policy,
    encode_job_policy,
    job_policy_key,
    list_job_policies,
    read_job_policy,
    resolve_keep_last,
    write_job_policy,
)
from pool.lifecycle import Lifecycle, LifecycleConfig
from snapshot.errors import CorruptDataError, InvalidArgumentError, NotFoundError
from store.memory import MemoryStore
from tests.lifecycle_helpers import build_job

settings = st.one_of(st.none(), st.integers(1, 2**40))
policies = st.builds(
    JobPolicy,
    keep_last=settings,
    compact_max_layers=settings,
    compact_max_delta_bytes=settings,
    maintenance=st.booleans(),
    updated_ms=st.integers(0, 2**50),
)


@given(policies, st.sampled_from(["orders", "team-1.x", "ünïcode", "a" * 128]))
def test_a_policy_reads_back_as_written(policy, job):
    store = MemoryStore()
    assert read_job_policy(store, job) is None
    assert write_job_policy(store, job, policy) == policy
    assert read_job_policy(store, job) == policy
    assert [o.key for o in store.list("")] == [f"{POLICY_PREFIX}{job}.json"]
    assert clear_job_policy(store, job) is True
    assert read_job_policy(store, job) is None and not list(store.list(""))
    assert clear_job_policy(store, job) is False


def test_policies_of_two_jobs_are_apart():
    store = MemoryStore()
    write_job_policy(store, "a", JobPolicy(keep_last=2))
    write_job_policy(store, "b", JobPolicy(keep_last=5, maintenance=False))
    assert list_job_policies(store) == {"a": JobPolicy(keep_last=2), "b": JobPolicy(keep_last=5, maintenance=False)}
    clear_job_policy(store, "a")
    assert list_job_policies(store) == {"b": JobPolicy(keep_last=5, maintenance=False)}


@pytest.mark.parametrize(
    ("policy", "field"),
    [
        (JobPolicy(keep_last=0), "keep_last"),
        (JobPolicy(keep_last=-3), "keep_last"),
        (JobPolicy(keep_last=True), "keep_last"),
        (JobPolicy(compact_max_layers=0), "compact_max_layers"),
        (JobPolicy(compact_max_delta_bytes=0), "compact_max_delta_bytes"),
        (JobPolicy(compact_max_delta_bytes=1.5), "compact_max_delta_bytes"),  # type: ignore[arg-type]
        (JobPolicy(maintenance="yes"), "maintenance"),  # type: ignore[arg-type]
        (JobPolicy(updated_ms=-1), "updated_ms"),
    ],
)
def test_a_bad_setting_is_refused_by_name_and_writes_nothing(policy, field):
    store = MemoryStore()
    write_job_policy(store, "j", JobPolicy(keep_last=4))
    with pytest.raises(InvalidArgumentError, match=field):
        write_job_policy(store, "j", policy)
    assert read_job_policy(store, "j") == JobPolicy(keep_last=4)


@pytest.mark.parametrize("job", ["", "a/b", "..", "has space", ".clink-x", "x" * 129])
def test_a_bad_job_name_is_refused(job):
    store = MemoryStore()
    with pytest.raises(InvalidArgumentError, match="job id"):
        write_job_policy(store, job, JobPolicy())
    with pytest.raises(InvalidArgumentError, match="job id"):
        read_job_policy(store, job)
    assert not list(store.list(""))


def _body(**changes) -> bytes:
    body = json.loads(encode_job_policy("j", JobPolicy(keep_last=3)))
    body.update(changes)
    return json.dumps({k: v for k, v in body.items() if v is not ...}).encode()


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (b"{not json", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (_body(format="clink.pin"), "format"),
        (_body(format=...), "format"),
        (_body(version=2), "version"),
        (_body(keep_last_days=3), "'keep_last_days'"),
        (_body(job="other"), "names job 'other'"),
        (_body(keep_last=0), "keep_last"),
        (_body(keep_last="3"), "keep_last"),
        (_body(maintenance="off"), "maintenance"),
    ],
)
def test_a_corrupt_policy_is_named(data, needle):
    store = MemoryStore()
    store.put(job_policy_key("j"), data)
    with pytest.raises(CorruptDataError, match=needle) as excinfo:
        read_job_policy(store, "j")
    assert "maintenance/policies/j.json" in str(excinfo.value)
    with pytest.raises(CorruptDataError, match="maintenance/policies/j.json"):
        list_job_policies(store)


def test_the_stored_body_says_its_format_and_job():
    body = json.loads(encode_job_policy("orders", JobPolicy(keep_last=7, maintenance=False, updated_ms=5)))
    assert body == {
        "format": "clink.job-policy",
        "version": 1,
        "job": "orders",
        "keep_last": 7,
        "compact_max_layers": None,
        "compact_max_delta_bytes": None,
        "maintenance": False,
        "updated_ms": 5,
    }


def test_unset_fields_fall_back_to_the_pool():
    pool = JobPolicy(keep_last=3, compact_max_layers=8, compact_max_delta_bytes=100)
    assert effective_policy(None, pool) == pool
    mine = JobPolicy(keep_last=9, maintenance=False, updated_ms=4)
    assert effective_policy(mine, pool) == JobPolicy(9, 8, 100, False, 4)
    assert resolve_keep_last(5, mine, 3) == (5, "request")
    assert resolve_keep_last(0, mine, 3) == (9, "job policy")
    assert resolve_keep_last(0, JobPolicy(compact_max_layers=2), 3) == (3, "pool")
    assert resolve_keep_last(0, None, 3) == (3, "pool")
    with pytest.raises(InvalidArgumentError, match="keep_last"):
        resolve_keep_last(-1, None, 3)


def test_policies_live_outside_job_state_and_gc_leaves_them():
    store = MemoryStore()
    build_job(PoolCore(store), "orders", 4, random.Random(3))
    life = Lifecycle(store, LifecycleConfig(gc_min_age_s=0))
    policies = JobPolicies(life)
    policies.set("orders", JobPolicy(keep_last=1))
    assert PoolCore(store).list_jobs() == ["orders"]
    life.retain("orders", 1)
    GarbageCollector(life.context, life.pins).gc(None)  # a store-wide run lists everything
    assert store.exists(job_policy_key("orders"))
    stored = policies.get("orders")
    assert stored is not None and stored.keep_last == 1


def test_a_policy_needs_an_existing_job_but_a_stray_one_can_be_cleared():
    store = MemoryStore()
    build_job(PoolCore(store), "orders", 2, random.Random(4))
    policies = JobPolicies(Lifecycle(store, clock=lambda: 1234.5))
    with pytest.raises(NotFoundError, match="ordres"):
        policies.set("ordres", JobPolicy(keep_last=2))
    with pytest.raises(NotFoundError, match="ordres"):
        policies.get("ordres")
    with pytest.raises(NotFoundError, match="ordres"):
        policies.clear("ordres")
    assert not store.exists(job_policy_key("ordres"))
    assert policies.set("orders", JobPolicy(keep_last=2, updated_ms=7)) == JobPolicy(keep_last=2, updated_ms=1234500)
    write_job_policy(store, "gone", JobPolicy(keep_last=2))  # its job was deleted since
    assert policies.get("gone") == JobPolicy(keep_last=2)
    assert policies.clear("gone") is True and policies.clear("orders") is True and policies.clear("orders") is False


def test_the_pools_maintenance_settings_are_what_unset_ones_fall_back_to():
    store = MemoryStore()
    build_job(PoolCore(store), "orders", 9, random.Random(5))
    life = Lifecycle(store, LifecycleConfig(retain_last=2, compact_max_delta_bytes=99))
    policies = JobPolicies(life, JobPolicy(keep_last=7, compact_max_layers=4))
    assert policies.defaults == JobPolicy(keep_last=7, compact_max_layers=4, compact_max_delta_bytes=99)
    assert JobPolicies(life).defaults == JobPolicy(keep_last=2, compact_max_layers=8, compact_max_delta_bytes=99)
    dry = policies.retain("orders", dry_run=True)
    assert (dry.keep_last, dry.keep_last_from, dry.result.deleted) == (7, "pool", (1, 2))
    policies.set("orders", JobPolicy(keep_last=5))
    assert policies.effective(policies.get("orders")).compact_max_layers == 4
    run = policies.retain("orders")
    assert (run.keep_last, run.keep_last_from, run.result.deleted) == (5, "job policy", (1, 2, 3, 4))
    assert [c.checkpoint_id for c in PoolCore(store).list_checkpoints("orders")] == [5, 6, 7, 8, 9]
    with pytest.raises(InvalidArgumentError, match="keep_last"):
        policies.retain("orders", keep_last=-1)
    with pytest.raises(NotFoundError, match="ordres"):
        policies.retain("ordres", dry_run=True)
