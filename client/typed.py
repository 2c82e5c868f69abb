"""Typed views over a RemoteReadBackend: keyed and operator state by slot and user key, int64 values, TTL slots."""

from __future__ import annotations

import struct
from collections.abc import Sequence

import snapshot
from client.backend import RemoteReadBackend
from client.errors import InvalidArgumentError

_I64 = struct.Struct("<q")


def _op_id(backend: RemoteReadBackend, operator: str | int) -> int:
    """An operator given by uid (registered with the backend) or by op_id."""
    if isinstance(operator, str):
        return backend.register_operator(operator)
    if isinstance(operator, int) and not isinstance(operator, bool) and 0 <= operator < 1 << 64:
        return operator
    raise InvalidArgumentError(f"operator must be a uid string or a uint64 op_id, got {operator!r}")


def encode_int64(value: int) -> bytes:
    """8 bytes little-endian of a signed 64-bit int."""
    if not isinstance(value, int) or isinstance(value, bool) or not -(1 << 63) <= value < 1 << 63:
        raise InvalidArgumentError(f"value {value!r} is not a signed 64-bit int")
    return _I64.pack(value)


def decode_int64(raw: bytes | None) -> int | None:
    """The int64 of an 8-byte little-endian value (None stays None)."""
    if raw is None:
        return None
    if len(raw) != 8:
        raise InvalidArgumentError(f"int64 state value must be 8 bytes, got {len(raw)}")
    return _I64.unpack(raw)[0]


class KeyedState:
    """Keyed state of one operator slot: bytes values addressed by user key ([kg][slot]|[user key])."""

    def __init__(self, backend: RemoteReadBackend, operator: str | int, slot: str) -> None:
        snapshot.validate_slot(slot)
        self.backend = backend
        self.op_id = _op_id(backend, operator)
        self.slot = slot

    def key(self, user_key: bytes) -> bytes:
        """key_bytes of a user key in this slot."""
        return snapshot.encode_keyed_key(self.slot, user_key)

    def get(self, user_key: bytes) -> bytes | None:
        """The value for ``user_key`` (None when absent)."""
        return self.backend.get(self.op_id, self.key(user_key))

    def get_many(self, user_keys: Sequence[bytes]) -> list[bytes | None]:
        """Values of many user keys in order, misses fetched in one MultiGet."""
        return self.backend.get_many(self.op_id, [self.key(k) for k in user_keys])

    def put(self, user_key: bytes, value: bytes) -> None:
        """Set the value for ``user_key``."""
        self.backend.put(self.op_id, self.key(user_key), value)

    def erase(self, user_key: bytes) -> None:
        """Remove ``user_key``."""
        self.backend.erase(self.op_id, self.key(user_key))


class KeyedInt64State(KeyedState):
    """Keyed state holding signed 64-bit ints."""

    def get(self, user_key: bytes) -> int | None:  # type: ignore[override]
        """The int for ``user_key`` (None when absent)."""
        return decode_int64(super().get(user_key))

    def get_many(self, user_keys: Sequence[bytes]) -> list[int | None]:  # type: ignore[override]
        """Ints of many user keys in order."""
        return [decode_int64(v) for v in super().get_many(user_keys)]

    def put(self, user_key: bytes, value: int) -> None:  # type: ignore[override]
        """Set the int for ``user_key``."""
        super().put(user_key, encode_int64(value))

    def add(self, user_key: bytes, amount: int = 1) -> int:
        """Add to the int for ``user_key`` (absent counts as 0) and return the new value."""
        value = (self.get(user_key) or 0) + amount
        self.put(user_key, value)
        return value


class OperatorState(KeyedState):
    """Operator (non-keyed) state of one slot: [0xFF][slot]|[user key]; every subtask sees it after a rescale."""

    def key(self, user_key: bytes = b"") -> bytes:
        """key_bytes of a user key in this operator slot."""
        return snapshot.encode_operator_key(self.slot, user_key)

    def get(self, user_key: bytes = b"") -> bytes | None:
        """The value (None when absent)."""
        return super().get(user_key)

    def put(self, user_key: bytes = b"", value: bytes = b"") -> None:
        """Set the value."""
        super().put(user_key, value)


class OperatorInt64State(OperatorState):
    """Operator state holding a signed 64-bit int, e.g. a source offset."""

    def get(self, user_key: bytes = b"") -> int | None:  # type: ignore[override]
        """The int (None when absent)."""
        return decode_int64(OperatorState.get(self, user_key))

    def set(self, value: int, user_key: bytes = b"") -> None:
        """Set the int."""
        OperatorState.put(self, user_key, encode_int64(value))


class TtlState(KeyedState):
    """Keyed state whose values expire: stored as 8-byte little-endian expire-at-ms + value.

    An expired value reads as absent and is left out of exports; the backend's clock decides.
    """

    def __init__(self, backend: RemoteReadBackend, operator: str | int, slot: str, ttl_ms: int) -> None:
        super().__init__(backend, operator, slot)
        if not isinstance(ttl_ms, int) or ttl_ms <= 0:
            raise InvalidArgumentError(f"ttl_ms must be a positive int, got {ttl_ms!r}")
        self.ttl_ms = ttl_ms
        backend.register_ttl_slot(self.op_id, slot, keyed=True)

    def _unwrap(self, raw: bytes | None) -> bytes | None:
        if raw is None or len(raw) < 8:
            return None
        if _I64.unpack_from(raw)[0] <= self.backend.config.clock_ms():
            return None
        return raw[8:]

    def get(self, user_key: bytes) -> bytes | None:
        """The value unless absent or expired."""
        return self._unwrap(super().get(user_key))

    def get_many(self, user_keys: Sequence[bytes]) -> list[bytes | None]:
        """Values of many user keys, expired ones as None."""
        return [self._unwrap(v) for v in super().get_many(user_keys)]

    def put(self, user_key: bytes, value: bytes, ttl_ms: int | None = None) -> None:
        """Set the value, expiring ``ttl_ms`` (default: the slot's) from the backend's clock now."""
        expire_at = self.backend.config.clock_ms() + (self.ttl_ms if ttl_ms is None else ttl_ms)
        super().put(user_key, _I64.pack(expire_at) + bytes(value))
