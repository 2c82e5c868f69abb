"""CallStore: an ObjectStore wrapper that sends every call of its inner store through one ``_call(op, key, fn)`` hook."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from store.objects import ObjectInfo, ObjectStore


class CallStore(ObjectStore):
    """Delegates each store call to ``self.inner`` through ``_call``, which subclasses override (hooks, scheduling, faults)."""

    inner: ObjectStore

    def _call(self, op: str, key: str, fn: Callable[[], object]):
        return fn()

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

    def list_prefixes(self, prefix: str = "") -> list[str]:
        return self._call("list", prefix, lambda: self.inner.list_prefixes(prefix))

    def delete(self, key: str) -> None:
        self._call("delete", key, lambda: self.inner.delete(key))
