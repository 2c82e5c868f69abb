"""The local-directory object store (file://): atomic rename for puts, exclusive link for put-if-absent."""

from __future__ import annotations

import builtins
import fcntl
import os
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from snapshot.errors import ConflictError, InvalidArgumentError, NotFoundError, UnavailableError
from store.objects import ObjectInfo, ObjectStore, StoreConfig, StoreCounters, coalesce_ranges, cut_ranges, validate_key, validate_prefix

TMP_DIR = ".clink-tmp"
_LOCK_FILE = ".clink-lock"


def _etag(st: os.stat_result) -> str:
    # every install stamps an mtime past the previous version's (FileStore._stamp), so this never repeats for one key
    return f"{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}"


def _holds_a_file(directory: Path) -> bool:
    """Whether any object file lies below ``directory`` (a store's .clink- files are none; stops at the first one found)."""
    for _, dirnames, filenames in os.walk(directory):
        dirnames[:] = [d for d in dirnames if d != TMP_DIR]
        if any(f != _LOCK_FILE for f in filenames):
            return True
    return False


class FileStore(ObjectStore):
    """Objects as files under a root directory; safe for several threads and processes on one host."""

    def __init__(self, root: str | os.PathLike[str], config: StoreConfig | None = None) -> None:
        config = config or StoreConfig()
        # nothing is created here: a reader never leaves a folder behind, the first write makes the root (see create)
        self.root = Path(root).expanduser().resolve()
        self.uri = f"file://{self.root}"
        self._root_prefix = str(self.root).rstrip("/") + "/"
        self.counters = StoreCounters()
        self.coalesce_gap_bytes = config.coalesce_gap_bytes
        self._thread_lock = threading.Lock()

    def create(self) -> None:
        """Make the root directory and its temp folder (the first write does it too); UnavailableError naming the root."""
        try:
            (self.root / TMP_DIR).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UnavailableError(f"cannot create store directory {self.root}: {exc.strerror or exc}") from exc

    def check_exists(self) -> None:
        """NotFoundError "no such store" when the root directory is missing; InvalidArgumentError when it is a file."""
        if self.root.is_dir():
            return
        if self.root.exists():
            raise InvalidArgumentError(f"not a store: {self.root} is a file, not a directory")
        raise NotFoundError(f"no such store: {self.uri} (the directory {self.root} does not exist)")

    def _path(self, key: str) -> Path:
        parts = validate_key(key).split("/")
        if parts[-1] == _LOCK_FILE or TMP_DIR in parts:  # a nested file store's own files: never objects of this one
            raise InvalidArgumentError(f"object key {key!r} names a file store's {_LOCK_FILE} or {TMP_DIR}; refused")
        return self.root / key

    def _inside(self, key: str, path: Path) -> Path:
        """``path``, unless a symlink under the root leads it elsewhere (a store never reads or writes outside its root)."""
        real = os.path.realpath(path)
        if real != str(path) and not real.startswith(self._root_prefix):
            raise InvalidArgumentError(f"object {key} resolves outside the store (a symbolic link); refused")
        return path

    @contextmanager
    def _locked(self) -> Iterator[None]:
        # the thread lock orders threads of this process, flock orders processes sharing the directory
        with self._thread_lock, open(self.root / _LOCK_FILE, "a+b") as fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)

    def _open_read(self, key: str):
        path = self._inside(key, self._path(key))
        try:
            return open(path, "rb")
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise NotFoundError(f"object {key} not found in {self.uri}") from None
        except OSError as exc:
            raise UnavailableError(f"cannot read {key} in {self.uri}: {exc}") from exc

    def get(self, key: str) -> bytes:
        """The whole object; NotFoundError naming the key."""
        with self._open_read(key) as fh:
            data = fh.read()
        self.counters.count("get", read=len(data))
        return data

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """``length`` bytes from ``start`` (shorter at the end of the object, b'' past it)."""
        if start < 0 or length < 0:
            raise InvalidArgumentError(f"range ({start}, {length}) of {key} must have start >= 0 and length >= 0")
        with self._open_read(key) as fh:
            fh.seek(start)
            data = fh.read(length)
        self.counters.count("get_range", read=len(data))
        return data

    def get_ranges(self, key: str, ranges: builtins.list[tuple[int, int]]) -> builtins.list[bytes]:
        """Several (start, length) slices, coalesced as for any store, read with one open of the file (a pread per span)."""
        if not ranges:
            return []
        if any(start < 0 or length < 0 for start, length in ranges):
            raise InvalidArgumentError(f"ranges of {key} must have start >= 0 and length >= 0")
        spans = coalesce_ranges(list(ranges), self.coalesce_gap_bytes)
        blobs = []
        with self._open_read(key) as fh:
            for span_start, span_len, _ in spans:
                blob = os.pread(fh.fileno(), span_len, span_start) if span_len else b""
                self.counters.count("get_range", read=len(blob))  # each span is still one counted request
                blobs.append(blob)
        return cut_ranges(ranges, spans, blobs)

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        """The object and the etag of exactly those bytes."""
        with self._open_read(key) as fh:
            st = os.fstat(fh.fileno())
            data = fh.read()
        self.counters.count("get", read=len(data))
        return data, _etag(st)

    def head(self, key: str) -> ObjectInfo:
        """Size, modification time and etag; NotFoundError naming the key."""
        path = self._inside(key, self._path(key))
        self.counters.count("head")
        try:
            st = path.stat()
        except (FileNotFoundError, NotADirectoryError):
            raise NotFoundError(f"object {key} not found in {self.uri}") from None
        if not path.is_file():
            raise NotFoundError(f"object {key} not found in {self.uri}")
        return ObjectInfo(key, st.st_size, st.st_mtime_ns // 1_000_000, _etag(st))

    def _write_temp(self, key: str, data: bytes) -> Path:
        tmp = self.root / TMP_DIR / f"{uuid.uuid4().hex}"
        if not tmp.parent.is_dir():
            self.create()
        try:
            with open(tmp, "xb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise UnavailableError(f"cannot write {key} in {self.uri}: {exc}") from exc
        return tmp

    @staticmethod
    def _stamp(tmp: Path, path: Path) -> str:
        """Give the new version a modification time past the old one's (called under the lock), so an etag never repeats.

        An etag is inode+mtime+size; a freed inode is soon reused, and coarse clocks give equal times, so without this a
        replace could bring back an earlier version's etag and let a stale compare-and-swap through.
        """
        try:
            previous = path.stat().st_mtime_ns
        except (FileNotFoundError, NotADirectoryError):
            previous = 0
        stamp = max(time.time_ns(), previous + 1)
        os.utime(tmp, ns=(stamp, stamp))
        return _etag(tmp.stat())

    def _ensure_parent(self, key: str, path: Path) -> None:
        self._inside(key, path.parent)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise InvalidArgumentError(f"object key {key} conflicts with an existing object on its path") from None

    def _install(self, key: str, tmp: Path, path: Path, exclusive: bool) -> str:
        etag = self._stamp(tmp, path)
        try:
            if exclusive:
                os.link(tmp, path)
            else:
                os.replace(tmp, path)
        except FileExistsError:
            raise ConflictError(f"object {key} already exists in {self.uri}") from None
        except IsADirectoryError:
            raise InvalidArgumentError(f"object key {key} names a directory of other objects") from None
        except OSError as exc:
            raise UnavailableError(f"cannot write {key} in {self.uri}: {exc}") from exc
        return etag

    def put(self, key: str, data: bytes) -> str:
        """Write atomically (temp file + rename); returns the etag."""
        path = self._path(key)
        tmp = self._write_temp(key, data)
        try:
            self._ensure_parent(key, path)
            with self._locked():
                etag = self._install(key, tmp, path, exclusive=False)
        finally:
            tmp.unlink(missing_ok=True)
        self.counters.count("put", written=len(data))
        return etag

    def put_if_absent(self, key: str, data: bytes) -> str:
        """Write only if absent (an exclusive hard link of a complete temp file); ConflictError otherwise."""
        return self._conditional(key, data, None, op="put_if_absent")

    def spool_path(self) -> Path:
        """A fresh path in the store's temp folder: a file written there is put by a hard link, never copied."""
        tmp = self.root / TMP_DIR / f"{uuid.uuid4().hex}.spool"
        if not tmp.parent.is_dir():
            self.create()
        return tmp

    def put_if_absent_file(self, key: str, path: Path, size: int) -> str:
        """put_if_absent of a complete local file: made durable, then hard-linked into place (copied in first if elsewhere)."""
        path = Path(path)
        if path.parent != self.root / TMP_DIR:  # another file system, perhaps: a temp copy of ours to link
            with open(path, "rb") as fh:
                return self.put_if_absent(key, fh.read())
        target = self._path(key)
        try:
            with open(path, "rb+") as fh:
                os.fsync(fh.fileno())
            self._ensure_parent(key, target)
            with self._locked():
                return self._install(key, path, target, exclusive=True)
        except OSError as exc:
            raise UnavailableError(f"cannot write {key} in {self.uri}: {exc}") from exc
        finally:
            self.counters.count("put_if_absent", written=size)

    def compare_and_swap(self, key: str, data: bytes, expected_etag: str | None) -> str:
        """Replace only if the current etag matches (None: must be absent); ConflictError otherwise."""
        return self._conditional(key, data, expected_etag, op="compare_and_swap")

    def _conditional(self, key: str, data: bytes, expected_etag: str | None, op: str) -> str:
        path = self._path(key)
        tmp = self._write_temp(key, data)
        try:
            self._ensure_parent(key, path)
            with self._locked():
                if expected_etag is None:
                    etag = self._install(key, tmp, path, exclusive=True)
                else:
                    try:
                        current = _etag(path.stat()) if path.is_file() else None
                    except FileNotFoundError:
                        current = None
                    if current is None:
                        raise ConflictError(f"object {key} does not exist in {self.uri} (expected etag {expected_etag})")
                    if current != expected_etag:
                        raise ConflictError(f"object {key} in {self.uri} changed (etag {current}, expected {expected_etag})")
                    etag = self._install(key, tmp, path, exclusive=False)
        finally:
            tmp.unlink(missing_ok=True)
            self.counters.count(op, written=len(data))
        return etag

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object whose key starts with ``prefix``, sorted by key."""
        validate_prefix(prefix)
        self.counters.count("list")
        base_rel = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        base = self.root / base_rel if base_rel else self.root
        found: list[ObjectInfo] = []
        if base.is_dir():
            for dirpath, dirnames, filenames in os.walk(base):
                rel_dir = os.path.relpath(dirpath, self.root)
                if rel_dir == ".":
                    dirnames[:] = [d for d in dirnames if not d.startswith(".clink-")]
                    filenames = [f for f in filenames if not f.startswith(".clink-")]
                else:  # the lock and temp folder of a file store rooted here (a savepoint directory) are no objects
                    dirnames[:] = [d for d in dirnames if d != TMP_DIR]
                    filenames = [f for f in filenames if f != _LOCK_FILE]
                rel_prefix = "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/"
                # descend only where keys can still start with the prefix (listing chk-* skips data/)
                dirnames[:] = [d for d in dirnames if (rel_prefix + d + "/").startswith(prefix) or prefix.startswith(rel_prefix + d + "/")]
                for name in filenames:
                    key = name if rel_dir == "." else f"{rel_dir.replace(os.sep, '/')}/{name}"
                    if not key.startswith(prefix):
                        continue
                    try:
                        st = os.stat(os.path.join(dirpath, name))
                    except FileNotFoundError:
                        continue
                    found.append(ObjectInfo(key, st.st_size, st.st_mtime_ns // 1_000_000, _etag(st)))
        found.sort(key=lambda info: info.key.encode())
        yield from found

    def list_prefixes(self, prefix: str = "") -> builtins.list[str]:
        """Directories right under ``prefix`` that hold at least one object name (a directory scan, not a walk)."""
        validate_prefix(prefix)
        if prefix and not prefix.endswith("/"):
            raise InvalidArgumentError(f"prefix {prefix!r} must be empty or end with '/'")
        self.counters.count("list")
        base = self.root / prefix if prefix else self.root
        try:
            entries = list(os.scandir(base))
        except (FileNotFoundError, NotADirectoryError):
            return []
        names = [e.name for e in entries if e.is_dir() and not (e.name == TMP_DIR or (not prefix and e.name.startswith(".clink-")))]
        return sorted(n for n in names if _holds_a_file(base / n))

    def holds(self, prefix: str = "") -> bool:
        """Whether any object lies under the folder ``prefix`` ('' or ending in '/'): a directory scan stopping at the first file."""
        validate_prefix(prefix)
        if prefix and not prefix.endswith("/"):
            return super().holds(prefix)
        base = self.root / prefix if prefix else self.root
        self.counters.count("list")
        try:
            entries = list(os.scandir(base))
        except (FileNotFoundError, NotADirectoryError):
            return False
        for entry in entries:
            if not prefix and entry.name.startswith(".clink-"):  # the store's own temp folder and lock file hold no object
                continue
            if entry.is_file() or (entry.is_dir() and _holds_a_file(Path(entry.path))):
                return True
        return False

    def remove_root_if_empty(self) -> bool:
        """Remove the root folder if it holds no object any more (only the lock file, the temp folder, empty folders).

        For a store rooted at a folder of another (a savepoint directory): its lock file would be an object of that other one.
        """
        if not self.root.is_dir() or any(True for _ in self.list("")):
            return False
        with self._thread_lock:
            (self.root / _LOCK_FILE).unlink(missing_ok=True)
            for folder, _, _ in sorted(os.walk(self.root), key=lambda entry: -len(entry[0])):
                try:
                    os.rmdir(folder)
                except OSError:
                    return False  # a file appeared meanwhile: keep what is there
        return True

    def delete(self, key: str) -> None:
        """Remove the object; a missing key is fine."""
        path = self._inside(key, self._path(key))
        if not self.root.is_dir():  # nothing to delete, and the lock file would create the root
            self.counters.count("delete")
            return
        with self._locked():
            try:
                path.unlink()
            except (FileNotFoundError, NotADirectoryError):
                pass
            except IsADirectoryError:
                raise InvalidArgumentError(f"object key {key} names a directory of other objects") from None
        self.counters.count("delete")
