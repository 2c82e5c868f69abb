"""Vectorised diff of two canonical tables: added, removed and changed entries per operator and slot."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from clink.tools.projections import decode_keys, render_bytes
from snapshot import composite_keys

CHANGES = ("added", "removed", "changed")


class RenderedEntry(TypedDict):
    """One differing entry, keys and values rendered as text (a value None where that side lacks the entry)."""

    op_id: int
    slot: str
    key_group: int | None
    change: str
    user_key: str
    value_a: str | None
    value_b: str | None


@dataclass(frozen=True)
class StateDiff:
    """The differences between A and B: one row per differing entry, and counts per (op_id, slot)."""

    rows_a: int
    rows_b: int
    entries: pa.Table  # op_id, key_bytes, change, value_a (null when added), value_b (null when removed), slot, key_group
    summary: pa.Table  # op_id, slot, added, removed, changed

    @property
    def equal(self) -> bool:
        """True when A and B hold the same entries with the same values."""
        return self.entries.num_rows == 0

    def counts(self) -> dict[str, int]:
        """Total added / removed / changed."""
        return {c: int(pc.sum(self.summary.column(c)).as_py() or 0) for c in CHANGES}


def _keyed(table: pa.Table, side: str) -> pa.Table:
    keys = composite_keys(table.column("op_id"), table.column("key_bytes")) if table.num_rows else pa.array([], pa.binary())
    return pa.table(
        {
            "k": keys,
            f"op_{side}": table.column("op_id"),
            f"key_{side}": table.column("key_bytes"),
            f"value_{side}": table.column("value_bytes"),
        }
    )


def diff_tables(a: pa.Table, b: pa.Table) -> StateDiff:
    """Full outer join of A and B on (op_id, key_bytes); equal pairs drop out, the rest is classified."""
    joined = _keyed(a, "a").join(_keyed(b, "b"), keys="k", join_type="full outer", use_threads=True)
    in_a = pc.is_valid(joined.column("value_a"))
    in_b = pc.is_valid(joined.column("value_b"))
    same = pc.and_kleene(pc.and_(in_a, in_b), pc.equal(joined.column("value_a"), joined.column("value_b")))
    differs = pc.invert(pc.fill_null(same, False))
    joined = joined.filter(differs)
    in_a = pc.is_valid(joined.column("value_a")).to_numpy(zero_copy_only=False)
    in_b = pc.is_valid(joined.column("value_b")).to_numpy(zero_copy_only=False)
    change = np.where(~in_a, "added", np.where(~in_b, "removed", "changed"))
    op_id = pc.coalesce(joined.column("op_a"), joined.column("op_b"))
    key_bytes = pc.coalesce(joined.column("key_a"), joined.column("key_b"))
    entries = pa.table(
        {
            "op_id": op_id,
            "key_bytes": key_bytes,
            "change": pa.array(change, pa.string()),
            "value_a": joined.column("value_a"),
            "value_b": joined.column("value_b"),
        }
    )
    decoded = decode_keys(entries.column("key_bytes"))
    entries = entries.append_column("slot", decoded.column("slot")).append_column("key_group", decoded.column("key_group"))
    entries = entries.append_column("user_key", decoded.column("user_key"))
    if entries.num_rows:
        entries = entries.take(
            pc.sort_indices(entries, sort_keys=[("op_id", "ascending"), ("slot", "ascending"), ("key_bytes", "ascending")])
        )
    summary = _summary(entries)
    return StateDiff(a.num_rows, b.num_rows, entries, summary)


def _summary(entries: pa.Table) -> pa.Table:
    schema = pa.schema([("op_id", pa.uint64()), ("slot", pa.string()), *[(c, pa.int64()) for c in CHANGES]])
    if entries.num_rows == 0:
        return schema.empty_table()
    flags = {c: pc.equal(entries.column("change"), c).cast(pa.int64()) for c in CHANGES}
    counted = pa.table({"op_id": entries.column("op_id"), "slot": entries.column("slot"), **flags})
    grouped = counted.group_by(["op_id", "slot"]).aggregate([(c, "sum") for c in CHANGES])
    grouped = grouped.rename_columns([{f"{c}_sum": c for c in CHANGES}.get(n, n) for n in grouped.column_names])
    grouped = grouped.select(schema.names).cast(schema)
    return grouped.take(pc.sort_indices(grouped, sort_keys=[("op_id", "ascending"), ("slot", "ascending")]))


def rendered_entries(diff: StateDiff, limit: int | None) -> list[RenderedEntry]:
    """The first ``limit`` differing entries (all when None) as plain dicts with rendered keys and values."""
    entries = diff.entries if limit is None else diff.entries.slice(0, limit)
    if entries.num_rows == 0:
        return []
    key_text, _ = render_bytes(entries.column("user_key"), quote_lookalikes=True)
    empty = pa.scalar(b"", pa.binary())
    a_text, _ = render_bytes(pc.fill_null(entries.column("value_a"), empty), quote_lookalikes=True)
    b_text, _ = render_bytes(pc.fill_null(entries.column("value_b"), empty), quote_lookalikes=True)
    rows = entries.select(["op_id", "slot", "key_group", "change"]).to_pylist()
    present_a = pc.is_valid(entries.column("value_a")).to_pylist()
    present_b = pc.is_valid(entries.column("value_b")).to_pylist()
    for row, key, va, vb, pa_, pb_ in zip(
        rows, key_text.to_pylist(), a_text.to_pylist(), b_text.to_pylist(), present_a, present_b, strict=True
    ):
        row["user_key"] = key
        row["value_a"] = va if pa_ else None
        row["value_b"] = vb if pb_ else None
    return rows
