"""Derived, non-restorable projections of a canonical snapshot table: key decoding, rendering, Parquet/Iceberg/query layouts."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from snapshot import NUM_KEY_GROUPS, RAW_SLOT, StateVersionMap, leading_bytes
from snapshot.format import FORMAT_VERSION, FORMAT_VERSION_KEY, STATE_VERSIONS_KEY
from snapshot.keys import key_groups_of_runs

# rows decoded per step: bounds the temporary gather indices (8 bytes per key byte) on big tables
DECODE_CHUNK_ROWS = 1 << 16
PROJECTION_KEY = b"clink.projection"
SEP = 0x7C  # '|'

# the Parquet projection; key_group is null for operator-state and legacy raw rows (they have no key group)
PARQUET_SCHEMA = pa.schema(
    [
        pa.field("op_id", pa.uint64(), nullable=False),
        pa.field("key_group", pa.uint8(), nullable=True),
        pa.field("slot", pa.string(), nullable=False),
        pa.field("user_key", pa.binary(), nullable=False),
        pa.field("value_bytes", pa.binary(), nullable=False),
    ]
)
# the Iceberg projection: Iceberg has no unsigned types, so op_id is bit-cast to int64 and key_group widened to int32
ICEBERG_ARROW_SCHEMA = pa.schema(
    [
        pa.field("op_id", pa.int64(), nullable=False),
        pa.field("key_group", pa.int32(), nullable=True),
        pa.field("slot", pa.string(), nullable=False),
        pa.field("user_key", pa.binary(), nullable=False),
        pa.field("value_bytes", pa.binary(), nullable=False),
    ]
)
QUERY_SCHEMA = pa.schema(
    [
        *PARQUET_SCHEMA,
        pa.field("kind", pa.string(), nullable=False),
        pa.field("key_text", pa.string(), nullable=False),
        pa.field("key_int64", pa.int64(), nullable=True),
        pa.field("value_size", pa.int64(), nullable=False),
        pa.field("value_text", pa.string(), nullable=False),
        pa.field("value_int64", pa.int64(), nullable=True),
    ]
)

_HEX_LUT = np.frombuffer(b"".join(f"{i:02x}".encode() for i in range(256)), dtype=np.uint8).reshape(256, 2)


# --- raw buffer helpers --------------------------------------------------------------------------------------


def _as_binary_array(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    if arr.type != pa.binary():
        arr = arr.cast(pa.binary())
    return arr


def _buffers(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets int64 of length n+1, data uint8) of a binary array, honouring its slice offset."""
    n = len(arr)
    _, off_buf, data_buf = arr.buffers()
    if n == 0:
        return np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.uint8)
    offsets = np.frombuffer(off_buf, dtype=np.int32, count=n + 1, offset=arr.offset * 4).astype(np.int64)
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, dtype=np.uint8)
    return offsets, data


def _gather(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """A binary array whose row i is data[starts[i] : starts[i] + lengths[i]], built without a row loop."""
    n = len(starts)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    if total:
        idx = np.repeat(starts - offsets[:-1], lengths) + np.arange(total, dtype=np.int64)
        out = data[idx]
    else:
        out = np.zeros(0, dtype=np.uint8)
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(out)])


def _chunks(arr: pa.Array | pa.ChunkedArray) -> Iterator[pa.Array]:
    chunks = arr.chunks if isinstance(arr, pa.ChunkedArray) else [arr]
    for chunk in chunks:
        chunk = _as_binary_array(chunk)
        for start in range(0, len(chunk), DECODE_CHUNK_ROWS):
            yield chunk.slice(start, DECODE_CHUNK_ROWS)


def _concat(parts: list[pa.Array], type_: pa.DataType) -> pa.ChunkedArray:
    return pa.chunked_array(parts, type=type_)


# --- key decoding -----------------------------------------------------------------------------------------


def _decode_chunk(keys: pa.Array) -> tuple[pa.Array, pa.Array, pa.Array, pa.Array, pa.Array]:
    n = len(keys)
    offsets, data = _buffers(keys)
    starts, ends = offsets[:-1], offsets[1:]
    lead = leading_bytes(keys)
    # pc.binary_slice mis-sizes its output on sliced arrays (pyarrow 26), so the tail after the prefix byte is gathered
    rest = _gather(data, starts + 1, np.maximum(ends - starts - 1, 0))
    sep = pc.find_substring(rest, "|").to_numpy(zero_copy_only=False).astype(np.int64)
    has_sep = (sep >= 0) & (ends > starts)
    is_raw = ~has_sep
    is_keyed = has_sep & (lead < NUM_KEY_GROUPS)
    slot_len = np.where(has_sep, sep, 0)
    user_start = np.where(has_sep, starts + 2 + sep, starts)
    user_key = _gather(data, user_start, ends - user_start)
    slot_bytes = _gather(data, starts + 1, slot_len)
    # slots repeat a lot: decode each distinct slot once (backslashreplace keeps a broken slot visible)
    encoded = pc.dictionary_encode(slot_bytes)
    distinct = encoded.dictionary.to_pylist()
    names = [b.decode("utf-8", errors="backslashreplace") for b in distinct]
    clean = np.array([_clean_slot(b) for b in distinct], dtype=bool)
    indices = encoded.indices.to_numpy(zero_copy_only=False)
    slot = pa.array(names, pa.string()).take(encoded.indices) if n else pa.array([], pa.string())
    slot = pc.if_else(pa.array(is_raw), pa.scalar(RAW_SLOT, pa.string()), slot)
    slot_ok = clean[indices] | is_raw if n else np.zeros(0, dtype=bool)
    key_group = pa.array(lead, pa.uint8(), mask=~is_keyed)
    kind = np.where(is_raw, "raw", np.where(is_keyed, "keyed", "operator"))
    return key_group, slot, user_key, pa.array(kind, pa.string()), pa.array(slot_ok, pa.bool_())


def _clean_slot(name: bytes) -> bool:
    """A slot name as slot creation allows it: UTF-8, no newline ('|' cannot occur before the split)."""
    try:
        name.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return b"\n" not in name


def decode_keys(key_bytes: pa.Array | pa.ChunkedArray) -> pa.Table:
    """Split key_bytes into kind, key_group (null unless keyed), slot, user_key and slot_ok, vectorised per chunk.

    Keyed rows are [kg][slot]|[user key], operator rows [0xFF][slot]|[user key]; a key without '|'
    after its prefix byte is a legacy raw key: slot <raw>, user_key the whole key.
    """
    kgs, slots, users, kinds, oks = [], [], [], [], []
    for chunk in _chunks(key_bytes):
        kg, slot, user, kind, ok = _decode_chunk(chunk)
        kgs.append(kg)
        slots.append(slot)
        users.append(user)
        kinds.append(kind)
        oks.append(ok)
    return pa.table(
        {
            "kind": _concat(kinds, pa.string()),
            "key_group": _concat(kgs, pa.uint8()),
            "slot": _concat(slots, pa.string()),
            "user_key": _concat(users, pa.binary()),
            "slot_ok": _concat(oks, pa.bool_()),
        }
    )


# --- rendering --------------------------------------------------------------------------------------------


def utf8_valid_mask(arr: pa.Array, rows: np.ndarray | None = None) -> np.ndarray:
    """Per row: are the bytes well-formed UTF-8 (no overlongs, surrogates or truncated sequences)? Vectorised over bytes.

    With ``rows`` (a boolean mask) only those rows are checked; the others read as valid.
    """
    arr = _as_binary_array(arr)
    n = len(arr)
    offsets, data = _buffers(arr)
    lengths = offsets[1:] - offsets[:-1]
    if rows is not None:
        lengths = np.where(rows, lengths, 0)
    if n == 0 or int(lengths.sum()) == 0:
        return np.ones(n, dtype=bool)
    row_of_byte = np.repeat(np.arange(n, dtype=np.int64), lengths)
    starts = np.repeat(offsets[:-1] - (np.cumsum(lengths) - lengths), lengths)
    high = data[starts + np.arange(row_of_byte.size, dtype=np.int64)] >= 0x80
    if not high.any():
        return np.ones(n, dtype=bool)  # pure ASCII, the common case for text keys
    # only rows holding a byte >= 0x80 need the full check
    suspects = np.flatnonzero(np.bincount(row_of_byte[high], minlength=n))
    out = np.ones(n, dtype=bool)
    out[suspects] = _utf8_valid_rows(data, offsets[:-1][suspects], lengths[suspects])
    return out


def _utf8_valid_rows(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    n = len(starts)
    sub = _gather(data, starts, lengths)
    offsets, raw = _buffers(sub)
    b = raw[: int(offsets[-1])]
    total = b.size
    row = np.repeat(np.arange(n, dtype=np.int64), lengths)
    cont = (b & 0xC0) == 0x80
    seq_len = np.select(
        [b < 0x80, (b >= 0xC2) & (b <= 0xDF), (b >= 0xE0) & (b <= 0xEF), (b >= 0xF0) & (b <= 0xF4)],
        [1, 2, 3, 4],
        default=0,
    )
    bad = ~cont & (seq_len == 0)
    covered = np.zeros(total, dtype=np.int8)
    pos = np.arange(total, dtype=np.int64)
    for k in (1, 2, 3):
        leads = pos[seq_len > k]
        target = leads + k
        inside = target < total
        ok = np.zeros(leads.size, dtype=bool)
        ok[inside] = row[target[inside]] == row[leads[inside]]
        bad[leads[~ok]] = True
        # targets of distinct leads never coincide in well-formed text; where they do, the count exceeds 1 and flags it
        np.add.at(covered, target[ok], 1)
    bad |= cont & (covered != 1)
    bad |= ~cont & (covered != 0)
    # second-byte limits that rule out overlong forms, surrogates and code points above U+10FFFF
    nxt = np.empty(total, dtype=np.uint8)
    nxt[:-1] = b[1:]
    nxt[-1] = 0
    bad |= (b == 0xE0) & (nxt < 0xA0)
    bad |= (b == 0xED) & (nxt > 0x9F)
    bad |= (b == 0xF0) & (nxt < 0x90)
    bad |= (b == 0xF4) & (nxt > 0x8F)
    return np.bincount(row[bad], minlength=n) == 0


def _hex(arr: pa.Array) -> pa.Array:
    """Lower-case hex of every row with a 0x prefix, from one table lookup over the data bytes."""
    n = len(arr)
    offsets, data = _buffers(arr)
    body = _HEX_LUT[data[offsets[0] : offsets[-1]]].ravel()
    rel = offsets - offsets[0]
    # every row gains "0x" (2 bytes) in front of 2 hex chars per byte
    new_offsets = rel * 2 + 2 * np.arange(n + 1, dtype=np.int64)
    out = np.empty(int(new_offsets[-1]), dtype=np.uint8)
    prefix_pos = new_offsets[:-1]
    out[prefix_pos] = ord("0")
    out[prefix_pos + 1] = ord("x")
    lengths = (offsets[1:] - offsets[:-1]) * 2
    if body.size:
        dest = np.repeat(prefix_pos + 2 - rel[:-1] * 2, lengths) + np.arange(body.size, dtype=np.int64)
        out[dest] = body
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(new_offsets.astype(np.int32)), pa.py_buffer(out)])


def int64_readings(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Little-endian int64 of every 8-byte row, null for any other length."""
    arr = _as_binary_array(arr)
    n = len(arr)
    offsets, data = _buffers(arr)
    is8 = (offsets[1:] - offsets[:-1]) == 8
    values = np.zeros(n, dtype=np.int64)
    if is8.any():
        gather = offsets[:-1][is8, None] + np.arange(8)
        values[is8] = data[gather].copy().view("<i8").ravel()
    return pa.array(values, pa.int64(), mask=~is8)


# what "printable" means for rendering: valid UTF-8, every character printable, and not empty or only spaces
PRINTABLE_RULE = (
    "printable UTF-8 (valid UTF-8 of at least one character that is not a space, with no control, format, "
    "line or paragraph separator, private-use or unassigned character: Python's str.isprintable)"
)


def printable_mask(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Per row: do the bytes render as text (PRINTABLE_RULE)? Vectorised: a UTF-8 check over bytes, then Arrow kernels."""
    arr = _as_binary_array(arr)
    valid = utf8_valid_mask(arr)
    # invalid rows become "" before the cast, so Arrow never sees them as text (and "" is not printable below)
    as_text = (arr if valid.all() else pc.if_else(pa.array(valid), arr, pa.scalar(b"", pa.binary()))).cast(pa.string())
    printable = pc.utf8_is_printable(as_text)
    visible = pc.greater(pc.binary_length(pc.utf8_trim(as_text, characters=" ")), 0)
    return np.asarray(pc.and_(printable, visible).to_numpy(zero_copy_only=False), dtype=bool) & valid


# text that would read as another rendering (a decimal int64 or 0x-hex): displays quote it
_LOOKS_RENDERED = r"^(-?[0-9]+|0x[0-9a-f]*)$"


def render_bytes(arr: pa.Array | pa.ChunkedArray, quote_lookalikes: bool = False) -> tuple[pa.Array, pa.Array]:
    """(text, int64) renderings of every row: printable UTF-8 as text (whatever its length), else 8 bytes as int64, else 0x-hex.

    The int64 is the little-endian reading of every 8-byte row, text or not (null for other lengths).
    ``quote_lookalikes`` (displays): text that reads as a number or as hex is shown in double quotes ("123"), so the
    text key "12345678" and the int64 key 12345678 look different; the query projection keeps text as it is.
    """
    arr = _as_binary_array(arr)
    ints = int64_readings(arr)
    is8 = ~np.asarray(ints.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    printable = printable_mask(arr)
    # rows that are not printable are blanked before the cast: Arrow may only hold valid UTF-8 as a string
    text = (arr if printable.all() else pc.if_else(pa.array(printable), arr, pa.scalar(b"", pa.binary()))).cast(pa.string())
    if quote_lookalikes and printable.any():
        lookalike = pc.and_(pa.array(printable), pc.match_substring_regex(text, _LOOKS_RENDERED))
        if pc.any(lookalike).as_py():
            text = pc.if_else(lookalike, pc.binary_join_element_wise(pa.scalar('"'), text, pa.scalar('"'), ""), text)
    use_int = is8 & ~printable
    if use_int.any():
        text = pc.if_else(pa.array(use_int), pc.cast(ints, pa.string()), text)
    needs_hex = ~printable & ~is8
    if needs_hex.any():
        # hex only for the rows that need it, scattered into place
        text = pc.replace_with_mask(text, pa.array(needs_hex), _hex(arr.filter(pa.array(needs_hex))))
    return text, ints


def preview(text: pa.Array, width: int) -> pa.Array:
    """Rendered text cut to ``width`` characters, with an ellipsis where something was cut."""
    cut = pc.utf8_slice_codeunits(text, 0, width)
    longer = pc.greater(pc.utf8_length(text), width)
    return pc.if_else(longer, pc.binary_join_element_wise(cut, pa.scalar("…"), ""), cut)


# --- the projections --------------------------------------------------------------------------------------


def projection_metadata(format_version: int, state_versions: StateVersionMap, projection: str) -> dict[bytes, bytes]:
    """Key-value metadata carried by every derived file: the source's format version and state versions."""
    return {
        FORMAT_VERSION_KEY: str(format_version or FORMAT_VERSION).encode(),
        STATE_VERSIONS_KEY: state_versions.pack().encode(),
        PROJECTION_KEY: projection.encode(),
    }


def parquet_projection(table: pa.Table, format_version: int = FORMAT_VERSION, state_versions: StateVersionMap | None = None) -> pa.Table:
    """op_id uint64, key_group uint8 (null for operator/raw rows), slot utf8, user_key binary, value_bytes binary."""
    decoded = decode_keys(table.column("key_bytes"))
    out = pa.table(
        [
            table.column("op_id"),
            decoded.column("key_group"),
            decoded.column("slot"),
            decoded.column("user_key"),
            table.column("value_bytes"),
        ],
        schema=PARQUET_SCHEMA,
    )
    return out.replace_schema_metadata(projection_metadata(format_version, state_versions or StateVersionMap(), "parquet/1"))


# the projections a Parquet file clink wrote declares (clink.projection); each holds the five columns of PARQUET_SCHEMA
READABLE_PROJECTIONS = ("parquet/1", "query/1")


def canonical_from_projection(table: pa.Table) -> pa.Table:
    """The canonical table (op_id, key_bytes, value_bytes) back from the Parquet projection's five columns, vectorised.

    Keyed rows become [kg][slot]|[user key], operator rows [0xFF][slot]|[user key], raw rows (slot <raw>) their user key.
    """
    n = table.num_rows
    key_group = table.column("key_group").combine_chunks()
    slot = table.column("slot").combine_chunks()
    if pa.types.is_dictionary(slot.type):
        slot = slot.dictionary_decode()
    slot = slot.cast(pa.binary())
    user_key = _as_binary_array(table.column("user_key"))
    keyed = np.asarray(key_group.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    lead = np.where(keyed, np.asarray(key_group.fill_null(0).to_numpy(zero_copy_only=False)), 0xFF).astype(np.uint8)
    # one byte per row, as a binary array over the lead bytes (offsets 0, 1, 2, ...)
    prefix = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(np.arange(n + 1, dtype=np.int32)), pa.py_buffer(lead)])
    empty = pa.scalar(b"", pa.binary())
    joined = pc.binary_join_element_wise(prefix, slot, pa.scalar(b"|", pa.binary()), user_key, empty)
    is_raw = pc.and_(pa.array(~keyed), pc.equal(slot, pa.scalar(RAW_SLOT.encode(), pa.binary())))
    key_bytes = pc.if_else(is_raw, user_key, joined)
    return pa.table(
        {
            "op_id": table.column("op_id").cast(pa.uint64()),
            "key_bytes": key_bytes,
            "value_bytes": table.column("value_bytes").cast(pa.binary()),
        }
    )


def signed_op_ids(op_ids: pa.Array | pa.ChunkedArray) -> pa.Array:
    """uint64 op ids bit-cast (not converted) to int64, as Iceberg stores them."""
    values = np.asarray(op_ids.to_numpy(zero_copy_only=False), dtype=np.uint64)
    return pa.array(values.view(np.int64), pa.int64())


def unsigned_op_ids(op_ids: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The inverse of signed_op_ids."""
    values = np.asarray(op_ids.to_numpy(zero_copy_only=False), dtype=np.int64)
    return pa.array(values.view(np.uint64), pa.uint64())


def iceberg_projection(table: pa.Table) -> pa.Table:
    """The Parquet projection in Iceberg types: op_id bit-cast to int64, key_group as int32."""
    parquet = parquet_projection(table)
    return pa.table(
        [
            signed_op_ids(parquet.column("op_id")),
            parquet.column("key_group").cast(pa.int32()),
            parquet.column("slot"),
            parquet.column("user_key"),
            parquet.column("value_bytes"),
        ],
        schema=ICEBERG_ARROW_SCHEMA,
    )


def query_projection(table: pa.Table) -> pa.Table:
    """The Parquet projection plus kind, rendered key/value text and int64 readings, for SQL filtering."""
    decoded = decode_keys(table.column("key_bytes"))
    user_key = decoded.column("user_key").combine_chunks()
    values = _as_binary_array(table.column("value_bytes"))
    key_text, key_int = render_bytes(user_key)
    value_text, value_int = render_bytes(values)
    return pa.table(
        [
            table.column("op_id"),
            decoded.column("key_group"),
            decoded.column("slot"),
            user_key,
            values,
            decoded.column("kind"),
            key_text,
            key_int,
            pc.binary_length(values).cast(pa.int64()),
            value_text,
            value_int,
        ],
        schema=QUERY_SCHEMA,
    )


def key_groups_of(user_keys: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """FNV-1a 64 mod 128 of every user key, vectorised over rows: one numpy step per byte position, shortest keys drop out first."""
    arr = _as_binary_array(user_keys)
    offsets, data = _buffers(arr)
    return key_groups_of_runs(data, offsets[:-1], offsets[1:] - offsets[:-1])
