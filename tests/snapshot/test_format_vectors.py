"""Conformance: every entry of format-vectors/expected.json (the in-repo copy of ../shared/format-vectors) against snapshot/."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

import snapshot
from snapshot import (
    CorruptSnapshotError,
    InvalidArgumentError,
    StateVersionMap,
    UnsupportedFormatVersionError,
)

VECTORS = (
    Path(__file__).resolve().parents[2] / "format-vectors"
)  # a copy of ../shared/format-vectors (test_format_vectors checks they agree)
EXPECTED = json.loads((VECTORS / "expected.json").read_text())
SNAPSHOTS = EXPECTED["snapshots"]
MERGE = EXPECTED["merge"]


def _rows_of(table: pa.Table) -> list[tuple[int, str, str]]:
    """Rows as sorted (op_id, key hex, value hex) tuples: stream order is unspecified, duplicates still count."""
    cols = table.select(["op_id", "key_bytes", "value_bytes"]).to_pydict()
    return sorted(zip(cols["op_id"], (k.hex() for k in cols["key_bytes"]), (v.hex() for v in cols["value_bytes"]), strict=True))


def _expected_rows(rows: list[dict]) -> list[tuple[int, str, str]]:
    return sorted((r["op_id"], r["key_bytes"], r["value_bytes"]) for r in rows)


def _blob(name: str) -> bytes:
    return (VECTORS / name).read_bytes()


def test_vectors_folder_is_present_and_nonempty() -> None:
    assert (VECTORS / "expected.json").is_file(), f"format vectors not found at {VECTORS}"
    assert len(EXPECTED["key_groups"]) >= 50
    assert len(SNAPSHOTS) >= 13


def test_every_snap_file_is_covered_by_expected_json() -> None:
    on_disk = {p.name for p in VECTORS.glob("*.snap")}
    covered = set(SNAPSHOTS) | set(MERGE["inputs"])
    assert on_disk, "no .snap files in the vectors folder"
    assert on_disk - covered == set(), f"snap files not described by expected.json: {sorted(on_disk - covered)}"
    assert covered - on_disk == set(), f"expected.json names missing files: {sorted(covered - on_disk)}"


# --- key groups -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", EXPECTED["key_groups"], ids=lambda c: c["user_key"][:16] or "empty")
def test_key_group_vector(case: dict) -> None:
    user_key = bytes.fromhex(case["user_key"])
    assert snapshot.fnv1a64(user_key) == int(case["fnv1a64"], 16)
    assert snapshot.key_group(user_key) == case["key_group"]
    assert int(case["fnv1a64"], 16) % 128 == case["key_group"]


# --- key layout -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", EXPECTED["key_layout"], ids=lambda c: f"{c['kind']}-{c['slot']}-{c['user_key'][:12]}")
def test_key_layout_vector(case: dict) -> None:
    key_bytes = bytes.fromhex(case["key_bytes"])
    user_key = bytes.fromhex(case["user_key"])
    decoded = snapshot.decode_key(key_bytes)
    assert decoded.kind == case["kind"]
    assert decoded.slot == case["slot"]
    assert decoded.user_key == user_key
    assert decoded.key_group == case["key_group"]
    if case["kind"] == "keyed":
        assert snapshot.encode_keyed_key(case["slot"], user_key) == key_bytes
        assert snapshot.key_group(user_key) == case["key_group"]
        assert key_bytes[0] == case["key_group"]
    elif case["kind"] == "operator":
        assert snapshot.encode_operator_key(case["slot"], user_key) == key_bytes
        assert key_bytes[0] == snapshot.OPERATOR_STATE_PREFIX
    else:
        assert case["slot"] == snapshot.RAW_SLOT
        assert b"|" not in key_bytes
        with pytest.raises(InvalidArgumentError):
            snapshot.encode_keyed_key(snapshot.RAW_SLOT, user_key)


@pytest.mark.parametrize("slot", ["a|b", "|", "line\nbreak", "\n", "trail|", snapshot.RAW_SLOT])
@pytest.mark.parametrize("encode", [snapshot.encode_keyed_key, snapshot.encode_operator_key], ids=["keyed", "operator"])
def test_bad_slot_names_are_refused(slot: str, encode) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        encode(slot, b"k")
    assert repr(slot) in str(err.value)
    with pytest.raises(InvalidArgumentError):
        snapshot.validate_slot(slot)


def test_slot_name_must_be_text() -> None:
    with pytest.raises(InvalidArgumentError):
        snapshot.encode_keyed_key(b"count", b"k")  # type: ignore[arg-type]


# --- operator ids -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", EXPECTED["operator_ids"]["cases"], ids=lambda c: c["uid"] or "empty")
def test_operator_id_vector(case: dict) -> None:
    assert snapshot.operator_id(case["uid"]) == case["op_id"]


# --- state versions ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", EXPECTED["state_versions"]["valid"], ids=lambda c: repr(c["packed"])[:30])
def test_state_versions_valid(case: dict) -> None:
    want = [tuple(e) for e in case["entries"]]
    for packed in (case["packed"], case["packed"].encode()):
        parsed = StateVersionMap.unpack(packed)
        assert parsed.entries() == want
        assert parsed.pack() == case["packed"]
        assert StateVersionMap.unpack(parsed.pack()) == parsed
    assert StateVersionMap(want).pack() == case["packed"]


@pytest.mark.parametrize("packed", EXPECTED["state_versions"]["invalid"], ids=repr)
def test_state_versions_invalid(packed: str) -> None:
    with pytest.raises(CorruptSnapshotError):
        StateVersionMap.unpack(packed)
    with pytest.raises(CorruptSnapshotError):
        StateVersionMap.unpack(packed.encode())


# --- snapshots --------------------------------------------------------------------------------------------

VALID = sorted(name for name, case in SNAPSHOTS.items() if case["valid"])
INVALID = sorted(name for name, case in SNAPSHOTS.items() if not case["valid"])


def test_vectors_have_both_kinds() -> None:
    assert "future-version.snap" in INVALID and len(INVALID) >= 6
    assert "changelog.snap" in VALID and "empty.snap" in VALID


@pytest.mark.parametrize("name", VALID)
def test_valid_snapshot_vector(name: str) -> None:
    case = SNAPSHOTS[name]
    blob = _blob(name)
    snap = snapshot.read_snapshot(blob)
    assert snap.format_version == 1
    assert snap.format_version == int(case.get("format_version", case.get("format_version_read_as", "1")))
    assert snap.is_changelog == (case.get("variant") == "changelog")
    if "state_versions" in case:
        assert snap.state_versions.pack() == case["state_versions"]
        assert snap.state_versions == StateVersionMap.unpack(case["state_versions"])

    canonical = snapshot.canonicalise_state_snapshot(blob)
    if not snap.is_changelog:
        assert canonical == blob, "a canonical snapshot must pass through canonicalise unchanged"
    out = snapshot.read_snapshot(canonical)
    assert not out.is_changelog
    assert out.table.schema.equals(snapshot.CANONICAL_SCHEMA)
    assert out.state_versions == snap.state_versions
    want = _expected_rows(case["canonical_rows"] if snap.is_changelog else case["rows"])
    assert _rows_of(out.table) == want
    if not snap.is_changelog:
        assert _rows_of(snap.table) == want


def test_unversioned_snapshot_has_no_marker_and_reads_as_one() -> None:
    snap = snapshot.read_snapshot(_blob("unversioned.snap"))
    assert b"clink.format_version" not in snap.metadata
    assert snap.format_version == 1


def test_extra_metadata_is_ignored_on_read_and_kept() -> None:
    snap = snapshot.read_snapshot(_blob("extra-metadata.snap"))
    unknown = {k for k in snap.metadata if not k.startswith(b"clink.")}
    assert unknown, "the vector is meant to carry an unknown metadata key"
    assert set(snap.extra_metadata) == unknown


def test_changelog_vector_replays_materialisation_first() -> None:
    snap = snapshot.read_snapshot(_blob("changelog.snap"))
    kinds = set(snap.table.column("row_kind").to_pylist())
    assert kinds == {snapshot.ROW_MATERIALISATION, snapshot.ROW_PUT, snapshot.ROW_ERASE}
    replayed = snapshot.canonical_from_changelog(snap.table)
    assert _rows_of(replayed) == _expected_rows(SNAPSHOTS["changelog.snap"]["canonical_rows"])
    # the same changelog overlaid on an empty base gives the same rows
    assert _rows_of(snapshot.overlay(snapshot.empty_table(), snap.table)) == _rows_of(replayed)


def test_legacy_raw_key_vector_decodes_under_raw_slot() -> None:
    snap = snapshot.read_snapshot(_blob("legacy-raw-key.snap"))
    (key,) = snap.table.column("key_bytes").to_pylist()
    decoded = snapshot.decode_key(key)
    assert (decoded.kind, decoded.slot, decoded.user_key, decoded.key_group) == ("raw", snapshot.RAW_SLOT, key, None)


@pytest.mark.parametrize("name", INVALID)
def test_invalid_snapshot_vector(name: str) -> None:
    expected_error = UnsupportedFormatVersionError if name == "future-version.snap" else CorruptSnapshotError
    blob = _blob(name)
    with pytest.raises(expected_error) as err:
        snapshot.read_snapshot(blob)
    assert str(err.value), "the error must say what is wrong"
    assert isinstance(err.value, snapshot.ClinkError)
    with pytest.raises(expected_error):
        snapshot.canonicalise_state_snapshot(blob)
    with pytest.raises(expected_error):
        snapshot.merge_snapshot_bytes([_blob("small.snap"), blob])


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("missing-column.snap", "value_bytes"),
        ("wrong-type.snap", "op_id"),
        ("null-value.snap", "null"),
        ("bad-versions.snap", "state_versions"),
    ],
)
def test_invalid_snapshot_error_names_the_problem(name: str, needle: str) -> None:
    with pytest.raises(CorruptSnapshotError, match=needle):
        snapshot.read_snapshot(_blob(name))


def test_future_version_is_not_a_corrupt_snapshot() -> None:
    with pytest.raises(UnsupportedFormatVersionError, match="2") as err:
        snapshot.read_snapshot(_blob("future-version.snap"))
    assert not isinstance(err.value, CorruptSnapshotError)


# --- merge ------------------------------------------------------------------------------------------------


def test_merge_vector() -> None:
    blobs = [_blob(name) for name in MERGE["inputs"]]
    merged = snapshot.read_snapshot(snapshot.merge_snapshot_bytes(blobs))
    assert _rows_of(merged.table) == _expected_rows(MERGE["rows"])
    assert merged.state_versions.pack() == MERGE["state_versions"]
    first_non_empty = next(snapshot.read_snapshot(b) for b in blobs if snapshot.read_snapshot(b).table.num_rows)
    assert first_non_empty.state_versions.pack() == MERGE["state_versions"]
    assert merged.metadata == first_non_empty.metadata
    assert merged.format_version == 1


def test_merge_vector_tables_agree_with_bytes() -> None:
    tables = [snapshot.read_snapshot(_blob(name)).table for name in MERGE["inputs"]]
    assert _rows_of(snapshot.merge_tables(tables)) == _expected_rows(MERGE["rows"])


def test_merge_vector_offset_rule_is_order_independent() -> None:
    rows_ab = _rows_of(snapshot.merge_tables([snapshot.read_snapshot(_blob(n)).table for n in ("merge-a.snap", "merge-b.snap")]))
    rows_ba = _rows_of(snapshot.merge_tables([snapshot.read_snapshot(_blob(n)).table for n in ("merge-b.snap", "merge-a.snap")]))
    keys_ab = [(o, k) for o, k, _ in rows_ab]
    keys_ba = [(o, k) for o, k, _ in rows_ba]
    assert keys_ab == keys_ba
    offsets = [r for r in rows_ab if r[1] == snapshot.encode_operator_key("offsets", b"partition-0").hex()]
    assert offsets == [r for r in rows_ba if r[1] == offsets[0][1]], "the 8-byte offset rule must not depend on input order"
    assert len(offsets) == 1 and offsets[0][2] == (900).to_bytes(8, "little").hex()


SHARED = Path(__file__).resolve().parents[3] / "shared" / "format-vectors"


@pytest.mark.skipif(not SHARED.is_dir(), reason="no ../shared checkout next to this clone: the in-repo copy is the reference")
def test_the_in_repo_vectors_are_identical_to_the_shared_ones() -> None:
    ours = sorted(p.relative_to(VECTORS) for p in VECTORS.rglob("*") if p.is_file())
    theirs = sorted(p.relative_to(SHARED) for p in SHARED.rglob("*") if p.is_file())
    assert ours == theirs
    for rel in ours:
        assert (VECTORS / rel).read_bytes() == (SHARED / rel).read_bytes(), f"format-vectors/{rel} differs from ../shared"
