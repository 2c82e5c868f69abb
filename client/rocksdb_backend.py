"""RocksDBStateBackend: a local embedded state backend on RocksDB (rocksdict), and RocksDB checkpoints to the canonical stream."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import snapshot
from client.backend import _check_op_id, _check_range, checked_put_many, checked_state_key
from snapshot import NUM_KEY_GROUPS, StateVersionMap, check_key_group_range
from snapshot.errors import ClinkError, ConflictError, CorruptDataError, InvalidArgumentError, NotFoundError
from snapshot.format import operators_metadata
from snapshot.ttl import drop_expired

if TYPE_CHECKING:  # rocksdict is an optional extra (pip install clink-remote-state[rocksdb]): imported where it is used
    from rocksdict import Rdict

__all__ = [
    "METADATA_COLUMN_FAMILY",
    "METADATA_KEY",
    "OP_ID_BYTES",
    "RocksDBConfig",
    "RocksDBState",
    "RocksDBStateBackend",
    "check_rocksdb_directory",
    "read_rocksdb_checkpoint",
    "rocksdb_checkpoint_to_arrow",
]

OP_ID_BYTES = 8  # a RocksDB key is the op_id as 8 bytes big-endian, then key_bytes: byte order = operators, then keys
# operator uids, state versions and TTL slots live in their own column family: never among (nor colliding with) state rows
METADATA_COLUMN_FAMILY = "clink.metadata"
METADATA_KEY = b"layout"
LAYOUT_VERSION = 1
COMPRESSIONS = ("none", "lz4", "zstd", "snappy")
ROCKSDICT_CONFIG = "rocksdict-config.json"  # rocksdict writes this into a directory it opens when it is missing
_CURRENT = re.compile(rb"MANIFEST-[0-9]+\n?")
_KEY_SLICE_END = (1 << 31) - 1  # binary_slice's stop for "to the end" (Arrow binary values are shorter than 2 GiB)


def _wall_clock_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class RocksDBConfig:
    """A RocksDBStateBackend's settings: its key-group range, whether a missing directory is created, compression, TTL clock."""

    key_groups: tuple[int, int] = (0, NUM_KEY_GROUPS - 1)
    create_if_missing: bool = True
    compression: str = "lz4"  # of the SST files: "none", "lz4", "zstd" or "snappy"
    # milliseconds since the epoch; TTL slots compare their expire-at prefix against it (as RemoteReadBackend's)
    clock_ms: Callable[[], int] = _wall_clock_ms


@dataclass(frozen=True)
class RocksDBState:
    """A RocksDB directory as read: its canonical table (operators ascending, keys in byte order) and its metadata."""

    table: pa.Table
    state_versions: StateVersionMap
    operators: dict[int, str]
    ttl_slots: frozenset[tuple[int, str, bool]]

    def to_arrow(self) -> bytes:
        """The canonical snapshot stream, stamped with the state versions and the operators' uids."""
        return snapshot.SnapshotArrowWriter(self.state_versions, operators_metadata(self.operators)).write(self.table)


# --- directories ----------------------------------------------------------------------------------------


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def check_rocksdb_directory(path: str | os.PathLike[str]) -> Path:
    """``path`` when it is a RocksDB directory (a CURRENT file naming an existing MANIFEST), else a one-line typed error.

    Checked before RocksDB opens anything: RocksDB and rocksdict create a database (or a config file) where they open.
    """
    where = Path(path)
    if not where.exists():
        raise NotFoundError(f"{where}: no such RocksDB directory")
    if not where.is_dir():
        raise InvalidArgumentError(f"{where}: is a file, not a RocksDB directory")
    current = where / "CURRENT"
    if not current.is_file():
        state = "an empty directory" if not any(where.iterdir()) else "a directory without a CURRENT file"
        raise InvalidArgumentError(f"{where}: not a RocksDB directory ({state})")
    try:
        named = current.read_bytes()[:256]
    except OSError as exc:
        raise InvalidArgumentError(f"{where}: cannot read its CURRENT file: {exc.strerror or exc}") from None
    if not _CURRENT.fullmatch(named) or not (where / named.decode().strip()).is_file():
        raise InvalidArgumentError(f"{where}: not a RocksDB directory (its CURRENT file names no MANIFEST in it)")
    return where


def _open_error(where: Path, exc: Exception) -> ClinkError:
    text = _one_line(exc)
    if "Corruption" in text:
        return CorruptDataError(f"{where}: a damaged RocksDB directory: {text}")
    if "lock" in text.lower():
        return ConflictError(f"{where}: the RocksDB directory is open elsewhere (its LOCK is held): {text}")
    return InvalidArgumentError(f"{where}: cannot open as RocksDB: {text}")


def _open(where: Path, read_only: bool, compression: str = "lz4", create: bool = False) -> Rdict:
    """The database at ``where`` in raw mode with every column family it has (the metadata one created when writable)."""
    from rocksdict import AccessType, DBCompressionType, Options, Rdict

    options = Options(raw_mode=True)
    options.create_if_missing(create)
    options.create_missing_column_families(not read_only)
    options.set_compression_type(getattr(DBCompressionType, compression)())
    had_config = (where / ROCKSDICT_CONFIG).exists()
    families = {}
    try:
        names = Rdict.list_cf(str(where), Options(raw_mode=True)) if (where / "CURRENT").is_file() else []
        foreign = sorted(set(names) - {"default", METADATA_COLUMN_FAMILY})
        if foreign:  # rows there are not clink state: reading the rest as the whole would drop them silently
            raise InvalidArgumentError(
                f"{where}: RocksDB column famil{'ies' if len(foreign) > 1 else 'y'} {', '.join(map(repr, foreign))} "
                "hold no clink state (clink keeps its rows in 'default' and its metadata in 'clink.metadata')"
            )
        families = {name: Options(raw_mode=True) for name in names if name != "default"}
        if not read_only:
            families.setdefault(METADATA_COLUMN_FAMILY, Options(raw_mode=True))
        access = AccessType.read_only() if read_only else AccessType.read_write()
        return Rdict(str(where), options, column_families=families or None, access_type=access)
    except ClinkError:
        raise
    except Exception as exc:  # noqa: BLE001 - rocksdict raises bare Exception with RocksDB's status text
        raise _open_error(where, exc) from None
    finally:
        if read_only and not had_config:  # a read leaves the directory as it found it
            (where / ROCKSDICT_CONFIG).unlink(missing_ok=True)


_Metadata = tuple[StateVersionMap, dict[int, str], frozenset[tuple[int, str, bool]], tuple[int, int]]
_FULL_RANGE = (0, NUM_KEY_GROUPS - 1)


def _load_metadata(db: Rdict, where: Path) -> _Metadata:
    """The state versions, operator uids, TTL slots and key-group range in the metadata column family (defaults when absent)."""
    try:
        family = db.get_column_family(METADATA_COLUMN_FAMILY)
    except Exception:  # noqa: BLE001 - a RocksDB written by another producer has no clink metadata
        return StateVersionMap(), {}, frozenset(), _FULL_RANGE
    raw = family.get(METADATA_KEY)
    if raw is None:
        return StateVersionMap(), {}, frozenset(), _FULL_RANGE
    try:
        doc = json.loads(raw)
        if doc.get("layout") != LAYOUT_VERSION:
            raise CorruptDataError(f"{where}: clink metadata layout {doc.get('layout')!r}; this reader knows {LAYOUT_VERSION}")
        versions = StateVersionMap.unpack(doc.get("state_versions", ""))
        operators = {int(op_id): str(uid) for op_id, uid in doc.get("operators", {}).items()}
        ttl = frozenset((int(o), str(s), bool(k)) for o, s, k in doc.get("ttl_slots", []))
        lo, hi = doc.get("key_groups", _FULL_RANGE)
        key_groups = check_key_group_range(int(lo), int(hi))
    except CorruptDataError:
        raise
    except (ValueError, TypeError, AttributeError, ClinkError) as exc:
        raise CorruptDataError(f"{where}: unreadable clink metadata in column family {METADATA_COLUMN_FAMILY}: {_one_line(exc)}") from None
    return versions, operators, ttl, key_groups


def _table_of(keys: Sequence[object], values: Sequence[object], where: Path, key_groups: tuple[int, int]) -> pa.Table:
    """The canonical table of RocksDB keys (8-byte big-endian op_id + key_bytes) and values, in bulk: no object per row.

    Keyed rows outside ``key_groups`` are left out: a backend restored to a narrower range keeps the others, stale.
    """
    composite = pa.array(keys, pa.binary())
    value_array = pa.array(values, pa.binary())
    if isinstance(composite, pa.ChunkedArray) or isinstance(value_array, pa.ChunkedArray):
        raise InvalidArgumentError(f"{where}: more than 2 GiB of keys or values, more than one snapshot batch holds")
    n = len(composite)
    if n == 0:
        return snapshot.empty_table()
    lengths = pc.binary_length(composite)
    if pc.min(lengths).as_py() <= OP_ID_BYTES:
        first = int(pc.index(pc.less_equal(lengths, OP_ID_BYTES), True).as_py())
        raise CorruptDataError(f"{where}: RocksDB key {composite[first].as_py().hex()!r} is not an 8-byte op_id followed by a state key")
    prefixes = pc.binary_slice(composite, 0, OP_ID_BYTES)  # n values of 8 bytes: one contiguous big-endian uint64 buffer
    data = prefixes.buffers()[2]
    assert data is not None
    op_ids = np.frombuffer(data, dtype=">u8", count=n).astype(np.uint64)
    key_bytes = pc.binary_slice(composite, OP_ID_BYTES, _KEY_SLICE_END)
    table = pa.Table.from_arrays([pa.array(op_ids, pa.uint64()), key_bytes, value_array], schema=snapshot.CANONICAL_SCHEMA)
    return table if key_groups == _FULL_RANGE else snapshot.filter_key_groups(table, *key_groups)


def read_rocksdb_checkpoint(path: str | os.PathLike[str]) -> RocksDBState:
    """Open a RocksDB checkpoint (or database) directory read-only and read it whole into a RocksDBState.

    A path that is not a RocksDB directory is a one-line NotFoundError / InvalidArgumentError naming it, and nothing is created.
    """
    where = check_rocksdb_directory(path)
    db = _open(where, read_only=True)
    try:
        versions, operators, ttl, key_groups = _load_metadata(db, where)
        try:
            keys, values = list(db.keys()), list(db.values())  # read-only: no writer moves between the two passes
        except Exception as exc:  # noqa: BLE001 - rocksdict raises bare Exception with RocksDB's status text
            raise CorruptDataError(f"{where}: reading RocksDB failed: {_one_line(exc)}") from None
    finally:
        db.close()
    return RocksDBState(_table_of(keys, values, where, key_groups), versions, operators, ttl)


def rocksdb_checkpoint_to_arrow(path: str | os.PathLike[str]) -> bytes:
    """The canonical snapshot stream of a RocksDB checkpoint directory: operators ascending, keys in byte order."""
    return read_rocksdb_checkpoint(path).to_arrow()


# --- the backend ----------------------------------------------------------------------------------------


def _checked_config(config: RocksDBConfig | None) -> RocksDBConfig:
    """``config`` (or the default) after checking its range and compression, before anything touches a directory."""
    config = config or RocksDBConfig()
    _check_range(config.key_groups)
    if config.compression not in COMPRESSIONS:
        raise InvalidArgumentError(f"compression must be one of {', '.join(COMPRESSIONS)}, got {config.compression!r}")
    return config


def _undo_open(where: Path, before: set[str] | None) -> None:
    """Remove what a failed RocksDB open added: the directory it created, or the files it wrote into an existing one."""
    if before is None:
        shutil.rmtree(where, ignore_errors=True)
        return
    for name in set(os.listdir(where)) - before if where.is_dir() else ():
        entry = where / name
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def _check_bytes(value: object, what: str) -> bytes:
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise InvalidArgumentError(f"{what} must be bytes, got {type(value).__name__}")
    return bytes(value)


class RocksDBStateBackend:
    """Keyed and operator state of one key-group range in a local RocksDB directory, in the canonical (op_id, key_bytes) layout.

    RocksDB key = 8-byte big-endian op_id + key_bytes, so RocksDB's byte order is the export order (operators ascending,
    keys in byte order). Operator uids, state versions and TTL slots live under ``METADATA_KEY`` in the
    ``clink.metadata`` column family, so a RocksDB checkpoint (``create_checkpoint``) carries them and no state row can
    collide with them. Writes go straight to RocksDB (its WAL, not synced): there is no hot delta and no pool.
    """

    def __init__(self, path: str | os.PathLike[str], config: RocksDBConfig | None = None) -> None:
        self.config = config = _checked_config(config)
        self.key_groups = _check_range(config.key_groups)
        self.path = where = Path(path)
        if where.exists() and not where.is_dir():
            raise InvalidArgumentError(f"{where}: is a file, not a RocksDB directory")
        if where.is_dir() and any(where.iterdir()):
            check_rocksdb_directory(where)  # a directory of other files is not taken over
        elif not config.create_if_missing:
            raise NotFoundError(f"{where}: no RocksDB directory there (create_if_missing is off)")
        self._lock = threading.RLock()
        before = set(os.listdir(where)) if where.is_dir() else None
        try:
            self._db = _open(where, read_only=False, compression=config.compression, create=config.create_if_missing)
        except BaseException:
            _undo_open(where, before)  # a failed open leaves the directory as it found it (no LOCK, LOG or config)
            raise
        self._meta = self._db.get_column_family(METADATA_COLUMN_FAMILY)
        try:
            self.state_versions, operators, ttl, stored_range = _load_metadata(self._db, where)
        except BaseException:
            self._db.close()
            raise
        self._operators: dict[int, str] = dict(operators)
        self._declared: dict[int, str] = {}
        self._ttl_slots: set[tuple[int, str, bool]] = set(ttl)
        self.closed = False
        if stored_range != self.key_groups:  # its checkpoints render its own range only (rows of others stay, stale)
            self._save_metadata()

    # -- lifecycle ----------------------------------------------------------------------------------

    @classmethod
    def from_checkpoint(
        cls, checkpoint: str | os.PathLike[str], path: str | os.PathLike[str], config: RocksDBConfig | None = None
    ) -> RocksDBStateBackend:
        """A backend at ``path`` (which must not exist) holding a copy of a RocksDB checkpoint directory's state."""
        config = _checked_config(config)
        source = check_rocksdb_directory(checkpoint)
        target = Path(path)
        if target.exists():
            raise InvalidArgumentError(f"{target}: already exists; a restore copies the checkpoint into a new directory")
        if not target.parent.is_dir():
            raise NotFoundError(f"{target.parent}: no such directory to restore into")
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.restoring-", dir=target.parent))
        try:
            copy = staging / "db"
            shutil.copytree(source, copy)
            (copy / "LOCK").unlink(missing_ok=True)
            cls(copy, config).close()  # opens, checks and records the range before the copy takes the target's name
            copy.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # nothing is left behind by a failed restore
        return cls(target, config)

    def close(self) -> None:
        """Flush and close the database; the directory keeps the state (reopen it with a new backend)."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            del self._meta
            self._db.close()

    def __enter__(self) -> RocksDBStateBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self.closed:
            raise InvalidArgumentError(f"RocksDB backend at {self.path} is closed")

    # -- operators and versions ---------------------------------------------------------------------

    def _save_metadata(self) -> None:
        doc = {
            "layout": LAYOUT_VERSION,
            "operators": {str(op_id): uid for op_id, uid in sorted(self._operators.items())},
            "state_versions": self.state_versions.pack(),
            "ttl_slots": sorted([op_id, slot, keyed] for op_id, slot, keyed in self._ttl_slots),
            "key_groups": list(self.key_groups),
        }
        self._meta[METADATA_KEY] = json.dumps(doc, separators=(",", ":")).encode()

    def register_operator(self, uid: str) -> int:
        """Declare one of the job's operators by uid and return its op_id (as RemoteReadBackend derives it); stored in the DB."""
        op_id = snapshot.operator_id(uid)
        with self._lock:
            self._check_open()
            self._declared[op_id] = uid
            if self._operators.get(op_id) != uid:
                self._operators[op_id] = uid
                self._save_metadata()
        return op_id

    @property
    def declared_operators(self) -> dict[str, int]:
        """The operators declared with ``register_operator`` on this backend: uid -> op_id."""
        with self._lock:
            return {uid: op_id for op_id, uid in self._declared.items()}

    @property
    def operators(self) -> dict[int, str]:
        """Every operator uid the database knows (stored with its state): op_id -> uid."""
        with self._lock:
            return dict(self._operators)

    def register_ttl_slot(self, op_id: int, slot: str, keyed: bool = True) -> None:
        """Mark a slot as TTL: its values start with an 8-byte little-endian expire-at-ms; expired rows are not exported."""
        snapshot.validate_slot(slot)
        entry = (_check_op_id(op_id), slot, bool(keyed))
        with self._lock:
            self._check_open()
            if entry not in self._ttl_slots:
                self._ttl_slots.add(entry)
                self._save_metadata()

    def set_state_version(self, op_id: int, state_type: str, version: int) -> None:
        """Stamp a state type's schema version; stored in the database and written on exports."""
        entries = dict(self.state_versions.items())
        entries[(_check_op_id(op_id), state_type)] = version
        versions = StateVersionMap(entries)
        with self._lock:
            self._check_open()
            self.state_versions = versions
            self._save_metadata()

    # -- keys ---------------------------------------------------------------------------------------

    def _rocks_key(self, op_id: int, key_bytes: object) -> bytes:
        op_id, key = checked_state_key(op_id, key_bytes, self.key_groups)
        return op_id.to_bytes(OP_ID_BYTES, "big") + key

    # -- writes -------------------------------------------------------------------------------------

    def put(self, op_id: int, key_bytes: bytes, value: bytes) -> None:
        """Write a value."""
        value = _check_bytes(value, "value")
        k = self._rocks_key(op_id, key_bytes)
        with self._lock:
            self._check_open()
            self._db.put(k, value)

    def erase(self, op_id: int, key_bytes: bytes) -> None:
        """Erase a key (absent keys too)."""
        k = self._rocks_key(op_id, key_bytes)
        with self._lock:
            self._check_open()
            self._db.delete(k)

    def put_many(self, op_id: int, keys: Sequence[bytes] | pa.Array, values: Sequence[bytes] | pa.Array) -> int:
        """Write many values of one operator in one atomic WriteBatch; a later write of a key wins. Returns the row count.

        Validated in bulk as RemoteReadBackend.put_many validates (a null, an empty key, a key outside the range, lengths
        that differ: InvalidArgumentError naming the first bad row, nothing written).
        """
        from rocksdict import WriteBatch

        self._check_open()
        key_array, value_array = checked_put_many(op_id, keys, values, self.key_groups)
        n = len(key_array)
        if n == 0:
            return 0
        prefix = pa.array([op_id.to_bytes(OP_ID_BYTES, "big")], pa.binary()).take(pa.array(np.zeros(n, dtype=np.int32)))
        composite = pc.binary_join_element_wise(prefix, key_array, b"")
        batch = WriteBatch(raw_mode=True)
        for k, v in zip(composite.to_pylist(), value_array.to_pylist(), strict=True):  # the binding takes one pair per call
            batch.put(k, v)
        with self._lock:
            self._check_open()
            self._db.write(batch)
        return n

    # -- reads --------------------------------------------------------------------------------------

    def get(self, op_id: int, key_bytes: bytes) -> bytes | None:
        """The current value of a key (None when absent)."""
        k = self._rocks_key(op_id, key_bytes)
        with self._lock:
            self._check_open()
            value: bytes | None = self._db.get(k)
        return value

    def get_many(self, op_id: int, keys: Sequence[bytes]) -> list[bytes | None]:
        """Values of many keys of one operator, in order, in one RocksDB MultiGet."""
        ks = [self._rocks_key(op_id, key) for key in keys]
        if not ks:
            return []
        with self._lock:
            self._check_open()
            values: list[bytes | None] = self._db.get(ks)  # type: ignore[arg-type,assignment]  # rocksdict stub: invariant key list, Any result
        return values

    # -- export and checkpoints ---------------------------------------------------------------------

    def read_state(self) -> RocksDBState:
        """The whole state of this backend's range at one RocksDB snapshot, as a RocksDBState (TTL-expired rows kept)."""
        with self._lock:
            self._check_open()
            view = self._db.snapshot()  # keys and values read in two passes over the same point in time
            versions, operators, ttl = self.state_versions, dict(self._operators), frozenset(self._ttl_slots)
        try:
            keys, values = list(view.keys()), list(view.values())
        finally:
            del view
        return RocksDBState(_table_of(keys, values, self.path, self.key_groups), versions, operators, ttl)

    def export_arrow_snapshot(self) -> bytes:
        """The canonical snapshot stream of this range (operators ascending, keys in byte order), TTL-expired rows left out."""
        state = self.read_state()
        table = drop_expired(state.table, state.ttl_slots, self.config.clock_ms())
        return RocksDBState(table, state.state_versions, state.operators, state.ttl_slots).to_arrow()

    def create_checkpoint(self, path: str | os.PathLike[str]) -> Path:
        """A RocksDB checkpoint of the whole database (state and metadata) in a new directory ``path``; returns it.

        Hard links where the file system allows, so it is cheap; rocksdb_checkpoint_to_arrow renders it, from_checkpoint restores it.
        """
        from rocksdict import Checkpoint

        target = Path(path)
        if target.exists():
            raise InvalidArgumentError(f"{target}: already exists; a RocksDB checkpoint goes into a new directory")
        if not target.parent.is_dir():
            raise NotFoundError(f"{target.parent}: no such directory to create the checkpoint in")
        with self._lock:
            self._check_open()
            try:
                Checkpoint(self._db).create_checkpoint(str(target))
            except Exception as exc:  # noqa: BLE001 - rocksdict raises bare Exception with RocksDB's status text
                shutil.rmtree(target, ignore_errors=True)
                raise InvalidArgumentError(f"{target}: RocksDB checkpoint failed: {_one_line(exc)}") from None
        return target

    def __repr__(self) -> str:
        return f"RocksDBStateBackend({str(self.path)!r}, key_groups={self.key_groups})"
