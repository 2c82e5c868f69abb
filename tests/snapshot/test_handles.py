"""Materialisation handles: canonicalise with handles equals a dict model; handles are refused without a store, named when bad."""

from __future__ import annotations

import hashlib
import json

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import snapshot
from snapshot.handles import (
    HANDLE_KEY_PREFIX,
    HANDLE_OP_ID,
    CheckpointHandle,
    FileHandle,
    Handle,
    changelog_snapshot,
    file_handle,
    handle_rows,
    handles_in,
    parse_handle,
)
from snapshot.ttl import TTL_FILTER_KEY, ttl_filter_metadata
from store.handles import StoreHandleResolver
from store.memory import MemoryStore

Model = dict[tuple[int, bytes], bytes]
OPS = [1, 2]
# keys over a few key groups and operator state, so handles, puts and erases collide often
KEYS = [bytes([kg]) + b"s|" + bytes([u]) for kg in (0, 5, 64, 127) for u in range(4)] + [b"\xffoff|" + bytes([u]) for u in range(3)]


def table_of(rows: list[tuple[int, bytes, bytes]]) -> pa.Table:
    return pa.table(
        {
            "op_id": pa.array([r[0] for r in rows], pa.uint64()),
            "key_bytes": pa.array([r[1] for r in rows], pa.binary()),
            "value_bytes": pa.array([r[2] for r in rows], pa.binary()),
        }
    )


def model_of(table: pa.Table) -> Model:
    out = {(o, k): v for o, k, v in zip(*(table.column(c).to_pylist() for c in ("op_id", "key_bytes", "value_bytes")), strict=True)}
    assert len(out) == table.num_rows, "a key appears twice"
    return out


class CheckpointStub:
    """Checkpoint handles answered from tables given here (the real routes are tested against a pool); files from a MemoryStore."""

    def __init__(self, store: MemoryStore, checkpoints: dict[int, pa.Table]) -> None:
        self.files = StoreHandleResolver(store)
        self.checkpoints = checkpoints

    def resolve_handle(self, handle):
        if isinstance(handle, CheckpointHandle):
            return self.checkpoints[handle.checkpoint]  # the whole table: canonicalise must keep only the handle's range
        return self.files.resolve_handle(handle)


row = st.tuples(st.sampled_from(OPS), st.sampled_from(KEYS), st.binary(max_size=4))
distinct_rows = st.lists(row, max_size=12, unique_by=lambda r: (r[0], r[1]))
log_row = st.tuples(st.sampled_from([0, 1, 2]), st.sampled_from(OPS), st.sampled_from(KEYS), st.binary(max_size=4))
handle_spec = st.tuples(st.sampled_from(["file", "checkpoint"]), distinct_rows, st.sampled_from([(0, 127), (0, 63), (5, 64), (127, 127)]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(handles=st.lists(handle_spec, max_size=4), log=st.lists(log_row, max_size=25))
def test_canonicalise_with_handles_equals_a_dict_model(handles, log) -> None:
    store = MemoryStore()
    checkpoints: dict[int, pa.Table] = {}
    made: list[Handle] = []
    model: Model = {}
    for i, (kind, rows, (lo, hi)) in enumerate(handles):
        table = table_of(rows)
        if kind == "file":
            data = snapshot.write_snapshot(table)
            store.put(f"bases/{i}.arrow", data)
            made.append(file_handle(f"bases/{i}.arrow", data))
            model.update({(o, k): v for o, k, v in rows})
        else:
            checkpoints[i + 1] = table
            made.append(CheckpointHandle("job", i + 1, (lo, hi), "0" * 64))
            model.update({(o, k): v for o, k, v in rows if k[0] >= 128 or lo <= k[0] <= hi})
    for kind, o, k, v in log:  # inline materialisation rows come after the handles in the stream, so they win over them
        if kind == 0:
            model[(o, k)] = v
    for kind, o, k, v in log:
        if kind == 1:
            model[(o, k)] = v
        elif kind == 2:
            model.pop((o, k), None)
    log_table = pa.table(
        {
            "row_kind": pa.array([r[0] for r in log], pa.uint8()),
            "op_id": pa.array([r[1] for r in log], pa.uint64()),
            "key_bytes": pa.array([r[2] for r in log], pa.binary()),
            "value_bytes": pa.array([r[3] for r in log], pa.binary()),
        }
    )
    data = changelog_snapshot(made, log_table)
    assert handles_in(data) == made
    out = snapshot.read_snapshot(snapshot.canonicalise_state_snapshot(data, store=CheckpointStub(store, checkpoints)))
    assert not out.is_changelog
    assert model_of(out.table) == model
    if made:
        with pytest.raises(snapshot.HandleNeedsStoreError):
            snapshot.canonicalise_state_snapshot(data)


def test_erases_and_puts_over_a_handle_and_an_empty_handle() -> None:
    store = MemoryStore()
    base = table_of([(1, b"\x00s|a", b"1"), (1, b"\x00s|b", b"2"), (2, b"\xffoff|", b"9")])
    data_a, data_empty = snapshot.write_snapshot(base), snapshot.write_snapshot(table_of([]))
    store.put("a.arrow", data_a)
    store.put("empty.arrow", data_empty)
    log = pa.table(
        {
            "row_kind": pa.array([2, 1, 1, 1], pa.uint8()),
            "op_id": pa.array([1, 1, 1, 1], pa.uint64()),
            "key_bytes": pa.array([b"\x00s|a", b"\x00s|c", b"\x00s|b", b"\x00s|b"], pa.binary()),
            "value_bytes": pa.array([b"", b"new", b"again", b"last"], pa.binary()),
        }
    )
    data = changelog_snapshot([file_handle("a.arrow", data_a), file_handle("empty.arrow", data_empty)], log)
    got = model_of(snapshot.read_snapshot(snapshot.canonicalise_state_snapshot(data, store=store)).table)
    assert got == {(1, b"\x00s|b"): b"last", (1, b"\x00s|c"): b"new", (2, b"\xffoff|"): b"9"}


def test_ttl_filter_applies_after_replay_and_is_consumed() -> None:
    import struct

    store = MemoryStore()
    ttl_key, plain = b"\x01ttl|k", b"\x01v|k"
    base = snapshot.write_snapshot(table_of([(1, ttl_key, struct.pack("<q", 100) + b"x"), (1, plain, struct.pack("<q", 100))]))
    store.put("base.arrow", base)
    log = pa.table(
        {
            "row_kind": pa.array([1], pa.uint8()),
            "op_id": pa.array([1], pa.uint64()),
            "key_bytes": pa.array([b"\x02ttl|late"], pa.binary()),
            "value_bytes": pa.array([struct.pack("<q", 500) + b"y"], pa.binary()),
        }
    )
    data = changelog_snapshot([file_handle("base.arrow", base)], log, extra_metadata=ttl_filter_metadata([(1, "ttl", True)], 200))
    out = snapshot.read_snapshot(snapshot.canonicalise_state_snapshot(data, store=store))
    assert set(model_of(out.table)) == {(1, plain), (1, b"\x02ttl|late")}  # the expired TTL row went; a non-TTL slot stays
    assert TTL_FILTER_KEY not in out.metadata


def _one_handle_stream(value: bytes, op_id: int = HANDLE_OP_ID, key: bytes = HANDLE_KEY_PREFIX + b"0") -> bytes:
    table = handle_rows([FileHandle("x.arrow", "0" * 64, 0)])
    table = pa.table(
        {
            "row_kind": table.column("row_kind"),
            "op_id": pa.array([op_id], pa.uint64()),
            "key_bytes": pa.array([key], pa.binary()),
            "value_bytes": pa.array([value], pa.binary()),
        }
    )
    return snapshot.write_snapshot(table, changelog=True)


@pytest.mark.parametrize(
    ("doc", "named"),
    [
        ({"kind": "file", "path": "../x.arrow", "sha256": "0" * 64, "rows": 0}, "../x.arrow"),
        ({"kind": "file", "path": "/abs/x.arrow", "sha256": "0" * 64, "rows": 0}, "/abs/x.arrow"),
        ({"kind": "file", "path": "a//b", "sha256": "0" * 64, "rows": 0}, "a//b"),
        ({"kind": "file", "path": "x.arrow", "sha256": "nope", "rows": 0}, "file x.arrow"),
        ({"kind": "checkpoint", "job": "j", "checkpoint": 0, "key_groups": [0, 1], "commit_sha256": "0" * 64}, "checkpoint 0 of job j"),
        ({"kind": "checkpoint", "job": "a/b", "checkpoint": 1, "key_groups": [0, 1], "commit_sha256": "0" * 64}, "job a/b"),
        ({"kind": "checkpoint", "job": "j", "checkpoint": 1, "key_groups": [9, 1], "commit_sha256": "0" * 64}, "checkpoint 1 of job j"),
        ({"kind": "other"}, "'other'"),
    ],
)
def test_a_malformed_handle_is_named_before_any_store_is_asked(doc, named) -> None:
    asked = []

    class Recorder:
        def resolve_handle(self, handle):
            asked.append(handle)
            raise AssertionError("not to be asked")

    with pytest.raises(snapshot.MaterialisationHandleError) as caught:
        snapshot.canonicalise_state_snapshot(_one_handle_stream(json.dumps(doc).encode()), store=Recorder())
    assert named in str(caught.value)
    assert asked == []


def test_a_handle_row_must_have_the_reserved_op_and_key() -> None:
    value = json.dumps(FileHandle("x.arrow", "0" * 64, 0).to_dict()).encode()
    for op_id, key in ((7, HANDLE_KEY_PREFIX + b"0"), (HANDLE_OP_ID, b"\x00s|k")):
        with pytest.raises(snapshot.MaterialisationHandleError, match="kind 3"):
            snapshot.canonicalise_state_snapshot(_one_handle_stream(value, op_id, key), store=MemoryStore())


def test_file_handle_checksum_rows_and_absence_are_named() -> None:
    store = MemoryStore()
    data = snapshot.write_snapshot(table_of([(1, b"\x00s|a", b"1")]))
    store.put("a.arrow", data)
    good = file_handle("a.arrow", data)
    cases = [
        (FileHandle("a.arrow", hashlib.sha256(b"other").hexdigest(), 1), snapshot.HandleChecksumError, "SHA-256"),
        (FileHandle("a.arrow", good.sha256, 2), snapshot.HandleChecksumError, "2"),
        (FileHandle("gone.arrow", good.sha256, 1), snapshot.HandleNotFoundError, "file gone.arrow"),
    ]
    for handle, error, text in cases:
        with pytest.raises(error, match=text) as caught:
            snapshot.canonicalise_state_snapshot(changelog_snapshot([handle]), store=store)
        assert handle.path in caught.value.handle


def test_without_a_store_every_reader_refuses_and_names_the_handle() -> None:
    data = changelog_snapshot([CheckpointHandle("orders", 7, (0, 63), "a" * 64)])
    for read in (snapshot.read_snapshot, snapshot.canonicalise_state_snapshot, lambda d: snapshot.merge_snapshot_bytes([d])):
        with pytest.raises(snapshot.HandleNeedsStoreError, match="checkpoint 7 of job orders, key groups 0-63"):
            read(data)
    with pytest.raises(snapshot.InvalidArgumentError, match="resolve_handle"):
        snapshot.canonicalise_state_snapshot(data, store=object())
    # a row kind above 3 is still the old error, handles allowed or not
    table = snapshot.read_snapshot(data, handles=True).table
    table = table.set_column(0, "row_kind", pa.array([4], pa.uint8()))
    with pytest.raises(snapshot.CorruptSnapshotError, match="row_kind 4"):
        snapshot.read_snapshot(snapshot.write_snapshot(table, changelog=True), handles=True)


def test_handle_json_round_trips() -> None:
    for handle in (CheckpointHandle("orders", 3, (4, 9), "b" * 64), FileHandle("x/y.arrow", "c" * 64, 12)):
        assert parse_handle(json.dumps(handle.to_dict())) == handle
