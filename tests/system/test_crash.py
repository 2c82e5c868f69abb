"""Crashes: kill -9 the pool mid-commit many times, and kill or pause a worker mid-snapshot; nothing acknowledged is lost."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time

import pytest

import snapshot
from client import RemoteReadBackend
from client.backend import BackendConfig
from client.errors import ClinkError
from client.pool_client import PoolClient, PoolClientConfig, RetryPolicy
from pool.lifecycle import Lifecycle, LifecycleConfig
from pool.server import PoolServer, PoolServerConfig
from store.local import FileStore
from store.manifest import job_prefix, parse_manifest
from tests.crash_fixtures import OP, REPO, Model, PoolProcess, apply, changelog, delta_rows, orphans, scan_model

JOB = "crashy"
SUCCESSOR_KEY = snapshot.encode_keyed_key("v", b"successor")
HALVES = ((0, 63), (64, 127))
ITERATIONS = 16  # each kill costs a pool process start, about 1 s
ITERATIONS_MOTO = 8
ROWS = 3000  # per checkpoint; big enough that a commit takes tens of milliseconds, so kills land inside commits
NO_RETRY = PoolClientConfig(retry=RetryPolicy(max_attempts=1), call_deadline_s=10, commit_deadline_s=20)


def _verify(client: PoolClient, models: dict[int, Model], acked: set[int], checked: set[int] | None = None) -> list[int]:
    """Every acknowledged checkpoint is complete; complete ones not in ``checked`` (None: all) scan to their models."""
    complete = [c.checkpoint_id for c in client.list_checkpoints(JOB)] if models else []
    missing = acked - set(complete)
    assert not missing, f"acknowledged checkpoints {sorted(missing)} are gone after a crash"
    for cid in complete:
        if checked is None or cid not in checked or cid == complete[-1]:
            assert scan_model(client.scan_checkpoint(JOB, cid)) == models[cid], f"checkpoint {cid} does not scan to its model"
            if checked is not None:
                checked.add(cid)
    return complete


@pytest.fixture(params=["file", "moto"])
def crash_store(request, tmp_path):
    """(store URI, extra serve flags, env, ObjectStore for inspection, iterations): a directory, or a bucket on moto."""
    if request.param == "file":
        return f"file://{tmp_path / 'store'}", (), {}, FileStore(tmp_path / "store"), ITERATIONS
    store = request.getfixturevalue("make_s3_store")(prefix="crash")
    config = request.getfixturevalue("s3_config")
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}
    return store.uri, ("--s3-endpoint-url", config.endpoint_url), env, store, ITERATIONS_MOTO


@pytest.mark.slow
def test_kill_9_the_pool_at_random_points_of_commits_loses_nothing_acknowledged(crash_store):
    uri, extra, env, store, iterations = crash_store
    rng = random.Random(20261129)
    models: dict[int, Model] = {}  # every checkpoint ever sent, complete or not (its content is deterministic)
    acked: set[int] = set()
    next_cid = 1
    kills_mid_commit = 0
    checked: set[int] = set()  # immutable once verified; the last restart checks every one again
    started = time.monotonic()
    for iteration in range(iterations):
        pool = PoolProcess(uri, extra, env)
        client = PoolClient(pool.address, NO_RETRY)
        try:
            client.wait_ready(10)
            complete = _verify(client, models, acked, checked)
            parent = max(complete, default=0)
            base = models.get(parent, {})
            epochs = [client.acquire_writer(JOB, kg).epoch for kg in HALVES]  # the restarted subtasks fence their predecessors
            in_commit = threading.Event()
            landed = threading.Event()
            done = threading.Event()

            def run(parent=parent, base=base, epochs=epochs, in_commit=in_commit, landed=landed, done=done, client=client) -> None:
                nonlocal next_cid
                try:
                    while True:
                        cid = next_cid
                        next_cid += 1
                        halves = [delta_rows(cid, h, ROWS) for h in (0, 1)]
                        model = base
                        for rows in halves:
                            model = apply(model, rows)
                        models[cid] = model
                        for kg, epoch, rows in zip(HALVES, epochs, halves, strict=True):
                            in_commit.set()
                            result = client.commit_checkpoint(JOB, cid, parent, kg, epoch, changelog(rows))
                            in_commit.clear()
                        assert result.checkpoint.complete
                        acked.add(cid)
                        landed.set()
                        parent, base = cid, model
                except ClinkError:
                    pass  # the pool died under us
                finally:
                    done.set()

            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            if iteration % 2:  # every other time, let one checkpoint land first (however slow the machine is), then kill
                assert landed.wait(60), "no checkpoint landed within 60 s of a restart"
            time.sleep(rng.uniform(0.02, 0.3))
            if iteration % 3 != 2:  # two kills in three wait (bounded) for a commit in flight; the third lands wherever it falls
                assert in_commit.wait(30), "the committing thread never started a commit"
            kills_mid_commit += in_commit.is_set() and not done.is_set()
            pool.kill9()
            assert done.wait(30), "the committing thread hung after the pool died"
            thread.join(5)
        finally:
            client.close()
            pool.kill9()
    # a last restart: everything acknowledged is still there, every visible checkpoint scans to its model; then GC
    # (the real minimum age, with a clock two ages ahead) deletes exactly the orphans and every checkpoint still scans
    tmp_dir = store.root / ".clink-tmp" if isinstance(store, FileStore) else None
    temp_leftovers = len(list(tmp_dir.iterdir())) if tmp_dir else 0
    pool = PoolProcess(uri, extra, env)
    try:
        with PoolClient(pool.address, NO_RETRY) as client:
            client.wait_ready(10)
            complete = _verify(client, models, acked)
            data_before = {o.key for o in store.list(job_prefix(JOB) + "data/")}
            named = _named_by_manifests_and_parts(store, JOB)
            config = LifecycleConfig()
            lifecycle = Lifecycle(store, config, clock=lambda: time.time() + 2 * config.gc_min_age_s)
            dry = lifecycle.gc(dry_run=True)
            gc = lifecycle.gc()
            data_after = {o.key for o in store.list(job_prefix(JOB) + "data/")}
            assert _verify(client, models, acked) == complete  # every complete checkpoint scans to its model after GC
    finally:
        pool.kill9()
    elapsed = time.monotonic() - started
    orphan_files, referenced = orphans(store, JOB)  # relative to complete manifests only, before GC
    orphan_keys = data_before - named
    print(
        f"\n[crash] {uri.split(':')[0]}: {iterations} kill -9 of the pool in {elapsed:.1f}s ({kills_mid_commit} while a commit was in flight); "
        f"{len(acked)} acknowledged and {len(complete)} complete checkpoints all scan to their models; "
        f"{len(data_before)} data files after the kills: {len(orphan_keys)} orphans (no manifest or part names them), "
        f"{len(named & data_before)} named; GC removed {len(orphan_keys & set(gc.deleted))} orphans "
        f"and {gc.temp_files} of {temp_leftovers} temp files; {len(data_after)} data files left"
    )
    assert len(acked) >= iterations // 2 and kills_mid_commit >= iterations // 3
    assert set(complete) >= acked and elapsed < 150  # bounded time, generous for a loaded 2-core box
    assert not orphan_files & referenced
    assert sorted(dry.deleted) == gc.deleted  # the dry run listed exactly what the real run deleted
    assert orphan_keys <= set(gc.deleted), f"GC left orphans {sorted(orphan_keys - set(gc.deleted))[:5]}"
    assert {k for k in gc.deleted if k.startswith(job_prefix(JOB) + "data/")} == orphan_keys  # and no data file that is named
    assert data_after == data_before & named, "a data file a manifest or part names was deleted"
    for key in orphan_keys:
        assert key.endswith(".arrow")
    if tmp_dir is not None:
        assert gc.temp_files == temp_leftovers and not list(tmp_dir.iterdir()), "GC left stale temp files"


def _named_by_manifests_and_parts(store, job: str) -> set[str]:
    """Store keys of the data files any _metadata or staged part of the job names."""
    prefix = job_prefix(job)
    named: set[str] = set()
    for o in store.list(prefix):
        if o.key.endswith("/_metadata") or ("/parts/" in o.key and o.key.endswith(".json")):
            named |= {prefix + f.path for f in parse_manifest(store.get(o.key), o.key).files}
    return named


def _worker(address: str, job: str, rows: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.crash_fixtures", "worker", address, job, str(rows)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(proc: subprocess.Popen, line: str, timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = proc.stdout.readline()
        if got.strip() == line:
            return
        if not got and proc.poll() is not None:
            raise AssertionError(f"worker exited {proc.returncode} before {line!r}: {proc.stderr.read()}")
    raise AssertionError(f"worker never printed {line!r}")


@pytest.fixture
def pool_server(tmp_path):
    """An in-process pool whose ``streaming`` event is set once a commit's second delta chunk arrives (chunks: chunks seen)."""
    server = PoolServer(PoolServerConfig(listen="127.0.0.1:0", grace_seconds=0.2), store=FileStore(tmp_path / "store")).start()
    server.streaming = threading.Event()
    server.chunks = 0
    commit = server.core.commit_checkpoint

    def observed(request, chunks, **kwargs):
        def watch():
            for seen, chunk in enumerate(chunks, 1):
                server.chunks += 1
                if seen >= 2:  # a second chunk of one commit: the stream is under way (checkpoint 1 is a single chunk)
                    server.streaming.set()
                yield chunk

        return commit(request, watch(), **kwargs)

    server.core.commit_checkpoint = observed
    try:
        yield server
    finally:
        server.stop(0)


def _first_checkpoint() -> dict[bytes, bytes]:
    return {snapshot.encode_keyed_key("v", f"first-{i}".encode()): f"one-{i}".encode() for i in range(100)}


def test_a_worker_killed_mid_snapshot_is_succeeded_by_one_that_sees_the_last_complete_checkpoint(pool_server):
    proc = _worker(pool_server.address, "w-killed", 200_000)
    _wait_for(proc, "streaming")
    assert pool_server.streaming.wait(30)
    time.sleep(random.uniform(0.0, 0.1))
    proc.kill()
    proc.wait(10)
    assert pool_server.chunks >= 1
    with RemoteReadBackend.connect(pool_server.address, "w-killed") as successor:
        successor.restore()
        assert successor.read_checkpoint == 1, "a half-sent checkpoint became visible"
        first = _first_checkpoint()
        keys = sorted(first)
        assert successor.get_many(OP, keys) == [first[k] for k in keys]
        assert scan_model(successor.export_arrow_snapshot()) == first
        successor.put(OP, keys[0], b"after")
        successor.snapshot(2)  # the dead worker's id is free: its partial stream left nothing behind
    assert [c.checkpoint_id for c in PoolClient(pool_server.address).list_checkpoints("w-killed")] == [1, 2]


def test_a_paused_zombie_worker_resumes_after_its_successor_and_is_fenced(pool_server):
    proc = _worker(pool_server.address, "w-zombie", 150_000)
    _wait_for(proc, "streaming")
    assert pool_server.streaming.wait(30)
    proc.send_signal(19)  # SIGSTOP: a long GC pause in the middle of the commit stream
    try:
        with RemoteReadBackend.connect(pool_server.address, "w-zombie") as successor:
            successor.restore()
            assert successor.read_checkpoint == 1
            successor.put(OP, SUCCESSOR_KEY, b"new owner")
            successor.snapshot(2)
    finally:
        proc.send_signal(18)  # SIGCONT: the zombie wakes up and finishes its commit
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 3 and "fenced:" in out, (proc.returncode, out, err)
    with RemoteReadBackend.connect(pool_server.address, "w-zombie", config=BackendConfig()) as reader:
        reader.restore()
        assert reader.read_checkpoint == 2
        assert reader.get(OP, SUCCESSOR_KEY) == b"new owner"
        assert reader.get(OP, snapshot.encode_keyed_key("v", b"second-0")) is None  # nothing the zombie sent became visible
