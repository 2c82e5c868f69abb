"""Admission of gRPC calls: lanes that keep health checks apart from work, limits per server and per token, deadlines on every call."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from typing import Any

from snapshot.errors import InvalidArgumentError, OverloadedError

log = logging.getLogger("clink.pool")

# request bytes that count as progress of a stream: a client trickling empty or tiny messages is idle all the same
PROGRESS_BYTES = 64 << 10

OPEN_LANE = "open"  # health checks and refusals: answered at once, never behind authorised work
REFLECTION_LANE = "reflection"
WORK_LANE = "work"


@dataclass(frozen=True)
class AdmissionConfig:
    """How many calls the pool takes at once, and how long a call may last or wait on its client."""

    # RemotePool calls admitted at once (running or queued for a worker); past it, RESOURCE_EXHAUSTED at once
    max_calls: int = 64
    # of those, per bearer token (None: no per-token bound); a token cannot take every worker
    max_calls_per_token: int | None = 8
    # a call waiting this long on its client (the next request message, or room to send a response) is cancelled
    idle_s: float = 60.0
    # any call running longer than this is cancelled (a commit or scan of a large state included)
    max_call_s: float = 3600.0
    open_lane_threads: int = 4
    reflection_threads: int = 2
    # Health.Watch streams open at once (each costs memory for its life, though no thread); more get RESOURCE_EXHAUSTED
    max_health_watches: int = 256

    def __post_init__(self) -> None:
        for name in ("max_calls", "open_lane_threads", "reflection_threads"):
            if getattr(self, name) < 1:
                raise InvalidArgumentError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_calls_per_token is not None and self.max_calls_per_token < 1:
            raise InvalidArgumentError(f"max_calls_per_token must be at least 1 (or None), got {self.max_calls_per_token}")
        if self.idle_s <= 0 or self.max_call_s <= 0:
            raise InvalidArgumentError(f"idle_s and max_call_s must be positive, got {self.idle_s} and {self.max_call_s}")


class Ticket:
    """One admitted call: its lane, who it counts against, and whether it is waiting on its client (and since when)."""

    __slots__ = ("lane", "holder", "admission", "started", "waiting_since", "call", "released", "on_release", "watched", "received", "mark")

    def __init__(self, lane: str, holder: str | None, admission: Admission | None, on_release: Callable[[], None] | None = None) -> None:
        self.on_release = on_release
        self.watched: Callable | None = None  # a Health.Watch behavior counted until its stream ends
        self.lane = lane
        self.holder = holder
        self.admission = admission
        self.started = time.monotonic()
        self.waiting_since: float | None = None  # set when a worker takes the call (time in the queue is not the client's)
        self.call: Any = None  # grpc's call object, to cancel it
        self.released = False
        self.received = 0  # request bytes so far, and at the last progress: the idle clock restarts per PROGRESS_BYTES
        self.mark = 0

    def waiting(self) -> None:
        """The call now waits on its client (reading its next message, or sending it a response)."""
        self.waiting_since = time.monotonic()

    def working(self) -> None:
        """The call works on its own (store reads, encoding): no idle deadline runs."""
        self.waiting_since = None

    def awaiting(self) -> None:
        """The call waits for its client's next message; a wait already running goes on (small messages are no progress)."""
        if self.waiting_since is None:
            self.waiting_since = time.monotonic()

    def arrived(self, nbytes: int) -> None:
        """A request message arrived: progress (the idle clock stops) once PROGRESS_BYTES came since the last progress."""
        self.received += nbytes
        if self.received - self.mark >= PROGRESS_BYTES or not self.mark:
            self.mark = self.received or 1
            self.waiting_since = None

    def release(self) -> None:
        if not self.released:
            self.released = True
            if self.admission is not None:
                self.admission.release(self)
            if self.on_release is not None:
                self.on_release()


def tag(behavior: Callable, ticket: Ticket) -> Callable:
    """``behavior`` marked with its ticket (keeping grpc's non-blocking flag, which the health service's Watch relies on)."""

    def tagged(*args: Any, **kwargs: Any) -> Any:
        return behavior(*args, **kwargs)

    tagged.clink_ticket = ticket  # type: ignore[attr-defined]
    for flag in ("experimental_non_blocking", "experimental_thread_pool"):
        if hasattr(behavior, flag):
            setattr(tagged, flag, getattr(behavior, flag))
    return tagged


def attach(behavior: Callable, ticket: Ticket) -> Callable:
    """``behavior``, a function made for this one call, marked with its ticket itself (tag's wrapper would cost a call more)."""
    behavior.clink_ticket = ticket  # type: ignore[attr-defined]
    return behavior


class Admission:
    """Counts admitted calls in all and per holder; hands out tickets or refuses with OverloadedError naming the limit."""

    def __init__(self, config: AdmissionConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._calls = 0
        self._by_holder: dict[str, int] = {}
        self._watches = 0
        self.refused = 0

    def watch(self, behavior: Callable) -> Ticket:
        """A ticket for a Health.Watch stream, which counts until the stream ends; OverloadedError past max_health_watches."""
        with self._lock:
            if self._watches >= self.config.max_health_watches:
                self.refused += 1
                raise OverloadedError(f"{self._watches} health watches are open, the pool's limit; poll Health.Check instead")
            self._watches += 1
        done = threading.Event()

        def close() -> None:
            if not done.is_set():
                done.set()
                with self._lock:
                    self._watches -= 1

        ticket = Ticket(OPEN_LANE, None, None)
        ran = []

        def watched(request: Any, context: Any, *args: Any, **kwargs: Any) -> Any:
            ran.append(True)
            if not context.add_callback(close):  # the stream already ended
                close()
            return behavior(request, context, *args, **kwargs)

        # a call cancelled before its behavior ran never registers the callback: its ticket's release closes it
        ticket.on_release = lambda: None if ran else close()
        watched.experimental_non_blocking = getattr(behavior, "experimental_non_blocking", False)  # type: ignore[attr-defined]
        ticket.watched = watched
        return ticket

    def admit(self, lane: str, holder: str | None) -> Ticket:
        """A ticket for a call of ``holder`` (a token's name, None for open calls); OverloadedError past a limit."""
        if lane == OPEN_LANE:
            return Ticket(lane, None, None)
        config = self.config
        with self._lock:
            if self._calls >= config.max_calls:
                self.refused += 1
                raise OverloadedError(
                    f"the pool is serving {self._calls} calls, its limit (--max-concurrent-rpcs {config.max_calls}); retry later"
                )
            held = self._by_holder.get(holder, 0) if holder is not None else 0
            if holder is not None and config.max_calls_per_token is not None and held >= config.max_calls_per_token:
                self.refused += 1
                raise OverloadedError(
                    f"token {holder} has {held} calls in flight, its limit (--max-rpcs-per-token {config.max_calls_per_token}); retry later"
                )
            self._calls += 1
            if holder is not None:
                self._by_holder[holder] = held + 1
        return Ticket(lane, holder, self)

    def release(self, ticket: Ticket) -> None:
        with self._lock:
            self._calls -= 1
            if ticket.holder is not None:
                left = self._by_holder.get(ticket.holder, 1) - 1
                if left:
                    self._by_holder[ticket.holder] = left
                else:
                    self._by_holder.pop(ticket.holder, None)

    def in_flight(self) -> int:
        """Calls admitted and not yet finished."""
        with self._lock:
            return self._calls


def _ticket_of(args: tuple) -> tuple[Ticket | None, Any]:
    """The ticket of the behavior and grpc's call among the arguments grpc hands the executor (a call event has .call)."""
    ticket = call = None
    for arg in args:
        if ticket is None:
            ticket = getattr(arg, "clink_ticket", None)
        if call is None and hasattr(arg, "call_details") and hasattr(arg, "call"):
            call = arg.call
    return ticket, call


class LaneExecutor(futures.Executor):
    """The executor grpc runs handlers on: one thread pool per lane, so a flood in one lane never delays another.

    Every call with a ticket is watched: cancelled when it waits on its client longer than ``idle_s`` or runs longer than
    ``max_call_s`` (grpc's server has no deadline of its own), and its ticket is released when its handler returns.
    """

    def __init__(self, work_threads: int, config: AdmissionConfig) -> None:
        self.config = config
        self._pools = {
            WORK_LANE: futures.ThreadPoolExecutor(work_threads, thread_name_prefix="pool-rpc"),
            OPEN_LANE: futures.ThreadPoolExecutor(config.open_lane_threads, thread_name_prefix="pool-open"),
            REFLECTION_LANE: futures.ThreadPoolExecutor(config.reflection_threads, thread_name_prefix="pool-reflection"),
        }
        self._watched: set[Ticket] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.cancelled = 0
        self._watchdog = threading.Thread(target=self._watch, name="pool-watchdog", daemon=True)
        self._watchdog.start()

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> futures.Future:
        ticket, call = _ticket_of(args)
        if ticket is None:  # nothing admitted it (should not happen): run it with the work, unwatched
            return self._pools[WORK_LANE].submit(fn, *args, **kwargs)
        ticket.call = call
        with self._lock:
            self._watched.add(ticket)

        def run() -> Any:
            ticket.waiting()  # grpc first receives the request (a unary one before the handler runs)
            try:
                return fn(*args, **kwargs)
            finally:
                with self._lock:
                    self._watched.discard(ticket)
                ticket.release()

        try:
            return self._pools[ticket.lane].submit(run)
        except RuntimeError:  # shut down
            with self._lock:
                self._watched.discard(ticket)
            ticket.release()
            raise

    def _watch(self) -> None:
        interval = max(0.05, min(1.0, self.config.idle_s / 4))
        while not self._stop.wait(interval):
            now = time.monotonic()
            with self._lock:
                tickets = list(self._watched)
            for ticket in tickets:
                waited = now - ticket.waiting_since if ticket.waiting_since is not None else 0.0
                if waited > self.config.idle_s:
                    self._cancel(
                        ticket, f"the client sent or read nothing for {waited:.0f} s (the pool's idle limit is {self.config.idle_s:g} s)"
                    )
                elif now - ticket.started > self.config.max_call_s:
                    self._cancel(ticket, f"the call ran longer than the pool's limit of {self.config.max_call_s:g} s")

    def _cancel(self, ticket: Ticket, why: str) -> None:
        from grpc._cython import cygrpc  # grpc's server offers no public way to end a call from another thread

        with self._lock:
            if ticket not in self._watched:
                return
            self._watched.discard(ticket)
        self.cancelled += 1
        log.info("cancelling a %s call: %s", ticket.lane, why)
        if ticket.call is not None:
            ticket.call.cancel(cygrpc.StatusCode.deadline_exceeded, why)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._stop.set()
        for pool in self._pools.values():
            pool.shutdown(wait=wait, cancel_futures=cancel_futures)
