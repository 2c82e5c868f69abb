"""RetryingStore: retries the object-store calls that are safe to repeat, with exponential backoff and full jitter."""

from __future__ import annotations

import random
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from snapshot.errors import ConflictError, InvalidArgumentError, NotFoundError, UnavailableError
from store.layout import IMMUTABLE_KEY_PATTERN
from store.objects import ObjectInfo, ObjectStore

T = TypeVar("T")


def full_jitter_backoff(attempt: int, rng: random.Random, initial_s: float, cap_s: float, multiplier: float) -> float:
    """Seconds to sleep before retry number ``attempt`` (0-based): uniform in [0, min(cap, initial * multiplier**attempt)]."""
    return rng.uniform(0.0, min(cap_s, initial_s * multiplier**attempt))


@dataclass(frozen=True)
class StoreRetryConfig:
    """How a RetryingStore retries UnavailableError: attempts per call and backoff uniform in [0, min(cap, base*mult**n)]."""

    max_attempts: int = 6
    initial_backoff_s: float = 0.02
    max_backoff_s: float = 1.0
    multiplier: float = 2.0
    immutable_key_pattern: str = IMMUTABLE_KEY_PATTERN
    seed: int | None = None
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise InvalidArgumentError(f"max_attempts must be at least 1, got {self.max_attempts}")
        if self.initial_backoff_s < 0 or self.max_backoff_s < 0 or self.multiplier < 1:
            raise InvalidArgumentError("backoffs must be >= 0 and the multiplier >= 1")

    def backoff(self, attempt: int, rng: random.Random) -> float:
        """Seconds to sleep before retry number ``attempt`` (0-based), full jitter."""
        return full_jitter_backoff(attempt, rng, self.initial_backoff_s, self.max_backoff_s, self.multiplier)


class RetryingStore(ObjectStore):
    """An ObjectStore decorator: reads, lists, deletes and puts of immutable data files are retried on UnavailableError.

    put_if_absent is retried too; when a retry finds the key taken after an attempt whose reply was lost, the object is
    read back and the write counts as ours if the bytes are exactly ours. compare_and_swap is retried only when the
    object still carries the expected etag (the failed attempt provably did nothing); otherwise the outcome is unknown
    and UnavailableError is raised. Mutable puts are never repeated.
    """

    def __init__(self, inner: ObjectStore, config: StoreRetryConfig | None = None) -> None:
        self.inner = inner
        self.config = config = config or StoreRetryConfig()
        self.uri = inner.uri
        self.counters = inner.counters
        self.coalesce_gap_bytes = inner.coalesce_gap_bytes
        self._immutable = re.compile(config.immutable_key_pattern)
        self._rng = random.Random(config.seed)
        self._lock = threading.Lock()
        self.retries = 0
        self.recovered_writes = 0

    def __getattr__(self, name: str):
        # store-specific extras (create_bucket, root, ...) pass through to the wrapped store
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def _sleep(self, attempt: int) -> None:
        with self._lock:
            self.retries += 1
            pause = self.config.backoff(attempt, self._rng)
        self.config.sleep(pause)

    def _retry(self, what: str, fn: Callable[[], T]) -> T:
        last: UnavailableError | None = None
        for attempt in range(self.config.max_attempts):
            if attempt:
                self._sleep(attempt - 1)
            try:
                return fn()
            except UnavailableError as exc:
                last = exc
        raise UnavailableError(f"{last} (gave up on {what} after {self.config.max_attempts} attempts)") from None

    # ---- safe to repeat ----------------------------------------------------------------------------------------

    def get(self, key: str) -> bytes:
        """The whole object, retried."""
        return self._retry(f"get {key}", lambda: self.inner.get(key))

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """A byte range, retried."""
        return self._retry(f"get {key}", lambda: self.inner.get_range(key, start, length))

    def get_ranges(self, key: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        """Several byte ranges in the wrapped store's own way (one open of a local file, concurrent GETs), retried whole."""
        return self._retry(f"get {key}", lambda: self.inner.get_ranges(key, ranges))

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        """Object and etag, retried."""
        return self._retry(f"get {key}", lambda: self.inner.get_with_etag(key))

    def head(self, key: str) -> ObjectInfo:
        """Object info, retried."""
        return self._retry(f"head {key}", lambda: self.inner.head(key))

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """A listing, read whole inside the retry (a listing that fails half-way starts over)."""
        return iter(self._retry(f"list {prefix}", lambda: list(self.inner.list(prefix))))

    def check_exists(self) -> None:
        """The wrapped store's existence check, retried."""
        self._retry("check the store exists", self.inner.check_exists)

    def holds(self, prefix: str = "") -> bool:
        """Whether any object's key starts with ``prefix``, retried (the wrapped store's own cheap check)."""
        return self._retry(f"list {prefix}", lambda: self.inner.holds(prefix))

    def probe(self) -> None:
        """The wrapped store's startup check, one attempt (a check that retries would hide a silent endpoint for minutes)."""
        self.inner.probe()

    def delete(self, key: str) -> None:
        """Delete, retried (deleting a missing key is not an error)."""
        self._retry(f"delete {key}", lambda: self.inner.delete(key))

    def put(self, key: str, data: bytes) -> str:
        """Write; retried only for immutable, uniquely named data files."""
        if self._immutable.search(key):
            return self._retry(f"put {key}", lambda: self.inner.put(key, data))
        return self.inner.put(key, data)

    # ---- conditional writes: retried only where the outcome can be decided ----------------------------------

    def put_if_absent(self, key: str, data: bytes) -> str:
        """Write if absent; a conflict after a lost reply is resolved by reading the object back."""
        return self._put_if_absent(key, lambda: self.inner.put_if_absent(key, data), lambda: data)

    def _put_if_absent(self, key: str, attempt: Callable[[], str], ours: Callable[[], bytes]) -> str:
        """Repeat ``attempt`` over unavailability; a conflict after an unknown outcome is ours if the object holds ``ours()``."""
        ambiguous = False
        last: UnavailableError | None = None
        for n in range(self.config.max_attempts):
            if n:
                self._sleep(n - 1)
            try:
                return attempt()
            except UnavailableError as exc:
                ambiguous, last = True, exc
            except ConflictError:
                if not ambiguous:
                    raise
                etag = self._ours(key, ours())
                if etag is None:
                    raise
                return etag
        raise UnavailableError(f"{last} (gave up on put-if-absent {key} after {self.config.max_attempts} attempts)") from None

    def spool_path(self) -> Path:
        """The wrapped store's spool path (a file store's own temp folder)."""
        return self.inner.spool_path()

    def put_if_absent_file(self, key: str, path: Path, size: int) -> str:
        """put_if_absent of a local file, retried as put_if_absent is (a conflict after a lost reply: the object read back)."""
        return self._put_if_absent(key, lambda: self.inner.put_if_absent_file(key, path, size), lambda: Path(path).read_bytes())

    def _ours(self, key: str, data: bytes) -> str | None:
        """The etag of ``key`` if it holds exactly ``data`` (our earlier attempt landed), else None."""
        try:
            current, etag = self._retry(f"read-back {key}", lambda: self.inner.get_with_etag(key))
        except NotFoundError:
            return None
        if current != data:
            return None
        with self._lock:
            self.recovered_writes += 1
        return etag

    def compare_and_swap(self, key: str, data: bytes, expected_etag: str | None) -> str:
        """Compare-and-swap; repeated only while the object provably still has the expected etag."""
        last: UnavailableError | None = None
        for attempt in range(self.config.max_attempts):
            if attempt:
                self._sleep(attempt - 1)
            try:
                return self.inner.compare_and_swap(key, data, expected_etag)
            except UnavailableError as exc:
                last = exc
            try:
                current = self._retry(f"head {key}", lambda: self.inner.head(key)).etag
            except NotFoundError:
                current = None
            if current != expected_etag:
                # the failed attempt may have landed (or someone else wrote): only the caller can decide
                raise UnavailableError(f"{last} (compare-and-swap of {key} has an unknown outcome: its etag changed)") from None
        raise UnavailableError(f"{last} (gave up on compare-and-swap {key} after {self.config.max_attempts} attempts)") from None
