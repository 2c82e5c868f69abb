"""StateVersionMap: the packed `<op_id>|<state_type>|<version>` lines of clink.state_versions."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from snapshot.errors import CorruptSnapshotError, InvalidArgumentError

_U64_MAX = (1 << 64) - 1


def _parse_uint(text: str, what: str, line: str, bits: int) -> int:
    if not text or not text.isascii() or not text.isdigit():
        raise CorruptSnapshotError(f"clink.state_versions: {what} {text!r} in line {line!r} is not a non-negative integer")
    value = int(text)
    if value > (1 << bits) - 1:
        raise CorruptSnapshotError(f"clink.state_versions: {what} {text!r} in line {line!r} is out of range")
    return value


class StateVersionMap(Mapping[tuple[int, str], int]):
    """Schema-evolution stamps: (op_id, state_type) -> version."""

    def __init__(self, entries: Mapping[tuple[int, str], int] | Iterable[tuple[int, str, int]] = ()) -> None:
        items = entries.items() if isinstance(entries, Mapping) else (((o, s), v) for o, s, v in entries)
        self._map: dict[tuple[int, str], int] = {}
        for (op_id, state_type), version in items:
            if not isinstance(op_id, int) or not 0 <= op_id <= _U64_MAX:
                raise InvalidArgumentError(f"state version op_id {op_id!r} must be a uint64")
            if not isinstance(state_type, str) or not state_type or any(c in state_type for c in "|\n"):
                raise InvalidArgumentError(f"state type {state_type!r} must be non-empty without '|' or newline")
            if not isinstance(version, int) or not 0 <= version <= 0xFFFFFFFF:
                raise InvalidArgumentError(f"state version {version!r} must be a uint32")
            self._map[(op_id, state_type)] = version

    def __getitem__(self, key: tuple[int, str]) -> int:
        return self._map[key]

    def __iter__(self) -> Iterator[tuple[int, str]]:
        return iter(self._map)

    def __len__(self) -> int:
        return len(self._map)

    def __repr__(self) -> str:
        return f"StateVersionMap({self._map!r})"

    def entries(self) -> list[tuple[int, str, int]]:
        """Entries sorted by (op_id, state_type)."""
        return [(o, s, v) for (o, s), v in sorted(self._map.items())]

    def pack(self) -> str:
        """Line-oriented text, sorted; empty string for an empty map."""
        return "\n".join(f"{o}|{s}|{v}" for o, s, v in self.entries())

    @classmethod
    def unpack(cls, packed: str | bytes) -> StateVersionMap:
        """Parse packed text; anything unparseable raises CorruptSnapshotError."""
        if isinstance(packed, bytes):
            try:
                packed = packed.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise CorruptSnapshotError(f"clink.state_versions is not UTF-8: {exc}") from exc
        if packed == "":
            return cls()
        entries = []
        for line in packed.split("\n"):
            parts = line.split("|")
            if len(parts) != 3:
                raise CorruptSnapshotError(f"clink.state_versions: line {line!r} is not <op_id>|<state_type>|<version>")
            op_text, state_type, version_text = parts
            if not state_type:
                raise CorruptSnapshotError(f"clink.state_versions: line {line!r} has an empty state type")
            entries.append((_parse_uint(op_text, "op_id", line, 64), state_type, _parse_uint(version_text, "version", line, 32)))
        return cls(entries)
