"""Canonical tables built from stored layers: changelogs resolved, overlaid and assembled into one contiguous chunk per column."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from snapshot import (
    CANONICAL_SCHEMA,
    CHANGELOG_SCHEMA,
    ROW_ERASE,
    ROW_MATERIALISATION,
    ROW_PUT,
    composite_keys,
    empty_table,
    leading_bytes,
    merge_tables,
    overlay,
    replay_changelog,
)
from snapshot.key_index import binary_parts
from store.datafile import DataFile


def as_puts(table: pa.Table) -> pa.Table:
    """A canonical table as a changelog of puts."""
    kinds = pa.array(np.ones(table.num_rows, dtype=np.uint8))
    return pa.table(
        {
            "row_kind": kinds,
            "op_id": table.column("op_id"),
            "key_bytes": table.column("key_bytes"),
            "value_bytes": table.column("value_bytes"),
        }
    )


def live_rows(changelog: pa.Table) -> pa.Table:
    """The put rows of a resolved changelog as canonical rows."""
    erased = pc.equal(changelog.column("row_kind"), ROW_ERASE)
    live = changelog.filter(pc.invert(erased)) if pc.any(erased).as_py() else changelog  # filtering copies: skip it when nothing is erased
    return live.select(["op_id", "key_bytes", "value_bytes"]).cast(CANONICAL_SCHEMA)


Piece = tuple[pa.Table, "np.ndarray | None"]  # canonical rows and which of them to keep (None: all)
_ASSEMBLE_ROWS = 1 << 16  # rows filtered at a time while assembling, so no full-size temporary is ever made


def live_piece(changelog: pa.Table) -> Piece:
    """The put rows of a resolved changelog, as a piece (no copy: erased rows are masked out)."""
    table = changelog.select(["op_id", "key_bytes", "value_bytes"]).cast(CANONICAL_SCHEMA)
    erased = pc.equal(changelog.column("row_kind"), ROW_ERASE)
    if not pc.any(erased).as_py():
        return table, None
    return table, ~erased.to_numpy(zero_copy_only=False) if isinstance(erased, pa.Array) else ~np.concatenate(
        [c.to_numpy(zero_copy_only=False) for c in erased.chunks]
    )


def _windows(table: pa.Table) -> Iterator[pa.RecordBatch]:
    """The table in batches of about _ASSEMBLE_ROWS rows: small chunks (a data file's blocks) joined a window at a time."""
    if table.num_columns == 0 or table.column(0).num_chunks <= 1 or table.num_rows <= table.column(0).num_chunks * 4096:
        yield from table.to_batches(max_chunksize=_ASSEMBLE_ROWS)
        return
    for start in range(0, table.num_rows, _ASSEMBLE_ROWS):  # a copy of one window at a time, never of the whole table
        window = table.slice(start, _ASSEMBLE_ROWS).combine_chunks()
        yield from window.to_batches()


def assemble(pieces: list[Piece]) -> pa.Table:
    """The kept rows of several canonical tables as ONE contiguous chunk per column, copied once.

    Filtering a table and then combining its chunks copies everything twice; here rows are filtered a slice at
    a time straight into preallocated buffers, so the only full-size allocation is the result itself.
    """
    work: list[tuple[pa.RecordBatch, np.ndarray | None]] = []
    for table, mask in pieces:
        offset = 0
        for batch in _windows(table.select(["op_id", "key_bytes", "value_bytes"])):
            m = None if mask is None else mask[offset : offset + batch.num_rows]
            offset += batch.num_rows
            if batch.num_rows and (m is None or m.any()):
                work.append((batch, None if m is None or m.all() else m))
    total = 0
    byte_totals = [0, 0]
    for batch, m in work:
        total += batch.num_rows if m is None else int(m.sum())
        for j in (0, 1):
            offs, _ = binary_parts(batch.column(j + 1))
            byte_totals[j] += int(offs[-1] - offs[0]) if m is None else int(np.diff(offs)[m].sum())
    if max(byte_totals) >= 2**31:  # too big for 32-bit offsets in one array: leave it to Arrow's own chunking
        return pa.concat_tables([t.filter(pa.array(m)) if m is not None else t for t, m in pieces]).cast(CANONICAL_SCHEMA)
    out_ops = np.empty(total, dtype=np.uint64)
    out_offs = [np.zeros(total + 1, dtype=np.int32), np.zeros(total + 1, dtype=np.int32)]
    out_data = [np.empty(byte_totals[0], dtype=np.uint8), np.empty(byte_totals[1], dtype=np.uint8)]
    row, pos = 0, [0, 0]
    for batch, m in work:
        if m is not None:
            batch = batch.filter(pa.array(m))  # one slice of at most _ASSEMBLE_ROWS rows
        k = batch.num_rows
        out_ops[row : row + k] = batch.column(0).to_numpy(zero_copy_only=False)
        for j in (0, 1):
            offs, data = binary_parts(batch.column(j + 1))
            size = int(offs[-1] - offs[0])
            out_data[j][pos[j] : pos[j] + size] = data[offs[0] : offs[-1]]
            out_offs[j][row : row + k + 1] = offs - offs[0] + pos[j]
            pos[j] += size
        row += k
    keys = pa.Array.from_buffers(pa.binary(), total, [None, pa.py_buffer(out_offs[0]), pa.py_buffer(out_data[0])])
    values = pa.Array.from_buffers(pa.binary(), total, [None, pa.py_buffer(out_offs[1]), pa.py_buffer(out_data[1])])
    return pa.Table.from_arrays([pa.array(out_ops, pa.uint64()), keys, values], schema=CANONICAL_SCHEMA)


def merge_same_checkpoint(changelogs: list[pa.Table]) -> pa.Table:
    """Resolved changelogs of one checkpoint (one per subtask, lowest key groups first) as one: puts merged by the format's rule over every erase."""
    if len(changelogs) <= 1:
        return changelogs[0] if changelogs else empty_table(changelog=True)
    erases = [t.filter(pc.equal(t.column("row_kind"), ROW_ERASE)).cast(CHANGELOG_SCHEMA) for t in changelogs]
    puts = as_puts(merge_tables([live_rows(t) for t in changelogs])).cast(CHANGELOG_SCHEMA)
    return pa.concat_tables([*erases, puts])  # replay keeps the last row per key: a put in this checkpoint beats an erase


def overlay_pieces(pieces: list[Piece], changelog: pa.Table) -> list[Piece]:
    """snapshot.overlay without copying: rows the changelog overwrites or erases are masked out, its puts appended."""
    resolved = replay_changelog(changelog)
    if resolved.num_rows == 0:
        return pieces
    r_keys = resolved.column("key_bytes").combine_chunks()
    r_comp = composite_keys(resolved.column("op_id"), r_keys)
    out: list[Piece] = []
    for table, mask in pieces:
        if table.num_rows == 0:
            continue
        cand = pc.is_in(table.column("key_bytes"), value_set=r_keys)  # one hash table for every chunk
        cand_np = (
            np.concatenate([c.to_numpy(zero_copy_only=False) for c in cand.chunks])
            if isinstance(cand, pa.ChunkedArray)
            else cand.to_numpy(zero_copy_only=False)
        )
        if mask is not None:
            cand_np &= mask
        idx = np.flatnonzero(cand_np)
        if idx.size:
            comps, start = [], 0
            for batch in table.to_batches():  # take per chunk: a take across many chunks would concatenate them all
                local = idx[(idx >= start) & (idx < start + batch.num_rows)] - start
                if local.size:
                    sub = batch.take(pa.array(local))
                    comps.append(composite_keys(sub.column(0), sub.column(1)))
                start += batch.num_rows
            hit = pc.is_in(pa.concat_arrays(comps), value_set=r_comp).to_numpy(zero_copy_only=False)
            if hit.any():
                mask = np.ones(table.num_rows, dtype=bool) if mask is None else mask.copy()
                mask[idx[hit]] = False
        out.append((table, mask))
    out.append(live_piece(resolved))
    return out


def deltas_in_sequence(changelogs: list[pa.Table]) -> pa.Table:
    """Several stored delta layers as one changelog in layer order; their materialisation rows become puts."""
    if len(changelogs) == 1:
        return changelogs[0]
    table = pa.concat_tables(changelogs)
    kinds = table.column("row_kind")
    # replay puts materialisations first; inside a stored layer a materialisation is just that layer's value
    return table.set_column(0, "row_kind", pc.if_else(pc.equal(kinds, ROW_MATERIALISATION), pa.scalar(ROW_PUT, pa.uint8()), kinds))


def apply_layer(acc: pa.Table, tables: list[tuple[DataFile, pa.Table]], lo: int, hi: int) -> pa.Table:
    """Overlay one layer: delta files apply puts/erases; a base file replaces the key groups it covers."""
    deltas = [t for f, t in tables if f.changelog]
    for f, t in tables:
        if not f.changelog:  # a base is the whole state of its range: drop what older layers said there
            b_lo, b_hi = max(lo, f.kg_lo), min(hi, f.kg_hi)
            lead = leading_bytes(acc.column("key_bytes"))
            acc = acc.filter(pa.array(~((lead >= b_lo) & (lead <= b_hi))))
            deltas.append(as_puts(t))
    if len(deltas) == 1 and acc.num_rows == 0 and len(tables) == 1:
        return live_rows(deltas[0])  # stored deltas are already resolved (one row per key): nothing to overlay onto
    if deltas:
        acc = overlay(acc, pa.concat_tables(deltas) if len(deltas) > 1 else deltas[0])
    return acc


def _is_in(column: pa.ChunkedArray | pa.Array, values: pa.Array) -> np.ndarray:
    """Which rows of a column hold one of ``values``, as one numpy mask."""
    mask = pc.is_in(column, value_set=values)
    if isinstance(mask, pa.ChunkedArray):
        return np.concatenate([c.to_numpy(zero_copy_only=False) for c in mask.chunks]) if mask.num_chunks else np.zeros(0, dtype=bool)
    return mask.to_numpy(zero_copy_only=False)


def _and(mask: np.ndarray | None, other: np.ndarray) -> np.ndarray:
    """Both masks (None keeps every row)."""
    return other if mask is None else mask & other


def pieces_of_op_ids(pieces: list[Piece], op_ids: Sequence[int]) -> list[Piece]:
    """The pieces with only the rows of some op_ids kept (masked, not copied)."""
    wanted = pa.array(list(op_ids), pa.uint64())
    return [(t, _and(m, _is_in(t.column("op_id"), wanted))) for t, m in pieces]
