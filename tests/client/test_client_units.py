"""Client pieces that need no pool: the status table, retries against a dead address, changelog columns, TTL mask, cache."""

from __future__ import annotations

import socket
import struct

import grpc
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import snapshot
from client import (
    BackendConfig,
    ConflictError,
    CorruptDataError,
    FencedError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    PoolClient,
    PoolClientConfig,
    RemoteReadBackend,
    RetryPolicy,
    UnauthenticatedError,
    UnavailableError,
    changelog_table,
    ttl_expired_mask,
)
from client.backend import _LruCache
from client.errors import STATUS_TO_ERROR, error_from_status


def _dead_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"  # closed on exit: nothing listens there


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        (grpc.StatusCode.NOT_FOUND, NotFoundError),
        (grpc.StatusCode.INVALID_ARGUMENT, InvalidArgumentError),
        (grpc.StatusCode.DATA_LOSS, CorruptDataError),
        (grpc.StatusCode.ABORTED, ConflictError),
        (grpc.StatusCode.ALREADY_EXISTS, ConflictError),
        (grpc.StatusCode.FAILED_PRECONDITION, FencedError),
        (grpc.StatusCode.UNAVAILABLE, UnavailableError),
        (grpc.StatusCode.DEADLINE_EXCEEDED, UnavailableError),
        (grpc.StatusCode.PERMISSION_DENIED, PermissionDeniedError),
        (grpc.StatusCode.UNAUTHENTICATED, UnauthenticatedError),
    ],
)
def test_status_table_maps_every_code_to_its_domain_error(code, cls):
    assert STATUS_TO_ERROR[code] is cls
    err = error_from_status(code, "checksum mismatch in jobs/j/data/x.arrow", "scan")
    assert type(err) is cls
    assert "jobs/j/data/x.arrow" in str(err)  # the pool's message, naming the file, survives


def test_unknown_code_is_still_a_clink_error_naming_the_code():
    err = error_from_status(grpc.StatusCode.INTERNAL, "boom", "get")
    assert isinstance(err, snapshot.ClinkError) and "INTERNAL" in str(err)


def test_backoff_is_full_jitter_and_capped():
    import random

    policy = RetryPolicy(max_attempts=8, initial_backoff_s=0.1, max_backoff_s=0.5)
    rng = random.Random(1)
    draws = [[policy.backoff(a, rng) for _ in range(200)] for a in range(6)]
    for a, ds in enumerate(draws):
        cap = min(0.5, 0.1 * 2**a)
        assert all(0 <= d <= cap for d in ds)
        assert max(ds) > cap * 0.8  # full jitter spans the whole window
    assert np.mean(draws[0]) < np.mean(draws[3])  # grows exponentially until the cap


def test_unavailable_is_retried_with_backoff_then_reported():
    sleeps: list[float] = []
    cfg = PoolClientConfig(
        call_deadline_s=1.0, retry=RetryPolicy(max_attempts=4, initial_backoff_s=0.01, max_backoff_s=0.05), sleep=sleeps.append, seed=3
    )
    with PoolClient(_dead_address(), cfg) as pool:
        with pytest.raises(UnavailableError, match="gave up after 4 attempt"):
            pool.get("job", 1, 7, b"\x00a|b")
        assert pool.calls == 4 and pool.retries == 3
    assert len(sleeps) == 3 and all(0 <= s <= 0.05 for s in sleeps)


def test_commit_to_dead_pool_is_bounded_and_typed():
    sleeps: list[float] = []
    cfg = PoolClientConfig(commit_deadline_s=1.0, retry=RetryPolicy(max_attempts=3, initial_backoff_s=0.01), sleep=sleeps.append)
    with PoolClient(_dead_address(), cfg) as pool:
        with pytest.raises(UnavailableError):
            pool.commit_checkpoint("job", 1, 0, (0, 127), 1, b"xx")
    assert len(sleeps) == 2


def test_bad_address_is_refused_clearly():
    with pytest.raises(InvalidArgumentError, match="address"):
        PoolClient("")


entries = st.dictionaries(
    st.tuples(st.integers(0, 3), st.binary(min_size=1, max_size=6)), st.one_of(st.none(), st.binary(max_size=6)), max_size=40
)


@settings(max_examples=60, deadline=None)
@given(entries)
def test_changelog_table_matches_the_layer(layer):
    table = changelog_table(layer)
    assert table.schema.equals(snapshot.CHANGELOG_SCHEMA)
    got = {
        (o, k): (None if kind == snapshot.ROW_ERASE else v)
        for kind, o, k, v in zip(*(table.column(c).to_pylist() for c in ("row_kind", "op_id", "key_bytes", "value_bytes")), strict=True)
    }
    assert got == layer
    # and it is a valid changelog stream the format reader accepts
    snap = snapshot.read_snapshot(snapshot.write_snapshot(table, changelog=True))
    assert snap.is_changelog and snap.table.num_rows == len(layer)


ttl_rows = st.lists(
    st.tuples(
        st.sampled_from([1, 2]),
        st.sampled_from(["ttl", "plain", "ttlx"]),
        st.booleans(),  # keyed?
        st.binary(max_size=4),
        st.integers(-5, 5),  # expire-at relative to now
        st.binary(max_size=3),
        st.booleans(),  # short (malformed) value
    ),
    max_size=40,
)


@settings(max_examples=80, deadline=None)
@given(ttl_rows)
def test_ttl_mask_matches_a_row_by_row_model(rows):
    now = 1_000
    ops, keys, values, expected = [], [], [], []
    for op, slot, keyed, user, rel, payload, short in rows:
        key = snapshot.encode_keyed_key(slot, user) if keyed else snapshot.encode_operator_key(slot, user)
        value = (struct.pack("<q", now + rel) + payload) if not short else payload[:3]
        ops.append(op)
        keys.append(key)
        values.append(value)
        is_ttl = op == 1 and slot == "ttl" and keyed
        expected.append(is_ttl and len(value) >= 8 and now + rel <= now)
    table = pa.table(
        {"op_id": pa.array(ops, pa.uint64()), "key_bytes": pa.array(keys, pa.binary()), "value_bytes": pa.array(values, pa.binary())}
    )
    mask = ttl_expired_mask(table, {(1, "ttl", True)}, now)
    assert mask.tolist() == expected


def test_lru_cache_is_bounded_in_bytes_and_evicts_oldest():
    cache = _LruCache(max_bytes=1000)
    for i in range(100):
        cache.store((1, bytes([i])), b"v" * 50)
    assert cache.bytes <= 1000 and len(cache) < 100
    assert cache.lookup((1, bytes([99]))) == (True, b"v" * 50)
    assert cache.lookup((1, bytes([0])))[0] is False
    cache.store((1, b"big"), b"x" * 5000)  # larger than the bound: not cached, nothing else evicted for it
    assert cache.lookup((1, b"big"))[0] is False and cache.bytes <= 1000


def _local_backend(key_groups=(32, 63)) -> RemoteReadBackend:
    # never touches the network: no checkpoint yet, so every read is answered by the delta
    pool = PoolClient(_dead_address(), PoolClientConfig(retry=RetryPolicy(max_attempts=1)))
    return RemoteReadBackend(pool, "job", key_groups, BackendConfig())


def test_writes_outside_the_range_are_refused_and_change_nothing():
    b = _local_backend((32, 63))
    inside = bytes([40]) + b"s|k"
    outside = bytes([10]) + b"s|k"
    b.put(5, inside, b"v")
    b.put(5, snapshot.encode_operator_key("offset", b""), b"\x01" * 8)  # operator state: any subtask may write
    with pytest.raises(InvalidArgumentError, match="key group 10, outside this backend's range 32-63"):
        b.put(5, outside, b"v")
    with pytest.raises(InvalidArgumentError):
        b.erase(5, outside)
    with pytest.raises(InvalidArgumentError, match="op_id"):
        b.put(-1, inside, b"v")
    with pytest.raises(InvalidArgumentError, match="value must be bytes"):
        b.put(5, inside, "text")
    assert b.delta_rows == 2 and b.delta_bytes == len(inside) + 1 + len(snapshot.encode_operator_key("offset", b"")) + 8
    assert b.get(5, inside) == b"v" and b.get(5, bytes([41]) + b"s|k") is None
    b.close()


def test_delta_is_newest_wins_and_counts_bytes():
    b = _local_backend((0, 127))
    k = bytes([3]) + b"s|k"
    b.put(1, k, b"aaaa")
    b.put(1, k, b"bb")
    assert (b.delta_rows, b.delta_bytes, b.get(1, k)) == (1, len(k) + 2, b"bb")
    b.erase(1, k)
    assert (b.delta_rows, b.delta_bytes, b.get(1, k)) == (1, len(k), None)
    assert b.get_many(1, [k, bytes([4]) + b"s|x"]) == [None, None]
    b.close()


def test_export_without_checkpoint_is_the_canonical_delta():
    b = _local_backend((0, 127))
    b.set_state_version(1, "ValueState", 3)
    b.put(1, bytes([3]) + b"s|k", b"v1")
    b.put(1, bytes([4]) + b"s|k", b"v2")
    b.erase(1, bytes([4]) + b"s|k")
    snap = snapshot.read_snapshot(b.export_arrow_snapshot())
    assert not snap.is_changelog and snap.format_version == 1
    assert dict(snap.state_versions) == {(1, "ValueState"): 3}
    assert snap.table.to_pylist() == [{"op_id": 1, "key_bytes": bytes([3]) + b"s|k", "value_bytes": b"v1"}]
    b.close()


def test_snapshot_id_must_grow():
    b = _local_backend()
    with pytest.raises(InvalidArgumentError, match="positive"):
        b.snapshot(0)
    b.close()


def test_token_is_sent_as_bearer_metadata_and_unauthenticated_maps_to_its_error():
    from concurrent import futures

    from protos import remote_pool_pb2 as pb
    from protos import remote_pool_pb2_grpc as pb_grpc

    seen: list[str | None] = []

    class Guarded(pb_grpc.RemotePoolServicer):
        def AcquireWriter(self, request, context):  # noqa: N802
            auth = dict(context.invocation_metadata()).get("authorization")
            seen.append(auth)
            if auth != "Bearer good":
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "no valid token")
            return pb.AcquireWriterResponse(epoch=7, latest_checkpoint_id=0)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_RemotePoolServicer_to_server(Guarded(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with PoolClient(f"127.0.0.1:{port}", PoolClientConfig(token="good")) as pool:
            assert pool.acquire_writer("job", (0, 127)).epoch == 7
        with PoolClient(f"127.0.0.1:{port}", PoolClientConfig(token="bad")) as pool:
            with pytest.raises(UnauthenticatedError, match="no valid token"):
                pool.acquire_writer("job", (0, 127))
        with PoolClient(f"127.0.0.1:{port}") as pool:
            with pytest.raises(UnauthenticatedError):
                pool.acquire_writer("job", (0, 127))
        assert seen == ["Bearer good", "Bearer bad", None]  # UNAUTHENTICATED is not retried
    finally:
        server.stop(0)


def test_the_package_exports_the_lifecycle_results_of_the_pool_client():
    import client
    from client import pool_client

    for name in ("SavepointInfo", "PinInfo", "CompactionInfo", "GcInfo", "CheckpointInfo", "CommitResult"):
        assert name in client.__all__
        assert getattr(client, name) is getattr(pool_client, name)
    assert all(hasattr(client, name) for name in client.__all__)
