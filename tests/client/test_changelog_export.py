"""export_changelog_snapshot against a real pool over moto: canonicalised by store and by pool it equals export_arrow_snapshot."""

from __future__ import annotations

import json
import struct

import pyarrow as pa
import pytest

import snapshot
from client import BackendConfig, RemoteReadBackend
from client.changelog_export import PoolHandleResolver
from client.pool_client import PoolClient
from snapshot.handles import HANDLE_KEY_PREFIX, CheckpointHandle, handle_positions, handles_in
from store.handles import StoreHandleResolver
from store.objects import ObjectStore
from tests.client_fixtures import OFFSET_KEY, OP_COUNT, OP_SOURCE, keyed_keys, serving

NOW_MS = 1_700_000_000_000
TTL_SLOT = "session"


def ttl_value(expire_at_ms: int, body: bytes) -> bytes:
    return struct.pack("<q", expire_at_ms) + body


def sorted_snapshot(data: bytes) -> tuple[pa.Table, dict[bytes, bytes]]:
    snap = snapshot.read_snapshot(data)
    assert not snap.is_changelog
    return snapshot.sort_for_layout(snap.table.replace_schema_metadata(None)), snap.metadata


def assert_same_state(got: bytes, want: bytes) -> None:
    got_table, got_meta = sorted_snapshot(got)
    want_table, want_meta = sorted_snapshot(want)
    assert got_table.num_rows == want_table.num_rows
    assert got_table.equals(want_table)
    assert got_meta == want_meta


def connect(address: str, key_groups: tuple[int, int] = (0, 127)) -> RemoteReadBackend:
    backend = RemoteReadBackend.connect(address, "orders", key_groups, BackendConfig(clock_ms=lambda: NOW_MS))
    backend.restore()
    backend.register_ttl_slot(OP_COUNT, TTL_SLOT)
    return backend


def write_history(backend: RemoteReadBackend, keys: list[bytes], ttl_keys: list[bytes]) -> None:
    """Puts, a bulk put, TTL rows expired and live, operator state, then a checkpoint; then more puts, erases, TTL changes."""
    backend.put_many(OP_COUNT, keys, [b"v0-%d" % i for i in range(len(keys))])
    for i, k in enumerate(ttl_keys):
        backend.put(OP_COUNT, k, ttl_value(NOW_MS - 1 if i % 2 else NOW_MS + 60_000, b"t%d" % i))
    backend.put(OP_SOURCE, OFFSET_KEY, struct.pack("<q", 41))
    backend.set_state_version(OP_COUNT, "value", 2)
    backend.snapshot(1)
    assert backend.read_checkpoint == 1
    for k in keys[:10]:
        backend.erase(OP_COUNT, k)  # erases of keys the checkpoint holds
    for i, k in enumerate(keys[10:20]):
        backend.put(OP_COUNT, k, b"again-%d" % i)
        backend.put(OP_COUNT, k, b"last-%d" % i)  # repeated puts to one key: the newest wins
    backend.put(OP_COUNT, ttl_keys[0], ttl_value(NOW_MS - 5, b"expired-now"))  # a live TTL row expires by a later write
    backend.put(OP_COUNT, snapshot.encode_keyed_key("v", b"brand-new"), b"new")
    backend.put(OP_SOURCE, OFFSET_KEY, struct.pack("<q", 42))
    backend.set_state_version(OP_SOURCE, "offsets", 3)


@pytest.fixture
def keys() -> list[bytes]:
    return keyed_keys(300, seed=7)


@pytest.fixture
def ttl_keys() -> list[bytes]:
    return keyed_keys(20, seed=8, slot=TTL_SLOT)


def test_changelog_export_resolved_by_store_and_by_pool_equals_export(pool_store: ObjectStore, keys, ttl_keys) -> None:
    with serving(pool_store) as address, connect(address) as backend:
        write_history(backend, keys, ttl_keys)
        changelog = backend.export_changelog_snapshot()
        full = backend.export_arrow_snapshot()
        (handle,) = handles_in(changelog)
        assert isinstance(handle, CheckpointHandle)
        assert (handle.job, handle.checkpoint, handle.key_groups) == ("orders", 1, (0, 127))
        assert len(changelog) < len(full)
        # the store route: the pool's own bucket, opened as any reader would
        assert_same_state(snapshot.canonicalise_state_snapshot(changelog, store=StoreHandleResolver(pool_store)), full)
        assert_same_state(snapshot.canonicalise_state_snapshot(changelog, store=pool_store), full)
        # the pool route
        with PoolClient(address) as client:
            assert_same_state(snapshot.canonicalise_state_snapshot(changelog, store=PoolHandleResolver(client)), full)
            assert_same_state(snapshot.canonicalise_state_snapshot(changelog, store=client), full)
        rows = snapshot.read_snapshot(full).table
        assert rows.num_rows > 0 and b"expired-now" not in rows.column("value_bytes").to_pylist()


def test_subtask_ranges_each_resolve_to_their_export(pool_store: ObjectStore, keys, ttl_keys) -> None:
    with serving(pool_store) as address:
        backends = [connect(address, (0, 63)), connect(address, (64, 127))]
        try:
            for b in backends:
                lo, hi = b.key_groups
                own = [k for k in keys if lo <= k[0] <= hi]
                b.put_many(OP_COUNT, own, [b"x"] * len(own))
                b.snapshot(1)
            for b in backends:
                b.refresh_completion()
                own = [k for k in keys if b.key_groups[0] <= k[0] <= b.key_groups[1]]
                b.erase(OP_COUNT, own[0])
                changelog = b.export_changelog_snapshot()
                (handle,) = handles_in(changelog)
                assert isinstance(handle, CheckpointHandle) and handle.key_groups == b.key_groups
                assert_same_state(snapshot.canonicalise_state_snapshot(changelog, store=pool_store), b.export_arrow_snapshot())
        finally:
            for b in backends:
                b.close()


def test_before_any_checkpoint_there_is_no_handle(pool_store: ObjectStore, keys, ttl_keys) -> None:
    with serving(pool_store) as address, connect(address) as backend:
        backend.put_many(OP_COUNT, keys, [b"v"] * len(keys))
        backend.erase(OP_COUNT, keys[0])
        backend.put(OP_COUNT, ttl_keys[0], ttl_value(NOW_MS - 1, b"gone"))
        backend.put(OP_COUNT, ttl_keys[1], ttl_value(NOW_MS + 1, b"kept"))
        changelog = backend.export_changelog_snapshot()
        assert handles_in(changelog) == []
        snap = snapshot.read_snapshot(changelog)  # a plain changelog: any version-1 reader replays it right
        assert snap.is_changelog and snapshot.ttl.TTL_FILTER_KEY not in snap.metadata
        assert_same_state(snapshot.canonicalise_state_snapshot(changelog), backend.export_arrow_snapshot())


def test_survives_a_copy_of_the_store_and_compaction(pool_store: ObjectStore, make_s3_store, keys, ttl_keys) -> None:
    with serving(pool_store) as address, connect(address) as backend:
        write_history(backend, keys, ttl_keys)
        backend.put(OP_COUNT, keys[50], b"second")
        backend.snapshot(2)
        backend.put(OP_COUNT, keys[51], b"after-2")
        changelog = backend.export_changelog_snapshot()
        full = backend.export_arrow_snapshot()
        copy = make_s3_store(prefix="copied/elsewhere")
        for info in pool_store.list(""):
            copy.put(info.key, pool_store.get(info.key))
        assert_same_state(snapshot.canonicalise_state_snapshot(changelog, store=copy), full)
        with PoolClient(address) as client:
            client.compact_checkpoint("orders", 2, force=True)
            assert_same_state(snapshot.canonicalise_state_snapshot(changelog, store=client), full)
        assert_same_state(snapshot.canonicalise_state_snapshot(changelog, store=pool_store), full)


def _tampered(changelog: bytes, **changes: object) -> bytes:
    snap = snapshot.read_snapshot(changelog, handles=True)
    table = snap.table
    pos = int(handle_positions(table)[0])
    doc = json.loads(table.column("value_bytes")[pos].as_py())
    doc.update(changes)
    values = table.column("value_bytes").to_pylist()
    values[pos] = json.dumps(doc).encode()
    table = table.set_column(3, "value_bytes", pa.array(values, pa.binary()))
    return snapshot.write_snapshot(table, snap.state_versions, snap.extra_metadata, changelog=True)


@pytest.mark.parametrize(
    ("changes", "error", "named"),
    [
        ({"commit_sha256": "0" * 64}, snapshot.HandleChecksumError, "checkpoint 2 of job orders"),
        ({"checkpoint": 1}, snapshot.HandleChecksumError, "checkpoint 1 of job orders"),  # there, but another commit
        ({"checkpoint": 9}, snapshot.HandleNotFoundError, "checkpoint 9 of job orders"),
        ({"job": "other"}, snapshot.HandleNotFoundError, "checkpoint 2 of job other"),
        ({"key_groups": [0, 200]}, snapshot.MaterialisationHandleError, "checkpoint 2 of job orders"),
        ({"kind": "file", "path": "../jobs/orders/x.arrow", "sha256": "0" * 64, "rows": 1}, snapshot.MaterialisationHandleError, ".."),
        ({"kind": "file", "path": "/etc/passwd", "sha256": "0" * 64, "rows": 1}, snapshot.MaterialisationHandleError, "/etc/passwd"),
        ({"kind": "mystery"}, snapshot.MaterialisationHandleError, "mystery"),
    ],
)
def test_a_tampered_handle_is_named(pool_store: ObjectStore, keys, ttl_keys, changes, error, named) -> None:
    with serving(pool_store) as address, connect(address) as backend:
        write_history(backend, keys, ttl_keys)
        backend.snapshot(2)  # the handle names checkpoint 2; checkpoint 1 is there too, another commit
        backend.put(OP_COUNT, keys[0], b"x")
        bad = _tampered(backend.export_changelog_snapshot(), **changes)
        with PoolClient(address) as client:
            for store in (pool_store, client):
                with pytest.raises(error) as caught:
                    snapshot.canonicalise_state_snapshot(bad, store=store)
                assert named in str(caught.value)
                assert named in caught.value.handle
                assert isinstance(caught.value, snapshot.MaterialisationHandleError)


def test_without_a_store_a_handle_is_refused_naming_it(pool_store: ObjectStore, keys, ttl_keys) -> None:
    with serving(pool_store) as address, connect(address) as backend:
        write_history(backend, keys, ttl_keys)
        changelog = backend.export_changelog_snapshot()
    for read in (snapshot.read_snapshot, snapshot.canonicalise_state_snapshot, lambda d: snapshot.merge_snapshot_bytes([d])):
        with pytest.raises(snapshot.HandleNeedsStoreError, match="checkpoint 1 of job orders, key groups 0-127"):
            read(changelog)
    # what a version-1 reader that never heard of handles sees: a row kind outside 0..2 in the ordinary changelog schema
    table = pa.ipc.open_stream(changelog).read_all()
    kinds = set(table.column("row_kind").to_pylist())
    assert 3 in kinds and kinds <= {1, 2, 3}
    assert all(
        k.startswith(HANDLE_KEY_PREFIX)
        for k, r in zip(table.column("key_bytes").to_pylist(), table.column("row_kind").to_pylist(), strict=True)
        if r == 3
    )
