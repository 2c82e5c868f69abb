"""The multi-pool load: worker processes that checkpoint rounds of writes through several pools, and the driver checking them.

Each worker is one subtask of one job (its own key-group range): rounds of puts, overwrites, erases and re-puts through
RemoteReadBackend, a checkpoint per round, its model of every round reported. The driver may SIGKILL a pool mid-run and
restart it, then compares every checkpoint still listed with the union of the models. Used by tests/system/test_multi_pool_load.py and bench/bench_multi_pool.py.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import pickle
import random
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from client.pool_client import RetryPolicy
from tests.multi_pool_fixtures import PoolGroup, add_counts, maintenance_counts, store_counts

# two operators: a value committed under the other's op_id is a difference the check sees
OPERATORS = ("multi-pool-load-a", "multi-pool-load-b")
StateKey = tuple[int, bytes]  # (op_id, key_bytes)
# the client's default retries: a call finding a pool down fails over to the next address at once
WORKER_RETRY = RetryPolicy()
CONNECT_TIMEOUT_S = 120  # spawned workers import grpc and pyarrow: 8 of them on 2 cores take a while
HOLD_TIMEOUT_S = 120  # a worker waits this long at most for the driver's go-ahead after the restart
MAINTENANCE_TIMEOUT_S = 60  # how long the driver waits for maintenance to act (a lease of a killed holder lapses first)


@dataclass(frozen=True)
class Workload:
    """What every worker does: ``rounds`` checkpoints over ``keys`` keys of its own range, of values ``value_bytes`` long."""

    job: str
    workers: int = 8
    rounds: int = 8
    keys: int = 200  # per worker
    value_bytes: int = 40
    reads: int = 32  # keys read back per round (get_many) and compared with the worker's model
    seed: int = 0

    def ranges(self) -> list[tuple[int, int]]:
        """``workers`` key-group ranges tiling 0..127."""
        edges = np.linspace(0, 128, self.workers + 1).astype(int)
        return [(int(edges[i]), int(edges[i + 1]) - 1) for i in range(self.workers)]


@dataclass(frozen=True)
class WorkerTask:
    """One worker's assignment: its range, the pool address(es), where to write its report."""

    index: int
    address: str
    key_groups: tuple[int, int]
    workload: Workload
    report_path: str
    retry: RetryPolicy = WORKER_RETRY
    # the worker waits before this round (0: never) until the driver says go on: the killed pool is back for the last rounds
    hold_before_round: int = 0


@dataclass
class WorkerReport:
    """What a worker saw: its changes per round (its model), every exception, its reads that disagreed, its retries."""

    index: int
    key_groups: tuple[int, int]
    # changes[r] = the net change of round r + 1: state key -> value, or None for an erase
    changes: list[dict[StateKey, bytes | None]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    read_mismatches: list[str] = field(default_factory=list)
    commits: int = 0
    rows: int = 0  # changelog rows shipped (puts and erases)
    reads: int = 0
    calls: int = 0
    retries: int = 0  # PoolClient.retries: calls tried again after UNAVAILABLE / RESOURCE_EXHAUSTED
    commit_retries: int = 0  # attempts beyond the first of the commits
    recovered_commits: int = 0  # retries the pool answered as a repeat of an attempt that had landed
    t_start: float = 0.0
    t_end: float = 0.0

    def model(self, rounds: int | None = None) -> dict[StateKey, bytes]:
        """The worker's state after ``rounds`` rounds (None: all)."""
        state: dict[StateKey, bytes] = {}
        for change in self.changes[:rounds]:
            apply_change(state, change)
        return state


def apply_change(state: dict[StateKey, bytes], change: dict[StateKey, bytes | None]) -> None:
    """Fold one round's net change into ``state``."""
    for key, value in change.items():
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value


def keys_in(lo: int, hi: int, count: int, seed: int) -> list[bytes]:
    """``count`` distinct keyed keys (slot "v") whose key group is in lo..hi, picked from candidates hashed in one numpy pass."""
    import snapshot
    from snapshot.keys import key_groups_of_runs

    width = hi - lo + 1
    n = count * 128 // width * 2 + 64  # twice the candidates the range's share needs
    users = pc.binary_join_element_wise(
        pa.scalar(f"s{seed}-".encode()), pc.cast(pa.array(np.arange(n)), pa.string()).cast(pa.binary()), b""
    )
    offsets = np.frombuffer(users.buffers()[1], dtype=np.int32)[users.offset : users.offset + n + 1]
    data = np.frombuffer(users.buffers()[2], dtype=np.uint8)
    groups = key_groups_of_runs(data, offsets[:-1], np.diff(offsets))
    picked = users.filter(pa.array((groups >= lo) & (groups <= hi))).to_pylist()[:count]
    assert len(picked) == count, f"only {len(picked)} of {count} candidate keys fell in key groups {lo}-{hi}"
    return [snapshot.encode_keyed_key("v", user) for user in picked]


class _Round:
    """One round's writes, applied to the backend and to the model in the same order (newest wins in both)."""

    def __init__(self, backend: Any, live: dict[StateKey, bytes], tag: str, value_bytes: int) -> None:
        self.backend, self.live, self.tag, self.value_bytes = backend, live, tag, value_bytes
        self.change: dict[StateKey, bytes | None] = {}
        self.n = 0

    def value(self) -> bytes:
        self.n += 1
        return f"{self.tag}.{self.n}.".encode().ljust(self.value_bytes, b"x")

    def put(self, keys: list[StateKey]) -> None:
        """put_many per operator, each key a fresh value."""
        values = {k: self.value() for k in keys}
        for op in {op for op, _ in keys}:
            mine = [k for k in keys if k[0] == op]
            self.backend.put_many(op, [k for _, k in mine], [values[k] for k in mine])
        self.live.update(values)
        self.change.update(values)

    def erase(self, keys: list[StateKey]) -> None:
        for op, key in keys:
            self.backend.erase(op, key)
            self.live.pop((op, key), None)
            self.change[(op, key)] = None


def run_worker(task: WorkerTask, ready: Any, go: Any, resume: Any, progress: Any) -> None:
    """A worker process's entry (spawned): the rounds, then its report pickled to ``task.report_path`` whatever happened."""
    report = WorkerReport(task.index, task.key_groups)
    try:
        _work(task, report, ready, go, resume, progress)
    except BaseException as exc:  # noqa: BLE001  # every failure goes to the report: none is allowed
        report.errors.append(f"worker {task.index}: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    finally:
        tmp = f"{task.report_path}.tmp"
        with open(tmp, "wb") as out:
            pickle.dump(report, out)
        os.replace(tmp, task.report_path)


def _work(task: WorkerTask, report: WorkerReport, ready: Any, go: Any, resume: Any, progress: Any) -> None:
    from client.backend import BackendConfig, RemoteReadBackend

    wl = task.workload
    # no read cache: every read not in the worker's own unconfirmed layers is a MultiGet to some pool
    config = BackendConfig(retry=task.retry, cache_bytes=0, warm_up="off", seed=task.index)
    rng = random.Random(wl.seed * 1000 + task.index)
    backend = RemoteReadBackend.connect(task.address, wl.job, task.key_groups, config)
    with backend:
        ops = [backend.register_operator(uid) for uid in OPERATORS]
        universe = [(ops[i % len(ops)], key) for i, key in enumerate(keys_in(*task.key_groups, wl.keys, seed=wl.seed * 1000 + task.index))]
        never_written = [(ops[0], key) for key in keys_in(*task.key_groups, 8, seed=wl.seed * 1000 + task.index + 500)]
        fresh_per_round = math.ceil(wl.keys / max(1, wl.rounds // 2))
        live: dict[StateKey, bytes] = {}
        erased: list[StateKey] = []
        with ready.get_lock():
            ready.value += 1
        go.wait()
        report.t_start = time.monotonic()
        for r in range(1, wl.rounds + 1):
            if r == task.hold_before_round and not resume.wait(HOLD_TIMEOUT_S):
                raise TimeoutError(f"no go-ahead from the driver before round {r} in {HOLD_TIMEOUT_S}s")
            step = _Round(backend, live, f"w{task.index}r{r}", wl.value_bytes)
            fresh = universe[(r - 1) * fresh_per_round : r * fresh_per_round]
            step.put(fresh)
            fresh_keys = set(fresh)
            old = sorted(k for k in live if k not in fresh_keys)
            rng.shuffle(old)
            n_over, n_erase = len(old) * 15 // 100, len(old) * 8 // 100
            step.put(old[:n_over])  # overwrites
            doomed = old[n_over : n_over + n_erase]
            step.erase(doomed)
            back = [k for k in erased if rng.random() < 0.5]  # re-puts of keys erased in earlier rounds
            step.put(back)
            back_keys = set(back)
            erased = [k for k in erased if k not in back_keys] + doomed
            flips = old[n_over + n_erase : n_over + n_erase + 2]
            step.erase(flips)  # erased, then put again in the same round: the put wins
            step.put(flips)
            if r * fresh_per_round < len(universe):
                gone = universe[-r:]  # put, then erased in the same round: never in a checkpoint until its own round
                gone = [k for k in gone if k not in live]
                step.put(gone)
                step.erase(gone)
            _check_reads(backend, live, rng.sample(universe, min(wl.reads, len(universe))) + never_written[:2], report, r)
            report.rows += backend.delta_rows
            result = backend.snapshot(r)
            report.commits += 1
            report.commit_retries += result.attempts - 1
            report.recovered_commits += int(result.recovered)
            report.changes.append(step.change)
            with progress.get_lock():
                progress.value += 1
        report.t_end = time.monotonic()
        pool = backend.pool
        report.calls, report.retries = pool.calls, pool.retries


def _check_reads(backend: Any, live: dict[StateKey, bytes], sample: list[StateKey], report: WorkerReport, r: int) -> None:
    """Read ``sample`` back (get_many per operator) and note every value the model disagrees with."""
    for op in {op for op, _ in sample}:
        keys = [k for o, k in sample if o == op]
        got = backend.get_many(op, keys)
        report.reads += len(keys)
        for key, value in zip(keys, got, strict=True):
            if value != live.get((op, key)):
                report.read_mismatches.append(f"round {r}: get op {op} key {key!r} = {value!r}, model {live.get((op, key))!r}")


@dataclass(frozen=True)
class Chaos:
    """Kill pool ``kill_index`` with SIGKILL once ``at_fraction`` of the commits are done; restart it ``down_s`` later."""

    kill_index: int
    at_fraction: float = 0.4
    down_s: float = 1.0
    resume_fraction: float = 0.75  # workers hold before this share of their rounds until the restarted pool serves
    # ...and until the pools' maintenance has changed the job (folded layers or deleted checkpoints), so the last rounds
    # commit on top of its work
    await_maintenance: bool = False


@dataclass
class KillRecord:
    """What the driver saw of the killed pool."""

    pool: str
    address: str
    progress_at_kill: int
    served_before: dict[str, int]
    maintenance_before: dict[str, int]  # the killed incarnation's maintenance counters, read just before the kill
    store_before: dict[str, int]  # ...and its store and cache counters
    served_after: dict[str, int] = field(default_factory=dict)
    exit_code: int | None = None
    down_s: float = 0.0  # from the kill to the restarted pool's ready line


@dataclass
class LoadResult:
    """A run's reports, figures and the check of the pool's checkpoints against the union of the workers' models."""

    workload: Workload
    address: str
    pools: int
    reports: list[WorkerReport]
    phase_s: float
    complete: list[int]  # complete checkpoints the pool lists at the end
    compared: list[int]  # those scanned and compared with the model
    retired: list[int]  # listed, then gone before their scan (retention by maintenance)
    differences: list[str]
    final_keys: int
    kill: KillRecord | None = None
    driver_errors: list[str] = field(default_factory=list)
    served_by_pool: dict[str, int] = field(default_factory=dict)  # RemotePool calls each pool's last incarnation finished
    maintenance: dict[str, int] = field(default_factory=dict)  # the maintenance counters of every pool incarnation, summed
    store: dict[str, int] = field(default_factory=dict)  # their store bytes read and written, cache hits and misses, summed

    @property
    def errors(self) -> list[str]:
        return self.driver_errors + [e for r in self.reports for e in r.errors]

    @property
    def read_mismatches(self) -> list[str]:
        return [m for r in self.reports for m in r.read_mismatches]

    @property
    def retries(self) -> int:
        return sum(r.retries for r in self.reports)

    @property
    def commits(self) -> int:
        return sum(r.commits for r in self.reports)

    @property
    def rows(self) -> int:
        return sum(r.rows for r in self.reports)

    @property
    def ok(self) -> bool:
        final = self.workload.rounds
        clean = not self.errors and not self.read_mismatches and not self.differences and not self.maintenance.get("errors", 0)
        return clean and final in self.compared

    def figures(self) -> dict[str, Any]:
        """The run's numbers, JSON-ready."""
        phase = max(self.phase_s, 1e-9)
        figures: dict[str, Any] = {
            "pools": self.pools,
            "workers": self.workload.workers,
            "rounds": self.workload.rounds,
            "keys_per_worker": self.workload.keys,
            "phase_s": round(self.phase_s, 3),
            "checkpoints": self.workload.rounds,
            "checkpoints_per_s": self.workload.rounds / phase,
            "commits": self.commits,
            "commits_per_s": self.commits / phase,
            "rows": self.rows,
            "rows_per_s": self.rows / phase,
            "reads": sum(r.reads for r in self.reports),
            "calls": sum(r.calls for r in self.reports),
            "retries": self.retries,
            "commit_retries": sum(r.commit_retries for r in self.reports),
            "recovered_commits": sum(r.recovered_commits for r in self.reports),
            "errors": len(self.errors),
            "read_mismatches": len(self.read_mismatches),
            "complete_checkpoints": len(self.complete),
            "compared_checkpoints": len(self.compared),
            "retired_checkpoints": len(self.retired),
            "differences": len(self.differences),
            "final_keys": self.final_keys,
            "final_state_matches_model": self.ok,
            "served_by_pool": self.served_by_pool,
            "maintenance": self.maintenance,
            "store": self.store,
            "store_read_bytes_per_commit": self.store.get("store_read_bytes", 0) / max(1, self.commits),
        }
        if self.kill is not None:
            figures["kill"] = {
                "pool": self.kill.pool,
                "address": self.kill.address,
                "progress_at_kill": self.kill.progress_at_kill,
                "exit_code": self.kill.exit_code,
                "down_s": round(self.kill.down_s, 3),
                "served_before": sum(self.kill.served_before.values()),
                "served_after": sum(self.kill.served_after.values()),
            }
        return figures


def run_load(
    group: PoolGroup,
    workload: Workload,
    address: str,
    work_dir: Path,
    chaos: Chaos | None = None,
    check: str = "all",
    worker_timeout_s: float = 300,
    retry: RetryPolicy = WORKER_RETRY,
    on_phase: Callable[[str], None] | None = None,
) -> LoadResult:
    """Run ``workload`` with its workers on ``address`` (one pool or a comma list), maybe killing a pool of ``group``.

    The check reads through every pool of ``group`` alone.

    ``check``: "all" compares every complete checkpoint still listed at the end with the models, "final" the last only.
    """
    say = on_phase or (lambda _msg: None)
    work_dir.mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("spawn")  # grpc channels must not cross a fork
    ready, progress = ctx.Value("i", 0), ctx.Value("i", 0)
    go, resume = ctx.Event(), ctx.Event()
    hold = max(2, math.ceil(workload.rounds * chaos.resume_fraction)) if chaos else 0
    if not chaos:
        resume.set()
    tasks = [
        WorkerTask(i, address, rng, workload, str(work_dir / f"{workload.job}-worker-{i}.pickle"), retry, hold)
        for i, rng in enumerate(workload.ranges())
    ]
    procs = [ctx.Process(target=run_worker, args=(t, ready, go, resume, progress), name=f"load-worker-{t.index}") for t in tasks]
    driver_errors: list[str] = []
    kill: KillRecord | None = None
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while ready.value < len(procs) and time.monotonic() < deadline and all(p.exitcode is None for p in procs):
            time.sleep(0.05)
        if ready.value < len(procs):
            driver_errors.append(f"only {ready.value} of {len(procs)} workers connected in {CONNECT_TIMEOUT_S}s")
            go.set()
            resume.set()
        else:
            say(f"{len(procs)} workers connected; go")
            go.set()
            if chaos is not None:
                kill = _kill_and_restart(group, chaos, workload, progress, procs, say)
                if chaos.await_maintenance:
                    driver_errors.extend(_await_maintenance(group, kill, say))
                resume.set()
        end = time.monotonic() + worker_timeout_s
        for p in procs:
            p.join(max(0.1, end - time.monotonic()))
            if p.exitcode is None:
                driver_errors.append(f"{p.name} did not finish in {worker_timeout_s:.0f}s")
    finally:
        go.set()
        resume.set()
        for p in procs:
            if p.pid is not None and p.exitcode is None:
                p.kill()
                p.join(10)
    served_by_pool: dict[str, int] = {}
    maintenance: dict[str, int] = dict(kill.maintenance_before) if kill else {}
    store: dict[str, int] = dict(kill.store_before) if kill else {}
    for pool in group.pools:
        try:
            samples = pool.scrape()
        except OSError as exc:
            driver_errors.append(f"metrics of pool {pool.name} unreadable: {exc}")
            continue
        served = pool.requests_served(samples)
        served_by_pool[pool.name] = sum(served.values())
        add_counts(maintenance, maintenance_counts(samples))
        add_counts(store, store_counts(samples))
        if kill is not None and pool.name == kill.pool:
            kill.served_after = served
    reports = []
    for t, p in zip(tasks, procs, strict=True):
        try:
            with open(t.report_path, "rb") as f:
                reports.append(pickle.load(f))
        except FileNotFoundError:
            driver_errors.append(f"worker {t.index} left no report (exit code {p.exitcode})")
    started = [r.t_start for r in reports if r.t_start]
    ended = [r.t_end for r in reports if r.t_end]
    phase = max(ended) - min(started) if started and ended else 0.0
    say(f"workers done in {phase:.1f}s; checking the checkpoints")
    result = LoadResult(workload, address, len(group.pools), reports, phase, [], [], [], [], 0, kill, driver_errors)
    result.served_by_pool, result.maintenance, result.store = served_by_pool, maintenance, store
    if len(reports) == len(tasks) and not result.errors:
        checking = time.monotonic()
        _check_checkpoints(result, group, retry, check)
        say(f"{len(result.compared)} checkpoint(s) compared in {time.monotonic() - checking:.1f}s")
    return result


def _kill_and_restart(
    group: PoolGroup, chaos: Chaos, workload: Workload, progress: Any, procs: list[Any], say: Callable[[str], None]
) -> KillRecord:
    """SIGKILL the chaos pool once enough commits are done (its metrics read just before), restart it on its port."""
    total = workload.workers * workload.rounds
    target = max(1, int(total * chaos.at_fraction))
    while progress.value < target and any(p.exitcode is None for p in procs):
        time.sleep(0.01)
    victim = group.pools[chaos.kill_index]
    samples = victim.scrape()
    at = progress.value
    group.kill(chaos.kill_index)
    killed_at = time.monotonic()
    say(f"SIGKILLed pool {victim.name} ({victim.address}) after {at} of {total} commits")
    time.sleep(chaos.down_s)
    group.restart(chaos.kill_index)
    down = time.monotonic() - killed_at
    say(f"pool {victim.name} serves again on {victim.address} after {down:.1f}s")
    exit_code = victim.exit_codes[-1] if victim.exit_codes else None
    return KillRecord(
        victim.name,
        victim.address,
        at,
        victim.requests_served(samples),
        maintenance_counts(samples),
        store_counts(samples),
        exit_code=exit_code,
        down_s=down,
    )


def _await_maintenance(group: PoolGroup, kill: KillRecord, say: Callable[[str], None]) -> list[str]:
    """Wait (bounded) until the pools' maintenance folded a layer or deleted a checkpoint; the error when it did not."""
    deadline = time.monotonic() + MAINTENANCE_TIMEOUT_S
    while True:
        counts = dict(kill.maintenance_before)
        for pool in group.pools:
            add_counts(counts, maintenance_counts(pool.scrape()))
        if counts.get("layers_folded", 0) + counts.get("checkpoints_deleted", 0) > 0:
            say(f"maintenance at work: {counts}")
            return []
        if time.monotonic() > deadline:
            return [f"the pools' maintenance folded nothing and deleted nothing in {MAINTENANCE_TIMEOUT_S}s: {counts}"]
        time.sleep(0.2)


def _check_checkpoints(result: LoadResult, group: PoolGroup, retry: RetryPolicy, check: str) -> None:
    """Scan the complete checkpoints through fresh clients, one pool after the other, and compare each with the models."""
    import snapshot
    from client.errors import NotFoundError
    from client.pool_client import PoolClient, PoolClientConfig

    wl = result.workload
    clients = [PoolClient(a, PoolClientConfig(retry=retry)) for a in group.addresses]
    try:
        result.complete = sorted(c.checkpoint_id for c in clients[0].list_checkpoints(wl.job))
        if wl.rounds not in result.complete:
            result.differences.append(f"the final checkpoint {wl.rounds} is not complete; complete: {result.complete}")
            return
        wanted = result.complete if check == "all" else [wl.rounds]
        expected: dict[StateKey, bytes] = {}
        for cid in range(1, wl.rounds + 1):
            for report in result.reports:
                apply_change(expected, report.changes[cid - 1])
            if cid not in wanted:
                continue
            # every pool reads some, and the final one each pool: none may hold a view of its own
            for client in clients if cid == wl.rounds else [clients[cid % len(clients)]]:
                try:
                    table = snapshot.read_snapshot(client.scan_checkpoint(wl.job, cid)).table
                except NotFoundError:
                    if cid == wl.rounds:
                        raise
                    result.retired.append(cid)
                    break
                keys = zip(table.column("op_id").to_pylist(), table.column("key_bytes").to_pylist(), strict=True)
                got = dict(zip(keys, table.column("value_bytes").to_pylist(), strict=True))
                where = f"checkpoint {cid} read through {client.address}"
                result.differences.extend(f"{where}: {d}" for d in state_differences(got, expected))
                result.final_keys = len(got)
            else:
                result.compared.append(cid)
    finally:
        for client in clients:
            client.close()


def state_differences(got: dict[StateKey, bytes], expected: dict[StateKey, bytes], limit: int = 10) -> list[str]:
    """The first ``limit`` keys where ``got`` and ``expected`` differ (missing, extra, other value), in key order."""
    out = []
    for key in sorted(got.keys() ^ expected.keys() | {k for k in got.keys() & expected.keys() if got[k] != expected[k]}):
        out.append(f"op {key[0]} key {key[1]!r}: pool has {got.get(key)!r}, model {expected.get(key)!r}")
        if len(out) == limit:
            break
    return out
