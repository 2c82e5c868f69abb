"""One byte budget for the working memory of requests in flight (commit deltas, scan overlays), shared by every caller."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from snapshot.errors import OverloadedError

# a commit holds its delta about this many times over while it decodes, replays and encodes it (measured: 4-6x)
COMMIT_WORKING_FACTOR = 4


class MemoryBudget:
    """Reservations of bytes against a limit, made by holdings (one per request) that grow as their data arrives.

    A holding that holds nothing yet waits up to ``wait_s`` for room; one that holds some fails at once (OverloadedError)
    when there is none, so two growing requests never wait for each other. A holding alone may pass the limit, so no
    honest request is refused for ever.
    """

    def __init__(
        self, limit_bytes: int, wait_s: float = 30.0, flag: str = "--request-memory-mb", max_waiters: int = 4, holder_share: float = 0.5
    ) -> None:
        self.limit = limit_bytes
        self.wait_s = wait_s
        self.flag = flag
        self.max_waiters = max_waiters  # requests waiting for room at once (each holds a worker meanwhile); more fail at once
        self.holder_share = holder_share  # of the limit, what one holder (a token) may hold while others hold anything
        self.reserved = 0
        self.peak = 0
        self.waiters = 0
        self._by_holder: dict[str, int] = {}
        self._cond = threading.Condition()

    def _full(self, nbytes: int, own: int, holder: str | None) -> bool:
        if self.reserved - own <= 0:
            return False  # alone: admitted whatever its size
        if self.reserved + nbytes > self.limit:
            return True
        if holder is None:
            return False
        # one token may not take more than its share while another holds anything: another tenant always finds room
        held = self._by_holder.get(holder, 0)
        return held + nbytes > self.limit * self.holder_share and self.reserved - held > 0

    def reserve(self, nbytes: int, what: str, own: int = 0, holder: str | None = None) -> None:
        """Take ``nbytes`` for a holding that has ``own`` already; OverloadedError naming ``what`` and the limit when no room comes."""
        if nbytes <= 0:
            return
        deadline = time.monotonic() + (self.wait_s if not own else 0.0)
        with self._cond:
            if self._full(nbytes, own, holder) and (own or self.waiters >= self.max_waiters):
                raise self._refusal(what)
            self.waiters += 1
            try:
                while self._full(nbytes, own, holder):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise self._refusal(what)
                    self._cond.wait(left)
            finally:
                self.waiters -= 1
            self.reserved += nbytes
            if holder is not None:
                self._by_holder[holder] = self._by_holder.get(holder, 0) + nbytes
            self.peak = max(self.peak, self.reserved)

    def _refusal(self, what: str) -> OverloadedError:
        return OverloadedError(
            f"{what}: the pool holds {self.reserved >> 20} MiB of request data in flight, "
            f"its limit ({self.flag} {self.limit >> 20}); retry later"
        )

    def release(self, nbytes: int, holder: str | None = None) -> None:
        if nbytes <= 0:
            return
        with self._cond:
            self.reserved -= nbytes
            if holder is not None:
                left = self._by_holder.get(holder, 0) - nbytes
                if left > 0:
                    self._by_holder[holder] = left
                else:
                    self._by_holder.pop(holder, None)
            self._cond.notify_all()

    @contextmanager
    def holding(self, holder: str | None = None) -> Iterator[Holding]:
        """A scope (of one request, of ``holder``'s) whose reservations are all released when it ends."""
        held = Holding(self, holder)
        try:
            yield held
        finally:
            held.release()


class Holding:
    """Reservations of one request (made by ``holder``, a token's identity, None without tokens)."""

    def __init__(self, budget: MemoryBudget, holder: str | None = None) -> None:
        self.budget = budget
        self.holder = holder
        self.total = 0

    def add(self, nbytes: int, what: str) -> None:
        self.budget.reserve(nbytes, what, self.total, self.holder)
        self.total += nbytes

    def release(self) -> None:
        total, self.total = self.total, 0
        self.budget.release(total, self.holder)
