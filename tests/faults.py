"""FaultyStore: an ObjectStore wrapper that fails chosen or random calls (errors, timeouts, slowness, throttling, lost replies)."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from snapshot.errors import UnavailableError
from store.objects import ObjectInfo, ObjectStore

# What a fault does to one call:
#   error     - fails before touching the store (connection reset)
#   throttle  - fails before touching the store with S3's "503 SlowDown"
#   timeout   - waits timeout_s, then fails before touching the store
#   slow      - waits slow_s, then the call succeeds
#   lost      - the call takes effect, then its reply is lost (an ambiguous outcome)
KINDS = ("error", "throttle", "timeout", "slow", "lost")
FAILING_KINDS = ("error", "throttle", "timeout", "lost")
WRITE_OPS = frozenset({"put", "put_if_absent", "compare_and_swap", "delete"})


class InjectedFault(UnavailableError):
    """An UnavailableError raised by FaultyStore (so tests can tell injected failures from real ones)."""


@dataclass(frozen=True)
class Call:
    """One call seen by FaultyStore: its index, operation, key and the fault injected (None: none)."""

    index: int
    op: str
    key: str
    fault: str | None


class FaultyStore(ObjectStore):
    """Wraps a store; call number i fails as ``plan[i]`` says, other calls fail at ``rate`` with a random kind.

    ``lost`` only applies to writes (a read that "took effect" is just a read); on a read it acts as ``error``.
    """

    def __init__(
        self,
        inner: ObjectStore,
        plan: dict[int, str] | None = None,
        rate: float = 0.0,
        kinds: tuple[str, ...] = FAILING_KINDS,
        seed: int = 0,
        slow_s: float = 0.005,
        timeout_s: float = 0.01,
        ops: frozenset[str] | None = None,
    ) -> None:
        for kind in (*kinds, *(plan or {}).values()):
            if kind not in KINDS:
                raise ValueError(f"unknown fault kind {kind!r} (known: {', '.join(KINDS)})")
        self.inner = inner
        self.uri = inner.uri
        self.counters = inner.counters
        self.coalesce_gap_bytes = inner.coalesce_gap_bytes
        self.plan = dict(plan or {})
        self.rate = rate
        self.kinds = kinds
        self.slow_s = slow_s
        self.timeout_s = timeout_s
        self.ops = ops
        self.enabled = True
        self.calls: list[Call] = []
        self.faults = Counter()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    @property
    def faults_injected(self) -> int:
        """Faults injected so far (slow responses included)."""
        return sum(self.faults.values())

    def _decide(self, op: str, key: str) -> str | None:
        with self._lock:
            index = len(self.calls)
            fault = None
            if self.enabled and (self.ops is None or op in self.ops):
                fault = self.plan.get(index)
                if fault is None and self.rate and self._rng.random() < self.rate:
                    fault = self._rng.choice(self.kinds)
            if fault == "lost" and op not in WRITE_OPS:
                fault = "error"
            self.calls.append(Call(index, op, key, fault))
            if fault is not None:
                self.faults[fault] += 1
            return fault

    def _before(self, op: str, key: str) -> str | None:
        """Apply a fault that strikes before the call; returns 'lost' when the reply must be dropped after it."""
        fault = self._decide(op, key)
        if fault is None:
            return None
        if fault == "slow":
            time.sleep(self.slow_s)
            return None
        if fault == "timeout":
            time.sleep(self.timeout_s)
            raise InjectedFault(f"{self.uri} unreachable ({op} {key}): read timeout (injected)")
        if fault == "throttle":
            raise InjectedFault(f"{self.uri} unavailable ({op} {key}): SlowDown 503 Please reduce your request rate (injected)")
        if fault == "error":
            raise InjectedFault(f"{self.uri} unreachable ({op} {key}): connection reset by peer (injected)")
        return fault

    def _run(self, op: str, key: str, fn):
        lost = self._before(op, key)
        result = fn()
        if lost:
            raise InjectedFault(f"{self.uri} unreachable ({op} {key}): connection lost before the reply (injected, the call took effect)")
        return result

    def get(self, key: str) -> bytes:
        """The whole object (faults permitting)."""
        return self._run("get", key, lambda: self.inner.get(key))

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """A byte range (faults permitting)."""
        return self._run("get_range", key, lambda: self.inner.get_range(key, start, length))

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        """Object and etag (faults permitting)."""
        return self._run("get_with_etag", key, lambda: self.inner.get_with_etag(key))

    def head(self, key: str) -> ObjectInfo:
        """Object info (faults permitting)."""
        return self._run("head", key, lambda: self.inner.head(key))

    def put(self, key: str, data: bytes) -> str:
        """Write (faults permitting)."""
        return self._run("put", key, lambda: self.inner.put(key, data))

    def put_if_absent(self, key: str, data: bytes) -> str:
        """Write if absent (faults permitting)."""
        return self._run("put_if_absent", key, lambda: self.inner.put_if_absent(key, data))

    def compare_and_swap(self, key: str, data: bytes, expected_etag: str | None) -> str:
        """Compare-and-swap (faults permitting)."""
        return self._run("compare_and_swap", key, lambda: self.inner.compare_and_swap(key, data, expected_etag))

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """A listing, taken whole when the call is made (faults permitting)."""
        return iter(self._run("list", prefix, lambda: list(self.inner.list(prefix))))

    def delete(self, key: str) -> None:
        """Delete (faults permitting)."""
        return self._run("delete", key, lambda: self.inner.delete(key))
