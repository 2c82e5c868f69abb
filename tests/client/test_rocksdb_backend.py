"""RocksDBStateBackend against a dict model (hypothesis), its export and rocksdb_checkpoint_to_arrow in pyarrow, DuckDB and Polars."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

import snapshot
from client.rocksdb_backend import (
    METADATA_COLUMN_FAMILY,
    METADATA_KEY,
    RocksDBConfig,
    RocksDBStateBackend,
    read_rocksdb_checkpoint,
    rocksdb_checkpoint_to_arrow,
)
from snapshot.errors import CorruptDataError, InvalidArgumentError, NotFoundError
from snapshot.format import OPERATORS_KEY, operators_from_metadata

Model = dict[tuple[int, bytes], bytes]

# op ids at both ends of uint64 and with the top bit set: byte order must be unsigned big-endian, not signed or little-endian
OPS = [0, 1, 0x0100, 0x7FFF_FFFF_FFFF_FFFF, 0x8000_0000_0000_0000, (1 << 64) - 1]
# a small key space so overwrites and erases hit written keys; 1-byte keys, keyed and operator-state (0xFF) prefixes
KEYS = [bytes([g]) + tail for g in (0, 5, 127, 0xFF) for tail in (b"", b"\x00", b"a", b"ab", b"\xff\xff")]
VALUES = st.binary(min_size=0, max_size=12)


def rows(table: pa.Table) -> list[tuple[int, bytes, bytes]]:
    return list(
        zip(
            table.column("op_id").to_pylist(),
            table.column("key_bytes").to_pylist(),
            table.column("value_bytes").to_pylist(),
            strict=True,
        )
    )


def in_order(model: Model) -> list[tuple[int, bytes, bytes]]:
    """The model as the export must give it: operators ascending, keys in byte order."""
    return [(op, key, value) for (op, key), value in sorted(model.items())]


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def test_rocksdb_backend_state_machine_against_a_dict_model() -> None:
    fired: Counter[str] = Counter()

    class RocksMachine(RuleBasedStateMachine):
        """Writes, reads, reopens, checkpoints, restores and exports a RocksDB backend; the model is a dict."""

        def __init__(self) -> None:
            super().__init__()
            self.root = Path(tempfile.mkdtemp(prefix="rocks-sm-"))
            self.path = self.root / "db"
            self.backend = RocksDBStateBackend(self.path)
            self.model: Model = {}
            self.versions: dict[tuple[int, str], int] = {}
            self.uids: dict[int, str] = {}
            # every checkpoint taken, with the model at that moment: later writes must not reach it
            self.checkpoints: list[tuple[Path, Model, dict[tuple[int, str], int], dict[int, str]]] = []

        def teardown(self) -> None:
            self.backend.close()
            shutil.rmtree(self.root, ignore_errors=True)

        @rule(op=st.sampled_from(OPS), key=st.sampled_from(KEYS), value=VALUES)
        def put(self, op: int, key: bytes, value: bytes) -> None:
            fired["overwrite" if (op, key) in self.model else "put"] += 1
            self.backend.put(op, key, value)
            self.model[(op, key)] = value

        @rule(op=st.sampled_from(OPS), key=st.sampled_from(KEYS))
        def erase(self, op: int, key: bytes) -> None:
            fired["erase hit" if (op, key) in self.model else "erase miss"] += 1
            self.backend.erase(op, key)
            self.model.pop((op, key), None)

        @precondition(lambda self: bool(self.model))
        @rule(data=st.data(), value=st.none() | VALUES)
        def rewrite_a_written_key(self, data: st.DataObject, value: bytes | None) -> None:
            op, key = data.draw(st.sampled_from(sorted(self.model)))
            if value is None:
                self.erase(op, key)
            else:
                self.put(op, key, value)

        @rule(
            op=st.sampled_from(OPS),
            pairs=st.lists(st.tuples(st.sampled_from(KEYS), VALUES), max_size=12),
            as_arrow=st.booleans(),
        )
        def put_many(self, op: int, pairs: list[tuple[bytes, bytes]], as_arrow: bool) -> None:
            keys, values = [k for k, _ in pairs], [v for _, v in pairs]
            if len(set(keys)) < len(keys):
                fired["put_many repeats a key"] += 1
            if as_arrow:
                assert self.backend.put_many(op, pa.array(keys, pa.binary()), pa.array(values, pa.binary())) == len(pairs)
            else:
                assert self.backend.put_many(op, keys, values) == len(pairs)
            for k, v in pairs:  # a later write of a key wins
                self.model[(op, k)] = v

        @rule(op=st.sampled_from(OPS), keys=st.lists(st.sampled_from(KEYS), max_size=8))
        def get_many(self, op: int, keys: list[bytes]) -> None:
            assert self.backend.get_many(op, keys) == [self.model.get((op, k)) for k in keys]
            if any((op, k) in self.model for k in keys) and any((op, k) not in self.model for k in keys):
                fired["get_many hits and misses"] += 1

        @rule(op=st.sampled_from(OPS), key=st.sampled_from(KEYS))
        def get(self, op: int, key: bytes) -> None:
            assert self.backend.get(op, key) == self.model.get((op, key))

        @rule(uid=st.sampled_from(["source", "window", "sink", "counter"]))
        def register(self, uid: str) -> None:
            op_id = self.backend.register_operator(uid)
            assert op_id == snapshot.operator_id(uid)  # the remote backend's derivation
            self.uids[op_id] = uid

        @rule(op=st.sampled_from(OPS), state_type=st.sampled_from(["ValueState", "ListState"]), version=st.integers(0, 9))
        def set_version(self, op: int, state_type: str, version: int) -> None:
            self.backend.set_state_version(op, state_type, version)
            self.versions[(op, state_type)] = version

        @rule()
        def reopen(self) -> None:
            fired["reopen"] += 1
            self.backend.close()
            self.backend = RocksDBStateBackend(self.path)

        @rule()
        def checkpoint(self) -> None:
            fired["checkpoint"] += 1
            target = self.root / f"chk-{len(self.checkpoints)}"
            self.backend.create_checkpoint(target)
            self.checkpoints.append((target, dict(self.model), dict(self.versions), dict(self.uids)))

        @precondition(lambda self: bool(self.checkpoints))
        @rule(data=st.data())
        def restore(self, data: st.DataObject) -> None:
            fired["restore"] += 1
            index = data.draw(st.integers(0, len(self.checkpoints) - 1))
            chk, model, versions, uids = self.checkpoints[index]
            self.backend.close()
            self.path = self.root / f"restored-{fired['restore']}"
            self.backend = RocksDBStateBackend.from_checkpoint(chk, self.path)
            self.model, self.versions, self.uids = dict(model), dict(versions), dict(uids)

        @precondition(lambda self: bool(self.checkpoints))
        @rule(data=st.data())
        def old_checkpoint_is_unchanged(self, data: st.DataObject) -> None:
            chk, model, versions, uids = self.checkpoints[data.draw(st.integers(0, len(self.checkpoints) - 1))]
            before = listing(chk)
            snap = snapshot.read_snapshot(rocksdb_checkpoint_to_arrow(chk))
            assert rows(snap.table) == in_order(model)
            assert dict(snap.state_versions.items()) == versions
            assert operators_from_metadata(snap.metadata) == uids
            assert listing(chk) == before  # reading a checkpoint writes nothing into it
            if model != self.model:
                fired["checkpoint differs from live state"] += 1

        @invariant()
        def export_equals_the_model(self) -> None:
            snap = snapshot.read_snapshot(self.backend.export_arrow_snapshot())
            assert rows(snap.table) == in_order(self.model)  # metadata is never a row; order is the layout order
            assert dict(snap.state_versions.items()) == self.versions
            assert operators_from_metadata(snap.metadata) == self.uids

    # derandomized: the checks below that every rule fired must not depend on the run's seed
    settings_ = settings(max_examples=25, stateful_step_count=30, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
    run_state_machine_as_test(RocksMachine, settings=settings_)
    for what in ("put", "overwrite", "erase hit", "erase miss", "reopen", "checkpoint", "restore", "put_many repeats a key"):
        assert fired[what] > 0, f"the state machine never did {what!r}: {dict(fired)}"
    assert fired["checkpoint differs from live state"] > 0  # else a checkpoint that is a live view would pass


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    model=st.dictionaries(st.tuples(st.integers(0, (1 << 64) - 1), st.binary(min_size=1, max_size=20)), st.binary(max_size=40), max_size=60)
)
def test_export_and_checkpoint_read_back_in_pyarrow_duckdb_and_polars(model: Model) -> None:
    with tempfile.TemporaryDirectory() as folder, RocksDBStateBackend(Path(folder) / "db") as backend:
        op = backend.register_operator("window")
        backend.set_state_version(op, "ValueState", 2)
        for (o, k), v in model.items():
            backend.put(o, k, v)
        exported = backend.export_arrow_snapshot()
        chk = backend.create_checkpoint(Path(folder) / "chk")
        backend.put(op, b"\x01late", b"after the checkpoint")
        rendered = rocksdb_checkpoint_to_arrow(chk)
        assert rendered == exported  # the same state renders to the same bytes
        for blob in (exported, rendered):
            table = ipc.open_stream(pa.BufferReader(blob)).read_all()  # plain pyarrow, no clink code
            assert table.schema.metadata[b"clink.format_version"] == b"1"
            assert table.schema.metadata[b"clink.state_versions"] == f"{op}|ValueState|2".encode()
            assert table.schema.metadata[OPERATORS_KEY] == f'{{"{op}":"window"}}'.encode()
            assert table.schema.remove_metadata().equals(snapshot.CANONICAL_SCHEMA)
            assert rows(table) == in_order(model)

            con = duckdb.connect()
            con.register("arrow_in", table)
            got = con.execute("SELECT op_id, key_bytes, value_bytes FROM arrow_in ORDER BY op_id, key_bytes").fetchall()
            assert [(o, bytes(k), bytes(v)) for o, k, v in got] == in_order(model)
            assert con.execute("SELECT count(DISTINCT op_id) FROM arrow_in").fetchone() == (len({o for o, _ in model}),)

            frame = pl.read_ipc_stream(blob)
            assert frame.height == len(model)
            assert list(frame.select(["op_id", "key_bytes", "value_bytes"]).iter_rows()) == in_order(model)


def test_the_metadata_lives_in_its_own_column_family_never_among_state_rows(tmp_path: Path) -> None:
    from rocksdict import AccessType, Options, Rdict

    with RocksDBStateBackend(tmp_path / "db") as backend:
        op = backend.register_operator("source")
        backend.set_state_version(op, "ListState", 1)
        backend.put(op, b"\xffoffsets|p0", b"7")
        backend.create_checkpoint(tmp_path / "chk")
    db = Rdict(str(tmp_path / "chk"), Options(raw_mode=True), column_families={METADATA_COLUMN_FAMILY: Options(raw_mode=True)},
               access_type=AccessType.read_only())  # fmt: skip
    try:
        assert list(db.keys()) == [op.to_bytes(8, "big") + b"\xffoffsets|p0"]  # the default family: state rows only
        assert list(db.get_column_family(METADATA_COLUMN_FAMILY).keys()) == [METADATA_KEY]
    finally:
        db.close()
    state = read_rocksdb_checkpoint(tmp_path / "chk")
    assert state.operators == {op: "source"} and dict(state.state_versions.items()) == {(op, "ListState"): 1}
    assert state.table.num_rows == 1


def test_put_many_refuses_bad_rows_naming_the_first_and_writes_nothing(tmp_path: Path) -> None:
    with RocksDBStateBackend(tmp_path / "db", RocksDBConfig(key_groups=(0, 63))) as backend:
        backend.put(1, b"\x01a", b"old")
        cases = [
            ([b"\x01a", b""], [b"x", b"y"], r"keys\[1\] is empty"),
            ([b"\x01a", b"\x40z"], [b"x", b"y"], r"keys\[1\] .* key group 64, outside this backend's range 0-63"),
            ([b"\x01a"], [b"x", b"y"], "1 keys and 2 values"),
            (pa.array([b"\x01a", None]), pa.array([b"x", b"y"]), r"keys\[1\] is null"),
            ([b"\x01a", 5], [b"x", b"y"], "must all be bytes"),
        ]
        for keys, values, message in cases:
            with pytest.raises(InvalidArgumentError, match=message):
                backend.put_many(1, keys, values)
        assert backend.get(1, b"\x01a") == b"old"
        with pytest.raises(InvalidArgumentError, match="outside this backend's range"):
            backend.put(1, b"\x7f", b"v")
        with pytest.raises(InvalidArgumentError, match="key_bytes is empty"):
            backend.get(1, b"")
        with pytest.raises(InvalidArgumentError, match="op_id must be an unsigned 64-bit int"):
            backend.put(-1, b"\x01a", b"v")
        with pytest.raises(InvalidArgumentError, match="value must be bytes"):
            backend.put(1, b"\x01a", "v")  # type: ignore[arg-type]
        assert rows(snapshot.read_snapshot(backend.export_arrow_snapshot()).table) == [(1, b"\x01a", b"old")]
    with pytest.raises(InvalidArgumentError, match="closed"):
        backend.put(1, b"\x01a", b"v")


def test_ttl_slots_are_left_out_of_the_export_once_expired_and_survive_a_checkpoint(tmp_path: Path) -> None:
    now = [1_000]
    config = RocksDBConfig(clock_ms=lambda: now[0])
    with RocksDBStateBackend(tmp_path / "db", config) as backend:
        backend.register_ttl_slot(9, "session")
        fresh, stale = snapshot.encode_keyed_key("session", b"a"), snapshot.encode_keyed_key("session", b"b")
        backend.put(9, fresh, (5_000).to_bytes(8, "little") + b"A")
        backend.put(9, stale, (2_000).to_bytes(8, "little") + b"B")
        now[0] = 3_000
        assert [k for _, k, _ in rows(snapshot.read_snapshot(backend.export_arrow_snapshot()).table)] == [fresh]
        backend.create_checkpoint(tmp_path / "chk")
    assert read_rocksdb_checkpoint(tmp_path / "chk").ttl_slots == frozenset({(9, "session", True)})
    with RocksDBStateBackend.from_checkpoint(tmp_path / "chk", tmp_path / "again", config) as restored:
        assert [k for _, k, _ in rows(snapshot.read_snapshot(restored.export_arrow_snapshot()).table)] == [fresh]


def test_a_narrower_range_keeps_operator_state_and_its_own_key_groups(tmp_path: Path) -> None:
    with RocksDBStateBackend(tmp_path / "db") as wide:
        wide.put(3, b"\x10k", b"in")
        wide.put(3, b"\x50k", b"out")
        wide.put(3, b"\xffop", b"operator")
    with RocksDBStateBackend(tmp_path / "db", RocksDBConfig(key_groups=(0, 31))) as narrow:
        exported = rows(snapshot.read_snapshot(narrow.export_arrow_snapshot()).table)
    assert exported == [(3, b"\x10k", b"in"), (3, b"\xffop", b"operator")]


def _not_rocksdb(tmp_path: Path) -> list[tuple[Path, type[Exception], str]]:
    a_file = tmp_path / "state.snap"
    a_file.write_bytes(b"not a database")
    empty = tmp_path / "empty"
    empty.mkdir()
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("x")
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "CURRENT").write_text("garbage\n")
    return [
        (tmp_path / "missing", NotFoundError, "no such RocksDB directory"),
        (a_file, InvalidArgumentError, "is a file, not a RocksDB directory"),
        (empty, InvalidArgumentError, r"not a RocksDB directory \(an empty directory\)"),
        (other, InvalidArgumentError, r"not a RocksDB directory \(a directory without a CURRENT file\)"),
        (fake, InvalidArgumentError, "its CURRENT file names no MANIFEST"),
    ]


def test_a_path_that_is_not_a_rocksdb_directory_is_a_one_line_error_that_creates_nothing(tmp_path: Path) -> None:
    cases = _not_rocksdb(tmp_path)
    before = listing(tmp_path)
    for path, error, message in cases:
        with pytest.raises(error, match=message) as raised:
            rocksdb_checkpoint_to_arrow(path)
        text = str(raised.value)
        assert str(path) in text and "\n" not in text
        with pytest.raises(error, match=message):
            RocksDBStateBackend.from_checkpoint(path, tmp_path / "restored")
    assert listing(tmp_path) == before  # nothing created: no database, no rocksdict-config.json, no restore target


def test_the_backend_refuses_a_file_a_foreign_directory_and_a_missing_one_without_create(tmp_path: Path) -> None:
    cases = {p: (e, m) for p, e, m in _not_rocksdb(tmp_path)}
    before = listing(tmp_path)
    for path in (tmp_path / "state.snap", tmp_path / "other", tmp_path / "fake"):
        error, message = cases[path]
        with pytest.raises(error, match=message):
            RocksDBStateBackend(path)
    with pytest.raises(NotFoundError, match="create_if_missing is off"):
        RocksDBStateBackend(tmp_path / "missing", RocksDBConfig(create_if_missing=False))
    with pytest.raises(InvalidArgumentError, match="compression must be one of"):
        RocksDBStateBackend(tmp_path / "missing", RocksDBConfig(compression="brotli"))
    assert listing(tmp_path) == before
    with RocksDBStateBackend(tmp_path / "empty") as backend:  # an empty directory becomes a database
        backend.put(1, b"\x01k", b"v")
        with pytest.raises(InvalidArgumentError, match="already exists"):
            backend.create_checkpoint(tmp_path / "other")
        with pytest.raises(NotFoundError, match="no such directory"):
            backend.create_checkpoint(tmp_path / "nowhere" / "chk")
    assert rows(snapshot.read_snapshot(rocksdb_checkpoint_to_arrow(tmp_path / "empty")).table) == [(1, b"\x01k", b"v")]


def test_a_rocksdb_key_too_short_for_an_op_id_is_corrupt_data_naming_it(tmp_path: Path) -> None:
    from rocksdict import Options, Rdict

    options = Options(raw_mode=True)
    db = Rdict(str(tmp_path / "foreign"), options)
    db[b"\x00" * 8 + b"\x01ok"] = b"v"
    db[b"short"] = b"v"
    db.close()
    with pytest.raises(CorruptDataError, match=r"RocksDB key '73686f7274' is not an 8-byte op_id followed by a state key"):
        rocksdb_checkpoint_to_arrow(tmp_path / "foreign")


def test_a_database_open_elsewhere_is_refused_as_a_conflict(tmp_path: Path) -> None:
    from snapshot.errors import ConflictError

    with RocksDBStateBackend(tmp_path / "db"):
        with pytest.raises(ConflictError, match="LOCK"):
            RocksDBStateBackend(tmp_path / "db")
        # a read-only render of the live directory works while it is open (RocksDB's read-only open takes no lock)
        assert snapshot.read_snapshot(rocksdb_checkpoint_to_arrow(tmp_path / "db")).table.num_rows == 0
    assert os.path.isdir(tmp_path / "db")
