"""The object-store interface every part of the tier talks to, plus key validation and open_store."""

from __future__ import annotations

import builtins
import os
import tempfile
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from snapshot.errors import InvalidArgumentError

# ranges closer than this are fetched with one GET (the gap is read and thrown away)
DEFAULT_COALESCE_GAP = 16 << 10
# a coalesced GET never grows beyond this many bytes unless a single range is bigger
DEFAULT_MAX_COALESCED = 64 << 20
# ranged GETs of one get_ranges call in flight at once: a point read batch over scattered blocks waits on one round trip,
# not on one per block
RANGE_READS_IN_FLIGHT = 8
_range_readers: ThreadPoolExecutor | None = None
_range_readers_lock = threading.Lock()


def _range_reader_pool() -> ThreadPoolExecutor:
    global _range_readers
    with _range_readers_lock:
        if _range_readers is None:
            _range_readers = ThreadPoolExecutor(RANGE_READS_IN_FLIGHT, thread_name_prefix="clink-range-read")
        return _range_readers


@dataclass(frozen=True)
class ObjectInfo:
    """What a listing or HEAD says about one object; key is relative to the store root."""

    key: str
    size: int
    last_modified_ms: int
    etag: str


@dataclass(frozen=True)
class StoreConfig:
    """Connection settings for remote stores; credentials None means boto3's default chain."""

    endpoint_url: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    max_attempts: int = 5
    connect_timeout_s: float = 5
    read_timeout_s: float = 30
    coalesce_gap_bytes: int = DEFAULT_COALESCE_GAP
    # the first look at a store (check_exists, probe): one attempt, this long to connect and to answer, so an endpoint
    # that accepts connections and never answers is reported in seconds, not after every retry's read timeout
    probe_timeout_s: float = 5

    def __post_init__(self) -> None:
        if self.endpoint_url is not None:  # boto3 would fail later with a bare ValueError, or connect somewhere odd
            from store.uris import parse_endpoint_url

            parse_endpoint_url(self.endpoint_url)


@dataclass
class StoreCounters:
    """Requests per operation and bytes moved, so benchmarks and metrics can count what hit the store."""

    requests: dict[str, int] = field(default_factory=dict)
    bytes_read: int = 0
    bytes_written: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def count(self, op: str, read: int = 0, written: int = 0) -> None:
        """Record one request of kind ``op``."""
        with self._lock:
            self.requests[op] = self.requests.get(op, 0) + 1
            self.bytes_read += read
            self.bytes_written += written

    def snapshot(self) -> dict[str, object]:
        """A plain copy: {"requests": {...}, "bytes_read": n, "bytes_written": n}."""
        with self._lock:
            return {"requests": dict(self.requests), "bytes_read": self.bytes_read, "bytes_written": self.bytes_written}

    def reset(self) -> None:
        """Zero every counter."""
        with self._lock:
            self.requests.clear()
            self.bytes_read = 0
            self.bytes_written = 0

    @property
    def total_requests(self) -> int:
        """Requests of every kind."""
        with self._lock:
            return sum(self.requests.values())


_FORBIDDEN_CHARS = ("\\", "\x00")


def validate_key(key: str) -> str:
    """Return ``key`` if it is a safe relative '/'-separated key; InvalidArgumentError naming it otherwise."""
    if not isinstance(key, str) or not key:
        raise InvalidArgumentError(f"object key {key!r} must be a non-empty string")
    if key.startswith("/"):
        raise InvalidArgumentError(f"object key {key!r} must be relative (starts with '/')")
    for ch in key:
        if ch in _FORBIDDEN_CHARS or ord(ch) < 0x20 or ord(ch) == 0x7F:
            raise InvalidArgumentError(f"object key {key!r} contains a forbidden character {ch!r}")
    parts = key.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise InvalidArgumentError(f"object key {key!r} has an empty, '.' or '..' component")
    if parts[0].startswith(".clink-"):
        raise InvalidArgumentError(f"object key {key!r} uses the reserved '.clink-' prefix")
    return key


def validate_prefix(prefix: str) -> str:
    """A listing prefix: '' (everything) or a key-like string (may end with '/')."""
    if prefix == "":
        return prefix
    validate_key(prefix[:-1] if prefix.endswith("/") else prefix)
    return prefix


def cut_ranges(ranges: list[tuple[int, int]], spans: list[tuple[int, int, list[int]]], blobs: list[bytes]) -> list[bytes]:
    """Each requested (start, length) cut from the fetched span that holds it (shorter where the object ends early)."""
    out: list[bytes] = [b""] * len(ranges)
    for (span_start, _, members), blob in zip(spans, blobs, strict=True):
        view = memoryview(blob)
        for i in members:
            start, length = ranges[i]
            out[i] = bytes(view[start - span_start : start - span_start + length])
    return out


def coalesce_ranges(ranges: list[tuple[int, int]], gap: int, max_bytes: int = DEFAULT_MAX_COALESCED) -> list[tuple[int, int, list[int]]]:
    """Group (start, length) ranges into few spans: (span_start, span_length, indices of the ranges inside it)."""
    for start, length in ranges:
        if start < 0 or length < 0:
            raise InvalidArgumentError(f"range ({start}, {length}) must have start >= 0 and length >= 0")
    order = sorted(range(len(ranges)), key=lambda i: ranges[i][0])
    spans: list[tuple[int, int, list[int]]] = []
    for i in order:
        start, length = ranges[i]
        end = start + length
        if spans:
            s_start, s_len, members = spans[-1]
            s_end = s_start + s_len
            if start <= s_end + gap and max(end, s_end) - s_start <= max(max_bytes, length):
                spans[-1] = (s_start, max(end, s_end) - s_start, [*members, i])
                continue
        spans.append((start, length, [i]))
    return spans


class ObjectStore(ABC):
    """Get, ranged get, put, put-if-absent, compare-and-swap, list, delete over keys relative to a root."""

    uri: str
    counters: StoreCounters
    coalesce_gap_bytes: int = DEFAULT_COALESCE_GAP

    @abstractmethod
    def get(self, key: str) -> bytes:
        """The whole object; NotFoundError naming the key."""

    @abstractmethod
    def get_range(self, key: str, start: int, length: int) -> bytes:
        """``length`` bytes from ``start`` (shorter at the end of the object, b'' past it)."""

    @abstractmethod
    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        """The object and the etag of exactly those bytes (for a later compare_and_swap)."""

    @abstractmethod
    def head(self, key: str) -> ObjectInfo:
        """Size, modification time and etag; NotFoundError naming the key."""

    @abstractmethod
    def put(self, key: str, data: bytes) -> str:
        """Write atomically (readers see the old or the new object, never a part); returns the etag."""

    @abstractmethod
    def put_if_absent(self, key: str, data: bytes) -> str:
        """Write only if no object has the key; ConflictError naming it otherwise."""

    @abstractmethod
    def compare_and_swap(self, key: str, data: bytes, expected_etag: str | None) -> str:
        """Replace only if the current etag is ``expected_etag`` (None: the key must be absent); ConflictError otherwise."""

    @abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object whose key starts with ``prefix`` (a string prefix, like S3), sorted by key."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object; deleting a missing key is not an error."""

    # builtins.list in annotations below: in a class body ``list`` is the method above
    def list_prefixes(self, prefix: str = "") -> builtins.list[str]:
        """Names of the 'folders' right under ``prefix`` (which is '' or ends with '/'), sorted, without listing their contents."""
        validate_prefix(prefix)
        if prefix and not prefix.endswith("/"):
            raise InvalidArgumentError(f"prefix {prefix!r} must be empty or end with '/'")
        return sorted({info.key[len(prefix) :].split("/", 1)[0] for info in self.list(prefix) if "/" in info.key[len(prefix) :]})

    def get_ranges(self, key: str, ranges: builtins.list[tuple[int, int]]) -> builtins.list[bytes]:
        """Several (start, length) slices of one object, fetched with as few GETs as the coalescing gap allows."""
        if not ranges:
            return []
        spans = coalesce_ranges(list(ranges), self.coalesce_gap_bytes)

        def fetch(span: tuple[int, int, list[int]]) -> bytes:
            return self.get_range(key, span[0], span[1]) if span[1] else b""

        # several spans: fetched concurrently (each is still its own counted request, with its own retries and errors)
        blobs = list(_range_reader_pool().map(fetch, spans)) if len(spans) >= 4 else [fetch(span) for span in spans]
        return cut_ranges(ranges, spans, blobs)

    def spool_path(self) -> Path:
        """A fresh local path to write a new object's bytes to before putting them (put_if_absent_file); the caller removes it.

        A store on local disk gives one on its own file system, so the put is a link, not a copy.
        """
        fd, name = tempfile.mkstemp(prefix="clink-spool-")
        os.close(fd)
        return Path(name)

    def put_if_absent_file(self, key: str, path: Path, size: int) -> str:
        """put_if_absent of the ``size`` bytes of a local file; a store may stream or link it (this one reads it whole)."""
        return self.put_if_absent(key, path.read_bytes())

    def holds(self, prefix: str = "") -> bool:
        """Whether any object's key starts with ``prefix`` ('' or ending in '/': a folder holds an object); stops at the first."""
        return next(iter(self.list(prefix)), None) is not None

    def exists(self, key: str) -> bool:
        """Whether an object has this key."""
        from snapshot.errors import NotFoundError

        try:
            self.head(key)
        except NotFoundError:
            return False
        return True

    def check_exists(self) -> None:  # noqa: B027 - a store with nothing to check (memory, views) keeps this no-op
        """NotFoundError "no such store: ..." when the store itself (a directory, a bucket) is missing; a no-op here."""

    def probe(self) -> None:
        """Read the store's top level once, as cheaply as it allows (a server's startup check); the store's error otherwise."""
        self.list_prefixes("")

    def resolve_handle(self, handle):  # noqa: ANN001, ANN201 - snapshot.handles.Handle -> pa.Table, typed in store/handles.py
        """The verified rows a materialisation handle names in this store, so canonicalise_state_snapshot(data, store=it) works."""
        from store.handles import StoreHandleResolver

        return StoreHandleResolver(self).resolve_handle(handle)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"


def open_store(uri: str, config: StoreConfig | None = None, must_exist: bool = False) -> ObjectStore:
    """Open the store at ``uri`` (read by store.uris.parse_store_uri); nothing is created until the first write.

    ``must_exist`` (readers: every command that only looks) checks the store is there: NotFoundError "no such store"
    for a missing directory, "no such bucket" for a missing bucket, instead of reading it as empty.
    """
    from store.uris import parse_store_uri

    location = parse_store_uri(uri)
    store: ObjectStore
    if location.scheme == "s3":
        from store.s3 import S3Store

        store = S3Store(location.bucket, location.prefix, config or StoreConfig())
    else:
        from store.local import FileStore

        store = FileStore(location.path, config or StoreConfig())
    if must_exist:
        store.check_exists()
    return store
