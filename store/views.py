"""Savepoints seen as checkpoints: a read-only store view so one checkpoint reader opens both."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from snapshot.errors import NotFoundError, PermissionDeniedError
from store.layout import SAVEPOINT_MANIFEST, SAVEPOINTS, job_prefix, metadata_key, savepoint_prefix
from store.objects import ObjectInfo, ObjectStore

__all__ = ["SAVEPOINTS", "SAVEPOINT_MANIFEST", "PrefixStore", "SavepointView", "savepoint_prefix"]


class SavepointView(ObjectStore):
    """A read-only view that shows ``base`` (a savepoint folder) as jobs/<job>/ with its _metadata as chk-<N>/_metadata.

    A savepoint is a relocatable copy (manifest plus the files it names, paths relative to its folder), so the
    checkpoint reader opens it unchanged through this view.
    """

    def __init__(self, inner: ObjectStore, base: str, job: str, checkpoint_id: int) -> None:
        self.inner, self.base, self.job_prefix = inner, base, job_prefix(job)
        self.meta = metadata_key(job, checkpoint_id)
        self.uri = f"{inner.uri.rstrip('/')}/{base.rstrip('/')}"
        self.counters = inner.counters
        self.coalesce_gap_bytes = inner.coalesce_gap_bytes

    def _key(self, key: str) -> str:
        if key == self.meta:
            return self.base + SAVEPOINT_MANIFEST
        if not key.startswith(self.job_prefix):
            raise NotFoundError(f"object {key} not found in {self.uri}")
        return self.base + key[len(self.job_prefix) :]

    def get(self, key: str) -> bytes:
        return self.inner.get(self._key(key))

    def get_range(self, key: str, start: int, length: int) -> bytes:
        return self.inner.get_range(self._key(key), start, length)

    def get_ranges(self, key: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        return self.inner.get_ranges(self._key(key), ranges)

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        return self.inner.get_with_etag(self._key(key))

    def head(self, key: str) -> ObjectInfo:
        return self.inner.head(self._key(key))

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        for info in self.inner.list(self.base):
            rest = info.key[len(self.base) :]
            key = self.meta if rest == SAVEPOINT_MANIFEST else self.job_prefix + rest
            if key.startswith(prefix):
                yield ObjectInfo(key, info.size, info.last_modified_ms, info.etag)

    def _read_only(self, *_: object) -> str:
        raise PermissionDeniedError(f"{self.uri} is opened read-only")

    put = put_if_absent = put_if_absent_file = compare_and_swap = delete = _read_only  # type: ignore[assignment]


class PrefixStore(ObjectStore):
    """A store seen from one of its folders: keys are relative to ``prefix`` (a savepoint directory inside a pool's store)."""

    def __init__(self, inner: ObjectStore, prefix: str) -> None:
        if prefix and not prefix.endswith("/"):
            raise ValueError(f"prefix {prefix!r} must end with '/'")
        self.inner, self.prefix = inner, prefix
        self.uri = f"{inner.uri.rstrip('/')}/{prefix.rstrip('/')}" if prefix else inner.uri
        self.counters = inner.counters
        self.coalesce_gap_bytes = inner.coalesce_gap_bytes

    def get(self, key: str) -> bytes:
        return self.inner.get(self.prefix + key)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        return self.inner.get_range(self.prefix + key, start, length)

    def get_ranges(self, key: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        return self.inner.get_ranges(self.prefix + key, ranges)

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        return self.inner.get_with_etag(self.prefix + key)

    def head(self, key: str) -> ObjectInfo:
        info = self.inner.head(self.prefix + key)
        return ObjectInfo(key, info.size, info.last_modified_ms, info.etag)

    def put(self, key: str, data: bytes) -> str:
        return self.inner.put(self.prefix + key, data)

    def put_if_absent(self, key: str, data: bytes) -> str:
        return self.inner.put_if_absent(self.prefix + key, data)

    def put_if_absent_file(self, key: str, path: Path, size: int) -> str:
        return self.inner.put_if_absent_file(self.prefix + key, path, size)

    def spool_path(self) -> Path:
        return self.inner.spool_path()

    def compare_and_swap(self, key: str, data: bytes, expected_etag: str | None) -> str:
        return self.inner.compare_and_swap(self.prefix + key, data, expected_etag)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        for info in self.inner.list(self.prefix + prefix):
            yield ObjectInfo(info.key[len(self.prefix) :], info.size, info.last_modified_ms, info.etag)

    def delete(self, key: str) -> None:
        self.inner.delete(self.prefix + key)
