"""Savepoints and checkpoints opened by location (a directory URI or its _metadata URI): one-line errors for what is not one."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from snapshot.errors import InvalidArgumentError, NotFoundError
from store.layout import JOBS, SAVEPOINT_MANIFEST, find_state_folder, job_prefix, metadata_key
from store.manifest import MANIFEST_FORMAT, MANIFEST_VERSION, PART_FORMAT, Manifest, manifest_extra_fields, parse_manifest
from store.objects import ObjectStore, StoreConfig, open_store
from store.views import SavepointView

# what an Arrow IPC file or stream starts with: a data file where a manifest should be
_ARROW_FILE_MAGIC = b"ARROW1"
_ARROW_STREAM_START = b"\xff\xff\xff\xff"


class NotAStateLocationError(InvalidArgumentError):
    """A location that holds no readable _metadata: none at all, a future version, a truncated one, a data file in its place."""


def directory_uri(location: str) -> str:
    """The directory a location names: its URI without a trailing '/_metadata' or '/'."""
    text = location.rstrip("/")
    if text.endswith("/" + SAVEPOINT_MANIFEST) or text == SAVEPOINT_MANIFEST:
        text = text[: -len(SAVEPOINT_MANIFEST)].rstrip("/")
    return text


def check_metadata_bytes(data: bytes, where: str) -> dict[str, Any]:
    """The parsed JSON of a _metadata, or NotAStateLocationError saying which of the ways it is not one."""
    if data[: len(_ARROW_FILE_MAGIC)] == _ARROW_FILE_MAGIC or data[:4] == _ARROW_STREAM_START:
        raise NotAStateLocationError(f"{where} is an Arrow data file, not a manifest: give the savepoint's directory or its _metadata")
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise NotAStateLocationError(
            f"{where} is truncated or not JSON ({len(data)} bytes): the manifest is damaged; use another copy of the savepoint"
        ) from None
    if not isinstance(doc, dict) or doc.get("format") not in (MANIFEST_FORMAT, PART_FORMAT):
        raise NotAStateLocationError(f"{where} is JSON but not a clink manifest (no format {MANIFEST_FORMAT!r})")
    version = doc.get("version")
    if isinstance(version, int) and not isinstance(version, bool) and version > MANIFEST_VERSION:
        raise NotAStateLocationError(
            f"{where} is manifest version {version}, newer than this clink reads (up to {MANIFEST_VERSION}): upgrade clink-remote-state"
        )
    if doc["format"] == PART_FORMAT:
        raise NotAStateLocationError(f"{where} is one subtask's part, not a complete checkpoint's _metadata")
    return doc


def read_metadata(directory: ObjectStore, key: str = SAVEPOINT_MANIFEST) -> tuple[Manifest, dict[str, Any]]:
    """The manifest at ``key`` of ``directory`` and its extra fields (savepoint, restored_from, provenance), checked."""
    where = f"{directory.uri.rstrip('/')}/{key}"
    try:
        data = directory.get(key)
    except NotFoundError:
        if key == SAVEPOINT_MANIFEST and not directory.holds(""):  # nothing there at all: a wrong or deleted location
            raise NotFoundError(f"no savepoint at {directory.uri}: nothing is there (is the location right?)") from None
        raise NotAStateLocationError(
            f"no {SAVEPOINT_MANIFEST} at {where}: not a savepoint or checkpoint directory (is the location right?)"
        ) from None
    check_metadata_bytes(data, where)
    return parse_manifest(data, where), manifest_extra_fields(data)


@dataclass(frozen=True)
class StateLocation:
    """A savepoint directory or a checkpoint folder, opened: ``store`` shows it as jobs/<job>/chk-<N>/ (read it as a checkpoint)."""

    uri: str  # the directory's absolute URI (without /_metadata)
    kind: str  # "savepoint" or "checkpoint"
    store: ObjectStore  # savepoints: a read-only view; checkpoints: the store root they live in
    directory: ObjectStore  # what holds _metadata and data/ (savepoints) or the store root (checkpoints)
    job: str
    checkpoint_id: int
    manifest: Manifest
    extra: dict[str, Any]

    @property
    def files_prefix(self) -> str:
        """Where the data files the manifest names lie, relative to ``directory``."""
        return "" if self.kind == "savepoint" else job_prefix(self.job)

    def describe(self) -> str:
        """'savepoint s3://b/sp (checkpoint 7 of job orders)' for messages."""
        return f"{self.kind} {self.uri} (checkpoint {self.checkpoint_id} of job {self.job})"


def open_directory(directory: ObjectStore, uri: str | None = None) -> StateLocation:
    """A savepoint directory already opened as a store rooted at it."""
    manifest, extra = read_metadata(directory)
    return _savepoint(directory, manifest, extra, uri)


def _savepoint(directory: ObjectStore, manifest: Manifest, extra: dict[str, Any], uri: str | None = None) -> StateLocation:
    view = SavepointView(directory, "", manifest.job, manifest.checkpoint_id)
    return StateLocation(uri or directory.uri, "savepoint", view, directory, manifest.job, manifest.checkpoint_id, manifest, extra)


def _drop_last_parts(uri: str, count: int) -> str:
    """``uri`` without its last ``count`` path parts, however many slashes separate them ('' when nothing is left)."""
    for _ in range(count):
        uri = uri.rstrip("/").rpartition("/")[0]
    kept = uri.rstrip("/")
    return uri if not kept or kept.endswith(":") else kept  # file:///, / and s3:// keep their slashes


def open_location(location: str, config: StoreConfig | None = None) -> StateLocation:
    """Open LOCATION: a savepoint directory anywhere (or its _metadata), or a checkpoint folder .../jobs/JOB/chk-N of a store.

    A directory named like a checkpoint folder whose _metadata is a savepoint's own (it carries the "savepoint" field, its
    files lie under it) opens as that savepoint: a checkpoint's _metadata never carries the field.
    """
    uri = directory_uri(location)
    if not uri:
        raise InvalidArgumentError("the location is empty: give a savepoint directory URI (file://... or s3://...) or its _metadata")
    _, sep, rest = uri.partition("://")
    parts = [p for p in (rest if sep else uri).split("/") if p]
    found = find_state_folder(parts)
    if found is not None and found.checkpoint_id is not None and found.job is not None:
        folder = f"{JOBS}{found.job}/chk-{found.checkpoint_id}"
        root = open_store(_drop_last_parts(uri, 3) or ".", config)  # the store the checkpoint's job lives in
        manifest, extra = read_metadata(root, metadata_key(found.job, found.checkpoint_id))
        if "savepoint" in extra:  # a savepoint written to a directory named like a checkpoint folder
            return _savepoint(open_store(uri, config), manifest, extra)
        full = f"{root.uri.rstrip('/')}/{folder}"  # absolute, whatever form it was given in
        return StateLocation(full, "checkpoint", root, root, found.job, found.checkpoint_id, manifest, extra)
    return open_directory(open_store(uri, config))


__all__ = [
    "NotAStateLocationError",
    "StateLocation",
    "check_metadata_bytes",
    "directory_uri",
    "open_directory",
    "open_location",
    "read_metadata",
]
