"""A manifest's anatomy, derived from its parts and files alone: operators, parallelism, subtasks, rows and bytes."""

from __future__ import annotations

from importlib import metadata
from typing import TYPE_CHECKING, Any

import numpy as np

from snapshot import NUM_KEY_GROUPS, StateVersionMap

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
    rows = np.zeros(NUM_KEY_GROUPS, dtype=np.float64)
    size = np.zeros(NUM_KEY_GROUPS, dtype=np.float64)
    for f in m.files:
        for seg in f.segments:
            if seg.operator:
                continue
            width = seg.kg_hi - seg.kg_lo + 1
            rows[seg.kg_lo : seg.kg_hi + 1] += seg.rows / width
            size[seg.kg_lo : seg.kg_hi + 1] += seg.length / width
    return rows, size


def _subtasks(m: Manifest) -> list[dict[str, Any]]:
    """One entry per part (the subtask that committed it): its key groups, epoch, layers, stored rows and bytes."""
    rows, size = _per_key_group(m)
    seen: set[str] = set()  # a file several parts list (after a rescale) is counted for the first of them
    out = []
    for i, part in enumerate(sorted(m.parts, key=lambda p: p.kg_lo)):
        op_rows = op_bytes = 0
        for path in (x for layer in part.layers for x in layer):
            if path in seen:
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


def _operators(m: Manifest, parallelism: int) -> tuple[list[dict[str, Any]], bool]:
    """Every operator the manifest names or holds rows of, with its rows, bytes and states; and whether every file counted them."""
    uids = {op: uid for op, uid in m.operators}
    rows: dict[int, int] = {}
    size: dict[int, int] = {}
    states: dict[int, dict[tuple[str, str], list[int]]] = {}
    counted = True
    for f in m.files:
        if f.operators is None:
            counted = False  # a file written before version 4: its operators are not known without reading it
            continue
        for o in f.operators:
            rows[o.op_id] = rows.get(o.op_id, 0) + o.rows
            size[o.op_id] = size.get(o.op_id, 0) + o.bytes
            for s in o.states:
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
    return out, counted


def anatomy(m: Manifest) -> dict[str, Any]:
    """What a complete manifest holds, as State Processor API tools show it, from _metadata alone (no data file is read).

    Parallelism is the number of parts (each committed by one subtask); every operator of a job spans every subtask.
    Operator bytes are key plus value bytes; subtask bytes are stored (encoded) bytes.
    """
    parallelism = len(m.parts)
    operators, counted = _operators(m, parallelism)
    one_layer = all(len(p.layers) <= 1 for p in m.parts) and all(f.kind == "base" for f in m.files)
    return {
        "parallelism": parallelism,
        "max_parallelism": NUM_KEY_GROUPS,
        "rows_counted": LIVE if one_layer else STORED,
        "operators_counted": counted,
        "operators": operators,
        "subtasks": _subtasks(m),
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
