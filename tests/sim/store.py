"""SimStore: the in-memory store seen through the scheduler: every call is a switch point, and may fail, lose its reply or crash."""

from __future__ import annotations

import random
from collections import Counter

from snapshot.errors import UnavailableError
from store.memory import MemoryStore
from tests.call_store import CallStore
from tests.sim.scheduler import Scheduler

WRITES = frozenset({"put", "put_if_absent", "compare_and_swap", "delete"})


class SimFault(UnavailableError):
    """A fault the simulation injected (so a report can tell it from a real one)."""


class SimStore(CallStore):
    """Every call yields to the scheduler before it acts (and a write yields again before it answers, as a reply in flight)."""

    def __init__(self, scheduler: Scheduler, rng: random.Random) -> None:
        self.scheduler = scheduler
        self.inner = MemoryStore("sim", clock_ms=lambda: scheduler.now_ms)
        self.uri = self.inner.uri
        self.counters = self.inner.counters
        self.rng = rng
        self.error_rate = 0.0  # fails before the call takes effect (connection reset, throttling)
        self.lost_rate = 0.0  # a write takes effect, then its reply is lost
        self.faults: Counter[str] = Counter()
        self.seq = 0  # effects so far: every write that took effect gets the next number
        self.on_effect = None  # callback(seq, op, key, data, before) after a write takes effect (the world's observer)

    def _call(self, op: str, key: str, fn):
        self.scheduler.point()
        if self.scheduler.current() is not None and self.error_rate and self.rng.random() < self.error_rate:
            self.faults["error"] += 1
            raise SimFault(f"{op} {key}: connection reset (injected)")
        before = self.inner.objects.get(key) if op in WRITES else None
        result = fn()
        if op in WRITES:
            self.seq += 1
            if self.on_effect is not None:
                self.on_effect(self.seq, op, key, before)
        if op in WRITES and self.scheduler.current() is not None:
            if self.lost_rate and self.rng.random() < self.lost_rate:
                self.faults["lost"] += 1
                raise SimFault(f"{op} {key}: reply lost after the call took effect (injected)")
            self.scheduler.point()
        return result
