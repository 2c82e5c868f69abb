"""Hostile review of materialisation handles (commit 43f7d0a): wrong state, loose parsing, resource bounds, export equality."""

from __future__ import annotations

import hashlib
import json
import os
import struct

import pyarrow as pa
import pytest

import snapshot
from client import BackendConfig, RemoteReadBackend
from client.pool_client import PoolClient
from snapshot.handles import (
    HANDLE_KEY_PREFIX,
    HANDLE_OP_ID,
    CheckpointHandle,
    FileHandle,
    changelog_snapshot,
    file_handle,
    handle_rows,
    handles_in,
    parse_handle,
)
from snapshot.ttl import ttl_filter_metadata
from store.memory import MemoryStore
from tests.client_fixtures import OFFSET_KEY, OP_COUNT, OP_SOURCE, keyed_keys, serving

NOW_MS = 1_700_000_000_000
TTL_SLOT = "session"


def table_of(rows: list[tuple[int, bytes, bytes]]) -> pa.Table:
    return pa.table(
        {
            "op_id": pa.array([r[0] for r in rows], pa.uint64()),
            "key_bytes": pa.array([r[1] for r in rows], pa.binary()),
            "value_bytes": pa.array([r[2] for r in rows], pa.binary()),
        }
    )


def model_of(data: bytes) -> dict[tuple[int, bytes], bytes]:
    snap = snapshot.read_snapshot(data)
    assert not snap.is_changelog
    t = snap.table
    out = {(o, k): v for o, k, v in zip(*(t.column(c).to_pylist() for c in ("op_id", "key_bytes", "value_bytes")), strict=True)}
    assert len(out) == t.num_rows
    return out


def one_handle_stream(value: bytes, key: bytes = HANDLE_KEY_PREFIX + b"0") -> bytes:
    table = pa.table(
        {
            "row_kind": pa.array([3], pa.uint8()),
            "op_id": pa.array([HANDLE_OP_ID], pa.uint64()),
            "key_bytes": pa.array([key], pa.binary()),
            "value_bytes": pa.array([value], pa.binary()),
        }
    )
    return snapshot.write_snapshot(table, changelog=True)


def ttl_value(expire_at_ms: int, body: bytes) -> bytes:
    return struct.pack("<q", expire_at_ms) + body


def connect(address: str, key_groups: tuple[int, int] = (0, 127), ttl: bool = True) -> RemoteReadBackend:
    backend = RemoteReadBackend.connect(address, "orders", key_groups, BackendConfig(clock_ms=lambda: NOW_MS))
    backend.restore()
    if ttl:
        backend.register_ttl_slot(OP_COUNT, TTL_SLOT)
    return backend


def same_state(changelog: bytes, full: bytes, store: object) -> None:
    got, want = snapshot.read_snapshot(snapshot.canonicalise_state_snapshot(changelog, store=store)), snapshot.read_snapshot(full)
    assert model_of(snapshot.write_snapshot(got.table)) == model_of(snapshot.write_snapshot(want.table))
    assert got.metadata == want.metadata


class Counting:
    """A resolver answering every checkpoint handle with ``rows`` and counting the calls."""

    def __init__(self, rows: pa.Table) -> None:
        self.rows = rows
        self.calls = 0

    def resolve_handle(self, handle):
        self.calls += 1
        return self.rows


# --- defects ---------------------------------------------------------------------------------------------------------


def test_file_handle_to_a_changelog_applies_its_ttl_filter() -> None:
    store = MemoryStore()
    log = pa.table(
        {
            "row_kind": pa.array([1, 1], pa.uint8()),
            "op_id": pa.array([1, 1], pa.uint64()),
            "key_bytes": pa.array([b"\x01ttl|gone", b"\x01ttl|kept"], pa.binary()),
            "value_bytes": pa.array([ttl_value(100, b"x"), ttl_value(900, b"y")], pa.binary()),
        }
    )
    inner = snapshot.write_snapshot(log, changelog=True, extra_metadata=ttl_filter_metadata([(1, "ttl", True)], 500))
    alone = model_of(snapshot.canonicalise_state_snapshot(inner))
    assert set(alone) == {(1, b"\x01ttl|kept")}
    store.put("base.snap", inner)
    via_handle = model_of(snapshot.canonicalise_state_snapshot(changelog_snapshot([file_handle("base.snap", inner)]), store=store))
    assert via_handle == alone


def test_many_handles_are_refused_before_the_store_is_asked_thousands_of_times() -> None:
    handles = [CheckpointHandle("orders", 1, (0, 127), "a" * 64)] * 5000
    data = changelog_snapshot(handles)
    assert len(data) < 1_000_000  # a small stream
    resolver = Counting(table_of([(1, b"\x00v|k", b"x" * 1000)]))
    try:
        snapshot.canonicalise_state_snapshot(data, store=resolver)
    except snapshot.ClinkError:
        pass
    assert resolver.calls <= 1024, f"the resolver was asked {resolver.calls} times by a {len(data)}-byte stream"


def test_a_handle_with_duplicate_keys_is_refused() -> None:
    value = b'{"kind":"file","path":"a.arrow","sha256":"' + b"0" * 64 + b'","rows":0,"kind":"checkpoint","job":"orders",'
    value += b'"checkpoint":1,"key_groups":[0,127],"commit_sha256":"' + b"a" * 64 + b'"}'
    with pytest.raises(snapshot.MaterialisationHandleError, match="(?i)duplicate"):
        handles_in(one_handle_stream(value))


def test_a_handle_with_an_unknown_field_is_refused() -> None:
    doc = {**CheckpointHandle("orders", 1, (0, 63), "a" * 64).to_dict(), "exclude_operators": [7]}
    with pytest.raises(snapshot.MaterialisationHandleError, match="exclude_operators"):
        handles_in(one_handle_stream(json.dumps(doc).encode()))


def test_a_handle_key_must_carry_its_position() -> None:
    value = json.dumps(FileHandle("x.arrow", "0" * 64, 0).to_dict()).encode()
    with pytest.raises(snapshot.MaterialisationHandleError):
        handles_in(one_handle_stream(value, key=HANDLE_KEY_PREFIX + b"not-a-number"))


def _history(backend: RemoteReadBackend, keys: list[bytes], ttl_keys: list[bytes]) -> None:
    backend.put_many(OP_COUNT, keys, [b"v0-%d" % i for i in range(len(keys))])
    for i, k in enumerate(ttl_keys):
        backend.put(OP_COUNT, k, ttl_value(NOW_MS - 1 if i % 2 else NOW_MS + 60_000, b"t%d" % i))
    backend.put(OP_SOURCE, OFFSET_KEY, struct.pack("<q", 41))
    backend.snapshot(1)
    backend.refresh_completion()
    for k in keys[:5]:
        backend.erase(OP_COUNT, k)
    backend.put(OP_COUNT, keys[5], b"changed")


def test_export_equals_full_export_across_backend_situations(pool_store) -> None:
    """Pending checkpoint, restore to a smaller range, rewind to an older checkpoint, erases, TTL and operator state."""
    keys, ttl_keys = keyed_keys(200, seed=11), keyed_keys(10, seed=12, slot=TTL_SLOT)
    with serving(pool_store) as address, PoolClient(address) as client:
        backend = connect(address)
        try:
            _history(backend, keys, ttl_keys)
            same_state(backend.export_changelog_snapshot(), backend.export_arrow_snapshot(), pool_store)
            # a checkpoint committed but not yet known complete: its writes are still local, the handle names checkpoint 1
            backend.snapshot(2)
            backend.put(OP_COUNT, keys[6], b"after-2")
            backend.erase(OP_SOURCE, OFFSET_KEY)
            same_state(backend.export_changelog_snapshot(), backend.export_arrow_snapshot(), client)
            backend.refresh_completion()
            assert handles_in(backend.export_changelog_snapshot())[0].checkpoint == 2
            same_state(backend.export_changelog_snapshot(), backend.export_arrow_snapshot(), pool_store)
            # rewind to checkpoint 1 with a smaller range
            backend.restore(1, key_groups=(10, 70))
            backend.put(OP_COUNT, next(k for k in keys if 10 <= k[0] <= 70), b"rewound")
            changelog = backend.export_changelog_snapshot()
            (handle,) = handles_in(changelog)
            assert (handle.checkpoint, handle.key_groups) == (1, (10, 70))
            same_state(changelog, backend.export_arrow_snapshot(), pool_store)
            same_state(changelog, backend.export_arrow_snapshot(), client)
        finally:
            backend.close()


def test_recommitted_checkpoint_id_is_not_exported_as_this_backends_state(pool_store) -> None:
    """Checkpoint 1 deleted and committed again by a newer attempt: the old backend's exports must agree (both fail or equal)."""
    keys = keyed_keys(20, seed=1)
    with serving(pool_store) as address:
        a = connect(address, ttl=False)
        b = None
        try:
            a.put_many(OP_COUNT, keys, [b"a"] * len(keys))
            a.snapshot(1)
            a.refresh_completion()
            a.put(OP_COUNT, keys[0], b"a-delta")
            with PoolClient(address) as client:
                client.delete_checkpoint("orders", 1)
            b = connect(address, ttl=False)
            b.put_many(OP_COUNT, keys[:5], [b"b"] * 5)
            b.snapshot(1)
            b.refresh_completion()
            outcomes = []
            for export in (a.export_arrow_snapshot, a.export_changelog_snapshot):
                try:
                    data = export()
                    outcomes.append(model_of(snapshot.canonicalise_state_snapshot(data, store=pool_store)))
                except snapshot.ClinkError as exc:
                    outcomes.append(type(exc))
            assert outcomes[0] == outcomes[1]
            if isinstance(outcomes[0], dict):  # never B's rows passed off as A's state
                assert b"b" not in outcomes[0].values()
        finally:
            a.close()
            if b is not None:
                b.close()


def test_a_deleted_and_recreated_checkpoint_id_fails_the_handle(pool_store) -> None:
    keys = keyed_keys(20, seed=2)
    with serving(pool_store) as address:
        a = connect(address, ttl=False)
        a.put_many(OP_COUNT, keys, [b"a"] * len(keys))
        a.snapshot(1)
        a.refresh_completion()
        changelog = a.export_changelog_snapshot()
        a.close()
        with PoolClient(address) as client:
            client.delete_checkpoint("orders", 1)
            b = connect(address, ttl=False)
            b.put_many(OP_COUNT, keys, [b"b"] * len(keys))
            b.snapshot(1)
            b.refresh_completion()
            b.close()
            for store in (pool_store, client):
                with pytest.raises(snapshot.HandleChecksumError) as caught:
                    snapshot.canonicalise_state_snapshot(changelog, store=store)
                assert "checkpoint 1 of job orders" in caught.value.handle


# --- properties that hold ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        b"\xff\xfe{not utf-8",
        b"[1, 2]",
        json.dumps({"kind": "checkpoint", "job": "o", "checkpoint": True, "key_groups": [0, 1], "commit_sha256": "a" * 64}).encode(),
        json.dumps({"kind": "checkpoint", "job": "o", "checkpoint": 1.0, "key_groups": [0, 1], "commit_sha256": "a" * 64}).encode(),
        json.dumps({"kind": "checkpoint", "job": "o", "checkpoint": 1, "key_groups": [0, 10**30], "commit_sha256": "a" * 64}).encode(),
        json.dumps({"kind": "checkpoint", "job": "o", "checkpoint": 1, "key_groups": [0, 1], "commit_sha256": "A" * 64}).encode(),
        json.dumps({"kind": "file", "path": "x.arrow", "sha256": "0" * 64, "rows": -1}).encode(),
        json.dumps({"kind": "file", "path": "x.arrow", "sha256": "0" * 64}).encode(),
        json.dumps({"kind": "file", "path": "C:/x.arrow", "sha256": "0" * 64, "rows": 0}).encode(),
        json.dumps({"kind": "file", "path": "a\\..\\..\\x", "sha256": "0" * 64, "rows": 0}).encode(),
        b'{"kind": "file", "path": "x.arrow", "sha256": "' + b"0" * 64 + b'", "rows": NaN}',
    ],
)
def test_malformed_handles_are_typed_errors_before_any_fetch(value: bytes) -> None:
    resolver = Counting(table_of([]))
    with pytest.raises(snapshot.MaterialisationHandleError):
        snapshot.canonicalise_state_snapshot(one_handle_stream(value), store=resolver)
    assert resolver.calls == 0


def test_huge_numbers_are_named_not_crashes(pool_store) -> None:
    data = changelog_snapshot([CheckpointHandle("orders", 10**30, (0, 127), "a" * 64), FileHandle("x.arrow", "0" * 64, 10**30)])
    with serving(pool_store) as address, PoolClient(address) as client:
        for store in (pool_store, client, MemoryStore()):
            with pytest.raises(snapshot.MaterialisationHandleError) as caught:
                snapshot.canonicalise_state_snapshot(data, store=store)
            assert "checkpoint 1000000000000000000000000000000 of job orders" in str(caught.value)


def test_file_handles_stay_inside_a_file_store(tmp_path, make_file_store) -> None:
    store = make_file_store("root")
    outside = tmp_path / "secret.arrow"
    data = snapshot.write_snapshot(table_of([(1, b"\x00v|s", b"secret")]))
    outside.write_bytes(data)
    store.root.mkdir(parents=True, exist_ok=True)
    os.symlink(tmp_path, store.root / "link")
    for path in ("link/secret.arrow", "%2e%2e/secret.arrow"):
        handle = FileHandle(path, hashlib.sha256(data).hexdigest(), 1)
        with pytest.raises(snapshot.MaterialisationHandleError) as caught:
            snapshot.canonicalise_state_snapshot(changelog_snapshot([handle]), store=store)
        assert path in caught.value.handle


def test_sha_and_rows_mismatches_are_detected_and_named() -> None:
    store = MemoryStore()
    data = snapshot.write_snapshot(table_of([(1, b"\x00v|a", b"1"), (1, b"\x00v|b", b"2")]))
    store.put("a.arrow", data)
    store.put("b.arrow", data[:-8] + bytes(8))  # same length, other bytes
    for handle in (FileHandle("a.arrow", hashlib.sha256(data).hexdigest(), 3), FileHandle("b.arrow", hashlib.sha256(data).hexdigest(), 2)):
        with pytest.raises(snapshot.HandleChecksumError) as caught:
            snapshot.canonicalise_state_snapshot(changelog_snapshot([handle]), store=store)
        assert caught.value.handle == handle.describe()


def test_rows_a_resolver_returns_outside_the_handle_range_are_dropped() -> None:
    rows = table_of([(1, b"\x00v|in", b"1"), (1, b"\x05v|out", b"2"), (1, b"\xffoff|", b"3")])
    data = changelog_snapshot([CheckpointHandle("orders", 1, (0, 3), "a" * 64)])
    assert set(model_of(snapshot.canonicalise_state_snapshot(data, store=Counting(rows)))) == {(1, b"\x00v|in"), (1, b"\xffoff|")}


def test_an_old_reader_refuses_a_handle_stream() -> None:
    """A version-1 reader that validates row_kind 0..2 (as the contract says every one does) refuses the stream."""
    data = changelog_snapshot([CheckpointHandle("orders", 1, (0, 127), "a" * 64)])
    table = pa.ipc.open_stream(data).read_all()
    assert max(table.column("row_kind").to_pylist()) > snapshot.ROW_ERASE
    with pytest.raises(snapshot.HandleNeedsStoreError, match="checkpoint 1 of job orders"):
        snapshot.read_snapshot(data)
    with pytest.raises(snapshot.HandleNeedsStoreError):
        snapshot.canonicalise_state_snapshot(data)
    assert parse_handle(table.column("value_bytes")[0].as_py()) == CheckpointHandle("orders", 1, (0, 127), "a" * 64)
    assert handle_rows([]).num_rows == 0
