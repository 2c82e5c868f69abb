"""Two `clink-pool serve` processes on one moto bucket: concurrent writers lose nothing, mix nothing, and races are ABORTED."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

import snapshot
from store.objects import ObjectStore
from tests.pool_server_fixtures import OPS, RawPool, apply, changelog_bytes, keyed_keys_in, random_delta

REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 30
RANGES = ((0, 31), (32, 63), (64, 95), (96, 127))


class ServeProcess:
    """One `python -m clink.cli.pool serve` subprocess; its ready line (JSON) gives the bound address."""

    def __init__(self, store_uri: str, endpoint: str, log_path: Path) -> None:
        env = dict(os.environ, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", PYTHONUNBUFFERED="1")
        env.pop("AWS_PROFILE", None)
        cmd = [
            sys.executable,
            "-m",
            "clink.cli.pool",
            "serve",
            "--store",
            store_uri,
            "--listen",
            "127.0.0.1:0",
            "--s3-endpoint-url",
            endpoint,
            "--s3-region",
            "us-east-1",
            "--output",
            "json",
            "--grace",
            "2",
            "--max-workers",
            "8",
        ]
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115  # closed in stop()
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=self._log)
        lines: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line) for line in self.proc.stdout], daemon=True).start()  # type: ignore[union-attr]
        try:
            line = lines.get(timeout=READY_TIMEOUT_S)
        except queue.Empty:
            self.kill()
            raise AssertionError(f"clink-pool serve did not get ready in {READY_TIMEOUT_S}s:\n{log_path.read_text()}") from None
        if not line:
            self.kill()
            raise AssertionError(f"clink-pool serve exited early ({self.proc.poll()}):\n{log_path.read_text()}")
        ready = json.loads(line)
        assert ready["event"] == "serving"
        self.address = ready["address"]

    def terminate(self, timeout: float = 15) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._log.close()


@pytest.fixture
def two_pools(
    moto_endpoint: str, make_s3_store: Callable[..., ObjectStore], tmp_path: Path
) -> Iterator[tuple[RawPool, RawPool, list[ServeProcess]]]:
    bucket = f"procs-{uuid.uuid4().hex[:16]}"
    make_s3_store(bucket)  # creates the bucket
    procs: list[ServeProcess] = []
    clients: list[RawPool] = []
    try:
        for name in ("a", "b"):
            procs.append(ServeProcess(f"s3://{bucket}/pool", moto_endpoint, tmp_path / f"pool-{name}.log"))
            clients.append(RawPool(procs[-1].address))
        yield clients[0], clients[1], procs
    finally:
        for client in clients:
            client.close()
        for proc in procs:
            proc.kill()


def test_writers_through_two_processes_lose_and_mix_nothing(two_pools: tuple[RawPool, RawPool, list[ServeProcess]]) -> None:
    pool_a, pool_b, procs = two_pools
    pools = (pool_a, pool_b)
    job = "two-procs"
    checkpoints = 5
    keys = {r: keyed_keys_in(r[0], r[1], 60, seed=r[0]) for r in RANGES}
    epochs = {r: pools[i % 2].acquire(job, *r) for i, r in enumerate(RANGES)}
    models: dict[tuple[int, int], dict[int, dict]] = {r: {} for r in RANGES}
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(RANGES))

    def subtask(i: int, r: tuple[int, int]) -> None:
        import random

        rng = random.Random(i)
        model: dict = {}
        try:
            for cid in range(1, checkpoints + 1):
                rows = random_delta(model, keys[r], rng, 25, tag=f"s{i}c{cid}")
                model = apply(model, rows)
                # alternate processes per checkpoint, so both serve every subtask
                pools[(i + cid) % 2].commit(job, cid, cid - 1, epochs[r], changelog_bytes(rows), lo=r[0], hi=r[1])
                models[r][cid] = model
                barrier.wait(timeout=60)
        except BaseException as exc:  # noqa: BLE001  # reported by the main thread
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=subtask, args=(i, r)) for i, r in enumerate(RANGES)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    for pool in pools:
        listed = pool.checkpoints(job, include_incomplete=True)
        assert [(c.checkpoint_id, c.complete) for c in listed] == [(cid, True) for cid in range(1, checkpoints + 1)]
        assert all(len(c.committed_ranges) >= 1 for c in listed)
    for cid in range(1, checkpoints + 1):
        expect: dict = {}
        for r in RANGES:
            expect.update(models[r][cid])
        assert pool_a.scan(job, cid) == expect
        assert pool_b.scan(job, cid) == expect
        probe = keys[RANGES[cid % 4]][:30]
        got = pool_b.multi_get(job, cid, [OPS[0]], probe)
        assert list(got.values) == [expect.get((OPS[0], k), b"") for k in probe]
    # both processes shut down gracefully on SIGTERM
    assert [p.terminate() for p in procs] == [0, 0]


def _race(pools: dict[str, RawPool], job: str, epoch: int, keys: list[bytes]) -> dict[str, object]:
    """Commit checkpoint 1 of ``job`` through every pool at once, each with its own values; outcome per pool name."""
    outcomes: dict[str, object] = {}
    barrier = threading.Barrier(len(pools))

    def commit(name: str, pool: RawPool) -> None:
        delta = changelog_bytes([(snapshot.ROW_PUT, OPS[1], k, name.encode()) for k in keys])
        barrier.wait(timeout=10)
        try:
            outcomes[name] = pool.commit(job, 1, 0, epoch, delta).checkpoint.checkpoint_id
        except grpc.RpcError as exc:
            outcomes[name] = exc.code()

    threads = [threading.Thread(target=commit, args=item) for item in pools.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return outcomes


def test_same_id_same_range_race_across_processes_one_wins_one_aborted(two_pools: tuple[RawPool, RawPool, list[ServeProcess]]) -> None:
    pool_a, pool_b, _procs = two_pools
    keys = keyed_keys_in(0, 127, 80, seed=11)
    for round_ in range(4):
        job = f"race-{round_}"
        outcomes = _race({"via-a": pool_a, "via-b": pool_b}, job, pool_a.acquire(job), keys)
        assert sorted(str(v) for v in outcomes.values()) == sorted(["1", str(grpc.StatusCode.ABORTED)]), outcomes
        winner = next(n for n, v in outcomes.items() if v == 1)
        for pool in (pool_a, pool_b):
            assert pool.scan(job, 1) == {(OPS[1], k): winner.encode() for k in keys}


def test_a_writer_fenced_through_the_other_process(two_pools: tuple[RawPool, RawPool, list[ServeProcess]]) -> None:
    pool_a, pool_b, _procs = two_pools
    job = "fenced-across"
    keys = keyed_keys_in(0, 63, 10, seed=12)
    old = pool_a.acquire(job, 0, 63)
    new = pool_b.acquire(job, 0, 127)
    assert new > old
    stale = changelog_bytes([(snapshot.ROW_PUT, OPS[0], k, b"stale") for k in keys])
    with pytest.raises(grpc.RpcError) as excinfo:
        pool_a.commit(job, 1, 0, old, stale, lo=0, hi=63)
    assert excinfo.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    # pool A had not seen the fence: the zombie's part was staged before its writers read said fenced (it never counts)
    assert pool_b.checkpoints(job, include_incomplete=False) == []
    (staged,) = pool_b.checkpoints(job)
    assert not staged.complete and list(staged.committed_ranges) == []
    with pytest.raises(grpc.RpcError) as again:  # and so does its next attempt (pool A has now seen the fence)
        pool_a.commit(job, 1, 0, old, stale, lo=0, hi=63)
    assert again.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    pool_b.commit(job, 1, 0, new, changelog_bytes([(snapshot.ROW_PUT, OPS[0], k, b"fresh") for k in keys]))
    assert pool_a.scan(job, 1) == {(OPS[0], k): b"fresh" for k in keys}


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (["--store", "ftp://nowhere"], 2, "unknown scheme"),
        (["--store", "file://{tmp}/s", "--listen", "256.0.0.1:1"], 69, "cannot listen"),
        (["--store", "file://{tmp}/s", "--create-bucket"], 2, "--create-bucket needs an s3:// store"),
    ],
)
def test_serve_fails_with_one_clear_line_and_a_trustworthy_exit_code(args: list[str], code: int, needle: str, tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "clink.cli.pool", "serve", "--listen", "127.0.0.1:0", *[a.replace("{tmp}", str(tmp_path)) for a in args]]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == code, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("clink-pool: error:")]
    assert len(errors) == 1 and needle in errors[0], done.stderr
    assert "Traceback" not in done.stderr


def test_serve_help_teaches() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "clink.cli.pool", "serve", "--help"], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0
    for flag in ("--store", "--listen", "--metrics-port", "--s3-endpoint-url", "--s3-region", "SIGTERM"):
        assert flag in done.stdout
