"""Random job histories driven through a real `clink-pool serve` process and RemoteReadBackend over gRPC, against a model.

One seed gives one history: subtasks on random uneven ranges write keyed and operator state (puts and erases, keyed-only
deltas, empty ones), checkpoint round by round, read, rescale, rewind to an older checkpoint (reusing its ids), compact,
delete, apply retention, pin and collect garbage with a zero minimum age. After every step every checkpoint of the
current attempt scans as the model says, and every backend exports exactly its model. `bench/histories.py --seeds N`
runs many seeds; tests/protocol/test_random_histories.py runs a few in CI.
"""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import snapshot as s
from client.backend import BackendConfig, RemoteReadBackend
from client.errors import ConflictError, NotFoundError
from client.pool_client import PoolClient, PoolClientConfig, RetryPolicy
from pool.lifecycle import Lifecycle, LifecycleConfig
from store.local import FileStore

REPO = Path(__file__).resolve().parents[2]
OPS = (s.operator_id("counter"), s.operator_id("window"))
USERS = [f"u{i}".encode() for i in range(24)]
NAMES = [f"offset-{i}".encode() for i in range(3)]
Key = tuple[int, bytes]
FAST = RetryPolicy(max_attempts=6, initial_backoff_s=0.01, max_backoff_s=0.1)


class ServePool:
    """One `clink-pool serve` subprocess on a file:// store; its JSON ready line gives the bound address."""

    def __init__(self, store_dir: Path, log: Path, extra: tuple[str, ...] = ()) -> None:
        cmd = [
            sys.executable,
            "-m",
            "clink.cli.pool",
            "serve",
            "--store",
            f"file://{store_dir}",
            "--listen",
            "127.0.0.1:0",
            "--output",
            "json",
            "--grace",
            "1",
            "--gc-min-age",
            "0",
            # the histories call GC and retention themselves, at their own moments, against the model
            "--maintenance",
            "off",
            *extra,
        ]
        self._log = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=dict(os.environ, PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE, stderr=self._log)
        lines: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line) for line in self.proc.stdout], daemon=True).start()  # type: ignore[union-attr]
        try:
            ready = json.loads(lines.get(timeout=30) or b"{}")
        except queue.Empty:
            self.stop()
            raise AssertionError(f"clink-pool serve did not start:\n{log.read_text()}") from None
        if ready.get("event") != "serving":
            self.stop()
            raise AssertionError(f"clink-pool serve did not start ({ready}):\n{log.read_text()}")
        self.address = ready["address"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


def merged(writes: list[dict[Key, bytes | None]]) -> dict[Key, bytes | None]:
    """Operator-state writes of one checkpoint by several subtasks (lowest key groups first), by the format's rule."""
    out: dict[Key, bytes | None] = {}
    for key in {k for w in writes for k in w}:
        puts = [w[key] for w in writes if key in w and w[key] is not None]
        out[key] = (
            None
            if not puts
            else max(puts, key=lambda v: int.from_bytes(v, "little", signed=True))
            if all(len(v) == 8 for v in puts)
            else puts[0]
        )
    return out


@dataclass
class Worker:
    """One subtask: its backend and what the model says it holds."""

    backend: RemoteReadBackend
    lo: int
    hi: int
    keyed: dict[Key, bytes] = field(default_factory=dict)
    ops: dict[Key, bytes | None] = field(default_factory=dict)  # operator-state writes since its last checkpoint


class History:
    """One seeded history against one pool address and store directory."""

    def __init__(self, address: str, store_dir: Path, seed: int) -> None:
        self.address, self.seed = address, seed
        self.rng = random.Random(seed)
        self.job = f"history-{seed}"
        self.store = FileStore(store_dir)
        self.pool = PoolClient(address, PoolClientConfig(retry=FAST))
        self.states: dict[int, dict[Key, bytes]] = {}  # complete checkpoints of the current attempt
        self.lineage: list[int] = []
        self.workers: list[Worker] = []
        self.next_cid = 1
        self.steps: list[str] = []

    def fail(self, what: str) -> None:
        raise AssertionError(
            f"seed {self.seed}: {what}\n  steps: {' | '.join(self.steps[-15:])}\n"
            f"  replay: python bench/histories.py --start {self.seed} --seeds 1"
        )

    def split(self) -> list[tuple[int, int]]:
        n = self.rng.choice([1, 2, 3, 4, 8])
        if self.rng.random() < 0.5 and n in (1, 2, 4, 8):
            return [(i * (128 // n), (i + 1) * (128 // n) - 1) for i in range(n)]
        cuts = sorted(self.rng.sample(range(1, 128), n - 1))
        bounds = [0, *cuts, 128]
        return [(a, b - 1) for a, b in zip(bounds, bounds[1:], strict=False)]

    def start_workers(self, base: int | None) -> None:
        for w in self.workers:
            w.backend.close()
        self.workers = []
        for lo, hi in self.split():
            backend = RemoteReadBackend.connect(
                self.address, self.job, (lo, hi), BackendConfig(retry=FAST, cache_bytes=self.rng.choice([0, 1 << 16]))
            )
            worker = Worker(backend, lo, hi)
            if base:
                backend.restore(base)
                worker.keyed = {k: v for k, v in self.states[base].items() if k[1][0] < 128 and lo <= k[1][0] <= hi}
            elif self.lineage:
                backend.start_fresh()
            self.workers.append(worker)

    def write(self, w: Worker) -> None:
        keyed = [u for u in USERS if w.lo <= s.key_group(u) <= w.hi]
        for _ in range(self.rng.randint(0, 5)):
            op = self.rng.choice(OPS)
            if self.rng.random() < 0.25:
                key = (op, s.encode_operator_key("o", self.rng.choice(NAMES)))
                value = (
                    None
                    if self.rng.random() < 0.4
                    else (self.rng.randrange(1000).to_bytes(8, "little") if self.rng.random() < 0.5 else b"t%d" % self.rng.randrange(99))
                )
                if value is None:
                    w.backend.erase(*key)
                else:
                    w.backend.put(*key, value)
                w.ops[key] = value
            elif keyed:
                key = (op, s.encode_keyed_key("v", self.rng.choice(keyed)))
                if key in w.keyed and self.rng.random() < 0.35:
                    w.backend.erase(*key)
                    w.keyed.pop(key)
                else:
                    w.keyed[key] = b"%d:%d" % (self.seed, self.rng.randrange(10**6))
                    w.backend.put(*key, w.keyed[key])

    def checkpoint(self) -> None:
        cid = self.next_cid
        parent = self.lineage[-1] if self.lineage else 0
        order = list(self.workers)
        self.rng.shuffle(order)
        results = [w.backend.snapshot(cid) for w in order]
        if not results[-1].checkpoint.complete or any(r.checkpoint.complete for r in results[:-1]):
            self.fail(
                f"checkpoint {cid}: only the last of {len(order)} commits should complete it, got {[r.checkpoint.complete for r in results]}"
            )
        state = dict(self.states.get(parent, {})) if parent else {}
        state = {k: v for k, v in state.items() if k[1][0] >= 128}
        for w in self.workers:
            state.update(w.keyed)
        for key, value in merged([w.ops for w in sorted(self.workers, key=lambda w: w.lo)]).items():
            if value is None:
                state.pop(key, None)
            else:
                state[key] = value
        for w in self.workers:
            w.ops = {}
        self.states[cid] = state
        self.lineage.append(cid)
        self.next_cid = cid + 1

    def verify(self) -> None:
        for cid in self.lineage:
            got = s.read_snapshot(self.pool.scan_checkpoint(self.job, cid)).table
            table = dict(
                zip(
                    zip(got.column("op_id").to_pylist(), got.column("key_bytes").to_pylist(), strict=True),
                    got.column("value_bytes").to_pylist(),
                    strict=True,
                )
            )
            if table != self.states[cid]:
                diff = sorted(set(table.items()) ^ set(self.states[cid].items()))[:4]
                self.fail(f"checkpoint {cid} scans {len(table)} rows, the model has {len(self.states[cid])}: {diff}")
        latest = [c for c in self.pool.list_checkpoints(self.job) if c.complete and not c.abandoned] if self.lineage else []
        if self.lineage and max(c.checkpoint_id for c in latest) != self.lineage[-1]:
            self.fail(f"latest is {max(c.checkpoint_id for c in latest)}, the current attempt's newest is {self.lineage[-1]}")
        for w in self.workers:
            exported = s.read_snapshot(w.backend.export_arrow_snapshot()).table
            rows = dict(
                zip(
                    zip(exported.column("op_id").to_pylist(), exported.column("key_bytes").to_pylist(), strict=True),
                    exported.column("value_bytes").to_pylist(),
                    strict=True,
                )
            )
            keyed = {k: v for k, v in rows.items() if k[1][0] < 128}
            if keyed != w.keyed:
                self.fail(f"subtask {w.lo}-{w.hi} exports {len(keyed)} keyed rows, it holds {len(w.keyed)}")
            keys = [s.encode_keyed_key("v", u) for u in USERS if w.lo <= s.key_group(u) <= w.hi]
            for op in OPS:
                if w.backend.get_many(op, keys) != [w.keyed.get((op, k)) for k in keys]:
                    self.fail(f"subtask {w.lo}-{w.hi} reads differ from what it wrote")

    def run(self, steps: int) -> dict:
        stats = {"checkpoints": 0, "rescales": 0, "rewinds": 0, "compactions": 0, "gc_deleted": 0, "deletes": 0, "retained": 0}
        life = Lifecycle(self.store, LifecycleConfig(gc_min_age_s=0))
        try:
            self.start_workers(None)
            for _ in range(steps):
                r = self.rng.random()
                if r < 0.35:
                    w = self.rng.choice(self.workers)
                    self.steps.append(f"write {w.lo}-{w.hi}")
                    self.write(w)
                elif r < 0.6:
                    self.steps.append(f"checkpoint {self.next_cid}")
                    self.checkpoint()
                    stats["checkpoints"] += 1
                elif r < 0.67 and self.lineage:
                    self.steps.append(f"rescale from {self.lineage[-1]}")
                    self.start_workers(self.lineage[-1])
                    stats["rescales"] += 1
                elif r < 0.74 and len(self.lineage) > 1:
                    back = self.rng.randint(1, len(self.lineage) - 1)
                    self.lineage = self.lineage[:-back]
                    self.steps.append(f"rewind to {self.lineage[-1]}")
                    self.start_workers(self.lineage[-1])
                    self.next_cid = self.lineage[-1] + 1
                    stats["rewinds"] += 1
                elif r < 0.8 and self.lineage:
                    cid = self.rng.choice(self.lineage)
                    self.steps.append(f"compact {cid}")
                    self.pool.compact_checkpoint(self.job, cid, force=self.rng.random() < 0.6)
                    stats["compactions"] += 1
                elif r < 0.86:
                    self.steps.append("gc")
                    stats["gc_deleted"] += len(self.pool.collect_garbage(self.job).deleted) if self.lineage else 0
                elif r < 0.9 and len(self.lineage) > 2:
                    cid = self.rng.choice(self.lineage[:-1])
                    self.steps.append(f"delete {cid}")
                    try:
                        self.pool.delete_checkpoint(self.job, cid)
                        self.lineage.remove(cid)
                        stats["deletes"] += 1
                    except ConflictError as exc:
                        self.steps.append(f"(refused: {exc})")  # a live writer restored from it: refused, as it should be
                elif r < 0.94 and len(self.lineage) > 1:
                    keep = self.rng.randint(1, 3)
                    self.steps.append(f"retain {keep}")
                    gone = life.retain(self.job, keep_last=keep).deleted
                    self.lineage = [c for c in self.lineage if c not in gone]
                    stats["retained"] += len(gone)
                elif r < 0.97 and self.lineage:
                    self.pool.pin_checkpoint(self.job, f"h{len(self.steps)}", 0.2, self.rng.choice(self.lineage))
                else:
                    self.steps.append("restart empty")
                    self.start_workers(None)
                    self.lineage = []
                    self.states = {}
                self.verify()
        except NotFoundError as exc:
            self.fail(f"{type(exc).__name__}: {exc}")
        finally:
            for w in self.workers:
                w.backend.close()
            self.pool.close()
        return stats
