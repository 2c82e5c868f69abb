"""Import: checkpoint 1 of a new job from a canonical table, folded at parallelism P, against dict models (file store and moto)."""

from __future__ import annotations

import json
import random
from collections import Counter

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import snapshot as s
from pool.core import PoolCore
from pool.domain import KeyGroupRange
from pool.importer import Importer, subtask_ranges, wrong_key_group_rows
from pool.lifecycle import Lifecycle
from snapshot.errors import ConflictError, InvalidArgumentError, UnavailableError
from store.datafile import verify_file
from store.layout import job_file_key, metadata_key, writers_key
from store.manifest import parse_manifest
from store.memory import MemoryStore
from tests.hook_store import HookStore
from tests.lifecycle_helpers import delta_for, scan_checkpoint
from tests.pool_core_helpers import OP_IDS, Model, apply, commit, keys_in_range

SOURCE, WINDOW, SINK = OP_IDS["source"], OP_IDS["window"], OP_IDS["sink"]
NAMED = {op: uid for uid, op in OP_IDS.items()}
EDGE_KEYS = [k.encode() for k in keys_in_range(0, 0, 2, "lo") + keys_in_range(127, 127, 2, "hi")]


def big_model(rng: random.Random, keys: int = 1500, value_bytes: int = 160) -> Model:
    """Keyed rows of three operators in two slots each, and operator-state rows (offsets, a broadcast slot)."""
    model: Model = {}
    users = [f"user-{i}".encode() for i in range(keys)] + EDGE_KEYS
    for op, slots in ((SOURCE, ("seen",)), (WINDOW, ("sum", "count")), (SINK, ("pending",))):
        for slot in slots:
            for u in rng.sample(users, len(users) * 2 // 3):
                model[(op, s.encode_keyed_key(slot, u))] = rng.randbytes(rng.randint(1, value_bytes))
    for p in range(8):
        model[(SOURCE, s.encode_operator_key("offsets", f"partition-{p}".encode()))] = rng.randint(0, 1 << 40).to_bytes(8, "little")
    model[(WINDOW, s.encode_operator_key("rules", b"current"))] = b"rule set 7"
    return model


def table_of(model: Model, rng: random.Random | None = None) -> pa.Table:
    """The model as a canonical table, rows shuffled (an import must not rely on any order)."""
    items = list(model.items())
    if rng is not None:
        rng.shuffle(items)
    return pa.table(
        {
            "op_id": pa.array([op for (op, _), _ in items], pa.uint64()),
            "key_bytes": pa.array([k for (_, k), _ in items], pa.binary()),
            "value_bytes": pa.array([v for _, v in items], pa.binary()),
        }
    )


def listing(store) -> list[tuple[str, bytes]]:
    return sorted((o.key, store.get(o.key)) for o in store.list(""))


BIG = big_model(random.Random(7))


# ---- the layout of an import ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("parallelism", [1, 3, 4, 8])
def test_import_folds_one_file_per_subtask_and_scans_equal_the_model(store, parallelism):
    m = Importer.on_store(store).import_table(
        "orders", table_of(BIG, random.Random(1)), NAMED, s.StateVersionMap({(WINDOW, "sum"): 2}), parallelism, {"note": "test"}
    )
    assert scan_checkpoint(store, "orders", 1) == BIG
    assert (m.job, m.checkpoint_id, m.parent_id) == ("orders", 1, 0)
    stored = parse_manifest(store.get(metadata_key("orders", 1)), "chk-1")
    assert stored == m
    ranges = subtask_ranges(parallelism)
    assert [(p.kg_lo, p.kg_hi) for p in sorted(m.parts, key=lambda p: p.kg_lo)] == ranges
    assert ranges[0][0] == 0 and ranges[-1][1] == 127 and all(a[1] + 1 == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    assert len(m.files) == parallelism
    for part in m.parts:
        assert len(part.layers) == 1 and len(part.layers[0]) == 1
        f = m.file(part.layers[0][0])
        assert (f.kind, f.kg_lo, f.kg_hi, f.as_of) == ("base", part.kg_lo, part.kg_hi, 1)
        keyed = [seg for seg in f.segments if not seg.operator]
        assert all(part.kg_lo <= seg.kg_lo <= seg.kg_hi <= part.kg_hi for seg in keyed)
        groups = part.kg_hi - part.kg_lo + 1
        assert groups // 2 <= len(keyed) <= 2 * groups, (len(keyed), groups)  # about one segment per key group
        assert any(seg.operator for seg in f.segments) == (part.kg_lo == 0)  # operator state: once, with the first subtask
        verify_file(f, store.get(job_file_key("orders", f.path)))
    doc = json.loads(store.get(metadata_key("orders", 1)))
    anatomy = doc["anatomy"]
    assert anatomy["parallelism"] == parallelism and anatomy["rows_counted"] == "live" and anatomy["operators_counted"] is True
    per_op = Counter(op for op, _ in BIG)
    assert {o["op_id"]: o["rows"] for o in anatomy["operators"]} == dict(per_op)
    assert {o["op_id"]: o["uid"] for o in anatomy["operators"]} == NAMED
    window = next(o for o in anatomy["operators"] if o["op_id"] == WINDOW)
    slots = {st["slot"]: st["rows"] for st in window["states"]}
    assert slots == dict(Counter(s.decode_key(k).slot for op, k in BIG if op == WINDOW))
    assert window["state_versions"] == [{"state_type": "sum", "version": 2}]
    assert len(anatomy["subtasks"]) == parallelism and sum(t["rows"] for t in anatomy["subtasks"]) == len(BIG)
    origin = doc["restored_from"]
    assert origin["kind"] == "import" and origin["imported_from"] == "a table" and origin["note"] == "test"
    assert origin["rows"] == len(BIG) and origin["parallelism"] == parallelism
    assert store.exists(writers_key("orders"))


def test_workers_of_another_parallelism_commit_on_top_of_an_import(store):
    Importer.on_store(store).import_table("orders", table_of(BIG), NAMED, None, 3)
    core = PoolCore(store)
    quarters = [KeyGroupRange(32 * i, 32 * i + 31) for i in range(4)]
    acquired = [core.acquire_writer("orders", kg) for kg in quarters]
    assert all(latest == 1 for _, latest in acquired)
    model = dict(BIG)
    rng = random.Random(3)
    for cid in (2, 3):
        for i, kg in enumerate(quarters):
            rows = delta_for(rng, model, kg, 20, 100 + cid, op_rows=i == 0, op_erase=False)
            apply(model, rows)
            commit(core, "orders", cid, cid - 1, kg, acquired[i][0], rows)
    assert scan_checkpoint(store, "orders", 3) == model
    for lo in (0, 32, 64, 96):
        expected = {k: v for k, v in model.items() if k[1][0] >= 128 or lo <= k[1][0] <= lo + 31}
        assert scan_checkpoint(store, "orders", 3, (lo, lo + 31)) == expected
    # a savepoint of the new job restores like any other
    life = Lifecycle(store)
    life.savepoint("orders", 3, "after-import")
    life.restore_job("orders-v2", savepoint="after-import")
    assert scan_checkpoint(store, "orders-v2", 1) == model


def test_an_empty_table_makes_a_job_of_empty_state(file_store):
    m = Importer.on_store(file_store).import_table("fresh", s.empty_table(), {SOURCE: "source"}, None, 4)
    assert len(m.parts) == 4 and not m.files and all(not p.layers for p in m.parts)
    assert scan_checkpoint(file_store, "fresh", 1) == {}
    anatomy = json.loads(file_store.get(metadata_key("fresh", 1)))["anatomy"]
    assert anatomy["parallelism"] == 4 and [o["uid"] for o in anatomy["operators"]] == ["source"]
    core = PoolCore(file_store)
    epoch, latest = core.acquire_writer("fresh", KeyGroupRange(0, 127))
    commit(core, "fresh", 2, 1, KeyGroupRange(0, 127), epoch, [(s.ROW_PUT, SOURCE, s.encode_keyed_key("v", b"a"), b"1")])
    assert latest == 1 and scan_checkpoint(file_store, "fresh", 2) == {(SOURCE, s.encode_keyed_key("v", b"a")): b"1"}


def test_progress_counts_the_subtasks_written(file_store):
    seen: list[tuple[int, int]] = []
    Importer.on_store(file_store).import_table("j", table_of(BIG), None, None, 4, progress=lambda done, total: seen.append((done, total)))
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]


# ---- the property --------------------------------------------------------------------------------------------------


_entry = st.tuples(
    st.sampled_from([SOURCE, WINDOW, SINK, 0, (1 << 64) - 1]),
    st.sampled_from(["keyed", "keyed", "operator"]),
    st.sampled_from(["v", "w", ""]),
    st.one_of(st.binary(max_size=12), st.sampled_from(EDGE_KEYS)),
    st.binary(max_size=24),
)


def _model_of(entries: list[tuple[int, str, str, bytes, bytes]]) -> Model:
    return {
        (op, s.encode_keyed_key(slot, user) if kind == "keyed" else s.encode_operator_key(slot, user)): value
        for op, kind, slot, user, value in entries
    }


@settings(max_examples=60, deadline=None)
@given(model=st.lists(_entry, max_size=80).map(_model_of), parallelism=st.integers(1, 128), seed=st.integers(0, 2**16))
def test_property_import_then_scan_equals_the_model(model, parallelism, seed):
    store = MemoryStore("import")
    m = Importer.on_store(store).import_table("p", table_of(model, random.Random(seed)), None, None, parallelism)
    assert scan_checkpoint(store, "p", 1) == model
    assert [(p.kg_lo, p.kg_hi) for p in sorted(m.parts, key=lambda p: p.kg_lo)] == subtask_ranges(parallelism)
    assert sum(f.rows for f in m.files) == len(model)
    for f in m.files:
        verify_file(f, store.get(job_file_key("p", f.path)))


def test_subtask_ranges_are_the_even_split():
    assert subtask_ranges(1) == [(0, 127)]
    assert subtask_ranges(3) == [(0, 41), (42, 84), (85, 127)]
    assert subtask_ranges(128) == [(i, i) for i in range(128)]
    for p in range(1, 129):
        r = subtask_ranges(p)
        assert len(r) == p and r[0][0] == 0 and r[-1][1] == 127 and all(a[1] + 1 == b[0] for a, b in zip(r, r[1:], strict=False))


def test_wrong_key_group_rows_agrees_with_the_scalar_hash():
    rng = random.Random(5)
    keys, truth = [], []
    for _ in range(2000):
        user = rng.randbytes(rng.randint(0, 20))
        key = s.encode_keyed_key(rng.choice(["v", "slot"]), user)
        bad = rng.random() < 0.1
        keys.append(bytes([(key[0] + 1) % 128]) + key[1:] if bad else key)
        truth.append(bad)
    keys += [s.encode_operator_key("o", b"x"), b"", b"\x05", b"\x05raw-no-separator"]  # no key group: never wrong
    truth += [False] * 4
    array = pa.array(keys, pa.binary())
    for offset in (0, 3, 1500):
        mask, expected = wrong_key_group_rows(pa.chunked_array([array.slice(offset, 100), array.slice(offset + 100)]))
        assert mask.tolist() == truth[offset:]
    mask, expected = wrong_key_group_rows(array)
    assert int(expected[0]) == s.key_group(s.decode_key(keys[0]).user_key)


# ---- refusals: each leaves the store exactly as it was ----------------------------------------------------------


def _bad_key_group_table() -> pa.Table:
    model = dict(list(BIG.items())[:50])
    key = s.encode_keyed_key("v", b"misplaced")
    model[(SINK, bytes([(key[0] + 5) % 128]) + key[1:])] = b"x"
    return table_of(model)


def _duplicate_table() -> pa.Table:
    t = table_of(dict(list(BIG.items())[:20]))
    return pa.concat_tables([t, t.slice(3, 2)])


REFUSALS = {
    "job exists": (lambda: ("orders", table_of(BIG), None, 2), ConflictError, "job orders already exists in"),
    "wrong key-group byte": (lambda: ("new", _bad_key_group_table(), None, 2), InvalidArgumentError, "1 keyed row(s) carry a key-group"),
    "duplicate keys": (lambda: ("new", _duplicate_table(), None, 2), InvalidArgumentError, "2 duplicate (op_id, key) row(s)"),
    "parallelism 0": (lambda: ("new", table_of(BIG), None, 0), InvalidArgumentError, "parallelism 0 must be"),
    "parallelism 129": (lambda: ("new", table_of(BIG), None, 129), InvalidArgumentError, "parallelism 129 must be"),
    "parallelism True": (lambda: ("new", table_of(BIG), None, True), InvalidArgumentError, "parallelism True must be"),
    "bad job name": (lambda: ("../x", table_of(BIG), None, 2), InvalidArgumentError, "job id"),
    "uid of another op_id": (lambda: ("new", table_of(BIG), {SOURCE: "window"}, 2), InvalidArgumentError, "operator uid 'window'"),
    "a changelog table": (
        lambda: ("new", s.read_snapshot(s.write_snapshot(s.empty_table(True), changelog=True)).table, None, 2),
        InvalidArgumentError,
        "row_kind",
    ),
    "null values": (
        lambda: (
            "new",
            pa.table({"op_id": pa.array([1], pa.uint64()), "key_bytes": [b"\xff|a"], "value_bytes": pa.array([None], pa.binary())}),
            None,
            1,
        ),
        InvalidArgumentError,
        "null",
    ),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_refused_imports_change_nothing(store, case):
    Importer.on_store(store).import_table("orders", table_of(BIG), NAMED, None, 2)
    before = listing(store)
    make, error, text = REFUSALS[case]
    job, table, operators, parallelism = make()
    with pytest.raises(error, match=None) as info:
        Importer.on_store(store).import_table(job, table, operators, None, parallelism)
    assert text in str(info.value), str(info.value)
    assert listing(store) == before


def test_a_wrong_key_group_is_refused_naming_an_example(file_store):
    with pytest.raises(InvalidArgumentError) as info:
        Importer.on_store(file_store).import_table("new", _bad_key_group_table(), None, None, 4)
    message = str(info.value)
    key = s.encode_keyed_key("v", b"misplaced")
    assert f"key_bytes 0x{bytes([(key[0] + 5) % 128]).hex()}" in message and f"its key group is {key[0]}" in message
    assert "nothing was written" in message and "\n" not in message
    assert list(file_store.list("")) == []


def test_a_job_of_the_pool_is_never_replaced(file_store):
    core = PoolCore(file_store)
    epoch, _ = core.acquire_writer("live", KeyGroupRange(0, 127))
    before = listing(file_store)
    with pytest.raises(ConflictError, match="give a new job name"):
        Importer.on_store(file_store).import_table("live", table_of(BIG), None, None, 1)
    assert listing(file_store) == before


def test_of_two_concurrent_imports_into_one_name_one_writes_nothing(file_store):
    hooked = HookStore(file_store)
    # the other import claims the name between our check and our claim
    hooked.on("put_if_absent", "writers", lambda: file_store.put_if_absent(writers_key("j"), b'{"other": true}'))
    with pytest.raises(ConflictError, match="created concurrently .* this import wrote nothing"):
        Importer.on_store(hooked).import_table("j", table_of(BIG), None, None, 4)
    assert [o.key for o in file_store.list("")] == [writers_key("j")]


@pytest.mark.parametrize("where", ["data/", "parts/", "_metadata"])
def test_a_failure_after_the_claim_removes_everything_written(file_store, where):
    Importer.on_store(file_store).import_table("other", table_of(BIG), None, None, 1)
    before = listing(file_store)
    hooked = HookStore(file_store)

    def fail() -> None:
        raise UnavailableError("the store went away")

    # the third file or part, or the _metadata: some of the import is written by then
    hooked.on("put_if_absent", lambda key, w=where: key.startswith("jobs/j/") and w in key, fail, skip=0 if where == "_metadata" else 2)
    with pytest.raises(UnavailableError, match="went away"):
        Importer.on_store(hooked).import_table("j", table_of(BIG), None, None, 4)
    assert listing(file_store) == before
    Importer.on_store(file_store).import_table("j", table_of(BIG), None, None, 4)  # the name is free again
    assert scan_checkpoint(file_store, "j", 1) == BIG


def test_a_metadata_put_whose_answer_was_lost_still_completes(file_store):
    hooked = HookStore(file_store)

    def lost() -> None:
        raise UnavailableError("timed out reading the answer")

    hooked.on("put_if_absent", "chk-1/_metadata", lost, when="after")
    Importer.on_store(hooked).import_table("j", table_of(BIG), None, None, 2)
    assert scan_checkpoint(file_store, "j", 1) == BIG


def test_refuse_existing_checks_the_name_first(file_store):
    importer = Importer(Lifecycle(file_store).context)
    assert importer.refuse_existing("fresh") == "fresh"
    with pytest.raises(InvalidArgumentError):
        importer.refuse_existing("a/b/c")
    Importer.on_store(file_store).import_table("fresh", s.empty_table(), None, None, 1)
    with pytest.raises(ConflictError, match="import only creates new jobs"):
        importer.refuse_existing("fresh")
