"""diff_tables against a dict model: every added, removed and changed entry, and the per-(operator, slot) counts."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

import snapshot as s
from clink.tools.state_diff import diff_tables

keys = st.one_of(
    st.builds(s.encode_keyed_key, st.sampled_from(["a", "b", "ключ"]), st.binary(max_size=6)),
    st.builds(s.encode_operator_key, st.sampled_from(["off"]), st.binary(max_size=3)),
    st.binary(max_size=4).filter(lambda k: b"|" not in k[1:]),
)
states = st.dictionaries(st.tuples(st.integers(0, 3), keys), st.binary(max_size=4), max_size=25)


def _table(model: dict) -> pa.Table:
    return pa.table(
        {
            "op_id": pa.array([k[0] for k in model], pa.uint64()),
            "key_bytes": pa.array([k[1] for k in model], pa.binary()),
            "value_bytes": pa.array(list(model.values()), pa.binary()),
        }
    )


@settings(max_examples=150, deadline=None)
@given(states, states, st.data())
def test_diff_matches_dict_model(a: dict, b_extra: dict, data) -> None:
    # B shares part of A (some values changed) and adds its own entries
    shared = data.draw(st.lists(st.sampled_from(sorted(a)), unique=True) if a else st.just([]))
    b = {k: a[k] for k in shared}
    for k in data.draw(st.lists(st.sampled_from(shared), unique=True) if shared else st.just([])):
        b[k] = a[k] + b"*"
    b.update({k: v for k, v in b_extra.items() if k not in a})
    diff = diff_tables(_table(a), _table(b))
    expected = {k: "added" for k in b.keys() - a.keys()}
    expected.update({k: "removed" for k in a.keys() - b.keys()})
    expected.update({k: "changed" for k in a.keys() & b.keys() if a[k] != b[k]})
    entries = diff.entries.to_pylist()
    assert {(e["op_id"], e["key_bytes"]): e["change"] for e in entries} == expected
    assert len(entries) == len(expected)
    for e in entries:
        key = (e["op_id"], e["key_bytes"])
        assert e["value_a"] == a.get(key) and e["value_b"] == b.get(key)
    assert diff.equal == (not expected)
    per_slot = Counter()
    for (op, key), change in expected.items():
        per_slot[(op, s.decode_key(key).slot, change)] += 1
    got = Counter()
    for row in diff.summary.to_pylist():
        for change in ("added", "removed", "changed"):
            if row[change]:
                got[(row["op_id"], row["slot"], change)] = row[change]
    assert got == per_slot
