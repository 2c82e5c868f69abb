"""Materialisation handles of the changelog variant: rows stored elsewhere, named by a reserved key and resolved by a store."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias, runtime_checkable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from snapshot.errors import (
    ClinkError,
    CorruptSnapshotError,
    HandleChecksumError,
    HandleNeedsStoreError,
    InvalidArgumentError,
    MaterialisationHandleError,
)
from snapshot.format import (
    CHANGELOG_SCHEMA,
    ROW_ERASE,
    ROW_HANDLE,
    Bytesish,
    ExtraMetadata,
    SnapshotArrowWriter,
    conform,
    read_snapshot,
)
from snapshot.keys import NUM_KEY_GROUPS, check_key_group_range
from snapshot.names import validate_job
from snapshot.versions import StateVersionMap

# every handle row has this op_id and a key under this prefix (operator-state layout, slot "clink.handle", its index after '|')
HANDLE_OP_ID = (1 << 64) - 1
HANDLE_KEY_PREFIX = b"\xffclink.handle|"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class CheckpointHandle:
    """The canonical rows of key groups lo..hi (and every operator-state row) of a pool checkpoint, as a scan returns them.

    ``commit_sha256`` is the checkpoint's commit digest (store/handles.py: job, id, parent, creation time, operators, state
    versions and each part's range, epoch and parent), the same in every copy of the store and after compaction.
    """

    job: str
    checkpoint: int
    key_groups: tuple[int, int]
    commit_sha256: str

    kind = "checkpoint"

    def describe(self) -> str:
        """The handle's name in messages: 'checkpoint 7 of job orders, key groups 0-63'."""
        lo, hi = self.key_groups
        return f"checkpoint {self.checkpoint} of job {self.job}, key groups {lo}-{hi}"

    def to_dict(self) -> dict[str, object]:
        """The JSON document stored in the handle row's value_bytes."""
        return {
            "kind": self.kind,
            "job": self.job,
            "checkpoint": self.checkpoint,
            "key_groups": list(self.key_groups),
            "commit_sha256": self.commit_sha256,
        }


@dataclass(frozen=True)
class FileHandle:
    """A snapshot stream stored at ``path`` (relative to the store's root) with its SHA-256 and row count."""

    path: str
    sha256: str
    rows: int

    kind = "file"

    def describe(self) -> str:
        """The handle's name in messages: 'file state/base.arrow'."""
        return f"file {self.path}"

    def to_dict(self) -> dict[str, object]:
        """The JSON document stored in the handle row's value_bytes."""
        return {"kind": self.kind, "path": self.path, "sha256": self.sha256, "rows": self.rows}


Handle: TypeAlias = CheckpointHandle | FileHandle


@runtime_checkable
class HandleResolver(Protocol):
    """Anything that turns a handle into the canonical rows it names, verified (store.handles, client.changelog_export)."""

    def resolve_handle(self, handle: Handle) -> pa.Table:
        """The canonical rows (op_id, key_bytes, value_bytes) ``handle`` names; a MaterialisationHandleError naming it otherwise."""
        ...


def check_relative_path(path: object, where: str = "file handle") -> str:
    """``path`` when it is a relative path inside the store ('/'-separated, no '..', '.', empty part, backslash or NUL)."""
    if not isinstance(path, str) or not path:
        raise MaterialisationHandleError(f"{where}: path must be a non-empty string, got {path!r}", f"file {path!r}")
    parts = path.split("/")
    if path.startswith("/") or re.match(r"^[A-Za-z]:", path) or "\\" in path or "\x00" in path:
        raise MaterialisationHandleError(f"{where} {path!r}: the path must be relative to the store's root", f"file {path}")
    if any(p in ("", ".", "..") for p in parts):
        raise MaterialisationHandleError(f"{where} {path!r}: the path may not hold '..', '.' or empty parts", f"file {path}")
    return path


def _handle_error(doc: object, what: str) -> MaterialisationHandleError:
    return MaterialisationHandleError(f"materialisation handle {doc!r} is malformed: {what}", str(doc)[:200])


# the fields of each kind, exactly: a field this reader does not know could change what the handle means, so it fails
HANDLE_FIELDS = {
    "checkpoint": frozenset({"kind", "job", "checkpoint", "key_groups", "commit_sha256"}),
    "file": frozenset({"kind", "path", "sha256", "rows"}),
}


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's members; a member named twice is refused (two readers could take different ones)."""
    doc: dict[str, Any] = {}
    for key, value in pairs:
        if key in doc:
            raise ValueError(f"duplicate member {key!r}")
        doc[key] = value
    return doc


def parse_handle(value: bytes | str) -> Handle:
    """The handle a row's value_bytes holds; MaterialisationHandleError naming what is wrong otherwise."""
    try:
        doc = json.loads(value, object_pairs_hook=_unique_pairs)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _handle_error(value[:200], f"its value is not a JSON object with unique members ({exc})"[:300]) from None
    if not isinstance(doc, dict):
        raise _handle_error(doc, "its value is not a JSON object")
    kind = doc.get("kind")
    if isinstance(kind, str) and kind in HANDLE_FIELDS and set(doc) != HANDLE_FIELDS[kind]:
        unknown, missing = sorted(set(doc) - HANDLE_FIELDS[kind]), sorted(HANDLE_FIELDS[kind] - set(doc))
        raise _handle_error(doc, f"a {kind} handle has exactly {sorted(HANDLE_FIELDS[kind])} (unknown {unknown}, missing {missing})")
    if kind == "checkpoint":
        job, checkpoint, groups, digest = (doc.get(k) for k in ("job", "checkpoint", "key_groups", "commit_sha256"))
        name = f"checkpoint {checkpoint} of job {job}"
        if not isinstance(job, str):
            raise _handle_error(doc, "job must be a string")
        try:
            validate_job(job)
        except InvalidArgumentError as exc:
            raise MaterialisationHandleError(f"materialisation handle {name}: {exc}", name) from None
        if type(checkpoint) is not int or checkpoint < 1:
            raise MaterialisationHandleError(f"materialisation handle {name}: checkpoint must be a positive integer", name)
        if not isinstance(groups, list) or len(groups) != 2 or any(type(g) is not int for g in groups):
            raise MaterialisationHandleError(f"materialisation handle {name}: key_groups must be [lo, hi]", name)
        try:
            lo, hi = check_key_group_range(groups[0], groups[1])
        except InvalidArgumentError as exc:
            raise MaterialisationHandleError(f"materialisation handle {name}: {exc}", name) from None
        if not isinstance(digest, str) or not _SHA256.match(digest):
            raise MaterialisationHandleError(f"materialisation handle {name}: commit_sha256 must be 64 lowercase hex digits", name)
        return CheckpointHandle(job, checkpoint, (lo, hi), digest)
    if kind == "file":
        path = check_relative_path(doc.get("path"), "materialisation handle file")
        digest, rows = doc.get("sha256"), doc.get("rows")
        if not isinstance(digest, str) or not _SHA256.match(digest):
            raise MaterialisationHandleError(f"materialisation handle file {path}: sha256 must be 64 lowercase hex digits", f"file {path}")
        if type(rows) is not int or rows < 0:
            raise MaterialisationHandleError(f"materialisation handle file {path}: rows must be a count", f"file {path}")
        return FileHandle(path, digest, rows)
    raise _handle_error(doc, f"unknown kind {kind!r} (this reader knows 'checkpoint' and 'file')")


def commit_digest(manifest: Mapping[str, Any]) -> str:
    """SHA-256 of what a checkpoint commit is, from its manifest's JSON document: job, id, parent, creation time, operators,
    state versions, and each part's range, epoch and parent.

    File paths and checksums are left out, so compaction (which refolds the same rows into new files) and copies of the
    store keep it; the same id committed again by another attempt (new epochs, new time) changes it. The rows are
    verified as every checkpoint read verifies them: each data file against its checksum in the manifest.
    """
    try:
        commit = {
            "job": str(manifest["job"]),
            "checkpoint_id": int(manifest["checkpoint_id"]),
            "parent_id": int(manifest["parent_id"]),
            "created_at_ms": int(manifest["created_at_ms"]),
            "operators": sorted([int(o["op_id"]), str(o.get("uid") or "")] for o in manifest["operators"]),
            "state_versions": str(manifest["state_versions"]),
            "parts": sorted([int(p["kg_lo"]), int(p["kg_hi"]), int(p["epoch"]), int(p["parent_id"])] for p in manifest["parts"]),
        }
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CorruptSnapshotError(f"checkpoint manifest lacks a commit field: {exc!r}") from None
    return hashlib.sha256(json.dumps(commit, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def check_commit(handle: CheckpointHandle, manifest: Mapping[str, Any]) -> None:
    """Raise HandleChecksumError naming the handle unless ``manifest`` (a JSON document) is the commit the handle names."""
    if manifest.get("job") != handle.job or manifest.get("checkpoint_id") != handle.checkpoint:
        raise HandleChecksumError(
            f"materialisation handle {handle.describe()}: the manifest found is of checkpoint {manifest.get('checkpoint_id')} "
            f"of job {manifest.get('job')}",
            handle.describe(),
        )
    try:
        digest = commit_digest(manifest)
    except CorruptSnapshotError as exc:
        raise MaterialisationHandleError(f"materialisation handle {handle.describe()}: {exc}", handle.describe()) from None
    if digest != handle.commit_sha256:
        raise HandleChecksumError(
            f"materialisation handle {handle.describe()}: the checkpoint's commit digest is {digest}, the handle says "
            f"{handle.commit_sha256} (another commit of that checkpoint id, or a handle changed since it was written)",
            handle.describe(),
        )


def encode_handle(handle: Handle) -> bytes:
    """The handle's JSON document (sorted keys, compact)."""
    return json.dumps(handle.to_dict(), sort_keys=True, separators=(",", ":")).encode()


def handle_rows(handles: Sequence[Handle]) -> pa.Table:
    """Changelog rows (row kind 3) for ``handles``, in order."""
    n = len(handles)
    return pa.Table.from_arrays(
        [
            pa.array(np.full(n, ROW_HANDLE, dtype=np.uint8)),
            pa.array(np.full(n, HANDLE_OP_ID, dtype=np.uint64)),
            pa.array([HANDLE_KEY_PREFIX + str(i).encode() for i in range(n)], pa.binary()),
            pa.array([encode_handle(h) for h in handles], pa.binary()),
        ],
        schema=CHANGELOG_SCHEMA,
    )


def handle_positions(table: pa.Table) -> np.ndarray:
    """Row positions of the handle rows of a changelog table (one vectorised compare)."""
    if "row_kind" not in table.column_names or table.num_rows == 0:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(pc.equal(table.column("row_kind"), ROW_HANDLE).to_numpy(zero_copy_only=False))


def handles_at(table: pa.Table, positions: np.ndarray) -> list[Handle]:
    """The handles at ``positions`` (a Python object per handle: a stream holds a few), each row's op_id and key checked."""
    rows = table.take(pa.array(positions, pa.int64()))
    ops = rows.column("op_id").to_numpy()
    keys = rows.column("key_bytes").to_pylist()
    values = rows.column("value_bytes").to_pylist()
    out = []
    for index, (op, key, value) in enumerate(zip(ops.tolist(), keys, values, strict=True)):
        if op != HANDLE_OP_ID or key != HANDLE_KEY_PREFIX + str(index).encode():
            raise MaterialisationHandleError(
                f"a row_kind 3 row (materialisation handle) has op_id {op} and key {key[:40]!r}; handle {index}'s op_id is 2**64-1 "
                f"and its key {HANDLE_KEY_PREFIX + str(index).encode()!r}",
                f"row key {key[:40]!r}",
            )
        out.append(parse_handle(value))
    return out


def describe_handles(handles: Sequence[Handle], limit: int = 3) -> str:
    """'checkpoint 7 of job orders, key groups 0-63' for one handle; the first few and how many for more."""
    names = [h.describe() for h in handles[:limit]]
    more = f" and {len(handles) - limit} more" if len(handles) > limit else ""
    return "; ".join(names) + more


def refuse_unresolved(table: pa.Table | pa.RecordBatch) -> None:
    """Raise HandleNeedsStoreError naming the handles of a changelog read without a store to resolve them."""
    t = table if isinstance(table, pa.Table) else pa.Table.from_batches([table])
    positions = handle_positions(t)
    named = describe_handles(handles_at(t, positions))  # a malformed one is said as such (MaterialisationHandleError)
    raise HandleNeedsStoreError(
        f"this changelog snapshot holds {len(positions)} materialisation handle(s) ({named}): the rows they name are stored "
        "elsewhere; canonicalise it with a store that holds them (canonicalise_state_snapshot(data, store=...), clink --store URI)",
        named,
    )


def as_resolver(store: object) -> HandleResolver:
    """``store`` as a HandleResolver: anything with resolve_handle (an ObjectStore, a PoolClient, a resolver of tests)."""
    if isinstance(store, HandleResolver):
        return store
    raise InvalidArgumentError(
        f"store {type(store).__name__} cannot resolve materialisation handles: pass an object store (store.open_store), a "
        "client.pool_client.PoolClient, or any object with resolve_handle(handle) -> pa.Table"
    )


def verified_file_rows(handle: FileHandle, data: Bytesish) -> pa.Table:
    """The canonical rows of a file handle's bytes, after checking their SHA-256 and row count against the handle."""
    digest = hashlib.sha256(memoryview(data) if not isinstance(data, pa.Buffer) else memoryview(data)).hexdigest()
    if digest != handle.sha256:
        raise HandleChecksumError(
            f"materialisation handle {handle.describe()}: its bytes have SHA-256 {digest}, the handle says {handle.sha256}",
            handle.describe(),
        )
    try:
        snap = read_snapshot(data)
    except ClinkError as exc:
        raise MaterialisationHandleError(f"materialisation handle {handle.describe()}: {exc}", handle.describe()) from exc
    if snap.table.num_rows != handle.rows:
        raise HandleChecksumError(
            f"materialisation handle {handle.describe()}: the file holds {snap.table.num_rows} row(s), the handle says {handle.rows}",
            handle.describe(),
        )
    from snapshot.ops import canonical_of  # ops builds on this module: imported when needed

    # a changelog file is replayed as when it is canonicalised on its own (its TTL cut included); it holds no handles
    return canonical_of(snap).table.replace_schema_metadata(None)


def file_handle(path: str, data: Bytesish) -> FileHandle:
    """A handle to a snapshot stream that will be stored at ``path`` (relative), its SHA-256 and rows taken from ``data``."""
    check_relative_path(path)
    digest = hashlib.sha256(memoryview(data)).hexdigest()
    return FileHandle(path, digest, read_snapshot(data).table.num_rows)


def changelog_snapshot(
    handles: Sequence[Handle],
    log: pa.Table | None = None,
    state_versions: StateVersionMap | None = None,
    extra_metadata: ExtraMetadata | Mapping[bytes, bytes] | None = None,
) -> bytes:
    """A changelog stream: ``handles`` (materialised first, in order), then ``log`` (a changelog of kinds 0..2) as it is."""
    parts = [handle_rows(handles)]
    if log is not None and log.num_rows:
        log = conform(log, changelog=True)
        if pc.max(log.column("row_kind")).as_py() > ROW_ERASE:
            raise InvalidArgumentError("log rows must be of kinds 0..2; pass handles in ``handles``")
        parts.append(log)
    return SnapshotArrowWriter(state_versions, extra_metadata, changelog=True).write(pa.concat_tables(parts))


def handles_in(data: Bytesish) -> list[Handle]:
    """The handles a changelog stream holds, in stream order (nothing resolved)."""
    snap = read_snapshot(data, handles=True)
    return handles_at(snap.table, handle_positions(snap.table)) if snap.is_changelog else []


def key_groups_of(handles: Iterable[Handle]) -> list[tuple[int, int]]:
    """The key-group ranges of the checkpoint handles (file handles cover 0..127)."""
    return [h.key_groups if isinstance(h, CheckpointHandle) else (0, NUM_KEY_GROUPS - 1) for h in handles]
