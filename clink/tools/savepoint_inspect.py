"""Savepoint inspect and verify: the anatomy in _metadata, and what a damaged or missing file costs (operators, key groups)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from store.anatomy import anatomy, operator_state_files
from store.locations import StateLocation
from store.manifest import info_field

# findings of check-savepoint that mean a file cannot be read
DAMAGE_CHECKS = ("presence", "checksum", "format", "format version", "state versions")


def iso_time_or_none(ms: Any) -> str | None:
    """An ISO time of epoch milliseconds given as information (a copied _metadata may say anything): None unless a plain
    int from 1970 to 9999.
    """
    if not isinstance(ms, int) or isinstance(ms, bool) or not 0 <= ms < 253402300800000:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _file_owners(loc: StateLocation) -> dict[str, list[int]]:
    """Which subtasks (parts, by index in key-group order) list each file."""
    owners: dict[str, list[int]] = {}
    for i, part in enumerate(sorted(loc.manifest.parts, key=lambda p: p.kg_lo)):
        for path in (x for layer in part.layers for x in layer):
            owners.setdefault(path, []).append(i)
    return owners


def inspect_location(loc: StateLocation) -> dict[str, Any]:
    """Everything the State Processor API shows of a savepoint and more, from its _metadata alone (no data file is read)."""
    m = loc.manifest
    doc = anatomy(m)
    uids = {o["op_id"]: o["uid"] for o in doc["operators"]}
    owners = _file_owners(loc)
    files = []
    for f in sorted(m.files, key=lambda f: f.path):
        files.append(
            {
                "path": f.path,
                "kind": f.kind,
                "size": f.size,
                "rows": f.rows,
                "kg_lo": f.kg_lo,
                "kg_hi": f.kg_hi,
                "segments": len(f.segments),
                "subtasks": owners.get(f.path, []),
                "operators": [{"op_id": o.op_id, "uid": uids.get(o.op_id), "rows": o.rows} for o in f.operators or ()],
            }
        )
    provenance = dict(doc["provenance"])
    provenance["created_at"] = iso_time_or_none(m.created_at_ms)
    for key in ("savepoint", "restored_from"):
        if key in loc.extra:
            provenance[key] = info_field(loc.extra, key)
    return {
        "location": loc.uri,
        "kind": loc.kind,
        "job": m.job,
        "checkpoint_id": m.checkpoint_id,
        **{k: doc[k] for k in ("parallelism", "max_parallelism", "rows_counted", "operators", "subtasks", "bytes")},
        "rows": sum(s["rows"] for s in doc["subtasks"]),
        "files": files,
        "provenance": provenance,
    }


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [header, *rows]]


def inspect_text(doc: dict[str, Any]) -> str:
    """The inspect report as a person reads it."""
    p = doc["provenance"]
    lines = [
        f"{doc['kind']} {doc['location']}",
        f"  checkpoint {doc['checkpoint_id']} of job {doc['job']}, parallelism {doc['parallelism']} (max parallelism "
        f"{doc['max_parallelism']}), {len(doc['files'])} file(s), {_size(doc['bytes'])}, {doc['rows']} rows ({doc['rows_counted']})",
    ]
    sp = p.get("savepoint")
    if sp:
        lines.append(
            f"  taken {iso_time_or_none(sp.get('created_at_ms'))} by {sp.get('writer', '?')} from {sp.get('source_store', '?')} "
            f"(job {sp.get('source_job', doc['job'])}, checkpoint {sp.get('source_checkpoint_id', doc['checkpoint_id'])})"
        )
    restored = p.get("restored_from")
    if isinstance(restored, dict) and restored.get("kind") == "import":
        lines.append(f"  imported {iso_time_or_none(restored.get('imported_at_ms'))} from {restored.get('imported_from', '?')}")
    elif restored:
        lines.append(
            f"  restored {iso_time_or_none(restored.get('restored_at_ms'))} from {restored.get('location') or restored.get('savepoint') or restored}"
        )
    lines.append("operators")
    ops = [
        [
            o["uid"] or "(no uid)",
            o["op_id_hex"],
            str(o["parallelism"]),
            str(o["max_parallelism"]),
            "?" if o["rows"] is None else str(o["rows"]),
            _size(o["bytes"]),
            ", ".join(f"{s['slot']} ({s['kind']}, {s['rows']} rows)" for s in o["states"])
            + "".join(f" {v['state_type']}=v{v['version']}" for v in o["state_versions"]),
        ]
        for o in doc["operators"]
    ]
    lines += _table(["uid", "op_id", "parallelism", "max", "rows", "bytes", "states"], ops) if ops else ["  (none)"]
    lines.append("subtasks")
    subs = [[str(s["subtask"]), f"{s['kg_lo']}-{s['kg_hi']}", str(s["rows"]), _size(s["bytes"])] for s in doc["subtasks"]]
    lines += _table(["subtask", "key groups", "rows", "bytes"], subs)
    lines.append("files")
    files = [
        [
            f["path"],
            _size(f["size"]),
            f"{f['rows']} rows",
            f"key groups {f['kg_lo']}-{f['kg_hi']}",
            "subtask " + ",".join(map(str, f["subtasks"])),
        ]
        for f in doc["files"]
    ]
    lines += _table(["path", "size", "rows", "holds", "of"], files) if files else ["  (none: empty state)"]
    return "\n".join(lines)


@dataclass(frozen=True)
class Damage:
    """What a verify found: the damaged files, what each held, and what can still be restored."""

    damaged: list[dict[str, Any]]
    restorable: list[tuple[int, int]]
    lost: list[tuple[int, int]]
    operator_state_lost: bool = False  # a damaged file held the operator state readers read (not a copy of it)


def assess_damage(loc: StateLocation, bad_paths: dict[str, str]) -> Damage:
    """For each damaged file (path -> what is wrong): the operators and key groups it holds; the ranges still restorable."""
    m = loc.manifest
    owners = _file_owners(loc)
    parts = sorted(m.parts, key=lambda p: p.kg_lo)
    uids = {op: uid for op, uid in m.operators}
    damaged = []
    for path, problem in sorted(bad_paths.items()):
        entry = m.file(path)
        damaged.append(
            {
                "path": path,
                "problem": problem,
                "size": entry.size,
                "rows": entry.rows,
                "key_groups": [[parts[i].kg_lo, parts[i].kg_hi] for i in owners.get(path, [])],
                "operator_state": any(s.operator for s in entry.segments),
                "operators": [
                    {"op_id": o.op_id, "op_id_hex": f"0x{o.op_id:016x}", "uid": uids.get(o.op_id) or None, "rows": o.rows}
                    for o in entry.operators or ()
                ],
            }
        )
    lost_parts = {i for path in bad_paths for i in owners.get(path, [])}
    read = operator_state_files(m)  # the files whose operator state every subtask reads (not the copies of it)
    operator_state_lost = any(f["operator_state"] and (read is None or f["path"] in read) for f in damaged)
    if operator_state_lost:
        lost_parts = set(range(len(parts)))  # no range restores without the operator state
    restorable = [(p.kg_lo, p.kg_hi) for i, p in enumerate(parts) if i not in lost_parts]
    lost = [(p.kg_lo, p.kg_hi) for i, p in enumerate(parts) if i in lost_parts]
    return Damage(damaged, restorable, lost, operator_state_lost)


def _ranges(ranges: list[tuple[int, int]]) -> str:
    return ", ".join(f"{lo}-{hi}" for lo, hi in ranges) or "none"


def damage_text(d: Damage) -> list[str]:
    """Lines naming each damaged file, what it holds, and what can still be restored."""
    lines = []
    for f in d.damaged:
        ops = ", ".join(f"{o['uid'] or o['op_id_hex']} ({o['rows']} rows)" for o in f["operators"]) or "operators not recorded"
        groups = ", ".join(f"{lo}-{hi}" for lo, hi in f["key_groups"])
        extra = " and operator state" if f["operator_state"] else ""
        lines.append(f"DAMAGED {f['path']} ({f['problem']}): holds key groups {groups}{extra} of {ops}")
    lines.append(f"restorable key groups: {_ranges(d.restorable)}; lost: {_ranges(d.lost)}")
    if d.operator_state_lost:
        lines.append("the operator state is lost, and every subtask reads it: restore from an earlier savepoint or checkpoint")
    elif d.lost:
        lines.append("restore the undamaged ranges from this savepoint and the lost ones from an earlier savepoint or checkpoint")
    return lines


__all__ = ["DAMAGE_CHECKS", "Damage", "assess_damage", "damage_text", "inspect_location", "inspect_text", "iso_time_or_none"]
