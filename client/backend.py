"""RemoteReadBackend: a worker's state for one key-group range; hot delta locally, state of record in the pool."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, fields
from typing import Literal, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import snapshot
from client.batched_reads import ReadCoalescer
from client.delta import MISSING as _MISSING
from client.delta import ArrowRun, Delta, StateKey, changelog_table
from client.delta import entry_bytes as _entry_bytes
from client.errors import (
    ClinkError,
    FencedError,
    InvalidArgumentError,
    MissingOperatorsError,
    NonRestoredStateError,
    NotFoundError,
    UnavailableError,
)
from client.live_export import LiveExport, LiveExportConfig
from client.pool_client import CheckpointInfo, CommitResult, PoolClient, PoolClientConfig
from client.warm import WarmTable, check_warm_mode, format_groups, plan_warm_up, table_of_scan
from snapshot import NUM_KEY_GROUPS, StateVersionMap, check_key_group_range
from snapshot.format import operators_metadata
from snapshot.key_index import hash_keys
from snapshot.names import validate_job
from snapshot.ttl import ttl_expired_mask

__all__ = ["BackendConfig", "RemoteReadBackend", "RestoredCheckpoint", "changelog_table", "ttl_expired_mask"]

_log = logging.getLogger(__name__)
_ENTRY_OVERHEAD = 64  # rough per-entry bookkeeping bytes counted against the cache bound
MAX_READ_BATCH_WINDOW_S = 1.0  # a read held longer to gather others is a mistake, not a batch
# (read checkpoint, its etag, cache generation, attempt) when a read was issued: an asynchronous read is answered there
ReadPoint = tuple["int | None", str, int, int]
_REPLACED_RETRIES = 3  # a read checkpoint replaced again while its new version is checked: asked again at most this often


@dataclass
class _LoopBatch:
    """An event loop's asynchronous reads of one turn: looked up locally at its flush, or earlier when state changes."""

    keys: list[StateKey] = field(default_factory=list)
    futures: list[asyncio.Future[bytes | None]] = field(default_factory=list)
    looked: int = 0  # reads before this index are looked up already (into hits and misses)
    hits: list[tuple[asyncio.Future[bytes | None], bytes | None]] = field(default_factory=list)
    misses: list[tuple[list[StateKey], list[asyncio.Future[bytes | None]], ReadPoint]] = field(default_factory=list)


def _wall_clock_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class BackendConfig(PoolClientConfig):
    """A RemoteReadBackend's settings: those of its PoolClient (deadlines, retries, credentials) plus cache size and TTL clock."""

    cache_bytes: int = 64 * 1024 * 1024
    # milliseconds since the epoch; TTL slots compare their expire-at prefix against it
    clock_ms: Callable[[], int] = _wall_clock_ms
    # after a restore, load the range in bulk to answer reads locally: "auto" in the background when it fits the cache
    # (else its most read key groups that fit), "eager" before restore returns, "off" never
    warm_up: str = "auto"
    # asynchronous reads (get_async, aget) issued within this window of the first one share one MultiGet
    read_batch_window_s: float = 0.0002
    # ...of at most this many keys (a full batch is sent at once; one MultiGet costs far less than several)
    read_batch_keys: int = 4096

    def pool_client_config(self) -> PoolClientConfig:
        """The PoolClientConfig these settings imply."""
        return PoolClientConfig(**{f.name: getattr(self, f.name) for f in fields(PoolClientConfig)})


@dataclass(frozen=True)
class RestoredCheckpoint(CheckpointInfo):
    """The checkpoint a restore pointed the backend at (its CheckpointInfo), and how the job's operators matched it.

    ``declared_without_state``: uid -> op_id of operators the job declared (register_operator) that hold no state in
    the checkpoint: new operators, or an operator whose uid changed (its old state then sits under the old uid).
    ``non_restored``: op_id -> uid (None when unnamed) of operators holding state the job does not declare, skipped
    by a restore with ``allow_non_restored_state=True`` (empty otherwise: such state fails the restore).
    """

    declared_without_state: dict[str, int] = field(default_factory=dict)
    non_restored: dict[int, str | None] = field(default_factory=dict)


def _check_range(key_groups: Sequence[int]) -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in key_groups)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"key_groups must be a (lo, hi) pair, got {key_groups!r}") from None
    return check_key_group_range(lo, hi)


def _binary_array(data: Sequence[bytes] | pa.Array | pa.ChunkedArray, what: str) -> pa.Array:
    """put_many's keys or values as one Arrow binary array (an Arrow array as it is; a list converted in one call)."""
    if isinstance(data, pa.ChunkedArray):
        data = data.combine_chunks()
    if isinstance(data, pa.Array):
        if pa.types.is_binary(data.type):
            return data
        if pa.types.is_large_binary(data.type) or pa.types.is_fixed_size_binary(data.type):
            return data.cast(pa.binary())
        raise InvalidArgumentError(f"put_many {what} must be an Arrow binary array, got {data.type}")
    if isinstance(data, (bytes, bytearray, memoryview, str)):
        raise InvalidArgumentError(f"put_many {what} must be a list of bytes or an Arrow array, not one {type(data).__name__} value")
    items = data if isinstance(data, list) else list(data)
    if str in set(map(type, items)):  # pyarrow would encode a str among bytes as UTF-8 unasked; put() refuses it too
        first = next(i for i, v in enumerate(items) if isinstance(v, str))
        raise InvalidArgumentError(f"put_many {what} must all be bytes: {what}[{first}] is a str (encode it first)")
    try:
        array = pa.array(items)
    except (TypeError, pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise InvalidArgumentError(f"put_many {what} must all be bytes: {exc}") from None
    if len(array) == 0:  # an empty list infers the null type
        return pa.array([], pa.binary())
    if not pa.types.is_binary(array.type):
        raise InvalidArgumentError(f"put_many {what} must all be bytes, got {array.type} values")
    return array


def _check_op_id(op_id: int) -> int:
    if not isinstance(op_id, int) or isinstance(op_id, bool) or not 0 <= op_id < 1 << 64:
        raise InvalidArgumentError(f"op_id must be an unsigned 64-bit int, got {op_id!r}")
    return op_id


class _LruCache:
    """Values read from the pool at the backend's read checkpoint (None: known absent), bounded in bytes."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max(0, int(max_bytes))
        self._entries: OrderedDict[StateKey, bytes | None] = OrderedDict()
        self._operator_keys: set[StateKey] = set()  # other subtasks write operator state: dropped when the checkpoint moves
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    def lookup(self, key: StateKey) -> tuple[bool, bytes | None]:
        value = self._entries.get(key, _MISSING)  # not [] and KeyError: a miss is the common case after a restore
        if value is _MISSING:
            self.misses += 1
            return False, None
        self._entries.move_to_end(key)
        self.hits += 1
        return True, value

    def store(self, key: StateKey, value: bytes | None) -> None:
        old = self._entries.pop(key, _MISSING)
        if old is not _MISSING:
            self.bytes -= _entry_bytes(key, old) + _ENTRY_OVERHEAD
        size = _entry_bytes(key, value) + _ENTRY_OVERHEAD
        if size > self.max_bytes:
            self._operator_keys.discard(key)
            return
        self._entries[key] = value
        self.bytes += size
        if key[1][:1] >= b"\x80":
            self._operator_keys.add(key)
        while self.bytes > self.max_bytes:
            k, v = self._entries.popitem(last=False)
            self.bytes -= _entry_bytes(k, v) + _ENTRY_OVERHEAD
            self._operator_keys.discard(k)

    def forget_run(self, run: ArrowRun) -> None:
        """Drop the entries of keys a run writes, walking whichever of the two is smaller (the run by hash, vectorised)."""
        if not self._entries or not run.rows:
            return
        if len(self._entries) <= run.rows:
            cached = list(self._entries)
            ops = np.fromiter((k[0] for k in cached), dtype=np.uint64, count=len(cached))
            keys = pa.array([k[1] for k in cached], pa.binary())
            rows = run.index.find(hash_keys(ops, keys), keys, ops)
            gone = [cached[i] for i in np.flatnonzero(rows >= 0).tolist()]
        else:
            changelog = run.changelog
            gone = list(zip(changelog.column("op_id").to_pylist(), changelog.column("key_bytes").to_pylist(), strict=True))
        for key in gone:
            value = self._entries.pop(key, _MISSING)
            if value is not _MISSING:
                self.bytes -= _entry_bytes(key, value) + _ENTRY_OVERHEAD
                self._operator_keys.discard(key)

    def drop_operator_state(self) -> None:
        for key in self._operator_keys:
            value = self._entries.pop(key, _MISSING)
            if value is not _MISSING:
                self.bytes -= _entry_bytes(key, value) + _ENTRY_OVERHEAD
        self._operator_keys.clear()

    def clear(self) -> None:
        self._entries.clear()
        self._operator_keys.clear()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)


# a local delta up to this size is sent with the scan for the pool to overlay (pools take requests of 16 MiB by default)
INLINE_SCAN_DELTA_BYTES = 8 << 20


def checked_state_key(op_id: int, key_bytes: object, key_groups: tuple[int, int]) -> tuple[int, bytes]:
    """(op_id, key_bytes) of one state key, checked for a backend of ``key_groups`` (every backend's one check)."""
    _check_op_id(op_id)
    if not isinstance(key_bytes, (bytes, bytearray, memoryview)):
        raise InvalidArgumentError(f"key_bytes must be bytes, got {type(key_bytes).__name__}")
    key = bytes(key_bytes)
    if not key:
        raise InvalidArgumentError("key_bytes is empty; a state key starts with its key-group byte (or 0xFF for operator state)")
    lo, hi = key_groups
    if key[0] < NUM_KEY_GROUPS and not lo <= key[0] <= hi:
        raise InvalidArgumentError(f"key {key[:32]!r} is in key group {key[0]}, outside this backend's range {lo}-{hi}")
    return op_id, key


def checked_put_many(
    op_id: int, keys: Sequence[bytes] | pa.Array, values: Sequence[bytes] | pa.Array, key_groups: tuple[int, int]
) -> tuple[pa.Array, pa.Array]:
    """put_many's input as two binary arrays, checked in bulk for a backend of ``key_groups`` (every backend's one check).

    InvalidArgumentError names the first bad row: a null, an empty key, a key outside ``key_groups``, lengths that differ.
    """
    _check_op_id(op_id)
    key_array = _binary_array(keys, "keys")
    value_array = _binary_array(values, "values")
    n = len(key_array)
    if len(value_array) != n:
        raise InvalidArgumentError(f"put_many got {n} keys and {len(value_array)} values; they must pair up")
    if n == 0:
        return key_array, value_array
    for name, array in (("keys", key_array), ("values", value_array)):
        if array.null_count:
            first = int(pc.index(array.is_null(), True).as_py())
            raise InvalidArgumentError(f"put_many {name}[{first}] is null; use erase to remove a key")
    lengths = pc.binary_length(key_array)
    if pc.min(lengths).as_py() == 0:
        first = int(pc.index(pc.equal(lengths, 0), True).as_py())
        raise InvalidArgumentError(f"put_many keys[{first}] is empty; a state key starts with its key-group byte (or 0xFF)")
    lead = snapshot.leading_bytes(key_array)
    lo, hi = key_groups
    outside = (lead < NUM_KEY_GROUPS) & ((lead < lo) | (lead > hi))
    if outside.any():
        first = int(np.flatnonzero(outside)[0])
        key = key_array[first].as_py()
        raise InvalidArgumentError(f"put_many keys[{first}] {key[:32]!r} is in key group {key[0]}, outside this backend's range {lo}-{hi}")
    return key_array, value_array


class RemoteReadBackend:
    """A worker's keyed and operator state for one key-group range of a job, read through a RemotePool.

    Writes land in the hot delta (newest wins). Reads look in the delta, in deltas shipped but not yet part of
    a complete checkpoint, in a bounded LRU cache, then in the pool at the backend's read checkpoint.
    """

    def __init__(self, pool: PoolClient, job: str, key_groups: tuple[int, int], config: BackendConfig, owns_pool: bool = True) -> None:
        self._pool = pool
        self._owns_pool = owns_pool
        self.job = job
        self.config = config
        self.key_groups = _check_range(key_groups)
        check_warm_mode(config.warm_up)
        if not 0 <= config.read_batch_window_s <= MAX_READ_BATCH_WINDOW_S:
            raise InvalidArgumentError(
                f"read_batch_window_s must be between 0 and {MAX_READ_BATCH_WINDOW_S} seconds, got {config.read_batch_window_s!r}"
            )
        if not isinstance(config.read_batch_keys, int) or config.read_batch_keys < 1:
            raise InvalidArgumentError(f"read_batch_keys must be a positive int, got {config.read_batch_keys!r}")
        self.epoch = 0
        self._lock = threading.RLock()
        self._snapshot_lock = threading.Lock()
        self._delta = Delta()
        self._shipping = Delta()
        # deltas committed for checkpoints not yet known complete: (checkpoint_id, delta), oldest first
        self._pending: list[tuple[int, Delta]] = []
        self._cache = _LruCache(config.cache_bytes)
        self._generation = 0  # bumped whenever the cache's basis changes, so late pool answers are not cached
        self._attempt = 0  # bumped by every restore and start_fresh: a warm-up of an older attempt stops
        self._warm: WarmTable | None = None
        self._warm_stale = False  # the warm table holds so many changed keys that the next release reloads it
        self._warm_thread: threading.Thread | None = None
        self._reads_by_group = [0] * NUM_KEY_GROUPS  # pool reads per key group: the hottest are warmed when not all fit
        self._coalescer: ReadCoalescer | None = None
        self._async_batches: dict[asyncio.AbstractEventLoop, _LoopBatch] = {}
        self._read_checkpoint: int | None = None
        self._read_etag = ""  # the version of the read checkpoint this backend holds: its reads are answered from it
        self._base: int | None = None  # the checkpoint this attempt restored from: every other read checkpoint it committed
        self._parent_id = 0
        self._operators: dict[int, str] = {}  # every operator's uid known (sent with commits); "" when unnamed
        self._declared: dict[int, str] = {}  # op_id -> uid of the operators this job declared (register_operator)
        self._ttl_slots: set[tuple[int, str, bool]] = set()
        self.state_versions = StateVersionMap()
        self.fenced = False
        self.closed = False
        self.last_commit: CommitResult | None = None
        self.latest_checkpoint_at_connect = 0
        self.live_export: LiveExport | None = None  # set by serve_live_export

    # -- lifecycle ----------------------------------------------------------------------------------

    @classmethod
    def connect(
        cls,
        address: str | PoolClient,
        job: str,
        key_groups: tuple[int, int] = (0, NUM_KEY_GROUPS - 1),
        config: BackendConfig | None = None,
    ) -> RemoteReadBackend:
        """Connect to a pool and acquire a writer epoch for ``key_groups`` of ``job``; the state starts empty.

        Call ``restore()`` to point the backend at the newest checkpoint (it returns None and stays empty for a new job).
        ``job`` follows the pool's rule (snapshot/names.py). Pass a PoolClient to share one channel.

        ``address``: one pool (HOST:PORT), several pools on one store (HOST1:PORT1,HOST2:PORT2: calls rotate over them and
        fail over when one is down), or dns:///NAME:PORT (client.pool_addresses). A writer epoch whose grant was lost and
        asked again (on any pool) is fenced by the one granted next, which this backend holds.
        """
        config = config or BackendConfig()
        job = validate_job(job)  # the pool's own rule, so a bad name fails here and not at the first call that sends it
        if isinstance(address, PoolClient):
            pool, owns = address, False
        else:
            pool, owns = PoolClient(address, config.pool_client_config()), True
        backend = cls(pool, job, key_groups, config, owns_pool=owns)
        try:
            lease = pool.acquire_writer(job, backend.key_groups)
        except BaseException:
            if owns:
                pool.close()
            raise
        backend.epoch = lease.epoch
        backend.latest_checkpoint_at_connect = lease.latest_checkpoint_id
        return backend

    def close(self) -> None:
        """Drop local state and close the channel (if this backend opened it); unsaved writes are lost."""
        live, self.live_export = self.live_export, None
        if live is not None:
            live.stop(withdraw=not self.closed)  # before the channel goes: the pool forgets this subtask at once
        with self._lock:
            self.closed = True
            self._delta, self._shipping, self._pending = Delta(), Delta(), []
            self._cache.clear()
            self._attempt += 1
            self._warm = None
            coalescer, self._coalescer = self._coalescer, None
        if self._owns_pool:
            self._pool.close()  # first: a MultiGet in flight ends (its reads fail) instead of being waited for
        if coalescer is not None:
            coalescer.close()  # reads still queued fail: the backend is closed

    def __enter__(self) -> RemoteReadBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what the caller can see --------------------------------------------------------------------

    @property
    def delta_rows(self) -> int:
        """Puts and erases in the hot delta (since the last snapshot; a key written by put and by put_many counts twice)."""
        return self._delta.rows

    @property
    def delta_bytes(self) -> int:
        """Key plus value bytes in the hot delta."""
        return self._delta.bytes

    @property
    def cache_bytes(self) -> int:
        """Bytes held by the read cache (the warm table's included)."""
        warm = self._warm
        return self._cache.bytes + (warm.bytes if warm is not None else 0)

    @property
    def cache_stats(self) -> dict[str, int | str]:
        """Read-cache hits, misses, entries and bytes, and the warm table's state, key groups, rows, bytes and hits.

        ``warm_state``: "off", "none" (nothing to warm, or not even one key group fits the cache), "loading", "full"
        (every key group of the range), "partial" (the most read key groups that fit; ``warm_key_groups`` says which)
        or "failed" (``warm_error`` says why; reads go to the pool).
        """
        warm = self._warm
        stats: dict[str, int | str] = {
            "hits": self._cache.hits,
            "misses": self._cache.misses,
            "entries": len(self._cache),
            "bytes": self._cache.bytes,
            "warm_state": "off" if warm is None else warm.state,
            "warm_key_groups": "" if warm is None else format_groups(sorted(warm.loaded_groups)),
            "warm_rows": 0 if warm is None else warm.rows,
            "warm_bytes": 0 if warm is None else warm.bytes,
            "warm_hits": 0 if warm is None else warm.hits,
            "warm_range_bytes": 0 if warm is None else warm.range_bytes,
            "warm_stale_keys": 0 if warm is None else warm.stale_keys,
        }
        if warm is not None and warm.error:
            stats["warm_error"] = warm.error
        return stats

    @property
    def read_checkpoint(self) -> int | None:
        """The complete checkpoint reads go to in the pool (None: nothing in the pool yet)."""
        return self._read_checkpoint

    @property
    def parent_id(self) -> int:
        """The checkpoint the next snapshot builds on (0: none)."""
        return self._parent_id

    @property
    def pool(self) -> PoolClient:
        """The pool client (shared channel for tools)."""
        return self._pool

    def register_operator(self, uid: str) -> int:
        """Declare one of the job's operators by uid and return its op_id; the uid is sent with every commit so tools name it.

        A backend with declared operators restores as Flink does from a savepoint: state of an operator it does not
        declare fails ``restore`` (unless ``allow_non_restored_state``), and declared operators without state are reported.
        """
        op_id = snapshot.operator_id(uid)
        with self._lock:
            self._operators[op_id] = uid
            self._declared[op_id] = uid
        return op_id

    @property
    def declared_operators(self) -> dict[str, int]:
        """The operators this job declared with ``register_operator``: uid -> op_id."""
        with self._lock:
            return {uid: op_id for op_id, uid in self._declared.items()}

    def register_ttl_slot(self, op_id: int, slot: str, keyed: bool = True) -> None:
        """Mark a slot as TTL: its values start with an 8-byte little-endian expire-at-ms; expired rows are not exported."""
        snapshot.validate_slot(slot)
        with self._lock:
            self._ttl_slots.add((_check_op_id(op_id), slot, bool(keyed)))

    def set_state_version(self, op_id: int, state_type: str, version: int) -> None:
        """Stamp a state type's schema version; sent with every commit and written on exports."""
        entries = dict(self.state_versions.items())
        entries[(_check_op_id(op_id), state_type)] = version
        self.state_versions = StateVersionMap(entries)

    # -- writes -------------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self.closed:
            raise InvalidArgumentError(f"backend for job {self.job} key groups {self.key_groups[0]}-{self.key_groups[1]} is closed")

    def _write(self, op_id: int, key_bytes: bytes, value: bytes | None) -> None:
        self._check_open()
        k = self._read_key(op_id, key_bytes)
        with self._lock:
            if self._async_batches:
                self._seal_async_reads()
            self._delta.put(k, value)

    def put(self, op_id: int, key_bytes: bytes, value: bytes) -> None:
        """Write a value into the hot delta."""
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise InvalidArgumentError(f"value must be bytes, got {type(value).__name__}")
        self._write(op_id, key_bytes, bytes(value))

    def erase(self, op_id: int, key_bytes: bytes) -> None:
        """Erase a key (recorded in the hot delta; shipped as an erase row)."""
        self._write(op_id, key_bytes, None)

    def put_many(self, op_id: int, keys: Sequence[bytes] | pa.Array, values: Sequence[bytes] | pa.Array) -> int:
        """Write many values of one operator at once; a later write of a key wins, as with ``put``. Returns the row count.

        ``keys`` and ``values``: lists of bytes, or Arrow binary (or large binary) arrays of equal length, which go
        into the delta as they are: no Python object per row. Bad input (a null, an empty key, a key outside this
        backend's key groups, lengths that differ) raises InvalidArgumentError naming the first bad row and writes nothing.
        """
        self._check_open()
        key_array, value_array = checked_put_many(op_id, keys, values, self.key_groups)
        n = len(key_array)
        if n == 0:
            return 0
        changelog = pa.Table.from_arrays(
            [
                pa.array(np.full(n, snapshot.ROW_PUT, dtype=np.uint8)),
                pa.array(np.full(n, op_id, dtype=np.uint64)),
                key_array,
                value_array,
            ],
            schema=snapshot.CHANGELOG_SCHEMA,
        )
        with self._lock:
            self._check_open()
            if self._async_batches:
                self._seal_async_reads()
            self._delta.put_run(changelog)
        return n

    # -- reads --------------------------------------------------------------------------------------

    def _local(self, k: StateKey, above_warm: bool = False) -> tuple[bool, bytes | None]:
        """Look a key up in the delta, the shipping delta, pending deltas (newest first), the cache, then the warm table.

        ``above_warm``: stop before the warm table (get_many asks it for all its misses at once).
        """
        delta = self._delta  # attribute reads, not Delta.get calls, on the way down: this is every read's path
        v = delta.top.get(k, _MISSING)
        if v is not _MISSING or (delta.runs and (v := delta.get(k)) is not _MISSING):
            return True, v
        shipping = self._shipping
        if shipping.top or shipping.runs:
            v = shipping.get(k)
            if v is not _MISSING:
                return True, v
        for _, layer in reversed(self._pending):
            v = layer.get(k)
            if v is not _MISSING:
                return True, v
        if self._read_checkpoint is None:
            return True, None
        hit = self._cache.lookup(k)
        warm = self._warm
        if hit[0] or warm is None or above_warm:
            return hit
        return warm.lookup(k, self._read_checkpoint)

    def _read_key(self, op_id: int, key_bytes: bytes) -> StateKey:
        return checked_state_key(op_id, key_bytes, self.key_groups)

    def _moved_on(self) -> bool:
        """After the read checkpoint was not found (deleted): whether a newer complete checkpoint of this backend's now serves."""
        before = self._read_checkpoint
        try:
            return self.refresh_completion() != before
        except ClinkError:
            return False

    def _again_if_moved_on(self, read, again=None):
        """Run a read; when its checkpoint is gone but a newer one of this backend's completed meanwhile, run ``again`` (or it)."""
        try:
            return read()
        except NotFoundError:
            if not self._moved_on():
                raise
        return (again or read)()

    def get(self, op_id: int, key_bytes: bytes) -> bytes | None:
        """The current value of a key (None when absent): delta, cache, then the pool."""
        self._check_open()
        k = self._read_key(op_id, key_bytes)
        with self._lock:
            found, value = self._local(k)
            if found:
                return value
        return self._fetch_from_pool([k])[0]

    def _fetch_from_pool(self, ks: list[StateKey], at: ReadPoint | None = None) -> list[bytes | None]:
        """Keys no local layer held when looked up, from the pool (again at a newer checkpoint if this one went).

        ``at``: the read checkpoint when the reads were issued (asynchronous reads are fetched later): read there.
        """
        return self._again_if_moved_on(lambda: self._fetch(ks, at=at), lambda: self._fetch(ks, True))

    def _read_point(self) -> ReadPoint:
        """What reads issued now are answered at (lock held)."""
        return (self._read_checkpoint, self._read_etag, self._generation, self._attempt)

    def _fetch(self, ks: list[StateKey], recheck: bool = False, at: ReadPoint | None = None) -> list[bytes | None]:
        """Keys no local layer holds, from the pool at the read checkpoint in one MultiGet (cached unless written meanwhile).

        ``recheck``: the read checkpoint moved since the keys were looked up locally, so look again first.
        """
        with self._lock:
            # the attempt the read was issued in: a read of an attempt a restore ended is never judged by the new one's part
            checkpoint, etag, generation, attempt = at if at is not None else self._read_point()
            held = [self._local(k) for k in ks] if recheck else [(False, None)] * len(ks)
        ask = [i for i, (found, _) in enumerate(held) if not found]
        out = [value for _, value in held]
        if not ask:
            return out
        # checkpoint is None only when a concurrent start_fresh dropped the read checkpoint: the request carried 0 for it
        counts = self._reads_by_group
        for i in ask:
            lead = ks[i][1][0]
            if lead < NUM_KEY_GROUPS:
                counts[lead] += 1
        op_ids = [ks[i][0] for i in ask]
        keys = [ks[i][1] for i in ask]
        fetched, answered = self._pool.multi_get_at(self.job, checkpoint or 0, op_ids, keys, etag)
        asked = 0
        while checkpoint and etag and answered and answered != etag and not self._holds_version(checkpoint, answered):
            # another version of the read checkpoint answered (compacted, or completed again): read on only when it
            # is still this attempt's own for its range; else this backend was fenced (FencedError)
            verified = self._check_version(checkpoint, attempt)
            if verified == answered:
                break
            asked += 1
            if asked > _REPLACED_RETRIES:
                raise UnavailableError(f"checkpoint {checkpoint} of job {self.job} kept being replaced while it was read; retry")
            etag = verified  # replaced again meanwhile: ask again at the version just checked
            fetched, answered = self._pool.multi_get_at(self.job, checkpoint, op_ids, keys, etag)
        self._adopt(checkpoint, answered)
        with self._lock:
            cache_ok = generation == self._generation
            written = self._delta or self._shipping or self._pending  # else no key can be held locally: skip the look
            for i, value in zip(ask, fetched, strict=True):
                out[i] = value
                if cache_ok and not (written and self._local_layers_hold(ks[i])):
                    self._cache.store(ks[i], value)
        return out

    def _local_layers_hold(self, k: StateKey) -> bool:
        return k in self._delta or k in self._shipping or any(k in layer for _, layer in self._pending)

    def get_many(self, op_id: int, keys: Sequence[bytes]) -> list[bytes | None]:
        """Values of many keys of one operator, in order; every miss goes to the pool in ONE MultiGet."""
        self._check_open()
        ks = [self._read_key(op_id, key) for key in keys]
        out: list[bytes | None] = [None] * len(ks)
        miss_idx: list[int] = []
        with self._lock:
            for i, k in enumerate(ks):
                found, value = self._local(k, True)  # the warm table is asked once, below, for every miss
                if found:
                    out[i] = value
                else:
                    miss_idx.append(i)
            warm = self._warm
            if warm is not None and miss_idx:
                answers = warm.lookup_many([ks[i] for i in miss_idx], self._read_checkpoint)
                if answers:
                    for j, value in answers.items():
                        out[miss_idx[j]] = value
                    miss_idx = [i for j, i in enumerate(miss_idx) if j not in answers]
        if miss_idx:
            fetched = self._fetch_from_pool([ks[i] for i in miss_idx])
            for i, value in zip(miss_idx, fetched, strict=True):
                out[i] = value
        return out

    # -- asynchronous reads -------------------------------------------------------------------------

    def _reads(self) -> ReadCoalescer:
        with self._lock:
            self._check_open()
            if self._coalescer is None:
                self._coalescer = ReadCoalescer(
                    self._fetch_from_pool, self.config.read_batch_window_s, self.config.read_batch_keys, name=f"clink-reads-{self.job}"
                )
            return self._coalescer

    def get_async(self, op_id: int, key_bytes: bytes) -> Future[bytes | None]:
        """A future of the key's current value: answered at once from local layers, else batched with other reads.

        Reads issued within ``read_batch_window_s`` of each other (from any thread) go to the pool in one MultiGet. A read
        sees every write this backend took before it was issued. Bad input raises here, not in the future.
        """
        self._check_open()
        k = self._read_key(op_id, key_bytes)
        with self._lock:
            found, value = self._local(k)
            at = self._read_point()
        future: Future[bytes | None] = Future()
        if found:
            future.set_result(value)
            return future

        def deliver(values: list[bytes | None] | None, error: BaseException | None) -> None:
            if not future.set_running_or_notify_cancel():
                return  # cancelled by its caller meanwhile
            if error is not None:
                future.set_exception(error)
            elif values is not None:
                future.set_result(values[0])

        self._reads().submit([k], deliver, at)
        return future

    def aget(self, op_id: int, key_bytes: bytes) -> asyncio.Future[bytes | None]:
        """``await backend.aget(op_id, key)``: the key's current value, without blocking the event loop.

        Every aget made before the loop next runs its callbacks (as by tasks that each await one) shares one MultiGet;
        local layers answer without one. A read sees every write this backend took before it was issued, and none
        after. Bad input raises here.
        """
        loop = asyncio.get_running_loop()
        self._check_open()
        k = self._read_key(op_id, key_bytes)
        future: asyncio.Future[bytes | None] = loop.create_future()
        # the local look-up waits for the batch's flush (one lock, one loop): a write or a checkpoint's completion
        # before then looks the batch up first (_seal_async_reads), so each read still sees the state it was issued in
        batch = self._async_batches.get(loop)
        if batch is None:
            batch = self._async_batches[loop] = _LoopBatch()
            loop.call_soon(self._flush_async_batch, loop, batch)
        batch.keys.append(k)
        batch.futures.append(future)
        if len(batch.keys) >= self.config.read_batch_keys:
            self._flush_async_batch(loop, batch)
        return future

    def _look_up_batch(self, batch: _LoopBatch) -> None:
        """Look up the batch's reads not looked up yet in the local layers, as of now (lock held)."""
        start, end = batch.looked, len(batch.keys)
        if start >= end:
            return
        at = self._read_point()
        local = self._local
        miss_keys: list[StateKey] = []
        miss_futures: list[asyncio.Future[bytes | None]] = []
        for k, future in zip(batch.keys[start:end], batch.futures[start:end], strict=True):
            found, value = local(k)
            if found:
                batch.hits.append((future, value))
            else:
                miss_keys.append(k)
                miss_futures.append(future)
        batch.looked = end
        if miss_keys:
            batch.misses.append((miss_keys, miss_futures, at))

    def _seal_async_reads(self) -> None:
        """Before a write or a change of read checkpoint: asynchronous reads issued so far see the state as it is (lock held)."""
        for batch in list(self._async_batches.values()):
            self._look_up_batch(batch)

    def _flush_async_batch(self, loop: asyncio.AbstractEventLoop, batch: _LoopBatch) -> None:
        if self._async_batches.get(loop) is not batch:
            return  # flushed already (it filled up)
        with self._lock:
            del self._async_batches[loop]
            self._look_up_batch(batch)
        for future, value in batch.hits:
            if not future.done():  # cancelled by its awaiter
                future.set_result(value)
        for keys, futures, at in batch.misses:
            self._fetch_for_loop(loop, keys, futures, at)

    def _fetch_for_loop(
        self, loop: asyncio.AbstractEventLoop, keys: list[StateKey], futures: list[asyncio.Future[bytes | None]], at: ReadPoint
    ) -> None:
        def resolve(values: list[bytes | None] | None, error: BaseException | None) -> None:
            for i, future in enumerate(futures):
                if future.done():  # cancelled by its awaiter
                    continue
                if error is not None:
                    future.set_exception(error)
                elif values is not None:
                    future.set_result(values[i])

        def deliver(values: list[bytes | None] | None, error: BaseException | None) -> None:
            try:
                loop.call_soon_threadsafe(resolve, values, error)
            except RuntimeError:
                pass  # the loop closed while the read was in flight: nobody awaits these futures any more

        try:
            self._reads().submit(keys, deliver, at, now=True)
        except ClinkError as exc:
            resolve(None, exc)

    # -- checkpoints --------------------------------------------------------------------------------

    def _fold_into_cache(self, layer: Delta) -> None:
        """A released delta's per-key writes go to the read cache; the warm table never answers any key it wrote."""
        warm = self._warm
        if warm is not None and warm.mark_changed(*layer.key_columns()):
            self._warm_stale = True
        for k, v in layer.top.items():
            if k[1][:1] < b"\x80":  # operator state is every subtask's: after completion it reads what the pool merged
                self._cache.store(k, v)
        for run in layer.runs:  # a run's keys are not copied into the cache row by row: what it holds of them goes
            self._cache.forget_run(run)

    def _holds_version(self, checkpoint: int, etag: str) -> bool:
        """Whether this backend holds (so checked or was given) exactly this version of its read checkpoint."""
        with self._lock:
            return checkpoint == self._read_checkpoint and etag == self._read_etag

    def _check_version(self, checkpoint: int, attempt: int) -> str:
        """The etag of the current version of the read checkpoint, after checking it is this attempt's (see _current_version)."""
        return self._current_version(checkpoint, attempt)[0]

    def _current_version(self, checkpoint: int, attempt: int) -> tuple[str, str]:
        """(etag, manifest JSON) of the current version of the read checkpoint, after checking it is this attempt's for its range.

        A version this backend may read has, for its key groups, the part this attempt committed (a read checkpoint it
        committed) or only parts older than its epoch (the base it restored from). Compaction keeps every part's range
        and epoch, and the replacement of an older attempt's version (I3) keeps the parts the writers table holds, so a
        live backend always passes; a version made by a newer attempt whose writers fenced this one fails, and its
        answers are never returned (FencedError). One DescribeCheckpoint, only when the answering etag changed.
        """
        info, doc = self._pool.describe_checkpoint(self.job, checkpoint)
        if not info.complete or not info.manifest_etag:
            raise NotFoundError(f"checkpoint {checkpoint} of job {self.job} is no longer complete")
        with self._lock:
            if attempt != self._attempt:
                return info.manifest_etag, doc  # a read of an attempt a restore ended: its answer serves no later read
            (lo, hi), epoch, own = self.key_groups, self.epoch, checkpoint != self._base
        parts = [(int(p["kg_lo"]), int(p["kg_hi"]), int(p["epoch"])) for p in json.loads(doc).get("parts", ())]
        covering = sorted(p for p in parts if p[0] <= hi and lo <= p[1])
        if (lo, hi, epoch) in covering if own else all(e < epoch for _, _, e in covering):
            return info.manifest_etag, doc
        with self._lock:
            self.fenced = True
        theirs = ", ".join(f"{a}-{b} e{e}" for a, b, e in covering) or "none"
        raise FencedError(
            f"job {self.job}: checkpoint {checkpoint}, which this backend (key groups {lo}-{hi}, epoch {epoch}) reads, was "
            f"replaced by another attempt's (its parts for these key groups: {theirs}); this backend was fenced and must restore"
        )

    def _adopt(self, checkpoint: int | None, etag: str) -> None:
        """The pool answered from this version of the read checkpoint (compacted since, perhaps): hold that one from now."""
        with self._lock:
            if etag and checkpoint == self._read_checkpoint:
                self._read_etag = etag

    def _release_pending(self, complete_id: int, etag: str = "") -> None:
        """Checkpoint ``complete_id`` is complete: pending deltas up to it are now in the pool; read there."""
        if self._async_batches:
            self._seal_async_reads()
        if self._read_checkpoint is None or complete_id > self._read_checkpoint:
            self._cache.drop_operator_state()
        keep = []
        for cid, layer in self._pending:
            if cid <= complete_id:
                self._fold_into_cache(layer)
            else:
                keep.append((cid, layer))
        self._pending = keep
        if self._read_checkpoint is None or complete_id > self._read_checkpoint:
            self._read_checkpoint = complete_id
            self._read_etag = etag
            self._generation += 1
        if self._warm_stale:  # so much changed since the warm table's checkpoint that loading this one pays
            self._warm_stale = False
            self._warm = None
            self._start_warm_up(wait=False)

    def refresh_completion(self) -> int | None:
        """Ask the pool whether checkpoints this backend committed are complete yet; return the newest complete one."""
        if not self._pending:
            return self._read_checkpoint
        # only checkpoints this backend committed count: a complete checkpoint outside its lineage (say, one made
        # before this backend rewound to an older checkpoint) must not become its read checkpoint
        # an abandoned version of an id this backend committed again is an older attempt's, without this backend's part
        mine = {cid for cid, _ in self._pending}
        complete = [c for c in self._pool.list_checkpoints(self.job) if c.complete and not c.abandoned and c.checkpoint_id in mine]
        if complete:
            newest = max(complete, key=lambda c: c.checkpoint_id)
            with self._lock:
                attempt = self._attempt
            # the version listed may be a newer attempt's that re-completed the id after fencing this one: checked first
            etag = self._check_version(newest.checkpoint_id, attempt) if newest.manifest_etag else ""
            with self._lock:
                if attempt == self._attempt:
                    self._release_pending(newest.checkpoint_id, etag)
        return self._read_checkpoint

    def snapshot(self, checkpoint_id: int) -> CommitResult:
        """Ship the hot delta as a changelog for this range of checkpoint ``checkpoint_id`` and commit it.

        Writes made during the upload go to a fresh delta and are kept. On failure the shipped delta is merged
        back under newer writes, so the next checkpoint carries it; FencedError is raised (never retried).
        """
        self._check_open()
        if not isinstance(checkpoint_id, int) or isinstance(checkpoint_id, bool) or checkpoint_id <= 0:
            raise InvalidArgumentError(f"checkpoint_id must be a positive int, got {checkpoint_id!r}")
        if checkpoint_id <= self._parent_id:
            raise InvalidArgumentError(f"checkpoint_id {checkpoint_id} must be greater than the parent checkpoint {self._parent_id}")
        with self._snapshot_lock:
            with self._lock:
                shipping, self._shipping = self._delta, self._delta
                self._delta = Delta()
                operators = dict(self._operators)
                for op_id in shipping.op_ids():
                    operators.setdefault(op_id, "")
                parent = self._parent_id
            try:
                writer = snapshot.SnapshotArrowWriter(self.state_versions, changelog=True)
                # in the data file's order: the pool then only checks it (one pass), no sort and no copy of the delta
                blob = writer.write_buffer(snapshot.sort_for_layout(shipping.changelog_table()))
                result = self._pool.commit_checkpoint(
                    self.job,
                    checkpoint_id,
                    parent,
                    self.key_groups,
                    self.epoch,
                    memoryview(blob),
                    state_versions=self.state_versions.pack(),
                    operators=operators,
                )
            except BaseException as exc:
                with self._lock:
                    merged = shipping
                    merged.absorb_newer(self._delta)  # newer writes win over the shipped ones
                    self._delta = merged
                    self._shipping = Delta()
                    if isinstance(exc, FencedError):
                        self.fenced = True
                raise
            with self._lock:
                self._shipping = Delta()
                self._parent_id = checkpoint_id
                self._operators.update({o: u for o, u in operators.items() if u or o not in self._operators})
                self._pending.append((checkpoint_id, shipping))
                if result.checkpoint.complete:
                    self._release_pending(checkpoint_id, result.checkpoint.manifest_etag)
                self.last_commit = result
        if self._pending:
            try:
                self.refresh_completion()
            except ClinkError:
                pass  # completion is re-checked on the next snapshot; pending deltas keep serving reads meanwhile
        return result

    @overload
    def restore(
        self,
        checkpoint_id: int,
        key_groups: tuple[int, int] | None = None,
        expected_operators: Mapping[str, int] | None = None,
        *,
        required: bool = False,
        allow_non_restored_state: bool = False,
    ) -> RestoredCheckpoint: ...

    @overload
    def restore(
        self,
        checkpoint_id: None = None,
        key_groups: tuple[int, int] | None = None,
        expected_operators: Mapping[str, int] | None = None,
        *,
        required: Literal[True],
        allow_non_restored_state: bool = False,
    ) -> RestoredCheckpoint: ...

    @overload
    def restore(
        self,
        checkpoint_id: int | None = None,
        key_groups: tuple[int, int] | None = None,
        expected_operators: Mapping[str, int] | None = None,
        *,
        required: bool = False,
        allow_non_restored_state: bool = False,
    ) -> RestoredCheckpoint | None: ...

    def restore(
        self,
        checkpoint_id: int | None = None,
        key_groups: tuple[int, int] | None = None,
        expected_operators: Mapping[str, int] | None = None,
        *,
        required: bool = False,
        allow_non_restored_state: bool = False,
    ) -> RestoredCheckpoint | None:
        """Point the backend at a complete checkpoint (None: the newest) and range (None: the current one); its info.

        A job with no complete checkpoint yet (a new job) has nothing to restore: the backend starts empty, as
        ``start_fresh``, and None is returned; ``required=True`` raises NotFoundError instead. A ``checkpoint_id`` that
        is not there is always NotFoundError. Reads metadata only; values are fetched lazily. Unsaved writes are dropped.
        Every restore acquires a fresh writer epoch for the range (fencing older overlapping writers, and this backend's
        own earlier attempt, so nothing staged before the restore completes a checkpoint). ``expected_operators``
        (uid -> op_id) is checked against the checkpoint first: any operator it lacks raises MissingOperatorsError and
        nothing changes.

        Operators declared with ``register_operator`` are then matched against the operators holding state in the
        checkpoint (by op_id; a checkpoint that did not name an operator still holds its state, and one named by a
        committer that wrote no row holds none; layers count stored rows, erases too), as Flink restores a
        savepoint: state of an operator the job does not declare raises NonRestoredStateError, before any epoch is taken,
        and nothing changes; ``allow_non_restored_state=True`` restores without it (listed in the result's
        ``non_restored``; nothing stops a read of it, and it stays in the pool's checkpoints). Declared operators with
        no state are listed in ``declared_without_state`` (and logged as a warning), so a changed uid shows at once, not
        as state that silently starts empty. A backend that declares no operator restores everything and checks nothing.
        The result is a RestoredCheckpoint: the checkpoint's CheckpointInfo with these two fields.
        """
        self._check_open()
        new_range = _check_range(key_groups) if key_groups is not None else self.key_groups
        if checkpoint_id is None:
            # one metadata call: the list already says which checkpoints are complete, with their operators
            complete = [c for c in self._pool.list_checkpoints(self.job) if c.complete and not c.abandoned]
            if not complete:
                if required:
                    raise NotFoundError(f"job {self.job} has no complete checkpoint to restore from")
                self.start_fresh(new_range)
                return None
            info = max(complete, key=lambda c: c.checkpoint_id)
            checkpoint_id = info.checkpoint_id
        else:
            info, _ = self._pool.describe_checkpoint(self.job, checkpoint_id)
        if not info.complete:
            ranges = ", ".join(f"{lo}-{hi}" for lo, hi in info.committed_ranges) or "none"
            raise InvalidArgumentError(
                f"checkpoint {checkpoint_id} of job {self.job} is incomplete (committed key groups: {ranges}); restore from a complete one"
            )
        if expected_operators:
            missing = {}
            for uid, op_id in expected_operators.items():
                have_uid = info.operators.get(op_id, _MISSING)
                if have_uid is _MISSING or (have_uid and have_uid != uid):
                    missing[uid] = op_id
            if missing:
                raise MissingOperatorsError(checkpoint_id, missing)
        with self._lock:
            declared = dict(self._declared)
        declared_without_state: dict[str, int] = {}
        non_restored: dict[int, str | None] = {}
        if declared:
            # an op_id the checkpoint holds counts for its declared uid, named there or not (another uid: a hash collision)
            held = {op_id: uid for op_id, uid in info.operators.items() if op_id not in info.operators_without_state}
            declared_without_state = {uid: op_id for uid, op_id in sorted((u, o) for o, u in declared.items()) if op_id not in held}
            undeclared = {op_id: uid or None for op_id, uid in sorted(held.items()) if op_id not in declared}
            if undeclared and not allow_non_restored_state:
                raise NonRestoredStateError(checkpoint_id, undeclared)
            non_restored = undeclared
        # a restore is a new attempt, even for an unchanged range: the fresh epoch fences every part staged before it
        epoch = self._pool.acquire_writer(self.job, new_range, restore_from=checkpoint_id).epoch
        with self._snapshot_lock, self._lock:
            self._begin_attempt(new_range, epoch, checkpoint_id, info.manifest_etag)
            self._operators.update({o: u for o, u in info.operators.items() if u or o not in self._operators})
            if info.state_versions:
                merged = dict(StateVersionMap.unpack(info.state_versions).items())
                merged.update(self.state_versions.items())
                self.state_versions = StateVersionMap(merged)
            if self.config.warm_up != "off":
                self._start_warm_up(wait=self.config.warm_up == "eager", info=info)
        if declared_without_state:
            _log.warning(
                "restore of job %s from checkpoint %d: declared operator(s) %s hold no state in it (new operators, or a changed uid)",
                self.job,
                checkpoint_id,
                ", ".join(f"{uid!r} (op_id {op_id})" for uid, op_id in sorted(declared_without_state.items())),
            )
        if non_restored:
            _log.info(
                "restore of job %s from checkpoint %d skipped the state of undeclared operator(s) %s",
                self.job,
                checkpoint_id,
                ", ".join(f"{uid!r} (op_id {op_id})" if uid else f"op_id {op_id}" for op_id, uid in non_restored.items()),
            )
        base = {f.name: getattr(info, f.name) for f in fields(CheckpointInfo)}
        return RestoredCheckpoint(**base, declared_without_state=declared_without_state, non_restored=non_restored)

    def start_fresh(self, key_groups: tuple[int, int] | None = None) -> None:
        """Start this subtask's state empty as a new attempt of the job (a job restarted with no checkpoint to restore).

        Takes a fresh epoch recorded as a restore from nothing, so every checkpoint the job completed before, and any an
        older attempt completes later, is left behind: never the latest, never mixed into this attempt's. Unsaved writes
        are dropped; the next snapshot has no parent.
        """
        self._check_open()
        new_range = _check_range(key_groups) if key_groups is not None else self.key_groups
        epoch = self._pool.acquire_writer(self.job, new_range, restore_from=0).epoch
        with self._snapshot_lock, self._lock:
            self._begin_attempt(new_range, epoch, None, "")

    def _begin_attempt(self, key_groups: tuple[int, int], epoch: int, base: int | None, etag: str) -> None:
        """Hold a new attempt's range and epoch, reading from ``base`` (None: nothing); unsaved writes and the cache go (locks held)."""
        if self._async_batches:
            self._seal_async_reads()
        self.key_groups = key_groups
        self.epoch = epoch
        self.fenced = False
        self._delta, self._shipping, self._pending = Delta(), Delta(), []
        self._cache.clear()
        self._cache.max_bytes = max(0, int(self.config.cache_bytes))
        self._generation += 1
        self._attempt += 1
        self._warm, self._warm_stale = None, False
        self._read_checkpoint = base
        self._read_etag = etag
        self._base = base
        self._parent_id = base or 0
        if self.live_export is not None:
            self.live_export.wake()  # announce the new range and epoch now

    # -- warm-up ------------------------------------------------------------------------------------

    def _start_warm_up(self, wait: bool, info: CheckpointInfo | None = None) -> None:
        """Load the range at the read checkpoint into a warm table: in a thread, or here when ``wait`` (lock held).

        The table is installed at once, before any later checkpoint can complete, so every key such a checkpoint
        changes is marked in it; its rows arrive scan by scan, each key group answering as soon as it is in.
        """
        checkpoint = self._read_checkpoint
        if checkpoint is None or self.closed:
            return
        table = WarmTable(checkpoint, self.key_groups, max(0, int(self.config.cache_bytes)))
        self._warm = table
        args = (self._attempt, table, self._read_etag, info)
        if wait:
            self._lock.release()  # the scans run without the lock: reads and writes go on meanwhile
            try:
                self._warm_up(*args)
            finally:
                self._lock.acquire()
            return
        self._warm_thread = threading.Thread(target=self._warm_up, args=args, name=f"clink-warm-{self.job}", daemon=True)
        self._warm_thread.start()

    def _warm_current(self, attempt: int, table: WarmTable) -> bool:
        return self._attempt == attempt and self._warm is table and not self.closed

    def _warm_up(self, attempt: int, table: WarmTable, etag: str, info: CheckpointInfo | None) -> None:
        """Plan which key groups fit the cache and scan them; a failure leaves what arrived answering, the rest to the pool."""
        try:
            if info is None or info.checkpoint_id != table.base:
                info, _ = self._pool.describe_checkpoint(self.job, table.base)
            lo, hi = table.key_groups
            group_bytes = info.key_group_bytes
            operator_bytes = info.operator_state_bytes
            if len(group_bytes) != NUM_KEY_GROUPS:  # a pool from before key_group_bytes: assume the bytes spread evenly
                group_bytes, operator_bytes = (info.total_bytes // NUM_KEY_GROUPS,) * NUM_KEY_GROUPS, 0
            budget = table.budget
            bytes_per_row = info.total_bytes / info.num_rows if info.num_rows else 0.0
            plan = plan_warm_up(lo, hi, group_bytes, operator_bytes, budget, list(self._reads_by_group), bytes_per_row)
            with self._lock:
                if not self._warm_current(attempt, table):
                    return
                table.set_plan(plan)
                # the warm table takes its share of the cache; the LRU keeps the rest (and at least an eighth)
                self._cache.max_bytes = max(budget - plan.expected_bytes, budget // 8)
            for i, (chunk_lo, chunk_hi) in enumerate(plan.chunks):
                if not self._warm_current(attempt, table):
                    return
                rows = table_of_scan(self._pool.scan_checkpoint(self.job, table.base, key_groups=(chunk_lo, chunk_hi), manifest_etag=etag))
                if not self._warm_current(attempt, table):  # a restore came meanwhile: these rows are an older attempt's
                    return
                table.add_scan(chunk_lo, chunk_hi, rows, first=i == 0)  # one that does not fit is dropped; the next may
            table.finish()
        except Exception as exc:  # a warm-up that fails leaves reads to the pool; it never fails the restore
            table.fail(exc)
            lo, hi = table.key_groups
            _log.warning("warm-up of job %s key groups %d-%d at checkpoint %d stopped: %s", self.job, lo, hi, table.base, table.error)
        except BaseException as exc:  # Ctrl-C and exits: noted, and passed on (to restore's caller, for an eager one)
            table.fail(exc)
            raise

    def wait_warm(self, timeout_s: float | None = None) -> bool:
        """Wait until a background warm-up has loaded (or failed); True when none is still loading."""
        thread = self._warm_thread
        if thread is not None:
            thread.join(timeout_s)
        warm = self._warm
        return warm is None or warm.state != "loading"

    # -- export -------------------------------------------------------------------------------------

    def _local_changes(self) -> pa.Table:
        """Every write not yet in the read checkpoint, as one changelog (oldest first, so the newest write of a key wins)."""
        tables = [layer.changelog_table() for layer in (*(d for _, d in self._pending), self._shipping, self._delta) if layer]
        if not tables:
            return snapshot.empty_table(changelog=True)
        if len(tables) == 1:
            return tables[0]
        return snapshot.replay_changelog(pa.concat_tables(tables))

    def serve_live_export(self, host: str = "127.0.0.1", port: int = 0, config: LiveExportConfig | None = None) -> str:
        """Serve this subtask's live state (export_arrow_snapshot) at GET /state.arrow and announce it to the pool.

        Returns the URL; readers send ``Authorization: Bearer <backend.live_export.token>``. The pool's
        ``GET /jobs/JOB/state.arrow?live=1`` merges every announced subtask. The announcement is renewed every
        ttl/3 and goes when the backend closes, is fenced (a newer writer of its range), or stops renewing.
        """
        self._check_open()
        if self.live_export is not None:
            raise InvalidArgumentError(f"this backend already serves its live export at {self.live_export.url}")
        config = config or LiveExportConfig(host=host, port=port)
        self.live_export = LiveExport(self, config)
        return self.live_export.url

    def export_changelog_snapshot(self) -> bytes:
        """This range as a changelog stream: a materialisation handle to the read checkpoint, then every local change as log rows.

        Kilobytes where export_arrow_snapshot is the whole range: canonicalise_state_snapshot(data, store=...) with the
        pool's object store or a PoolClient gives what export_arrow_snapshot gives at the same moment. Before any
        checkpoint there is no handle, only the changes (docs/format.md, client/changelog_export.py).
        """
        return self._again_if_moved_on(self._export_changelog)

    def _export_changelog(self) -> bytes:
        from client.changelog_export import changelog_snapshot_of

        self._check_open()
        with self._lock:
            changes, checkpoint, key_groups = self._local_changes(), self._read_checkpoint, self.key_groups
            ttl_slots, operators, attempt = set(self._ttl_slots), dict(self._operators), self._attempt
        # the handle names the checkpoint id as it is now: it must still be the commit this attempt reads (not re-made)
        manifest_json = self._current_version(checkpoint, attempt)[1] if checkpoint is not None else None
        return changelog_snapshot_of(
            self.job, key_groups, checkpoint, manifest_json, changes, self.state_versions, operators, ttl_slots, self.config.clock_ms()
        )

    def export_arrow_snapshot(self) -> bytes:
        """The canonical snapshot stream of this range: the pool's scan with every local change overlaid."""
        return self._again_if_moved_on(self._export)

    def _export(self) -> bytes:
        self._check_open()
        with self._lock:
            changes = self._local_changes()
            checkpoint = self._read_checkpoint
            ttl_slots, attempt = set(self._ttl_slots), self._attempt
        lo, hi = self.key_groups
        if checkpoint is not None:
            # one DescribeCheckpoint: the id must still be the commit this attempt reads (not one a newer attempt re-made)
            self._check_version(checkpoint, attempt)
        if checkpoint is None:
            table = snapshot.filter_key_groups(snapshot.canonical_from_changelog(changes), lo, hi)
            # the uids travel with the rows, as in a pool's scan, so tools name operators
            blob = snapshot.SnapshotArrowWriter(self.state_versions, operators_metadata(self._operators)).write(table)
        else:
            delta = snapshot.SnapshotArrowWriter(self.state_versions, changelog=True).write(changes) if changes.num_rows else b""
            if len(delta) <= INLINE_SCAN_DELTA_BYTES:
                blob = self._pool.scan_checkpoint(self.job, checkpoint, key_groups=(lo, hi), delta=delta, manifest_etag=self._read_etag)
            else:  # larger than a pool takes in one request: overlay here what the pool would have overlaid
                base = snapshot.read_snapshot(
                    self._pool.scan_checkpoint(self.job, checkpoint, key_groups=(lo, hi), manifest_etag=self._read_etag)
                )
                table = snapshot.overlay(base.table.replace_schema_metadata(None), snapshot.filter_key_groups(changes, lo, hi))
                blob = snapshot.SnapshotArrowWriter(base.state_versions, base.extra_metadata).write(table)
        local_versions = dict(self.state_versions.items())
        if not ttl_slots and not local_versions:
            return blob
        snap = snapshot.read_snapshot(blob)
        versions = dict(snap.state_versions.items())
        stamped = {**versions, **local_versions}  # versions set since the checkpoint are stamped too
        expired = ttl_expired_mask(snap.table, ttl_slots, self.config.clock_ms()) if ttl_slots else None
        if stamped == versions and (expired is None or not expired.any()):
            return blob
        kept = snap.table if expired is None or not expired.any() else snap.table.filter(pc.invert(pa.array(expired)))
        return snapshot.SnapshotArrowWriter(StateVersionMap(stamped), snap.extra_metadata).write(kept)
