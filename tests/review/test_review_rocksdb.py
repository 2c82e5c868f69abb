"""Hostile review of the local RocksDB backend, rocksdb:// sources and the ListState/MapState collection views (d232598)."""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import snapshot as s
from client.rocksdb_backend import (
    RocksDBConfig,
    RocksDBStateBackend,
    read_rocksdb_checkpoint,
    rocksdb_checkpoint_to_arrow,
)
from client.typed import ListState, MapState, TtlState
from clink.cli.state import cli as clink_cli
from clink.tools.sources import load_source, parse_source
from snapshot.collections import decode_list, decode_map, encode_list, encode_map
from snapshot.errors import ClinkError, ConflictError, CorruptDataError, InvalidArgumentError, NotFoundError

Model = dict[tuple[int, bytes], bytes]


# --- helpers (copied, tests do not import other test modules) -------------------------------------------


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def table_dict(table: pa.Table) -> Model:
    keys = zip(table.column("op_id").to_pylist(), table.column("key_bytes").to_pylist(), strict=True)
    out = dict(zip(keys, table.column("value_bytes").to_pylist(), strict=True))
    assert len(out) == table.num_rows, "a key appears twice"
    return out


def rows(table: pa.Table) -> list[tuple[int, bytes, bytes]]:
    return list(
        zip(table.column("op_id").to_pylist(), table.column("key_bytes").to_pylist(), table.column("value_bytes").to_pylist(), strict=True)
    )


def in_order(model: Model) -> list[tuple[int, bytes, bytes]]:
    return [(op, key, value) for (op, key), value in sorted(model.items())]


def invoke(group, *args: str):
    return CliRunner().invoke(group, list(args), catch_exceptions=False)


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text.strip(), text
    return text


def damaged_dir(where: Path) -> Path:
    """A directory whose CURRENT names an existing MANIFEST that is garbage."""
    where.mkdir()
    (where / "CURRENT").write_bytes(b"MANIFEST-000001\n")
    (where / "MANIFEST-000001").write_bytes(b"garbage" * 10)
    return where


class Clock:
    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


class CountingBackend:
    """A RocksDBStateBackend wrapper counting writes, to see read-modify-writes that should write nothing."""

    def __init__(self, inner: RocksDBStateBackend) -> None:
        self.inner = inner
        self.writes = 0

    def register_operator(self, uid: str) -> int:
        return self.inner.register_operator(uid)

    def put(self, op_id: int, key_bytes: bytes, value: bytes) -> None:
        self.writes += 1
        self.inner.put(op_id, key_bytes, value)

    def erase(self, op_id: int, key_bytes: bytes) -> None:
        self.writes += 1
        self.inner.erase(op_id, key_bytes)

    def get(self, op_id: int, key_bytes: bytes) -> bytes | None:
        return self.inner.get(op_id, key_bytes)

    def get_many(self, op_id: int, keys):
        return self.inner.get_many(op_id, keys)


# op ids at both ends of uint64 and either side of the sign bit
OPS = [0, 1, 0xFF, 0x0100, 0x7FFF_FFFF_FFFF_FFFF, 0x8000_0000_0000_0000, (1 << 64) - 1]
KEYS = [bytes([g]) + tail for g in (0, 3, 64, 127, 0xFF) for tail in (b"", b"\x00", b"a", b"a\x00", b"\xff")]


# --- defects --------------------------------------------------------------------------------------------


def test_backend_open_of_a_damaged_directory_leaves_it_as_it_was(tmp_path: Path) -> None:
    where = damaged_dir(tmp_path / "damaged")
    before = listing(where)
    with pytest.raises(CorruptDataError) as info:
        RocksDBStateBackend(where)
    assert str(where) in one_line(info.value)
    assert listing(where) == before


def test_from_checkpoint_failure_leaves_no_directories(tmp_path: Path) -> None:
    with RocksDBStateBackend(tmp_path / "db") as backend:
        backend.put(1, b"\x01s|k", b"v")
        checkpoint = backend.create_checkpoint(tmp_path / "chk")
    restore = tmp_path / "restores"
    with pytest.raises(InvalidArgumentError):
        RocksDBStateBackend.from_checkpoint(checkpoint, restore / "nested" / "db", RocksDBConfig(compression="bogus"))
    assert not restore.exists(), listing(restore)


def test_rows_in_unknown_column_families_are_not_silently_dropped(tmp_path: Path) -> None:
    from rocksdict import Options, Rdict

    db = Rdict(str(tmp_path / "other"), Options(raw_mode=True))
    family = db.create_column_family("orders", Options(raw_mode=True))
    family[(7).to_bytes(8, "big") + b"\x05s|k"] = b"an order"
    db.close()
    try:
        state = read_rocksdb_checkpoint(tmp_path / "other")
    except ClinkError as exc:  # refusing it, naming the family, is a fix
        assert "orders" in one_line(exc)
        return
    assert state.table.num_rows == 1, "a row in column family 'orders' vanished"


def test_put_many_refuses_str_elements_as_put_does(tmp_path: Path) -> None:
    with RocksDBStateBackend(tmp_path / "db") as backend:
        with pytest.raises(InvalidArgumentError):
            backend.put(1, "\x01k", b"v")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError):
            backend.put_many(1, [b"\x01a", "\x01k"], [b"v", b"w"])
        assert backend.get(1, b"\x01k") is None and backend.get(1, b"\x01a") is None


def test_checkpoint_of_a_narrowed_backend_renders_what_its_export_does(tmp_path: Path) -> None:
    with RocksDBStateBackend(tmp_path / "full") as full:
        for g in (3, 64, 100):
            full.put(1, bytes([g]) + b"s|k", b"old")
        full.put(1, b"\xffop|", b"operator")
        checkpoint = full.create_checkpoint(tmp_path / "chk")
    narrowed = RocksDBStateBackend.from_checkpoint(checkpoint, tmp_path / "low", RocksDBConfig(key_groups=(0, 63)))
    with narrowed:
        narrowed.put(1, b"\x03s|k", b"new")
        with pytest.raises(InvalidArgumentError):
            narrowed.put(1, b"\x64s|k", b"can't")  # group 100 is not this backend's
        exported = table_dict(s.read_snapshot(narrowed.export_arrow_snapshot()).table)
        assert exported == {(1, b"\x03s|k"): b"new", (1, b"\xffop|"): b"operator"}
        own = narrowed.create_checkpoint(tmp_path / "low-chk")
    assert table_dict(s.read_snapshot(rocksdb_checkpoint_to_arrow(own)).table) == exported


# --- properties that hold -------------------------------------------------------------------------------


def test_export_order_is_unsigned_op_id_then_key_bytes_and_equals_checkpoint_and_model(tmp_path: Path) -> None:
    rng = random.Random(17)
    model: Model = {}
    with RocksDBStateBackend(tmp_path / "db") as backend:
        for _ in range(400):
            op, key = rng.choice(OPS), rng.choice(KEYS)
            if rng.random() < 0.25:
                backend.erase(op, key)
                model.pop((op, key), None)
            else:
                value = rng.randbytes(rng.randrange(0, 5))
                backend.put(op, key, value)
                model[(op, key)] = value
        exported = s.read_snapshot(backend.export_arrow_snapshot()).table
        checkpoint = backend.create_checkpoint(tmp_path / "chk")
    assert rows(exported) == in_order(model)  # the order itself, not just the set
    assert rows(s.read_snapshot(rocksdb_checkpoint_to_arrow(checkpoint)).table) == in_order(model)
    with RocksDBStateBackend(tmp_path / "db") as reopened:  # erases survive a reopen
        assert rows(s.read_snapshot(reopened.export_arrow_snapshot()).table) == in_order(model)
        for op, key in [(op, key) for op in OPS for key in KEYS]:
            assert reopened.get(op, key) == model.get((op, key))


def test_put_many_last_write_wins_and_get_many_keeps_order_and_duplicates(tmp_path: Path) -> None:
    k1, k2, gone = b"\x05s|a", b"\x05s|b", b"\x05s|zz"
    with RocksDBStateBackend(tmp_path / "db") as backend:
        assert backend.put_many(9, [k1, k2, k1, k1], [b"1", b"2", b"3", b"4"]) == 4
        assert backend.get_many(9, [k2, gone, k1, k2]) == [b"2", None, b"4", b"2"]
        assert backend.get_many(9, []) == []
        table = s.read_snapshot(backend.export_arrow_snapshot()).table
    assert rows(table) == [(9, k1, b"4"), (9, k2, b"2")]


def test_writes_outside_the_range_are_refused_and_change_nothing(tmp_path: Path) -> None:
    with RocksDBStateBackend(tmp_path / "db", RocksDBConfig(key_groups=(10, 20))) as backend:
        backend.put(1, b"\x0as|ok", b"v")
        for bad in (b"\x09s|k", b"\x15s|k", b"\x7fs|k"):
            for call in (
                lambda k=bad: backend.put(1, k, b"x"),
                lambda k=bad: backend.erase(1, k),
                lambda k=bad: backend.get(1, k),
                lambda k=bad: backend.get_many(1, [b"\x0as|ok", k]),
                lambda k=bad: backend.put_many(1, [b"\x0bs|new", k], [b"x", b"y"]),
            ):
                with pytest.raises(InvalidArgumentError) as info:
                    call()
                assert "outside this backend's range 10-20" in one_line(info.value)
        backend.put(1, b"\xffop|", b"operator state belongs to every range")
        assert table_dict(s.read_snapshot(backend.export_arrow_snapshot()).table) == {
            (1, b"\x0as|ok"): b"v",
            (1, b"\xffop|"): b"operator state belongs to every range",
        }


def test_metadata_cannot_collide_with_state_and_versions_uids_ttl_round_trip(tmp_path: Path) -> None:
    clock = Clock()
    with RocksDBStateBackend(tmp_path / "db", RocksDBConfig(clock_ms=clock)) as backend:
        op = backend.register_operator("sink ünï")
        backend.set_state_version(op, "ValueState", 3)
        backend.set_state_version((1 << 64) - 1, "ListState", 0xFFFFFFFF)
        # a state key spelling the metadata key, under op_id 0 and every 8-byte prefix of "layout"
        backend.put(0, b"layout", b"not metadata")
        backend.put(int.from_bytes(b"\x00\x00layou", "big"), b"t", b"nor this")
        ttl = TtlState(backend, op, "sessions", ttl_ms=100)
        ttl.put(b"u1", b"soon gone")
        backend.put(op, s.encode_keyed_key("plain", b"u1"), b"stays")
        versions = backend.state_versions
        checkpoint = backend.create_checkpoint(tmp_path / "chk")
    clock.now += 100  # expire-at <= now is expired
    with RocksDBStateBackend(tmp_path / "db", RocksDBConfig(clock_ms=clock)) as reopened:
        assert reopened.operators == {op: "sink ünï"} and reopened.state_versions == versions
        snap = s.read_snapshot(reopened.export_arrow_snapshot())
        assert TtlState(reopened, op, "sessions", ttl_ms=100).get(b"u1") is None
    exported = table_dict(snap.table)
    assert s.encode_keyed_key("sessions", b"u1") not in {k for _, k in exported}  # the TTL slot came back from disk
    assert exported[(0, b"layout")] == b"not metadata" and len(exported) == 3
    assert snap.state_versions == versions
    state = read_rocksdb_checkpoint(checkpoint)
    assert state.operators == {op: "sink ünï"} and state.state_versions == versions
    assert state.table.num_rows == 4  # a checkpoint has no clock: the TTL row is kept


def test_checkpoint_taken_during_batched_writes_holds_whole_batches(tmp_path: Path) -> None:
    batch = 50
    with RocksDBStateBackend(tmp_path / "db") as backend:
        stop = threading.Event()

        def writer() -> None:
            n = 0
            while not stop.is_set() and n < 400:
                keys = [bytes([i % 128]) + b"s|" + n.to_bytes(4, "big") for i in range(batch)]
                backend.put_many(2, keys, [n.to_bytes(4, "big")] * batch)
                n += 1

        thread = threading.Thread(target=writer)
        thread.start()
        checkpoints = []
        try:
            for i in range(5):
                checkpoints.append(backend.create_checkpoint(tmp_path / f"chk-{i}"))
        finally:
            stop.set()
            thread.join()
    for checkpoint in checkpoints:
        table = read_rocksdb_checkpoint(checkpoint).table
        assert table.num_rows % batch == 0
        per_batch: dict[bytes, int] = {}
        for value in table.column("value_bytes").to_pylist():
            per_batch[value] = per_batch.get(value, 0) + 1
        assert set(per_batch.values()) <= {batch}


def test_checkpoint_into_existing_or_own_directory_is_refused(tmp_path: Path) -> None:
    with RocksDBStateBackend(tmp_path / "db") as backend:
        backend.put(1, b"\x01s|k", b"v")
        (tmp_path / "full").mkdir()
        (tmp_path / "full" / "keep.txt").write_text("mine")
        (tmp_path / "empty").mkdir()
        for target in (tmp_path / "db", tmp_path / "full", tmp_path / "empty"):
            before = listing(target)
            with pytest.raises(InvalidArgumentError) as info:
                backend.create_checkpoint(target)
            assert "already exists" in one_line(info.value) and listing(target) == before
        with pytest.raises(NotFoundError):
            backend.create_checkpoint(tmp_path / "no" / "chk")
        assert not (tmp_path / "no").exists()
        assert backend.get(1, b"\x01s|k") == b"v"


def test_from_checkpoint_refuses_existing_target_and_restores_a_copy(tmp_path: Path) -> None:
    with RocksDBStateBackend(tmp_path / "db") as backend:
        backend.register_operator("a")
        backend.put(1, b"\x01s|k", b"v")
        checkpoint = backend.create_checkpoint(tmp_path / "chk")
    (tmp_path / "taken").mkdir()
    with pytest.raises(InvalidArgumentError):
        RocksDBStateBackend.from_checkpoint(checkpoint, tmp_path / "taken")
    assert listing(tmp_path / "taken") == []
    with pytest.raises(NotFoundError):
        RocksDBStateBackend.from_checkpoint(tmp_path / "nope", tmp_path / "restored")
    assert not (tmp_path / "restored").exists()
    before = listing(checkpoint)
    with RocksDBStateBackend.from_checkpoint(checkpoint, tmp_path / "restored") as restored:
        restored.put(1, b"\x01s|k", b"changed")
        assert restored.operators == {s.operator_id("a"): "a"}
    assert listing(checkpoint) == before
    assert table_dict(read_rocksdb_checkpoint(checkpoint).table) == {(1, b"\x01s|k"): b"v"}  # the copy is independent


def test_bad_paths_are_one_line_typed_errors_creating_nothing(tmp_path: Path) -> None:
    from rocksdict import Options, Rdict

    (tmp_path / "empty").mkdir()
    (tmp_path / "a file").write_bytes(b"x")
    garbage = tmp_path / "garbage-current"
    garbage.mkdir()
    (garbage / "CURRENT").write_bytes(b"\x00\xffnot a manifest")
    damaged_dir(tmp_path / "damaged")
    other = tmp_path / "other-app"
    db = Rdict(str(other), Options(raw_mode=True))
    db[b"short"] = b"x"  # a key of another app: not 8 bytes + key_bytes
    db.close()
    (other / "rocksdict-config.json").unlink()
    cases = [
        (tmp_path / "missing", NotFoundError),
        (tmp_path / "empty", InvalidArgumentError),
        (tmp_path / "a file", InvalidArgumentError),
        (garbage, InvalidArgumentError),
        (tmp_path / "damaged", CorruptDataError),
        (other, CorruptDataError),
    ]
    before = listing(tmp_path)
    for path, error in cases:
        with pytest.raises(error) as info:
            rocksdb_checkpoint_to_arrow(path)
        assert str(path) in one_line(info.value)
        result = invoke(clink_cli, "state-cat", f"rocksdb://{path}")
        assert result.exit_code != 0 and str(path) in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert listing(tmp_path) == before  # no LOCK, LOG, rocksdict-config.json, no database


def test_a_database_open_in_this_process_is_a_conflict_and_can_still_be_read(tmp_path: Path) -> None:
    with RocksDBStateBackend(tmp_path / "db") as backend:
        backend.put(4, b"\x04s|k", b"v")
        with pytest.raises(ConflictError) as info:
            RocksDBStateBackend(tmp_path / "db")
        assert str(tmp_path / "db") in one_line(info.value)
        before = listing(tmp_path / "db")
        assert table_dict(read_rocksdb_checkpoint(tmp_path / "db").table) == {(4, b"\x04s|k"): b"v"}  # the WAL is read
        assert listing(tmp_path / "db") == before
        backend.put(4, b"\x04s|k", b"still writable")
        assert backend.get(4, b"\x04s|k") == b"still writable"


def test_rocksdb_url_forms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    odd = tmp_path / "a b ünï%"
    with RocksDBStateBackend(odd) as backend:
        backend.put(3, b"\x03s|k", b"v")
    assert parse_source(f"rocksdb://{tmp_path}/a%20b%20%C3%BCn%C3%AF%25").path == str(odd)
    assert table_dict(load_source(f"rocksdb://{tmp_path}/a%20b%20%C3%BCn%C3%AF%25").table) == {(3, b"\x03s|k"): b"v"}
    monkeypatch.chdir(tmp_path)
    assert table_dict(load_source("ROCKSDB://a%20b%20%C3%BCn%C3%AF%25").table) == {(3, b"\x03s|k"): b"v"}  # relative
    # a query string is not a selection: it names another (missing) directory, an error, never the directory itself
    result = invoke(clink_cli, "state-cat", f"rocksdb://{odd}?live=1")
    assert result.exit_code != 0 and "no such RocksDB directory" in result.stderr


# --- collection codecs and views ------------------------------------------------------------------------


@settings(max_examples=300, derandomize=True, deadline=None)
@given(st.binary(max_size=40))
def test_codecs_accept_only_canonical_values(raw: bytes) -> None:
    for decode, encode in ((decode_list, encode_list), (decode_map, encode_map)):
        try:
            decoded = decode(raw)
        except CorruptDataError:
            continue
        assert encode(decoded) == raw  # type: ignore[arg-type]


@settings(max_examples=150, derandomize=True, deadline=None)
@given(st.dictionaries(st.binary(max_size=4), st.binary(max_size=4), max_size=8), st.lists(st.binary(max_size=4), max_size=8))
def test_codecs_round_trip_with_keys_in_unsigned_order(entries: dict[bytes, bytes], values: list[bytes]) -> None:
    assert list(decode_map(encode_map(entries))) == sorted(entries)
    assert decode_map(encode_map(entries)) == entries
    assert decode_list(encode_list(values)) == values


def test_decoders_are_bounded_and_strict() -> None:
    for decode in (decode_list, decode_map):
        with pytest.raises(CorruptDataError) as info:
            decode(b"\xff\xff\xff\xff" + b"\x00" * 12, "v")
        assert "count says 4294967295" in one_line(info.value)
        for bad in (b"", b"\x00\x00\x00", b"\x00\x00\x00\x00\x00", b"\x01\x00\x00\x00\x05\x00\x00\x00ab"):
            with pytest.raises(CorruptDataError):
                decode(bad)
    descending = b"\x02\x00\x00\x00" + b"\x01\x00\x00\x00\x80\x00\x00\x00\x00" + b"\x01\x00\x00\x00\x7f\x00\x00\x00\x00"
    with pytest.raises(CorruptDataError):
        decode_map(descending)  # b"\x80" before b"\x7f": signed order, refused
    repeated = b"\x02\x00\x00\x00" + (b"\x01\x00\x00\x00a\x00\x00\x00\x00") * 2
    with pytest.raises(CorruptDataError):
        decode_map(repeated)
    assert list(decode_map(encode_map({b"\x80": b"", b"\x7f": b"", b"": b"", b"\x7f\x00": b""}))) == [b"", b"\x7f", b"\x7f\x00", b"\x80"]


def test_collection_views_on_rocksdb_match_a_model_and_empty_erases(tmp_path: Path) -> None:
    rng = random.Random(5)
    user_keys = [b"", b"u1", b"\xff", "ü".encode()]
    map_keys = [b"", b"\x00", b"\x7f", b"\x80", b"a", b"ab"]
    lists: dict[bytes, list[bytes]] = {}
    maps: dict[bytes, dict[bytes, bytes]] = {}
    with RocksDBStateBackend(tmp_path / "db") as backend:
        lv, mv = ListState(backend, "op", "l"), MapState(backend, "op", "m")
        for _ in range(300):
            uk = rng.choice(user_keys)
            pick = rng.random()
            if pick < 0.2:
                batch = [rng.randbytes(rng.randrange(3)) for _ in range(rng.randrange(3))]
                lv.add_all(uk, batch)
                lists[uk] = lists.get(uk, []) + batch
            elif pick < 0.3:
                batch = [rng.randbytes(1) for _ in range(rng.randrange(3))]
                lv.update(uk, batch)
                lists[uk] = batch
            elif pick < 0.6:
                entries = {rng.choice(map_keys): rng.randbytes(rng.randrange(3)) for _ in range(rng.randrange(3))}
                mv.put_all(uk, entries)
                maps[uk] = {**maps.get(uk, {}), **entries}
            elif pick < 0.9:
                mk = rng.choice(map_keys)
                mv.remove(uk, mk)
                maps.get(uk, {}).pop(mk, None)
            else:
                mv.clear(uk)
                maps.pop(uk, None)
            lists = {k: v for k, v in lists.items() if v}
            maps = {k: v for k, v in maps.items() if v}
        for uk in user_keys:
            assert lv.get(uk) == lists.get(uk, [])
            assert mv.items(uk) == maps.get(uk, {}) and mv.keys(uk) == sorted(maps.get(uk, {}))
        assert lv.get_many(user_keys) == [lists.get(uk, []) for uk in user_keys]
        assert mv.items_many(user_keys) == [maps.get(uk, {}) for uk in user_keys]
        exported = table_dict(s.read_snapshot(backend.export_arrow_snapshot()).table)
    expected = {(lv.op_id, lv.key(uk)): encode_list(v) for uk, v in lists.items()}
    expected |= {(mv.op_id, mv.key(uk)): encode_map(v) for uk, v in maps.items()}
    assert exported == expected  # no row for an emptied collection


def test_view_mutations_that_change_nothing_write_nothing(tmp_path: Path) -> None:
    with RocksDBStateBackend(tmp_path / "db") as inner:
        backend = CountingBackend(inner)
        lv, mv = ListState(backend, "op", "l"), MapState(backend, "op", "m")
        mv.put(b"u", b"k", b"v")
        lv.add(b"u", b"x")
        writes = backend.writes
        mv.remove(b"u", b"absent")
        mv.remove(b"nobody", b"k")
        mv.put_all(b"u", {})
        lv.add_all(b"u", [])
        assert backend.writes == writes
        with pytest.raises(InvalidArgumentError):
            mv.put_all(b"u", {b"ok": b"1", b"bad": "str"})  # type: ignore[dict-item]
        with pytest.raises(InvalidArgumentError):
            lv.add_all(b"u", [b"ok", 3])  # type: ignore[list-item]
        assert backend.writes == writes and mv.items(b"u") == {b"k": b"v"} and lv.get(b"u") == [b"x"]
        mv.remove(b"u", b"k")
        assert inner.get(mv.op_id, mv.key(b"u")) is None  # the last entry removed erases the row
        inner.put(lv.op_id, lv.key(b"bad"), b"\x02\x00\x00\x00\x00\x00\x00\x00")  # count 2, one element
        with pytest.raises(CorruptDataError) as info:
            lv.add(b"bad", b"y")
        assert "b'bad'" in one_line(info.value)
        assert inner.get(lv.op_id, lv.key(b"bad")) == b"\x02\x00\x00\x00\x00\x00\x00\x00"  # left as it was


# --- the clink CLI and clink-pool import on rocksdb:// --------------------------------------------------


def _model_checkpoint(tmp_path: Path, name: str, seed: int) -> tuple[Path, Model]:
    rng = random.Random(seed)
    model: Model = {}
    with RocksDBStateBackend(tmp_path / f"{name}-db") as backend:
        ops = [backend.register_operator(uid) for uid in ("source", "window ü", "sink")]
        backend.set_state_version(ops[1], "MapState", 2)
        for op in ops:
            keyed = {s.encode_keyed_key("v", rng.randbytes(3)): rng.randbytes(4) for _ in range(60)}
            keyed[s.encode_operator_key("offsets", rng.randbytes(2))] = rng.randbytes(8)
            keyed[s.encode_operator_key("offsets", b"")] = b""
            backend.put_many(op, list(keyed), list(keyed.values()))
            model |= {(op, k): v for k, v in keyed.items()}
        for op, key in rng.sample(sorted(model), 10):
            backend.erase(op, key)
            del model[(op, key)]
        checkpoint = backend.create_checkpoint(tmp_path / name)
    return checkpoint, model


def test_clink_commands_on_rocksdb_agree_with_the_model(tmp_path: Path) -> None:
    checkpoint, model = _model_checkpoint(tmp_path, "chk", 1)
    before = listing(checkpoint)
    src = f"rocksdb://{checkpoint}"
    out = tmp_path / "state.arrow"
    assert invoke(clink_cli, "state-export", "--from", src, "--out", str(out)).exit_code == 0
    snap = s.read_snapshot(out.read_bytes())
    assert rows(snap.table) == in_order(model)
    assert invoke(clink_cli, "state-diff", src, str(out)).exit_code == 0
    other, other_model = _model_checkpoint(tmp_path, "other", 2)
    differ = invoke(clink_cli, "state-diff", src, f"rocksdb://{other}", "-o", "json")
    assert differ.exit_code == 1, differ.stdout + differ.stderr
    query = invoke(clink_cli, "state-query", src, "SELECT count(*) AS n, count(DISTINCT op_id) AS o FROM state", "-o", "json")
    assert query.exit_code == 0, query.stderr
    assert [len(model), 3] in [list(r.values()) if isinstance(r, dict) else r for r in json.loads(query.stdout)["rows"]]
    expect = [arg for uid in ("source", "window ü", "sink") for arg in ("--expect-uid", uid)]
    check = invoke(clink_cli, "check-savepoint", src, *expect, "-o", "json")
    assert check.exit_code == 0, check.stdout
    missing = invoke(clink_cli, "check-savepoint", src, *expect, "--expect-uid", "not there", "-o", "json")
    assert missing.exit_code == 1, missing.stdout
    assert listing(checkpoint) == before  # reading wrote nothing into the checkpoint


def test_clink_pool_import_splits_key_groups_and_keeps_operator_rows(tmp_path: Path) -> None:
    from clink.cli.pool import cli as pool_cli

    checkpoint, model = _model_checkpoint(tmp_path, "chk", 3)
    before = listing(checkpoint)
    uri = f"file://{tmp_path / 'pool'}"
    result = invoke(pool_cli, "import", "--store", uri, "orders", "--from", f"rocksdb://{checkpoint}", "-p", "3", "-o", "json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["rows"] == len(model)
    imported = load_source(f"{uri}/jobs/orders/chk-1")
    assert table_dict(imported.table) == model
    assert imported.state_versions == read_rocksdb_checkpoint(checkpoint).state_versions
    assert listing(checkpoint) == before
    again = invoke(pool_cli, "import", "--store", uri, "orders", "--from", f"rocksdb://{checkpoint}")
    assert again.exit_code == 4  # the job exists: refused, a conflict
