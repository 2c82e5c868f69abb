"""Changelog snapshots of a backend (a handle to its pool checkpoint plus its hot delta) and handles resolved through a pool."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

import snapshot
from client.pool_client import PoolClient
from snapshot.errors import (
    CorruptDataError,
    HandleNotFoundError,
    MaterialisationHandleError,
    NotFoundError,
)
from snapshot.format import operators_metadata
from snapshot.handles import CheckpointHandle, FileHandle, Handle, changelog_snapshot, check_commit, commit_digest
from snapshot.ttl import TtlSlot, ttl_expired_mask, ttl_filter_metadata
from snapshot.versions import StateVersionMap


def _manifest_doc(manifest_json: str, where: str) -> dict[str, Any]:
    """A DescribeCheckpoint's manifest JSON as a document; CorruptDataError naming ``where`` when it is not one."""
    try:
        doc = json.loads(manifest_json)
    except ValueError as exc:
        raise CorruptDataError(f"{where}: the pool's manifest is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise CorruptDataError(f"{where}: the pool's manifest is not a JSON object")
    return doc


def _manifest_of(pool: PoolClient, handle: CheckpointHandle) -> tuple[str, dict[str, Any]]:
    """(manifest etag, manifest document) of the complete checkpoint a handle names, from one DescribeCheckpoint."""
    try:
        info, doc = pool.describe_checkpoint(handle.job, handle.checkpoint)
    except NotFoundError:
        raise HandleNotFoundError(
            f"materialisation handle {handle.describe()}: the pool has no checkpoint {handle.checkpoint} of job {handle.job}",
            handle.describe(),
        ) from None
    if not info.complete:
        raise HandleNotFoundError(
            f"materialisation handle {handle.describe()}: checkpoint {handle.checkpoint} of job {handle.job} is not complete",
            handle.describe(),
        )
    return info.manifest_etag, _manifest_doc(doc, f"materialisation handle {handle.describe()}")


class PoolHandleResolver:
    """Resolves checkpoint handles through a pool (DescribeCheckpoint to verify the commit, then one scan of the range)."""

    def __init__(self, pool: PoolClient) -> None:
        self.pool = pool

    def resolve_handle(self, handle: Handle) -> pa.Table:
        """The verified canonical rows of a checkpoint handle; a file handle needs an object store and is refused, named."""
        if isinstance(handle, FileHandle):
            raise MaterialisationHandleError(
                f"materialisation handle {handle.describe()}: a pool resolves checkpoint handles only; give the object store "
                "holding the file (--store s3://... or file://...)",
                handle.describe(),
            )
        etag, manifest = _manifest_of(self.pool, handle)
        check_commit(handle, manifest)
        blob = self.pool.scan_checkpoint(handle.job, handle.checkpoint, key_groups=handle.key_groups, manifest_etag=etag)
        return snapshot.read_snapshot(blob).table.replace_schema_metadata(None)


def changelog_snapshot_of(
    job: str,
    key_groups: tuple[int, int],
    checkpoint: int | None,
    manifest_json: str | None,
    changes: pa.Table,
    state_versions: StateVersionMap,
    operators: Mapping[int, str],
    ttl_slots: Iterable[TtlSlot],
    now_ms: int,
) -> bytes:
    """The changelog stream a backend exports: a handle to ``checkpoint`` (None: none yet) for its range, then its changes.

    ``manifest_json``: the checkpoint's manifest as DescribeCheckpoint gave it (the backend checked it is the commit it reads).

    Canonicalised with a store holding the checkpoint it equals export_arrow_snapshot at the same moment: the same rows,
    state versions (the checkpoint's, then the backend's) and, without a checkpoint, the same operator names. The changes
    are replayed to one row per key first; TTL rows expired at ``now_ms`` are dropped here without a checkpoint, and
    recorded as clink.ttl_filter (applied after replay) with one, since the checkpoint's rows expire too.
    """
    lo, hi = key_groups
    slots = sorted(set(ttl_slots))
    log = snapshot.replay_changelog(snapshot.filter_key_groups(changes, lo, hi)) if changes.num_rows else changes
    if checkpoint is None:
        if slots and log.num_rows:
            puts = pc.equal(log.column("row_kind"), snapshot.ROW_PUT).to_numpy(zero_copy_only=False)
            log = log.filter(pa.array(~(puts & ttl_expired_mask(log, slots, now_ms))))
        return changelog_snapshot([], log, state_versions, operators_metadata(operators))
    manifest = _manifest_doc(manifest_json or "", f"checkpoint {checkpoint} of job {job}")
    handle = CheckpointHandle(job, checkpoint, (lo, hi), commit_digest(manifest))
    # as export_arrow_snapshot stamps them: the checkpoint's versions, then the ones this backend set
    stamped = {**dict(StateVersionMap.unpack(str(manifest.get("state_versions", ""))).items()), **dict(state_versions.items())}
    return changelog_snapshot([handle], log, StateVersionMap(stamped), ttl_filter_metadata(slots, now_ms))
