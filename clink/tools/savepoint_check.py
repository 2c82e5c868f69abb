"""check-savepoint: format, versions, key layout, every file's presence and checksum, and operator (uid) matching."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from clink.tools.projections import decode_keys, key_groups_of
from clink.tools.sources import SourceConfig, SourceRef, _is_parquet, _read_local, parse_source, savepoint_directory_of
from snapshot import (
    NUM_KEY_GROUPS,
    OPERATOR_STATE_PREFIX,
    ClinkError,
    CorruptSnapshotError,
    UnsupportedFormatVersionError,
    canonical_from_changelog,
    composite_keys,
    leading_bytes,
    operator_id,
    read_snapshot,
)
from snapshot.format import FORMAT_VERSION, FORMAT_VERSION_KEY

PASS, FAIL, WARN, INFO = "ok", "fail", "warn", "info"
# how many offending keys a finding quotes
EXAMPLES = 3


@dataclass(frozen=True)
class Finding:
    """One line of the report: which check, its status, what it found, and the file it concerns (if any)."""

    check: str
    status: str
    detail: str
    path: str | None = None

    def as_dict(self) -> dict[str, object]:
        """JSON form."""
        out: dict[str, object] = {"check": self.check, "status": self.status, "detail": self.detail}
        if self.path is not None:
            out["path"] = self.path
        return out


@dataclass
class CheckReport:
    """Everything check-savepoint found about one source."""

    source: str
    findings: list[Finding] = field(default_factory=list)
    operators: dict[int, str | None] = field(default_factory=dict)
    rows: int = 0
    files_checked: int = 0

    @property
    def passed(self) -> bool:
        """No finding failed."""
        return not any(f.status == FAIL for f in self.findings)

    def add(self, check: str, status: str, detail: str, path: str | None = None) -> None:
        """Record a finding."""
        self.findings.append(Finding(check, status, detail, path))

    def as_dict(self) -> dict[str, object]:
        """JSON form."""
        return {
            "source": self.source,
            "passed": self.passed,
            "rows": self.rows,
            "files_checked": self.files_checked,
            "operators": [{"op_id": o, "uid": u} for o, u in sorted(self.operators.items())],
            "findings": [f.as_dict() for f in self.findings],
        }


def _examples(keys: pa.Array, mask: np.ndarray) -> str:
    idx = np.flatnonzero(mask)[:EXAMPLES]
    if idx.size == 0:
        return ""
    picked = keys.take(pa.array(idx))
    return ", ".join(k.hex() for k in picked.to_pylist())


def check_key_layout(table: pa.Table, report: CheckReport, path: str | None = None) -> None:
    """Vectorised key-layout checks: key-group byte equals FNV-1a(user key) mod 128, prefix bytes, slots, duplicates."""
    n = table.num_rows
    if n == 0:
        report.add("key layout", PASS, "no rows (empty state is valid)", path)
        return
    keys = table.column("key_bytes").combine_chunks()
    decoded = decode_keys(keys)
    kind = decoded.column("kind").to_numpy(zero_copy_only=False)
    lead = leading_bytes(keys)
    keyed = kind == "keyed"
    problems = 0
    if keyed.any():
        user = decoded.column("user_key").combine_chunks()
        wrong = keyed & (key_groups_of(user) != lead)
        if wrong.any():
            problems += 1
            report.add(
                "key layout",
                FAIL,
                f"{int(wrong.sum())} keyed row(s) carry a key-group byte that is not FNV-1a(user key) mod {NUM_KEY_GROUPS}"
                f" (key_bytes e.g. {_examples(keys, wrong)})",
                path,
            )
    odd_prefix = (kind == "operator") & (lead != OPERATOR_STATE_PREFIX)
    if odd_prefix.any():
        report.add("key layout", WARN, f"{int(odd_prefix.sum())} operator-state row(s) use prefix bytes other than 0xFF", path)
    raw = kind == "raw"
    if raw.any():
        report.add("key layout", WARN, f"{int(raw.sum())} legacy raw key(s) without '|' (shown under slot <raw>)", path)
    bad_slot = ~np.asarray(decoded.column("slot_ok").to_numpy(zero_copy_only=False), dtype=bool)
    if bad_slot.any():
        problems += 1
        report.add("key layout", FAIL, f"{int(bad_slot.sum())} row(s) have a slot name that is not clean UTF-8 without newlines", path)
    comp = composite_keys(table.column("op_id"), keys)
    distinct = pc.count_distinct(comp).as_py()
    if distinct != n:
        problems += 1
        report.add("key layout", FAIL, f"{n - distinct} duplicate (op_id, key) row(s): a canonical snapshot holds each key once", path)
    if not problems:
        kinds = {k: int((kind == k).sum()) for k in ("keyed", "operator", "raw")}
        report.add("key layout", PASS, f"{n} row(s): {kinds['keyed']} keyed, {kinds['operator']} operator-state, {kinds['raw']} raw", path)


def check_operators(report: CheckReport, expect_ops: Sequence[int], expect_uids: Sequence[str]) -> None:
    """Compare the operators present with those expected: both directions are reported by name."""
    present = report.operators
    if not expect_ops and not expect_uids:
        names = ", ".join(_op_name(o, u) for o, u in sorted(present.items())) or "none"
        report.add("operators", INFO, f"present: {names} (pass --expect-op/--expect-uid to check them)")
        return
    expected: dict[int, str | None] = {int(o): None for o in expect_ops}
    for uid in expect_uids:
        expected[operator_id(uid)] = uid
    unexpected = sorted(set(present) - set(expected))
    absent = sorted(set(expected) - set(present))
    for op in unexpected:
        report.add(
            "operators",
            FAIL,
            f"operator {_op_name(op, present[op])} is present but not expected (its state would be dropped or misassigned)",
        )
    for op in absent:
        report.add("operators", FAIL, f"operator {_op_name(op, expected[op])} is expected but absent (it would start from empty state)")
    mismatched = [op for op in set(present) & set(expected) if present[op] and expected[op] and present[op] != expected[op]]
    for op in sorted(mismatched):
        report.add("operators", FAIL, f"operator {op} is recorded with uid {present[op]!r} but expected as {expected[op]!r}")
    if not unexpected and not absent and not mismatched:
        report.add("operators", PASS, f"all {len(expected)} expected operator(s) present, none unexpected")


def _op_name(op: int, uid: str | None) -> str:
    return f"{uid!r} (op_id {op})" if uid else f"op_id {op}"


def check_snapshot_bytes(report: CheckReport, data: bytes | pa.Buffer | pa.NativeFile, path: str | None = None) -> pa.Table | None:
    """Format, versions and layout of one snapshot stream; the canonical table, or None when unreadable."""
    try:
        snap = read_snapshot(data)
    except UnsupportedFormatVersionError as exc:
        report.add("format version", FAIL, str(exc), path)
        return None
    except CorruptSnapshotError as exc:
        check = "state versions" if "state_versions" in str(exc) else "format"
        report.add(check, FAIL, str(exc), path)
        return None
    declared = "declared" if FORMAT_VERSION_KEY in snap.metadata else "absent, read as"
    report.add("format version", PASS, f"{declared} {snap.format_version} (this reader knows up to {FORMAT_VERSION})", path)
    report.add("state versions", PASS, f"{len(snap.state_versions)} stamp(s) parse", path)
    table = canonical_from_changelog(snap.table) if snap.is_changelog else snap.table
    if snap.is_changelog:
        report.add("format", INFO, f"changelog variant: {snap.table.num_rows} log row(s) replay to {table.num_rows} entries", path)
    check_key_layout(table, report, path)
    return table


def check_source(
    spec: str,
    config: SourceConfig | None = None,
    expect_ops: Sequence[int] = (),
    expect_uids: Sequence[str] = (),
) -> CheckReport:
    """Run every check on SRC; problems in the data become failing findings, a source that cannot be found raises."""
    config = config or SourceConfig()
    ref = savepoint_directory_of(parse_source(spec), config)
    report = CheckReport(ref.describe())
    if ref.kind in ("file", "object"):
        _check_snapshot_source(ref, config, report)
    elif ref.kind in ("checkpoint", "savepoint"):
        from clink.tools.stored import check_stored

        check_stored(ref, config, report)
    else:
        _check_pool(ref, config, report)
    check_operators(report, expect_ops, expect_uids)
    return report


def _record_table(report: CheckReport, table: pa.Table | None) -> None:
    if table is None:
        return
    report.rows += table.num_rows
    if table.num_rows:
        for op in pc.unique(table.column("op_id")).to_pylist():
            report.operators.setdefault(int(op), None)


def _check_snapshot_source(ref: SourceRef, config: SourceConfig, report: CheckReport) -> None:
    if ref.kind == "file":
        data = _read_local(ref)
    else:
        from clink.tools.sources import open_source_store

        data = open_source_store(ref, config).get(ref.path)
    report.files_checked = 1
    if ref.kind == "file" and _is_parquet(data):  # state-cat reads it, but nothing restores from it
        report.add(
            "format",
            FAIL,
            "a Parquet file: clink's Parquet export is a derived projection, not restorable; check the Arrow stream, "
            "checkpoint or savepoint it came from",
        )
        return
    # one file: the report's title names it already
    _record_table(report, check_snapshot_bytes(report, data))


def _check_pool(ref: SourceRef, config: SourceConfig, report: CheckReport) -> None:
    from clink.tools.sources import load_source

    try:
        source = load_source(ref.spec, config)
    except (CorruptSnapshotError, UnsupportedFormatVersionError) as exc:
        report.add("format", FAIL, str(exc))
        return
    except ClinkError as exc:
        if exc.__class__.__name__ == "ChecksumMismatchError":
            report.add("checksum", FAIL, str(exc), getattr(exc, "path", None))
            return
        raise
    why = (
        "rendered from the RocksDB directory; RocksDB checks its own block checksums"
        if ref.kind == "rocksdb"
        else "the pool re-encodes what it serves; its files are checked by the pool"
    )
    report.add("format version", PASS, f"{source.format_version} ({why})")
    check_key_layout(source.table, report)
    report.rows = source.table.num_rows
    report.operators.update(source.operators)


__all__ = ["CheckReport", "Finding", "check_key_layout", "check_operators", "check_snapshot_bytes", "check_source"]
