"""Typed views over a state backend: keyed and operator state by slot and user key, int64 values, TTL slots, lists and maps."""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

import snapshot
from client.errors import InvalidArgumentError
from snapshot.collections import append_to_list, decode_list, decode_map, encode_list, encode_map

__all__ = [
    "KeyedInt64State",
    "KeyedState",
    "ListState",
    "MapState",
    "OperatorInt64State",
    "OperatorState",
    "StateBackend",
    "TtlState",
    "TtlStateBackend",
    "decode_int64",
    "decode_list",
    "decode_map",
    "encode_int64",
    "encode_list",
    "encode_map",
]

_I64 = struct.Struct("<q")


class StateBackend(Protocol):
    """What a view needs of a backend: RemoteReadBackend and RocksDBStateBackend both have it (op_id, key_bytes addressing)."""

    def register_operator(self, uid: str, /) -> int: ...

    def put(self, op_id: int, key_bytes: bytes, value: bytes, /) -> None: ...

    def get(self, op_id: int, key_bytes: bytes, /) -> bytes | None: ...

    def erase(self, op_id: int, key_bytes: bytes, /) -> None: ...

    def get_many(self, op_id: int, keys: Sequence[bytes], /) -> list[bytes | None]: ...


class _Clocked(Protocol):
    @property
    def clock_ms(self) -> Callable[[], int]: ...


class TtlStateBackend(StateBackend, Protocol):
    """A backend that can hold TTL slots: it knows them (to leave expired values out of exports) and has a clock."""

    @property
    def config(self) -> _Clocked: ...

    def register_ttl_slot(self, op_id: int, slot: str, /, keyed: bool = True) -> None: ...


def _op_id(backend: StateBackend, operator: str | int) -> int:
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

    def __init__(self, backend: StateBackend, operator: str | int, slot: str) -> None:
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

    backend: TtlStateBackend

    def __init__(self, backend: TtlStateBackend, operator: str | int, slot: str, ttl_ms: int) -> None:
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


class _CollectionState:
    """One keyed slot whose value per user key is a whole collection, read and written whole (the seed's rule)."""

    kind = "collection"

    def __init__(self, backend: StateBackend, operator: str | int, slot: str) -> None:
        self.raw = KeyedState(backend, operator, slot)  # the stored bytes, for readers that decode themselves
        self.backend = backend
        self.op_id = self.raw.op_id
        self.slot = slot

    def key(self, user_key: bytes) -> bytes:
        """key_bytes of a user key in this slot."""
        return self.raw.key(user_key)

    def _what(self, user_key: bytes) -> str:
        shown = bytes(user_key) if isinstance(user_key, bytes | bytearray | memoryview) else user_key
        return f"{self.kind} of slot {self.slot!r} user key {shown!r} (op_id {self.op_id})"

    def _store(self, user_key: bytes, value: bytes | None) -> None:
        # an empty collection is no row: absent and empty are one state, so exports and restores never differ on it
        if value is None:
            self.raw.erase(user_key)
        else:
            self.raw.put(user_key, value)

    def clear(self, user_key: bytes) -> None:
        """Remove the whole collection of ``user_key`` (erase its row)."""
        self.raw.erase(user_key)


class ListState(_CollectionState):
    """Keyed list state: per user key a list of bytes elements, stored as one list value (snapshot/collections.py).

    Every mutation is a read-modify-write of that one value: ``add`` reads the list, appends and writes it all back,
    so its cost grows with the list's size (building a list of n elements one ``add`` at a time moves O(n²) bytes;
    ``add_all`` appends a batch in one write). An empty list erases the key: absent and empty are the same state, and
    ``get`` answers ``[]`` for both. Mutations of one user key are not atomic across threads; a subtask owns its keys.
    """

    kind = "list"

    def _decode(self, user_key: bytes, raw: bytes | None) -> list[bytes]:
        return [] if raw is None else decode_list(raw, self._what(user_key))

    def _encode(self, user_key: bytes, values: Iterable[bytes]) -> bytes | None:
        encoded = encode_list(values, self._what(user_key))
        return None if encoded == _EMPTY else encoded

    def get(self, user_key: bytes) -> list[bytes]:
        """The list of ``user_key`` (``[]`` when absent); a malformed stored value is a CorruptDataError naming the key."""
        return self._decode(user_key, self.raw.get(user_key))

    def get_many(self, user_keys: Sequence[bytes]) -> list[list[bytes]]:
        """The lists of many user keys in order, misses fetched in one MultiGet."""
        return [self._decode(k, raw) for k, raw in zip(user_keys, self.raw.get_many(user_keys), strict=True)]

    def add(self, user_key: bytes, value: bytes) -> None:
        """Append one element (a read-modify-write of the whole list)."""
        self.add_all(user_key, [value])

    def add_all(self, user_key: bytes, values: Iterable[bytes]) -> None:
        """Append elements in order with one read and one write; appending nothing writes nothing."""
        what = self._what(user_key)
        added = encode_list(values, what)  # checked before the read: bad input changes nothing
        if added == _EMPTY:
            return
        old = self.raw.get(user_key)
        self._store(user_key, added if old is None else append_to_list(old, added, what))

    def update(self, user_key: bytes, values: Iterable[bytes]) -> None:
        """Replace the list with ``values`` (no read); an empty ``values`` erases the key."""
        self._store(user_key, self._encode(user_key, values))


class MapState(_CollectionState):
    """Keyed map state: per user key a map of bytes keys to bytes values, stored as one map value (snapshot/collections.py).

    Every mutation is a read-modify-write of that one value: ``put`` reads the map, changes one entry and writes the
    whole map back, so its cost (and a point ``get``'s) grows with the map's size; ``put_all`` changes a batch in one
    write. Removing the last entry erases the key: absent and empty are the same state (``items`` answers ``{}``).
    Mutations of one user key are not atomic across threads; a subtask owns its keys.
    """

    kind = "map"

    def _decode(self, user_key: bytes, raw: bytes | None) -> dict[bytes, bytes]:
        return {} if raw is None else decode_map(raw, self._what(user_key))

    def _write(self, user_key: bytes, entries: Mapping[bytes, bytes]) -> None:
        encoded = encode_map(entries, self._what(user_key))
        self._store(user_key, None if encoded == _EMPTY else encoded)

    def _checked(self, user_key: bytes, entries: Mapping[bytes, bytes]) -> dict[bytes, bytes]:
        """``entries`` as a map of bytes, checked by encoding them before anything is read or written."""
        return decode_map(encode_map(entries, self._what(user_key)))

    def items(self, user_key: bytes) -> dict[bytes, bytes]:
        """The whole map of ``user_key`` in key order (``{}`` when absent)."""
        return self._decode(user_key, self.raw.get(user_key))

    def items_many(self, user_keys: Sequence[bytes]) -> list[dict[bytes, bytes]]:
        """The maps of many user keys in order, misses fetched in one MultiGet."""
        return [self._decode(k, raw) for k, raw in zip(user_keys, self.raw.get_many(user_keys), strict=True)]

    def get(self, user_key: bytes, map_key: bytes) -> bytes | None:
        """The value of ``map_key`` in the map of ``user_key`` (None when absent); decodes the whole map."""
        return self.items(user_key).get(self._map_key(user_key, map_key))

    def contains(self, user_key: bytes, map_key: bytes) -> bool:
        """Whether the map of ``user_key`` holds ``map_key``."""
        return self.get(user_key, map_key) is not None

    def keys(self, user_key: bytes) -> list[bytes]:
        """The map's keys in ascending byte order."""
        return list(self.items(user_key))

    def values(self, user_key: bytes) -> list[bytes]:
        """The map's values in the order of their keys."""
        return list(self.items(user_key).values())

    def put(self, user_key: bytes, map_key: bytes, value: bytes) -> None:
        """Set one entry (a read-modify-write of the whole map)."""
        self.put_all(user_key, {map_key: value})

    def put_all(self, user_key: bytes, entries: Mapping[bytes, bytes]) -> None:
        """Set many entries with one read and one write; an empty ``entries`` writes nothing."""
        new = self._checked(user_key, entries)
        if new:
            self._write(user_key, {**self.items(user_key), **new})

    def remove(self, user_key: bytes, map_key: bytes) -> None:
        """Remove one entry; removing the last erases the key, removing an absent one writes nothing."""
        key = self._map_key(user_key, map_key)
        current = self.items(user_key)
        if current.pop(key, None) is not None:
            self._write(user_key, current)

    def _map_key(self, user_key: bytes, map_key: object) -> bytes:
        if not isinstance(map_key, bytes | bytearray | memoryview):
            raise InvalidArgumentError(f"{self._what(user_key)}: map key must be bytes, got {type(map_key).__name__}")
        return bytes(map_key)


_EMPTY = encode_list([])  # the 4-byte zero count: an empty list and an empty map encode alike
