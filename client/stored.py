"""Checkpoints and savepoints read straight from an object store (no pool): loading for the CLI and the file-by-file check."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pyarrow.compute as pc

from client.sources import Selection, SourceConfig, SourceRef, StateSource, apply_selection, open_source_store
from snapshot import ClinkError, CorruptDataError, NotFoundError, PermissionDeniedError, StateVersionMap, UnsupportedFormatVersionError
from snapshot.errors import ChecksumMismatchError, CorruptSnapshotError
from snapshot.format import FORMAT_VERSION
from store.objects import ObjectInfo, ObjectStore

SAVEPOINT_MANIFEST = "_metadata"
_CHECKPOINT_MANIFEST = re.compile(r"^chk-[0-9]+/_metadata$")


class SavepointView(ObjectStore):
    """savepoints/<name>/ seen as one checkpoint of its job: _metadata at jobs/<job>/chk-<N>/_metadata, data/... at jobs/<job>/data/...

    A savepoint is a relocatable copy (manifest plus the files it names, paths relative to its folder), so the
    checkpoint reader opens it unchanged through this read-only view.
    """

    def __init__(self, inner: ObjectStore, name: str, job: str, checkpoint_id: int) -> None:
        self.inner = inner
        self.base = f"savepoints/{name}/"
        self.job_prefix = f"jobs/{job}/"
        self.checkpoint_id = checkpoint_id
        self.uri = f"{inner.uri.rstrip('/')}/savepoints/{name}"
        self.counters = inner.counters
        self.coalesce_gap_bytes = inner.coalesce_gap_bytes

    def _key(self, key: str) -> str:
        if not key.startswith(self.job_prefix):
            raise NotFoundError(f"object {key} not found in {self.uri}")
        rest = key[len(self.job_prefix) :]
        return self.base + (SAVEPOINT_MANIFEST if _CHECKPOINT_MANIFEST.match(rest) else rest)

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
            rest = f"chk-{self.checkpoint_id}/_metadata" if rest == SAVEPOINT_MANIFEST else rest
            key = self.job_prefix + rest
            if key.startswith(prefix):
                yield ObjectInfo(key, info.size, info.last_modified_ms, info.etag)

    def _read_only(self, *_: object) -> str:
        raise PermissionDeniedError(f"{self.uri} is opened read-only")

    put = put_if_absent = compare_and_swap = delete = _read_only  # type: ignore[assignment]


def _open(ref: SourceRef, store: ObjectStore) -> tuple[ObjectStore, str, int]:
    """(store, job, checkpoint id) to read: the checkpoint itself, or a savepoint through its view."""
    if ref.kind != "savepoint":
        return store, ref.job, ref.checkpoint_id
    from store.manifest import parse_manifest

    key = f"savepoints/{ref.savepoint}/{SAVEPOINT_MANIFEST}"
    try:
        data = store.get(key)
    except NotFoundError:
        raise NotFoundError(f"{ref.describe()}: no {SAVEPOINT_MANIFEST} at {store.uri}/{key}") from None
    manifest = parse_manifest(data, key)
    return SavepointView(store, ref.savepoint, manifest.job, manifest.checkpoint_id), manifest.job, manifest.checkpoint_id


def read_stored(ref: SourceRef, store, selection: Selection) -> StateSource:
    """A checkpoint's or savepoint's canonical table (selection pushed down to the segment reads), operators and state versions."""
    from store.checkpoint import CheckpointReader

    try:
        store, job, checkpoint_id = _open(ref, store)
        reader = CheckpointReader(store, job)
        manifest = reader.manifest(checkpoint_id)
        table = reader.read_manifest_table(manifest, selection.key_groups, list(selection.op_ids) or None)
    except ClinkError as exc:
        raise _named(exc, ref) from None
    table = apply_selection(table, Selection(None, selection.op_ids))  # the reader already clipped the key groups
    operators: dict[int, str | None] = {int(o): (uid or None) for o, uid in manifest.operators}
    return StateSource(
        ref,
        table,
        FORMAT_VERSION,
        StateVersionMap.unpack(manifest.state_versions),
        {},
        operators,
        False,
        manifest.checkpoint_id,
    )


def _named(exc: ClinkError, ref: SourceRef) -> ClinkError:
    if isinstance(exc, ChecksumMismatchError):
        return exc
    text = str(exc)
    if ref.describe() in text or ref.spec in text:
        return exc
    try:
        return type(exc)(f"{ref.describe()}: {text}")
    except TypeError:
        return exc


def check_stored(ref: SourceRef, config: SourceConfig, report) -> None:
    """Manifest, then every data file (presence, size, sha256, each segment's crc32 and stream), then the merged table."""
    from client.savepoint_check import FAIL, INFO, PASS, check_key_layout
    from snapshot import read_snapshot
    from store.checkpoint import CheckpointReader
    from store.datafile import decode_segment, verify_file, verify_segment
    from store.manifest import job_prefix, metadata_key

    store = open_source_store(ref, config)
    try:
        store, job, checkpoint_id = _open(ref, store)
        manifest_key = metadata_key(job, checkpoint_id)
        if not store.exists(manifest_key):
            raise NotFoundError(f"{ref.describe()}: no _metadata at {store.uri}/{manifest_key}")
        reader = CheckpointReader(store, job)
        manifest = reader.manifest(checkpoint_id)
    except CorruptDataError as exc:
        report.add("manifest", FAIL, str(exc), "_metadata")
        return
    report.add(
        "manifest",
        PASS,
        f"checkpoint {manifest.checkpoint_id} of job {manifest.job!r} (parent {manifest.parent_id}), "
        f"{len(manifest.files)} file(s), {len(manifest.parts)} part(s)",
        "_metadata",
    )
    versions = StateVersionMap.unpack(manifest.state_versions)
    report.add("state versions", PASS, f"{len(versions)} stamp(s) in the manifest parse", "_metadata")
    for op, uid in manifest.operators:
        report.operators[int(op)] = uid or None
    files_ok = True
    newest_version = 0
    for entry in sorted(manifest.files, key=lambda f: f.path):
        report.files_checked += 1
        try:
            data = store.get(job_prefix(job) + entry.path)
        except NotFoundError:
            files_ok = False
            report.add("presence", FAIL, f"data file is missing ({entry.rows} rows, {entry.size} bytes per the manifest)", entry.path)
            continue
        try:
            verify_file(entry, data)
        except ChecksumMismatchError as exc:
            files_ok = False
            report.add("checksum", FAIL, f"{exc.expected} in the manifest, {exc.actual} on the store", entry.path)
            continue
        bad = False
        for seg in entry.segments:
            blob = data[seg.offset : seg.offset + seg.length]
            try:
                verify_segment(entry, seg, blob)
                snap = read_snapshot(blob)
                newest_version = max(newest_version, snap.format_version)
                decode_segment(entry, seg, blob)
            except ChecksumMismatchError as exc:
                report.add(
                    "checksum",
                    FAIL,
                    f"segment at offset {seg.offset}: {exc.expected} in the manifest, {exc.actual} on the store",
                    entry.path,
                )
                bad = True
            except UnsupportedFormatVersionError as exc:
                report.add("format version", FAIL, f"segment at offset {seg.offset}: {exc}", entry.path)
                bad = True
            except CorruptSnapshotError as exc:
                check = "state versions" if "state_versions" in str(exc) else "format"
                report.add(check, FAIL, f"segment at offset {seg.offset}: {exc}", entry.path)
                bad = True
            except CorruptDataError as exc:
                report.add("format", FAIL, str(exc), entry.path)
                bad = True
            if bad:
                break
        files_ok &= not bad
    if files_ok:
        report.add("checksum", PASS, f"{len(manifest.files)} file(s) present, sha256 and segment crc32 match the manifest")
        report.add(
            "format version", PASS, f"every segment declares version {max(newest_version, 1)} (this reader knows up to {FORMAT_VERSION})"
        )
        table = reader.read_manifest_table(manifest)
        report.rows = table.num_rows
        check_key_layout(table, report)
        if table.num_rows:
            for op in pc.unique(table.column("op_id")).to_pylist():
                report.operators.setdefault(int(op), None)
    else:
        report.add("key layout", INFO, "not checked: fix the files above first")
