"""Reads issued together become one MultiGet: a thread takes what was queued within a short window and fetches it at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from client.errors import InvalidArgumentError

Deliver = Callable[[list, BaseException | None], None]
Fetch = Callable[[list], list]

# a batch closes early at this many keys (the pool client splits larger MultiGets anyway)
MAX_BATCH_KEYS = 4096


class ReadCoalescer:
    """Queued reads, fetched by one thread: the first read of a batch waits ``window_s`` for others, then all go at once.

    While a fetch is in flight the next batch gathers, so under load batches grow on their own (as group commit does).
    Each submitter's ``deliver(values, error)`` is called once, on the coalescer's thread.
    """

    def __init__(self, fetch: Fetch, window_s: float, name: str = "clink-reads") -> None:
        self._fetch = fetch
        self._window_s = window_s
        self._queue: list[tuple[list, Deliver]] = []
        self._queued_keys = 0
        self._closed = False
        self._urgent = False
        self._cond = threading.Condition()
        self.batches = 0  # fetches made (each one MultiGet call of the backend)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, keys: list, deliver: Deliver, now: bool = False) -> None:
        """Queue keys; ``deliver`` gets their values in order, or the error of their fetch.

        ``now``: the keys are a batch already (an event loop's reads of one turn): fetch without waiting the window.
        """
        with self._cond:
            if self._closed:
                raise InvalidArgumentError("the backend is closed; no more reads")
            self._queue.append((keys, deliver))
            self._queued_keys += len(keys)
            self._urgent = self._urgent or now
            self._cond.notify()

    def close(self) -> None:
        """Stop; reads still queued are failed (the backend that owns them is closed)."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    def _take(self) -> list[tuple[list, Deliver]] | None:
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if self._closed:
                batch, self._queue = self._queue, []
                for _, deliver in batch:
                    deliver([], InvalidArgumentError("the backend was closed before this read was answered"))
                return None
            deadline = time.monotonic() + self._window_s
            while self._queued_keys < MAX_BATCH_KEYS and not self._closed and not self._urgent:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            batch, self._queue, self._queued_keys, self._urgent = self._queue, [], 0, False
            return batch

    def _run(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            keys = [k for ks, _ in batch for k in ks]
            try:
                values = self._fetch(keys)
            except BaseException as exc:  # every reader of the batch learns why; the thread goes on
                for _, deliver in batch:
                    deliver([], exc)
                continue
            self.batches += 1
            at = 0
            for ks, deliver in batch:
                deliver(values[at : at + len(ks)], None)
                at += len(ks)
