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
    update_job_policy,
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


# ---- updates that change only the settings given, and the life a policy belongs to ---------------------------------

changes_of = st.dictionaries(
    st.sampled_from(["keep_last", "compact_max_layers", "compact_max_delta_bytes", "maintenance"]),
    st.one_of(st.none(), st.integers(1, 2**40)),
    min_size=1,
).map(lambda d: {k: (bool(v) if k == "maintenance" else v) for k, v in d.items()})


@given(st.lists(changes_of, min_size=1, max_size=6), st.integers(0, 5))
def test_updates_change_only_their_settings_even_when_another_update_lands_between_read_and_write(updates, racing_at):
    """A model (a dict of settings) against update_job_policy, with a second client's update landing mid-update once."""
    from tests.hook_store import HookStore

    inner = MemoryStore()
    store = HookStore(inner)
    model = {"keep_last": None, "compact_max_layers": None, "compact_max_delta_bytes": None, "maintenance": True}
    racer = {"compact_max_layers": 7}
    raced = {"done": False}

    def another_client() -> None:  # after our read, before our compare-and-swap: its setting must survive ours
        if not raced["done"]:
            raced["done"] = True
            update_job_policy(inner, "orders", racer, 1)

    for n, changes in enumerate(updates):
        if n == racing_at:
            store.on("compare_and_swap", job_policy_key("orders"), another_client, when="before")
            model.update(racer)
        update_job_policy(store, "orders", changes, 10 + n)
        model.update(changes)
        if n == racing_at and "compact_max_layers" in changes:
            model["compact_max_layers"] = changes["compact_max_layers"]  # ours came after the racer's: ours stands
    stored = read_job_policy(inner, "orders")
    assert stored is not None
    assert {k: getattr(stored, k) for k in model} == model
    assert stored.updated_ms == 10 + len(updates) - 1


def test_an_update_of_an_unknown_setting_or_a_bad_value_writes_nothing():
    store = MemoryStore()
    write_job_policy(store, "orders", JobPolicy(keep_last=3))
    before = store.get(job_policy_key("orders"))
    with pytest.raises(InvalidArgumentError, match="keep_lats"):
        update_job_policy(store, "orders", {"keep_lats": 5}, 1)
    with pytest.raises(InvalidArgumentError, match="compact_max_layers"):
        update_job_policy(store, "orders", {"compact_max_layers": 2**63}, 1)
    with pytest.raises(InvalidArgumentError, match="keep_last"):
        JobPolicy(keep_last=2**63).validated()
    assert store.get(job_policy_key("orders")) == before


def test_a_policy_belongs_to_the_life_of_the_job_it_was_set_for():
    """Deleted and made again, a job starts with no policy of its own; an update then starts from the pool's settings."""
    store = MemoryStore()
    core = PoolCore(store)
    build_job(core, "orders", 2, random.Random(1))
    write_job_policy(store, "orders", JobPolicy(keep_last=1, compact_max_layers=2, maintenance=False))
    assert json.loads(store.get(job_policy_key("orders")))["life"]  # tied to the writers table's life token
    assert read_job_policy(store, "orders") == JobPolicy(keep_last=1, compact_max_layers=2, maintenance=False)
    for info in list(store.list("jobs/orders/")):
        store.delete(info.key)
    build_job(PoolCore(store), "orders", 2, random.Random(2))  # a new life, same name
    assert read_job_policy(store, "orders") is None
    assert list_job_policies(store) == {}
    assert JobPolicies(Lifecycle(store)).get("orders") is None
    assert update_job_policy(store, "orders", {"keep_last": 4}, 5) == JobPolicy(keep_last=4, updated_ms=5)
    assert read_job_policy(store, "orders") == JobPolicy(keep_last=4, updated_ms=5)


def test_a_policy_set_before_the_job_had_writers_stays_with_it():
    """A job imported from a savepoint has checkpoints but no writers table yet: its policy applies once writers come."""
    store = MemoryStore()
    write_job_policy(store, "orders", JobPolicy(keep_last=6))
    assert "life" not in json.loads(store.get(job_policy_key("orders")))
    build_job(PoolCore(store), "orders", 1, random.Random(3))
    assert read_job_policy(store, "orders") == JobPolicy(keep_last=6)
