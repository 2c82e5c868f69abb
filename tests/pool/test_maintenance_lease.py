"""Maintenance leases: one holder per job by conditional writes, taken over only once expired; maintenance/ is never job state."""

from __future__ import annotations

import json
import random

import pytest

from pool.core import PoolCore
from pool.job_policy import JobPolicy, write_job_policy
from pool.lifecycle import Lifecycle, LifecycleConfig
from pool.maintenance_lease import LEASE_PREFIX, MaintenanceLeases, encode_lease, lease_key
from pool.server import mark_store
from snapshot.errors import InvalidArgumentError
from store.layout import STORE_MARKER, holds_a_store
from store.memory import MemoryStore
from tests.hook_store import HookStore
from tests.lifecycle_helpers import build_job, scan_checkpoint


class Clock:
    """A clock the test moves by hand (seconds)."""

    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(clock: Clock) -> MemoryStore:
    return MemoryStore(clock_ms=lambda: int(clock.now * 1000))


def body_of(store: MemoryStore, job: str) -> dict:
    return json.loads(store.get(lease_key(job)))


def test_a_new_lease_is_written_once_and_renewed_by_its_holder(store: MemoryStore, clock: Clock) -> None:
    a = MaintenanceLeases(store, "pool-a", 30, clock)
    lease, other = a.acquire("orders")
    assert other is None and lease is not None
    assert (lease.holder, lease.acquired_ms, lease.expires_ms) == ("pool-a", 1_000_000, 1_030_000)
    assert body_of(store, "orders") == {
        "format": "clink.maintenance-lease",
        "job": "orders",
        "holder": "pool-a",
        "acquired_ms": 1_000_000,
        "expires_ms": 1_030_000,
    }
    clock.now += 10
    renewed, _ = a.acquire("orders")
    assert renewed is not None and renewed.etag != lease.etag
    assert (renewed.acquired_ms, renewed.expires_ms) == (1_000_000, 1_040_000)  # held since the first take


def test_another_pool_takes_a_lease_only_once_it_has_seen_it_unchanged_for_its_ttl(store: MemoryStore, clock: Clock) -> None:
    a, b = MaintenanceLeases(store, "pool-a", 30, clock), MaintenanceLeases(store, "pool-b", 30, clock)
    held, _ = a.acquire("orders")
    assert held is not None
    clock.now += 10
    lease, current = b.acquire("orders")  # b's first sight of this lease: its ttl counts from here, on b's own clock
    assert lease is None and current is not None and current.holder == "pool-a"
    clock.now += 29.999
    lease, current = b.acquire("orders")
    assert lease is None and current is not None and current.holder == "pool-a"
    assert body_of(store, "orders")["holder"] == "pool-a"  # nothing written by b
    clock.now += 0.001  # seen unchanged for the whole ttl: its holder stopped renewing
    lease, current = b.acquire("orders")
    assert current is None and lease is not None and lease.holder == "pool-b"
    assert lease.acquired_ms == int(clock.now * 1000)
    back, current = a.acquire("orders")  # a, back from a pause, finds it taken
    assert back is None and current is not None and current.holder == "pool-b"


def test_a_renewed_lease_is_never_taken_whatever_the_holders_clock_says(store: MemoryStore, clock: Clock) -> None:
    slow = Clock()
    slow.now = clock.now - 3600  # the holder's clock an hour behind: every stamp it writes is long "expired" for b
    a, b = MaintenanceLeases(store, "pool-a", 30, slow), MaintenanceLeases(store, "pool-b", 30, clock)
    for _ in range(10):
        held, _ = a.acquire("orders")
        assert held is not None and held.holder == "pool-a"
        lease, current = b.acquire("orders")
        assert lease is None and current is not None and current.holder == "pool-a"
        clock.now += 12
        slow.now += 12


def test_of_two_pools_racing_for_a_lease_exactly_one_wins(store: MemoryStore, clock: Clock) -> None:
    hooked = HookStore(store)
    a, b = MaintenanceLeases(hooked, "pool-a", 30, clock), MaintenanceLeases(store, "pool-b", 30, clock)
    won: list[object] = []
    # b takes the absent lease between a's read and a's put_if_absent
    hooked.on("put_if_absent", "maintenance/leases/", lambda: won.append(b.acquire("orders")))
    lease, current = a.acquire("orders")
    assert lease is None and current is not None and current.holder == "pool-b"
    assert won[0][0] is not None and won[0][0].holder == "pool-b"
    # and for a lapsed one: a has seen it unchanged for the ttl, b renews it first, a's compare-and-swap on the old etag loses
    assert a.acquire("orders")[0] is None  # a's first sight of b's lease
    clock.now += 60
    hooked.on("compare_and_swap", "maintenance/leases/", lambda: won.append(b.acquire("orders")))
    lease, current = a.acquire("orders")
    assert lease is None and current is not None and current.holder == "pool-b"
    assert body_of(store, "orders")["expires_ms"] == int(clock.now * 1000) + 30_000


def test_a_released_lease_is_taken_at_once_and_a_stale_release_changes_nothing(store: MemoryStore, clock: Clock) -> None:
    a, b = MaintenanceLeases(store, "pool-a", 30, clock), MaintenanceLeases(store, "pool-b", 30, clock)
    held, _ = a.acquire("orders")
    assert held is not None
    clock.now += 1
    assert a.release(held) is True
    assert body_of(store, "orders")["expires_ms"] == int(clock.now * 1000)
    taken, _ = b.acquire("orders")
    assert taken is not None and taken.holder == "pool-b"
    assert a.release(held) is False  # its etag is gone: b's lease stays
    assert body_of(store, "orders")["holder"] == "pool-b"


def test_a_damaged_lease_counts_as_expired_and_is_replaced_by_compare_and_swap(store: MemoryStore, clock: Clock) -> None:
    store.put(lease_key("orders"), b"{not json")
    lease, _ = MaintenanceLeases(store, "pool-a", 30, clock).acquire("orders")
    assert lease is not None and body_of(store, "orders")["holder"] == "pool-a"
    store.put(lease_key("orders"), json.dumps({"format": "other", "holder": "x", "acquired_ms": 0, "expires_ms": 10**15}).encode())
    lease, _ = MaintenanceLeases(store, "pool-b", 30, clock).acquire("orders")
    assert lease is not None and lease.holder == "pool-b"


def test_leases_refuse_bad_arguments(store: MemoryStore, clock: Clock) -> None:
    with pytest.raises(InvalidArgumentError, match="holder id"):
        MaintenanceLeases(store, "", 30, clock)
    with pytest.raises(InvalidArgumentError, match="lease_ttl_s"):
        MaintenanceLeases(store, "a", 0, clock)
    with pytest.raises(InvalidArgumentError):
        lease_key("../jobs/x")


def test_maintenance_objects_are_never_job_state(store: MemoryStore, clock: Clock) -> None:
    """GC (store-wide and per job), list_jobs, inspect and the store marker leave maintenance/ alone and never list it."""
    core = PoolCore(store, clock=clock)
    models = build_job(core, "orders", 3, random.Random(5))
    MaintenanceLeases(store, "pool-a", 30, clock).acquire("orders")
    MaintenanceLeases(store, "pool-a", 30, clock).acquire("gone")  # a lease of a job that has no folder
    write_job_policy(store, "orders", JobPolicy(keep_last=2))
    store.put(f"{LEASE_PREFIX}stray.txt", b"not a lease")
    maintenance = {k: v for k, v in store.objects.items() if k.startswith("maintenance/")}
    assert len(maintenance) == 4
    clock.now += 10 * 86400  # every object is far older than any minimum age
    life = Lifecycle(store, LifecycleConfig(gc_min_age_s=0), clock=clock)
    life.retain("orders", keep_last=1)
    store_wide = life.gc()
    per_job = life.gc("orders")
    assert not [k for k in store_wide.deleted + per_job.deleted if not k.startswith("jobs/orders/")]
    assert {k: v for k, v in store.objects.items() if k.startswith("maintenance/")} == maintenance
    assert scan_checkpoint(store, "orders", 3) == models[3]
    assert core.list_jobs() == ["orders"]
    described = json.dumps(life.describe_job("orders"))
    assert "maintenance" not in described and "lease" not in described
    assert life.list_savepoints() == []


def test_a_store_holding_only_maintenance_objects_is_still_marked_as_new(clock: Clock) -> None:
    store = MemoryStore(clock_ms=lambda: int(clock.now * 1000))
    store.put(lease_key("orders"), encode_lease("orders", "pool-a", 0, 1))
    assert not holds_a_store(store)  # leases and policies are no job state: readers still call this "no such store"
    mark_store(store)
    assert store.exists(STORE_MARKER) and holds_a_store(store)
