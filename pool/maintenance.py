"""Maintenance that runs itself inside a pool: per job, under its lease, compaction, retention and GC on a timer."""

from __future__ import annotations

import copy
import logging
import random
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pool.compaction import Compaction
from pool.durations import parse_duration
from pool.gc import GarbageCollector
from pool.job_policy import JobPolicy, read_job_policy
from pool.lifecycle import Lifecycle
from pool.lifecycle_context import LifecycleConfig, LifecycleContext
from pool.maintenance_lease import Lease, MaintenanceLeases
from pool.pins import Pins
from pool.retention import Retention
from snapshot.errors import ClinkError, InvalidArgumentError
from store.checkpoint import CheckpointReader
from store.layout import JOBS
from store.objects import ObjectStore

if TYPE_CHECKING:
    from pool.metrics import MaintenanceMetrics

log = logging.getLogger("clink.pool.maintenance")

TASKS = ("compaction", "retention", "gc")


@dataclass(frozen=True)
class MaintenanceConfig:
    """What a pool's own maintenance does and how often: thresholds, retention depth, GC age, which tasks, the lease.

    Defaults are safe for any job: compact a part over 8 layers or 256 MiB of deltas, keep the newest 3 checkpoints (plus
    pinned ones; savepoints live outside jobs/ and are never touched), delete unreferenced files older than an hour.
    """

    enabled: bool = True
    interval_s: float = 60.0  # one round over every job this often (jittered by up to a tenth, so pools spread out)
    lease_ttl_s: float | None = None  # None: 3 x interval_s; renewed before every task, so it must exceed 2 x interval_s
    keep_last: int = 3
    compact_max_layers: int = 8
    compact_max_delta_bytes: int = 256 << 20
    gc_min_age_s: float = 3600.0
    compaction: bool = True
    retention: bool = True
    gc: bool = True
    max_jobs_per_round: int | None = None  # None: every job each round; else this many, the next ones the round after
    history: int = 20  # runs kept in memory per job (the status page shows them)
    stop_timeout_s: float = 30.0  # how long stop() waits for a task in progress before it returns

    def __post_init__(self) -> None:
        for name in ("enabled", "compaction", "retention", "gc"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidArgumentError(f"maintenance {name} = {getattr(self, name)!r} must be true or false")
        for name in ("interval_s", "gc_min_age_s", "stop_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 or (name != "gc_min_age_s" and value == 0):
                raise InvalidArgumentError(f"maintenance {name} = {value!r} must be a positive number of seconds")
        for name in ("keep_last", "compact_max_layers", "compact_max_delta_bytes", "history"):
            value, least = getattr(self, name), 0 if name == "compact_max_delta_bytes" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise InvalidArgumentError(f"maintenance {name} = {value!r} must be an integer of at least {least}")
        jobs = self.max_jobs_per_round
        if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
            raise InvalidArgumentError(f"maintenance max_jobs_per_round = {jobs!r} must be an integer of at least 1 (or unset: every job)")
        ttl = self.lease_ttl_s
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int | float) or not ttl > 0):
            raise InvalidArgumentError(f"maintenance lease_ttl_s = {ttl!r} must be a positive number of seconds")
        ttl = self.ttl_s
        if not self.interval_s < ttl / 2:
            raise InvalidArgumentError(
                f"maintenance interval_s = {self.interval_s:g} must be less than half of lease_ttl_s = {ttl:g}, "
                "so a holder renews its leases before they can lapse"
            )

    @property
    def ttl_s(self) -> float:
        """The lease's time to live in seconds: lease_ttl_s, or 3 x interval_s when unset."""
        return float(self.lease_ttl_s) if self.lease_ttl_s is not None else 3 * float(self.interval_s)

    def tasks(self) -> tuple[str, ...]:
        """The tasks a round runs, in order."""
        return tuple(t for t in TASKS if getattr(self, t))

    def check_writes(self, max_write_s: float, max_commit_s: float | None = None) -> MaintenanceConfig:
        """This config when GC's minimum age exceeds the longest write it must not race; InvalidArgumentError naming both.

        GC protects only files younger than its minimum age, so a commit (PoolConfig.max_commit_s) or a compaction,
        savepoint or restore (LifecycleConfig.max_write_s) still writing when its first files pass that age could lose them.
        """
        for name, bound in (("LifecycleConfig.max_write_s", max_write_s), ("PoolConfig.max_commit_s", max_commit_s)):
            if bound is not None and not self.gc_min_age_s > bound:
                raise InvalidArgumentError(
                    f"maintenance gc_min_age_s = {self.gc_min_age_s:g} s must exceed {name} = {bound:g} s "
                    "(GC protects only files younger than its minimum age, and a write may take that long)"
                )
        return self

    def to_dict(self) -> dict[str, object]:
        """The config as plain JSON values (for the status page), the lease's TTL resolved."""
        return {**asdict(self), "lease_ttl_s": self.ttl_s}


# --- the policy file -------------------------------------------------------------------------------------------

_DURATION_KEYS = frozenset({"interval_s", "lease_ttl_s", "gc_min_age_s", "stop_timeout_s"})
# the file's spellings: a duration key may drop its _s (interval = "5m"); each is the config field it sets
_FILE_KEYS = {f.name: f.name for f in fields(MaintenanceConfig)} | {k.removesuffix("_s"): k for k in _DURATION_KEYS}


def _duration(value: object) -> float:
    """A TOML duration: a number of seconds or a string with a unit ("30s", "5m", "1h"), read by the flags' one parser."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InvalidArgumentError("not a duration")
    try:
        return parse_duration(str(value))
    except InvalidArgumentError:
        raise InvalidArgumentError("not a duration (a number of seconds, or with a unit: 30s, 5m, 1h, 7d)") from None


def _read_toml(path: Path) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10 reads TOML with the tomli backport
        try:
            import tomli as tomllib  # type: ignore[import-not-found]
        except ModuleNotFoundError:
            raise InvalidArgumentError(f"maintenance policy {path}: reading TOML on Python 3.10 needs the tomli package") from None
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except OSError as exc:
        raise InvalidArgumentError(f"maintenance policy {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidArgumentError(f"maintenance policy {path}: not TOML: {exc}") from None
    except UnicodeDecodeError as exc:  # tomllib decodes the bytes itself: this is no TOMLDecodeError
        raise InvalidArgumentError(f"maintenance policy {path}: not UTF-8 text (byte {exc.start})") from None


def maintenance_config_of(table: dict[str, Any], where: str, base: MaintenanceConfig | None = None) -> MaintenanceConfig:
    """A MaintenanceConfig from a [maintenance] table's values over ``base``; InvalidArgumentError, one line naming the key."""
    values: dict[str, object] = {}
    for key, raw in table.items():
        name = _FILE_KEYS.get(key)
        if name is None:
            raise InvalidArgumentError(f"{where}: unknown key {key!r} in [maintenance] (known: {', '.join(sorted(_FILE_KEYS))})")
        try:
            values[name] = _duration(raw) if name in _DURATION_KEYS else raw
            if name == "compact_max_delta_bytes" and isinstance(raw, str):
                raise InvalidArgumentError("not a number of bytes")
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"{where}: key {key!r} = {_toml_repr(raw)}: {exc}") from None
    try:
        return replace(base or MaintenanceConfig(), **values)  # type: ignore[arg-type]
    except InvalidArgumentError as exc:
        named = next((k for k in table if _FILE_KEYS[k] in str(exc)), None)
        lead = f"key {named!r} = {_toml_repr(table[named])}: " if named is not None else ""
        raise InvalidArgumentError(f"{where}: {lead}{str(exc).removeprefix('maintenance ')}") from None


def _toml_repr(value: object) -> str:
    """A value as TOML writes it (strings in double quotes, true/false), for error lines."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


def load_maintenance_policy(path: str | Path, base: MaintenanceConfig | None = None) -> MaintenanceConfig:
    """The MaintenanceConfig of a TOML file's [maintenance] table (over ``base``, default the defaults).

    Keys are MaintenanceConfig's fields; a duration (interval, lease_ttl, gc_min_age, stop_timeout, with or without _s)
    is a number of seconds or "30s" / "5m" / "1h". An unknown key, a bad value, a table other than [maintenance] or an
    unreadable file is an InvalidArgumentError of one line naming the file and the key.
    """
    path = Path(path)
    where = f"maintenance policy {path}"
    doc = _read_toml(path)
    others = sorted(k for k in doc if k != "maintenance")
    if others:
        raise InvalidArgumentError(f"{where}: unknown key {others[0]!r} at the top level (the file holds one [maintenance] table)")
    table = doc.get("maintenance", {})
    if not isinstance(table, dict):
        raise InvalidArgumentError(f"{where}: key 'maintenance' must be a table ([maintenance])")
    return maintenance_config_of(table, where, base)


# --- runs and the maintainer -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class MaintenanceRun:
    """One task's run on one job: when, how long, how it ended and what it freed."""

    task: str
    started_ms: int
    duration_s: float
    outcome: str  # ok | error | skipped
    detail: str  # an error's starts with its class name (UnavailableError: ...)
    bytes_reclaimed: int = 0
    layers_folded: int = 0
    checkpoints_deleted: int = 0

    def to_dict(self) -> dict[str, object]:
        """The run as plain JSON values."""
        return asdict(self)


@dataclass
class _JobState:
    runs: deque[MaintenanceRun]
    lease: Lease | None = None
    last_error: str | None = None


class Maintainer:
    """Runs a pool's maintenance: ``start()`` a background thread (a round every interval), or ``run_once()`` one round now.

    A round lists the jobs; for each it reads the job's policy (pool.job_policy), takes or renews the job's lease and,
    only while the lease is ours with at least half its TTL left (renewed before each task), compacts the latest
    checkpoint when a part passes the thresholds, applies retention (keep_last, pins and live writers' restore points
    kept), then collects the job's garbage past the minimum age. One job's failure is recorded and the round goes on.
    """

    def __init__(
        self,
        store: ObjectStore,
        lifecycle_or_context: Lifecycle | LifecycleContext,
        config: MaintenanceConfig,
        holder_id: str,
        clock: Callable[[], float] = time.time,
        metrics: MaintenanceMetrics | None = None,
        max_commit_s: float | None = None,
    ) -> None:
        context = lifecycle_or_context.context if isinstance(lifecycle_or_context, Lifecycle) else lifecycle_or_context
        config.check_writes(context.config.max_write_s, max_commit_s)
        self.store = store
        self.context = context
        self.config = config
        self.holder_id = holder_id
        self.clock = clock
        self.metrics = metrics
        self.leases = MaintenanceLeases(store, holder_id, config.ttl_s, clock)
        self._jobs: dict[str, _JobState] = {}
        self._lock = threading.Lock()  # guards _jobs and the round counters
        self._round_lock = threading.Lock()  # one round at a time (the thread's and run_once's)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop_thread: threading.Thread | None = None  # the thread that runs rounds (kept after stop(), for _stopping)
        self._next_job = 0  # where the next round starts when max_jobs_per_round cuts rounds short
        self.rounds = 0
        self.last_round_ms: int | None = None
        self.last_error: str | None = None
        self._rng = random.Random()
        if metrics is not None:
            metrics.watch_leases(self.leases_held)

    # ---- the thread --------------------------------------------------------------------------------------------

    def start(self) -> Maintainer:
        """Run rounds on a daemon thread until stop(); the first round starts at once."""
        if self._thread is not None or not self.config.enabled:
            return self
        self._stop.clear()
        self._thread = self._loop_thread = threading.Thread(target=self._loop, name="pool-maintenance", daemon=True)
        self._thread.start()
        log.info("maintenance on as %s: a round every %gs (lease %gs)", self.holder_id, self.config.interval_s, self.config.ttl_s)
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.run_once()
            except Exception as exc:  # noqa: BLE001 - the thread must outlive any round (run_once records what it can)
                log.exception("maintenance round failed")
                self._round_failed(exc)
            pause = self.config.interval_s * self._rng.uniform(0.9, 1.1) - (time.monotonic() - started)
            self._stop.wait(max(0.0, pause))

    @property
    def running(self) -> bool:
        """Whether the background thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self, release: bool = True) -> bool:
        """Stop the thread, waiting up to stop_timeout_s for a task in progress; then (``release``) give back our leases.

        Returns whether the thread ended in time. Leases are released only then (a task still running keeps its lease
        until it lapses); ``release=False`` leaves them to expire, as a killed process does.
        """
        self._stop.set()
        thread, self._thread = self._thread, None
        ended = True
        if thread is not None:
            thread.join(self.config.stop_timeout_s)
            ended = not thread.is_alive()
            if not ended:
                log.warning("maintenance still busy after %gs; its leases lapse on their own", self.config.stop_timeout_s)
        if release and ended:
            self.release_leases()
        elif not release:
            with self._lock:  # left to lapse: a later stop() (the server's) must not give them back either
                for state in self._jobs.values():
                    state.lease = None
        return ended

    def release_leases(self) -> int:
        """Expire every lease this maintainer holds now (a clean stop); how many it released."""
        with self._lock:
            held = [(job, st.lease) for job, st in self._jobs.items() if st.lease is not None and self._ours(st.lease)]
        released = 0
        for job, lease in held:
            assert lease is not None
            try:
                if self.leases.release(lease):
                    released += 1
            except ClinkError as exc:
                log.warning("could not release the maintenance lease of job %s: %s", job, exc)
            with self._lock:
                self._jobs[job].lease = None
        return released

    # ---- one round ---------------------------------------------------------------------------------------------

    def run_once(self) -> dict[str, list[MaintenanceRun]]:
        """One round now, synchronously: each job's runs of this round (jobs whose lease another pool holds: none)."""
        with self._round_lock:
            out: dict[str, list[MaintenanceRun]] = {}
            if not self.config.enabled or not self.config.tasks():
                return out
            try:
                listed = self.store.list_prefixes(JOBS)
            except ClinkError as exc:
                self._round_failed(exc)
                return out
            jobs = listed
            if self.config.max_jobs_per_round is not None and len(listed) > self.config.max_jobs_per_round:
                start = self._next_job % len(listed)
                jobs = (listed[start:] + listed[:start])[: self.config.max_jobs_per_round]
                self._next_job = start + len(jobs)
            for job in jobs:
                if self._stopping():
                    break
                out[job] = self.maintain_job(job)
            with self._lock:
                self.rounds += 1
                self.last_round_ms = self._now_ms()
                self.last_error = None
                for gone in set(self._jobs) - set(listed):
                    del self._jobs[gone]  # a deleted job: nothing left to show
            return out

    def _stopping(self) -> bool:
        """Whether the background thread was told to stop (a run_once of the caller's own always finishes its round)."""
        return self._stop.is_set() and threading.current_thread() is self._loop_thread

    def _round_failed(self, exc: BaseException) -> None:
        with self._lock:
            self.last_error = f"{type(exc).__name__}: {exc}"
        if self.metrics is not None:
            self.metrics.round_failed()
        log.warning("maintenance round could not list the jobs: %s", exc)

    def maintain_job(self, job: str) -> list[MaintenanceRun]:
        """One job's part of a round: its policy, its lease, then each task while the lease stays ours."""
        runs: list[MaintenanceRun] = []
        state = self._state(job)
        tasks = self.config.tasks()
        try:
            policy = read_job_policy(self.store, job)
        except ClinkError as exc:  # a policy it cannot read might turn maintenance off: the job is left alone
            runs.append(
                self._record(
                    job, MaintenanceRun(tasks[0], self._now_ms(), 0.0, "error", f"{type(exc).__name__}: reading the job's policy: {exc}")
                )
            )
            return runs
        if policy is not None and not policy.maintenance:
            for task in tasks:
                runs.append(
                    self._record(job, MaintenanceRun(task, self._now_ms(), 0.0, "skipped", "maintenance is off in the job's policy"))
                )
            return runs
        context = self._job_context(policy)
        errors = 0
        for task in tasks:
            if self._stopping():
                break
            try:
                lease, other = self.leases.acquire(job)
            except ClinkError as exc:
                runs.append(
                    self._record(job, MaintenanceRun(task, self._now_ms(), 0.0, "error", f"{type(exc).__name__}: taking the lease: {exc}"))
                )
                errors += 1
                break
            with self._lock:
                state.lease = lease or other
            if lease is None:
                if runs:  # we held it for an earlier task of this round and lost it since
                    holder = other.holder if other is not None else "nobody"
                    runs.append(self._record(job, MaintenanceRun(task, self._now_ms(), 0.0, "skipped", f"lease lost to {holder}")))
                break  # another pool maintains this job
            if lease.expires_ms - self._now_ms() < self.leases.ttl_ms // 2:
                runs.append(self._record(job, MaintenanceRun(task, self._now_ms(), 0.0, "skipped", "too little lease time left")))
                break
            run = self._run_task(job, task, context, lease)
            runs.append(self._record(job, run))
            errors += run.outcome == "error"
        if not errors:
            with self._lock:
                state.last_error = None
        return runs

    def _job_context(self, policy: JobPolicy | None) -> LifecycleContext:
        """The lifecycle context a job's tasks run with: the pool's, with this policy's thresholds (the job's own first)."""
        own = policy or JobPolicy()
        config: LifecycleConfig = replace(
            self.context.config,
            retain_last=own.keep_last or self.config.keep_last,
            compact_max_layers=own.compact_max_layers or self.config.compact_max_layers,
            compact_max_delta_bytes=own.compact_max_delta_bytes or self.config.compact_max_delta_bytes,
            gc_min_age_s=self.config.gc_min_age_s,
        )
        context = copy.copy(self.context)  # the same store, clock, cache, fencing and manifest callback
        context.config = config
        return context

    def _run_task(self, job: str, task: str, context: LifecycleContext, lease: Lease) -> MaintenanceRun:
        started_ms = self._now_ms()
        began = time.perf_counter()
        try:
            if task == "compaction":
                outcome, detail, counts = self._compact(job, context)
            elif task == "retention":
                outcome, detail, counts = self._retain(job, context)
            else:
                outcome, detail, counts = self._gc(job, context, lease)
        except ClinkError as exc:
            outcome, detail, counts = "error", f"{type(exc).__name__}: {exc}", {}
        except Exception as exc:  # noqa: BLE001 - a defect in one job's task is that job's error, not the thread's end
            log.exception("maintenance %s of job %s failed", task, job)
            outcome, detail, counts = "error", f"{type(exc).__name__}: {exc}", {}
        return MaintenanceRun(task, started_ms, time.perf_counter() - began, outcome, detail, **counts)

    def _compact(self, job: str, context: LifecycleContext) -> tuple[str, str, dict[str, int]]:
        latest = CheckpointReader(context.store, job, context.cache).latest()
        if not latest:
            return "skipped", "no complete checkpoint yet", {}
        result = Compaction(context).compact(job, latest)  # the latest: what the next commits build on
        if not result.folded:
            limits = f"{context.config.compact_max_layers} layers or {context.config.compact_max_delta_bytes} delta bytes"
            return "skipped", f"checkpoint {result.checkpoint_id}: no part over {limits}", {}
        layers = sum(before for _, _, before in result.folded)
        detail = (
            f"checkpoint {result.checkpoint_id}: folded {len(result.folded)} part(s), {layers} layers, "
            f"into {result.files_written} file(s) of {result.bytes_written} bytes"
        )
        return "ok", detail, {"layers_folded": layers}

    def _retain(self, job: str, context: LifecycleContext) -> tuple[str, str, dict[str, int]]:
        result = Retention(context, Pins(context)).retain(job, context.config.retain_last)
        detail = f"deleted {len(result.deleted)} checkpoint(s), kept {len(result.kept)}, {len(result.pinned)} kept by pins"
        if result.deleted:
            detail += f" (deleted {', '.join(map(str, result.deleted))})"
        return "ok", detail, {"checkpoints_deleted": len(result.deleted)}

    def _gc(self, job: str, context: LifecycleContext, lease: Lease) -> tuple[str, str, dict[str, int]]:
        margin_ms = self.leases.ttl_ms // 4

        def lapsing(done: int, planned: int) -> str | None:  # stop deleting once the lease may lapse (or we stop)
            if self._now_ms() >= lease.expires_ms - margin_ms or self._stopping():
                return f"stopped after {done} of {planned} deletes: the lease is about to lapse or the pool is stopping"
            return None

        result = GarbageCollector(context, Pins(context)).gc(job, stop=lapsing, by_store_clock=True)
        detail = f"deleted {len(result.deleted)} file(s), {result.deleted_bytes} bytes; {result.too_young} too young"
        if result.skipped_jobs:
            detail += "; the job's checkpoints kept changing, judged again next round"
        if result.stopped:  # its progress marker stays: the next run in scope recomputes from a fresh listing
            detail = f"{result.stopped}; {detail}"
        return "ok", detail, {"bytes_reclaimed": result.deleted_bytes}

    # ---- bookkeeping -------------------------------------------------------------------------------------------

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def _ours(self, lease: Lease) -> bool:
        return lease.holder == self.holder_id and lease.expires_ms > self._now_ms()

    def _state(self, job: str) -> _JobState:
        with self._lock:
            state = self._jobs.get(job)
            if state is None:
                state = self._jobs[job] = _JobState(deque(maxlen=self.config.history))
            return state

    def _record(self, job: str, run: MaintenanceRun) -> MaintenanceRun:
        state = self._state(job)
        with self._lock:
            state.runs.append(run)
            if run.outcome == "error":
                state.last_error = f"{run.task}: {run.detail}"
        if self.metrics is not None:
            self.metrics.task_finished(
                run.task, run.outcome, run.duration_s, run.bytes_reclaimed, run.layers_folded, run.checkpoints_deleted
            )
        if run.outcome == "error":
            log.warning("maintenance %s of job %s failed: %s", run.task, job, run.detail)
        elif run.outcome == "ok" and (run.bytes_reclaimed or run.layers_folded or run.checkpoints_deleted):
            log.info("maintenance %s of job %s: %s", run.task, job, run.detail)
        return run

    def leases_held(self) -> int:
        """Jobs whose lease this maintainer holds now (by its clock)."""
        with self._lock:
            return sum(1 for st in self._jobs.values() if st.lease is not None and self._ours(st.lease))

    def status(self, job: str | None = None) -> dict[str, Any]:
        """What the status page shows: holder, config, and per job (all, or ``job``) its lease, last runs (oldest first), last error."""
        now = self._now_ms()
        with self._lock:
            names = sorted(self._jobs) if job is None else [job]
            jobs: dict[str, dict[str, Any]] = {}
            for name in names:
                st = self._jobs.get(name)
                lease = None if st is None else st.lease
                jobs[name] = {
                    "lease": None if lease is None else lease.to_dict(self.holder_id, now),
                    "runs": [] if st is None else [run.to_dict() for run in st.runs],
                    "last_error": None if st is None else st.last_error,
                }
            return {
                "holder_id": self.holder_id,
                "enabled": self.config.enabled,
                "running": self.running,
                "rounds": self.rounds,
                "last_round_ms": self.last_round_ms,
                "last_error": self.last_error,
                "config": self.config.to_dict(),
                "jobs": jobs,
            }


@contextmanager
def maintaining(maintainer: Maintainer) -> Iterator[Maintainer]:
    """start() the maintainer, stop() it (releasing its leases) on exit."""
    maintainer.start()
    try:
        yield maintainer
    finally:
        maintainer.stop()


__all__ = ["TASKS", "MaintenanceConfig", "MaintenanceRun", "Maintainer", "load_maintenance_policy", "maintaining", "maintenance_config_of"]
