"""Savepoints: a checkpoint folded into self-contained base files (one per part) and a _metadata, in any directory of any store."""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from pool.compaction import fold_segment_target
from pool.lifecycle_context import LifecycleContext
from snapshot import NUM_KEY_GROUPS, StateVersionMap, leading_bytes
from snapshot.errors import ConflictError, InvalidArgumentError, UnavailableError
from store.anatomy import WRITER_VERSION
from store.datafile import KIND_BASE, DataFile, encode_datafile
from store.layout import (
    GC_MARKER,
    JOBS,
    SAVEPOINT_MANIFEST,
    SAVEPOINTS,
    job_savepoint_name,
    new_data_path,
    savepoint_folders,
    savepoint_prefix,
)
from store.manifest import MANIFEST_FORMAT, Manifest, Part, manifest_json
from store.objects import ObjectStore
from store.views import PrefixStore


@dataclass(frozen=True)
class SavepointInfo:
    """A written savepoint: where it lives and what it holds."""

    name: str
    store_uri: str
    job: str
    checkpoint_id: int
    files: int
    bytes: int
    rows: int
    location: str = ""  # the savepoint's directory URI (what every command that takes a savepoint accepts)
    parallelism: int = 1


def split_by_parts(table: pa.Table, parts: list[tuple[int, int]]) -> list[pa.Table]:
    """A canonical table in layout order cut into the keyed rows of each range (sorted, tiling 0..127); operator state goes with the first."""
    lead = leading_bytes(table.column("key_bytes")) if table.num_rows else np.zeros(0, np.uint8)
    keyed_end = int(np.searchsorted(lead, NUM_KEY_GROUPS, side="left"))
    out = []
    for i, (lo, hi) in enumerate(parts):
        a = int(np.searchsorted(lead[:keyed_end], lo, side="left"))
        b = int(np.searchsorted(lead[:keyed_end], hi, side="right"))
        piece = table.slice(a, b - a)
        if i == 0 and keyed_end < table.num_rows:  # operator state: one copy, in the first subtask's file
            piece = pa.concat_tables([piece, table.slice(keyed_end)])
        out.append(piece)
    return out


def write_folded(
    target: ObjectStore,
    table: pa.Table,
    ranges: list[tuple[int, int, int]],
    as_of: int,
    state_versions: StateVersionMap | None = None,
    on_put: Callable[[str], None] | None = None,
    on_part: Callable[[Part, DataFile | None], None] | None = None,
) -> tuple[list[Part], list[DataFile], int]:
    """One folded base file per range (lo, hi, epoch) under data/ of ``target``, about one segment per key group; (parts, files, bytes).

    Each subtask's key groups stay in a file of their own, so a damaged file costs only its ranges and a rescaled
    reader fetches only the segments of its key groups. ``on_put`` gets each path right before its put (what to undo on
    failure), ``on_part`` each part as soon as its file landed (None: an empty part), so a caller can name it at once.
    """
    parts: list[Part] = []
    files: list[DataFile] = []
    written = 0
    for (lo, hi, epoch), piece in zip(ranges, split_by_parts(table, [(lo, hi) for lo, hi, _ in ranges]), strict=True):
        if not piece.num_rows:
            parts.append(Part(lo, hi, epoch, 0, ()))
            if on_part is not None:
                on_part(parts[-1], None)
            continue
        encoded = encode_datafile(
            piece,
            changelog=False,
            state_versions=state_versions,
            target_segment_bytes=fold_segment_target(piece, hi - lo + 1),
            count_states=True,
        )
        path = new_data_path()
        if on_put is not None:
            on_put(path)
        target.put_if_absent(path, encoded.data)
        written += encoded.size
        files.append(encoded.entry(path, KIND_BASE, lo, hi, as_of))
        parts.append(Part(lo, hi, epoch, 0, ((path,),)))
        if on_part is not None:
            on_part(parts[-1], files[-1])
    return parts, files, written


def _relative_to(root_uri: str, uri: str) -> str | None:
    """The path of ``uri`` inside the store at ``root_uri`` ("" for the root itself); None when it lies elsewhere."""

    def norm(u: str) -> str:
        scheme, sep, rest = u.partition("://")
        return scheme + sep + re.sub(r"/+", "/", rest).rstrip("/")

    root, inner = norm(root_uri), norm(uri)
    if inner == root:
        return ""
    return inner[len(root) + 1 :] if inner.startswith(root + "/") else None


def check_savepoint_directory(store: ObjectStore, to: ObjectStore) -> None:
    """Refuse a --to directory in the store's own layout: the pool's jobs/ and gc/ (GC would take its files for garbage,
    a chk-N folder would pass for a checkpoint), the store root and savepoints/ itself (every other savepoint lies there).
    """
    rel = _relative_to(store.uri, to.uri)
    if rel is None:
        return
    top = rel.split("/", 1)[0]
    if rel in ("", SAVEPOINTS.rstrip("/")) or top in (JOBS.rstrip("/"), GC_MARKER.split("/", 1)[0]):
        where = "the store's root" if not rel else f"{rel}/ of the store"
        raise InvalidArgumentError(
            f"cannot write a savepoint to {to.uri}: that is {where} {store.uri}, which the pool manages (its jobs' files, "
            "checkpoints and GC); choose a directory of its own, e.g. savepoints/<job>/<name>/ or another prefix"
        )


class Savepoints:
    """Writes and lists the savepoints of one store."""

    def __init__(self, context: LifecycleContext) -> None:
        self.context = context

    def savepoint(
        self,
        job: str,
        checkpoint_id: int,
        name: str | None = None,
        target_store: ObjectStore | None = None,
        under_job: bool = False,
        to: ObjectStore | None = None,
    ) -> SavepointInfo:
        """Write a savepoint of a checkpoint (0: the latest): _metadata plus one folded base file per part, relative paths only.

        Where: ``to`` (a store rooted at any directory: the savepoint is its _metadata and data/); else savepoints/NAME/
        of ``target_store`` or this store (savepoints/JOB/NAME/ ``under_job``: the job's own namespace, what a job's
        token may write through the pool's RPC); with no name, savepoints/JOB/savepoint-<chk>-<6 hex>/ of this store.
        The parts (and so the parallelism and each subtask's key groups) are the checkpoint's; each is folded into one
        base with about one segment per key group, so the savepoint is self-contained and any range reads only its bytes.
        """
        job = self.context.job(job)
        if to is not None:
            directory, label = to, name or to.uri.rstrip("/").rsplit("/", 1)[-1]
            taken = f"a savepoint exists already at {directory.uri}; choose another location (savepoints are never replaced)"
        if to is None and name is not None:  # names are checked before anything is read
            own = self.context.name(name)
            label = self.context.savepoint_name(job_savepoint_name(job, own) if under_job else own)
        reader, manifest, _ = self.context.open_checkpoint(job, checkpoint_id)
        if to is None:
            if name is None:
                label = job_savepoint_name(job, f"savepoint-{manifest.checkpoint_id}-{secrets.token_hex(3)}")
            directory = PrefixStore(target_store or self.context.store, savepoint_prefix(label))
            taken = f"savepoint {label!r} already exists in {(target_store or self.context.store).uri}; choose another name (savepoints are never replaced)"
        check_savepoint_directory(self.context.store, directory)  # --to or --target-store may be this store's own layout
        if directory.exists(SAVEPOINT_MANIFEST):
            raise ConflictError(taken)
        table = reader.read_manifest_table(manifest)
        written_at = self.context.clock()
        versions = StateVersionMap.unpack(manifest.state_versions)
        parts, files, written = write_folded(
            directory, table, [(p.kg_lo, p.kg_hi, p.epoch) for p in manifest.parts], manifest.checkpoint_id, versions
        )
        if (
            self.context.clock() - written_at > self.context.config.max_write_s
        ):  # GC's minimum age protects the unpublished base only so long
            raise UnavailableError(
                f"savepoint {label!r} took longer than {self.context.config.max_write_s:g} s between its files and its _metadata; "
                "nothing was published (the files are left to GC), run it again"
            )
        sp = Manifest(
            MANIFEST_FORMAT,
            manifest.job,
            manifest.checkpoint_id,
            0,
            manifest.created_at_ms,
            manifest.operators,
            manifest.state_versions,
            tuple(parts),
            tuple(files),
        )
        extra = {
            "savepoint": {
                "name": label,
                # information only, never used to open a file: a copied savepoint opens wherever it lies
                "written_to": directory.uri,
                "source_store": self.context.store.uri,
                "source_job": manifest.job,
                "source_checkpoint_id": manifest.checkpoint_id,
                "created_at_ms": self.context.now_ms(),
                "writer": WRITER_VERSION,
            }
        }
        try:
            directory.put_if_absent(SAVEPOINT_MANIFEST, manifest_json(sp, extra))  # written last: the savepoint exists from here on
        except ConflictError:
            raise ConflictError(f"a savepoint was created concurrently at {directory.uri}; this copy was not published") from None
        return SavepointInfo(
            label, directory.uri, manifest.job, manifest.checkpoint_id, len(files), written, table.num_rows, directory.uri, len(parts)
        )

    def list_savepoints(self, store: ObjectStore | None = None) -> list[str]:
        """Names (relative to savepoints/: NAME, JOB/NAME, or deeper for a --to there) of every savepoint folder, complete or not."""
        published, unpublished = savepoint_folders(info.key for info in (store or self.context.store).list(SAVEPOINTS))
        return sorted(published + unpublished)
