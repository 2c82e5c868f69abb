"""Materialisation handles resolved over an object store: checkpoint handles through the checkpoint reader, file handles by key."""

from __future__ import annotations

import pyarrow as pa

from snapshot import handles
from snapshot.errors import ClinkError, HandleNotFoundError, MaterialisationHandleError, NotFoundError
from snapshot.handles import CheckpointHandle, FileHandle, Handle, check_relative_path, verified_file_rows
from store.checkpoint import CheckpointReader
from store.manifest import manifest_document
from store.objects import ObjectStore


class StoreHandleResolver:
    """Resolves handles over one object store: checkpoints of its jobs/ (the pool's store root), files by relative key."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self._readers: dict[str, CheckpointReader] = {}

    def _reader(self, job: str) -> CheckpointReader:
        reader = self._readers.get(job)
        if reader is None:
            reader = self._readers[job] = CheckpointReader(self.store, job)
        return reader

    def resolve_handle(self, handle: Handle) -> pa.Table:
        """The verified canonical rows ``handle`` names; HandleNotFoundError when the store lacks them."""
        if isinstance(handle, CheckpointHandle):
            return self._checkpoint(handle)
        if isinstance(handle, FileHandle):
            return self._file(handle)
        raise MaterialisationHandleError(f"unknown materialisation handle {handle!r}", repr(handle))

    def _checkpoint(self, handle: CheckpointHandle) -> pa.Table:
        reader = self._reader(handle.job)
        try:
            manifest = reader.manifest(handle.checkpoint)
        except NotFoundError:
            raise HandleNotFoundError(
                f"materialisation handle {handle.describe()}: no complete checkpoint {handle.checkpoint} of job {handle.job} "
                f"in {self.store.uri}",
                handle.describe(),
            ) from None
        handles.check_commit(handle, manifest_document(manifest))
        return reader.read_manifest_table(manifest, handle.key_groups)

    def _file(self, handle: FileHandle) -> pa.Table:
        path = check_relative_path(handle.path)
        try:
            data = self.store.get(path)
        except NotFoundError:
            raise HandleNotFoundError(f"materialisation handle {handle.describe()}: not in {self.store.uri}", handle.describe()) from None
        except ClinkError as exc:  # a key the store refuses (its own rules) names the handle too
            raise MaterialisationHandleError(f"materialisation handle {handle.describe()}: {exc}", handle.describe()) from exc
        return verified_file_rows(handle, data)
