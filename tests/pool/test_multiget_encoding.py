"""The MultiGet read path's bulk shortcuts give exactly what the plain versions give: wire bytes, key hashes, index probes."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from pool.wire import encode_multi_get_response
from protos import remote_pool_pb2 as pb
from snapshot.key_index import KeyIndex, hash_keys

values_lists = st.one_of(
    st.lists(st.binary(max_size=40), max_size=60),  # mixed widths, empty values among them
    st.integers(0, 40).flatmap(lambda w: st.lists(st.binary(min_size=w, max_size=w), max_size=60)),  # one width
    st.lists(st.sampled_from([b"", b"x" * 32, b"y" * 200, b"z" * 20000]), max_size=40),  # multi-byte length varints, few runs
)


@settings(max_examples=150, deadline=None)
@given(values=values_lists, checkpoint_id=st.one_of(st.just(0), st.integers(1, 2**64 - 1)), data=st.data())
def test_encoded_response_is_what_protobuf_writes(values: list[bytes], checkpoint_id: int, data: st.DataObject) -> None:
    found = data.draw(st.lists(st.booleans(), min_size=len(values), max_size=len(values)))
    array = pa.array(values, pa.binary())
    expected = pb.MultiGetResponse(found=found, values=values, checkpoint_id=checkpoint_id)
    encoded = encode_multi_get_response(np.array(found, dtype=bool), array, checkpoint_id)
    assert encoded == expected.SerializeToString()
    assert pb.MultiGetResponse.FromString(encoded) == expected


def test_encoding_a_sliced_array_and_many_runs() -> None:
    values = [bytes([i % 7]) * (i % 5) for i in range(300)]  # far more width changes than the run path takes
    array = pa.array([b"skip"] + values, pa.binary()).slice(1)
    found = np.array([len(v) > 0 for v in values])
    expected = pb.MultiGetResponse(found=found.tolist(), values=values, checkpoint_id=7).SerializeToString()
    assert encode_multi_get_response(found, array, 7) == expected


@settings(max_examples=60, deadline=None)
@given(width=st.integers(1, 300), n=st.integers(1, 80), seed=st.integers(0, 2**32 - 1))
def test_equal_width_hashes_match_the_mixed_width_path(width: int, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    keys = [bytes(rng.integers(0, 256, width, dtype=np.uint8)) for _ in range(n)]
    ops = rng.integers(0, 2**63, n, dtype=np.uint64)
    one_width = hash_keys(ops, pa.array(keys, pa.binary()))
    # one key of another width sends the block through the general (gather + reduceat) path
    mixed = hash_keys(np.concatenate([ops, np.array([1], np.uint64)]), pa.array([*keys, b"\x01" * (width + 1)], pa.binary()))
    assert one_width.tolist() == mixed[:n].tolist()


@settings(max_examples=60, deadline=None)
@given(
    rows=st.dictionaries(st.tuples(st.integers(0, 3), st.binary(min_size=1, max_size=6)), st.binary(max_size=8), max_size=40),
    queries=st.lists(st.tuples(st.integers(0, 3), st.binary(min_size=1, max_size=6)), max_size=40),
    collide=st.booleans(),
)
def test_index_find_agrees_with_a_dict(rows: dict, queries: list, collide: bool) -> None:
    table = pa.table(
        {
            "op_id": pa.array([k[0] for k in rows], pa.uint64()),
            "key_bytes": pa.array([k[1] for k in rows], pa.binary()),
            "value_bytes": pa.array(list(rows.values()), pa.binary()),
        }
    )
    index = KeyIndex.build(table)
    q_ops = np.array([q[0] for q in queries], dtype=np.uint64)
    q_keys = pa.array([q[1] for q in queries], pa.binary())
    q_hash = hash_keys(q_ops, q_keys)
    if collide:  # every hash equal: find must walk the equal hashes and compare keys
        index = KeyIndex(index.table, np.zeros(len(rows), np.uint64), np.arange(len(rows)))
        q_hash = np.zeros(len(queries), np.uint64)
    pos = index.find(q_hash, q_keys, q_ops)
    values = index.table.column("value_bytes").to_pylist()
    assert [values[p] if p >= 0 else None for p in pos] == [rows.get(q) for q in queries]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 3000), seed=st.integers(0, 2**32 - 1), repeats=st.integers(0, 20))
def test_bucketed_probe_is_searchsorted(n: int, seed: int, repeats: int) -> None:
    rng = np.random.default_rng(seed)
    hashes = rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)
    hashes[: min(repeats, n)] = hashes[0]  # runs of equal hashes (collisions) and the extremes
    hashes = np.sort(np.concatenate([hashes, np.array([0, 2**64 - 1], np.uint64)]))
    index = KeyIndex(pa.table({"op_id": pa.array([], pa.uint64())}), hashes, np.arange(len(hashes)))
    queries = np.concatenate([hashes[rng.integers(0, len(hashes), 200)], rng.integers(0, 2**64 - 1, 200, dtype=np.uint64, endpoint=True)])
    assert index._first_at_least(queries).tolist() == np.searchsorted(hashes, queries, side="left").tolist()
