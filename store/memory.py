"""An in-memory object store (memory://name): the same contract as file:// and s3://, for tests and simulations."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator

from snapshot.errors import ConflictError, InvalidArgumentError, NotFoundError
from store.objects import ObjectInfo, ObjectStore, StoreCounters, validate_key, validate_prefix

_ids = itertools.count(1)


class MemoryStore(ObjectStore):
    """Objects in a dict; every write gets a never-repeating etag; ``clock_ms`` stamps modification times (injectable)."""

    def __init__(self, name: str = "", clock_ms: Callable[[], int] | None = None) -> None:
        self.uri = f"memory://{name or next(_ids)}"
        self.counters = StoreCounters()
        self.objects: dict[str, tuple[bytes, str, int]] = {}  # key -> (data, etag, last_modified_ms)
        self._clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self._versions = itertools.count(1)
        self._lock = threading.Lock()

    def _find(self, key: str) -> tuple[bytes, str, int]:
        item = self.objects.get(validate_key(key))
        if item is None:
            raise NotFoundError(f"object {key} not found in {self.uri}")
        return item

    def _store(self, key: str, data: bytes) -> str:
        etag = f"v{next(self._versions)}"
        self.objects[key] = (bytes(data), etag, self._clock_ms())
        return etag

    def get(self, key: str) -> bytes:
        """The whole object; NotFoundError naming the key."""
        data = self._find(key)[0]
        self.counters.count("get", read=len(data))
        return data

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """``length`` bytes from ``start`` (shorter at the end of the object, b'' past it)."""
        if start < 0 or length < 0:
            raise InvalidArgumentError(f"range ({start}, {length}) of {key} must have start >= 0 and length >= 0")
        data = self._find(key)[0][start : start + length]
        self.counters.count("get_range", read=len(data))
        return data

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        """The object and the etag of exactly those bytes."""
        data, etag, _ = self._find(key)
        self.counters.count("get", read=len(data))
        return data, etag

    def head(self, key: str) -> ObjectInfo:
        """Size, modification time and etag; NotFoundError naming the key."""
        data, etag, mtime = self._find(key)
        self.counters.count("head")
        return ObjectInfo(key, len(data), mtime, etag)

    def put(self, key: str, data: bytes) -> str:
        """Write (atomic: readers see the old or the new object)."""
        validate_key(key)
        with self._lock:
            etag = self._store(key, data)
        self.counters.count("put", written=len(data))
        return etag

    def put_if_absent(self, key: str, data: bytes) -> str:
        """Write only if absent; ConflictError otherwise."""
        return self.compare_and_swap(key, data, None, op="put_if_absent")

    def compare_and_swap(self, key: str, data: bytes, expected_etag: str | None, op: str = "compare_and_swap") -> str:
        """Replace only if the current etag matches (None: must be absent); ConflictError otherwise."""
        validate_key(key)
        with self._lock:
            current = self.objects.get(key)
            self.counters.count(op, written=len(data))
            if expected_etag is None and current is not None:
                raise ConflictError(f"object {key} already exists in {self.uri}")
            if expected_etag is not None and (current is None or current[1] != expected_etag):
                raise ConflictError(f"object {key} in {self.uri} changed or is gone (expected etag {expected_etag})")
            return self._store(key, data)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object whose key starts with ``prefix``, sorted by key (a snapshot taken when called)."""
        validate_prefix(prefix)
        self.counters.count("list")
        with self._lock:
            found = [ObjectInfo(k, len(d), m, e) for k, (d, e, m) in self.objects.items() if k.startswith(prefix)]
        found.sort(key=lambda info: info.key.encode())
        return iter(found)

    def delete(self, key: str) -> None:
        """Remove the object; a missing key is fine."""
        validate_key(key)
        with self._lock:
            self.objects.pop(key, None)
        self.counters.count("delete")
