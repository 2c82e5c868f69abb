"""The RemotePool through real gRPC on loopback over moto S3: behaviour, status codes, health, reflection, metrics."""

from __future__ import annotations

import json
import logging
import random
import re
import time
import urllib.request
from collections.abc import Callable, Iterator

import grpc
import pyarrow as pa
import pyarrow.ipc  # noqa: F401  # pa.ipc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from hypothesis import given, settings
from hypothesis import strategies as st

import snapshot
from pool.errors import ERROR_CLASS_METADATA_KEY, STATUS_BY_ERROR, status_for
from pool.server import PoolServer, PoolServerConfig
from pool.wire import length_delimited_field_1
from protos import remote_pool_pb2 as pb
from store.objects import ObjectStore, StoreConfig
from tests.pool_server_fixtures import (
    OPS,
    RawPool,
    apply,
    changelog_bytes,
    in_range,
    keyed_keys_in,
    random_delta,
)

SERVICE = "clink.remote_state.v1.RemotePool"


def _config(**kw: object) -> PoolServerConfig:
    return PoolServerConfig(listen="127.0.0.1:0", grace_seconds=0.5, **kw)


@pytest.fixture
def make_server() -> Iterator[Callable[..., PoolServer]]:
    started: list[PoolServer] = []

    def make(store: ObjectStore, **kw: object) -> PoolServer:
        server = PoolServer(_config(**kw), store=store).start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop(0)


@pytest.fixture
def served(make_s3_store: Callable[..., ObjectStore], make_server: Callable[..., PoolServer]) -> Iterator[tuple[PoolServer, RawPool]]:
    server = make_server(make_s3_store(), metrics_port=0)
    pool = RawPool(server.address)
    yield server, pool
    pool.close()


def _code(excinfo: pytest.ExceptionInfo[grpc.RpcError]) -> grpc.StatusCode:
    return excinfo.value.code()


def _state(pool: RawPool, job: str) -> tuple[list[tuple[int, bool, int]], dict]:
    """What a client can see of a job: its checkpoints and the newest scan (for 'changes nothing' checks)."""
    infos = [(c.checkpoint_id, c.complete, c.num_rows) for c in pool.checkpoints(job)]
    newest = max((c[0] for c in infos if c[1]), default=0)
    return infos, (pool.scan(job, newest) if newest else {})


def test_end_to_end_incremental_checkpoints_match_a_dict_model(served: tuple[PoolServer, RawPool]) -> None:
    server, pool = served
    job = "orders-7"
    rng = random.Random(7)
    keyed = keyed_keys_in(0, 127, 300, seed=1)
    operator_keys = [snapshot.encode_operator_key("offsets", bytes([i])) for i in range(8)]
    keys = keyed + operator_keys
    epoch = pool.acquire(job)
    models: dict[int, dict] = {}
    model: dict = {}
    parent = 0
    for cid in range(1, 9):
        rows = random_delta(model, keys, rng, 120 if cid == 1 else 40, tag=f"c{cid}")
        model = apply(model, rows)
        resp = pool.commit(job, cid, parent, epoch, changelog_bytes(rows), chunk=4096)
        assert resp.checkpoint.checkpoint_id == cid and resp.checkpoint.complete
        assert resp.checkpoint.parent_id == parent
        assert resp.bytes_written > 0
        # num_rows counts the rows of every referenced file (layers), so at least the live keys
        assert resp.checkpoint.num_rows >= len(model) and resp.checkpoint.num_files >= 1
        models[cid] = model
        parent = cid

    # every checkpoint, old and new, scans and reads exactly as the model says
    for cid, expect in models.items():
        assert pool.scan(job, cid) == expect
        probe = keys[:100] + [snapshot.encode_keyed_key("v", b"never-written")]
        op_ids = [OPS[i % 3] for i in range(len(probe))]
        got = pool.multi_get(job, cid, op_ids, probe)
        assert got.checkpoint_id == cid
        assert list(got.found) == [(op, k) in expect for op, k in zip(op_ids, probe, strict=True)]
        assert list(got.values) == [expect.get((op, k), b"") for op, k in zip(op_ids, probe, strict=True)]
        for (op, key), value in list(expect.items())[:10]:
            one = pool.get(job, cid, op, key)
            assert (one.found, one.value, one.checkpoint_id) == (True, value, cid)

    # checkpoint 0 means the newest complete one
    assert pool.scan(job, 0) == models[8]
    assert pool.get(job, 0, OPS[0], b"\x00absent").checkpoint_id == 8
    # range and operator filters, and an overlay delta, agree with the model
    assert pool.scan(job, 8, key_groups=(10, 60)) == in_range(models[8], 10, 60)
    assert pool.scan(job, 8, op_ids=[OPS[1]]) == {k: v for k, v in models[8].items() if k[0] == OPS[1]}
    overlay_rows = random_delta(models[8], keys, rng, 30, tag="overlay")
    assert pool.scan(job, 8, delta=changelog_bytes(overlay_rows)) == apply(models[8], overlay_rows)
    # a MultiGet with one shared op_id
    shared = pool.multi_get(job, 8, [OPS[2]], keyed[:20])
    assert list(shared.found) == [(OPS[2], k) in models[8] for k in keyed[:20]]

    listed = pool.checkpoints(job, include_incomplete=False)
    assert [c.checkpoint_id for c in listed] == list(range(1, 9))
    assert job in pool.stub.ListJobs(pb.ListJobsRequest(), timeout=10).jobs
    described = pool.stub.DescribeCheckpoint(pb.DescribeCheckpointRequest(job=job, checkpoint_id=5), timeout=10)
    assert described.checkpoint.checkpoint_id == 5
    manifest = json.loads(described.manifest_json)
    assert isinstance(manifest, dict)
    assert {op.uid for op in described.checkpoint.operators} == {"counter", "window", "dedup"}


def test_bad_input_gets_the_right_status_and_changes_nothing(served: tuple[PoolServer, RawPool]) -> None:
    _server, pool = served
    job = "guarded"
    keys = keyed_keys_in(0, 63, 50, seed=2)
    epoch = pool.acquire(job, 0, 63)
    rows = [(snapshot.ROW_PUT, OPS[0], k, b"v1") for k in keys]
    pool.commit(job, 1, 0, epoch, changelog_bytes(rows), lo=0, hi=63)
    # a second subtask completes checkpoint 1 for the other half
    other = pool.acquire(job, 64, 127)
    pool.commit(job, 1, 0, other, changelog_bytes([]), lo=64, hi=127)
    before = _state(pool, job)
    assert before[0] and before[0][-1][1], "checkpoint 1 should be complete"

    def expect(code: grpc.StatusCode, call: Callable[[], object], *needles: str) -> None:
        with pytest.raises(grpc.RpcError) as excinfo:
            call()
        assert _code(excinfo) == code, excinfo.value.details()
        for needle in needles:
            assert needle in excinfo.value.details(), excinfo.value.details()
        assert _state(pool, job) == before

    nf = grpc.StatusCode.NOT_FOUND
    ia = grpc.StatusCode.INVALID_ARGUMENT
    expect(nf, lambda: pool.get("no-such-job", 0, OPS[0], keys[0]))
    expect(nf, lambda: pool.scan_bytes("no-such-job"))
    expect(nf, lambda: pool.scan_bytes(job, 99))
    expect(nf, lambda: pool.multi_get(job, 99, [OPS[0]], keys[:3]))
    expect(nf, lambda: pool.stub.DescribeCheckpoint(pb.DescribeCheckpointRequest(job=job, checkpoint_id=42), timeout=10))
    expect(ia, lambda: pool.multi_get(job, 1, [OPS[0], OPS[1]], keys[:3]), "op_ids")
    # malformed Arrow, and a canonical (not changelog) stream where a changelog is required
    expect(ia, lambda: pool.commit(job, 2, 1, epoch, b"not an arrow stream at all", lo=0, hi=63))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, pa.schema([("op_id", pa.uint64()), ("key", pa.binary())])) as w:
        w.write_table(pa.table({"op_id": pa.array([1], pa.uint64()), "key": [keys[0]]}))
    wrong_schema = sink.getvalue().to_pybytes()
    expect(ia, lambda: pool.commit(job, 2, 1, epoch, changelog_bytes(rows)[:-40], lo=0, hi=63))
    expect(ia, lambda: pool.scan_bytes(job, 1, delta=b"garbage"))
    # a key group outside the writer's declared range
    outside = keyed_keys_in(64, 127, 1, seed=3)[0]
    expect(ia, lambda: pool.commit(job, 2, 1, epoch, changelog_bytes([(snapshot.ROW_PUT, OPS[0], outside, b"x")]), lo=0, hi=63))
    # job ids that could leave their prefix
    for bad in ("..", "a/b", "", "\x01", "j" * 129):
        expect(ia, lambda bad=bad: pool.acquire(bad))
        expect(ia, lambda bad=bad: pool.commit(bad, 1, 0, 1, changelog_bytes(rows)))
        expect(ia, lambda bad=bad: pool.get(bad, 0, OPS[0], keys[0]))
    # invalid key-group ranges
    expect(ia, lambda: pool.acquire(job, 5, 200))
    expect(ia, lambda: pool.acquire(job, 9, 3))
    # the commit stream must start with the header, and must not carry a second one
    expect(ia, lambda: pool.stub.CommitCheckpoint(iter([pb.CommitChunk(delta=changelog_bytes(rows))]), timeout=10), "header")
    expect(ia, lambda: pool.stub.CommitCheckpoint(iter([]), timeout=10), "header")
    header = pb.CommitHeader(job=job, checkpoint_id=2, parent_id=1, key_groups=pb.KeyGroupRange(lo=0, hi=63), epoch=epoch)
    expect(
        ia, lambda: pool.stub.CommitCheckpoint(iter([pb.CommitChunk(header=header), pb.CommitChunk(header=header)]), timeout=10), "header"
    )
    no_range = pb.CommitHeader(job=job, checkpoint_id=2, parent_id=1, epoch=epoch)
    expect(ia, lambda: pool.stub.CommitCheckpoint(iter([pb.CommitChunk(header=no_range)]), timeout=10), "key_groups")
    # a stale epoch: a newer writer took over an overlapping range
    newer = pool.acquire(job, 32, 95)
    assert newer > epoch
    expect(grpc.StatusCode.FAILED_PRECONDITION, lambda: pool.commit(job, 2, 1, epoch, changelog_bytes(rows[:5]), lo=0, hi=63))
    # a valid Arrow stream of the wrong schema, as a commit delta and as a scan overlay
    expect(ia, lambda: pool.commit(job, 2, 1, newer, wrong_schema, lo=32, hi=95), "column")
    expect(ia, lambda: pool.scan_bytes(job, 1, delta=wrong_schema))


def test_flipped_byte_in_a_data_file_is_data_loss_naming_the_file(
    make_s3_store: Callable[..., ObjectStore], make_server: Callable[..., PoolServer]
) -> None:
    store = make_s3_store()
    writer = RawPool(make_server(store).address)
    job = "flipped"
    keys = keyed_keys_in(0, 127, 200, seed=4)
    rows = [(snapshot.ROW_PUT, OPS[0], k, b"value-" + k) for k in keys]
    writer.commit(job, 1, 0, writer.acquire(job), changelog_bytes(rows))
    data_files = [o.key for o in store.list(f"jobs/{job}/") if o.key.endswith(".arrow")]
    assert data_files, "the commit should have written a data file"
    victim = data_files[0]
    blob = bytearray(store.get(victim))
    blob[len(blob) // 2] ^= 0x40
    store.put(victim, bytes(blob))
    # a fresh server has nothing cached: its reads go to the flipped bytes
    reader = RawPool(make_server(store).address)
    name = victim.rsplit("/", 1)[-1]
    for call in (
        lambda: reader.scan_bytes(job, 1),
        lambda: reader.get(job, 1, OPS[0], keys[0]),
        lambda: reader.multi_get(job, 1, [OPS[0]], keys[:5]),
    ):
        with pytest.raises(grpc.RpcError) as excinfo:
            call()
        assert _code(excinfo) == grpc.StatusCode.DATA_LOSS
        assert name in excinfo.value.details()
    # the server is still up and says so
    assert reader.checkpoints(job)[0].checkpoint_id == 1
    writer.close()
    reader.close()


def test_concurrent_same_checkpoint_same_range_one_wins_the_other_is_aborted(served: tuple[PoolServer, RawPool]) -> None:
    import threading

    _server, pool = served
    job = "racy"
    keys = keyed_keys_in(0, 127, 100, seed=5)
    epoch = pool.acquire(job)
    deltas = {name: changelog_bytes([(snapshot.ROW_PUT, OPS[0], k, name.encode()) for k in keys]) for name in ("left", "right")}
    outcomes: dict[str, object] = {}
    barrier = threading.Barrier(2)

    def commit(name: str) -> None:
        barrier.wait(timeout=10)
        try:
            outcomes[name] = pool.commit(job, 1, 0, epoch, deltas[name])
        except grpc.RpcError as exc:
            outcomes[name] = exc.code()

    threads = [threading.Thread(target=commit, args=(n,)) for n in deltas]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    codes = sorted(v.name if isinstance(v, grpc.StatusCode) else "OK" for v in outcomes.values())
    assert codes == ["ABORTED", "OK"], outcomes
    winner = next(n for n, v in outcomes.items() if not isinstance(v, grpc.StatusCode))
    # all of the winner's rows, none of the loser's
    assert set(pool.scan(job, 1).values()) == {winner.encode()}
    assert len(pool.scan(job, 1)) == len(keys)


def _wait_until_bindable(port: int, timeout_s: float = 30.0) -> None:
    """Return once 127.0.0.1:port can be bound (bounded); fail naming the port otherwise."""
    import socket

    deadline = time.monotonic() + timeout_s
    while True:
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
                return
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"port {port} stayed in use for {timeout_s:g} s: the store could not come back on it")
        time.sleep(0.1)


def test_object_store_outage_is_unavailable_and_the_server_keeps_serving(
    s3_config: StoreConfig, make_server: Callable[..., PoolServer]
) -> None:
    from moto.server import ThreadedMotoServer

    from store.s3 import S3Store

    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    config = StoreConfig(
        endpoint_url=f"http://{host}:{port}",
        region="us-east-1",
        access_key_id="testing",
        secret_access_key="testing",
        max_attempts=1,
        connect_timeout_s=1,
        read_timeout_s=5,
    )
    store = S3Store("outage-bucket", "", config)
    store.create_bucket()
    server = make_server(store)
    pool = RawPool(server.address)
    keys = keyed_keys_in(0, 127, 20, seed=6)
    epoch = pool.acquire("survivor")
    pool.commit("survivor", 1, 0, epoch, changelog_bytes([(snapshot.ROW_PUT, OPS[0], k, b"v") for k in keys]))
    moto.stop()
    try:
        for call in (
            lambda: pool.acquire("survivor"),
            lambda: pool.checkpoints("survivor"),
            lambda: pool.commit("survivor", 2, 1, epoch, changelog_bytes([(snapshot.ROW_PUT, OPS[0], keys[0], b"w")])),
        ):
            with pytest.raises(grpc.RpcError) as excinfo:
                call()
            assert _code(excinfo) == grpc.StatusCode.UNAVAILABLE, excinfo.value.details()
            assert (
                str(port) in excinfo.value.details() or "unreachable" in excinfo.value.details() or "unavailable" in excinfo.value.details()
            )
        health = health_pb2_grpc.HealthStub(pool.channel).Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        # the store comes back on the same port: the same server answers again (moto keeps its state in process)
        _wait_until_bindable(port)  # another test's ephemeral socket may hold the freed port a moment (moto would hang)
        moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        moto.start()
    try:
        assert pool.scan("survivor", 1) == {(OPS[0], k): b"v" for k in keys}
        assert pool.commit("survivor", 2, 1, epoch, changelog_bytes([(snapshot.ROW_PUT, OPS[0], keys[0], b"w")])).checkpoint.complete
    finally:
        moto.stop()
        pool.close()


def test_dead_endpoint_is_unavailable(make_server: Callable[..., PoolServer]) -> None:
    import socket

    from store.s3 import S3Store

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]
    config = StoreConfig(
        endpoint_url=f"http://127.0.0.1:{dead_port}",
        region="us-east-1",
        access_key_id="x",
        secret_access_key="y",
        max_attempts=1,
        connect_timeout_s=1,
        read_timeout_s=2,
    )
    pool = RawPool(make_server(S3Store("nowhere", "", config), check_store=False).address)  # a store that dies after start
    for _ in range(2):
        with pytest.raises(grpc.RpcError) as excinfo:
            pool.stub.ListJobs(pb.ListJobsRequest(), timeout=20)
        assert _code(excinfo) == grpc.StatusCode.UNAVAILABLE
    pool.close()


def test_unexpected_error_is_internal_logged_and_the_server_stays_up(
    served: tuple[PoolServer, RawPool], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    server, pool = served

    def broken(*_a: object, **_k: object) -> list[str]:
        raise RuntimeError("a bug in the core")

    monkeypatch.setattr(server.core, "list_jobs", broken)
    with caplog.at_level(logging.ERROR, logger="clink.pool"), pytest.raises(grpc.RpcError) as excinfo:
        pool.stub.ListJobs(pb.ListJobsRequest(), timeout=10)
    assert _code(excinfo) == grpc.StatusCode.INTERNAL
    assert "RuntimeError" in excinfo.value.details()
    assert any(r.exc_info and "a bug in the core" in str(r.exc_info[1]) for r in caplog.records), "traceback not logged"
    monkeypatch.undo()
    assert pool.stub.ListJobs(pb.ListJobsRequest(), timeout=10) is not None


@pytest.mark.parametrize("error", sorted(STATUS_BY_ERROR, key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_every_domain_error_maps_through_the_one_table(
    error: type[Exception], served: tuple[PoolServer, RawPool], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, pool = served
    exc = error("/jobs/x/data/f.arrow", "aa", "bb") if error is snapshot.ChecksumMismatchError else error(f"boom {error.__name__}")

    def raising(*_a: object, **_k: object) -> object:
        raise exc

    monkeypatch.setattr(server.core, "scan_table", raising)
    with pytest.raises(grpc.RpcError) as excinfo:
        pool.scan_bytes("anyjob")
    assert _code(excinfo) == STATUS_BY_ERROR[error] == status_for(exc)
    assert str(exc) in excinfo.value.details()
    assert (ERROR_CLASS_METADATA_KEY, error.__name__) in tuple(excinfo.value.trailing_metadata())


def test_status_table_prefers_the_most_specific_class() -> None:
    assert status_for(snapshot.CorruptSnapshotError("x")) == grpc.StatusCode.INVALID_ARGUMENT
    assert status_for(snapshot.ChecksumMismatchError("p", "a", "b")) == grpc.StatusCode.DATA_LOSS
    assert status_for(snapshot.CorruptDataError("x")) == grpc.StatusCode.DATA_LOSS
    assert status_for(snapshot.ConflictError("x")) == grpc.StatusCode.ABORTED
    assert status_for(KeyError("x")) == grpc.StatusCode.INTERNAL


def test_health_reflection_and_metrics(served: tuple[PoolServer, RawPool]) -> None:
    server, pool = served
    health = health_pb2_grpc.HealthStub(pool.channel)
    for service in ("", SERVICE):
        assert health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status == health_pb2.HealthCheckResponse.SERVING

    reflection = reflection_pb2_grpc.ServerReflectionStub(pool.channel)
    responses = list(reflection.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5))
    names = {s.name for s in responses[0].list_services_response.service}
    assert SERVICE in names and "grpc.health.v1.Health" in names

    keys = keyed_keys_in(0, 127, 30, seed=8)
    epoch = pool.acquire("metered")
    pool.commit("metered", 1, 0, epoch, changelog_bytes([(snapshot.ROW_PUT, OPS[0], k, b"v" * 100) for k in keys]))
    for _ in range(3):
        pool.multi_get("metered", 1, [OPS[0]], keys)
    pool.scan_bytes("metered", 1)
    with pytest.raises(grpc.RpcError):
        pool.get("nobody", 0, OPS[0], keys[0])

    assert server.metrics_port
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5).read().decode()

    def value(pattern: str) -> float:
        match = re.search(pattern + r"\s+([0-9.e+]+)", text)
        assert match, f"{pattern} not in metrics"
        return float(match.group(1))

    assert value(r'clink_pool_requests_total\{code="OK",method="MultiGet"\}') == 3
    assert value(r'clink_pool_requests_total\{code="NOT_FOUND",method="Get"\}') == 1
    assert value(r'clink_pool_request_seconds_count\{method="CommitCheckpoint"\}') == 1
    assert value(r'clink_pool_received_bytes_total\{method="CommitCheckpoint"\}') > 30 * 100
    assert value(r'clink_pool_sent_bytes_total\{method="ScanCheckpoint"\}') > 30 * 100
    assert value(r"clink_pool_cache_hits_total") + value(r"clink_pool_cache_misses_total") > 0


def test_stop_reports_not_serving_and_drains(make_s3_store: Callable[..., ObjectStore]) -> None:
    server = PoolServer(_config(), store=make_s3_store()).start()
    pool = RawPool(server.address)
    assert pool.stub.ListJobs(pb.ListJobsRequest(), timeout=5) is not None
    server.stop(0.2)
    assert server.wait(timeout=5)
    with pytest.raises(grpc.RpcError) as excinfo:
        pool.stub.ListJobs(pb.ListJobsRequest(), timeout=2)
    assert _code(excinfo) == grpc.StatusCode.UNAVAILABLE
    pool.close()


def test_server_config_is_validated() -> None:
    with pytest.raises(snapshot.InvalidArgumentError):
        PoolServer(PoolServerConfig(store_uri="file:///tmp/unused-pool", max_workers=0))
    with pytest.raises(snapshot.InvalidArgumentError):
        PoolServer(PoolServerConfig(store_uri="file:///tmp/unused-pool", max_message_bytes=1000))


def test_scan_stream_is_byte_identical_to_the_core_stream(served: tuple[PoolServer, RawPool]) -> None:
    server, pool = served
    job = "identical"
    keys = keyed_keys_in(0, 127, 400, seed=9) + [snapshot.encode_operator_key("offsets", b"p")]
    epoch = pool.acquire(job)
    rows = [(snapshot.ROW_PUT, OPS[i % 3], k, bytes(i % 251 for i in range(i % 97))) for i, k in enumerate(keys)]
    pool.commit(job, 1, 0, epoch, changelog_bytes(rows), state_versions="0|ValueState|2")
    delta = changelog_bytes(rows[:7])
    for kg, ops, overlay in ((None, [], b""), ((3, 90), [], b""), (None, [OPS[2]], b""), ((0, 127), [OPS[0], OPS[1]], delta)):
        from pool.domain import KeyGroupRange

        expected = b"".join(server.core.scan(job, 1, KeyGroupRange(*kg) if kg else None, ops, overlay or None))
        assert pool.scan_bytes(job, 1, key_groups=kg, op_ids=ops, delta=overlay) == expected


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 300), chunk=st.integers(1, 5000), seed=st.integers(0, 2**16))
def test_stream_chunks_concatenate_to_the_writer_output(n: int, chunk: int, seed: int) -> None:
    from pool.streaming import stream_chunks

    rng = random.Random(seed)
    table = pa.table(
        {
            "op_id": pa.array([rng.getrandbits(64) for _ in range(n)], pa.uint64()),
            "key_bytes": [rng.randbytes(rng.randint(1, 20)) for _ in range(n)],
            "value_bytes": [rng.randbytes(rng.randint(0, 40)) for _ in range(n)],
        }
    )
    writer = snapshot.SnapshotArrowWriter(snapshot.StateVersionMap({(7, "ListState"): 3}))
    chunks = list(stream_chunks(writer, table, chunk))
    assert b"".join(chunks) == writer.write(table)
    assert all(len(c) == chunk for c in chunks[:-1]) and 0 < len(chunks[-1]) <= chunk
    # framed as ScanChunk messages, each parses back to the same chunk
    framed = list(stream_chunks(writer, table, chunk, frame=length_delimited_field_1))
    assert [pb.ScanChunk.FromString(f).data for f in framed] == chunks


@pytest.mark.parametrize("size", [1, 127, 128, 16383, 16384, 1 << 20, (1 << 21) + 3])
def test_scan_chunk_header_is_the_protobuf_encoding(size: int) -> None:
    data = bytes(size)
    assert length_delimited_field_1(size) + data == pb.ScanChunk(data=data).SerializeToString()
