"""Live export announcements against a model: seeded random histories of acquires, announces, withdraws and expiry."""

from __future__ import annotations

import random

import pytest

from pool.domain import KeyGroupRange, LiveExportConfig
from pool.live_exports import LiveExports, gaps
from pool.writers import Fencing
from snapshot.errors import FencedError
from store.memory import MemoryStore

JOB = "live-model"


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def random_range(rng: random.Random) -> KeyGroupRange:
    lo = rng.randrange(128)
    return KeyGroupRange(lo, rng.randrange(lo, min(128, lo + rng.choice((1, 8, 32, 128)))))


@pytest.mark.parametrize("seed", range(40))
def test_announcements_follow_the_model(seed: int) -> None:
    """current() is exactly the model's unexpired announcements whose epoch still owns its range, newest per range and URL."""
    rng = random.Random(seed)
    clock = Clock()
    fencing = Fencing(MemoryStore())
    live = LiveExports(fencing, LiveExportConfig(max_ttl_s=60), clock=clock)
    writers: list[tuple[KeyGroupRange, int]] = []  # every (range, epoch) ever acquired
    model: dict[str, tuple[KeyGroupRange, int, float]] = {}  # url -> (range, epoch, expires)
    for _step in range(120):
        action = rng.random()
        if action < 0.2 or not writers:
            kg = random_range(rng)
            writers.append((kg, fencing.acquire(JOB, kg)))
        elif action < 0.6:
            kg, epoch = rng.choice(writers)
            url = f"http://127.0.0.1:{rng.randrange(1, 12)}/state.arrow"
            ttl = rng.choice((1, 5, 60))
            table, _ = fencing.read(JOB)
            try:
                live.announce(JOB, kg, epoch, url, "t", ttl)
            except FencedError:
                assert not table.holds(kg.lo, kg.hi, epoch), "an owner's announcement was refused"
                continue
            assert table.holds(kg.lo, kg.hi, epoch), "a fenced writer's announcement was taken"
            model = {
                u: v for u, v in model.items() if u != url and not v[0].overlaps(kg) and v[2] > clock.now
            }  # overlapping and same-URL ones give way
            model[url] = (kg, epoch, clock.now + ttl)
        elif action < 0.7 and model:
            url = rng.choice(sorted(model))
            kg, epoch, _ = model.pop(url)
            assert live.withdraw(JOB, kg, epoch)
        elif action < 0.85:
            clock.now += rng.choice((0.5, 2.0, 10.0))
        else:
            table, _ = fencing.read(JOB)
            expected = {(v[0], v[1], u) for u, v in model.items() if v[2] > clock.now and table.holds(v[0].lo, v[0].hi, v[1])}
            got = {(a.key_groups, a.epoch, a.url) for a in live.current(JOB)}
            assert got == expected
            ranges = sorted((a.key_groups for a in live.current(JOB)), key=lambda r: r.lo)
            assert all(a.hi < b.lo for a, b in zip(ranges, ranges[1:], strict=False)), "announced ranges overlap"
            model = {u: v for u, v in model.items() if (v[0], v[1], u) in expected}  # fenced and expired ones are gone


def test_gaps_names_every_key_group_not_covered() -> None:
    rng = random.Random(5)
    for _ in range(200):
        ranges, lo = [], 0
        while lo < 128:
            hi = min(127, lo + rng.randrange(0, 40))
            if rng.random() < 0.7:
                ranges.append(KeyGroupRange(lo, hi))
            lo = hi + 1
        covered = {g for r in ranges for g in range(r.lo, r.hi + 1)}
        missing = {g for r in gaps(ranges) for g in range(r.lo, r.hi + 1)}
        assert missing == set(range(128)) - covered
