"""Vectorised operations on snapshot tables: replay, overlay, merge, key-group filter."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from snapshot.errors import ClinkError, InvalidArgumentError, LimitExceededError, MaterialisationHandleError, prefixed
from snapshot.format import (
    CANONICAL_SCHEMA,
    CHANGELOG_SCHEMA,
    ROW_ERASE,
    ROW_MATERIALISATION,
    Bytesish,
    Snapshot,
    SnapshotArrowWriter,
    conform,
    empty_table,
    read_snapshot,
)
from snapshot.handles import (
    CheckpointHandle,
    Handle,
    HandleResolver,
    as_resolver,
    handle_positions,
    handles_at,
    refuse_unresolved,
)
from snapshot.keys import NUM_KEY_GROUPS, check_key_group_range, leading_bytes
from snapshot.ttl import TTL_FILTER_KEY, drop_expired, parse_ttl_filter

_EMPTY_SEP = pa.scalar(b"", pa.binary())


def composite_keys(op_ids: pa.Array | pa.ChunkedArray, key_bytes: pa.Array | pa.ChunkedArray) -> pa.Array:
    """One binary key per row: op_id as 8 big-endian bytes, then key_bytes."""
    ops = np.asarray(op_ids.to_numpy(zero_copy_only=False), dtype=">u8")
    prefix = pa.FixedSizeBinaryArray.from_buffers(pa.binary(8), len(ops), [None, pa.py_buffer(ops.tobytes())])
    keys = key_bytes.combine_chunks() if isinstance(key_bytes, pa.ChunkedArray) else key_bytes
    return pc.binary_join_element_wise(prefix.cast(pa.binary()), keys, _EMPTY_SEP)


def _group_starts(sorted_keys: pa.Array) -> np.ndarray:
    """Boolean mask of the first row of each run of equal keys in a sorted array."""
    n = len(sorted_keys)
    starts = np.ones(n, dtype=bool)
    if n > 1:
        starts[1:] = pc.not_equal(sorted_keys.slice(1), sorted_keys.slice(0, n - 1)).to_numpy(zero_copy_only=False)
    return starts


def _all_distinct(values: pa.Array | pa.ChunkedArray) -> bool:
    """Whether no value repeats (one hash pass)."""
    return len(pc.unique(values)) == len(values)


def _resolve(changelog: pa.Table) -> tuple[pa.Table, bool]:
    """The replayed changelog, and whether its key_bytes are all distinct (so key_bytes alone identify a row)."""
    n = changelog.num_rows
    if n == 0 or _all_distinct(changelog.column("key_bytes")):
        return changelog, True  # distinct key_bytes imply distinct (op_id, key_bytes): nothing to resolve
    kinds = changelog.column("row_kind").to_numpy()
    position = np.arange(n, dtype=np.int64)
    order = np.where(kinds == ROW_MATERIALISATION, position, position + n)
    comp = composite_keys(changelog.column("op_id"), changelog.column("key_bytes"))
    if _all_distinct(comp):
        return changelog, False
    keyed = pa.table({"k": comp, "o": pa.array(-order)})
    idx = pc.sort_indices(keyed, sort_keys=[("k", "ascending"), ("o", "ascending")])
    sorted_keys = comp.take(idx)
    first = idx.to_numpy()[_group_starts(sorted_keys)]
    resolved = changelog.take(pa.array(np.sort(first)))
    return resolved, _all_distinct(resolved.column("key_bytes"))


def replay_changelog(changelog: pa.Table) -> pa.Table:
    """Resolve a changelog to one row per (op_id, key_bytes): the last one after materialisation-first ordering.

    The result keeps ``row_kind``, so an erase is still visible to overlay.
    """
    return _resolve(changelog)[0]


def canonical_from_changelog(changelog: pa.Table) -> pa.Table:
    """Replay a changelog into canonical rows (erased keys dropped)."""
    resolved = replay_changelog(changelog)
    live = resolved.filter(pc.not_equal(resolved.column("row_kind"), ROW_ERASE)) if resolved.num_rows else resolved
    return live.select(["op_id", "key_bytes", "value_bytes"]).cast(CANONICAL_SCHEMA)


def _overwritten_rows(base: pa.Table, resolved: pa.Table, keys_distinct: bool) -> np.ndarray:
    """Indices of base rows whose (op_id, key_bytes) the resolved changelog touches."""
    resolved_keys = resolved.column("key_bytes").combine_chunks()
    resolved_ops = resolved.column("op_id").to_numpy()
    if keys_distinct:
        # each key_bytes names one changelog row: one hash probe gives its position, then compare op_ids (no composite keys)
        pos = pc.index_in(base.column("key_bytes"), value_set=resolved_keys)
        cand = pc.indices_nonzero(pc.is_valid(pos))
        cand_ops = base.column("op_id").take(cand).to_numpy()
        return cand.to_numpy()[resolved_ops[pos.take(cand).to_numpy()] == cand_ops]
    candidate = pc.is_in(base.column("key_bytes"), value_set=resolved_keys).to_numpy(zero_copy_only=False)
    cand_idx = np.flatnonzero(candidate)
    if cand_idx.size == 0:
        return cand_idx
    cand_ops = base.column("op_id").take(pa.array(cand_idx))
    hit = pc.is_in(
        composite_keys(cand_ops, base.column("key_bytes").take(pa.array(cand_idx))),
        value_set=composite_keys(resolved.column("op_id"), resolved_keys),
    ).to_numpy(zero_copy_only=False)
    return cand_idx[hit]


def overlay(base: pa.Table, changelog: pa.Table) -> pa.Table:
    """Apply a changelog (puts, erases, materialisations) on top of a canonical table."""
    base = base.select(["op_id", "key_bytes", "value_bytes"])
    if changelog.num_rows == 0:
        return base.cast(CANONICAL_SCHEMA)
    if "row_kind" not in changelog.column_names:
        raise InvalidArgumentError("overlay needs a changelog table (row_kind column missing)")
    resolved, keys_distinct = _resolve(changelog)
    if base.num_rows:
        drop = _overwritten_rows(base, resolved, keys_distinct)
        if drop.size:
            keep = np.ones(base.num_rows, dtype=bool)
            keep[drop] = False
            base = base.filter(pa.array(keep))
    live = resolved.filter(pc.not_equal(resolved.column("row_kind"), ROW_ERASE))
    puts = live.select(["op_id", "key_bytes", "value_bytes"])
    return pa.concat_tables([base.cast(CANONICAL_SCHEMA), puts.cast(CANONICAL_SCHEMA)])


def key_group_mask(key_bytes: pa.Array | pa.ChunkedArray, lo: int, hi: int) -> np.ndarray:
    """Rows whose leading byte is in [lo, hi], plus every operator-state row (leading byte >= 128)."""
    check_key_group_range(lo, hi)
    lead = leading_bytes(key_bytes)
    return (lead >= NUM_KEY_GROUPS) | ((lead >= lo) & (lead <= hi))


def filter_key_groups(table: pa.Table, lo: int, hi: int) -> pa.Table:
    """Keep keyed rows of key groups lo..hi (inclusive) and every operator-state row; a one-byte compare."""
    if table.num_rows == 0:
        check_key_group_range(lo, hi)
        return table
    return table.filter(pa.array(key_group_mask(table.column("key_bytes"), lo, hi)))


def merge_tables(tables: Iterable[pa.Table]) -> pa.Table:
    """Scale-down merge of canonical tables: one row per (op_id, key_bytes), the collision rule of the format."""
    parts = [t.select(["op_id", "key_bytes", "value_bytes"]).cast(CANONICAL_SCHEMA) for t in tables if t.num_rows]
    if not parts:
        return empty_table()
    table = pa.concat_tables(parts).combine_chunks()
    n = table.num_rows
    if _all_distinct(table.column("key_bytes")):
        return table  # no key repeats, so no (op_id, key_bytes) collides
    comp = composite_keys(table.column("op_id"), table.column("key_bytes"))
    if _all_distinct(comp):
        return table
    idx = pc.sort_indices(pa.table({"k": comp, "o": pa.array(np.arange(n))}), sort_keys=[("k", "ascending"), ("o", "ascending")]).to_numpy()
    sorted_keys = comp.take(pa.array(idx))
    starts = _group_starts(sorted_keys)
    group = np.cumsum(starts) - 1
    values = table.column("value_bytes").combine_chunks().take(pa.array(idx))
    is8 = pc.binary_length(values).to_numpy(zero_copy_only=False) == 8
    op_state = (
        leading_bytes(table.column("key_bytes").take(pa.array(idx))) >= NUM_KEY_GROUPS
    )  # 128 and up is operator state, as in the filter
    # a group takes the greatest int64 only when it is operator state and every value in it is 8 bytes
    group_all8 = np.minimum.reduceat(is8, np.flatnonzero(starts))[group]
    by_value = op_state & group_all8
    ints = np.zeros(n, dtype=np.int64)
    if by_value.any():
        vals8 = values.filter(pa.array(by_value))
        raw = np.frombuffer(pa.concat_arrays([vals8]).buffers()[2], dtype=np.uint8)
        offs = np.frombuffer(vals8.buffers()[1], dtype=np.int32, count=len(vals8) + 1, offset=vals8.offset * 4)
        gather = offs[:-1, None] + np.arange(8)
        ints[by_value] = raw[gather].copy().view("<i8").ravel()
    priority = np.where(by_value, ~ints, 0)  # ~x reverses int64 order without overflow
    order = np.lexsort((np.arange(n), priority, group))
    chosen = order[np.r_[True, group[order][1:] != group[order][:-1]]]
    return table.take(pa.array(np.sort(idx[chosen])))


def _resolved_rows(handle: Handle, resolver: HandleResolver) -> pa.Table:
    """The canonical rows one handle names, through ``resolver``; every failure is an error naming the handle."""
    name = handle.describe()
    try:
        rows = resolver.resolve_handle(handle)
        rows = conform(rows.select(["op_id", "key_bytes", "value_bytes"]).replace_schema_metadata(None))
    except MaterialisationHandleError:
        raise
    except ClinkError as exc:
        raise prefixed(exc, f"materialisation handle {name}") from exc
    except (KeyError, ValueError, TypeError, pa.ArrowException) as exc:
        raise MaterialisationHandleError(f"materialisation handle {name}: the store answered with unusable rows: {exc}", name) from exc
    if isinstance(handle, CheckpointHandle) and rows.num_rows:
        rows = filter_key_groups(rows, *handle.key_groups)  # a handle names its range only, whatever a resolver returns
    return rows


# materialisation handles one changelog snapshot may hold (a backend's export holds one)
MAX_HANDLES = 1024


def expand_handles(changelog: pa.Table, store: HandleResolver | object | None) -> pa.Table:
    """A changelog with every handle row replaced, in place, by the materialisation rows it names (the rest as it is)."""
    positions = handle_positions(changelog)
    if positions.size == 0:
        return changelog
    if positions.size > MAX_HANDLES:  # a small stream must not make the resolver fetch state thousands of times
        raise LimitExceededError(
            f"this changelog snapshot holds {positions.size} materialisation handles; a reader takes at most {MAX_HANDLES}"
        )
    handles = handles_at(changelog, positions)  # every handle parsed and checked before any is fetched
    if store is None:
        refuse_unresolved(changelog)
    resolver = as_resolver(store)
    pieces, start = [], 0
    resolved: dict[Handle, pa.Table] = {}  # a handle named twice is fetched once
    for pos, handle in zip(positions.tolist(), handles, strict=True):
        pieces.append(changelog.slice(start, pos - start))
        rows = resolved.get(handle)
        if rows is None:
            rows = resolved[handle] = _resolved_rows(handle, resolver)
        kinds = pa.array(np.full(rows.num_rows, ROW_MATERIALISATION, dtype=np.uint8))
        pieces.append(pa.Table.from_arrays([kinds, *rows.columns], schema=CHANGELOG_SCHEMA))
        start = pos + 1
    pieces.append(changelog.slice(start))
    return pa.concat_tables([p.cast(CHANGELOG_SCHEMA) for p in pieces if p.num_rows] or [empty_table(changelog=True)])


def read_canonical(data: Bytesish, store: HandleResolver | object | None = None) -> Snapshot:
    """Any snapshot blob read into its canonical table: a changelog's handles resolved through ``store``, then replayed.

    Replay order: materialisation rows first (a handle's rows where the handle stands), then puts and erases in stream
    order; then a clink.ttl_filter, if the stream carries one, drops the rows of its TTL slots expired at its cut time.
    The result's metadata is the input's, less clink.ttl_filter; ``replayed`` says the input was a changelog.
    """
    return canonical_of(read_snapshot(data, handles=True), store)


def canonical_of(snap: Snapshot, store: HandleResolver | object | None = None) -> Snapshot:
    """A snapshot already read, in canonical form: as it is, or its changelog replayed as read_canonical says."""
    if not snap.is_changelog:
        return snap
    table = canonical_from_changelog(expand_handles(snap.table, store))
    metadata = dict(snap.metadata)
    ttl = parse_ttl_filter(metadata)
    if ttl is not None:
        table = drop_expired(table, *ttl)
        metadata.pop(TTL_FILTER_KEY)
    return Snapshot(table, snap.format_version, snap.state_versions, metadata, is_changelog=False, replayed=True)


def canonicalise_state_snapshot(data: Bytesish, store: HandleResolver | object | None = None) -> bytes:
    """Any snapshot blob to the canonical form: canonical passes through, a changelog is replayed (read_canonical).

    ``store`` resolves materialisation handles: an object store (store.open_store), a PoolClient, or any HandleResolver.
    A changelog with handles and no store is a HandleNeedsStoreError naming them; a handle that cannot be resolved, or
    whose checksum differs, is a MaterialisationHandleError naming it.
    """
    snap = read_canonical(data, store)
    if not snap.replayed:
        return bytes(data) if not isinstance(data, pa.Buffer) else data.to_pybytes()
    writer = SnapshotArrowWriter(snap.state_versions, snap.extra_metadata)
    return writer.write(snap.table)


def merge_snapshot_bytes(blobs: Iterable[Bytesish]) -> bytes:
    """Merge snapshot streams (scale-down): rows by the collision rule, metadata of the first non-empty input."""
    snaps = [read_snapshot(b) for b in blobs]
    tables = [canonical_from_changelog(s.table) if s.is_changelog else s.table for s in snaps]
    source = next((s for s, t in zip(snaps, tables, strict=False) if t.num_rows), snaps[0] if snaps else None)
    writer = SnapshotArrowWriter(source.state_versions, source.extra_metadata) if source else SnapshotArrowWriter()
    return writer.write(merge_tables(tables))


def in_layout_order(table: pa.Table) -> bool:
    """Whether rows are already sorted by key bytes then op_id (one vectorised pass over neighbours, no sort)."""
    keys = table.column("key_bytes")
    n = table.num_rows
    before, after = keys.slice(0, n - 1), keys.slice(1)
    ops = table.column("op_id").to_numpy()
    ordered = pc.less(before, after).to_numpy(zero_copy_only=False)
    if ordered.all():
        return True
    tied = pc.equal(before, after).to_numpy(zero_copy_only=False)
    return bool((ordered | (tied & (ops[:-1] <= ops[1:]))).all())


def has_adjacent_repeats(table: pa.Table) -> bool:
    """Whether two neighbouring rows share (op_id, key_bytes): in a table sorted for layout, whether any key repeats."""
    n = table.num_rows
    if n <= 1:
        return False
    keys = table.column("key_bytes")
    tied = pc.equal(keys.slice(0, n - 1), keys.slice(1)).to_numpy(zero_copy_only=False)
    if not tied.any():
        return False
    ops = table.column("op_id").to_numpy()
    return bool((tied & (ops[:-1] == ops[1:])).any())


def sort_for_layout(table: pa.Table) -> pa.Table:
    """Rows sorted by key bytes then op_id: keyed rows by key group first, operator-state rows (>= 0x80) last.

    Rows already in that order come back as they are (no copy), so a caller that sorted once pays nothing again.
    """
    if table.num_rows <= 1 or in_layout_order(table):
        return table
    idx = pc.sort_indices(table, sort_keys=[("key_bytes", "ascending"), ("op_id", "ascending")])
    return table.take(idx)
