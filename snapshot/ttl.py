"""TTL slots in snapshot tables: which rows have expired at a cut time, and the ttl-filter metadata a changelog carries."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from snapshot.errors import CorruptSnapshotError
from snapshot.keys import NUM_KEY_GROUPS, OPERATOR_STATE_PREFIX, leading_bytes

# {"now_ms": N, "slots": [[op_id, slot, keyed], ...]}: rows of these TTL slots expired at now_ms are dropped after replay
TTL_FILTER_KEY = b"clink.ttl_filter"

TtlSlot = tuple[int, str, bool]


def _prefix_mask(keys: pa.Array, prefix: bytes, start: int) -> np.ndarray:
    """Rows of a binary array whose bytes at [start, start+len(prefix)) equal ``prefix``, vectorised."""
    n = len(keys)
    if n == 0:
        return np.zeros(0, dtype=bool)
    offsets = np.frombuffer(keys.buffers()[1], dtype=np.int32, count=n + 1, offset=keys.offset * 4)
    data_buf = keys.buffers()[2]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, dtype=np.uint8)
    lengths = offsets[1:] - offsets[:-1]
    ok = lengths >= start + len(prefix)
    if not ok.any():
        return ok
    base = offsets[:-1][ok] + start
    sub = np.ones(base.size, dtype=bool)
    for j, byte in enumerate(prefix):
        sub &= data[base + j] == byte
    ok[np.flatnonzero(ok)] = sub
    return ok


def ttl_expired_mask(table: pa.Table, ttl_slots: Iterable[TtlSlot], now_ms: int) -> np.ndarray:
    """Rows of TTL slots whose 8-byte little-endian expire-at-ms prefix is at or before ``now_ms``, vectorised.

    ``ttl_slots`` holds (op_id, slot, keyed) triples: keyed slots match a key-group leading byte, others 0xFF.
    """
    n = table.num_rows
    expired = np.zeros(n, dtype=bool)
    if n == 0:
        return expired
    keys = table.column("key_bytes").combine_chunks()
    ops = table.column("op_id").to_numpy()
    lead = leading_bytes(keys)
    in_slot = np.zeros(n, dtype=bool)
    for op_id, slot, keyed in ttl_slots:
        lead_ok = lead < NUM_KEY_GROUPS if keyed else lead == OPERATOR_STATE_PREFIX
        in_slot |= (ops == np.uint64(op_id)) & lead_ok & _prefix_mask(keys, slot.encode("utf-8") + b"|", 1)
    if not in_slot.any():
        return expired
    values = table.column("value_bytes").combine_chunks()
    offsets = np.frombuffer(values.buffers()[1], dtype=np.int32, count=n + 1, offset=values.offset * 4)
    lengths = offsets[1:] - offsets[:-1]
    rows = np.flatnonzero(in_slot & (lengths >= 8))
    if rows.size == 0:
        return expired
    data = np.frombuffer(values.buffers()[2], dtype=np.uint8)
    gather = offsets[:-1][rows, None] + np.arange(8)
    expire_at = data[gather].copy().view("<i8").ravel()
    expired[rows] = expire_at <= now_ms
    return expired


def drop_expired(table: pa.Table, ttl_slots: Iterable[TtlSlot], now_ms: int) -> pa.Table:
    """``table`` without the rows of ``ttl_slots`` expired at ``now_ms`` (the table itself when none has)."""
    slots = list(ttl_slots)
    if not slots or table.num_rows == 0:
        return table
    expired = ttl_expired_mask(table, slots, now_ms)
    return table.filter(pc.invert(pa.array(expired))) if expired.any() else table


def ttl_filter_metadata(ttl_slots: Iterable[TtlSlot], now_ms: int) -> dict[bytes, bytes]:
    """The TTL_FILTER_KEY entry recording the slots and the cut time of an export (empty when there is no TTL slot)."""
    slots = sorted((int(op), str(slot), bool(keyed)) for op, slot, keyed in ttl_slots)
    if not slots:
        return {}
    doc = {"now_ms": int(now_ms), "slots": [[op, slot, keyed] for op, slot, keyed in slots]}
    return {TTL_FILTER_KEY: json.dumps(doc, separators=(",", ":")).encode()}


def parse_ttl_filter(metadata: Mapping[bytes, bytes]) -> tuple[list[TtlSlot], int] | None:
    """(slots, now_ms) of a TTL_FILTER_KEY entry; None when absent; CorruptSnapshotError naming what is wrong otherwise."""
    raw = metadata.get(TTL_FILTER_KEY)
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
        now_ms = doc["now_ms"]
        slots = doc["slots"]
        if type(now_ms) is not int or not isinstance(slots, list):
            raise TypeError("now_ms must be an integer and slots a list")
        parsed: list[TtlSlot] = []
        for item in slots:
            op, slot, keyed = item
            if type(op) is not int or not 0 <= op < 1 << 64 or not isinstance(slot, str) or not isinstance(keyed, bool):
                raise TypeError(f"slot {item!r} is not [op_id, slot, keyed]")
            parsed.append((op, slot, keyed))
    except (ValueError, TypeError, KeyError, UnicodeDecodeError) as exc:
        raise CorruptSnapshotError(f"{TTL_FILTER_KEY.decode()} metadata is unreadable: {exc}") from None
    return parsed, now_ms
