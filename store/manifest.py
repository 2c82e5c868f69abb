"""Checkpoint manifests and parts: JSON with relative paths only, parsed strictly (CorruptDataError naming the file)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from snapshot import NUM_KEY_GROUPS, StateVersionMap
from snapshot.errors import CorruptDataError, CorruptSnapshotError, InvalidArgumentError
from store.anatomy import anatomy
from store.datafile import ENCODING_FILE, ENCODING_STREAMS, KIND_BASE, KIND_DELTA, DataFile, OperatorStats, Segment, StateStats
from store.layout import DATA_DIR, checkpoint_prefix, is_data_path, job_prefix, metadata_key, part_key, writers_key
from store.objects import validate_key

__all__ = [
    "MANIFEST_FORMAT",
    "MANIFEST_VERSION",
    "PART_FORMAT",
    "Manifest",
    "Part",
    "checkpoint_prefix",
    "job_prefix",
    "manifest_extra_fields",
    "manifest_json",
    "metadata_key",
    "parse_manifest",
    "part_key",
    "ordered_file_paths",
    "ordered_layers",
    "tiles",
    "writers_key",
]

MANIFEST_FORMAT = "clink.checkpoint-manifest"
PART_FORMAT = "clink.checkpoint-part"
# 2: data files may be Arrow IPC files ("encoding"); parts are named by range and epoch.
# 3: a segment may be several blocks with a block index in the file's footer ("index"). Versions 1 and 2 still read.
# 4: files count their rows and bytes per operator and state slot ("operators"), and a complete manifest carries its
#    anatomy (operators, parallelism, subtasks, provenance) for tools that read _metadata alone.
MANIFEST_VERSION = 4
_READABLE_VERSIONS = (1, 2, 3, 4)
_U64 = (1 << 64) - 1


@dataclass(frozen=True)
class Part:
    """One committed key-group range of a checkpoint: its writer's epoch and its layers (file paths, oldest first)."""

    kg_lo: int
    kg_hi: int
    epoch: int
    parent_id: int
    layers: tuple[tuple[str, ...], ...]

    def overlaps(self, lo: int, hi: int) -> bool:
        """Whether this part's range meets lo..hi."""
        return self.kg_lo <= hi and lo <= self.kg_hi


@dataclass(frozen=True)
class Manifest:
    """A checkpoint manifest (format MANIFEST_FORMAT, complete) or one part file (PART_FORMAT, a single part)."""

    format: str
    job: str
    checkpoint_id: int
    parent_id: int
    created_at_ms: int
    operators: tuple[tuple[int, str], ...]
    state_versions: str
    parts: tuple[Part, ...]
    files: tuple[DataFile, ...]
    # files a replaced version of this _metadata used that this one does not: still referenced (for GC) while the
    # checkpoint exists, so a commit that read the earlier version never names a deleted file
    retired: tuple[str, ...] = ()
    _by_path: dict[str, DataFile] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_path", {f.path: f for f in self.files})

    @cached_property
    def identity(self) -> str:
        """A digest of the manifest's content: equal for equal manifests, different whenever a version differs."""
        return hashlib.sha256(self.to_json()).hexdigest()[:32]

    @cached_property
    def stored_bytes_by_key_group(self) -> tuple[tuple[int, ...], int]:
        """Stored bytes of keyed segments per key group (a segment over several groups split evenly) and of operator state.

        Computed once per parsed manifest (listings ask for it of every checkpoint), with difference arrays, not per group.
        """
        share = np.zeros(NUM_KEY_GROUPS + 1, dtype=np.int64)
        extra = np.zeros(NUM_KEY_GROUPS + 1, dtype=np.int64)
        operator_bytes = 0
        for f in self.files:
            for seg in f.segments:
                if seg.operator:
                    operator_bytes += seg.length
                    continue
                each, rest = divmod(seg.length, seg.kg_hi - seg.kg_lo + 1)
                share[seg.kg_lo] += each
                share[seg.kg_hi + 1] -= each
                extra[seg.kg_lo] += 1  # the remainder: one more byte in each of the first ``rest`` groups
                extra[seg.kg_lo + rest] -= 1
        per_group = np.cumsum(share)[:NUM_KEY_GROUPS] + np.cumsum(extra)[:NUM_KEY_GROUPS]
        return tuple(int(b) for b in per_group), operator_bytes

    @property
    def max_epoch(self) -> int:
        """The newest epoch among the parts (which attempt completed the checkpoint)."""
        return max((p.epoch for p in self.parts), default=0)

    def part_for(self, kg_lo: int, kg_hi: int, epoch: int) -> Part | None:
        """The part of exactly this range and epoch, if the manifest has it."""
        return next((p for p in self.parts if (p.kg_lo, p.kg_hi, p.epoch) == (kg_lo, kg_hi, epoch)), None)

    @property
    def referenced_paths(self) -> set[str]:
        """Every data file path this manifest keeps alive: the files it uses and the ones it retired."""
        return {f.path for f in self.files} | set(self.retired)

    @property
    def complete(self) -> bool:
        """True for a _metadata manifest."""
        return self.format == MANIFEST_FORMAT

    def file(self, path: str) -> DataFile:
        """The entry of a referenced data file."""
        return self._by_path[path]

    @property
    def total_bytes(self) -> int:
        """Bytes of every referenced data file."""
        return sum(f.size for f in self.files)

    @property
    def total_rows(self) -> int:
        """Rows stored in every referenced data file (layers overlap, so not the live row count)."""
        return sum(f.rows for f in self.files)

    def to_json(self) -> bytes:
        """Deterministic JSON (sorted keys): equal manifests are equal bytes."""
        return json.dumps(manifest_document(self), sort_keys=True, separators=(",", ":")).encode()


def _segment_dict(s: Segment) -> dict[str, Any]:
    lo_hi: dict[str, Any] = {"kg_lo": "op", "kg_hi": "op"} if s.operator else {"kg_lo": s.kg_lo, "kg_hi": s.kg_hi}
    index: dict[str, Any] = {} if s.index is None else {"index": list(s.index)}
    return {**lo_hi, **index, "offset": s.offset, "length": s.length, "rows": s.rows, "crc32": s.crc32}


def _operator_stats_dict(o: OperatorStats) -> dict[str, Any]:
    states: dict[str, Any] = {"states": [[s.slot, s.kind, s.rows, s.bytes] for s in o.states]} if o.states else {}
    return {"op_id": o.op_id, "rows": o.rows, "bytes": o.bytes, **states}


def _file_dict(f: DataFile) -> dict[str, Any]:
    as_of: dict[str, Any] = {} if f.as_of is None else {"as_of": f.as_of}
    encoding: dict[str, Any] = {} if f.encoding == ENCODING_STREAMS else {"encoding": f.encoding}
    operators: dict[str, Any] = {} if f.operators is None else {"operators": [_operator_stats_dict(o) for o in f.operators]}
    return {
        **as_of,
        **encoding,
        **operators,
        "path": f.path,
        "kind": f.kind,
        "kg_lo": f.kg_lo,
        "kg_hi": f.kg_hi,
        "rows": f.rows,
        "size": f.size,
        "sha256": f.sha256,
        "segments": [_segment_dict(s) for s in f.segments],
    }


def manifest_document(m: Manifest) -> dict[str, Any]:
    """The manifest as the JSON document ``to_json`` writes (what readers of _metadata, and commit digests, see)."""
    retired: dict[str, Any] = {"retired": sorted(m.retired)} if m.retired else {}
    # information for tools that read _metadata alone; derived from the rest, never read back
    anatomy_field: dict[str, Any] = {"anatomy": anatomy(m)} if m.format == MANIFEST_FORMAT else {}
    return {
        **retired,
        **anatomy_field,
        "format": m.format,
        "version": MANIFEST_VERSION,
        "job": m.job,
        "checkpoint_id": m.checkpoint_id,
        "parent_id": m.parent_id,
        "created_at_ms": m.created_at_ms,
        "operators": [{"op_id": o, "uid": u} for o, u in m.operators],
        "state_versions": m.state_versions,
        "parts": [
            {"kg_lo": p.kg_lo, "kg_hi": p.kg_hi, "epoch": p.epoch, "parent_id": p.parent_id, "layers": [list(layer) for layer in p.layers]}
            for p in m.parts
        ],
        "files": [_file_dict(f) for f in sorted(m.files, key=lambda f: f.path)],
    }


class _Parser:
    """Strict field access; every failure is a CorruptDataError naming the manifest and the field."""

    def __init__(self, name: str) -> None:
        self.name = name

    def fail(self, what: str) -> CorruptDataError:
        return CorruptDataError(f"manifest {self.name} is malformed: {what}")

    def obj(self, value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(f"{where} must be an object")
        return value

    def get(self, d: dict[str, Any], key: str, where: str) -> Any:
        if key not in d:
            raise self.fail(f"{where}.{key} is missing")
        return d[key]

    def int_(self, d: dict[str, Any], key: str, where: str, lo: int = 0, hi: int = _U64) -> int:
        v = self.get(d, key, where)
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise self.fail(f"{where}.{key} = {v!r} must be an integer in {lo}..{hi}")
        return v

    def str_(self, d: dict[str, Any], key: str, where: str) -> str:
        v = self.get(d, key, where)
        if not isinstance(v, str):
            raise self.fail(f"{where}.{key} must be a string")
        return v

    def list_(self, d: dict[str, Any], key: str, where: str) -> list[Any]:
        v = self.get(d, key, where)
        if not isinstance(v, list):
            raise self.fail(f"{where}.{key} must be a list")
        return v

    def path(self, value: Any, where: str) -> str:
        if not isinstance(value, str):
            raise self.fail(f"{where} must be a string path")
        try:
            validate_key(value)
        except InvalidArgumentError:
            raise self.fail(f"{where} = {value!r} is not a safe relative path") from None
        if not is_data_path(value):
            raise self.fail(f"{where} = {value!r} must lie under {DATA_DIR}")
        return value


def _parse_segment(p: _Parser, raw: Any, where: str, size: int) -> Segment:
    d = p.obj(raw, where)
    lo_raw, hi_raw = p.get(d, "kg_lo", where), p.get(d, "kg_hi", where)
    operator = lo_raw == "op"
    if operator != (hi_raw == "op"):
        raise p.fail(f"{where}: kg_lo and kg_hi must both be 'op' or both be key groups")
    lo = hi = 0
    if not operator:
        lo = p.int_(d, "kg_lo", where, 0, NUM_KEY_GROUPS - 1)
        hi = p.int_(d, "kg_hi", where, lo, NUM_KEY_GROUPS - 1)
    offset = p.int_(d, "offset", where)
    length = p.int_(d, "length", where, 1)
    if offset + length > size:
        raise p.fail(f"{where} ends at {offset + length}, past the file size {size}")
    index = None
    if "index" in d:  # where the segment's block index lies in the file (manifest version 3)
        raw_index = p.list_(d, "index", where)
        if len(raw_index) != 4 or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in raw_index):
            raise p.fail(f"{where}.index must be [offset, top length, crc32, total length] (non-negative integers)")
        i_off, i_len, i_crc, i_total = raw_index
        if i_len < 1 or i_total < i_len or i_off + i_total > size or i_crc > 0xFFFFFFFF:
            raise p.fail(f"{where}.index = {raw_index} does not lie inside the file of {size} bytes")
        index = (i_off, i_len, i_crc, i_total)
    return Segment(
        offset,
        length,
        p.int_(d, "rows", where),
        p.int_(d, "crc32", where, 0, 0xFFFFFFFF),
        lo,
        hi if not operator else NUM_KEY_GROUPS - 1,
        operator,
        index,
    )


def _parse_file(p: _Parser, raw: Any, where: str) -> DataFile:
    d = p.obj(raw, where)
    path = p.path(p.get(d, "path", where), f"{where}.path")
    kind = p.str_(d, "kind", where)
    if kind not in (KIND_BASE, KIND_DELTA):
        raise p.fail(f"{where}.kind = {kind!r} must be 'base' or 'delta'")
    lo = p.int_(d, "kg_lo", where, 0, NUM_KEY_GROUPS - 1)
    hi = p.int_(d, "kg_hi", where, lo, NUM_KEY_GROUPS - 1)
    size = p.int_(d, "size", where)
    sha = p.str_(d, "sha256", where)
    if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        raise p.fail(f"{where}.sha256 must be 64 lowercase hex digits")
    segments = tuple(_parse_segment(p, s, f"{where}.segments[{i}]", size) for i, s in enumerate(p.list_(d, "segments", where)))
    rows = p.int_(d, "rows", where)
    if sum(s.rows for s in segments) != rows:
        raise p.fail(f"{where}: segment rows add up to {sum(s.rows for s in segments)}, file says {rows}")
    as_of = p.int_(d, "as_of", where, -(1 << 63), (1 << 63) - 1) if "as_of" in d else None  # absent in manifests written before it
    encoding = p.str_(d, "encoding", where) if "encoding" in d else ENCODING_STREAMS
    if encoding not in (ENCODING_FILE, ENCODING_STREAMS):
        raise p.fail(f"{where}.encoding = {encoding!r} must be {ENCODING_FILE!r} or {ENCODING_STREAMS!r}")
    if encoding != ENCODING_FILE and any(s.index is not None for s in segments):
        raise p.fail(f"{where}: only {ENCODING_FILE!r} files carry block indexes")
    operators = _parse_operator_stats(p, d, where, rows) if "operators" in d else None  # absent before version 4
    return DataFile(path, kind, lo, hi, rows, size, sha, segments, as_of, encoding, operators)


def _parse_operator_stats(p: _Parser, d: dict[str, Any], where: str, rows: int) -> tuple[OperatorStats, ...]:
    out = []
    for i, raw in enumerate(p.list_(d, "operators", where)):
        at = f"{where}.operators[{i}]"
        od = p.obj(raw, at)
        states = []
        for j, s in enumerate(p.list_(od, "states", at) if "states" in od else []):
            ok = isinstance(s, list) and len(s) == 4 and isinstance(s[0], str) and s[1] in ("keyed", "operator", "raw")
            if not ok or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in s[2:]):
                raise p.fail(f"{at}.states[{j}] must be [slot, 'keyed'|'operator'|'raw', rows, bytes]")
            states.append(StateStats(s[0], s[1], s[2], s[3]))
        out.append(OperatorStats(p.int_(od, "op_id", at), p.int_(od, "rows", at), p.int_(od, "bytes", at), tuple(states)))
    if sum(o.rows for o in out) != rows:
        raise p.fail(f"{where}: operator rows add up to {sum(o.rows for o in out)}, file says {rows}")
    return tuple(out)


def parse_manifest(data: bytes, name: str) -> Manifest:
    """Parse and check a manifest or part; ``name`` (its store key) appears in every error."""
    p = _Parser(name)
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise p.fail(f"not JSON ({exc})") from exc
    d = p.obj(raw, "top level")
    fmt = p.str_(d, "format", "top")
    if fmt not in (MANIFEST_FORMAT, PART_FORMAT):
        raise p.fail(f"format {fmt!r} is not {MANIFEST_FORMAT!r} or {PART_FORMAT!r}")
    version = p.int_(d, "version", "top")
    if version not in _READABLE_VERSIONS:
        raise p.fail(f"version {version} is not supported (this reader knows up to {MANIFEST_VERSION})")
    job = p.str_(d, "job", "top")
    checkpoint_id = p.int_(d, "checkpoint_id", "top", 1)
    parent_id = p.int_(d, "parent_id", "top", 0, checkpoint_id - 1)
    created = p.int_(d, "created_at_ms", "top")
    operators = []
    for i, o in enumerate(p.list_(d, "operators", "top")):
        od = p.obj(o, f"operators[{i}]")
        operators.append((p.int_(od, "op_id", f"operators[{i}]"), p.str_(od, "uid", f"operators[{i}]")))
    state_versions = p.str_(d, "state_versions", "top")
    try:
        StateVersionMap.unpack(state_versions)
    except (CorruptSnapshotError, InvalidArgumentError) as exc:
        raise p.fail(f"state_versions: {exc}") from exc
    files = tuple(_parse_file(p, f, f"files[{i}]") for i, f in enumerate(p.list_(d, "files", "top")))
    known = {f.path for f in files}
    if len(known) != len(files):
        raise p.fail("files lists a path twice")
    parts = []
    for i, raw_part in enumerate(p.list_(d, "parts", "top")):
        where = f"parts[{i}]"
        pd = p.obj(raw_part, where)
        lo = p.int_(pd, "kg_lo", where, 0, NUM_KEY_GROUPS - 1)
        hi = p.int_(pd, "kg_hi", where, lo, NUM_KEY_GROUPS - 1)
        layers = []
        for j, layer in enumerate(p.list_(pd, "layers", where)):
            if not isinstance(layer, list):
                raise p.fail(f"{where}.layers[{j}] must be a list of paths")
            paths = tuple(p.path(x, f"{where}.layers[{j}]") for x in layer)
            missing = [x for x in paths if x not in known]
            if missing:
                raise p.fail(f"{where}.layers[{j}] names {missing[0]}, which files does not describe")
            layers.append(paths)
        parts.append(Part(lo, hi, p.int_(pd, "epoch", where, 1), p.int_(pd, "parent_id", where, 0, checkpoint_id - 1), tuple(layers)))
    retired = tuple(p.path(x, f"retired[{i}]") for i, x in enumerate(p.list_(d, "retired", "top"))) if "retired" in d else ()
    parts.sort(key=lambda x: x.kg_lo)
    for a, b in zip(parts, parts[1:], strict=False):
        if b.kg_lo <= a.kg_hi:
            raise p.fail(f"parts {a.kg_lo}-{a.kg_hi} and {b.kg_lo}-{b.kg_hi} overlap")
    if fmt == PART_FORMAT and len(parts) != 1:
        raise p.fail(f"a part file must hold exactly one part, found {len(parts)}")
    if fmt == MANIFEST_FORMAT and not tiles(parts):
        raise p.fail("parts do not tile key groups 0..127")
    return Manifest(fmt, job, checkpoint_id, parent_id, created, tuple(operators), state_versions, tuple(parts), files, retired)


def tiles(parts: list[Part] | tuple[Part, ...]) -> bool:
    """Whether sorted parts cover key groups 0..127 exactly once."""
    expected = 0
    for part in sorted(parts, key=lambda x: x.kg_lo):
        if part.kg_lo != expected:
            return False
        expected = part.kg_hi + 1
    return expected == NUM_KEY_GROUPS


def ordered_file_paths(paths: list[str], files: dict[str, DataFile]) -> list[str]:
    """Paths oldest first by as_of (a base after a delta of the same checkpoint: it folds it); files without as_of first, as listed."""
    legacy = [p for p in paths if files[p].as_of is None]
    dated = sorted((files[p].as_of, files[p].kind == KIND_BASE, i, p) for i, p in enumerate(paths) if files[p].as_of is not None)
    return legacy + [p for *_, p in dated]


def ordered_layers(manifest: Manifest, part: Part) -> list[tuple[str, ...]]:
    """A part's layers oldest first, ordered by the checkpoint each file's rows are as of, whatever order the part lists them.

    Rescales join the layers of several parent parts, so list order is not time order; as_of is. Files without as_of
    (written before it existed) keep their listed layers, before every file that has one.
    """
    if all(manifest.file(p).as_of is None for layer in part.layers for p in layer):
        return list(part.layers)
    legacy = [layer for layer in part.layers if all(manifest.file(p).as_of is None for p in layer)]
    paths = [p for layer in part.layers for p in layer if manifest.file(p).as_of is not None]
    return legacy + [(p,) for p in ordered_file_paths(paths, {p: manifest.file(p) for p in paths})]


def manifest_extra_fields(raw: bytes) -> dict:
    """Top-level fields a stored manifest carries beyond the manifest itself (restored_from, savepoint): kept on rewrite."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return {}
    return {k: doc[k] for k in ("restored_from", "savepoint") if k in doc}


def info_field(extra: dict, key: str) -> dict[str, Any]:
    """An information-only object of a manifest's extra fields (savepoint, restored_from); {} when absent or not an object.

    Information is never needed to open anything, so a field edited into another shape reads as no information.
    """
    value = extra.get(key)
    return value if isinstance(value, dict) else {}


def manifest_json(m: Manifest, extra: dict | None = None) -> bytes:
    """The manifest's deterministic JSON, with optional extra top-level fields (readers ignore unknown fields)."""
    if not extra:
        return m.to_json()
    doc = json.loads(m.to_json())
    doc.update(extra)
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
