"""A seeded cooperative scheduler: actors are threads, but exactly one runs at a time and they switch only at store calls."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field


class SimCrash(BaseException):
    """Raised inside an actor the scheduler crashes: the process it stands for stops at that store call."""


class Deadlock(RuntimeError):
    """An actor neither yielded nor finished in time (it blocked on something other than a store call)."""


@dataclass
class Actor:
    """One operation in flight (a commit, a GC run...), run on its own thread, paused at every store call."""

    name: str
    fn: Callable[[], object]
    go: threading.Event = field(default_factory=threading.Event)
    state: str = "new"  # new | waiting | running | done
    result: object = None
    error: BaseException | None = None
    crash: bool = False
    thread: threading.Thread | None = None
    steps: int = 0
    priority: float = 0.0
    waiting_since_ms: int = 0


class Scheduler:
    """Runs actors one at a time; ``step()`` lets one (chosen by the seeded rng) run to its next store call."""

    def __init__(self, rng: random.Random, stall_timeout_s: float = 60.0, pct: float = 0.0, max_pause_ms: int | None = None) -> None:
        self.rng = rng
        # pct > 0: priority scheduling (as PCT): the highest-priority actor runs until, with this chance per step, it is
        # pre-empted to the lowest priority right where it stands, so one actor stalls mid-operation while others finish
        self.pct = pct
        # the protocol assumes no process pauses longer than this between two store calls (its time bounds rely on it):
        # an actor that has waited so long runs next
        self.max_pause_ms = max_pause_ms
        self.actors: list[Actor] = []
        self.stall_timeout_s = stall_timeout_s
        self._yielded = threading.Event()
        self._local = threading.local()
        self.now_ms = 1_000_000  # logical clock: every step advances it
        self.steps = 0

    def current(self) -> Actor | None:
        """The actor whose thread calls this (None on the scheduler's own thread)."""
        return getattr(self._local, "actor", None)

    def spawn(self, name: str, fn: Callable[[], object]) -> Actor:
        """A new actor; it starts running only when the scheduler picks it."""
        actor = Actor(name, fn, priority=self.rng.random(), waiting_since_ms=self.now_ms)

        def body() -> None:
            self._local.actor = actor
            actor.go.wait()
            actor.go.clear()
            actor.state = "running"
            try:
                if actor.crash:
                    raise SimCrash(actor.name)
                actor.result = fn()
            except BaseException as exc:  # noqa: BLE001 - the world inspects every outcome, crashes included
                actor.error = exc
            finally:
                actor.state = "done"
                self._yielded.set()

        actor.thread = threading.Thread(target=body, name=f"sim-{name}", daemon=True)
        actor.state = "waiting"
        self.actors.append(actor)
        actor.thread.start()
        return actor

    def point(self) -> None:
        """Called by an actor at a store call: hand control back and wait to be picked again (or crashed)."""
        actor = self.current()
        if actor is None:
            return  # the world's own checks read the store directly
        actor.state = "waiting"
        actor.waiting_since_ms = self.now_ms
        self._yielded.set()
        actor.go.wait()
        actor.go.clear()
        actor.state = "running"
        if actor.crash:
            raise SimCrash(actor.name)

    def runnable(self) -> list[Actor]:
        """Actors paused at a store call (or not started)."""
        return [a for a in self.actors if a.state == "waiting"]

    def step(self, actor: Actor | None = None) -> Actor | None:
        """Let one actor run to its next store call or its end; returns it (None when nothing can run)."""
        ready = self.runnable()
        if not ready:
            return None
        if actor is None and self.max_pause_ms is not None:
            starved = [a for a in ready if self.now_ms - a.waiting_since_ms > self.max_pause_ms]
            if starved:
                actor = min(starved, key=lambda a: a.waiting_since_ms)
        if actor is None and self.pct:
            actor = max(ready, key=lambda a: a.priority)
            if self.rng.random() < self.pct:
                actor.priority = min(a.priority for a in self.actors) - 1.0
        actor = actor or self.rng.choice(ready)
        self._yielded.clear()
        actor.steps += 1
        self.steps += 1
        self.now_ms += self.rng.randint(1, 10)
        actor.go.set()
        if not self._yielded.wait(self.stall_timeout_s):
            raise Deadlock(f"actor {actor.name} neither reached a store call nor finished in {self.stall_timeout_s} s")
        if actor.state == "done":
            self.actors.remove(actor)
            actor.thread.join(5)
        return actor

    def crash(self, actor: Actor) -> None:
        """Stop an actor at its current store call (its thread unwinds with SimCrash when next picked)."""
        actor.crash = True

    def drain(self, max_steps: int = 100_000) -> None:
        """Run every actor to its end."""
        for _ in range(max_steps):
            if self.step() is None:
                return
        raise Deadlock(f"actors still running after {max_steps} steps: {[a.name for a in self.actors]}")
