"""Every object key of a store root, built and parsed in one place (as SlateDB's paths.rs): jobs, checkpoints, parts, data files."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from snapshot import NUM_KEY_GROUPS
from snapshot.errors import NotFoundError

if TYPE_CHECKING:
    from store.objects import ObjectStore

JOBS = "jobs/"
SAVEPOINTS = "savepoints/"
SAVEPOINT_MANIFEST = "_metadata"
DATA_DIR = "data/"
DATA_SUFFIX = ".arrow"
PARTS_DIR = "parts/"
PINS_DIR = "pins/"
GC_MARKER = "gc/progress.json"
# written by a pool that serves a store holding nothing yet, so a new store reads as an empty store, not as no store
STORE_MARKER = "clink-store.json"
STORE_MARKER_FORMAT = "clink.store"
# a store root holds at least one of these; a prefix or folder holding none is no store (a typo, a bucket's root)
STORE_FOLDERS = (JOBS, SAVEPOINTS, "gc/")
JOB_GC_MARKER = "gc-progress.json"  # jobs/<job>/gc-progress.json: the marker of a GC run scoped to one job

# data files are written once under a fresh name, so repeating their put cannot overwrite anyone else's bytes
IMMUTABLE_KEY_PATTERN = rf"(^|/){re.escape(DATA_DIR)}[^/]+{re.escape(DATA_SUFFIX)}$"

_CHECKPOINT_DIR = re.compile(r"^chk-([1-9][0-9]*)$")
_PART_NAME = re.compile(r"^([0-9]{1,3})-([0-9]{1,3})(?:-e([1-9][0-9]*))?\.json$")


def job_prefix(job: str) -> str:
    """Store key of a job's folder (with trailing '/')."""
    return f"{JOBS}{job}/"


def writers_key(job: str) -> str:
    """Store key of a job's fencing epochs."""
    return f"{JOBS}{job}/writers"


def checkpoint_prefix(job: str, checkpoint_id: int) -> str:
    """Store key prefix of checkpoint N (with trailing '/')."""
    return f"{JOBS}{job}/chk-{checkpoint_id}/"


def checkpoints_prefix(job: str) -> str:
    """Listing prefix that holds every checkpoint folder of a job."""
    return f"{JOBS}{job}/chk-"


def metadata_key(job: str, checkpoint_id: int) -> str:
    """Store key of the complete manifest: its existence is the commit."""
    return f"{JOBS}{job}/chk-{checkpoint_id}/_metadata"


def part_name(kg_lo: int, kg_hi: int, epoch: int) -> str:
    """File name of one writer's part: its range and epoch, so a fenced writer's part never blocks its successor's."""
    return f"{kg_lo}-{kg_hi}-e{epoch}.json"


def part_key(job: str, checkpoint_id: int, kg_lo: int, kg_hi: int, epoch: int) -> str:
    """Store key of one subtask's contribution to checkpoint N."""
    return f"{parts_prefix(job, checkpoint_id)}{part_name(kg_lo, kg_hi, epoch)}"


def legacy_part_key(job: str, checkpoint_id: int, kg_lo: int, kg_hi: int) -> str:
    """Where a part was staged before part names carried the epoch (read, never written)."""
    return f"{parts_prefix(job, checkpoint_id)}{kg_lo}-{kg_hi}.json"


def parts_prefix(job: str, checkpoint_id: int) -> str:
    """Listing prefix of the parts of checkpoint N."""
    return f"{JOBS}{job}/chk-{checkpoint_id}/{PARTS_DIR}"


def pin_key(job: str, checkpoint_id: int, holder: str) -> str:
    """Store key of one holder's pin on checkpoint N."""
    return f"{pin_prefix(job)}{checkpoint_id}/{holder}.json"


def pin_prefix(job: str) -> str:
    """Listing prefix of every pin of a job."""
    return f"{JOBS}{job}/{PINS_DIR}"


def job_gc_marker_key(job: str) -> str:
    """Store key of the progress marker of a GC run scoped to one job."""
    return f"{JOBS}{job}/{JOB_GC_MARKER}"


def new_data_path() -> str:
    """A fresh relative path for a data file (relative to its job or savepoint folder)."""
    return f"{DATA_DIR}{uuid.uuid4().hex}{DATA_SUFFIX}"


def is_data_path(path: str) -> bool:
    """Whether a path a manifest names lies in the data folder, where every data file is written."""
    return path.startswith(DATA_DIR)


def job_file_key(job: str, path: str) -> str:
    """Store key of a file a job's manifests name by its path relative to the job folder (data/...)."""
    return f"{job_prefix(job)}{path}"


def savepoint_prefix(name: str) -> str:
    """Store prefix of a savepoint folder (with trailing '/'); NAME or JOB/NAME (the pool's RPC writes under its job)."""
    return f"{SAVEPOINTS}{name}/"


def savepoint_manifest_key(name: str) -> str:
    """Store key of a savepoint's manifest: written last, its existence makes the savepoint."""
    return f"{savepoint_prefix(name)}{SAVEPOINT_MANIFEST}"


def savepoint_file_key(name: str, path: str) -> str:
    """Store key of a file a savepoint's manifest names by its path relative to the savepoint folder (data/...)."""
    return f"{savepoint_prefix(name)}{path}"


def job_savepoint_name(job: str, name: str) -> str:
    """The name JOB/NAME of a savepoint written under a job's own namespace."""
    return f"{job}/{name}"


def split_job_savepoint_name(name: str) -> tuple[str, str] | None:
    """(JOB, NAME) of a savepoint name written under a job (one '/'); None for any other name."""
    if name.count("/") != 1:
        return None
    job, own = name.split("/")
    return job, own


# what a savepoint folder holds directly: a nested savepoint (JOB/NAME) may not take these names
SAVEPOINT_ENTRIES = frozenset({DATA_DIR.rstrip("/"), SAVEPOINT_MANIFEST})


def savepoint_of(key: str) -> str | None:
    """The savepoint (NAME or JOB/NAME) an object under savepoints/ belongs to; None for a key outside any savepoint folder."""
    parts = key.split("/")
    if parts[0] + "/" != SAVEPOINTS or len(parts) < 3:
        return None
    if parts[2] in SAVEPOINT_ENTRIES or len(parts) == 3:
        return parts[1]
    return f"{parts[1]}/{parts[2]}"


def savepoint_folders(keys: Iterable[str]) -> tuple[list[str], list[str]]:
    """Of keys under savepoints/: the folders holding a _metadata (at any depth: a --to savepoint may lie deeper), and the
    folders (NAME or JOB/NAME) of other objects under none of them (savepoints never published); names relative to savepoints/.
    """
    keys = list(keys)
    suffix = "/" + SAVEPOINT_MANIFEST
    published = sorted({k[len(SAVEPOINTS) : -len(suffix)] for k in keys if k.startswith(SAVEPOINTS) and k.endswith(suffix)} - {""})
    published_set = set(published)
    unpublished = {name for key in keys if (name := savepoint_of(key)) is not None and savepoint_holding(key, published_set) is None}
    return published, sorted(unpublished - published_set)


def savepoint_holding(key: str, folders: set[str]) -> str | None:
    """The innermost of the published savepoint ``folders`` (relative to savepoints/) that ``key`` lies in, if any."""
    parts = key[len(SAVEPOINTS) :].split("/")[:-1] if key.startswith(SAVEPOINTS) else []
    return next((name for i in range(len(parts), 0, -1) if (name := "/".join(parts[:i])) in folders), None)


def parse_checkpoint_dir(name: str) -> int | None:
    """N of a checkpoint folder name chk-N, None for any other name."""
    m = _CHECKPOINT_DIR.match(name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class StateFolder:
    """A checkpoint or savepoint folder found at the end of a path; the first ``root_parts`` parts are the store's root."""

    root_parts: int
    job: str | None = None
    checkpoint_id: int | None = None
    savepoint: str | None = None


def find_state_folder(parts: Sequence[str]) -> StateFolder | None:
    """Find .../jobs/JOB/chk-N or .../savepoints/[JOB/]NAME (with or without a trailing _metadata) in a path's parts."""
    parts = list(parts)
    if parts and parts[-1] == SAVEPOINT_MANIFEST:
        parts = parts[:-1]
    if len(parts) >= 3 and parts[-3] + "/" == JOBS:
        checkpoint_id = parse_checkpoint_dir(parts[-1])
        if checkpoint_id is not None:
            return StateFolder(len(parts) - 3, job=parts[-2], checkpoint_id=checkpoint_id)
    if len(parts) >= 2 and parts[-2] + "/" == SAVEPOINTS and parts[-1]:
        return StateFolder(len(parts) - 2, savepoint=parts[-1])
    if len(parts) >= 3 and parts[-3] + "/" == SAVEPOINTS and parts[-1] not in SAVEPOINT_ENTRIES:
        return StateFolder(len(parts) - 3, savepoint=job_savepoint_name(parts[-2], parts[-1]))
    return None


@dataclass(frozen=True)
class JobKey:
    """What one key under jobs/<job>/ is: kind is metadata, part, writers, data, pin, gc-marker or other."""

    job: str
    kind: str
    rest: str  # the key below the job folder
    checkpoint_id: int = 0
    kg_lo: int = 0
    kg_hi: int = 0
    epoch: int | None = None  # a part's epoch from its name (None: a part named before names carried it)
    pin_checkpoint: int = 0


def parse_part_name(name: str) -> tuple[int, int, int | None] | None:
    """(kg_lo, kg_hi, epoch or None) of a part file name, None when it is not one."""
    m = _PART_NAME.match(name)
    if not m:
        return None
    lo, hi = int(m.group(1)), int(m.group(2))
    if not lo <= hi < NUM_KEY_GROUPS:
        return None
    return lo, hi, int(m.group(3)) if m.group(3) else None


def parse_job_key(key: str) -> JobKey | None:
    """Classify a key under jobs/; None for keys outside any job folder."""
    if not key.startswith(JOBS):
        return None
    job, sep, rest = key[len(JOBS) :].partition("/")
    if not job or not sep or not rest:
        return None
    head, _, tail = rest.partition("/")
    if rest == "writers":
        return JobKey(job, "writers", rest)
    if rest == JOB_GC_MARKER:
        return JobKey(job, "gc-marker", rest)
    m = _CHECKPOINT_DIR.match(head)
    if m:
        cid = int(m.group(1))
        if tail == "_metadata":
            return JobKey(job, "metadata", rest, cid)
        if tail.startswith(PARTS_DIR) and "/" not in tail[len(PARTS_DIR) :]:
            parsed = parse_part_name(tail[len(PARTS_DIR) :])
            if parsed:
                return JobKey(job, "part", rest, cid, parsed[0], parsed[1], parsed[2])
        return JobKey(job, "other", rest, cid)
    if head + "/" == DATA_DIR and tail and "/" not in tail:
        return JobKey(job, "data", rest)
    if head + "/" == PINS_DIR and tail.endswith(".json"):
        cid_text = tail.partition("/")[0]
        return JobKey(job, "pin", rest, pin_checkpoint=int(cid_text) if cid_text.isdigit() else 0)
    return JobKey(job, "other", rest)


def staged_part_label(key: str) -> str | None:
    """The file name, less .json, of an object staged in a checkpoint's parts/ folder (e.g. 0-63-e7); None for any other key."""
    parsed = parse_job_key(key)
    if parsed is None or not parsed.checkpoint_id or not parsed.rest.partition("/")[2].startswith(PARTS_DIR):
        return None
    return key.rsplit("/", 1)[-1].removesuffix(".json")


def is_gc_marker(key: str) -> bool:
    """Whether a key is the progress marker of a GC run, store-wide or of one job."""
    if key == GC_MARKER:
        return True
    parsed = parse_job_key(key)
    return parsed is not None and parsed.kind == "gc-marker"


def holds_a_store(store: ObjectStore) -> bool:
    """Whether ``store`` holds a store: jobs/, savepoints/, gc/ or the marker a serving pool writes into a new one."""
    return any(store.holds(folder) for folder in STORE_FOLDERS) or store.exists(STORE_MARKER)


def require_store(store: ObjectStore) -> None:
    """NotFoundError "no such store: ..." when ``store`` holds no store (a mistyped prefix or folder), naming what is there."""
    if holds_a_store(store):
        return
    if store.holds(""):
        what = f"it holds objects, but no {JOBS}, {SAVEPOINTS} or {STORE_MARKER}; is the path or prefix right?"
    else:
        what = "nothing under it; is the path or prefix right? `clink-pool serve --store` makes a new one"
    raise NotFoundError(f"no such store: {store.uri} ({what})")
