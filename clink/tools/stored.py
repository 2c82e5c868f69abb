"""Checkpoints and savepoints read straight from an object store (no pool): loading for the CLI and the file-by-file check."""

from __future__ import annotations

import pyarrow.compute as pc

from clink.tools.sources import Selection, SourceConfig, SourceRef, StateSource, apply_selection, open_source_store
from snapshot import ClinkError, CorruptDataError, NotFoundError, StateVersionMap, UnsupportedFormatVersionError
from snapshot.errors import ChecksumMismatchError, CorruptSnapshotError, prefixed
from snapshot.format import FORMAT_VERSION
from store.layout import require_store
from store.locations import open_directory
from store.objects import ObjectStore


def _open(ref: SourceRef, store: ObjectStore) -> tuple[ObjectStore, str, int]:
    """(store, job, checkpoint id) to read: the checkpoint itself, or a savepoint (its directory) through its view."""
    if ref.kind != "savepoint":
        assert ref.checkpoint_id is not None, ref  # a checkpoint path names its id (sources._layout)
        return store, ref.job, ref.checkpoint_id
    try:
        opened = open_directory(store)  # NotAStateLocationError (exit 2) for no _metadata, a future version, a damaged one
    except NotFoundError:
        if not ref.savepoint:
            raise
        raise NotFoundError(f"{ref.what()} not found (no _metadata at {store.uri}/_metadata)") from None
    return opened.store, opened.job, opened.checkpoint_id


def read_stored(ref: SourceRef, store, selection: Selection) -> StateSource:
    """A checkpoint's or savepoint's canonical table (selection pushed down to the segment reads), operators and state versions."""
    from store.checkpoint import CheckpointReader

    root = store
    try:
        store, job, checkpoint_id = _open(ref, store)
        reader = CheckpointReader(store, job)
        manifest = reader.manifest(checkpoint_id)
        table = reader.read_manifest_table(manifest, selection.key_groups, list(selection.op_ids) or None)
    except NotFoundError as exc:
        if ref.kind != "savepoint":  # a savepoint's store was checked when it was opened
            require_store(root)  # a mistyped prefix or folder is "no such store", not "checkpoint not found"
        raise _named(exc, ref) from exc
    except ClinkError as exc:
        raise _named(exc, ref) from exc
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
    """The error with the source named in front, unless it already names it (a message never says a thing twice)."""
    if isinstance(exc, ChecksumMismatchError):
        return exc
    text = str(exc)
    said = (ref.describe(), ref.spec, ref.what(), f"checkpoint {ref.checkpoint_id} of job {ref.job}")
    if any(s in text for s in said if s):
        return exc
    return prefixed(exc, ref.describe())


def check_stored(ref: SourceRef, config: SourceConfig, report) -> None:
    """Manifest, then every data file (presence, size, sha256, each segment's crc32 and stream), then the merged table."""
    from clink.tools.savepoint_check import FAIL, INFO, PASS, check_key_layout
    from snapshot import read_arrow_file, read_snapshot
    from store.checkpoint import CheckpointReader
    from store.datafile import ENCODING_FILE, ENCODING_STREAMS, decode_segment, verify_file, verify_segment, verify_segment_index
    from store.layout import job_file_key, metadata_key

    store = open_source_store(ref, config)
    root = store
    try:
        store, job, checkpoint_id = _open(ref, store)
        manifest_key = metadata_key(job, checkpoint_id)
        if not store.exists(manifest_key):
            raise NotFoundError(f"{ref.what()} not found (no _metadata at {store.uri}/{manifest_key})")
        reader = CheckpointReader(store, job)
        manifest = reader.manifest(checkpoint_id)
    except NotFoundError:
        if ref.kind != "savepoint":  # a savepoint's store was checked when it was opened
            require_store(root)  # a mistyped prefix or folder is "no such store", not "checkpoint not found"
        raise
    except CorruptDataError as exc:
        report.add("manifest", FAIL, str(exc), "_metadata")
        return
    report.add(
        "manifest",
        PASS,
        f"checkpoint {manifest.checkpoint_id} of job {manifest.job} (parent {manifest.parent_id}), "
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
            data = store.get(job_file_key(job, entry.path))
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
        if entry.encoding == ENCODING_FILE:  # one Arrow IPC file: its schema declares the format version once
            try:
                newest_version = max(newest_version, read_arrow_file(data).format_version)
            except UnsupportedFormatVersionError as exc:
                report.add("format version", FAIL, str(exc), entry.path)
                files_ok = False
                continue
            except CorruptSnapshotError as exc:
                report.add("format", FAIL, str(exc), entry.path)
                files_ok = False
                continue
        for seg in entry.segments:
            blob = data[seg.offset : seg.offset + seg.length]
            try:
                verify_segment(entry, seg, blob)
                if entry.encoding == ENCODING_STREAMS:  # each segment a stream with its own format version
                    newest_version = max(newest_version, read_snapshot(blob).format_version)
                decode_segment(entry, seg, blob)
                if seg.index is not None:  # the block index a point read trusts: top, partitions, every block
                    verify_segment_index(entry, seg, data)
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
        report.add("checksum", PASS, f"{len(manifest.files)} file(s) present, sha256, segment and block crc32 match the manifest")
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
