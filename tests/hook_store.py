"""HookStore: an ObjectStore wrapper that runs a callback before or after chosen calls, to force one interleaving."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from store.objects import ObjectInfo, ObjectStore


@dataclass
class _Hook:
    op: str
    match: Callable[[str], bool]
    run: Callable[[], None]
    when: str  # "before" or "after" (after the inner call, before its result is returned)
    times: int
    skip: int


class HookStore(ObjectStore):
    """Wraps a store; ``on(op, match, run)`` runs ``run()`` around the next matching call (a hook's own calls may fire others)."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.uri = inner.uri
        self.counters = inner.counters
        self.coalesce_gap_bytes = inner.coalesce_gap_bytes
        self._hooks: list[_Hook] = []
        self._busy = threading.local()
        self.log: list[tuple[str, str]] = []

    def on(self, op: str, match: str | Callable[[str], bool], run: Callable[[], None], when: str = "before", times: int = 1, skip: int = 0) -> None:
        """Run ``run`` around the (skip+1)-th .. calls of ``op`` whose key matches (a substring or a predicate)."""
        test = (lambda key, s=match: s in key) if isinstance(match, str) else match
        self._hooks.append(_Hook(op, test, run, when, times, skip))

    def _fire(self, op: str, key: str, when: str) -> None:
        for hook in list(self._hooks):
            if hook.op != op or hook.when != when or hook.times <= 0 or not hook.match(key):
                continue
            if hook.skip:
                hook.skip -= 1
                continue
            hook.times -= 1
            self._busy.on = True
            try:
                hook.run()
            finally:
                self._busy.on = False

    def _call(self, op: str, key: str, fn: Callable[[], object]):
        if not getattr(self._busy, "on", False):
            self.log.append((op, key))
        self._fire(op, key, "before")
        out = fn()
        self._fire(op, key, "after")
        return out

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
