"""Property: any history of rescales, rewinds that reuse ids, compactions and deltas reads as a dict model says.

Built not to mask what the earlier randomized tests hid: deltas may be keyed-only, empty, or operator-state only;
operator state is erased as often as written; few keys, so folds come out empty; rewinds reuse checkpoint ids; splits
halve and double (4 -> 2 -> 4 -> 2), so parts share files across shapes.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import snapshot as s
from pool.core import PoolCore
from pool.domain import CommitRequest, KeyGroupRange, PoolConfig
from pool.lifecycle import Lifecycle
from store.checkpoint import CheckpointReader
from store.memory import MemoryStore
from tests.pool_core_helpers import changelog

OPS = (s.operator_id("counter"), s.operator_id("window"))
KEYED = [s.encode_keyed_key("v", f"k{i}".encode()) for i in range(10)]
OPERATOR = [s.encode_operator_key("o", f"o{i}".encode()) for i in range(2)]
Model = dict[tuple[int, bytes], bytes]


def merged_operator_writes(writes: list[dict]) -> dict:
    """One checkpoint's operator-state writes by several subtasks (lowest key groups first), by the format's rule."""
    out: dict = {}
    for key in {k for w in writes for k in w}:
        puts = [w[key] for w in writes if key in w and w[key] is not None]
        if not puts:
            out[key] = None
        elif all(len(v) == 8 for v in puts):
            out[key] = max(puts, key=lambda v: int.from_bytes(v, "little", signed=True))
        else:
            out[key] = puts[0]
    return out


def ranges_of(shape: tuple[str, int]) -> list[KeyGroupRange]:
    kind, n = shape
    if kind == "even":
        step = 128 // n
        return [KeyGroupRange(i * step, i * step + step - 1) for i in range(n)]
    cuts = sorted({(n * 37 + i * 53) % 127 + 1 for i in range(n - 1)})
    bounds = [0, *cuts, 128]
    return [KeyGroupRange(a, b - 1) for a, b in zip(bounds, bounds[1:], strict=False)]


writes = st.lists(
    st.tuples(st.booleans(), st.integers(0, 9), st.sampled_from(OPS), st.sampled_from(["put8", "puttext", "erase"]), st.integers(-5, 99)),
    max_size=6,
)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("commit"), st.lists(writes, min_size=8, max_size=8)),
        st.tuples(st.just("rescale"), st.sampled_from([("even", 1), ("even", 2), ("even", 4), ("even", 8), ("uneven", 3), ("uneven", 5)]),
                  st.integers(0, 3)),
        st.tuples(st.just("compact"), st.integers(0, 3), st.booleans()),
    ),
    min_size=4,
    max_size=16,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=steps, first=st.sampled_from([("even", 1), ("even", 2), ("even", 4), ("uneven", 3)]))
def test_every_history_reads_as_the_model_says(history, first):
    store = MemoryStore()
    pools = [PoolCore(store, PoolConfig(segment_target_bytes=256, resolved_index_after=-1)) for _ in range(2)]
    life = Lifecycle(store)
    states: dict[int, Model] = {}  # complete checkpoints of the current attempt
    lineage: list[int] = []
    writers = [(kg, pools[0].acquire_writer("j", kg)[0]) for kg in ranges_of(first)]
    parent, state, next_cid = 0, {}, 1
    for n, step in enumerate(history):
        if step[0] == "commit":
            cid = next_cid
            op_writes = []
            new = dict(state)
            for i, (kg, epoch) in enumerate(writers):
                rows, mine = [], {}
                keyed_here = [k for k in KEYED if kg.lo <= k[0] <= kg.hi]
                for operator, idx, op, kind, number in step[1][i % 8]:
                    if operator:
                        key = OPERATOR[idx % len(OPERATOR)]
                    elif keyed_here:
                        key = keyed_here[idx % len(keyed_here)]
                    else:
                        continue
                    value = None if kind == "erase" else number.to_bytes(8, "little", signed=True) if kind == "put8" else f"v{cid}-{number}".encode()
                    rows.append((s.ROW_ERASE, op, key, b"") if value is None else (s.ROW_PUT, op, key, value))
                    if operator:
                        mine[(op, key)] = value
                    elif value is None:
                        new.pop((op, key), None)
                    else:
                        new[(op, key)] = value
                op_writes.append({k: v for k, v in mine.items()})
                request = CommitRequest("j", cid, parent, kg, epoch, "", ())
                pools[(n + i) % 2].commit_checkpoint(request, [changelog(rows)])
            for key, value in merged_operator_writes(op_writes).items():
                if value is None:
                    new.pop(key, None)
                else:
                    new[key] = value
            states[cid], state, parent, next_cid = new, new, cid, cid + 1
            lineage.append(cid)
            check(pools[n % 2], cid, new)
        elif step[0] == "rescale" and lineage:
            back = min(step[2], len(lineage) - 1)
            base = lineage[-1 - back]  # back > 0: a rewind, whose next commits reuse the ids after base
            lineage = lineage[: len(lineage) - back]
            writers = [(kg, pools[1].acquire_writer("j", kg, restore_from=base)[0]) for kg in ranges_of(step[1])]
            state, parent, next_cid = states[base], base, base + 1
            assert CheckpointReader(store, "j").latest() == base  # what the rewind left behind is never latest
        elif step[0] == "compact" and lineage:
            cid = lineage[-1 - min(step[1], len(lineage) - 1)]
            life.compact("j", cid, force=step[2])
            check(pools[0], cid, states[cid])
    for cid in lineage:  # every checkpoint of the attempt that survived reads the same at the end, on a fresh pool
        check(PoolCore(store), cid, states[cid])


def check(core: PoolCore, cid: int, model: Model) -> None:
    """Scan (whole and by ranges) and point reads of checkpoint cid all agree with the model."""
    table, _ = core.scan_table("j", cid, None, [], None)
    got = dict(zip(zip(table.column("op_id").to_pylist(), table.column("key_bytes").to_pylist(), strict=True),
                   table.column("value_bytes").to_pylist(), strict=True))
    assert got == model, f"checkpoint {cid}: scan differs from the model"
    for lo, hi in ((0, 40), (41, 41), (42, 127)):
        part, _ = core.scan_table("j", cid, KeyGroupRange(lo, hi), [], None)
        want = {k: v for k, v in model.items() if k[1][0] >= 128 or lo <= k[1][0] <= hi}
        assert dict(zip(zip(part.column("op_id").to_pylist(), part.column("key_bytes").to_pylist(), strict=True),
                        part.column("value_bytes").to_pylist(), strict=True)) == want
    probe = [(op, k) for op in OPS for k in KEYED + OPERATOR]
    found, values, _ = core.multi_get("j", cid, [p[0] for p in probe], [p[1] for p in probe])
    assert {p: v for p, f, v in zip(probe, found, values, strict=True) if f} == model, f"checkpoint {cid}: point reads differ"
