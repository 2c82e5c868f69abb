"""HookStore: an ObjectStore wrapper that runs a callback before or after chosen calls, to force one interleaving."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from store.objects import ObjectStore
from tests.call_store import CallStore


@dataclass
class _Hook:
    op: str
    match: Callable[[str], bool]
    run: Callable[[], None]
    when: str  # "before" or "after" (after the inner call, before its result is returned)
    times: int
    skip: int


class HookStore(CallStore):
    """Wraps a store; ``on(op, match, run)`` runs ``run()`` around the next matching call (a hook's own calls may fire others)."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.uri = inner.uri
        self.counters = inner.counters
        self.coalesce_gap_bytes = inner.coalesce_gap_bytes
        self._hooks: list[_Hook] = []
        self._busy = threading.local()
        self.log: list[tuple[str, str]] = []

    def on(
        self, op: str, match: str | Callable[[str], bool], run: Callable[[], None], when: str = "before", times: int = 1, skip: int = 0
    ) -> None:
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
