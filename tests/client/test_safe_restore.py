"""Safe restore with Flink's rules: state of an operator the job does not declare fails the restore (nothing changes)
unless ``allow_non_restored_state``; declared operators without state are reported, so a changed uid shows.

Real pool server on loopback over a file store and over moto S3, real PoolClient and RemoteReadBackend.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import snapshot
from client import (
    BackendConfig,
    CheckpointInfo,
    InvalidArgumentError,
    MissingOperatorsError,
    NonRestoredStateError,
    RemoteReadBackend,
    RestoredCheckpoint,
)
from store.local import FileStore
from store.objects import ObjectStore
from tests.client_fixtures import counted, serving

CONFIG = BackendConfig(warm_up="off")
A, B = "orders-agg", "dedup"
OP_A, OP_B = snapshot.operator_id(A), snapshot.operator_id(B)
OP_RAW = snapshot.operator_id("never-named")  # written by op_id only: the checkpoint holds it unnamed


def _job() -> str:
    return f"safe-{uuid.uuid4().hex[:10]}"


def _key(uid: str, i: int = 0) -> bytes:
    return snapshot.encode_keyed_key("v", f"{uid}-{i}".encode())


def _write(address: str, job: str, uids: list[str], checkpoint_id: int = 1, tag: str = "v1", raw_ops: tuple[int, ...] = ()) -> None:
    """Checkpoint ``checkpoint_id`` of ``job`` (one subtask, all key groups): two keys per operator, values ``tag|uid|i``."""
    with RemoteReadBackend.connect(address, job, config=CONFIG) as writer:
        if checkpoint_id > 1:
            writer.restore(allow_non_restored_state=True)
        for uid in uids:
            op_id = writer.register_operator(uid)
            for i in range(2):
                writer.put(op_id, _key(uid, i), f"{tag}|{uid}|{i}".encode())
        for op_id in raw_ops:
            writer.put(op_id, _key("raw"), f"{tag}|raw".encode())
        assert writer.snapshot(checkpoint_id).checkpoint.complete


@pytest.fixture
def address(store: ObjectStore) -> Iterator[str]:
    """host:port of a real pool over the file store, and again over moto S3 (``store`` is parametrised over both)."""
    with serving(store) as served:
        yield served


@pytest.fixture(scope="module")
def shared_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One pool over a file store for every example of the property test (each example uses a job of its own)."""
    with serving(FileStore(tmp_path_factory.mktemp("safe-restore") / "store")) as served:
        yield served


# -- undeclared state fails the restore, and nothing changes ------------------------------------------------------


def test_state_of_an_undeclared_operator_fails_the_restore_of_a_new_backend_and_changes_nothing(address: str) -> None:
    job = _job()
    _write(address, job, [A, B])
    with RemoteReadBackend.connect(address, job, config=CONFIG) as b:
        assert b.register_operator(A) == OP_A
        b.put(OP_A, _key("unsaved"), b"unsaved")
        epoch = b.epoch
        with counted(b, "acquire_writer") as acquired, pytest.raises(NonRestoredStateError) as raised:
            b.restore()
        err = raised.value
        assert isinstance(err, InvalidArgumentError)  # the CLI's exit code 2
        assert err.checkpoint_id == 1 and err.operators == {OP_B: B}
        message = str(err)
        assert f"'{B}' (op_id {OP_B}, 0x{OP_B:016x})" in message and f"'{A}'" not in message, message
        assert "nothing was changed" in message and "allow_non_restored_state=True" in message and "old uid" in message, message
        assert acquired == [0], "a writer epoch was acquired before the check"
        assert b.epoch == epoch and not b.fenced and b.read_checkpoint is None and b.parent_id == 0
        assert b.delta_rows == 1 and b.get(OP_A, _key("unsaved")) == b"unsaved"
        assert b.get(OP_A, _key(A)) is None  # still reading nothing from the pool: no read checkpoint


def test_a_failed_restore_leaves_a_restored_backend_reading_its_checkpoint_with_its_cache(address: str) -> None:
    job = _job()
    _write(address, job, [A])
    with RemoteReadBackend.connect(address, job, config=CONFIG) as b:
        b.register_operator(A)
        first = b.restore()
        assert first.checkpoint_id == 1 and first.non_restored == {} and first.declared_without_state == {}
        assert b.get(OP_A, _key(A)) == f"v1|{A}|0".encode()  # cached now
        b.put(OP_A, _key(A, 1), b"unsaved")
        _write(address, job, [A, B], checkpoint_id=2, tag="v2")  # another attempt adds operator B in checkpoint 2
        epoch, stats = b.epoch, b.cache_stats
        with counted(b, "acquire_writer") as acquired, pytest.raises(NonRestoredStateError, match=f"checkpoint 2 .*'{B}'"):
            b.restore()
        assert acquired == [0]
        assert b.epoch == epoch and b.read_checkpoint == 1 and b.parent_id == 1 and b.delta_rows == 1
        assert {k: b.cache_stats[k] for k in ("entries", "bytes")} == {k: stats[k] for k in ("entries", "bytes")}
        assert b.get(OP_A, _key(A)) == f"v1|{A}|0".encode() and b.get(OP_A, _key(A, 1)) == b"unsaved"
        assert b.cache_stats["hits"] == stats["hits"] + 1  # answered from the cache kept across the failed restore


def test_allow_non_restored_state_restores_and_names_what_it_skipped(address: str) -> None:
    job = _job()
    _write(address, job, [A, B])
    with RemoteReadBackend.connect(address, job, config=CONFIG) as b:
        b.register_operator(A)
        info = b.restore(allow_non_restored_state=True)
        assert isinstance(info, RestoredCheckpoint) and isinstance(info, CheckpointInfo)
        assert info.checkpoint_id == 1 and info.complete and set(info.operators) == {OP_A, OP_B}
        assert info.non_restored == {OP_B: B} and info.declared_without_state == {}
        assert b.read_checkpoint == 1
        assert b.get_many(OP_A, [_key(A, 0), _key(A, 1)]) == [f"v1|{A}|0".encode(), f"v1|{A}|1".encode()]
        assert b.get(OP_B, _key(B)) == f"v1|{B}|0".encode()  # skipped, not hidden: reads of it are not prevented


def test_a_renamed_operator_is_reported_as_declared_without_state(address: str, caplog: pytest.LogCaptureFixture) -> None:
    job = _job()
    _write(address, job, [A, B])
    renamed = f"{A}-v2"
    with RemoteReadBackend.connect(address, job, config=CONFIG) as b:
        for uid in (A, B, renamed):
            b.register_operator(uid)
        with caplog.at_level(logging.WARNING, logger="client.backend"):
            info = b.restore()
        assert info.declared_without_state == {renamed: snapshot.operator_id(renamed)} and info.non_restored == {}
        warned = [r for r in caplog.records if r.name == "client.backend" and r.levelno == logging.WARNING]
        assert len(warned) == 1 and repr(renamed) in warned[0].getMessage() and job in warned[0].getMessage()
    with RemoteReadBackend.connect(address, job, config=CONFIG) as b:  # renamed only: A's state is undeclared
        b.register_operator(renamed)
        b.register_operator(B)
        with pytest.raises(NonRestoredStateError) as raised:
            b.restore()
        assert raised.value.operators == {OP_A: A}
        info = b.restore(allow_non_restored_state=True)
        assert info.declared_without_state == {renamed: snapshot.operator_id(renamed)} and info.non_restored == {OP_A: A}


def test_a_backend_that_declares_nothing_restores_everything_as_before(address: str) -> None:
    job = _job()
    _write(address, job, [A, B], raw_ops=(OP_RAW,))
    with RemoteReadBackend.connect(address, job, config=CONFIG) as b:
        info = b.restore()
        assert isinstance(info, RestoredCheckpoint) and info.checkpoint_id == 1
        assert info.declared_without_state == {} and info.non_restored == {}
        assert info.operators == {OP_A: A, OP_B: B, OP_RAW: ""}
        assert b.get(OP_A, _key(A)) == f"v1|{A}|0".encode() and b.get(OP_B, _key(B, 1)) == f"v1|{B}|1".encode()


# -- unnamed operators, the older check, a new job -----------------------------------------------------------------


def test_an_unnamed_operator_in_the_checkpoint_is_named_by_op_id_and_counts_for_a_declared_uid(memory_pool_address: str) -> None:
    job = _job()
    _write(memory_pool_address, job, [A], raw_ops=(OP_RAW, OP_B))  # B written by op_id only: the checkpoint names it ""
    with RemoteReadBackend.connect(memory_pool_address, job, config=CONFIG) as b:
        b.register_operator(A)
        b.register_operator(B)  # present: its op_id holds state, though the checkpoint recorded no uid for it
        with pytest.raises(NonRestoredStateError) as raised:
            b.restore()
        assert raised.value.operators == {OP_RAW: None}
        assert f"unnamed operator (op_id {OP_RAW}, 0x{OP_RAW:016x})" in str(raised.value)
        info = b.restore(allow_non_restored_state=True)
        assert info.non_restored == {OP_RAW: None} and info.declared_without_state == {}
        assert b.get(OP_B, _key("raw")) == b"v1|raw"


def test_expected_operators_are_checked_first(memory_pool_address: str) -> None:
    job = _job()
    _write(memory_pool_address, job, [A, B])
    with RemoteReadBackend.connect(memory_pool_address, job, config=CONFIG) as b:
        b.register_operator(A)
        with pytest.raises(MissingOperatorsError):
            b.restore(expected_operators={A: OP_A, "absent": snapshot.operator_id("absent")})
        with pytest.raises(NonRestoredStateError):
            b.restore(expected_operators={A: OP_A})
        assert b.restore(expected_operators={A: OP_A}, allow_non_restored_state=True).non_restored == {OP_B: B}


def test_a_new_job_and_start_fresh_are_unaffected(memory_pool_address: str) -> None:
    with RemoteReadBackend.connect(memory_pool_address, _job(), config=CONFIG) as b:
        b.register_operator(A)
        assert b.restore() is None and b.read_checkpoint is None
        b.start_fresh()
        assert b.declared_operators == {A: OP_A}


def test_restored_checkpoint_keeps_every_checkpoint_info_field(memory_pool_address: str) -> None:
    job = _job()
    _write(memory_pool_address, job, [A])
    with RemoteReadBackend.connect(memory_pool_address, job, config=CONFIG) as b:
        b.register_operator(A)
        info = b.restore(1, required=True)
        described, _ = b.pool.describe_checkpoint(job, 1)
        for name in CheckpointInfo.__dataclass_fields__:
            assert getattr(info, name) == getattr(described, name), name


# -- the rule, on random operator sets -------------------------------------------------------------------------------

UIDS = st.frozensets(st.sampled_from(["a", "b", "c", "d"]), max_size=4)


@settings(max_examples=25, deadline=None)
@given(written=UIDS.filter(bool), declared=UIDS, allow=st.booleans())
def test_restore_follows_the_rule_on_random_operator_sets(
    shared_address: str, written: frozenset, declared: frozenset, allow: bool
) -> None:
    job = _job()
    _write(shared_address, job, sorted(written))
    ids = {uid: snapshot.operator_id(uid) for uid in written | declared}
    with RemoteReadBackend.connect(shared_address, job, config=CONFIG) as b:
        for uid in sorted(declared):
            b.register_operator(uid)
        epoch = b.epoch
        undeclared = written - declared if declared else frozenset()
        if undeclared and not allow:
            with pytest.raises(NonRestoredStateError) as raised:
                b.restore(allow_non_restored_state=allow)
            assert raised.value.operators == {ids[u]: u for u in undeclared}
            assert b.epoch == epoch and b.read_checkpoint is None
            return
        info = b.restore(allow_non_restored_state=allow)
        assert info.declared_without_state == ({u: ids[u] for u in declared - written})
        assert info.non_restored == {ids[u]: u for u in undeclared}
        assert b.read_checkpoint == 1
        for uid in sorted(written):
            assert b.get(ids[uid], _key(uid)) == f"v1|{uid}|0".encode()
