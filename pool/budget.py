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

    def __init__(self, limit_bytes: int, wait_s: float = 30.0, flag: str = "--request-memory-mb") -> None:
        self.limit = limit_bytes
        self.wait_s = wait_s
        self.flag = flag
        self.reserved = 0
        self.peak = 0
        self._cond = threading.Condition()

    def reserve(self, nbytes: int, what: str, own: int = 0) -> None:
        """Take ``nbytes`` for a holding that has ``own`` already; OverloadedError naming ``what`` and the limit when no room comes."""
        if nbytes <= 0:
            return
        deadline = time.monotonic() + (self.wait_s if not own else 0.0)
        with self._cond:
            while self.reserved > own and self.reserved + nbytes > self.limit:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise OverloadedError(f"{what}: the pool holds {self.reserved >> 20} MiB of request data in flight, "
                                          f"its limit ({self.flag} {self.limit >> 20}); retry later")
                self._cond.wait(left)
            self.reserved += nbytes
            self.peak = max(self.peak, self.reserved)

    def release(self, nbytes: int) -> None:
        if nbytes <= 0:
            return
        with self._cond:
            self.reserved -= nbytes
            self._cond.notify_all()

    @contextmanager
    def holding(self) -> Iterator[Holding]:
        """A scope whose reservations are all released when it ends."""
        held = Holding(self)
        try:
            yield held
        finally:
            self.release(held.total)


class Holding:
    """Reservations made within one MemoryBudget.holding() scope."""

    def __init__(self, budget: MemoryBudget) -> None:
        self.budget = budget
        self.total = 0

    def add(self, nbytes: int, what: str) -> None:
        self.budget.reserve(nbytes, what, self.total)
        self.total += nbytes
