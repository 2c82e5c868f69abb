"""SimStore: the in-memory store seen through the scheduler: every call is a switch point, and may fail, lose its reply or crash."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator

from snapshot.errors import UnavailableError
from store.memory import MemoryStore
from store.objects import ObjectInfo, ObjectStore
from tests.sim.scheduler import Scheduler

WRITES = frozenset({"put", "put_if_absent", "compare_and_swap", "delete"})


class SimFault(UnavailableError):
    """A fault the simulation injected (so a report can tell it from a real one)."""


class SimStore(ObjectStore):
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

    def get(self, key: str) -> bytes:
        return self._call("get", key, lambda: self.inner.get(key))

    def get_range(self, key: str, start: int, length: int) -> bytes:
        return self._call("get_range", key, lambda: self.inner.get_range(key, start, length))

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        return self._call("get", key, lambda: self.inner.get_with_etag(key))

    def head(self, key: str) -> ObjectInfo:
        return self._call("head", key, lambda: self.inner.head(key))

    def put(self, key: str, data: bytes) -> str:
        return self._call("put", key, lambda: self.inner.put(key, data))

    def put_if_absent(self, key: str, data: bytes) -> str:
        return self._call("put_if_absent", key, lambda: self.inner.put_if_absent(key, data))

    def compare_and_swap(self, key: str, data: bytes, expected_etag: str | None) -> str:
        return self._call("compare_and_swap", key, lambda: self.inner.compare_and_swap(key, data, expected_etag))

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        return iter(self._call("list", prefix, lambda: list(self.inner.list(prefix))))

    def delete(self, key: str) -> None:
        self._call("delete", key, lambda: self.inner.delete(key))
