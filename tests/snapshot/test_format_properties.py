"""Hypothesis properties of snapshot/: round-trips, replay, overlay, merge and key-group filters against dict models."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import snapshot
from snapshot import (
    CANONICAL_SCHEMA,
    CHANGELOG_SCHEMA,
    ROW_ERASE,
    ROW_MATERIALISATION,
    ClinkError,
    CorruptSnapshotError,
    InvalidArgumentError,
    StateVersionMap,
    UnsupportedFormatVersionError,
)
from snapshot.format import FORMAT_VERSION_KEY, STATE_VERSIONS_KEY

PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# few distinct operators and keys, so that collisions (same key, other operator; same key twice) are common
op_ids = st.one_of(st.sampled_from([0, 1, 7, 2**63, 2**64 - 1]), st.integers(0, 2**64 - 1))
few_ops = st.sampled_from([3, 4, 2**64 - 1])
slots = st.sampled_from(["count", "profile", "w", "окно"])
user_keys = st.one_of(st.integers(0, 5).map(lambda i: i.to_bytes(8, "little")), st.binary(max_size=4))
keyed_keys = st.builds(snapshot.encode_keyed_key, slots, user_keys)
operator_keys = st.builds(snapshot.encode_operator_key, st.sampled_from(["offsets", "bcast"]), st.sampled_from([b"p0", b"p1", b""]))
raw_keys = st.binary(max_size=5).filter(lambda b: b"|" not in b)
any_keys = st.one_of(keyed_keys, operator_keys, raw_keys)
int8_values = st.integers(-(2**63), 2**63 - 1).map(lambda i: i.to_bytes(8, "little", signed=True))
values = st.one_of(st.binary(max_size=12), int8_values)
row_kinds = st.sampled_from([0, 1, 2])

state_types = st.text(st.characters(exclude_characters="|\n", exclude_categories=("Cs",)), min_size=1, max_size=8)
version_maps = st.dictionaries(st.tuples(op_ids, state_types), st.integers(0, 2**32 - 1), max_size=4).map(StateVersionMap)
extra_metadata = st.dictionaries(
    st.binary(min_size=1, max_size=10).filter(lambda k: k not in (FORMAT_VERSION_KEY, STATE_VERSIONS_KEY)),
    st.binary(max_size=16),
    max_size=3,
)

Row = tuple[int, bytes, bytes]


def canonical_table(rows: list[Row], pieces: int = 1) -> pa.Table:
    """A canonical table of ``rows``, split into up to ``pieces`` chunks."""
    table = pa.Table.from_pydict(
        {"op_id": [r[0] for r in rows], "key_bytes": [r[1] for r in rows], "value_bytes": [r[2] for r in rows]}, schema=CANONICAL_SCHEMA
    )
    return _chunked(table, pieces)


def changelog_table(rows: list[tuple[int, int, bytes, bytes]], pieces: int = 1) -> pa.Table:
    """A changelog table of (row_kind, op_id, key, value) rows, split into up to ``pieces`` chunks."""
    cols = list(zip(*rows, strict=True)) if rows else [[], [], [], []]
    table = pa.Table.from_arrays([pa.array(list(c), f.type) for c, f in zip(cols, CHANGELOG_SCHEMA, strict=True)], schema=CHANGELOG_SCHEMA)
    return _chunked(table, pieces)


def _chunked(table: pa.Table, pieces: int) -> pa.Table:
    if pieces <= 1 or table.num_rows < 2:
        return table
    step = -(-table.num_rows // pieces)
    return pa.concat_tables([table.slice(i, step) for i in range(0, table.num_rows, step)])


def rows_of(table: pa.Table) -> list[Row]:
    """Rows in table order."""
    cols = table.select(["op_id", "key_bytes", "value_bytes"]).to_pydict()
    return list(zip(cols["op_id"], cols["key_bytes"], cols["value_bytes"], strict=True))


def as_dict(table: pa.Table) -> dict[tuple[int, bytes], bytes]:
    """Rows keyed by (op_id, key_bytes); a canonical result has no repeats."""
    rows = rows_of(table)
    result = {(o, k): v for o, k, v in rows}
    assert len(result) == len(rows), "a canonical result must hold one row per (op_id, key_bytes)"
    return result


def replay_model(base: dict[tuple[int, bytes], bytes], log: list[tuple[int, int, bytes, bytes]]) -> dict[tuple[int, bytes], bytes]:
    """Plain-dict replay: materialisation rows first (in order), then puts and erases in stream order."""
    state = dict(base)
    for kind, op, key, value in [r for r in log if r[0] == ROW_MATERIALISATION] + [r for r in log if r[0] != ROW_MATERIALISATION]:
        if kind == ROW_ERASE:
            state.pop((op, key), None)
        else:
            state[(op, key)] = value
    return state


def lead(key: bytes) -> int:
    return key[0] if key else 0


# --- write -> read ----------------------------------------------------------------------------------------


@PROPS
@given(
    rows=st.lists(st.tuples(op_ids, any_keys, values), max_size=25),
    kinds=st.lists(row_kinds, min_size=25, max_size=25),
    versions=version_maps,
    extra=extra_metadata,
    changelog=st.booleans(),
    pieces=st.integers(1, 3),
)
def test_write_then_read_round_trips(rows, kinds, versions, extra, changelog, pieces) -> None:
    if changelog:
        table = changelog_table([(k, *r) for k, r in zip(kinds, rows, strict=False)], pieces)
    else:
        table = canonical_table(rows, pieces)
    writer = snapshot.SnapshotArrowWriter(versions, extra, changelog=changelog)
    blob = writer.write(table)
    assert writer.write_buffer(table).to_pybytes() == blob

    snap = snapshot.read_snapshot(blob)
    assert snap.is_changelog == changelog
    assert snap.table.equals(table.combine_chunks())
    assert snap.table.schema.equals(CHANGELOG_SCHEMA if changelog else CANONICAL_SCHEMA)
    assert snap.format_version == 1 and snap.metadata[FORMAT_VERSION_KEY] == b"1"
    assert snap.state_versions == versions
    assert (STATE_VERSIONS_KEY in snap.metadata) == bool(versions)
    assert snap.extra_metadata == extra
    # any Arrow reader sees the same: one batch, the same rows
    raw = ipc.open_stream(blob)
    batches = list(raw)
    assert len(batches) == 1 and pa.Table.from_batches(batches).equals(table.combine_chunks())

    sink = io.BytesIO()
    writer.write_to(sink, table)
    assert sink.getvalue() == blob
    assert snapshot.read_snapshot(pa.BufferReader(blob)).table.equals(snap.table)


@PROPS
@given(versions=version_maps)
def test_state_version_map_pack_round_trips(versions) -> None:
    packed = versions.pack()
    assert StateVersionMap.unpack(packed) == versions
    assert StateVersionMap.unpack(packed.encode()) == versions
    assert packed == "" if not versions else len(packed.split("\n")) == len(versions)


@PROPS
@given(slot=st.text(max_size=6), user_key=st.binary(max_size=10))
def test_keys_encode_and_decode(slot, user_key) -> None:
    if "|" in slot or "\n" in slot or slot == snapshot.RAW_SLOT:
        with pytest.raises(InvalidArgumentError):
            snapshot.encode_keyed_key(slot, user_key)
        with pytest.raises(InvalidArgumentError):
            snapshot.encode_operator_key(slot, user_key)
        return
    keyed = snapshot.decode_key(snapshot.encode_keyed_key(slot, user_key))
    assert (keyed.kind, keyed.key_group, keyed.slot, keyed.user_key) == ("keyed", snapshot.key_group(user_key), slot, user_key)
    op = snapshot.decode_key(snapshot.encode_operator_key(slot, user_key))
    assert (op.kind, op.key_group, op.slot, op.user_key) == ("operator", None, slot, user_key)


# --- changelog replay and overlay -------------------------------------------------------------------------


@PROPS
@given(
    log=st.lists(st.tuples(row_kinds, few_ops, st.one_of(keyed_keys, operator_keys), values), max_size=40),
    versions=version_maps,
    extra=extra_metadata,
    pieces=st.integers(1, 3),
)
def test_canonicalise_changelog_equals_dict_replay(log, versions, extra, pieces) -> None:
    blob = snapshot.write_snapshot(changelog_table(log, pieces), versions, extra, changelog=True)
    out = snapshot.read_snapshot(snapshot.canonicalise_state_snapshot(blob))
    assert not out.is_changelog
    assert as_dict(out.table) == replay_model({}, log)
    assert out.state_versions == versions
    assert out.extra_metadata == extra
    assert as_dict(snapshot.canonical_from_changelog(changelog_table(log))) == replay_model({}, log)


@PROPS
@given(
    base=st.dictionaries(st.tuples(few_ops, st.one_of(keyed_keys, operator_keys)), values, max_size=30),
    log=st.lists(st.tuples(row_kinds, few_ops, st.one_of(keyed_keys, operator_keys), values), max_size=30),
    base_pieces=st.integers(1, 3),
    log_pieces=st.integers(1, 3),
)
def test_overlay_equals_dict_model(base, log, base_pieces, log_pieces) -> None:
    base_table = canonical_table([(o, k, v) for (o, k), v in base.items()], base_pieces)
    out = snapshot.overlay(base_table, changelog_table(log, log_pieces))
    assert out.schema.equals(CANONICAL_SCHEMA)
    assert as_dict(out) == replay_model(base, log)


@PROPS
@given(
    base=st.dictionaries(st.tuples(st.just(9), keyed_keys), values, max_size=30),
    log=st.lists(st.tuples(st.sampled_from([1, 2]), st.just(9), keyed_keys, values), max_size=30),
)
def test_overlay_single_operator_equals_dict_model(base, log) -> None:
    out = snapshot.overlay(canonical_table([(o, k, v) for (o, k), v in base.items()]), changelog_table(log))
    assert as_dict(out) == replay_model(base, log)


def test_overlay_distinguishes_operators_sharing_key_bytes() -> None:
    key = snapshot.encode_keyed_key("count", b"k")
    base = canonical_table([(1, key, b"one"), (2, key, b"two")])
    out = snapshot.overlay(base, changelog_table([(1, 1, key, b"ONE")]))
    assert as_dict(out) == {(1, key): b"ONE", (2, key): b"two"}
    out = snapshot.overlay(base, changelog_table([(2, 2, key, b""), (1, 3, b"other", b"x")]))
    assert as_dict(out) == {(1, key): b"one", (3, b"other"): b"x"}


def test_canonical_writer_refuses_a_changelog_table() -> None:
    log = changelog_table([(ROW_ERASE, 1, b"\x01a|b", b"")])
    with pytest.raises(InvalidArgumentError, match="row_kind"):
        snapshot.write_snapshot(log)
    assert snapshot.read_snapshot(snapshot.write_snapshot(log, changelog=True)).is_changelog


@pytest.mark.parametrize("changelog", [False, True], ids=["canonical", "changelog"])
def test_writer_refuses_missing_columns_and_nulls(changelog: bool) -> None:
    kinds = {"row_kind": pa.array([1], pa.uint8())} if changelog else {}
    with pytest.raises(InvalidArgumentError, match="value_bytes missing"):
        snapshot.write_snapshot(pa.table({**kinds, "op_id": _OPS, "key_bytes": _KEYS}), changelog=changelog)
    nulls = {**kinds, "op_id": _OPS, "key_bytes": pa.array([None], pa.binary()), "value_bytes": _VALS}
    with pytest.raises(InvalidArgumentError, match="key_bytes has 1 null"):
        snapshot.write_snapshot(pa.table(nulls), changelog=changelog)


def test_overlay_refuses_a_canonical_table_as_changelog() -> None:
    with pytest.raises(InvalidArgumentError, match="row_kind"):
        snapshot.overlay(canonical_table([]), canonical_table([(1, b"k", b"v")]))


# --- merge ------------------------------------------------------------------------------------------------


def merge_model(parts: list[list[Row]]) -> dict[tuple[int, bytes], bytes]:
    """One row per (op_id, key): operator-state keys whose values are all 8 bytes keep the greatest int64, else the first."""
    seen: dict[tuple[int, bytes], list[bytes]] = {}
    for part in parts:
        for o, k, v in part:
            seen.setdefault((o, k), []).append(v)
    result = {}
    for (o, k), vs in seen.items():
        if lead(k) >= 128 and all(len(v) == 8 for v in vs):
            result[(o, k)] = max(vs, key=lambda v: int.from_bytes(v, "little", signed=True))
        else:
            result[(o, k)] = vs[0]
    return result


@PROPS
@given(data=st.data(), n_parts=st.integers(1, 4))
def test_merge_of_disjoint_keyed_snapshots(data, n_parts) -> None:
    keyed = data.draw(st.dictionaries(st.tuples(few_ops, keyed_keys), values, max_size=30), label="keyed rows")
    owner = data.draw(st.lists(st.integers(0, n_parts - 1), min_size=len(keyed), max_size=len(keyed)), label="owner of each keyed row")
    parts: list[list[Row]] = [[] for _ in range(n_parts)]
    for ((o, k), v), p in zip(keyed.items(), owner, strict=True):
        parts[p].append((o, k, v))
    for p in range(n_parts):  # every subtask holds its own copy of operator state: these collide
        op_state = data.draw(st.dictionaries(st.tuples(few_ops, operator_keys), values, max_size=4), label=f"operator state {p}")
        parts[p].extend((o, k, v) for (o, k), v in op_state.items())
    metas = [(data.draw(version_maps, label=f"versions {p}"), data.draw(extra_metadata, label=f"extra {p}")) for p in range(n_parts)]
    blobs = [snapshot.write_snapshot(canonical_table(rows), v, e) for rows, (v, e) in zip(parts, metas, strict=True)]

    merged = snapshot.read_snapshot(snapshot.merge_snapshot_bytes(blobs))
    got = as_dict(merged.table)
    assert got == merge_model(parts)
    assert all(got[(o, k)] == v for (o, k), v in keyed.items()), "every keyed row survives the merge"
    source = next((m for rows, m in zip(parts, metas, strict=True) if rows), metas[0])
    assert merged.state_versions == source[0]
    assert merged.extra_metadata == source[1]
    assert as_dict(snapshot.merge_tables([canonical_table(rows) for rows in parts])) == got


@PROPS
@given(a=int8_values, b=int8_values, other=st.binary(max_size=12))
def test_merge_collision_rule_for_operator_state(a, b, other) -> None:
    key = snapshot.encode_operator_key("offsets", b"p0")
    bigger = max(a, b, key=lambda v: int.from_bytes(v, "little", signed=True))
    for first, second in ((a, b), (b, a)):
        out = snapshot.merge_tables([canonical_table([(1, key, first)]), canonical_table([(1, key, second)])])
        assert as_dict(out) == {(1, key): bigger}
    out = snapshot.merge_tables([canonical_table([(1, key, other)]), canonical_table([(1, key, a)])])
    assert as_dict(out) == {(1, key): other if len(other) != 8 else max(other, a, key=lambda v: int.from_bytes(v, "little", signed=True))}
    keyed = snapshot.encode_keyed_key("count", b"k")  # keyed collisions: first occurrence, even for 8-byte values
    out = snapshot.merge_tables([canonical_table([(1, keyed, a)]), canonical_table([(1, keyed, b)])])
    assert as_dict(out) == {(1, keyed): a}


def test_merge_accepts_changelog_inputs() -> None:
    key = snapshot.encode_keyed_key("count", b"k")
    log = changelog_table([(1, 5, key, b"v1"), (2, 5, key, b""), (1, 5, b"\x00x|y", b"v2")])
    merged = snapshot.read_snapshot(snapshot.merge_snapshot_bytes([snapshot.write_snapshot(log, changelog=True)]))
    assert as_dict(merged.table) == {(5, b"\x00x|y"): b"v2"}


# --- key-group filter -------------------------------------------------------------------------------------


@PROPS
@given(
    rows=st.lists(st.tuples(op_ids, st.one_of(keyed_keys, operator_keys, raw_keys), values), max_size=40),
    cuts=st.lists(st.integers(1, 127), unique=True, max_size=6).map(sorted),
    pieces=st.integers(1, 3),
)
def test_key_group_filters_partition_the_rows(rows, cuts, pieces) -> None:
    bounds = [0, *cuts, 128]
    ranges = [(lo, hi - 1) for lo, hi in zip(bounds, bounds[1:], strict=False)]
    table = canonical_table(rows, pieces)
    keyed_parts: list[Row] = []
    for lo, hi in ranges:
        part = rows_of(snapshot.filter_key_groups(table, lo, hi))
        assert part == [r for r in rows if lead(r[1]) >= 128 or lo <= lead(r[1]) <= hi]
        keyed_parts.extend(r for r in part if lead(r[1]) < 128)
        assert [r for r in part if lead(r[1]) >= 128] == [r for r in rows if lead(r[1]) >= 128], "operator state goes to every part"
        mask = snapshot.key_group_mask(table.column("key_bytes"), lo, hi)
        assert mask.tolist() == [lead(r[1]) >= 128 or lo <= lead(r[1]) <= hi for r in rows]
    assert sorted(keyed_parts) == sorted(r for r in rows if lead(r[1]) < 128), "each keyed row lands in exactly one part"


@PROPS
@given(keys=st.lists(st.one_of(any_keys, st.just(b"")), max_size=30), pieces=st.integers(1, 3))
def test_leading_bytes_match_python(keys, pieces) -> None:
    column = canonical_table([(0, k, b"") for k in keys], pieces).column("key_bytes")
    assert snapshot.leading_bytes(column).tolist() == [lead(k) for k in keys]
    assert snapshot.leading_bytes(column.combine_chunks().slice(min(1, len(keys)))).tolist() == [lead(k) for k in keys[1:]]


@pytest.mark.parametrize(("lo", "hi"), [(5, 4), (-1, 3), (0, 128), (200, 300)])
def test_bad_key_group_range_is_refused(lo, hi) -> None:
    with pytest.raises(InvalidArgumentError, match="key-group range"):
        snapshot.filter_key_groups(canonical_table([(1, b"\x01a|b", b"v")]), lo, hi)
    with pytest.raises(InvalidArgumentError):
        snapshot.filter_key_groups(canonical_table([]), lo, hi)


# --- zero rows --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("changelog", [False, True], ids=["canonical", "changelog"])
def test_zero_row_snapshots_are_valid(changelog: bool) -> None:
    versions = StateVersionMap({(1, "ValueState"): 3})
    blob = snapshot.write_snapshot(snapshot.empty_table(changelog), versions, {"k": "v"}, changelog=changelog)
    snap = snapshot.read_snapshot(blob)
    assert snap.table.num_rows == 0 and snap.is_changelog == changelog and snap.state_versions == versions
    assert len(list(ipc.open_stream(blob))) == 1, "a zero-row snapshot still carries its one (empty) batch"
    canonical = snapshot.read_snapshot(snapshot.canonicalise_state_snapshot(blob))
    assert canonical.table.num_rows == 0 and canonical.state_versions == versions
    merged = snapshot.read_snapshot(snapshot.merge_snapshot_bytes([blob, blob]))
    assert merged.table.num_rows == 0 and merged.state_versions == versions and merged.extra_metadata == {b"k": b"v"}
    assert snapshot.overlay(snapshot.empty_table(), snapshot.empty_table(True)).num_rows == 0
    assert snapshot.filter_key_groups(snap.table, 0, 127).num_rows == 0


def test_merge_of_nothing_is_an_empty_snapshot() -> None:
    snap = snapshot.read_snapshot(snapshot.merge_snapshot_bytes([]))
    assert snap.table.num_rows == 0 and snap.format_version == 1


# --- the reader on odd and damaged input ------------------------------------------------------------------


def _only_typed_errors(fn, data) -> object | None:
    """Call fn(data); any failure must be a ClinkError subclass. Returns the result or None."""
    try:
        return fn(data)
    except ClinkError:
        return None
    except Exception as exc:  # noqa: BLE001 -- the property is exactly that nothing else escapes
        pytest.fail(f"{fn.__name__} raised {type(exc).__name__} (not a ClinkError): {exc}")


def _sample_blob(changelog: bool) -> bytes:
    rows = [(1, snapshot.encode_keyed_key("count", bytes([i]) * 8), bytes([i]) * (i % 5)) for i in range(6)]
    rows.append((2, snapshot.encode_operator_key("offsets", b"p0"), (7).to_bytes(8, "little")))
    table = changelog_table([(i % 3, *r) for i, r in enumerate(rows)]) if changelog else canonical_table(rows)
    return snapshot.write_snapshot(table, StateVersionMap({(1, "ValueState"): 2}), {"vendor.x": "y"}, changelog=changelog)


@FUZZ
@given(data=st.binary(max_size=400))
def test_random_bytes_raise_only_typed_errors(data) -> None:
    for fn in (snapshot.read_snapshot, snapshot.canonicalise_state_snapshot):
        _only_typed_errors(fn, data)
    _only_typed_errors(lambda d: snapshot.merge_snapshot_bytes([d]), data)


@FUZZ
@given(changelog=st.booleans(), edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4))
def test_damaged_streams_raise_only_typed_errors(changelog, edits) -> None:
    blob = bytearray(_sample_blob(changelog))
    for pos, byte in edits:
        blob[pos % len(blob)] = byte
    snap = _only_typed_errors(snapshot.read_snapshot, bytes(blob))
    if snap is not None:  # a damaged value or key byte may still read: then the table must be sound
        snap.table.validate(full=True)
        assert snap.table.schema.equals(CHANGELOG_SCHEMA if snap.is_changelog else CANONICAL_SCHEMA)
        _only_typed_errors(snapshot.canonicalise_state_snapshot, bytes(blob))


@FUZZ
@given(changelog=st.booleans(), cut=st.integers(0, 10_000))
def test_truncated_streams_are_refused(changelog, cut) -> None:
    blob = _sample_blob(changelog)
    prefix = blob[: cut % len(blob)]
    with pytest.raises(CorruptSnapshotError):
        snapshot.read_snapshot(prefix)
    with pytest.raises(CorruptSnapshotError):
        snapshot.canonicalise_state_snapshot(prefix)


def _batches_stream(table: pa.Table, max_chunksize: int, end: bool = True) -> bytes:
    sink = pa.BufferOutputStream()
    writer = ipc.new_stream(sink, table.schema)
    for batch in table.to_batches(max_chunksize=max_chunksize):
        writer.write_batch(batch)
    if end:
        writer.close()
    return sink.getvalue().to_pybytes()


def test_multiple_batches_read_as_all_rows_in_order() -> None:
    # writers emit one batch; the reader still takes another writer's multi-batch stream whole
    table = canonical_table([(1, b"\x01a|%d" % i, b"v%d" % i) for i in range(7)])
    snap = snapshot.read_snapshot(_batches_stream(table, 3))
    assert rows_of(snap.table) == rows_of(table)


def test_a_stream_cut_at_a_batch_boundary_is_refused_not_read_short() -> None:
    table = canonical_table([(1, b"\x01a|%d" % i, b"v%d" % i) for i in range(7)])
    cut = _batches_stream(table, 3, end=False)  # all batches, no end-of-stream marker
    assert pa.Table.from_batches(list(ipc.open_stream(cut))).num_rows == 7, "plain Arrow reads it without complaint"
    with pytest.raises(CorruptSnapshotError, match="end-of-stream"):
        snapshot.read_snapshot(cut)
    schema_only = _batches_stream(table.slice(0, 0), 3)[:-8]  # the schema message alone
    assert ipc.open_stream(schema_only).read_all().num_rows == 0, "plain Arrow reads a bare schema as empty state"
    with pytest.raises(CorruptSnapshotError, match="end-of-stream"):
        snapshot.read_snapshot(schema_only)


def test_bytes_after_the_end_of_stream_are_refused() -> None:
    with pytest.raises(CorruptSnapshotError, match="end-of-stream"):
        snapshot.read_snapshot(_sample_blob(False) + b"\x00garbage")


def test_stream_with_no_batch_but_an_end_marker_reads_as_zero_rows() -> None:
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, CANONICAL_SCHEMA):
        pass
    assert snapshot.read_snapshot(sink.getvalue()).table.num_rows == 0


def test_legacy_stream_without_continuation_markers_reads() -> None:
    table = canonical_table([(1, b"\x01a|b", b"v")])
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, CANONICAL_SCHEMA, options=ipc.IpcWriteOptions(use_legacy_format=True)) as writer:
        writer.write_table(table)
    blob = sink.getvalue().to_pybytes()
    assert blob[:4] != b"\xff\xff\xff\xff"
    assert rows_of(snapshot.read_snapshot(blob).table) == rows_of(table)
    with pytest.raises(CorruptSnapshotError):
        snapshot.read_snapshot(blob + b"\x01")


@pytest.mark.parametrize("source", ["bytes", "bytearray", "memoryview", "buffer", "buffer-reader", "os-file", "memory-map"])
def test_every_source_kind_reads_the_same(source: str, tmp_path) -> None:
    blob = _sample_blob(True)
    path = tmp_path / "s.snap"
    path.write_bytes(blob)
    data = {
        "bytes": lambda: blob,
        "bytearray": lambda: bytearray(blob),
        "memoryview": lambda: memoryview(blob),
        "buffer": lambda: pa.py_buffer(blob),
        "buffer-reader": lambda: pa.BufferReader(blob),
        "os-file": lambda: pa.OSFile(str(path)),
        "memory-map": lambda: pa.memory_map(str(path)),
    }[source]()
    snap = snapshot.read_snapshot(data)
    assert snap.is_changelog and snap.table.equals(snapshot.read_snapshot(blob).table)


def test_arrow_file_format_is_refused() -> None:
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, CANONICAL_SCHEMA) as writer:
        writer.write_table(canonical_table([(1, b"\x01a|b", b"v")]))
    with pytest.raises(CorruptSnapshotError, match="not an Arrow IPC stream"):
        snapshot.read_snapshot(sink.getvalue())


def _raw_stream(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


_OPS = pa.array([1], pa.uint64())
_KEYS = pa.array([b"\x01a|b"], pa.binary())
_VALS = pa.array([b"v"], pa.binary())


@pytest.mark.parametrize(
    ("table", "needle"),
    [
        (pa.table({"op_id": _OPS, "key_bytes": _KEYS, "value_bytes": _VALS, "extra": _OPS}), "columns must be"),
        (pa.table({"key_bytes": _KEYS, "op_id": _OPS, "value_bytes": _VALS}), "columns must be"),
        (pa.table({"op_id": _OPS, "key_bytes": _KEYS.cast(pa.large_binary()), "value_bytes": _VALS}), "key_bytes must be binary"),
        (pa.table({"op_id": _OPS, "key_bytes": _KEYS.dictionary_encode(), "value_bytes": _VALS}), "key_bytes must be binary"),
        (pa.table({"op_id": _OPS, "key_bytes": _KEYS.cast(pa.string()), "value_bytes": _VALS}), "key_bytes must be binary"),
        (pa.table({"op_id": pa.array([None], pa.uint64()), "key_bytes": _KEYS, "value_bytes": _VALS}), "null"),
        (pa.table({"row_kind": pa.array([3], pa.uint8()), "op_id": _OPS, "key_bytes": _KEYS, "value_bytes": _VALS}), "row_kind 3"),
        (
            pa.table({"row_kind": pa.array([1], pa.int8()), "op_id": _OPS, "key_bytes": _KEYS, "value_bytes": _VALS}),
            "row_kind must be uint8",
        ),
        (pa.table({"op_id": _OPS, "key_bytes": _KEYS}), "value_bytes column missing"),
    ],
    ids=["extra-column", "reordered", "large-binary", "dictionary", "string", "null-op", "row-kind-3", "row-kind-int8", "missing"],
)
def test_odd_schemas_are_refused_naming_the_problem(table: pa.Table, needle: str) -> None:
    with pytest.raises(CorruptSnapshotError, match=needle):
        snapshot.read_snapshot(_raw_stream(table))


@pytest.mark.parametrize(
    ("version", "error"),
    [
        (b"2", UnsupportedFormatVersionError),
        (b"17", UnsupportedFormatVersionError),
        (b"0", CorruptSnapshotError),
        (b"one", CorruptSnapshotError),
    ],
)
def test_declared_format_version_is_checked(version: bytes, error: type[ClinkError]) -> None:
    table = canonical_table([(1, b"\x01a|b", b"v")]).replace_schema_metadata({FORMAT_VERSION_KEY: version})
    with pytest.raises(error, match=version.decode()):
        snapshot.read_snapshot(_raw_stream(table))


def test_nullable_flags_from_other_writers_are_accepted_and_normalised() -> None:
    table = pa.table({"op_id": _OPS, "key_bytes": _KEYS, "value_bytes": _VALS})  # pyarrow's default: nullable fields
    assert table.schema.field("op_id").nullable
    snap = snapshot.read_snapshot(_raw_stream(table))
    assert snap.table.schema.equals(CANONICAL_SCHEMA) and rows_of(snap.table) == [(1, b"\x01a|b", b"v")]
    assert snap.format_version == 1  # no marker at all reads as version 1


def test_out_of_bounds_offsets_are_refused() -> None:
    rows = [(1, b"\x01a|bcd", b"ab"), (1, b"\x01a|efg", b"cd"), (1, b"\x01a|hij", b"ef")]
    blob = bytearray(_raw_stream(canonical_table(rows)))
    # value_bytes offsets [0, 2, 4, 6] sit in the body; a middle one pointing far past the data passes Arrow's cheap checks
    offsets = b"".join(i.to_bytes(4, "little") for i in (0, 2, 4, 6))
    pos = blob.find(offsets)
    assert pos > 0 and blob.find(offsets, pos + 1) < 0
    blob[pos + 4 : pos + 8] = (4000).to_bytes(4, "little")
    with pytest.raises(pa.ArrowInvalid):
        ipc.open_stream(bytes(blob)).read_all().validate(full=True)
    with pytest.raises(CorruptSnapshotError, match="value_bytes has damaged offsets"):
        snapshot.read_snapshot(bytes(blob))
