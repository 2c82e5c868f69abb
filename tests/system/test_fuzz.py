"""Malformed input (hypothesis): the reader, canonicalise, merge, manifest parsing and every gRPC handler answer with a typed error."""

from __future__ import annotations

import json
import random
import time
from collections import Counter

import grpc
import pyarrow as pa
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import snapshot
from pool.server import PoolServer, PoolServerConfig
from protos import remote_pool_pb2 as pb
from snapshot.errors import ClinkError, CorruptDataError, CorruptSnapshotError, UnsupportedFormatVersionError
from store.local import FileStore
from store.manifest import parse_manifest
from tests.pool_server_fixtures import changelog_bytes

TRIED: Counter = Counter()
SERVICE = "/clink.remote_state.v1.RemotePool/"
OP = snapshot.operator_id("fuzz-op")
FAST = settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
SLOW_INPUT_S = 5.0  # no single input may take longer than this (a hang would be caught here or by pytest-timeout)


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    print(f"\n[fuzz] inputs tried: {sum(TRIED.values())} ({', '.join(f'{k} {v}' for k, v in sorted(TRIED.items()))})")


def _valid_blobs() -> list[bytes]:
    keys = [snapshot.encode_keyed_key("s", f"k{i}".encode()) for i in range(20)] + [snapshot.encode_operator_key("o", b"x")]
    canonical = pa.table(
        {
            "op_id": pa.array([OP] * len(keys), pa.uint64()),
            "key_bytes": pa.array(keys, pa.binary()),
            "value_bytes": pa.array([f"v{i}".encode() for i in range(len(keys))], pa.binary()),
        }
    )
    canonical = canonical.sort_by([("op_id", "ascending"), ("key_bytes", "ascending")])
    versions = snapshot.StateVersionMap({(OP, "value"): 2})
    return [
        snapshot.write_snapshot(canonical, versions),
        changelog_bytes([(snapshot.ROW_PUT, OP, k, b"v") for k in keys[:5]] + [(snapshot.ROW_ERASE, OP, keys[0], b"")]),
        snapshot.write_snapshot(canonical.slice(0, 0)),
    ]


VALID = _valid_blobs()


@st.composite
def damaged_streams(draw) -> bytes:
    """Random bytes, or a valid stream truncated, bit-flipped, spliced or with a length field blown up."""
    how = draw(st.sampled_from(["random", "truncate", "flip", "splice", "huge_length", "append"]))
    if how == "random":
        return draw(st.binary(max_size=600))
    blob = bytearray(draw(st.sampled_from(VALID)))
    if how == "truncate":
        return bytes(blob[: draw(st.integers(0, len(blob) - 1))])
    if how == "flip":
        for _ in range(draw(st.integers(1, 8))):
            i = draw(st.integers(0, len(blob) - 1))
            blob[i] ^= 1 << draw(st.integers(0, 7))
        return bytes(blob)
    if how == "splice":
        other = draw(st.sampled_from(VALID))
        cut = draw(st.integers(0, len(blob)))
        return bytes(blob[:cut]) + other[draw(st.integers(0, len(other))) :]
    if how == "huge_length":
        i = draw(st.integers(0, max(0, len(blob) - 8)))
        blob[i : i + 4] = draw(st.sampled_from([b"\xff\xff\xff\x7f", b"\x00\x00\x00\x80", b"\xff\xff\xff\xff"]))
        return bytes(blob)
    return bytes(blob) + draw(st.binary(min_size=1, max_size=64))


def _timed(fn, *args):
    start = time.perf_counter()
    try:
        return fn(*args)
    finally:
        assert time.perf_counter() - start < SLOW_INPUT_S, f"{fn.__name__} took {time.perf_counter() - start:.1f}s on one input"


@FAST
@given(damaged_streams())
def test_read_snapshot_and_canonicalise_accept_or_raise_a_typed_error(blob: bytes):
    TRIED["read_snapshot+canonicalise"] += 1
    try:
        snap = _timed(snapshot.read_snapshot, blob)
    except (CorruptSnapshotError, UnsupportedFormatVersionError) as exc:
        assert str(exc)
        with pytest.raises((CorruptSnapshotError, UnsupportedFormatVersionError)):
            snapshot.canonicalise_state_snapshot(blob)
        return
    assert snap.table.num_rows >= 0
    try:
        out = _timed(snapshot.canonicalise_state_snapshot, blob)
    except ClinkError as exc:  # a readable changelog can still be refused when replayed (a typed error)
        assert str(exc)
        return
    assert not snapshot.read_snapshot(out).is_changelog


@FAST
@given(st.lists(damaged_streams(), min_size=1, max_size=3), st.booleans())
def test_merge_snapshot_bytes_accepts_or_raises_a_typed_error(blobs: list[bytes], with_valid: bool):
    TRIED["merge_snapshot_bytes"] += 1
    if with_valid:
        blobs = [VALID[0], *blobs]
    try:
        out = _timed(snapshot.merge_snapshot_bytes, blobs)
    except ClinkError as exc:
        assert str(exc)
        return
    snapshot.read_snapshot(out)


def _manifest_doc() -> dict:
    entry = {
        "path": "data/a.arrow",
        "kind": "delta",
        "kg_lo": 0,
        "kg_hi": 127,
        "rows": 3,
        "size": 100,
        "sha256": "0" * 64,
        "segments": [{"kg_lo": 0, "kg_hi": 127, "offset": 0, "length": 100, "rows": 3, "crc32": 7}],
    }
    return {
        "format": "clink.checkpoint-manifest",
        "version": 1,
        "job": "j",
        "checkpoint_id": 2,
        "parent_id": 1,
        "created_at_ms": 5,
        "operators": [{"op_id": 1, "uid": "u"}],
        "state_versions": "",
        "files": [entry],
        "parts": [{"kg_lo": 0, "kg_hi": 127, "epoch": 1, "parent_id": 1, "layers": [["data/a.arrow"]]}],
    }


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(1 << 70), max_value=1 << 70) | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12,
)


def _paths(doc, prefix=()):
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield (*prefix, k)
            yield from _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield (*prefix, i)
            yield from _paths(v, (*prefix, i))


MANIFEST_PATHS = list(_paths(_manifest_doc()))
EVIL_VALUES = [
    "../../x",
    "/etc/passwd",
    "data/../../other/data/x.arrow",
    "data/\x00.arrow",
    "\udcff",
    -1,
    1 << 64,
    1 << 200,
    None,
    [],
    {},
    "op",
    "",
    1.5,
    True,
    "data/a.arrow",
]


@FAST
@given(
    st.one_of(
        st.binary(max_size=300),
        JSONISH.map(lambda d: json.dumps(d).encode()),
        st.tuples(st.sampled_from(MANIFEST_PATHS), st.one_of(st.sampled_from(EVIL_VALUES), JSONISH)),
    )
)
def test_manifest_parsing_accepts_or_raises_corrupt_data_naming_the_file(data):
    TRIED["parse_manifest"] += 1
    if isinstance(data, tuple):
        path, value = data
        doc = _manifest_doc()
        node = doc
        for step in path[:-1]:
            node = node[step]
        node[path[-1]] = value
        data = json.dumps(doc, ensure_ascii=False).encode("utf-8", "surrogatepass")
    try:
        manifest = _timed(parse_manifest, data, "jobs/j/chk-2/_metadata")
    except CorruptDataError as exc:
        assert "jobs/j/chk-2/_metadata" in str(exc)
        return
    for f in manifest.files:
        assert f.path.startswith("data/") and ".." not in f.path.split("/")


# ---- every gRPC handler ---------------------------------------------------------------------------------------------

ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}


@pytest.fixture(scope="module")
def fuzz_pool(tmp_path_factory):
    store = FileStore(tmp_path_factory.mktemp("fuzz") / "store")
    server = PoolServer(
        PoolServerConfig(listen="127.0.0.1:0", grace_seconds=0.2, max_message_bytes=4 << 20, store_retry=None), store=store
    ).start()
    channel = grpc.insecure_channel(server.address, options=[("grpc.max_send_message_length", 64 << 20)])
    acquire = channel.unary_unary(
        SERVICE + "AcquireWriter",
        request_serializer=pb.AcquireWriterRequest.SerializeToString,
        response_deserializer=pb.AcquireWriterResponse.FromString,
    )
    epoch = acquire(pb.AcquireWriterRequest(job="fz", key_groups=pb.KeyGroupRange(lo=0, hi=127)), timeout=10).epoch
    commit = channel.stream_unary(
        SERVICE + "CommitCheckpoint",
        request_serializer=pb.CommitChunk.SerializeToString,
        response_deserializer=pb.CommitCheckpointResponse.FromString,
    )
    header = pb.CommitHeader(job="fz", checkpoint_id=1, key_groups=pb.KeyGroupRange(lo=0, hi=127), epoch=epoch)
    commit(iter([pb.CommitChunk(header=header), pb.CommitChunk(delta=VALID[1])]), timeout=10)
    try:
        yield server, channel, store
    finally:
        channel.close()
        server.stop(0)


def _raw(channel, method: str, payload, stream_in: bool = False, stream_out: bool = False):
    """Call with raw bytes (no client-side serialisation); returns the status code."""
    try:
        if stream_in:
            channel.stream_unary(SERVICE + method)(iter(payload), timeout=10)
        elif stream_out:
            for _ in channel.unary_stream(SERVICE + method)(payload, timeout=10):
                pass
        else:
            channel.unary_unary(SERVICE + method)(payload, timeout=10)
    except grpc.RpcError as exc:
        assert exc.code() in ALLOWED, f"{method}: {exc.code()} {exc.details()}"
        assert exc.details(), f"{method}: {exc.code()} without a message"
        return exc.code()
    return grpc.StatusCode.OK


UNARY = ["AcquireWriter", "Get", "MultiGet", "ListJobs", "ListCheckpoints", "DescribeCheckpoint", "DeleteCheckpoint"]
WEIRD_TEXT = st.one_of(st.text(max_size=40), st.sampled_from(["fz", "", "..", "a/b", "x" * 300, "\x00", "fz\n", "é" * 70]))
WEIRD_U64 = st.one_of(st.integers(0, 3), st.sampled_from([(1 << 63) - 1, 1 << 63, (1 << 64) - 1]), st.integers(0, (1 << 64) - 1))
WEIRD_U32 = st.one_of(st.integers(0, 130), st.integers(0, (1 << 32) - 1))


def _field(num: int, wire: int, payload: bytes) -> bytes:
    return _varint(num << 3 | wire) + payload


def _varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


@st.composite
def garbled_bytes(draw) -> bytes:
    """Raw protobuf-ish bytes: random, a string field with bad UTF-8, a length prefix far past the end, or a huge varint."""
    how = draw(st.sampled_from(["random", "bad_utf8", "huge_len", "huge_varint"]))
    if how == "random":
        return draw(st.binary(max_size=200))
    if how == "bad_utf8":
        bad = draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"fz\x80", b"\xf8\x88\x80\x80\x80"]))
        return _field(1, 2, _varint(len(bad)) + bad)
    if how == "huge_len":
        return _field(draw(st.integers(1, 6)), 2, _varint(draw(st.integers(1000, 1 << 62))) + b"abc")
    return _field(draw(st.integers(1, 6)), 0, b"\xff" * 10 + b"\x01")


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.sampled_from(UNARY + ["ScanCheckpoint", "CommitCheckpoint"]), garbled_bytes())
def test_every_handler_answers_garbled_bytes_with_a_proper_status(fuzz_pool, method: str, raw: bytes):
    TRIED["grpc garbled bytes"] += 1
    _, channel, _ = fuzz_pool
    if method == "CommitCheckpoint":
        _raw(channel, method, [raw, raw], stream_in=True)
    else:
        _raw(channel, method, raw, stream_out=method == "ScanCheckpoint")


@st.composite
def weird_requests(draw):
    job = draw(WEIRD_TEXT)
    cid = draw(WEIRD_U64)
    kg = pb.KeyGroupRange(lo=draw(WEIRD_U32), hi=draw(WEIRD_U32))
    keys = draw(st.lists(st.binary(max_size=20), max_size=5))
    ops = draw(st.lists(WEIRD_U64, max_size=6))
    delta = draw(st.one_of(st.just(b""), damaged_streams(), st.sampled_from(VALID)))
    method = draw(st.sampled_from(UNARY + ["ScanCheckpoint", "CommitCheckpoint"]))
    if method in ("AcquireWriter", "CommitCheckpoint", "DeleteCheckpoint") and job == "fz":
        job = "fz-w"  # writes go elsewhere: the final test checks job fz is exactly as committed
    if method == "AcquireWriter":
        return method, pb.AcquireWriterRequest(job=job, key_groups=kg)
    if method == "Get":
        return method, pb.GetRequest(job=job, checkpoint_id=cid, op_id=ops[0] if ops else 0, key_bytes=keys[0] if keys else b"")
    if method == "MultiGet":
        return method, pb.MultiGetRequest(job=job, checkpoint_id=cid, op_ids=ops, keys=keys)
    if method == "ListJobs":
        return method, pb.ListJobsRequest()
    if method == "ListCheckpoints":
        return method, pb.ListCheckpointsRequest(job=job, include_incomplete=draw(st.booleans()))
    if method == "DescribeCheckpoint":
        return method, pb.DescribeCheckpointRequest(job=job, checkpoint_id=cid)
    if method == "DeleteCheckpoint":
        return method, pb.DeleteCheckpointRequest(job=job, checkpoint_id=cid)
    if method == "ScanCheckpoint":
        req = pb.ScanCheckpointRequest(job=job, checkpoint_id=cid, op_ids=ops, delta=delta)
        if draw(st.booleans()):
            req.key_groups.CopyFrom(kg)
        return method, req
    header = pb.CommitHeader(
        job=job,
        checkpoint_id=cid,
        parent_id=draw(WEIRD_U64),
        key_groups=kg,
        epoch=draw(WEIRD_U64),
        state_versions=draw(st.one_of(st.just(""), st.text(max_size=30))),
        operators=[pb.OperatorInfo(op_id=o, uid=draw(st.text(max_size=8))) for o in ops[:2]],
    )
    order = draw(st.sampled_from(["header_first", "no_header", "two_headers", "header_only"]))
    chunks = {
        "header_first": [pb.CommitChunk(header=header), pb.CommitChunk(delta=delta)],
        "no_header": [pb.CommitChunk(delta=delta)],
        "two_headers": [pb.CommitChunk(header=header), pb.CommitChunk(header=header)],
        "header_only": [pb.CommitChunk(header=header)],
    }[order]
    return method, chunks


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(weird_requests())
def test_every_handler_answers_wrong_and_extreme_fields_with_a_proper_status(fuzz_pool, call):
    TRIED["grpc weird fields"] += 1
    _, channel, _ = fuzz_pool
    method, message = call
    if method == "CommitCheckpoint":
        code = _raw(channel, method, [m.SerializeToString() for m in message], stream_in=True)
    else:
        code = _raw(channel, method, message.SerializeToString(), stream_out=method == "ScanCheckpoint")
    if method in ("AcquireWriter", "CommitCheckpoint", "DeleteCheckpoint") and code is grpc.StatusCode.OK:
        job = message[0].header.job if method == "CommitCheckpoint" else message.job
        assert job and "/" not in job and ".." not in job


def test_the_server_is_healthy_and_job_state_intact_after_the_fuzzing(fuzz_pool):
    server, channel, store = fuzz_pool
    health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    scan = channel.unary_stream(
        SERVICE + "ScanCheckpoint",
        request_serializer=pb.ScanCheckpointRequest.SerializeToString,
        response_deserializer=pb.ScanChunk.FromString,
    )
    blob = b"".join(c.data for c in scan(pb.ScanCheckpointRequest(job="fz", checkpoint_id=1), timeout=10))
    expected = snapshot.read_snapshot(snapshot.canonicalise_state_snapshot(VALID[1])).table
    assert sorted(snapshot.read_snapshot(blob).table.to_pylist(), key=repr) == sorted(expected.to_pylist(), key=repr)
    assert snapshot.read_snapshot(blob).table.num_rows == 4  # 5 puts, 1 erase: no fuzzed call changed the job
    # a huge message is refused by the size limit, and the server still answers afterwards
    code = _raw(channel, "MultiGet", pb.MultiGetRequest(job="fz", op_ids=[OP], keys=[b"\x01" * (5 << 20)]).SerializeToString())
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
    TRIED["grpc health+limits"] += 2
    rng = random.Random(0)
    for _ in range(200):  # a burst of random bytes at every method, then a healthy answer again
        method = rng.choice(UNARY)
        _raw(channel, method, rng.randbytes(rng.randrange(0, 64)))
        TRIED["grpc random burst"] += 1
    assert (
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5).status
        == health_pb2.HealthCheckResponse.SERVING
    )
