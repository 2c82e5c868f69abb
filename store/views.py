"""Savepoints seen as checkpoints: a read-only store view so one checkpoint reader opens both."""

from __future__ import annotations

from collections.abc import Iterator

from snapshot.errors import NotFoundError, PermissionDeniedError
from store.layout import SAVEPOINT_MANIFEST, SAVEPOINTS, job_prefix, metadata_key, savepoint_prefix
from store.objects import ObjectInfo, ObjectStore

__all__ = ["SAVEPOINTS", "SAVEPOINT_MANIFEST", "SavepointView", "savepoint_prefix"]


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
