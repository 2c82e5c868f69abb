"""Reads issued together become one MultiGet: a thread takes what was queued within a short window and fetches it at once."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from client.errors import InvalidArgumentError

Deliver = Callable[[list, BaseException | None], None]
Fetch = Callable[[list, Any], list]  # (keys, the read point they were issued at) -> values
Entry = tuple[list, Deliver, Any]


class ReadCoalescer:
    """Queued reads, fetched by one thread: a batch's first read waits ``window_s`` for others (up to ``max_keys``).

    While a fetch is in flight the next batch gathers, so under load batches grow on their own (as group commit does).
    Each submitter's ``deliver(values, error)`` is called once, on the coalescer's thread.
    """

    def __init__(self, fetch: Fetch, window_s: float, max_keys: int, name: str = "clink-reads") -> None:
        self._fetch = fetch
        self._window_s = window_s
        self._max_keys = max_keys
        self._queue: list[Entry] = []
        self._queued_keys = 0
        self._closed = False
        self._urgent = False
        self._cond = threading.Condition()
        # one fetch in flight: a second MultiGet beside it costs more (per call, and in the GIL) than waiting for the first
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, keys: list, deliver: Deliver, at: Any = None, now: bool = False) -> None:
        """Queue keys; ``deliver`` gets their values in order, or the error of their fetch.

        ``at``: where they are read (the read checkpoint when they were issued); only reads of one ``at`` share a fetch.
        ``now``: the keys are a batch already (an event loop's reads of one turn): fetch without waiting the window.
        """
        with self._cond:
            if self._closed:
                raise InvalidArgumentError("the backend is closed; no more reads")
            self._queue.append((keys, deliver, at))
            self._queued_keys += len(keys)
            self._urgent = self._urgent or now
            self._cond.notify()

    def close(self) -> None:
        """Stop; reads still queued are failed (the backend that owns them is closed). A fetch in flight is not waited for."""
        with self._cond:
            self._closed = True
            batch, self._queue = self._queue, []
            self._cond.notify_all()
        _deliver_all(batch, [], InvalidArgumentError("the backend was closed before this read was answered"))

    def _take(self) -> list[Entry] | None:
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            deadline = time.monotonic() + self._window_s
            while self._queued_keys < self._max_keys and not self._closed and not self._urgent:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            at = self._queue[0][2]
            taken, keys = 0, 0
            while taken < len(self._queue) and (keys < self._max_keys or not taken) and self._queue[taken][2] == at:
                keys += len(self._queue[taken][0])
                taken += 1
            batch, self._queue = self._queue[:taken], self._queue[taken:]
            self._queued_keys -= keys
            self._urgent = self._urgent and bool(self._queue)
            return batch

    def _run(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            keys = [k for ks, _, _ in batch for k in ks]
            try:
                values = self._fetch(keys, batch[0][2])
            except BaseException as exc:  # every reader of the batch learns why; the thread goes on
                _deliver_all(batch, [], exc)
                continue
            start = 0
            for ks, deliver, _ in batch:
                _deliver_all([(ks, deliver, None)], values[start : start + len(ks)], None)
                start += len(ks)


def _deliver_all(batch: list[Entry], values: list, error: BaseException | None) -> None:
    """Hand each entry its answer; a deliver that raises is logged, and the rest are still answered."""
    for _, deliver, _ in batch:
        try:
            deliver(values, error)
        except Exception:
            logging.getLogger(__name__).exception("an asynchronous read's callback raised")
