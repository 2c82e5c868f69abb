"""No object outside a job's prefix is reachable through any request parameter (job ids, checkpoint ids, ranges, URLs, manifests)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import grpc
import pytest

import snapshot
from pool.server import PoolServer, PoolServerConfig
from protos import remote_pool_pb2 as pb
from protos import remote_pool_pb2_grpc as pb_grpc
from store.local import FileStore
from store.manifest import job_prefix
from tests.faults import FaultyStore
from tests.pool_server_fixtures import changelog_bytes

SECRET = b"the victim's secret value"
VICTIM = "victim"
OP = snapshot.operator_id("access-op")
KEY = snapshot.encode_keyed_key("v", b"k")

# every spelling we could think of for "some other place in the store"
SNEAKY_JOBS = [
    "..",
    ".",
    "../victim",
    "victim/..",
    "attacker/../victim",
    "jobs/victim",
    "/victim",
    "victim/",
    "victim\\..",
    "..\\victim",
    "victim\x00",
    "victim\n",
    "\x7f",
    "%2e%2e",
    "%2e%2e%2fvictim",
    "..%2fvictim",
    "%2E%2E%2F",
    "attacker%2f..%2fvictim",
    "\u2024\u2024",
    "\uff0e\uff0e",
    "\u2025",
    "victim\u2215x",
    ".clink-tmp",
    ".clink-lock",
    "",
    "x" * 129,
    "é" * 65,
    "victim/../../secret.txt",
    "..\u0000",
    "savepoints",
    "../savepoints/s1",
    "jobs",
    "*",
    "victim*",
    "\u202evictim",
]
CHECKPOINT_IDS = [0, 1, 2, (1 << 63) - 1, 1 << 63, (1 << 64) - 1]


@pytest.fixture
def pool(tmp_path):
    inner = FileStore(tmp_path / "store")
    recording = FaultyStore(inner)  # no faults: it records every call and key
    server = PoolServer(PoolServerConfig(listen="127.0.0.1:0", grace_seconds=0.2, http_port=0, store_retry=None), store=recording).start()
    channel = grpc.insecure_channel(server.address)
    stub = pb_grpc.RemotePoolStub(channel)
    epoch = stub.AcquireWriter(pb.AcquireWriterRequest(job=VICTIM, key_groups=pb.KeyGroupRange(lo=0, hi=127)), timeout=10).epoch
    delta = changelog_bytes([(snapshot.ROW_PUT, OP, KEY, SECRET)])
    header = pb.CommitHeader(job=VICTIM, checkpoint_id=1, key_groups=pb.KeyGroupRange(lo=0, hi=127), epoch=epoch)
    stub.CommitCheckpoint(iter([pb.CommitChunk(header=header), pb.CommitChunk(delta=delta)]), timeout=10)
    inner.put("secret.txt", SECRET)
    inner.put("savepoints/s1/_metadata", SECRET)
    try:
        yield server, stub, recording, inner
    finally:
        channel.close()
        server.stop(0)


def _requests(job: str, cid: int):
    kg = pb.KeyGroupRange(lo=0, hi=127)
    header = pb.CommitHeader(job=job, checkpoint_id=max(cid, 1), parent_id=0, key_groups=kg, epoch=1)
    delta = changelog_bytes([(snapshot.ROW_PUT, OP, KEY, b"overwrite")])
    return [
        ("AcquireWriter", lambda s: s.AcquireWriter(pb.AcquireWriterRequest(job=job, key_groups=kg), timeout=10)),
        ("CommitCheckpoint", lambda s: s.CommitCheckpoint(iter([pb.CommitChunk(header=header), pb.CommitChunk(delta=delta)]), timeout=10)),
        ("Get", lambda s: s.Get(pb.GetRequest(job=job, checkpoint_id=cid, op_id=OP, key_bytes=KEY), timeout=10)),
        ("MultiGet", lambda s: s.MultiGet(pb.MultiGetRequest(job=job, checkpoint_id=cid, op_ids=[OP], keys=[KEY]), timeout=10)),
        (
            "ScanCheckpoint",
            lambda s: b"".join(c.data for c in s.ScanCheckpoint(pb.ScanCheckpointRequest(job=job, checkpoint_id=cid), timeout=10)),
        ),
        ("ListCheckpoints", lambda s: s.ListCheckpoints(pb.ListCheckpointsRequest(job=job, include_incomplete=True), timeout=10)),
        ("DescribeCheckpoint", lambda s: s.DescribeCheckpoint(pb.DescribeCheckpointRequest(job=job, checkpoint_id=cid), timeout=10)),
        ("DeleteCheckpoint", lambda s: s.DeleteCheckpoint(pb.DeleteCheckpointRequest(job=job, checkpoint_id=cid), timeout=10)),
    ]


def test_no_request_parameter_reaches_outside_its_job_prefix(pool):
    server, stub, recording, inner = pool
    tried = 0
    for job in SNEAKY_JOBS:
        for cid in CHECKPOINT_IDS:
            for name, call in _requests(job, cid):
                before = len(recording.calls)
                try:
                    response = call(stub)
                    code = grpc.StatusCode.OK
                except grpc.RpcError as exc:
                    response, code = None, exc.code()
                tried += 1
                touched = recording.calls[before:]
                assert code in (
                    grpc.StatusCode.OK,
                    grpc.StatusCode.INVALID_ARGUMENT,
                    grpc.StatusCode.NOT_FOUND,
                    grpc.StatusCode.FAILED_PRECONDITION,
                    grpc.StatusCode.ABORTED,
                ), (name, job, cid, code)
                assert SECRET not in (response.SerializeToString() if hasattr(response, "SerializeToString") else (response or b"")), (
                    name,
                    job,
                )
                for c in touched:
                    assert c.key.startswith(job_prefix(job)) and job and "/" not in job, f"{name}({job!r}, {cid}) touched {c.key!r}"
                if code is grpc.StatusCode.INVALID_ARGUMENT:
                    assert not touched or cid > (1 << 63) - 1 or name == "CommitCheckpoint", (name, job, cid, touched)
    # the victim's checkpoint and the objects outside jobs/ are exactly as they were
    assert inner.get("secret.txt") == SECRET and inner.get("savepoints/s1/_metadata") == SECRET
    got = stub.Get(pb.GetRequest(job=VICTIM, checkpoint_id=1, op_id=OP, key_bytes=KEY), timeout=10)
    assert got.found and got.value == SECRET
    print(f"\n[access] {tried} requests with {len(SNEAKY_JOBS)} job spellings x {len(CHECKPOINT_IDS)} checkpoint ids: none left its prefix")


def test_http_export_paths_cannot_leave_the_job_prefix(pool):
    server, stub, recording, inner = pool
    base = f"http://127.0.0.1:{server.http_port}"
    paths = [
        "/jobs/..%2Fvictim/state.arrow",
        "/jobs/%2E%2E/state.arrow",
        "/jobs/x%2F..%2F..%2Fsecret.txt/state.arrow",
        "/jobs/victim%00/state.arrow",
        "/jobs/../secret.txt",
        "/jobs/%252e%252e/state.arrow",
        "/jobs/victim/../../secret.txt",
        "/jobs/%2e%2e%5cvictim/state.arrow",
        "/jobs/victim/state.arrow?checkpoint=../../secret",
        "/jobs/victim/state.arrow?checkpoint=99999999999999999999999",
        "/jobs/victim/state.arrow?key_groups=0-999",
        "/secret.txt",
        "/savepoints/s1/_metadata",
    ]
    for path in paths:
        before = len(recording.calls)
        try:
            with urllib.request.urlopen(base + path, timeout=10) as response:
                status, body = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, body = exc.code, exc.read()
        assert status in (400, 404), (path, status)
        assert SECRET not in body
        for c in recording.calls[before:]:
            assert c.key.startswith(("jobs/%2e%2e/", "jobs/victim/")), (path, c.key)  # %252e decodes once: a literal job "%2e%2e"


def test_a_tampered_manifest_cannot_point_into_another_job(pool):
    server, stub, recording, inner = pool
    victim_file = next(o.key for o in inner.list("jobs/victim/data/"))
    honest = json.loads(inner.get("jobs/victim/chk-1/_metadata"))
    for bad_path in (
        "data/../../victim/" + victim_file.split("/", 2)[2],
        "../victim/" + victim_file.split("/", 2)[2],
        "/" + victim_file,
        victim_file,
    ):
        doc = json.loads(json.dumps(honest))
        doc["job"] = "attacker"
        doc["files"][0]["path"] = bad_path
        doc["parts"][0]["layers"] = [[bad_path]]
        inner.put("jobs/attacker/chk-1/_metadata", json.dumps(doc).encode())
        before = len(recording.calls)
        with pytest.raises(grpc.RpcError) as info:
            b"".join(c.data for c in stub.ScanCheckpoint(pb.ScanCheckpointRequest(job="attacker", checkpoint_id=1), timeout=10))
        details = info.value.details()
        assert info.value.code() == grpc.StatusCode.DATA_LOSS and (
            "not a safe relative path" in details or "must lie under data/" in details
        ), details
        assert all(c.key.startswith("jobs/attacker/") for c in recording.calls[before:])
