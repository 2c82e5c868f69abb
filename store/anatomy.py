"""A manifest's anatomy, derived from its parts and files alone: operators, parallelism, subtasks, rows and bytes."""

from __future__ import annotations

from importlib import metadata
from typing import TYPE_CHECKING, Any

import numpy as np

from snapshot import NUM_KEY_GROUPS, StateVersionMap
from store.datafile import operator_state_sources

if TYPE_CHECKING:
    from store.manifest import Manifest

try:
    WRITER_VERSION = f"clink-remote-state {metadata.version('clink-remote-state')}"
except metadata.PackageNotFoundError:  # run from a source tree that was never installed
    WRITER_VERSION = "clink-remote-state (not installed)"

# how rows are counted: "live" when every part is one layer (a savepoint, a restore, a compacted checkpoint), else
# "stored" (a key written in several checkpoints counts once per layer that holds it, erases included)
LIVE, STORED = "live", "stored"


def _per_key_group(m: Manifest) -> tuple[np.ndarray, np.ndarray]:
    """Stored rows and bytes of keyed segments per key group, every file once (a segment over several groups split evenly)."""
    keyed = [(seg.kg_lo, seg.kg_hi, seg.rows, seg.length) for f in m.files for seg in f.segments if not seg.operator]
    if not keyed:
        return np.zeros(NUM_KEY_GROUPS), np.zeros(NUM_KEY_GROUPS)
    lo, hi, rows, size = np.array(keyed, dtype=np.float64).T
    width = hi - lo + 1
    out = []
    for values in (rows / width, size / width):  # difference arrays: + at each segment's first group, - past its last
        diff = np.zeros(NUM_KEY_GROUPS + 1)
        np.add.at(diff, lo.astype(np.int64), values)
        np.add.at(diff, hi.astype(np.int64) + 1, -values)
        out.append(np.cumsum(diff)[:NUM_KEY_GROUPS])
    return out[0], out[1]


def operator_state_files(m: Manifest) -> set[str] | None:
    """Paths of the files whose operator state a reader reads (store.datafile.operator_state_sources, as the reader picks
    them); None when a file predates as_of (then any may be read).
    """
    entries = list({path: m.file(path) for p in m.parts for layer in p.layers for path in layer}.values())
    if any(e.as_of is None for e in entries):
        return None
    newest, deltas = operator_state_sources(entries)
    return {e.path for e in deltas} | ({newest.path} if newest is not None else set())


def _repeated_operator_state(m: Manifest) -> set[str]:
    """Files of a one-layer-per-part manifest whose operator state no reader reads (compaction folds the whole operator
    state into every part's base): the anatomy counts the operator state of the file read only.
    """
    read = operator_state_files(m)
    if read is None:
        return set()
    return {f.path for f in m.files if f.path not in read and any(s.operator for s in f.segments)}


def _subtasks(m: Manifest, repeated: set[str]) -> list[dict[str, Any]]:
    """One entry per part (the subtask that committed it): its key groups, epoch, layers, stored rows and bytes."""
    rows, size = _per_key_group(m)
    seen: set[str] = set()  # a file several parts list (after a rescale) is counted for the first of them
    out = []
    for i, part in enumerate(sorted(m.parts, key=lambda p: p.kg_lo)):
        op_rows = op_bytes = 0
        for path in (x for layer in part.layers for x in layer):
            if path in seen or path in repeated:
                continue
            seen.add(path)
            for seg in m.file(path).segments:
                if seg.operator:
                    op_rows += seg.rows
                    op_bytes += seg.length
        lo, hi = part.kg_lo, part.kg_hi
        out.append(
            {
                "subtask": i,
                "kg_lo": lo,
                "kg_hi": hi,
                "epoch": part.epoch,
                "layers": len(part.layers),
                "rows": round(float(rows[lo : hi + 1].sum())) + op_rows,
                "bytes": round(float(size[lo : hi + 1].sum())) + op_bytes,
                "operator_state_rows": op_rows,
            }
        )
    return out


def _operators(m: Manifest, parallelism: int, repeated: set[str]) -> tuple[list[dict[str, Any]], bool, bool]:
    """Every operator the manifest names or holds rows of, with its rows, bytes and states; whether every file counted them;
    and whether the operator state of ``repeated`` files could be left out (their rows counted per state slot).
    """
    uids = {op: uid for op, uid in m.operators}
    rows: dict[int, int] = {}
    size: dict[int, int] = {}
    states: dict[int, dict[tuple[str, str], list[int]]] = {}
    counted = separated = True
    for f in m.files:
        if f.operators is None:
            counted = False  # a file written before version 4: its operators are not known without reading it
            continue
        for o in f.operators:
            skipped = [s for s in o.states if s.kind == "operator"] if f.path in repeated else []
            separated = separated and (f.path not in repeated or bool(o.states) or not o.rows)
            rows[o.op_id] = rows.get(o.op_id, 0) + o.rows - sum(s.rows for s in skipped)
            size[o.op_id] = size.get(o.op_id, 0) + o.bytes - sum(s.bytes for s in skipped)
            for s in o.states:
                if s in skipped:
                    continue
                acc = states.setdefault(o.op_id, {}).setdefault((s.slot, s.kind), [0, 0])
                acc[0] += s.rows
                acc[1] += s.bytes
    versions = StateVersionMap.unpack(m.state_versions)
    out = []
    for op in sorted(set(uids) | set(rows) | {op for op, _ in versions}):
        out.append(
            {
                "op_id": op,
                "op_id_hex": f"0x{op:016x}",
                "uid": uids.get(op) or None,
                "parallelism": parallelism,
                "max_parallelism": NUM_KEY_GROUPS,
                "rows": rows.get(op, 0) if counted else None,
                "bytes": size.get(op, 0) if counted else None,
                "states": [
                    {"slot": slot, "kind": kind, "rows": r, "bytes": b} for (slot, kind), (r, b) in sorted(states.get(op, {}).items())
                ],
                "state_versions": [{"state_type": t, "version": v} for (o, t), v in sorted(versions.items()) if o == op],
            }
        )
    return out, counted, separated


def anatomy(m: Manifest) -> dict[str, Any]:
    """What a complete manifest holds, as State Processor API tools show it, from _metadata alone (no data file is read).

    Parallelism is the number of parts (each committed by one subtask); every operator of a job spans every subtask.
    Operator bytes are key plus value bytes; subtask bytes are stored (encoded) bytes.
    """
    parallelism = len(m.parts)
    one_layer = all(len(p.layers) <= 1 for p in m.parts) and all(f.kind == "base" for f in m.files)
    repeated = _repeated_operator_state(m) if one_layer else set()
    operators, counted, separated = _operators(m, parallelism, repeated)
    if not separated:  # a repeated operator state not counted per slot: count everything stored
        repeated = set()
        operators, counted, _ = _operators(m, parallelism, repeated)
    return {
        "parallelism": parallelism,
        "max_parallelism": NUM_KEY_GROUPS,
        "rows_counted": LIVE if one_layer and separated else STORED,
        "operators_counted": counted,
        "operators": operators,
        "subtasks": _subtasks(m, repeated),
        "files": len(m.files),
        "bytes": m.total_bytes,
        "rows": m.total_rows,
        "provenance": {"job": m.job, "checkpoint_id": m.checkpoint_id, "created_at_ms": m.created_at_ms, "writer": WRITER_VERSION},
    }


def operators_named_or_held(m: Manifest) -> dict[int, str | None]:
    """op_id -> uid (None: unnamed) of every operator the manifest names (its committers registered) or holds rows of."""
    uids = {op: uid for op, uid in m.operators}
    held = {o.op_id for f in m.files for o in (f.operators or ()) if o.rows}
    return {op: uids.get(op) or None for op in sorted(set(uids) | held)}


def operators_with_state(m: Manifest) -> dict[int, str | None]:
    """op_id -> uid (None: unnamed) of the operators holding rows (the set a safe restore checks); named ones too for older files."""
    if all(f.operators is not None for f in m.files):  # counted: exactly the operators with rows
        uids = {op: uid for op, uid in m.operators}
        return {op: uids.get(op) or None for op in sorted({o.op_id for f in m.files for o in f.operators or () if o.rows})}
    return operators_named_or_held(m)  # files written before version 4: the names recorded, and what is known
