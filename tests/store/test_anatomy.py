"""The anatomy derived from a manifest's segments: per-subtask rows and bytes equal a per-segment sum, whatever the layout."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from snapshot import NUM_KEY_GROUPS
from store.anatomy import anatomy
from store.datafile import DataFile, Segment
from store.manifest import MANIFEST_FORMAT, Manifest, Part


@st.composite
def segments(draw) -> Segment:
    if draw(st.booleans()) and draw(st.booleans()):
        return Segment(0, draw(st.integers(0, 10_000)), draw(st.integers(0, 500)), 0, operator=True)
    lo = draw(st.integers(0, NUM_KEY_GROUPS - 1))
    hi = draw(st.integers(lo, min(NUM_KEY_GROUPS - 1, lo + draw(st.sampled_from([0, 3, 40, 127])))))
    return Segment(0, draw(st.integers(0, 100_000)), draw(st.integers(0, 5_000)), 0, lo, hi)


@st.composite
def manifests(draw) -> Manifest:
    cuts = sorted(draw(st.sets(st.integers(1, NUM_KEY_GROUPS - 1), max_size=7)))
    bounds = list(zip([0, *cuts], [c - 1 for c in cuts] + [NUM_KEY_GROUPS - 1], strict=True))
    files, parts = [], []
    for i, (lo, hi) in enumerate(bounds):
        layers = []
        for j in range(draw(st.integers(1, 3))):
            segs = tuple(s for s in draw(st.lists(segments(), max_size=6)) if s.operator or (lo <= s.kg_lo and s.kg_hi <= hi))
            path = f"data/{i}-{j}.arrow"
            size, rows = sum(s.length for s in segs), sum(s.rows for s in segs)
            files.append(DataFile(path, "base", lo, hi, rows, size, "0" * 64, segs, as_of=draw(st.integers(1, 4))))
            layers.append((path,))
        parts.append(Part(lo, hi, 1, 0, tuple(layers)))
    return Manifest(MANIFEST_FORMAT, "j", 2, 1, 0, (), "", tuple(parts), tuple(files))


def expected_subtask(m: Manifest, part: Part) -> tuple[int, int]:
    """Rows and bytes of a part, summed segment by segment: its keyed segments' shares of its groups, plus its operator state."""
    rows = size = 0.0
    for f in m.files:
        for seg in f.segments:
            if seg.operator:
                continue
            inside = max(0, min(seg.kg_hi, part.kg_hi) - max(seg.kg_lo, part.kg_lo) + 1)
            width = seg.kg_hi - seg.kg_lo + 1
            rows += seg.rows * inside / width
            size += seg.length * inside / width
    own = [m.file(p) for layer in part.layers for p in layer]
    op_rows = sum(s.rows for f in own for s in f.segments if s.operator)
    op_bytes = sum(s.length for f in own for s in f.segments if s.operator)
    if all(len(p.layers) == 1 for p in m.parts) and part.layers[0][0] != newest_base(m):
        op_rows = op_bytes = 0  # one base per part, as compaction writes: readers take the operator state of the newest only
    return round(rows) + op_rows, round(size) + op_bytes


def newest_base(m: Manifest) -> str:
    """The base a reader takes the operator state from: the first, in part order, of the newest checkpoint."""
    bases = [m.file(x) for p in m.parts for layer in p.layers for x in layer]
    return next(f.path for f in bases if f.as_of == max(b.as_of or 0 for b in bases))


@settings(max_examples=200, deadline=None)
@given(manifests())
def test_subtask_rows_and_bytes_are_the_sum_of_their_segments(m: Manifest) -> None:
    doc = anatomy(m)
    parts = sorted(m.parts, key=lambda p: p.kg_lo)
    assert [(s["kg_lo"], s["kg_hi"]) for s in doc["subtasks"]] == [(p.kg_lo, p.kg_hi) for p in parts]
    for sub, part in zip(doc["subtasks"], parts, strict=True):
        rows, size = expected_subtask(m, part)
        assert abs(sub["rows"] - rows) <= 1 and abs(sub["bytes"] - size) <= 1, (sub, rows, size)
    if any(len(p.layers) > 1 for p in m.parts):  # every layer stored counts
        assert abs(sum(s["bytes"] for s in doc["subtasks"]) - m.total_bytes) <= len(parts)
    assert doc["rows_counted"] == ("live" if all(len(p.layers) == 1 for p in m.parts) else "stored")


def test_a_manifest_without_keyed_segments_has_zero_rows_per_subtask() -> None:
    only_ops = DataFile("data/a.arrow", "base", 0, 127, 3, 30, "0" * 64, (Segment(0, 30, 3, 0, operator=True),))
    m = Manifest(MANIFEST_FORMAT, "j", 1, 0, 0, (), "", (Part(0, 127, 1, 0, (("data/a.arrow",),)),), (only_ops,))
    assert [(s["rows"], s["bytes"], s["operator_state_rows"]) for s in anatomy(m)["subtasks"]] == [(3, 30, 3)]
