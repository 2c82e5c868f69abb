"""Maintenance inside the pool: layers, checkpoints and garbage stay bounded with no lifecycle call; leases; policies; errors."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

import snapshot
from client.backend import RemoteReadBackend
from client.pool_client import PoolClient
from pool.core import PoolCore
from pool.domain import PoolConfig
from pool.job_listing import JobListing
from pool.job_policy import JobPolicy, write_job_policy
from pool.lifecycle import Lifecycle, LifecycleConfig
from pool.maintenance import Maintainer, MaintenanceConfig, load_maintenance_policy
from pool.maintenance_lease import lease_key
from pool.metrics import PoolMetrics
from pool.server import PoolServer, PoolServerConfig
from snapshot.errors import InvalidArgumentError, UnavailableError
from store.checkpoint import CheckpointReader
from store.layout import job_prefix, metadata_key
from store.manifest import parse_manifest
from store.memory import MemoryStore
from store.objects import ObjectStore
from tests.call_store import CallStore
from tests.hook_store import HookStore
from tests.lifecycle_helpers import HALVES as LIFECYCLE_HALVES
from tests.lifecycle_helpers import build_job, delta_for, scan_checkpoint, scan_savepoint
from tests.pool_core_helpers import apply, commit
from tests.pool_server_fixtures import keyed_keys_in

JOB = "orders"
HALVES = ((0, 63), (64, 127))
OP = snapshot.operator_id("counter")
OP_SOURCE = snapshot.operator_id("source")
OP_KEYS = [snapshot.encode_operator_key("offset", b""), snapshot.encode_operator_key("mark", b"")]
Model = dict[tuple[int, bytes], bytes]


class Clock:
    """A clock the test moves by hand (seconds), starting at the real time (pins made through the RPC use the real clock)."""

    def __init__(self) -> None:
        self.now = float(int(time.time()))

    def __call__(self) -> float:
        return self.now

    def ms(self) -> int:
        return int(self.now * 1000)


def wait_for(what: str, done: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Poll ``done`` until it holds; fail naming ``what`` after ``timeout_s`` (a bound on a wait, not a timed assertion)."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what} after {timeout_s} s")
        time.sleep(0.02)


def server_config(maintenance: MaintenanceConfig | None, write_s: float = 20.0) -> PoolServerConfig:
    return PoolServerConfig(
        listen="127.0.0.1:0",
        grace_seconds=0.2,
        maintenance=maintenance,
        lifecycle=LifecycleConfig(max_write_s=write_s),
        pool=PoolConfig(max_commit_s=write_s),
    )


# ---- what the store holds, read directly ---------------------------------------------------------------------


def complete_manifests(store: MemoryStore, job: str = JOB) -> dict[int, object]:
    listing = JobListing.of(job, list(store.list(job_prefix(job))))
    return {cid: parse_manifest(store.get(metadata_key(job, cid)), metadata_key(job, cid)) for cid in sorted(listing.complete)}


def max_layers(manifest) -> int:
    return max(len(part.layers) for part in manifest.parts)


def unreferenced_old_files(store: MemoryStore, now_ms: int, min_age_s: float, job: str = JOB) -> list[str]:
    """Data files of ``job`` that no manifest or staged part names and that are older than the minimum age."""
    infos = list(store.list(job_prefix(job)))
    listing = JobListing.of(job, infos)
    refs = set()
    for key in listing.manifest_keys:
        refs |= {job_prefix(job) + p for p in parse_manifest(store.get(key), key).referenced_paths}
    return sorted(i.key for i in listing.data if i.key not in refs and now_ms - i.last_modified_ms >= min_age_s * 1000)


def scanned(client: PoolClient, checkpoint_id: int, job: str = JOB) -> Model:
    table = snapshot.read_snapshot(client.scan_checkpoint(job, checkpoint_id)).table
    rows = zip(
        table.column("op_id").to_pylist(), table.column("key_bytes").to_pylist(), table.column("value_bytes").to_pylist(), strict=True
    )
    out = {(o, k): v for o, k, v in rows}
    assert len(out) == table.num_rows, "a key appears twice"
    return out


# ---- a job of two subtasks writing against a dict model ------------------------------------------------------


class Workload:
    """Two subtasks of one job (RemoteReadBackend over gRPC) making puts, overwrites, erases and re-puts of erased keys.

    Operator state (one subtask writes it) is put, erased and put again too. ``model`` is what the latest checkpoint
    must read as; ``models`` keeps each checkpoint's, so an older retained checkpoint is checked as well.
    """

    def __init__(self, address: str, seed: int) -> None:
        self.rng = random.Random(seed)
        self.backends = [RemoteReadBackend.connect(address, JOB, kg) for kg in HALVES]
        for backend in self.backends:
            backend.register_operator("counter")
            backend.register_operator("source")
        self.keys = [keyed_keys_in(lo, hi, 24, seed + i) for i, (lo, hi) in enumerate(HALVES)]
        self.model: Model = {}
        self.erased: set[tuple[int, bytes]] = set()
        self.models: dict[int, Model] = {}
        self.kinds = {"new": 0, "overwrite": 0, "erase": 0, "re-put": 0}

    def write(self, i: int, step: int) -> None:
        backend, keys = self.backends[i], self.keys[i]
        for n in range(self.rng.randint(1, 5)):
            key = (OP, self.rng.choice(keys))
            kind = "erase" if key in self.model and self.rng.random() < 0.35 else None
            if kind == "erase":
                backend.erase(*key)
                self.model.pop(key)
                self.erased.add(key)
            else:
                kind = "re-put" if key in self.erased else "overwrite" if key in self.model else "new"
                value = f"{i}:{step}:{n}".encode()
                backend.put(*key, value)
                self.model[key] = value
                self.erased.discard(key)
            self.kinds[kind] += 1
        if i == 0 and self.rng.random() < 0.5:  # operator state: an offset that grows, a mark erased and put back
            backend.put(OP_SOURCE, OP_KEYS[0], step.to_bytes(8, "little", signed=True))
            self.model[(OP_SOURCE, OP_KEYS[0])] = step.to_bytes(8, "little", signed=True)
            mark = (OP_SOURCE, OP_KEYS[1])
            if mark in self.model and self.rng.random() < 0.5:
                backend.erase(*mark)
                self.model.pop(mark)
            else:
                backend.put(*mark, f"m{step}".encode())
                self.model[mark] = f"m{step}".encode()

    def close(self) -> None:
        for backend in self.backends:
            backend.close()


# ---- bounded over 200 commits ----------------------------------------------------------------------------------

LAYERS, KEEP, MIN_AGE_S, INTERVAL_S, STEP_S = 4, 3, 60.0, 35.0, 5.0
# a subtask commits every STEP_S (the two of a checkpoint one after the other), a round comes every INTERVAL_S: 7 commits,
# so rounds alternate between coming before a checkpoint's first part and between its two parts
COMMITS_PER_ROUND = int(INTERVAL_S // STEP_S)
PER_ROUND = -(-COMMITS_PER_ROUND // 2)  # checkpoints completed between two rounds, at most


def test_maintenance_keeps_layers_checkpoints_and_garbage_bounded_over_200_commits() -> None:
    """No lifecycle RPC or command: only the pool's maintainer, one round per interval of a clock the test drives.

    Bounds, derived. Layers: each checkpoint adds one layer to each part; a round folds the latest checkpoint's parts
    over LAYERS layers into one base, which resets a part only if its subtask has not yet staged its part of the next
    checkpoint (that one was built on the unfolded layers). Rounds alternate between coming before a checkpoint's
    first part (every part reset) and between its parts (the part staged first escapes), so each part is reset at
    least every second round, every 2 * COMMITS_PER_ROUND / 2 = 7 of its own commits: at most LAYERS + 7 layers
    anywhere, and right after a round the latest checkpoint has at most LAYERS. Checkpoints: retention keeps the
    newest KEEP plus the pinned one, so at most KEEP + 1 complete after a round and KEEP + 1 + PER_ROUND between two.
    Garbage: GC runs after retention, so no unreferenced file older than the minimum age survives a round.
    """
    clock = Clock()
    store = MemoryStore(clock_ms=clock.ms)
    maintenance = MaintenanceConfig(
        interval_s=3600,  # the thread sleeps; rounds come from run_once at the test clock's intervals
        keep_last=KEEP,
        compact_max_layers=LAYERS,
        gc_min_age_s=MIN_AGE_S,
    )
    server = PoolServer(server_config(maintenance), store=store, clock=clock).start()
    client = PoolClient(server.address)
    work = Workload(server.address, seed=18)
    maintainer = server.maintainer
    assert maintainer is not None and maintainer.running
    pinned: set[int] = set()
    next_round = clock.now + INTERVAL_S
    rounds = max_seen_layers = max_seen_complete = max_data_files = 0
    try:
        for cid in range(1, 201):
            for i in range(2):
                clock.now += STEP_S
                if clock.now >= next_round:  # a round may fall between the two parts of a checkpoint
                    maintainer.run_once()
                    rounds += 1
                    next_round += INTERVAL_S
                    manifests = complete_manifests(store)
                    if manifests:
                        assert max_layers(manifests[max(manifests)]) <= LAYERS, f"round {rounds}: the latest kept more layers"
                    assert len(manifests) <= KEEP + len(pinned), f"round {rounds}: {sorted(manifests)} retained"
                    assert unreferenced_old_files(store, clock.ms(), MIN_AGE_S) == [], f"round {rounds}: garbage survived"
                    for retained in manifests:  # every retained checkpoint reads as it was committed
                        assert scanned(client, retained) == work.models[retained], f"checkpoint {retained} after round {rounds}"
                work.write(i, cid * 2 + i)
                work.backends[i].snapshot(cid)
            work.models[cid] = dict(work.model)
            manifests = complete_manifests(store)
            assert max(manifests) == cid
            max_seen_layers = max(max_seen_layers, max(max_layers(m) for m in manifests.values()))
            max_seen_complete = max(max_seen_complete, len(manifests))
            max_data_files = max(max_data_files, sum(1 for k in store.objects if k.startswith(f"jobs/{JOB}/data/")))
            assert max_seen_layers <= LAYERS + COMMITS_PER_ROUND, f"checkpoint {cid}: a part holds {max_seen_layers} layers"
            assert max_seen_complete <= KEEP + len(pinned) + PER_ROUND, f"checkpoint {cid}: {sorted(manifests)} complete"
            if cid == 10:
                pinned.add(client.pin_checkpoint(JOB, "backup", 86400.0, 10).checkpoint_id)
            if cid == 20:
                client.savepoint(JOB, "before-migration", 20)
            if cid % 50 == 0:
                assert scanned(client, 0) == work.model, f"latest after checkpoint {cid}"
        status = maintainer.status(JOB)["jobs"][JOB]
        assert status["last_error"] is None and status["lease"]["ours"] is True
    finally:
        work.close()
        client.close()
        server.stop(0)
    assert rounds == 2 * 200 * STEP_S // INTERVAL_S
    assert max_seen_layers > LAYERS + PER_ROUND, "no part escaped a round: the schedule did not test the in-flight case"
    assert all(work.kinds.values()), f"the workload missed a kind of write: {work.kinds}"
    assert max_seen_layers > LAYERS, "no part ever passed the threshold: compaction was never needed"
    assert 10 in complete_manifests(store) and scan_checkpoint(store, JOB, 10) == work.models[10]  # the pin held it
    assert scan_savepoint(store, f"{JOB}/before-migration") == work.models[20]  # job GC never touches savepoints/
    assert scan_checkpoint(store, JOB, 200) == work.model
    text = server.metrics.render().decode()
    assert 'clink_pool_maintenance_runs_total{outcome="ok",task="compaction"}' in text
    folded = metric(text, "clink_pool_maintenance_layers_folded_total", task="compaction")
    deleted = metric(text, "clink_pool_maintenance_checkpoints_deleted_total", task="retention")
    reclaimed = metric(text, "clink_pool_maintenance_reclaimed_bytes_total", task="gc")
    assert folded > 0 and deleted >= 200 - KEEP - 1 - PER_ROUND and reclaimed > 0
    # without maintenance 200 checkpoints leave 400 deltas (and every checkpoint): the figures of this run
    print(f"\nmax layers {max_seen_layers}, max complete {max_seen_complete}, max data files {max_data_files}, rounds {rounds}")


def metric(text: str, name: str, **labels: str) -> float:
    """One sample's value from the exposition text (0 when absent)."""
    want = "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}" if labels else ""
    for line in text.splitlines():
        if line.startswith(name + want + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_maintenance_runs_by_itself_on_its_thread_while_a_job_commits() -> None:
    """The real thread on a short interval (real clock): after each checkpoint, a full round later, the bounds hold."""
    store = MemoryStore()
    maintenance = MaintenanceConfig(interval_s=0.05, keep_last=2, compact_max_layers=3, gc_min_age_s=2.5)
    server = PoolServer(server_config(maintenance, write_s=2.0), store=store).start()
    maintainer = server.maintainer
    assert maintainer is not None
    client = PoolClient(server.address)
    work = Workload(server.address, seed=7)
    try:
        for cid in range(1, 31):
            for i in range(2):
                work.write(i, cid * 2 + i)
                work.backends[i].snapshot(cid)
            work.models[cid] = dict(work.model)
            seen = maintainer.rounds
            wait_for("two maintenance rounds", lambda seen=seen: maintainer.rounds >= seen + 2)  # one began after the commit
            manifests = complete_manifests(store)
            assert max(manifests) == cid and len(manifests) <= 2
            assert max_layers(manifests[cid]) <= 3
        time.sleep(2.6)  # the files retention freed pass GC's minimum age
        seen = maintainer.rounds
        wait_for("two more rounds", lambda: maintainer.rounds >= seen + 2)
        assert unreferenced_old_files(store, int(time.time() * 1000), 2.5) == []
        assert scanned(client, 0) == work.model
        runs = maintainer.status()["jobs"][JOB]["runs"]
        assert len(runs) == maintainer.config.history and {r["task"] for r in runs} == {"compaction", "retention", "gc"}
    finally:
        work.close()
        client.close()
        server.stop(0)
    assert not maintainer.running
    assert json.loads(store.get(lease_key(JOB)))["expires_ms"] <= int(time.time() * 1000)  # a clean stop released the lease


# ---- two pools, one maintainer per job ------------------------------------------------------------------------


class Recording(CallStore):
    """A view of a shared store that records who wrote or deleted what, when (ms), per job, from maintenance threads."""

    WRITES = frozenset({"put", "put_if_absent", "compare_and_swap", "delete"})

    def __init__(
        self, inner: ObjectStore, holder: str, log: list, clock: Callable[[], float] = time.time, thread: str | None = None
    ) -> None:
        self.inner, self.holder, self.log, self.clock, self.thread = inner, holder, log, clock, thread
        self.uri, self.counters = inner.uri, inner.counters
        self.lock = threading.Lock()

    def _call(self, op: str, key: str, fn):
        out = fn()
        if op in self.WRITES and (self.thread is None or threading.current_thread().name == self.thread):
            job = key.split("/")[1] if key.startswith("jobs/") else key.rsplit("/", 1)[-1].removesuffix(".json")
            with self.lock:
                self.log.append((self.holder, job, key, int(self.clock() * 1000)))
        return out


class Committer:
    """Two subtasks of a job committing straight to a PoolCore, against a dict model (for tests with no server)."""

    def __init__(self, core: PoolCore, job: str, seed: int) -> None:
        self.core, self.job, self.rng = core, job, random.Random(seed)
        self.epochs = [core.acquire_writer(job, kg)[0] for kg in LIFECYCLE_HALVES]
        self.model: Model = {}
        self.models: dict[int, Model] = {}
        self.cid = 0

    def commit(self, checkpoints: int = 1) -> None:
        for _ in range(checkpoints):
            self.cid += 1
            for i, kg in enumerate(LIFECYCLE_HALVES):
                rows = delta_for(self.rng, self.model, kg, 12, self.cid, op_rows=i == 0)
                apply(self.model, rows)
                commit(self.core, self.job, self.cid, self.cid - 1, kg, self.epochs[i], rows)
            self.models[self.cid] = dict(self.model)


def test_two_maintainers_never_share_a_job_and_the_survivor_waits_out_the_lease() -> None:
    clock = Clock()
    inner = MemoryStore(clock_ms=clock.ms)
    core = PoolCore(inner, clock=clock)
    jobs = {job: Committer(core, job, n) for n, job in enumerate(("a", "b"))}
    for job in jobs.values():
        job.commit(12)
    log: list[tuple[str, str, str, int]] = []
    config = MaintenanceConfig(interval_s=10, lease_ttl_s=30, compact_max_layers=3, gc_min_age_s=40, history=1000)

    def maintainer(holder: str) -> Maintainer:
        view = Recording(inner, holder, log, clock)
        return Maintainer(view, Lifecycle(view, LifecycleConfig(max_write_s=20), clock=clock), config, holder, clock)

    one, two = maintainer("one"), maintainer("two")
    rng = random.Random(3)
    for _ in range(6):  # both run a round every interval, in either order; the first to come takes both leases
        clock.now += 10
        for m in rng.sample([one, two], 2):
            m.run_once()
        jobs["a"].commit(2)
    holders = {job: {h for h, j, _, _ in log if j == job} for job in ("a", "b")}
    assert holders["a"] == holders["b"] and len(holders["a"]) == 1, holders
    first = one if holders["a"] == {"one"} else two
    second = two if first is one else one
    assert not second.status()["jobs"]["a"]["runs"] and second.status()["jobs"]["a"]["lease"]["holder"] == first.holder_id
    # the holder dies (no release); its leases as it left them
    first.stop(release=False)
    expiry = {job: json.loads(inner.get(lease_key(job)))["expires_ms"] for job in ("a", "b")}
    killed_at = clock.ms()
    while clock.ms() < max(expiry.values()) + 20_000:
        clock.now += 7
        second.run_once()
        jobs["a"].commit(2)
    for job in ("a", "b"):
        took = [t for h, j, _, t in log if h == second.holder_id and j == job]
        assert took and min(took) >= expiry[job], f"{job}: the survivor wrote at {min(took)} before the lease expired at {expiry[job]}"
        assert not [t for h, j, _, t in log if h == first.holder_id and j == job and t > killed_at]
        runs = second.status(job)["jobs"][job]["runs"]
        assert {r["task"] for r in runs if r["outcome"] != "skipped"} >= {"retention", "gc"}
    latest = jobs["a"].cid
    assert list(complete_manifests(inner, "a")) == list(range(latest - 4, latest + 1))  # 3 kept by the last round, 2 since
    for cid in (latest - 4, latest):
        assert scan_checkpoint(inner, "a", cid) == jobs["a"].models[cid]


def test_a_clean_stop_releases_the_leases_so_another_pool_takes_over_at_once() -> None:
    clock = Clock()
    store = MemoryStore(clock_ms=clock.ms)
    build_job(PoolCore(store, clock=clock), "a", 5, random.Random(1))
    config = MaintenanceConfig(interval_s=10, gc_min_age_s=40)
    one = Maintainer(store, Lifecycle(store, LifecycleConfig(max_write_s=20), clock=clock), config, "one", clock).start()
    wait_for("the first round", lambda: one.rounds >= 1)
    assert one.stop() is True and not one.running
    two = Maintainer(store, Lifecycle(store, LifecycleConfig(max_write_s=20), clock=clock), config, "two", clock)
    assert [r.task for r in two.run_once()["a"]] == ["compaction", "retention", "gc"]  # no wait: the lease was given back


def test_two_pool_servers_on_one_store_maintain_each_job_one_at_a_time() -> None:
    """Real servers and threads: every maintenance write of a job comes from one holder at a time; the survivor waits."""
    inner = MemoryStore()
    log: list[tuple[str, str, str, int]] = []
    # a task starts only with half the lease left: it would have to stall 1.5 s for another pool to begin beside it
    config = MaintenanceConfig(interval_s=0.1, lease_ttl_s=3.0, compact_max_layers=3, keep_last=2, gc_min_age_s=6.0, history=100_000)
    views = [Recording(inner, f"pool-{n}", log, thread="pool-maintenance") for n in range(2)]
    servers = [PoolServer(server_config(config, write_s=5.0), store=view).start() for view in views]
    work = Workload(servers[0].address, seed=11)
    try:
        for cid in range(1, 16):
            for i in range(2):
                work.write(i, cid * 2 + i)
                work.backends[i].snapshot(cid)
            time.sleep(0.03)
        maintainers = [s.maintainer for s in servers]
        assert all(m is not None for m in maintainers)
        holder = json.loads(inner.get(lease_key(JOB)))["holder"]
        victim = next(m for m in maintainers if m is not None and m.holder_id == holder)
        survivor = next(m for m in maintainers if m is not None and m is not victim)
        victim.stop(release=False)  # as SIGKILL would: the lease stays until it expires
        killed_ms = int(time.time() * 1000)
        expires = json.loads(inner.get(lease_key(JOB)))["expires_ms"]
        assert json.loads(inner.get(lease_key(JOB)))["holder"] == victim.holder_id
        for cid in range(16, 21):  # the job goes on committing through the survivor
            for i in range(2):
                work.write(i, cid * 2 + i)
                work.backends[i].snapshot(cid)
        wait_for("the survivor to take the lease", lambda: json.loads(inner.get(lease_key(JOB)))["holder"] == survivor.holder_id)
        wait_for("a round of the survivor", lambda: any(r["task"] == "gc" for r in survivor.status(JOB)["jobs"][JOB]["runs"]))
    finally:
        work.close()
        for server in servers:
            server.stop(0)
    names = {views[n].holder: servers[n].maintainer.holder_id for n in range(2)}  # type: ignore[union-attr]
    writes = [(names[h], t) for h, j, key, t in log if j == JOB and not key.startswith("maintenance/")]
    assert writes, "maintenance wrote nothing for the job"
    by_victim = [t for h, t in writes if h == victim.holder_id]
    by_survivor = [t for h, t in writes if h == survivor.holder_id]
    assert by_victim and by_survivor
    assert max(by_victim) <= killed_ms, "the killed maintainer wrote after it was stopped"
    assert min(by_survivor) >= expires, f"the survivor wrote at {min(by_survivor)}, before the lease expired at {expires}"
    # no overlap: the runs (tasks) of the two holders on the job are disjoint intervals
    spans = []
    for m in (victim, survivor):
        for r in m.status(JOB)["jobs"][JOB]["runs"]:
            if r["duration_s"] > 0:
                spans.append((r["started_ms"], r["started_ms"] + r["duration_s"] * 1000 + 1, m.holder_id))
    spans.sort()
    for (_, end, a), (start, _, b) in zip(spans, spans[1:], strict=False):
        assert a == b or start >= end, f"{a} and {b} maintained the job at once"
    assert scan_checkpoint(inner, JOB, 20) == work.model


# ---- pins, savepoints and a job's own policy -----------------------------------------------------------------


def test_pins_savepoints_and_each_jobs_policy_are_honoured() -> None:
    clock = Clock()
    store = MemoryStore(clock_ms=clock.ms)
    core = PoolCore(store, clock=clock)
    models = {job: build_job(core, job, 10, random.Random(n)) for n, job in enumerate(("plain", "short", "paused", "layered"))}
    life = Lifecycle(store, LifecycleConfig(max_write_s=20), clock=clock)
    life.pin("plain", 2, "audit", 3600)
    life.savepoint("plain", 1, "first")
    life.savepoint("short", 4, "mid", under_job=True)
    write_job_policy(store, "short", JobPolicy(keep_last=1))
    write_job_policy(store, "paused", JobPolicy(maintenance=False))
    write_job_policy(store, "layered", JobPolicy(compact_max_layers=50))
    maintainer = Maintainer(store, life, MaintenanceConfig(compact_max_layers=4, gc_min_age_s=60), "pool-a", clock)
    maintainer.run_once()
    clock.now += 120  # freed files pass the minimum age
    runs = maintainer.run_once()
    assert sorted(complete_manifests(store, "plain")) == [2, 8, 9, 10]  # keep_last 3, and the pinned one
    assert sorted(complete_manifests(store, "short")) == [10]
    assert sorted(complete_manifests(store, "paused")) == list(range(1, 11))
    assert [r.outcome for r in runs["paused"]] == ["skipped"] * 3 and "policy" in runs["paused"][0].detail
    assert sorted(complete_manifests(store, "layered")) == [8, 9, 10]
    assert max_layers(complete_manifests(store, "layered")[10]) == 10  # its own threshold: not folded
    assert max_layers(complete_manifests(store, "plain")[10]) == 1
    for job, cids in (("plain", (2, 8, 9, 10)), ("short", (10,)), ("layered", (8, 9, 10))):
        for cid in cids:
            assert scan_checkpoint(store, job, cid) == models[job][cid]
    assert scan_savepoint(store, "first") == models["plain"][1]
    assert scan_savepoint(store, "short/mid") == models["short"][4]
    assert runs["short"][1].checkpoints_deleted == 0  # all deleted in the first round
    for job in ("plain", "short", "layered"):
        assert unreferenced_old_files(store, clock.ms(), 60, job) == []


# ---- errors --------------------------------------------------------------------------------------------------


class Failing(CallStore):
    """A store whose calls on keys under ``prefix`` fail with UnavailableError while ``on`` is set."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner, self.uri, self.counters = inner, inner.uri, inner.counters
        self.prefix = "jobs/a/"
        self.on = False

    def _call(self, op: str, key: str, fn):
        if self.on and key.startswith(self.prefix):
            raise UnavailableError(f"{op} {key}: connection reset (test)")
        return fn()


def test_a_store_error_is_recorded_in_status_and_metrics_and_the_next_round_runs() -> None:
    clock = Clock()
    inner = MemoryStore(clock_ms=clock.ms)
    core = PoolCore(inner, clock=clock)
    for job in ("a", "b"):
        build_job(core, job, 12, random.Random(4))
    store = Failing(inner)
    metrics = PoolMetrics()
    life = Lifecycle(store, LifecycleConfig(max_write_s=20), clock=clock)
    maintainer = Maintainer(store, life, MaintenanceConfig(compact_max_layers=4, gc_min_age_s=60), "pool-a", clock, metrics.maintenance)
    store.on = True
    runs = maintainer.run_once()
    assert [r.outcome for r in runs["a"]] == ["error"] * 3 and "connection reset" in runs["a"][0].detail
    assert [r.outcome for r in runs["b"]] == ["ok", "ok", "ok"]  # the round went on
    status = maintainer.status()
    assert "connection reset" in status["jobs"]["a"]["last_error"] and status["jobs"]["b"]["last_error"] is None
    text = metrics.render().decode()
    for task in ("compaction", "retention", "gc"):
        assert metric(text, "clink_pool_maintenance_errors_total", task=task) == 1
        assert metric(text, "clink_pool_maintenance_runs_total", outcome="error", task=task) == 1
    assert metric(text, "clink_pool_maintenance_leases_held") == 2
    store.on = False
    clock.now += 5
    runs = maintainer.run_once()
    assert [r.outcome for r in runs["a"]] == ["ok", "ok", "ok"] and runs["a"][0].layers_folded == 24
    assert maintainer.status("a")["jobs"]["a"]["last_error"] is None
    # a round that cannot list the jobs: recorded, and the thread goes on to the next
    store.prefix, store.on = "jobs/", True
    assert maintainer.run_once() == {} and "connection reset" in maintainer.status()["last_error"]
    assert metric(metrics.render().decode(), "clink_pool_maintenance_errors_total", task="round") == 1
    maintainer.config = MaintenanceConfig(interval_s=0.02, gc_min_age_s=60)
    maintainer.start()
    try:
        rounds = maintainer.rounds
        wait_for("failed rounds", lambda: metric(metrics.render().decode(), "clink_pool_maintenance_errors_total", task="round") >= 3)
        assert maintainer.running and maintainer.rounds == rounds
        store.on = False
        wait_for("a round after the store came back", lambda: maintainer.rounds > rounds)
        assert maintainer.status()["last_error"] is None
    finally:
        assert maintainer.stop()


def test_a_concurrent_change_is_one_jobs_error_and_its_other_tasks_still_run() -> None:
    clock = Clock()
    inner = MemoryStore(clock_ms=clock.ms)
    build_job(PoolCore(inner, clock=clock), "a", 12, random.Random(2))
    store = HookStore(inner)
    key = metadata_key("a", 12)
    # a commit re-completing checkpoint 12 (its _metadata replaced) while the compaction folds it
    store.on("compare_and_swap", key, lambda: inner.put(key, inner.get(key)))
    maintainer = Maintainer(
        store, Lifecycle(store, LifecycleConfig(max_write_s=20), clock=clock), MaintenanceConfig(compact_max_layers=4), "p", clock
    )
    runs = maintainer.run_once()["a"]
    assert [(r.task, r.outcome) for r in runs] == [("compaction", "error"), ("retention", "ok"), ("gc", "ok")]
    assert "ConflictError" in runs[0].detail and runs[1].checkpoints_deleted == 9


def test_a_defect_in_a_task_does_not_end_the_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    import pool.maintenance as maintenance_mod

    clock = Clock()
    store = MemoryStore(clock_ms=clock.ms)
    build_job(PoolCore(store, clock=clock), "a", 3, random.Random(2))

    def broken(self, job, checkpoint_id=0, force=False):
        raise RuntimeError("a bug")

    monkeypatch.setattr(maintenance_mod.Compaction, "compact", broken)
    m = Maintainer(store, Lifecycle(store, clock=clock), MaintenanceConfig(interval_s=0.02, gc_min_age_s=3600), "p", clock).start()
    try:
        wait_for("three rounds", lambda: m.rounds >= 3)
        assert m.running
        runs = m.status("a")["jobs"]["a"]["runs"]
        assert {(r["task"], r["outcome"]) for r in runs} == {("compaction", "error"), ("retention", "ok"), ("gc", "ok")}
        assert "RuntimeError: a bug" in m.status("a")["jobs"]["a"]["last_error"]
    finally:
        assert m.stop()


def test_max_jobs_per_round_visits_every_job_in_turn() -> None:
    clock = Clock()
    store = MemoryStore(clock_ms=clock.ms)
    core = PoolCore(store, clock=clock)
    for job in ("a", "b", "c"):
        build_job(core, job, 1, random.Random(1))
    m = Maintainer(store, Lifecycle(store, clock=clock), MaintenanceConfig(max_jobs_per_round=2), "p", clock)
    assert [sorted(m.run_once()) for _ in range(3)] == [["a", "b"], ["a", "c"], ["b", "c"]]


# ---- configuration -------------------------------------------------------------------------------------------


def test_config_defaults_are_safe_and_bad_values_name_their_field() -> None:
    config = MaintenanceConfig()
    assert (config.interval_s, config.ttl_s, config.keep_last, config.compact_max_layers) == (60.0, 180.0, 3, 8)
    assert (config.compact_max_delta_bytes, config.gc_min_age_s, config.tasks()) == (256 << 20, 3600.0, ("compaction", "retention", "gc"))
    assert config.check_writes(LifecycleConfig().max_write_s, PoolConfig().max_commit_s) is config
    for kwargs, field in (
        ({"interval_s": 0}, "interval_s"),
        ({"interval_s": 60, "lease_ttl_s": 120}, "interval_s = 60 must be less than half of lease_ttl_s = 120"),
        ({"lease_ttl_s": -1}, "lease_ttl_s"),
        ({"keep_last": 0}, "keep_last"),
        ({"compact_max_layers": 1.5}, "compact_max_layers"),
        ({"gc_min_age_s": -1}, "gc_min_age_s"),
        ({"gc": "yes"}, "gc"),
        ({"max_jobs_per_round": 0}, "max_jobs_per_round"),
    ):
        with pytest.raises(InvalidArgumentError, match=field):
            MaintenanceConfig(**kwargs)  # type: ignore[arg-type]
    assert MaintenanceConfig(interval_s=120).ttl_s == 360  # the TTL follows the interval unless set


def test_gc_minimum_age_must_exceed_the_longest_write() -> None:
    short = MaintenanceConfig(gc_min_age_s=900)
    with pytest.raises(InvalidArgumentError, match=r"gc_min_age_s = 900 s must exceed LifecycleConfig.max_write_s = 1800 s"):
        short.check_writes(1800, 600)
    with pytest.raises(InvalidArgumentError, match=r"gc_min_age_s = 900 s must exceed PoolConfig.max_commit_s = 900 s"):
        short.check_writes(60, 900)
    store = MemoryStore()
    with pytest.raises(InvalidArgumentError, match="max_write_s = 1800"):
        Maintainer(store, Lifecycle(store), short, "p")
    with pytest.raises(InvalidArgumentError, match="max_commit_s = 1200"):
        PoolServer(PoolServerConfig(maintenance=MaintenanceConfig(gc_min_age_s=1000), pool=PoolConfig(max_commit_s=1200),
                                    lifecycle=LifecycleConfig(max_write_s=10)))  # fmt: skip


def test_maintenance_is_off_unless_configured_and_off_means_no_thread(tmp_path: Path) -> None:
    with PoolServer(server_config(None), store=MemoryStore()) as server:
        assert server.maintainer is None
    with PoolServer(server_config(MaintenanceConfig(enabled=False)), store=MemoryStore()) as server:
        assert server.maintainer is None
    with PoolServer(server_config(MaintenanceConfig(interval_s=3600, gc_min_age_s=60)), store=MemoryStore()) as server:
        assert server.maintainer is not None and server.maintainer.running
        assert server.maintainer.holder_id.endswith(f"@{server.address}")
        maintainer = server.maintainer
    assert not maintainer.running


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    return path


def test_policy_file_reads_durations_and_fields(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[maintenance]\ninterval = "5m"\nlease_ttl_s = "1h"\nkeep_last = 5\ngc_min_age = "2h"\ncompaction = false\n'
        "compact_max_delta_bytes = 1048576\nmax_jobs_per_round = 10\nstop_timeout = 12\n",
    )
    config = load_maintenance_policy(path)
    assert (config.interval_s, config.lease_ttl_s, config.keep_last, config.gc_min_age_s) == (300, 3600, 5, 7200)
    assert (config.compaction, config.compact_max_delta_bytes, config.max_jobs_per_round, config.stop_timeout_s) == (False, 1 << 20, 10, 12)
    assert config.tasks() == ("retention", "gc")
    assert load_maintenance_policy(write(tmp_path, "")) == MaintenanceConfig()
    assert load_maintenance_policy(write(tmp_path, "[maintenance]\ninterval = 90.5\n")).interval_s == 90.5


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("[maintenance]\nkeep_lst = 3\n", "unknown key 'keep_lst' in [maintenance]"),
        ('[maintenance]\ninterval = "fast"\n', "key 'interval' = \"fast\": not a duration"),
        ("[maintenance]\ninterval = true\n", "key 'interval' = true: not a duration"),
        ('[maintenance]\nkeep_last = "3"\n', "key 'keep_last' = \"3\": keep_last = '3' must be an integer of at least 1"),
        ("[maintenance]\nkeep_last = 0\n", "key 'keep_last' = 0: keep_last = 0 must be an integer of at least 1"),
        ('[maintenance]\ngc = "no"\n', "key 'gc' = \"no\": gc = 'no' must be true or false"),
        ('[maintenance]\ncompact_max_delta_bytes = "1MB"\n', "key 'compact_max_delta_bytes' = \"1MB\": not a number of bytes"),
        (
            "[maintenance]\ninterval = 100\nlease_ttl = 150\n",
            "key 'interval' = 100: interval_s = 100 must be less than half of lease_ttl_s",
        ),
        ("[maint]\nkeep_last = 3\n", "unknown key 'maint' at the top level"),
        ("maintenance = 3\n", "key 'maintenance' must be a table"),
        ("[maintenance\n", "not TOML"),
    ],
)
def test_a_bad_policy_file_is_one_line_naming_the_key(tmp_path: Path, text: str, line: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(InvalidArgumentError) as info:
        load_maintenance_policy(path)
    message = str(info.value)
    assert message.startswith(f"maintenance policy {path}: ") and line in message and "\n" not in message


def test_a_missing_policy_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match=r"maintenance policy .*nope.toml: No such file"):
        load_maintenance_policy(tmp_path / "nope.toml")


def test_serve_refuses_a_bad_policy_file_with_one_line_and_exit_2_before_binding(tmp_path: Path) -> None:
    from clink.cli.pool import cli

    path = write(tmp_path, "[maintenance]\nkeep_lst = 3\n")
    store_dir = tmp_path / "store"
    result = CliRunner().invoke(
        cli, ["serve", "--store", str(store_dir), "--listen", "127.0.0.1:0", "--maintenance-config", str(path)], catch_exceptions=False
    )
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"maintenance policy {path}: unknown key 'keep_lst' in [maintenance]" in lines[0]
    assert not store_dir.exists()  # nothing bound, nothing opened


def test_serve_flags_override_the_policy_file(tmp_path: Path) -> None:
    from clink.cli.pool import maintenance_config_of_flags

    path = write(tmp_path, '[maintenance]\ninterval = "5m"\nkeep_last = 5\ngc_min_age = "2h"\n')
    config = maintenance_config_of_flags("on", str(path), interval_s=30.0, gc_min_age_s=None, compact_max_delta_mb=0)
    assert config is not None
    assert (config.interval_s, config.keep_last, config.gc_min_age_s, config.compact_max_delta_bytes, config.ttl_s) == (30, 5, 7200, 0, 90)
    assert maintenance_config_of_flags("off", str(path)) is None
    assert maintenance_config_of_flags("on", str(write(tmp_path, "[maintenance]\nenabled = false\n"))) is None
    with pytest.raises(InvalidArgumentError, match="keep_lst"):
        maintenance_config_of_flags("off", str(write(tmp_path, "[maintenance]\nkeep_lst = 1\n")))


def test_checkpoint_reader_sees_no_maintenance_objects() -> None:
    """A job whose lease and policy exist lists only its checkpoints (the reader's listing ignores maintenance/)."""
    clock = Clock()
    store = MemoryStore(clock_ms=clock.ms)
    build_job(PoolCore(store, clock=clock), "a", 2, random.Random(9))
    Maintainer(store, Lifecycle(store, clock=clock), MaintenanceConfig(), "p", clock).run_once()
    write_job_policy(store, "a", JobPolicy(keep_last=4))
    assert [c.checkpoint_id for c in CheckpointReader(store, "a").listing()] == [1, 2]
    assert PoolCore(store).list_jobs() == ["a"]


def test_serve_refuses_a_gc_minimum_age_below_the_longest_write_while_maintenance_is_on(tmp_path: Path) -> None:
    from clink.cli.pool import cli

    store_dir = tmp_path / "store"
    args = ["serve", "--store", str(store_dir), "--listen", "127.0.0.1:0", "--gc-min-age", "0"]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 2, result.output
    line = result.stderr.strip()
    assert "\n" not in line and "gc_min_age_s = 0 s must exceed LifecycleConfig.max_write_s = 1800 s" in line
    assert "--maintenance off" in line and not store_dir.exists()
