"""Key layout of the format: key groups, operator ids, and key_bytes encoding."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from snapshot.errors import InvalidArgumentError

NUM_KEY_GROUPS = 128
OPERATOR_STATE_PREFIX = 0xFF
RAW_SLOT = "<raw>"
SEPARATOR = b"|"
FNV_OFFSET_BASIS = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
_MASK64 = 0xFFFFFFFFFFFFFFFF


def fnv1a64(data: bytes) -> int:
    """FNV-1a 64-bit hash of ``data``."""
    h = FNV_OFFSET_BASIS
    for byte in data:
        h = ((h ^ byte) * FNV_PRIME) & _MASK64
    return h


def key_group(user_key: bytes) -> int:
    """The key group (0..127) of a user key: FNV-1a 64-bit mod 128."""
    return fnv1a64(bytes(user_key)) % NUM_KEY_GROUPS


def key_groups_of_runs(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """FNV-1a 64 mod 128 of the byte runs data[start:start+length] (uint8), vectorised: one numpy step per byte position.

    Rows still hashing at byte j form a prefix of the length-descending order, so the longest key sets the step count.
    """
    n = len(starts)
    order = np.argsort(-lengths, kind="stable")
    first, length = starts[order], lengths[order]
    h = np.full(n, FNV_OFFSET_BASIS, dtype=np.uint64)
    prime = np.uint64(FNV_PRIME)
    longest = int(length[0]) if n else 0
    active = np.searchsorted(-length, -(np.arange(longest) + 1), side="right")
    with np.errstate(over="ignore"):
        for j in range(longest):
            m = int(active[j])
            h[:m] = (h[:m] ^ data[first[:m] + j].astype(np.uint64)) * prime
    out = np.empty(n, dtype=np.uint8)
    out[order] = (h % np.uint64(NUM_KEY_GROUPS)).astype(np.uint8)
    return out


def operator_id(uid: str) -> int:
    """An operator's id: first 8 bytes of SHA-256 of its uid (UTF-8), little-endian."""
    if not isinstance(uid, str):
        raise InvalidArgumentError(f"operator uid must be a str, got {type(uid).__name__}")
    return int.from_bytes(hashlib.sha256(uid.encode("utf-8")).digest()[:8], "little")


def check_key_group_range(lo: object, hi: object, refuse_bools: bool = False) -> tuple[int, int]:
    """An inclusive key-group range (lo, hi) as given, or InvalidArgumentError unless they are ints with 0 <= lo <= hi <= 127."""
    if (
        not (isinstance(lo, int) and isinstance(hi, int))
        or (refuse_bools and (isinstance(lo, bool) or isinstance(hi, bool)))
        or not 0 <= lo <= hi < NUM_KEY_GROUPS
    ):
        raise InvalidArgumentError(f"key-group range {lo}-{hi} must satisfy 0 <= lo <= hi <= {NUM_KEY_GROUPS - 1}")
    return lo, hi


def validate_slot(slot: str) -> bytes:
    """Check a slot name at creation and return its UTF-8 bytes; '|' and newline are refused."""
    if not isinstance(slot, str):
        raise InvalidArgumentError(f"slot name must be a str, got {type(slot).__name__}")
    if "|" in slot or "\n" in slot:
        raise InvalidArgumentError(f"slot name {slot!r} must not contain '|' or a newline")
    if slot == RAW_SLOT:
        raise InvalidArgumentError(f"slot name {RAW_SLOT!r} is reserved for legacy raw keys")
    return slot.encode("utf-8")


def _user_key_bytes(user_key: object) -> bytes:
    # bytes() would take an int as a length (that many NULs) and fail on a str with a TypeError
    if not isinstance(user_key, bytes | bytearray | memoryview):
        raise InvalidArgumentError(f"user key must be bytes, got {type(user_key).__name__}")
    return bytes(user_key)


def encode_keyed_key(slot: str, user_key: bytes) -> bytes:
    """key_bytes of a keyed-state entry: [kg][slot]|[user key]."""
    user_key = _user_key_bytes(user_key)
    return bytes([key_group(user_key)]) + validate_slot(slot) + SEPARATOR + user_key


def encode_operator_key(slot: str, user_key: bytes) -> bytes:
    """key_bytes of an operator-state entry: [0xFF][slot]|[user key]."""
    return bytes([OPERATOR_STATE_PREFIX]) + validate_slot(slot) + SEPARATOR + _user_key_bytes(user_key)


@dataclass(frozen=True)
class DecodedKey:
    """The parts of a key_bytes value."""

    kind: str  # "keyed", "operator" or "raw"
    key_group: int | None
    slot: str
    user_key: bytes


def decode_key(key_bytes: bytes) -> DecodedKey:
    """Split key_bytes at the first '|' after the prefix byte; no '|' means a legacy raw key."""
    key_bytes = bytes(key_bytes)
    sep = key_bytes.find(SEPARATOR, 1)
    if not key_bytes or sep < 0:
        return DecodedKey("raw", None, RAW_SLOT, key_bytes)
    prefix = key_bytes[0]
    slot = key_bytes[1:sep].decode("utf-8", errors="backslashreplace")
    user_key = key_bytes[sep + 1 :]
    if prefix >= NUM_KEY_GROUPS:
        return DecodedKey("operator", None, slot, user_key)
    return DecodedKey("keyed", prefix, slot, user_key)


def leading_bytes(key_bytes: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The first byte of every key as a uint8 numpy array (0 for an empty key), vectorised."""
    if isinstance(key_bytes, pa.ChunkedArray):
        if key_bytes.num_chunks == 0:
            return np.zeros(0, dtype=np.uint8)
        return (
            np.concatenate([leading_bytes(c) for c in key_bytes.chunks]) if key_bytes.num_chunks > 1 else leading_bytes(key_bytes.chunk(0))
        )
    n = len(key_bytes)
    if n == 0:
        return np.zeros(0, dtype=np.uint8)
    if pa.types.is_large_binary(key_bytes.type):
        off_dtype = np.int64
    else:
        off_dtype = np.int32
    _, off_buf, data_buf = key_bytes.buffers()
    offsets = np.frombuffer(off_buf, dtype=off_dtype, count=n + 1, offset=key_bytes.offset * np.dtype(off_dtype).itemsize)
    starts = offsets[:-1]
    lengths = offsets[1:] - starts
    if data_buf is None or data_buf.size == 0:
        return np.zeros(n, dtype=np.uint8)
    data = np.frombuffer(data_buf, dtype=np.uint8)
    safe = np.minimum(starts, max(data.size - 1, 0))
    return np.where(lengths > 0, data[safe], 0).astype(np.uint8, copy=False)
