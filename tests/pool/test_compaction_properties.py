"""Property: compaction (and a savepoint's fold) answers every scan and point read exactly as the layers did, across rescales."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import snapshot as s
from pool.core import PoolCore
from pool.domain import KeyGroupRange
from pool.lifecycle import Lifecycle
from store.local import FileStore
from store.segment_cache import SegmentCache
from tests.pool_core_helpers import OP_IDS, commit, keyed, keys_in_range, op_key

UNIVERSE = keys_in_range(0, 127, 300)


def split(cuts: list[int]) -> list[KeyGroupRange]:
    bounds = [0, *sorted(set(cuts)), 128]
    return [KeyGroupRange(a, b - 1) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


def rows_for(rng: random.Random, kg: KeyGroupRange, n: int, step: int) -> list:
    inside = [k for k in UNIVERSE if kg.lo <= s.key_group(k.encode()) <= kg.hi]
    out = []
    for j in range(n):
        op = OP_IDS[rng.choice(list(OP_IDS))]
        key = op_key(f"o{rng.randint(0, 4)}") if rng.random() < 0.15 or not inside else keyed(rng.choice(inside))
        if rng.random() < 0.25:
            out.append((s.ROW_ERASE, op, key, b""))
        else:
            value = rng.randint(0, 1000).to_bytes(8, "little") if rng.random() < 0.5 else f"v{step}-{j}".encode()
            out.append((s.ROW_PUT, op, key, value))
    return out


def table_dict(table) -> dict:
    keys = zip(table.column("op_id").to_pylist(), table.column("key_bytes").to_pylist(), strict=True)
    return dict(zip(keys, table.column("value_bytes").to_pylist(), strict=True))


def reads(store, job: str, cid: int, ranges: list[tuple[int, int]]) -> dict:
    life = Lifecycle(store, cache=SegmentCache(32 << 20))
    reader, manifest, _ = life.open_checkpoint(job, cid)
    out = {r: table_dict(life.read_table(reader, manifest, r)) for r in ranges}
    probe = [keyed(k) for k in UNIVERSE[::7]] + [op_key(f"o{i}") for i in range(5)]
    for op in OP_IDS.values():
        found, values = reader.lookup(manifest, [op] * len(probe), probe)
        out[("get", op)] = (found.tolist(), values)
    return out


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    plan=st.lists(st.tuples(st.lists(st.integers(1, 127), max_size=3), st.integers(0, 20)), min_size=2, max_size=7),
    seed=st.integers(0, 2**16),
    ranges=st.lists(st.tuples(st.integers(0, 127), st.integers(0, 127)).map(lambda t: (min(t), max(t))), min_size=1, max_size=3),
)
def test_compaction_and_fold_answer_as_the_layers_did(tmp_path_factory, plan, seed, ranges):
    store = FileStore(tmp_path_factory.mktemp("compaction"))
    core = PoolCore(store)
    rng = random.Random(seed)
    for cid, (cuts, n) in enumerate(plan, start=1):
        writers = [(kg, core.acquire_writer("j", kg)[0]) for kg in split(cuts)]  # a new split fences the old writers: a rescale
        for kg, epoch in writers:
            commit(core, "j", cid, cid - 1, kg, epoch, rows_for(rng, kg, n, cid))
    last = len(plan)
    ranges = [(0, 127), *ranges]
    before = {cid: reads(store, "j", cid, ranges) for cid in range(1, last + 1)}
    life = Lifecycle(store)
    life.savepoint("j", last, "sp")
    sp_reader, sp_manifest, _ = Lifecycle(store, cache=SegmentCache(32 << 20)).open_savepoint("sp")
    for r in ranges:
        assert table_dict(sp_reader.read_manifest_table(sp_manifest, r)) == before[last][r]
    for cid in range(1, last + 1):
        life.compact("j", cid, force=True)
        _, compacted, _ = life.open_checkpoint("j", cid)
        assert all(len(p.layers) <= 1 for p in compacted.parts)
    for cid in range(1, last + 1):
        assert reads(store, "j", cid, ranges) == before[cid]
