"""ListState and MapState over a real pool (and RocksDB) against a dict model: checkpoints, restores, erases, exports read back."""

from __future__ import annotations

import itertools
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

import snapshot
from client import (
    BackendConfig,
    CorruptDataError,
    InvalidArgumentError,
    KeyedState,
    ListState,
    MapState,
    RemoteReadBackend,
    decode_list,
    decode_map,
    encode_list,
    encode_map,
)
from client.rocksdb_backend import RocksDBStateBackend
from client.typed import StateBackend

# '' and a key holding the layout's '|' separator are user keys like any other
USER_KEYS = [b"", b"a", b"b\x00", b"\xff\xfe", b"k|x"]
MAP_KEYS = [b"", b"m", b"m\x00", b"n", b"\x80"]
LIST_OP, MAP_OP = "collector", "index"
SLOT = "buf"  # the list and the map share a slot name under two operators: only op_id keeps them apart
RAW_SLOT = "raw"  # a plain keyed slot of the list's operator with the same user keys: the slot keeps it apart
SMALL_CACHE = BackendConfig(cache_bytes=400, call_deadline_s=10)  # small: after a restore most reads go to the pool

values_st = st.binary(max_size=6)


class Harness:
    """One backend kind's open / checkpoint / restore, so one machine runs over each."""

    backend: StateBackend

    def checkpoint(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        """A fresh backend holding the newest checkpoint (empty when there is none); the old one is closed."""
        raise NotImplementedError

    def export(self) -> bytes:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class PoolHarness(Harness):
    def __init__(self, address: str) -> None:
        self.address = address
        self.job = f"coll-{uuid.uuid4().hex[:10]}"
        self.remote = RemoteReadBackend.connect(address, self.job, config=SMALL_CACHE)
        self.backend = self.remote
        self.next_id = 1

    def checkpoint(self) -> None:
        result = self.remote.snapshot(self.next_id)
        assert result.checkpoint.complete  # one subtask owning 0..127 completes its checkpoint alone
        self.next_id += 1

    def restore(self) -> None:
        self.remote.close()
        self.remote = RemoteReadBackend.connect(self.address, self.job, config=SMALL_CACHE)
        self.remote.restore()
        self.backend = self.remote
        self.next_id = max(self.next_id, self.remote.parent_id + 1)

    def export(self) -> bytes:
        return self.remote.export_arrow_snapshot()

    def close(self) -> None:
        self.remote.close()


class RocksHarness(Harness):
    def __init__(self, root: Path) -> None:
        self.root = root
        self.names = itertools.count()
        self.rocks = RocksDBStateBackend(root / f"db{next(self.names)}")
        self.backend = self.rocks
        self.last: Path | None = None

    def checkpoint(self) -> None:
        self.last = self.rocks.create_checkpoint(self.root / f"cp{next(self.names)}")

    def restore(self) -> None:
        self.rocks.close()
        target = self.root / f"db{next(self.names)}"
        self.rocks = RocksDBStateBackend(target) if self.last is None else RocksDBStateBackend.from_checkpoint(self.last, target)
        self.backend = self.rocks

    def export(self) -> bytes:
        return self.rocks.export_arrow_snapshot()

    def close(self) -> None:
        self.rocks.close()


@pytest.fixture(params=["pool", "rocksdb"])
def harnesses(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A factory of fresh harnesses of one backend kind: over a real pool server in memory, or over RocksDB in a temp dir."""
    if request.param == "pool":
        address = request.getfixturevalue("memory_pool_address")
        yield lambda: PoolHarness(address)
    else:
        yield lambda: RocksHarness(tmp_path_factory.mktemp("rocks"))


Lists = dict[bytes, list[bytes]]
Maps = dict[bytes, dict[bytes, bytes]]
Raws = dict[bytes, bytes]


def exported_model(blob: bytes, list_op: int, map_op: int) -> tuple[Lists, Maps, Raws]:
    """What an external reader sees: the canonical stream's rows, value_bytes decoded with the documented codecs."""
    table = snapshot.read_snapshot(blob).table
    lists: Lists = {}
    maps: Maps = {}
    raws: Raws = {}
    for op_id, key, value in zip(*(table.column(c).to_pylist() for c in ("op_id", "key_bytes", "value_bytes")), strict=True):
        decoded = snapshot.decode_key(key)
        assert decoded.kind == "keyed" and decoded.key_group == snapshot.key_group(decoded.user_key)
        where = (op_id, decoded.slot)
        if where == (list_op, SLOT):
            lists[decoded.user_key] = decode_list(value)
        elif where == (map_op, SLOT):
            maps[decoded.user_key] = decode_map(value)
        else:
            assert where == (list_op, RAW_SLOT), f"a row nobody wrote: {where}"
            raws[decoded.user_key] = value
    assert all(lists.values()) and all(maps.values()), "an empty collection was stored instead of erased"
    return lists, maps, raws


@pytest.mark.parametrize("steps", [40])
def test_collection_views_against_a_dict_model(harnesses, steps: int) -> None:
    fired: Counter[str] = Counter()

    class CollectionMachine(RuleBasedStateMachine):
        """Mutates lists, maps and a plain slot through views, checkpoints, restores and exports; the model is dicts."""

        def __init__(self) -> None:
            super().__init__()
            self.h: Harness = harnesses()
            self.lists: Lists = {}
            self.maps: Maps = {}
            self.raws: Raws = {}
            self.committed: tuple[Lists, Maps, Raws] = ({}, {}, {})
            self._views()

        def _views(self) -> None:
            self.list = ListState(self.h.backend, LIST_OP, SLOT)
            self.map = MapState(self.h.backend, MAP_OP, SLOT)
            self.raw = KeyedState(self.h.backend, LIST_OP, RAW_SLOT)

        def teardown(self) -> None:
            self.h.close()

        @rule(user_key=st.sampled_from(USER_KEYS), value=values_st)
        def list_add(self, user_key: bytes, value: bytes) -> None:
            fired["list_add"] += 1
            self.list.add(user_key, value)
            self.lists.setdefault(user_key, []).append(value)

        @rule(user_key=st.sampled_from(USER_KEYS), values=st.lists(values_st, max_size=4))
        def list_add_all(self, user_key: bytes, values: list[bytes]) -> None:
            fired["list_add_all"] += 1
            self.list.add_all(user_key, iter(values))
            if values:
                self.lists.setdefault(user_key, []).extend(values)

        @rule(user_key=st.sampled_from(USER_KEYS), values=st.lists(values_st, max_size=3))
        def list_update(self, user_key: bytes, values: list[bytes]) -> None:
            fired["list_update_empty" if not values else "list_update"] += 1
            self.list.update(user_key, values)
            if values:
                self.lists[user_key] = list(values)
            else:
                self.lists.pop(user_key, None)

        @rule(user_key=st.sampled_from(USER_KEYS))
        def list_clear(self, user_key: bytes) -> None:
            fired["list_clear"] += 1
            self.list.clear(user_key)
            self.lists.pop(user_key, None)

        @rule(user_key=st.sampled_from(USER_KEYS), map_key=st.sampled_from(MAP_KEYS), value=values_st)
        def map_put(self, user_key: bytes, map_key: bytes, value: bytes) -> None:
            fired["map_put"] += 1
            self.map.put(user_key, map_key, value)
            self.maps.setdefault(user_key, {})[map_key] = value

        @rule(user_key=st.sampled_from(USER_KEYS), entries=st.dictionaries(st.sampled_from(MAP_KEYS), values_st, max_size=3))
        def map_put_all(self, user_key: bytes, entries: dict[bytes, bytes]) -> None:
            fired["map_put_all"] += 1
            self.map.put_all(user_key, entries)
            if entries:
                self.maps.setdefault(user_key, {}).update(entries)

        @rule(user_key=st.sampled_from(USER_KEYS), data=st.data())
        def map_remove(self, user_key: bytes, data: st.DataObject) -> None:
            """Remove a key the map holds (often its last one) or any key (often an absent one)."""
            current = self.maps.get(user_key, {})
            map_key = data.draw(st.sampled_from(sorted(current) or MAP_KEYS) | st.sampled_from(MAP_KEYS))
            fired["map_remove_last" if list(current) == [map_key] else "map_remove"] += 1
            self.map.remove(user_key, map_key)
            current.pop(map_key, None)
            if not current:
                self.maps.pop(user_key, None)

        @rule(user_key=st.sampled_from(USER_KEYS))
        def map_clear(self, user_key: bytes) -> None:
            fired["map_clear"] += 1
            self.map.clear(user_key)
            self.maps.pop(user_key, None)

        @rule(user_key=st.sampled_from(USER_KEYS), value=st.none() | values_st)
        def raw_write(self, user_key: bytes, value: bytes | None) -> None:
            fired["raw_write"] += 1
            if value is None:
                self.raw.erase(user_key)
                self.raws.pop(user_key, None)
            else:
                self.raw.put(user_key, value)
                self.raws[user_key] = value

        @rule()
        def checkpoint(self) -> None:
            fired["checkpoint"] += 1
            self.h.checkpoint()
            self.committed = (_copy_lists(self.lists), _copy_maps(self.maps), dict(self.raws))

        @rule()
        def restore(self) -> None:
            """A restart from the newest checkpoint: writes after it are gone, erases before it stay erased."""
            fired["restore_dropping" if (self.lists, self.maps, self.raws) != self.committed else "restore"] += 1
            self.h.restore()
            self._views()
            self.lists, self.maps = _copy_lists(self.committed[0]), _copy_maps(self.committed[1])
            self.raws = dict(self.committed[2])

        @rule()
        def export(self) -> None:
            fired["export"] += 1
            assert exported_model(self.h.export(), self.list.op_id, self.map.op_id) == (self.lists, self.maps, self.raws)

        @invariant()
        def reads_match_the_model(self) -> None:
            assert self.list.get_many(USER_KEYS) == [self.lists.get(k, []) for k in USER_KEYS]
            assert self.map.items_many(USER_KEYS) == [self.maps.get(k, {}) for k in USER_KEYS]
            for user_key in USER_KEYS:
                model = self.maps.get(user_key, {})
                assert self.list.get(user_key) == self.lists.get(user_key, [])
                assert self.map.keys(user_key) == sorted(model)
                assert self.map.values(user_key) == [model[k] for k in sorted(model)]
                assert [self.map.get(user_key, k) for k in MAP_KEYS] == [model.get(k) for k in MAP_KEYS]
                assert [self.map.contains(user_key, k) for k in MAP_KEYS] == [k in model for k in MAP_KEYS]
                assert self.raw.get(user_key) == self.raws.get(user_key)
                # absent and empty are one state: an empty collection has no stored value at all
                assert (self.list.raw.get(user_key) is None) == (user_key not in self.lists)
                assert (self.map.raw.get(user_key) is None) == (user_key not in self.maps)

    # derandomized: the check that every rule fired must not depend on the run's seed
    run_state_machine_as_test(
        CollectionMachine,
        settings=settings(
            max_examples=25, derandomize=True, stateful_step_count=steps, deadline=None, suppress_health_check=[HealthCheck.too_slow]
        ),
    )
    rules = {"list_add", "list_add_all", "list_update", "list_update_empty", "list_clear", "map_put", "map_put_all"}
    rules |= {"map_remove", "map_remove_last", "map_clear", "raw_write", "checkpoint", "restore_dropping", "export"}
    assert rules <= set(fired), f"rules never exercised: {rules - set(fired)}"


def _copy_lists(lists: Lists) -> Lists:
    return {k: list(v) for k, v in lists.items()}


def _copy_maps(maps: Maps) -> Maps:
    return {k: dict(v) for k, v in maps.items()}


def test_an_external_reader_decodes_the_exported_values_with_pyarrow_alone(memory_pool_address: str) -> None:
    """The committed checkpoint's canonical stream, read with pyarrow.ipc and the documented codecs, holds the collections."""
    with RemoteReadBackend.connect(memory_pool_address, f"ext-{uuid.uuid4().hex[:8]}") as backend:
        lists, maps = ListState(backend, LIST_OP, SLOT), MapState(backend, MAP_OP, SLOT)
        lists.add_all(b"u1", [b"x", b"", b"yz"])
        lists.add(b"u2", b"only")
        lists.update(b"u3", [b"gone"])
        lists.update(b"u3", [])
        maps.put_all(b"u1", {b"z": b"26", b"a": b"1"})
        maps.put(b"u4", b"k", b"v")
        maps.remove(b"u4", b"k")
        backend.snapshot(1)
        blob = backend.export_arrow_snapshot()
    table = pa.ipc.open_stream(blob).read_all()
    ops = table.column("op_id").to_pylist()
    keys = table.column("key_bytes").to_pylist()
    values = table.column("value_bytes").to_pylist()
    rows = {(op, key): value for op, key, value in zip(ops, keys, values, strict=True)}
    list_op, map_op = snapshot.operator_id(LIST_OP), snapshot.operator_id(MAP_OP)
    assert set(rows) == {
        (list_op, snapshot.encode_keyed_key(SLOT, b"u1")),
        (list_op, snapshot.encode_keyed_key(SLOT, b"u2")),
        (map_op, snapshot.encode_keyed_key(SLOT, b"u1")),
    }, "u3's emptied list and u4's emptied map are erased, not stored empty"
    assert decode_list(rows[(list_op, snapshot.encode_keyed_key(SLOT, b"u1"))]) == [b"x", b"", b"yz"]
    assert decode_list(rows[(list_op, snapshot.encode_keyed_key(SLOT, b"u2"))]) == [b"only"]
    map_value = rows[(map_op, snapshot.encode_keyed_key(SLOT, b"u1"))]
    assert map_value == encode_map({b"a": b"1", b"z": b"26"})
    assert map_value[:4] == b"\x02\x00\x00\x00" and map_value.index(b"a") < map_value.index(b"z")  # sorted by key bytes


def test_a_corrupt_stored_value_is_named_and_mutations_change_nothing(harnesses) -> None:
    h: Harness = harnesses()
    try:
        lists, maps = ListState(h.backend, LIST_OP, SLOT), MapState(h.backend, MAP_OP, SLOT)
        garbage = b"\x05\x00\x00\x00\x01"
        lists.raw.put(b"bad", garbage)
        maps.raw.put(b"bad", encode_list([b"k", b"v"]) + b"x")
        with pytest.raises(CorruptDataError, match=r"^list of slot 'buf' user key b'bad' \(op_id \d+\): count says 5"):
            lists.get(b"bad")
        with pytest.raises(CorruptDataError, match=r"^list of slot 'buf' user key b'bad'"):
            lists.add(b"bad", b"more")
        with pytest.raises(CorruptDataError, match=r"^map of slot 'buf' user key b'bad' \(op_id \d+\): "):
            maps.put(b"bad", b"k", b"v")
        with pytest.raises(CorruptDataError, match=r"^map of slot 'buf' user key b'bad'"):
            maps.remove(b"bad", b"k")
        assert lists.raw.get(b"bad") == garbage
        assert maps.raw.get(b"bad") == encode_list([b"k", b"v"]) + b"x"
        lists.update(b"bad", [b"fresh"])  # a replace needs no read, so it repairs the key
        assert lists.get(b"bad") == [b"fresh"]
    finally:
        h.close()


def test_bad_input_is_named_and_changes_nothing(harnesses) -> None:
    h: Harness = harnesses()
    try:
        lists, maps = ListState(h.backend, LIST_OP, SLOT), MapState(h.backend, MAP_OP, SLOT)
        lists.add_all(b"u", [b"a"])
        maps.put(b"u", b"k", b"v")
        with pytest.raises(InvalidArgumentError, match=r"^list of slot 'buf' user key b'u' .*: element 1 must be bytes, got str"):
            lists.add_all(b"u", [b"b", "c"])  # type: ignore[list-item]
        with pytest.raises(InvalidArgumentError, match=r"element 0 must be bytes, got str"):
            lists.update(b"u", ["c"])  # type: ignore[list-item]
        with pytest.raises(InvalidArgumentError, match=r"^map of slot 'buf' user key b'u' .*: value of key b'k3' must be bytes, got int"):
            maps.put_all(b"u", {b"k2": b"ok", b"k3": 3})  # type: ignore[dict-item]
        with pytest.raises(InvalidArgumentError, match=r"map key must be bytes, got str"):
            maps.remove(b"u", "k")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match=r"map key must be bytes, got str"):
            maps.get(b"u", "k")  # type: ignore[arg-type]
        assert lists.get(b"u") == [b"a"]
        assert maps.items(b"u") == {b"k": b"v"}
        with pytest.raises(InvalidArgumentError):
            ListState(h.backend, LIST_OP, "bad|slot")
    finally:
        h.close()


def test_views_accept_operator_ids_and_share_state_with_raw_readers(harnesses) -> None:
    """A view built from the op_id sees what one built from the uid wrote; the raw value is the documented codec's."""
    h: Harness = harnesses()
    try:
        by_uid = ListState(h.backend, LIST_OP, SLOT)
        by_id = ListState(h.backend, snapshot.operator_id(LIST_OP), SLOT)
        by_uid.add_all(b"u", [b"1", b"2"])
        by_id.add(b"u", b"3")
        assert by_uid.get(b"u") == [b"1", b"2", b"3"]
        assert h.backend.get(by_uid.op_id, by_uid.key(b"u")) == encode_list([b"1", b"2", b"3"])
        assert by_uid.key(b"u") == snapshot.encode_keyed_key(SLOT, b"u")
    finally:
        h.close()


def test_a_user_key_that_is_not_bytes_is_an_argument_error(harnesses) -> None:
    h: Harness = harnesses()
    try:
        with pytest.raises(InvalidArgumentError):
            ListState(h.backend, LIST_OP, SLOT).add("u", b"v")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError):
            MapState(h.backend, MAP_OP, SLOT).put("u", b"k", b"v")  # type: ignore[arg-type]
    finally:
        h.close()
