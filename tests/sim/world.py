"""The simulated world: subtasks, pools, maintenance and faults driven by one seed, checked against a model after every step.

A seed fixes everything: the ranges and rescales, the writes, which actor runs at each store call, which calls fail,
lose their reply or crash. The model knows what each subtask wrote; after every step the world checks that every
complete checkpoint reads as the model says, that no fenced writer's part is in one, that no referenced file is gone,
that pinned checkpoints and live writers' restore points survive, and that "latest" is never a checkpoint a rewind left
behind. A failure raises SimViolation naming the seed and the step.
"""

from __future__ import annotations

import functools
import json
import logging
import random
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

import snapshot as s
from client.backend import BackendConfig, RemoteReadBackend
from client.delta import MISSING
from pool.core import PoolCore
from pool.domain import PoolConfig
from pool.lifecycle import Lifecycle, LifecycleConfig
from pool.maintenance import Maintainer, MaintenanceConfig
from pool.maintenance_lease import LEASE_PREFIX, Lease
from pool.protocol import carried_paths, own_delta
from snapshot.errors import ClinkError, FencedError, NotFoundError
from store.checkpoint import CheckpointReader
from store.layout import metadata_key, part_key
from store.layout import parse_job_key as parse_job_key_uncached
from store.manifest import parse_manifest
from store.retry import RetryingStore, StoreRetryConfig
from store.segment_cache import SegmentCache
from tests.sim.adapter import LocalPool, connect
from tests.sim.scheduler import Actor, Scheduler, SimCrash
from tests.sim.store import SimStore

JOB = "sim"
OPS = (s.operator_id("counter"), s.operator_id("window"))
USER_KEYS = [f"user-{i}".encode() for i in range(48)]
OP_NAMES = [f"offset-{i}".encode() for i in range(5)]

Key = tuple[int, bytes]  # (op_id, key_bytes)
PartId = tuple[int, int, int, int]  # (checkpoint, kg_lo, kg_hi, epoch)


# the checker parses every key at every step; a key's parse never changes
parse_job_key = functools.lru_cache(maxsize=1 << 16)(parse_job_key_uncached)


class SimViolation(AssertionError):
    """An invariant the protocol promises did not hold."""


def keyed_key(user: bytes) -> bytes:
    return s.encode_keyed_key("v", user)


def op_key(name: bytes) -> bytes:
    return s.encode_operator_key("o", name)


def split(rng: random.Random, n: int) -> list[tuple[int, int]]:
    """N uneven ranges tiling 0..127."""
    cuts = sorted(rng.sample(range(1, 128), n - 1)) if n > 1 else []
    bounds = [0, *cuts, 128]
    return [(a, b - 1) for a, b in zip(bounds, bounds[1:], strict=False)]


def even(n: int) -> list[tuple[int, int]]:
    """N equal ranges tiling 0..127 (n a power of two)."""
    step = 128 // n
    return [(i * step, i * step + step - 1) for i in range(n)]


def rows_of(table) -> dict[Key, bytes]:
    """A canonical table as {(op_id, key_bytes): value_bytes}."""
    ops, keys, values = (table.column(c).to_pylist() for c in ("op_id", "key_bytes", "value_bytes"))
    return dict(zip(zip(ops, keys, strict=True), values, strict=True))


def merge_same_checkpoint(deltas: list[dict[Key, bytes | None]]) -> dict[Key, bytes | None]:
    """Operator-state writes of one checkpoint by several subtasks (lowest key groups first), by the format's rule."""
    out: dict[Key, bytes | None] = {}
    keys = {k for d in deltas for k in d}
    for k in keys:
        puts = [d[k] for d in deltas if k in d and d[k] is not None]
        if puts:
            if all(len(v) == 8 for v in puts):
                out[k] = max(puts, key=lambda v: int.from_bytes(v, "little", signed=True))
            else:
                out[k] = puts[0]
        else:
            out[k] = None
    return out


@dataclass
class PartModel:
    """What one issued commit ships, as the model sees it: its range's keyed state and its operator-state writes."""

    pid: PartId
    keyed: dict[Key, bytes]
    ops: dict[Key, bytes | None]
    parent_id: int
    prev: PartId | None  # this writer's previous landed part (own lineage), None after a restore
    base: tuple[int, tuple[PartId, ...]] | None  # (checkpoint, parts of its version) restored from, for a first commit
    fenced_before: bool  # the writer was fenced before this commit started: nothing of it may ever be visible
    restored_op: dict[Key, bytes] | None = None  # a restored job's checkpoint 1: its whole operator state


@dataclass
class Subtask:
    """One subtask process: its backend, range, and the model of what it holds."""

    uid: int
    backend: RemoteReadBackend
    lo: int
    hi: int
    keyed: dict[Key, bytes]
    unshipped_ops: dict[Key, bytes | None] = field(default_factory=dict)
    prev: PartId | None = None
    base: tuple[int, tuple[PartId, ...]] | None = None
    next_cid: int = 1
    zombie: bool = False
    fenced_seq: int | None = None  # world step at which a successor fenced it
    busy: Actor | None = None
    restored: bool = True
    restore_target: int = 0
    cancelled: bool = False


def clink_error_names() -> frozenset[str]:
    """Names of every ClinkError class: a maintenance run that failed with anything else hit a defect."""
    out, todo = set(), [ClinkError]
    while todo:
        cls = todo.pop()
        out.add(cls.__name__)
        todo += cls.__subclasses__()
    return frozenset(out)


class SimMaintainer(Maintainer):
    """A pool's maintainer (pool/maintenance.py) whose every task start and end the world checks against the leases."""

    world: World

    def _run_task(self, job, task, context, lease):  # noqa: ANN001, ANN202 - Maintainer's own signature
        self.world.task_started(self, job, task, lease)
        try:
            return super()._run_task(job, task, context, lease)
        finally:
            self.world.task_ended(self, job)


class World:
    """One seeded run: ``run(steps)`` drives the workload, checks after every step, and drains at the end."""

    def __init__(self, seed: int, faults: bool = True, maintainers: bool | None = None) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.sched = Scheduler(random.Random(seed * 7919 + 1), pct=random.Random(seed).choice([0.0, 0.0, 0.02, 0.1]))
        # no process pauses longer than a quarter of GC's minimum age between two store calls (docs/protocol.md)
        self.store = SimStore(self.sched, random.Random(seed * 104729 + 2))
        if faults:
            self.store.error_rate = self.rng.choice([0.0, 0.01, 0.03])
            self.store.lost_rate = self.rng.choice([0.0, 0.01, 0.02])
        self.crash_rate = self.rng.choice([0.0, 0.001, 0.004]) if faults else 0.0
        self.min_age_ms = self.rng.choice([2000, 6000, 20000])
        self.sched.max_pause_ms = self.min_age_ms // 4
        n_pools = self.rng.randint(1, 3)
        self.pools = [self._pool(i) for i in range(n_pools)]
        self.client_rng = random.Random(seed * 31 + 3)
        self.fenced_at: dict[tuple[int, int, int], int] = {}  # (lo, hi, epoch) -> store effect that fenced it
        self.part_written_at: dict[str, int] = {}  # part key -> store effect that wrote it
        self.store.on_effect = self.observe
        self.parts: dict[PartId, PartModel] = {}
        self.subtasks: list[Subtask] = []
        self.zombies: list[Subtask] = []
        self.next_uid = 0
        self.step_no = 0
        self.actions: list[str] = []
        self.verified: set[tuple[str, str]] = set()  # (key, etag) of manifest versions already checked
        self.parsed: dict[tuple[str, str], object] = {}
        # (key, etag) whose references were all present, with no object deleted since: checked again only after a delete
        self.references_held: set[tuple[str, str]] = set()
        self.present_at_last_check: set[str] = set()
        self.restores: list[tuple[int, int]] = []  # (base, epoch) of every restore that completed
        self.group_target: int | None = None  # the checkpoint a rescale or rewind in progress restores to
        self.restoring: list[Subtask] = []
        self.savepoints: dict[str, dict[Key, bytes]] = {}
        # savepoints under way: name -> (checkpoint, every version of it current at some moment since the savepoint
        # started, as (max epoch, model)); the savepoint may read any of them (a re-completion can replace it meanwhile)
        self.saving: dict[str, tuple[int, list[tuple[int, dict[Key, bytes]]]]] = {}
        self.restored_jobs: dict[str, dict[Key, bytes]] = {}
        self.pinned: dict[int, int] = {}  # checkpoint -> expiry (logical ms)
        self.deleted: set[int] = set()
        self.life = 0  # how many times the job was deleted and created again (part ids are per life)
        self.life_epoch_floor = 0
        self.stats = {
            "commits": 0,
            "complete_versions": 0,
            "rescales": 0,
            "rewinds": 0,
            "failovers": 0,
            "zombie_commits": 0,
            "gc_runs": 0,
            "gc_deleted": 0,
            "compactions": 0,
            "crashes": 0,
            "reads": 0,
            "warm_reads": 0,
        }
        self.max_actors = self.rng.randint(2, 5)
        # the workload's profile, drawn per seed so some seeds hammer what others barely touch
        self.user_keys = USER_KEYS[: self.rng.choice([8, 16, 48])]
        self.op_names = OP_NAMES[: self.rng.choice([1, 1, 2, 5])]
        self.op_write = self.rng.choice([0.0, 0.1, 0.1, 0.3])
        self.erase = self.rng.choice([0.15, 0.4, 0.7, 0.7])
        self.restart_weight = self.rng.choice([0.5, 1, 2])
        self.binary_splits = self.rng.random() < 0.5
        self.compact_weight = self.rng.choice([0.05, 0.3, 0.6])  # share of maintenance that compacts
        self.time_weight = self.rng.choice([0.5, 2, 5])  # how often time jumps (files age past GC's minimum age)
        self.parallelism = 1
        self.rescale_weight = self.rng.choice([0.3, 1, 3])
        self.gc_race = self.rng.random() < 0.12  # one writer committing back to back while GC, retention and compaction race it
        self.gc_focus = self.gc_race or self.rng.random() < 0.3  # maintenance, GC and retention dominate; time passes quickly
        # an operator deletes checkpoints running commits build on (their parent, the latest): each commit must notice (I6)
        self.parent_deletes = self.rng.random() < 0.3
        if self.gc_focus:
            self.time_weight = 6
            self.compact_weight = 0.5
        # the pools' own maintenance (pool/maintenance.py): two maintainers competing for leases, rounds beside everything
        # else; its choices come from an rng of its own, so a seed without maintainers runs exactly as it did before them
        self.maint_rng = random.Random(seed * 613 + 29)
        self.with_maintainers = self.maint_rng.random() < 0.5 if maintainers is None else maintainers
        self.maintainers: list[SimMaintainer] = []
        self.maint_busy: dict[str, Actor] = {}  # holder -> its round (or release) in flight
        self.generation = 0
        self.in_task: dict[str, dict[str, int]] = {}  # job -> holder -> expiry of the lease its running task started under
        self.lease_seen: dict[str, tuple[str, int]] = {}  # lease key -> (holder, expires_ms) of its last write
        self.last_task_holder: dict[str, str] = {}
        self.error_names = clink_error_names()
        for key in (
            "maintainer_rounds",
            "maintainer_tasks",
            "maintainer_takeovers",
            "maintainer_deaths",
            "maintainer_gc_bytes",
            "maintainer_layers_folded",
            "maintainer_checkpoints_deleted",
        ):
            self.stats[key] = 0
        if self.with_maintainers:
            rng = self.maint_rng
            ttl_s = rng.choice([0.1, 0.25, 1.0]) * self.min_age_ms / 1000  # a dead holder's lease lapses within the run
            self.maint_config = MaintenanceConfig(
                interval_s=ttl_s / 3,
                lease_ttl_s=ttl_s,
                keep_last=rng.randint(1, 3),
                compact_max_layers=rng.randint(1, 4),
                compact_max_delta_bytes=rng.choice([2000, 1 << 20]),
                gc_min_age_s=self.min_age_ms / 1000,
                history=8,
            )
            self.maint_rate = rng.choice([0.05, 0.15, 0.3])
            self.maintainers = [self._maintainer(n) for n in range(2)]

    # ---- construction -----------------------------------------------------------------------------------------

    def _pool(self, i: int) -> tuple[PoolCore, Lifecycle]:
        retry = StoreRetryConfig(max_attempts=4, initial_backoff_s=0, max_backoff_s=0, sleep=lambda _: None, seed=self.seed * 13 + i)
        store = RetryingStore(self.store, retry)
        clock = lambda: self.sched.now_ms / 1000  # noqa: E731 - the logical clock in seconds
        config = PoolConfig(
            cache_bytes=self.rng.choice([1 << 16, 8 << 20]),
            resolved_index_after=-1,
            segment_target_bytes=512,
            max_commit_s=self.min_age_ms / 3000,
        )
        core = PoolCore(store, config, clock=clock)
        core.fencing._sleep = lambda _: None
        life = Lifecycle(
            store,
            LifecycleConfig(gc_min_age_s=self.min_age_ms / 1000, retain_last=1, max_write_s=self.min_age_ms / 3000),
            clock=clock,
            cache=SegmentCache(1 << 20),
            on_manifest_replaced=core.forget_manifest,
        )
        return core, life

    def _maintainer(self, n: int) -> SimMaintainer:
        """A new maintainer process on pool n (its holder id names its generation: a restarted one is a new holder)."""
        self.generation += 1
        _, life = self.pools[n % len(self.pools)]
        clock = lambda: self.sched.now_ms / 1000  # noqa: E731 - the logical clock in seconds
        holder = f"m{n}-g{self.generation}"
        m = SimMaintainer(life.store, life, self.maint_config, holder, clock, max_commit_s=self.min_age_ms / 3000)
        m.world = self
        return m

    def maintainer_round(self) -> None:
        """One idle maintainer runs a round (or, rarely, stops cleanly or dies between rounds and is started again)."""
        idle = [(n, m) for n, m in enumerate(self.maintainers) if m.holder_id not in self.maint_busy]
        if not idle:
            return
        n, m = self.maint_rng.choice(idle)
        choice = self.maint_rng.random()
        if choice < 0.01:  # killed between rounds: its leases stay until they expire
            self.stats["maintainer_deaths"] += 1
            self.note(f"maintainer {m.holder_id} dies")
            self.maintainers[n] = self._maintainer(n)
            return
        if choice < 0.03:  # a clean stop: its leases are released, then a new process starts
            self.note(f"maintainer {m.holder_id} stops cleanly")

            def released(actor: Actor) -> None:
                self.maint_busy.pop(m.holder_id, None)
                self._ignore_errors("release leases")(actor)
                self.maintainers[n] = self._maintainer(n)

            self.maint_busy[m.holder_id] = self.sched.spawn(f"release-{m.holder_id}", m.release_leases)
            self.maint_busy[m.holder_id].done = released  # type: ignore[attr-defined]
            return
        self.stats["maintainer_rounds"] += 1
        self.note(f"maintainer {m.holder_id} runs a round")

        def done(actor: Actor) -> None:
            self.maint_busy.pop(m.holder_id, None)
            if isinstance(actor.error, SimCrash):  # the pool died mid-round: a new process (a new holder) takes its place
                self.stats["maintainer_deaths"] += 1
                for holders in self.in_task.values():
                    holders.pop(m.holder_id, None)
                if self.maintainers[n] is m:
                    self.maintainers[n] = self._maintainer(n)
                return
            if actor.error is not None:
                self.fail(f"maintainer {m.holder_id}'s round raised {type(actor.error).__name__}: {actor.error}")
            for job, runs in actor.result.items():
                for run in runs:
                    if run.outcome == "error" and run.detail.split(":", 1)[0] not in self.error_names:
                        self.fail(f"maintenance {run.task} of job {job} hit a defect: {run.detail}")
                    if run.outcome == "error":
                        self.note(f"maintenance {run.task} of {job} by {m.holder_id} failed: {run.detail[:100]}")
                    self.stats["maintainer_gc_bytes"] += run.bytes_reclaimed
                    self.stats["maintainer_layers_folded"] += run.layers_folded
                    self.stats["maintainer_checkpoints_deleted"] += run.checkpoints_deleted

        actor = self.sched.spawn(f"maintain-{m.holder_id}", m.run_once)
        actor.done = done  # type: ignore[attr-defined]
        self.maint_busy[m.holder_id] = actor

    def task_started(self, m: Maintainer, job: str, task: str, lease: Lease) -> None:
        """A task starts only under the maintainer's own unexpired lease, and never beside another's under a live lease."""
        now = self.sched.now_ms
        item = self._objects().get(f"{LEASE_PREFIX}{job}.json")
        body = json.loads(item[0]) if item else {}
        if body.get("holder") != m.holder_id or body.get("expires_ms", 0) <= now:
            self.fail(f"maintainer {m.holder_id} starts {task} of {job} without holding its lease (the store has {body})")
        for holder, expires in self.in_task.get(job, {}).items():
            if holder != m.holder_id and expires > now:
                self.fail(f"maintainers {holder} and {m.holder_id} maintain job {job} at once ({holder}'s lease lasts to {expires})")
        self.in_task.setdefault(job, {})[m.holder_id] = lease.expires_ms
        if self.last_task_holder.get(job, m.holder_id) != m.holder_id:
            self.stats["maintainer_takeovers"] += 1
        self.last_task_holder[job] = m.holder_id
        self.stats["maintainer_tasks"] += 1

    def task_ended(self, m: Maintainer, job: str) -> None:
        self.in_task.get(job, {}).pop(m.holder_id, None)

    def observe_lease(self, key: str) -> None:
        """A lease changes hands only once its holder's expiry has passed (or the holder released it: expired now)."""
        item = self._objects().get(key)
        if item is None:
            self.lease_seen.pop(key, None)
            return
        body = json.loads(item[0])
        before = self.lease_seen.get(key)
        if before is not None and before[0] != body["holder"] and before[1] > self.sched.now_ms:
            self.fail(f"lease {key} went from {before[0]} (expires {before[1]}) to {body['holder']} at {self.sched.now_ms}")
        self.lease_seen[key] = (body["holder"], body["expires_ms"])

    def _local_pool(self) -> LocalPool:
        return LocalPool([c for c, _ in self.pools], random.Random(self.client_rng.getrandbits(32)))

    def observe(self, seq: int, op: str, key: str, before) -> None:
        """Record when each writer was fenced and when each part landed, from the store's own effects."""
        if key.startswith(LEASE_PREFIX):
            self.observe_lease(key)
        elif key == f"jobs/{JOB}/writers" and op in ("compare_and_swap", "put_if_absent", "put"):
            from store.writers import parse_writers

            old = parse_writers(before[0], key).writers if before else ()
            new = {(w.kg_lo, w.kg_hi, w.epoch) for w in self.writers().writers}
            for w in old:
                if (w.kg_lo, w.kg_hi, w.epoch) not in new:
                    self.fenced_at.setdefault((w.kg_lo, w.kg_hi, w.epoch), seq)
        elif op == "put_if_absent" and "/parts/" in key and key.startswith(f"jobs/{JOB}/"):
            self.part_written_at.setdefault(key, seq)
        elif op in ("compare_and_swap", "put_if_absent", "put") and key.endswith("/_metadata") and self.saving:
            parsed = parse_job_key(key)
            if parsed and parsed.job == JOB and parsed.kind == "metadata" and key in self._objects():
                data, etag, _ = self._objects()[key]
                m = self._parse(key, data, etag)
                for cid, candidates in self.saving.values():
                    if cid == parsed.checkpoint_id:
                        candidates.append((m.max_epoch, self.model_of(cid, self.part_ids(m))))

    def fail(self, what: str) -> None:
        tail = "\n  ".join(self.actions[-25:])
        raise SimViolation(f"seed {self.seed} step {self.step_no}: {what}\n  last actions:\n  {tail}")

    def note(self, text: str) -> None:
        self.actions.append(f"[{self.step_no}] {text}")

    # ---- reading the store directly (the checker's view: no faults, no yields) ---------------------------------

    def _objects(self) -> dict[str, tuple[bytes, str, int]]:
        return self.store.inner.objects

    def _parse(self, key: str, data: bytes, etag: str):
        item = self.parsed.get((key, etag))
        if item is None:
            item = self.parsed[(key, etag)] = parse_manifest(data, key)
        return item

    def complete_versions(self, job: str = JOB) -> dict[int, tuple[object, str]]:
        out = {}
        for key, (data, etag, _) in list(self._objects().items()):
            parsed = parse_job_key(key)
            if parsed and parsed.job == job and parsed.kind == "metadata":
                out[parsed.checkpoint_id] = (self._parse(key, data, etag), etag)
        return out

    def checker(self) -> PoolCore:
        return PoolCore(self.store.inner, PoolConfig(resolved_index_after=-1))

    # ---- the model ---------------------------------------------------------------------------------------------

    def past(self, pid: PartId, memo: dict) -> set[PartId]:
        """Every part whose writes a part's state includes: itself, its writer's earlier parts, the version it restored from."""
        if pid in memo:
            return memo[pid]
        memo[pid] = set()
        out = {pid}
        part = self.parts.get(pid)
        if part is not None:
            if part.prev is not None:
                out |= self.past(part.prev, memo)
            if part.base is not None:
                for q in part.base[1]:
                    out |= self.past(q, memo)
        memo[pid] = out
        return out

    def op_state(self, part_ids: tuple[PartId, ...]) -> dict[Key, bytes]:
        """Operator state of a checkpoint made of these parts: every write in their past, checkpoint by checkpoint."""
        memo: dict = {}
        past: set[PartId] = set()
        for pid in part_ids:
            past |= self.past(pid, memo)
        state: dict[Key, bytes] = {}
        restored = [self.parts[p].restored_op for p in past if p in self.parts and self.parts[p].restored_op is not None]
        if restored:
            state = dict(restored[0])
        by_cid: dict[int, list[PartModel]] = {}
        for pid in past:
            if pid in self.parts and self.parts[pid].restored_op is None:
                by_cid.setdefault(pid[0], []).append(self.parts[pid])
        for cid in sorted(by_cid):
            merged = merge_same_checkpoint([p.ops for p in sorted(by_cid[cid], key=lambda p: p.pid[1])])
            for k, v in merged.items():
                if v is None:
                    state.pop(k, None)
                else:
                    state[k] = v
        return state

    def model_of(self, cid: int, part_ids: tuple[PartId, ...]) -> dict[Key, bytes]:
        """The whole state a complete checkpoint made of these parts must read as."""
        out: dict[Key, bytes] = {}
        for pid in part_ids:
            part = self.parts.get(pid)
            if part is None:
                self.fail(f"checkpoint {cid} holds part {pid}, which no subtask committed")
            out.update({k: v for k, v in part.keyed.items() if pid[1] <= k[1][0] <= pid[2]})
        out.update(self.op_state(part_ids))
        return out

    @staticmethod
    def part_ids(manifest) -> tuple[PartId, ...]:
        return tuple((manifest.checkpoint_id, p.kg_lo, p.kg_hi, p.epoch) for p in manifest.parts)

    def abandoned(self, manifest) -> bool:
        """By the world's own records: after the base of the newest restore, and made only by epochs older than it."""
        if not self.restores:
            return False
        base, epoch = max(self.restores, key=lambda r: r[1])
        return manifest.checkpoint_id > base and manifest.max_epoch < epoch

    # ---- checks ------------------------------------------------------------------------------------------------

    def check(self) -> None:
        self.notice_fencing()
        objects = self._objects()
        present = set(objects)
        if not self.present_at_last_check <= present:  # something was deleted: every manifest is checked again
            self.references_held.clear()
        self.present_at_last_check = present
        for key, (data, etag, _) in list(objects.items()):
            if (key, etag) in self.references_held:
                continue
            self.references_held.add((key, etag))  # a failure below ends the run, so adding first is safe
            parsed = parse_job_key(key)
            if key.startswith("savepoints/") and key.endswith("/_metadata"):
                m = self._parse(key, data, etag)
                base = key[: -len("_metadata")]
                missing = [f.path for f in m.files if base + f.path not in present]
                if missing:
                    self.fail(f"savepoint {key} names {missing[0]}, which is gone")
                continue
            if parsed is None or parsed.kind not in ("metadata", "part"):
                continue
            if parsed.kind == "part" and parsed.job == JOB and (parsed.epoch or 0) < self.life_epoch_floor:
                continue  # a part an earlier life's process wrote after the job was deleted: it never counts
            m = self._parse(key, data, etag)
            prefix = f"jobs/{parsed.job}/"
            missing = sorted(p for p in m.referenced_paths if prefix + p not in present)
            if missing and not (parsed.kind == "part" and self.never_counts(parsed.job, m, missing)):
                self.fail(f"{key} (etag {etag}) references {missing[0]}, which GC or someone else deleted")
        versions = self.complete_versions()
        for cid, (m, etag) in versions.items():
            if (f"chk-{cid}", etag) in self.verified:
                continue
            self.verified.add((f"chk-{cid}", etag))
            self.stats["complete_versions"] += 1
            self.check_held_at_once(cid, self.part_ids(m))
            for pid in self.part_ids(m):
                part = self.parts.get(pid)
                if part is not None and part.fenced_before:
                    self.fail(f"checkpoint {cid} holds part {pid} of a writer fenced before it committed")
                fenced = self.fenced_at.get(pid[1:])
                written = self.part_written_at.get(f"jobs/{JOB}/chk-{pid[0]}/parts/{pid[1]}-{pid[2]}-e{pid[3]}.json")
                if fenced is not None and written is not None and written > fenced:
                    self.fail(
                        f"checkpoint {cid} holds part {pid}, written (store effect {written}) after its writer was fenced (effect {fenced})"
                    )
            self.verify_state(JOB, cid, self.model_of(cid, self.part_ids(m)), m)
        now = self.sched.now_ms
        for cid, expires in self.pinned.items():
            if expires > now + 1000 and cid not in versions and cid not in self.deleted:
                self.fail(f"checkpoint {cid} is pinned until {expires} but is gone")
        for sub in self.subtasks:
            if sub.restored and sub.base is not None and not sub.zombie and sub.base[0] not in versions and sub.base[0] not in self.deleted:
                self.fail(f"checkpoint {sub.base[0]}, which live subtask {sub.uid} restored from, is gone")
        left_behind = {m.checkpoint_id for m, _ in versions.values() if self.abandoned(m)}
        if left_behind and not self.restoring:  # with restores under way the world's records lag the writers table
            latest = CheckpointReader(self.store.inner, JOB).latest()
            if latest in left_behind:
                self.fail(f"latest is {latest}, a checkpoint the rewind to an earlier one left behind")

    def check_held_at_once(self, cid: int, part_ids: tuple[PartId, ...]) -> None:
        """I1: a completion judged every part by one writers table read after they all landed, so some moment after the
        last of them was written came before any of their writers was fenced.
        """
        written = [self.part_written_at.get(f"jobs/{JOB}/chk-{p[0]}/parts/{p[1]}-{p[2]}-e{p[3]}.json") for p in part_ids]
        fenced = [(f, p) for p in part_ids if (f := self.fenced_at.get(p[1:])) is not None]
        if None in written or not fenced:
            return  # a part of an earlier life or written before this run's records, or no writer fenced yet
        last = max(w for w in written if w is not None)
        first_fence, fenced_part = min(fenced)
        if last > first_fence:
            self.fail(
                f"checkpoint {cid}'s parts never all held their ranges at once: the last was written (store effect {last}) "
                f"after the writer of {fenced_part} was fenced (effect {first_fence})"
            )

    def never_counts(self, job: str, part, missing: list[str]) -> bool:
        """Whether a part naming files that are gone is one the protocol never counts: its own delta is there, but its
        parent (the _metadata, or its writer's own part of it) was deleted and no longer holds what it carried.

        Such a part was written by a commit whose parent was deleted under it; that commit fails its parent check, and
        every completion checks each part's parent (I6), so only a checkpoint holding it would be wrong (checked above).
        """
        mine = own_delta(part)
        if mine is not None and mine.path in missing:
            return False
        p = part.parts[0]
        for key in (metadata_key(job, part.parent_id), part_key(job, part.parent_id, p.kg_lo, p.kg_hi, p.epoch)):
            item = self._objects().get(key)
            if item is not None and carried_paths(part) <= self._parse(key, item[0], item[1]).referenced_paths:
                return False
        return True

    def writers(self):
        from store.writers import EMPTY_TABLE, parse_writers

        key = f"jobs/{JOB}/writers"
        item = self._objects().get(key)
        return parse_writers(item[0], key) if item else EMPTY_TABLE

    def holds(self, sub: Subtask) -> bool:
        return self.writers().holds(sub.lo, sub.hi, sub.backend.epoch)

    def notice_fencing(self) -> None:
        """A live subtask whose epoch no longer holds its range was fenced this step: from now on it is a zombie."""
        table = self.writers()
        for sub in list(self.subtasks):
            if not table.holds(sub.lo, sub.hi, sub.backend.epoch):
                sub.zombie = True
                sub.fenced_seq = self.step_no
                self.subtasks.remove(sub)
                self.note(f"subtask {sub.uid} {sub.lo}-{sub.hi} e{sub.backend.epoch} is fenced")
                if self.rng.random() < 0.6:
                    self.zombies.append(sub)  # the old process lives on for a while and keeps committing

    def savepoint_model(self, name: str, cid: int, candidates: list[tuple[int, dict[Key, bytes]]]) -> dict[Key, bytes]:
        """The model of the version of checkpoint ``cid`` a just-written savepoint holds, checked against the savepoint itself.

        A savepoint reads ``_metadata`` once, at some moment while it runs: any version current then is right (a rewound
        job's re-completion may replace an abandoned version of the id meanwhile, I3). Which one it took its manifest
        says (the epoch of its one part is the version's newest epoch); its rows must be exactly that version's model.
        """
        key = f"savepoints/{name}/_metadata"
        data, etag, _ = self._objects()[key]
        epoch = self._parse(key, data, etag).max_epoch
        models = [model for e, model in candidates if e == epoch]
        if not models:
            self.fail(
                f"savepoint {name} of {cid} holds epoch {epoch}: no version of {cid} current while it ran has it {[e for e, _ in candidates]}"
            )
        reader, manifest, _ = Lifecycle(self.store.inner, cache=SegmentCache(1 << 20)).open_savepoint(name)
        table = reader.read_manifest_table(manifest)
        got = rows_of(table)
        if got not in models:
            diff = sorted(set(got.items()) ^ set(models[-1].items()))[:6]
            self.fail(
                f"savepoint {name} of {cid} (epoch {epoch}) holds {len(got)} rows, the model has {len(models[-1])}; differing: {diff}"
            )
        return got

    def verify_state(self, job: str, cid: int, model: dict[Key, bytes], manifest=None) -> None:
        core = self.checker()
        table, _ = core.scan_table(job, cid, None, [], None)
        got = rows_of(table)
        if got != model:
            diff = sorted(set(got.items()) ^ set(model.items()))[:6]
            self.fail(f"checkpoint {cid} of {job} scans {len(got)} rows, the model has {len(model)}; differing: {diff}")
        probe = sorted(model) + [(OPS[0], keyed_key(b"never")), (OPS[1], op_key(b"never"))]
        probe += [(o, keyed_key(u)) for o in OPS for u in USER_KEYS[:12]] + [(o, op_key(n)) for o in OPS for n in OP_NAMES]
        found, values, _ = core.multi_get(job, cid, [k[0] for k in probe], [k[1] for k in probe])
        for k, f, v in zip(probe, found, values, strict=True):
            want = model.get(k)
            if (v if f else None) != want:
                self.fail(f"checkpoint {cid} of {job}: get{k} answers {v if f else None!r}, the model says {want!r}")

    # ---- subtasks ----------------------------------------------------------------------------------------------

    def new_subtask(self, lo: int, hi: int, restored: bool = False) -> Subtask:
        """A new subtask process: it connects (taking an epoch) and, unless the job is new, restores before it works."""
        pool = self._local_pool()
        # warm-up "eager" loads inside restore, on the simulation's schedule; "auto" would load on a thread of its own
        config = BackendConfig(cache_bytes=self.rng.choice([0, 2048, 4096, 1 << 20]), warm_up=self.rng.choice(["off", "eager", "eager"]))
        backend = connect(pool, JOB, (lo, hi), config)
        for uid in ("counter", "window"):
            backend.register_operator(uid)
        self.next_uid += 1
        return Subtask(self.next_uid, backend, lo, hi, {}, restored=restored)

    def start_restore(self, sub: Subtask, cid: int) -> None:
        """A new subtask process restores from checkpoint ``cid`` (retried until it can, as a restarted worker would)."""
        if sub not in self.restoring:
            self.restoring.append(sub)
        sub.restore_target = cid

        def done(actor: Actor) -> None:
            if sub.cancelled:
                return  # the coordinator killed this process when it restarted the job again
            if actor.error is not None:
                self.note(f"restore of subtask {sub.uid} to {cid} failed: {type(actor.error).__name__}: {str(actor.error)[:100]}")
                if not isinstance(actor.error, (ClinkError, SimCrash)):
                    self.fail(f"restore raised {type(actor.error).__name__}: {actor.error}")
                self.start_restore(sub, cid)
                return
            self.restoring.remove(sub)
            versions = self.complete_versions()
            if not self.holds(sub):
                self.note(f"subtask {sub.uid} restored from {cid} but was fenced meanwhile: it is a zombie")
                sub.zombie, sub.fenced_seq = True, self.step_no
                return
            if cid and cid not in versions:
                self.fail(f"subtask {sub.uid} restored from checkpoint {cid}, which is not complete")
            if cid:
                m, _ = versions[cid]
                parts = self.part_ids(m)
                model = self.model_of(cid, parts)
                sub.keyed = {k: v for k, v in model.items() if k[1][0] < 128 and sub.lo <= k[1][0] <= sub.hi}
                sub.base = (cid, parts)
                sub.next_cid = cid + 1
            else:  # a fresh start: empty state, no parent (checkpoint ids go on where the job was)
                sub.keyed, sub.base = {}, None
            sub.prev = None
            sub.unshipped_ops = {}
            sub.restored = True
            self.subtasks.append(sub)
            self.restores.append((cid, sub.backend.epoch))
            self.note(f"subtask {sub.uid} {sub.lo}-{sub.hi} restored from {cid} at epoch {sub.backend.epoch}")
            if not any(t.restore_target == self.group_target for t in self.restoring):
                self.group_target = None

        self.launch(f"restore-{sub.uid}", (lambda: sub.backend.restore(cid)) if cid else sub.backend.start_fresh, done, sub)

    # ---- actors ------------------------------------------------------------------------------------------------

    def launch(self, name: str, fn: Callable[[], object], done: Callable[[Actor], None], sub: Subtask | None = None) -> None:
        actor = self.sched.spawn(name, fn)
        actor.done = done  # type: ignore[attr-defined]
        if sub is not None:
            sub.busy = actor

    def finish(self, actor: Actor) -> None:
        for sub in [*self.subtasks, *self.zombies, *self.restoring]:
            if sub.busy is actor:
                sub.busy = None
        if isinstance(actor.error, SimCrash):
            self.stats["crashes"] += 1
        actor.done(actor)  # type: ignore[attr-defined]

    # ---- the workload ------------------------------------------------------------------------------------------

    def write(self, sub: Subtask) -> None:
        if self.rng.random() < 0.08:  # everything it holds erased, operator state too: the next folds come out empty
            for key in list(sub.keyed):
                sub.backend.erase(*key)
                sub.keyed.pop(key)
            for op in OPS:
                for name in self.op_names:
                    sub.backend.erase(op, op_key(name))
                    sub.unshipped_ops[(op, op_key(name))] = None
            return
        for _ in range(self.rng.randint(1, 6)):
            op = self.rng.choice(OPS)
            if self.rng.random() < self.op_write:
                key = (op, op_key(self.rng.choice(self.op_names)))
                if self.rng.random() < self.erase:
                    sub.backend.erase(*key)
                    sub.unshipped_ops[key] = None
                else:
                    value = (
                        self.rng.randrange(-50, 1000).to_bytes(8, "little", signed=True)
                        if self.rng.random() < 0.5
                        else f"s{sub.uid}-{self.step_no}".encode()
                    )
                    sub.backend.put(*key, value)
                    sub.unshipped_ops[key] = value
                continue
            mine = [u for u in self.user_keys if sub.lo <= s.key_group(u) <= sub.hi]
            if not mine:
                continue
            if self.rng.random() < 0.2:  # a bulk write: put_many's Arrow run under (and over) per-key writes; a key may repeat
                picked = [keyed_key(self.rng.choice(mine)) for _ in range(self.rng.randint(1, 6))]
                values = [f"{sub.uid}:{self.step_no}:bulk{i}".encode() for i in range(len(picked))]
                sub.backend.put_many(op, picked, values)
                for k, v in zip(picked, values, strict=True):
                    sub.keyed[(op, k)] = v
                continue
            key = (op, keyed_key(self.rng.choice(mine)))
            if key in sub.keyed and self.rng.random() < self.erase:
                sub.backend.erase(*key)
                sub.keyed.pop(key, None)
            else:
                value = f"{sub.uid}:{self.step_no}:{self.rng.randrange(1000)}".encode()
                sub.backend.put(*key, value)
                sub.keyed[key] = value

    def snapshot(self, sub: Subtask) -> None:
        cid = sub.next_cid
        epoch = sub.backend.epoch
        pid = (cid, sub.lo, sub.hi, epoch)
        fenced = sub.zombie
        parent = sub.backend.parent_id
        part = PartModel(
            pid,
            dict(sub.keyed),
            dict(sub.unshipped_ops),
            parent,
            sub.prev if parent and sub.prev and sub.prev[0] == parent else None,
            sub.base if parent and (sub.prev is None or sub.prev[0] != parent) else None,
            fenced,
        )
        if pid not in self.parts:
            self.parts[pid] = part
        self.note(f"{'zombie ' if sub.zombie else ''}subtask {sub.uid} {sub.lo}-{sub.hi} e{epoch} snapshots {cid} (parent {parent})")

        def done(actor: Actor) -> None:
            if actor.error is None:
                if fenced:
                    self.fail(f"zombie subtask {sub.uid} (fenced at step {sub.fenced_seq}) committed checkpoint {cid} successfully")
                sub.prev = pid
                sub.unshipped_ops = {}
                self.stats["commits"] += 1
                self.note(f"subtask {sub.uid} committed {cid}: complete={actor.result.checkpoint.complete}")
            else:
                self.note(f"subtask {sub.uid} commit {cid} failed: {type(actor.error).__name__}: {str(actor.error)[:120]}")
                if not isinstance(actor.error, (ClinkError, SimCrash)):
                    self.fail(f"commit raised {type(actor.error).__name__}: {actor.error}")
                if isinstance(actor.error, SimCrash):
                    self.on_crash(sub)
                elif isinstance(actor.error, NotFoundError) and sub in self.subtasks:
                    self.note(f"subtask {sub.uid} lost its parent: the job restarts it from the latest checkpoint")
                    self.subtasks.remove(sub)
                    self.failover(sub)
            sub.next_cid = max(sub.next_cid, cid + 1)

        if sub.zombie:
            self.stats["zombie_commits"] += 1
        self.launch(f"snapshot-{sub.uid}-{cid}", lambda: sub.backend.snapshot(cid), done, sub)

    def read(self, sub: Subtask) -> None:
        keys = [keyed_key(u) for u in self.user_keys if sub.lo <= s.key_group(u) <= sub.hi] + [op_key(n) for n in self.op_names]
        op = self.rng.choice(OPS)
        expected = {k: sub.keyed.get((op, k)) for k in keys if k[0] < 128}
        also: dict[bytes, int] = {}
        b = sub.backend
        for k in keys:
            if k[0] < 128:
                continue
            layers = [b._delta, b._shipping, *(layer for _, layer in reversed(b._pending))]
            local = next((v for layer in layers if (v := layer.get((op, k))) is not MISSING), "pool")
            if local != "pool":
                expected[k] = local  # this subtask's own write, not yet in a checkpoint it knows complete
            elif b.read_checkpoint:
                m, _ = self.complete_versions().get(b.read_checkpoint, (None, None))
                if m is not None:
                    expected[k] = self.model_of(m.checkpoint_id, self.part_ids(m)).get((op, k))
                    also[k] = b.read_checkpoint  # a newer version completing during the read may answer instead

        def done(actor: Actor) -> None:
            if actor.error is not None:
                if not isinstance(actor.error, (ClinkError, SimCrash)):
                    self.fail(f"get_many raised {type(actor.error).__name__}: {actor.error}")
                if isinstance(actor.error, FencedError) and self.holds(sub):
                    self.fail(f"subtask {sub.uid}, which still holds its range, had its read refused: {actor.error}")
                return
            self.stats["reads"] += 1
            for k, got in zip(keys, actor.result, strict=True):
                if k in also and got != expected[k]:
                    m, _ = self.complete_versions().get(also[k], (None, None))
                    if m is not None and got == self.model_of(m.checkpoint_id, self.part_ids(m)).get((op, k)):
                        continue
                if k in expected and got != expected[k]:
                    self.fail(
                        f"subtask {sub.uid} reads {k!r} as {got!r}; the model says {expected[k]!r} "
                        f"(its own writes, else checkpoint {sub.backend.read_checkpoint})"
                    )

        if b.cache_stats["warm_rows"]:
            self.stats["warm_reads"] += 1  # a read the warm table may answer: what the warm mutants are caught by
        self.launch(f"read-{sub.uid}", lambda: sub.backend.get_many(op, keys), done, sub)

    def on_crash(self, sub: Subtask) -> None:
        """A subtask's process died: a new one takes its range from the latest complete checkpoint."""
        if sub in self.subtasks:
            self.subtasks.remove(sub)
            self.failover(sub)

    def latest_current(self) -> int:
        """What a coordinator restores a failed subtask to: the rescale or rewind in progress, else the pool's latest."""
        if self.group_target is not None:
            return self.group_target
        return CheckpointReader(self.store.inner, JOB).latest()

    def cancel_restores(self) -> None:
        """A new job-wide restart kills the processes still restoring for the previous one (as a coordinator cancels tasks)."""
        for sub in self.restoring:
            sub.cancelled = True
            if sub.busy is not None:
                self.sched.crash(sub.busy)
            self.note(f"restore of subtask {sub.uid} cancelled")
        self.restoring = []

    def restart_target(self) -> int | None:
        """A failover's target: None when the job must restart empty (no checkpoint, and no empty restart under way)."""
        cid = self.latest_current()
        return cid if cid or self.group_target == 0 else None

    def failover(self, sub: Subtask) -> None:
        cid = self.restart_target()
        if cid is None:  # nothing complete yet: as a job with no checkpoint does, the whole job starts again from empty state
            old = [t for t in self.subtasks if t is not sub] + [sub] + self.restoring
            next_cid = max(t.next_cid for t in old)
            self.note(f"subtask {sub.uid} failed before any checkpoint completed: the job restarts empty")
            for t in old:
                if t in self.subtasks:
                    self.subtasks.remove(t)
            self.cancel_restores()
            self.group_target = 0
            for lo, hi in split(self.rng, self.rng.randint(1, 8)):
                new = self.new_subtask(lo, hi)
                new.next_cid = next_cid
                self.start_restore(new, 0)
            return
        self.stats["failovers"] += 1
        new = self.new_subtask(sub.lo, sub.hi)
        self.note(f"failover of subtask {sub.uid}: subtask {new.uid} restores {cid}")
        self.start_restore(new, cid)

    def rescale(self, rewind: bool) -> None:
        latest = CheckpointReader(self.store.inner, JOB).latest()
        versions = self.complete_versions()
        current = sorted(cid for cid, (m, _) in versions.items() if not self.abandoned(m) and cid <= latest and cid not in self.deleted)
        if not current:
            return
        cid = self.rng.choice(current[:-1]) if rewind and len(current) > 1 else current[-1]
        self.cancel_restores()
        self.group_target = cid
        n = self.rng.randint(1, 8)
        if self.binary_splits:  # aligned halves and quarters, doubling or halving: 4 -> 2 -> 4 -> 2 shares files across shapes
            self.halving = not getattr(self, "halving", False) if self.parallelism not in (1, 8) else self.parallelism == 8
            n = max(1, min(8, self.parallelism // 2 if self.halving else self.parallelism * 2))
        self.parallelism = n
        same = sorted((t.lo, t.hi) for t in self.subtasks)
        tiled = (
            bool(same) and same[0][0] == 0 and same[-1][1] == 127 and all(a[1] + 1 == b[0] for a, b in zip(same, same[1:], strict=False))
        )
        ranges = (even(n) if self.binary_splits else split(self.rng, n)) if self.rng.random() < 0.7 or not tiled else same
        self.stats["rewinds" if cid != current[-1] else "rescales"] += 1
        self.note(f"{'rewind' if cid != current[-1] else 'rescale'} to {len(ranges)} subtasks from checkpoint {cid}")
        for lo, hi in ranges:
            self.start_restore(self.new_subtask(lo, hi), cid)

    def maintenance(self) -> None:
        core, life = self.rng.choice(self.pools)
        versions = self.complete_versions()
        choice = self.rng.random()
        if self.gc_focus and choice < 0.5:  # half of it GC or retention (keep 1), right behind the commits
            choice = self.compact_weight + (0.3 if choice < 0.3 else 0.05)
        if choice < self.compact_weight and versions:
            cid = max(versions) if self.gc_focus else self.rng.choice(sorted(versions))  # folding the newest frees its layers soonest
            self.stats["compactions"] += 1
            self.note(f"compact {cid}")
            self.launch(f"compact-{cid}", lambda: life.compact(JOB, cid, force=self.rng.random() < 0.5), self._ignore_errors("compact"))
        elif choice < self.compact_weight + 0.2:
            keep = self.rng.randint(1, 3)
            self.note(f"retain last {keep}")
            self.launch("retain", lambda: life.retain(JOB, keep_last=keep), self._ignore_errors("retain"))
        elif choice < self.compact_weight + 0.45:
            self.stats["gc_runs"] += 1
            self.note("gc")

            def gc_done(actor: Actor) -> None:
                if actor.error is None:
                    self.stats["gc_deleted"] += len(actor.result.deleted)
                self._ignore_errors("gc")(actor)

            self.launch("gc", lambda: life.gc(JOB), gc_done)
        elif choice < self.compact_weight + 0.55 and versions:
            cid = self.rng.choice(sorted(versions))
            ttl = self.rng.choice([0.5, 5, 60])

            def pinned(actor: Actor) -> None:
                if actor.error is None:
                    got_cid, expires = actor.result
                    self.pinned[got_cid] = max(self.pinned.get(got_cid, 0), expires)
                self._ignore_errors("pin")(actor)

            self.note(f"pin {cid} for {ttl} s")
            holder = f"holder-{self.step_no}"  # one holder per pin: a renewal by the same holder would replace its expiry
            self.launch(f"pin-{cid}", lambda: life.pin(JOB, cid, holder, ttl), pinned)
        elif choice < self.compact_weight + 0.62 and versions:
            cid = self.rng.choice(sorted(versions))
            name = f"sp-{self.step_no}"
            m, _ = versions[cid]
            self.saving[name] = (cid, [(m.max_epoch, self.model_of(cid, self.part_ids(m)))])

            def saved(actor: Actor) -> None:
                _, candidates = self.saving.pop(name)
                if actor.error is None:
                    self.savepoints[name] = self.savepoint_model(name, cid, candidates)
                    self.note(f"savepoint {name} of {cid} written")
                self._ignore_errors("savepoint")(actor)

            self.note(f"savepoint {name} of {cid}")
            self.launch(f"savepoint-{cid}", lambda: life.savepoint(JOB, cid, name), saved)
        elif self.savepoints and choice < self.compact_weight + 0.72:
            name = self.rng.choice(sorted(self.savepoints))
            job = f"restored-{self.step_no}"

            def restored(actor: Actor) -> None:
                if actor.error is None:
                    self.restored_jobs[job] = self.savepoints[name]
                    self.verify_state(job, 1, self.savepoints[name])
                    self.note(f"job {job} restored from savepoint {name}")
                self._ignore_errors("restore_job")(actor)

            self.note(f"restore savepoint {name} into {job}")
            self.launch(f"restore-job-{job}", lambda: life.restore_job(job, savepoint=name), restored)
        elif versions:
            protected = {t.base[0] for t in self.subtasks if t.base} | {t.restore_target for t in self.restoring}
            protected |= {cid for cid, e in self.pinned.items() if e > self.sched.now_ms}
            if not self.parent_deletes:
                protected |= {t.backend.parent_id for t in self.subtasks} | {self.latest_current()}
            candidates = [cid for cid in versions if cid not in protected and (self.parent_deletes or cid < self.latest_current())]
            if candidates:
                cid = self.rng.choice(sorted(candidates))
                self.deleted.add(cid)
                self.note(f"delete checkpoint {cid}")
                self.launch(f"delete-{cid}", lambda: core.delete_checkpoint(JOB, cid), self._ignore_errors("delete"))

    def _ignore_errors(self, what: str) -> Callable[[Actor], None]:
        def done(actor: Actor) -> None:
            if actor.error is not None:
                self.note(f"{what} failed: {type(actor.error).__name__}: {str(actor.error)[:100]}")
                if not isinstance(actor.error, (ClinkError, SimCrash)):
                    self.fail(f"{what} raised {type(actor.error).__name__}: {actor.error}")

        return done

    def pick_action(self) -> None:
        idle = [t for t in self.subtasks if t.busy is None and t.restored]
        zombies = [z for z in self.zombies if z.busy is None]
        w = self.restart_weight
        if self.gc_race:
            choices = [("write", 20 if idle else 0), ("snapshot", 30 if idle else 0), ("maintenance", 40), ("time", 10)]
            action = self.rng.choices([c for c, _ in choices], weights=[x for _, x in choices])[0]
            if action == "write":
                self.write(self.rng.choice(idle))
            elif action == "snapshot":
                self.snapshot(self.rng.choice(idle))
            elif action == "maintenance":
                self.maintenance()
            else:
                self.sched.now_ms += self.min_age_ms // self.rng.choice([4, 8, 16])
            return
        choices = [
            ("write", 30 if idle else 0),
            ("snapshot", 30 if idle else 0),
            ("read", 8 if idle else 0),
            ("zombie", 5 if zombies else 0),
            ("maintenance", 36 if self.gc_focus else 12),
            ("failover", 0.6 * w if idle else 0),
            ("rescale", self.rescale_weight),
            ("rewind", 0.5 * w),
            ("time", self.time_weight),
            ("zombie dies", 2 if self.zombies else 0),
            ("recreate", 0.1),
        ]
        action = self.rng.choices([c for c, _ in choices], weights=[x for _, x in choices])[0]
        if action == "write":
            self.write(self.rng.choice(idle))
        elif action == "snapshot":
            lagging = min(t.next_cid for t in idle)
            sub = self.rng.choice([t for t in idle if t.next_cid == lagging] if self.rng.random() < 0.7 else idle)
            lead = min(t.next_cid for t in self.subtasks)
            if sub.next_cid <= lead + 1:
                self.snapshot(sub)
        elif action == "read":
            self.read(self.rng.choice(idle))
        elif action == "zombie":
            z = self.rng.choice(zombies)
            self.write(z)
            self.snapshot(z)
        elif action == "maintenance":
            self.maintenance()
        elif action == "failover":
            self.failover(self.rng.choice(idle))
        elif action in ("rescale", "rewind"):
            self.rescale(rewind=action == "rewind")
        elif action == "time":  # time passes: files age past GC's minimum age, commits in flight overrun theirs
            self.sched.now_ms += self.min_age_ms // self.rng.choice([4, 8, 16])
        elif action == "zombie dies":
            self.zombies.pop(self.rng.randrange(len(self.zombies)))
        elif action == "recreate":
            self.recreate()

    def recreate(self) -> None:
        """An operator stops the job, deletes its folder and starts it again under its old name (checkpoint ids begin at 1).

        Pools keep whatever they cached of the earlier life: nothing of it may be served for the new one.
        """
        self.cancel_restores()
        for sub in [*self.subtasks, *self.zombies]:
            sub.zombie = True
        for actor in self.sched.actors:  # the operator stopped every worker process first (forgotten zombies too)
            if actor.name.startswith(("snapshot-", "restore-", "read-")) and not actor.name.startswith("restore-job-"):
                self.sched.crash(actor)
        self.subtasks, self.zombies = [], []
        for key in [k for k in self._objects() if k.startswith(f"jobs/{JOB}/")]:
            self.store.inner.delete(key)
        self.life += 1
        self.parts = {}  # a new life: epochs of the earlier one never come back, so its part ids never collide
        self.part_written_at = {}
        self.verified = set()
        self.deleted |= set(self.pinned)
        self.pinned = {}
        self.restores = []
        self.group_target = None
        for lo, hi in split(self.rng, self.rng.randint(1, 8)):
            sub = self.new_subtask(lo, hi, restored=True)
            self.subtasks.append(sub)
        # processes of the earlier life may still write parts here: fenced (older epochs), naming files the rm deleted
        self.life_epoch_floor = min(t.backend.epoch for t in self.subtasks)
        self.note(f"the job is deleted and created again: {[(t.lo, t.hi) for t in self.subtasks]}")

    # ---- running -----------------------------------------------------------------------------------------------

    def start(self) -> None:
        n = 1 if self.gc_race else self.rng.choice([1, 2, 4, 8]) if self.binary_splits else self.rng.randint(1, 8)
        self.parallelism = n
        for lo, hi in even(n) if self.binary_splits else split(self.rng, n):
            self.subtasks.append(self.new_subtask(lo, hi, restored=True))
        self.note(f"job starts with {len(self.subtasks)} subtasks: {[(t.lo, t.hi) for t in self.subtasks]}")

    def run(self, steps: int) -> dict:
        if self.gc_focus:
            steps *= 2  # garbage needs a long history: checkpoints folded, then retired, then old enough
        with deterministic_ids(random.Random(self.seed * 17 + 5)), quiet_maintenance():
            self.start()
            for self.step_no in range(1, steps + 1):
                if len(self.sched.actors) < self.max_actors or self.rng.random() < 0.1:
                    self.pick_action()
                if self.maintainers and self.maint_rng.random() < self.maint_rate:
                    self.maintainer_round()
                actor = self.sched.step()
                if actor is not None and actor.state == "done":
                    self.finish(actor)
                if self.crash_rate and self.sched.actors and self.rng.random() < self.crash_rate:
                    victim = self.rng.choice(self.sched.actors)
                    self.note(f"crash {victim.name}")
                    self.sched.crash(victim)
                self.check()
            self.drain()
        return self.stats

    def _run_until_quiet(self) -> None:
        """Step every actor to its end (bounded), checking the invariants after each step."""
        for _ in range(20000):
            actor = self.sched.step()
            if actor is None:
                return
            if actor.state == "done":
                self.finish(actor)
            self.check()

    def drain(self) -> None:
        """Faults off; every actor finishes; then every live subtask commits one more checkpoint, which must complete."""
        self.store.error_rate = self.store.lost_rate = 0.0
        self.crash_rate = 0.0
        self.zombies.clear()
        self._run_until_quiet()
        leases = [until for _, until, _ in self.writers().retiring]
        if leases:  # a crashed removal's announcement holds its checkpoints until its lease ends: wait for that
            self.sched.now_ms = max(self.sched.now_ms, max(leases) + 1)
        if not self.subtasks or any(not t.restored for t in self.subtasks):
            return
        tiles = sorted((t.lo, t.hi) for t in self.subtasks)
        if [lo for lo, _ in tiles] != [0, *[hi + 1 for _, hi in tiles[:-1]]] or tiles[-1][1] != 127:
            return  # the live subtasks do not cover every key group (a failover still restoring was crashed)
        cid = max(t.next_cid for t in self.subtasks)
        for sub in self.subtasks:
            sub.next_cid = cid
            self.write(sub)
        for _ in range(3):  # a commit that failed is repeated as its subtask would (same id, same delta: a repeat)
            for sub in self.subtasks:
                if sub.prev is None or sub.prev[0] != cid:
                    sub.next_cid = cid
                    self.snapshot(sub)
            self._run_until_quiet()
            if cid in self.complete_versions():
                break
        versions = self.complete_versions()
        if cid not in versions:
            self.fail(f"after a quiet final round every subtask committed checkpoint {cid}, yet it is not complete (a wedge)")


@contextmanager
def quiet_maintenance():
    """Maintenance logs each failed task as a warning: under injected faults that is noise, not news."""
    logger = logging.getLogger("clink.pool.maintenance")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@contextmanager
def deterministic_ids(rng: random.Random):
    """uuid4 from the seed, so data file names (and every order that depends on them) repeat exactly."""
    real = uuid.uuid4
    uuid.uuid4 = lambda: uuid.UUID(int=rng.getrandbits(128), version=4)  # type: ignore[assignment]
    try:
        yield
    finally:
        uuid.uuid4 = real  # type: ignore[assignment]


__all__ = ["SimViolation", "World"]
