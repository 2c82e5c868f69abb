"""One regression test per protocol defect found in review (issue 10), each named for its defect so it stays visible."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

import snapshot as s
from client.backend import BackendConfig, RemoteReadBackend
from client.pool_client import PoolClient, RetryPolicy
from pool.core import PoolCore
from pool.domain import CommitRequest, KeyGroupRange
from pool.lifecycle import Lifecycle, LifecycleConfig
from snapshot.errors import ConflictError, CorruptSnapshotError, FencedError, InvalidArgumentError, NotFoundError, UnavailableError
from store.local import FileStore
from tests.client_fixtures import start_pool
from tests.hook_store import HookStore
from tests.pool_core_helpers import OP_IDS, OPERATOR_PAIRS, changelog, commit, keyed, keys_in_range, op_key, scan_dict
from tests.sim.mutants import mutant

OP = OP_IDS["window"]
FULL = KeyGroupRange(0, 127)
LOW, HIGH = KeyGroupRange(0, 63), KeyGroupRange(64, 127)
QUARTERS = [KeyGroupRange(32 * i, 32 * i + 31) for i in range(4)]


def put(op: int, key: bytes, value: bytes) -> tuple[int, int, bytes, bytes]:
    return (s.ROW_PUT, op, key, value)


def erase(op: int, key: bytes) -> tuple[int, int, bytes, bytes]:
    return (s.ROW_ERASE, op, key, b"")


def all_reads(core: PoolCore, job: str, cid: int, op: int, key: bytes) -> list[bytes | None]:
    """The value of one key through get, multi_get and a scan (None where absent)."""
    found, value, _ = core.get(job, cid, op, key)
    founds, values, _ = core.multi_get(job, cid, [op], [key])
    scanned = scan_dict(core, job, cid).get((op, key))
    return [value if found else None, values[0] if founds[0] else None, scanned]


def test_defect_01_rescale_4_2_4_2_never_brings_an_overwritten_value_back(tmp_path):
    core = PoolCore(FileStore(tmp_path))
    k = keyed(keys_in_range(40, 40, 1)[0])  # key group 40: in the second quarter and the first half
    low = keyed(keys_in_range(5, 5, 1)[0])  # key group 5: makes the half-range delta reach the first quarter too
    epochs = {kg: core.acquire_writer("j", kg)[0] for kg in QUARTERS}
    for kg in QUARTERS:
        commit(core, "j", 1, 0, kg, epochs[kg], [put(OP, k, b"old")] if kg.lo == 32 else [])
    halves = {kg: core.acquire_writer("j", kg)[0] for kg in (LOW, HIGH)}
    commit(core, "j", 2, 1, LOW, halves[LOW], [put(OP, k, b"new"), put(OP, low, b"x")])
    commit(core, "j", 2, 1, HIGH, halves[HIGH], [])
    epochs = {kg: core.acquire_writer("j", kg)[0] for kg in QUARTERS}
    for kg in QUARTERS:
        commit(core, "j", 3, 2, kg, epochs[kg], [])
    halves = {kg: core.acquire_writer("j", kg)[0] for kg in (LOW, HIGH)}
    for kg in (LOW, HIGH):
        commit(core, "j", 4, 3, kg, halves[kg], [])
    fresh = PoolCore(core.store)
    for cid in (2, 3, 4):
        assert all_reads(fresh, "j", cid, OP, k) == [b"new"] * 3, f"checkpoint {cid}"


def test_defect_01_scale_out_compact_scale_in_keeps_the_newest_value(tmp_path):
    store = FileStore(tmp_path)
    core = PoolCore(store)
    k = keyed(keys_in_range(70, 70, 1)[0])
    e = core.acquire_writer("j", FULL)[0]
    commit(core, "j", 1, 0, FULL, e, [put(OP, k, b"old")])
    halves = {kg: core.acquire_writer("j", kg)[0] for kg in (LOW, HIGH)}
    commit(core, "j", 2, 1, LOW, halves[LOW], [put(OP, keyed(keys_in_range(3, 3, 1)[0]), b"x")])
    commit(core, "j", 2, 1, HIGH, halves[HIGH], [put(OP, k, b"new")])
    Lifecycle(store).compact("j", 2, force=True)
    e = core.acquire_writer("j", FULL)[0]
    commit(core, "j", 3, 2, FULL, e, [])
    assert all_reads(PoolCore(store), "j", 3, OP, k) == [b"new"] * 3


def test_defect_02_compacting_a_part_whose_fold_is_empty_keeps_an_erase(tmp_path):
    store = FileStore(tmp_path)
    core = PoolCore(store)
    o = op_key("offset")
    e = core.acquire_writer("j", FULL)[0]
    commit(core, "j", 1, 0, FULL, e, [put(OP, o, b"1")])
    halves = {kg: core.acquire_writer("j", kg)[0] for kg in (LOW, HIGH)}
    commit(core, "j", 2, 1, LOW, halves[LOW], [erase(OP, o)])
    commit(core, "j", 2, 1, HIGH, halves[HIGH], [])
    assert all_reads(PoolCore(store), "j", 2, OP, o) == [None] * 3
    Lifecycle(store).compact("j", 2, force=True)
    assert all_reads(PoolCore(store), "j", 2, OP, o) == [None] * 3


def test_defect_03_gc_never_deletes_a_file_a_checkpoint_committed_during_the_run_references(tmp_path):
    inner = FileStore(tmp_path)
    store = HookStore(inner)
    core = PoolCore(inner)
    e = core.acquire_writer("j", FULL)[0]
    k1, k2 = keyed("a"), keyed("b")
    commit(core, "j", 1, 0, FULL, e, [put(OP, k1, b"1")])
    commit(core, "j", 2, 1, FULL, e, [put(OP, k2, b"2")])
    life = Lifecycle(store, LifecycleConfig(gc_min_age_s=0))

    def commit_then_retain() -> None:  # after GC listed: a commit reuses the old files, retention removes their manifests
        commit(core, "j", 3, 2, FULL, e, [put(OP, keyed("c"), b"3")])
        Lifecycle(inner).retain("j", keep_last=1)

    store.on("list", "jobs/j/", commit_then_retain, when="after")
    life.gc("j")
    assert scan_dict(PoolCore(inner), "j", 3) == {(OP, k1): b"1", (OP, k2): b"2", (OP, keyed("c")): b"3"}


def test_defect_04_a_part_written_after_its_writer_was_fenced_never_completes_a_checkpoint(tmp_path):
    inner = FileStore(tmp_path)
    store = HookStore(inner)
    core = PoolCore(store)
    zombie = core.acquire_writer("j", LOW)[0]
    high = core.acquire_writer("j", HIGH)[0]
    k = keyed(keys_in_range(1, 1, 1)[0])
    outcome: dict[str, object] = {}
    fresh: dict[str, int] = {}

    def fence() -> None:
        fresh["epoch"] = PoolCore(inner).acquire_writer("j", LOW)[0]

    def zombie_commits() -> None:  # runs inside the HIGH commit's completion, after it read the writers table
        store.on("put_if_absent", "/parts/", fence)  # fenced just before its part lands
        try:
            commit(core, "j", 1, 0, LOW, zombie, [put(OP, k, b"zombie")])
            outcome["zombie"] = "succeeded"
        except FencedError:
            outcome["zombie"] = "fenced"

    armed = {"listed": False}
    store.on("list", "/parts/", lambda: armed.update(listed=True), when="after", times=99)
    # once the HIGH commit has listed the staged parts and read the writers table, the zombie's part lands after its fence
    store.on("get", lambda key: key == "jobs/j/writers" and armed["listed"], zombie_commits, when="after")
    commit(core, "j", 1, 0, HIGH, high, [])
    assert outcome["zombie"] == "fenced"
    assert not any(c.complete for c in PoolCore(inner).list_checkpoints("j", include_incomplete=True))
    result = commit(PoolCore(inner), "j", 1, 0, LOW, fresh["epoch"], [put(OP, k, b"current")])
    assert result.checkpoint.complete
    assert all_reads(PoolCore(inner), "j", 1, OP, k) == [b"current"] * 3


def _backend(address: str, job: str, kg: tuple[int, int], **config) -> RemoteReadBackend:
    return RemoteReadBackend.connect(address, job, kg, BackendConfig(call_deadline_s=10, **config))


@pytest.mark.parametrize("first", ["low", "high"])
def test_defect_05_a_rewind_that_reuses_an_id_starts_a_new_attempt(tmp_path, first):
    server = start_pool(FileStore(tmp_path))
    try:
        a = _backend(server.address, "j", (0, 63))
        b = _backend(server.address, "j", (64, 127))
        ka, kb = keyed(keys_in_range(1, 1, 1)[0]), keyed(keys_in_range(100, 100, 1)[0])
        a.put(OP, ka, b"a1")
        b.put(OP, kb, b"b1")
        a.snapshot(1)
        assert b.snapshot(1).checkpoint.complete
        early = a if first == "low" else b  # one subtask commits 2, then the job fails
        early.put(OP, ka if early is a else kb, b"before-failure")
        early.snapshot(2)
        for backend in (a, b):
            backend.restore(1)
        a.put(OP, ka, b"a2")
        b.put(OP, kb, b"b2")
        a.snapshot(2)
        assert b.snapshot(2).checkpoint.complete
        with PoolClient(server.address) as pool:
            assert pool.get("j", 2, OP, ka) == b"a2"
            assert pool.get("j", 2, OP, kb) == b"b2"
    finally:
        server.stop(0)


def test_defect_05_a_rewind_that_reuses_an_id_of_a_complete_checkpoint_recommits_it(tmp_path):
    server = start_pool(FileStore(tmp_path))
    try:
        a = _backend(server.address, "j", (0, 127))
        k = keyed("k")
        for cid in (1, 2, 3):
            a.put(OP, k, f"v{cid}".encode())
            assert a.snapshot(cid).checkpoint.complete
        a.restore(1)  # the job rewinds: 2 and 3 belong to an abandoned attempt
        a.put(OP, k, b"again")
        assert a.snapshot(2).checkpoint.complete
        with PoolClient(server.address) as pool:
            assert pool.get("j", 2, OP, k) == b"again"
            assert pool.get("j", 0, OP, k) == b"again"  # latest is the rewound job's 2, not the abandoned 3
            latest = [c.checkpoint_id for c in pool.list_checkpoints("j") if c.complete and not c.abandoned]
            assert max(latest) == 2
    finally:
        server.stop(0)


def test_defect_06_a_retried_commit_stages_its_own_part_beside_a_fenced_predecessors(tmp_path):
    inner = FileStore(tmp_path)
    store = HookStore(inner)
    server = start_pool(store)
    try:
        config = dict(retry=RetryPolicy(max_attempts=4, initial_backoff_s=0.01, max_backoff_s=0.02))
        a0 = _backend(server.address, "j", (0, 63), **config)
        b = _backend(server.address, "j", (64, 127), **config)
        ka = keyed(keys_in_range(2, 2, 1)[0])
        a0.put(OP, ka, b"1")
        a0.snapshot(1)
        assert b.snapshot(1).checkpoint.complete
        a0.put(OP, ka, b"zombie")
        a0.snapshot(2)  # staged; the subtask then dies
        a1 = _backend(server.address, "j", (0, 63), **config)
        a1.restore(1)
        a1.put(OP, ka, b"2")

        def unavailable() -> None:
            raise UnavailableError("injected: connection reset before the store saw the request")

        store.on("put_if_absent", "/data/", unavailable)
        result = a1.snapshot(2)
        assert not result.recovered
        assert b.snapshot(2).checkpoint.complete
        a1.put(OP, ka, b"3")
        assert a1.snapshot(3).checkpoint.complete is False  # b has not committed 3 yet; but the parent was found
        with PoolClient(server.address) as pool:
            assert pool.get("j", 2, OP, ka) == b"2"
    finally:
        server.stop(0)


def test_defect_07_after_completion_a_backend_reads_operator_state_as_the_pool_does(tmp_path):
    server = start_pool(FileStore(tmp_path))
    try:
        high = _backend(server.address, "j", (64, 127))
        low = _backend(server.address, "j", (0, 63))
        o = op_key("broadcast")
        high.put(OP, o, b"from-high")
        low.put(OP, o, b"from-low")  # merge rule: for non-8-byte values the lowest key groups win
        assert not high.snapshot(1).checkpoint.complete
        assert low.snapshot(1).checkpoint.complete
        high.refresh_completion()
        with PoolClient(server.address) as pool:
            pooled = pool.get("j", 1, OP, o)
        assert pooled == b"from-low"
        assert high.get(OP, o) == pooled
        assert low.get(OP, o) == pooled
    finally:
        server.stop(0)


def test_defect_08_an_sdk_retry_of_a_conditional_put_is_resolved_by_reading_back(make_s3_store):
    store = make_s3_store(prefix="sdk-retry")
    retried = {"n": 0}

    def retry_once(attempts: int, **_: object):  # the first PUT lands; its reply is "lost", so the SDK sends it again
        if attempts == 1 and retried["n"] == 0:
            retried["n"] += 1
            return 0
        return None

    store._client.meta.events.register_first("needs-retry.s3.PutObject", retry_once)
    store.put_if_absent("a/one", b"payload")
    assert retried["n"] == 1
    assert store.get("a/one") == b"payload"
    with pytest.raises(ConflictError):
        store.put_if_absent("a/one", b"other")  # a real conflict stays a conflict
    _, etag = store.get_with_etag("a/one")
    retried["n"] = 0
    store.compare_and_swap("a/one", b"swapped", etag)
    assert retried["n"] == 1 and store.get("a/one") == b"swapped"


def test_defect_09_another_pool_never_serves_a_manifest_that_was_deleted_and_recommitted(tmp_path):
    store = FileStore(tmp_path)
    reader_pool, writer_pool = PoolCore(store), PoolCore(store)
    k = keyed("k")
    e = writer_pool.acquire_writer("j", FULL)[0]
    commit(writer_pool, "j", 1, 0, FULL, e, [put(OP, k, b"first-life")])
    assert all_reads(reader_pool, "j", 1, OP, k) == [b"first-life"] * 3
    writer_pool.delete_checkpoint("j", 1)  # the job is deleted and created again under its old name
    for obj in list(store.list("jobs/j/")):
        store.delete(obj.key)
    e = writer_pool.acquire_writer("j", FULL)[0]
    commit(writer_pool, "j", 1, 0, FULL, e, [put(OP, k, b"second-life")])
    assert all_reads(reader_pool, "j", 1, OP, k) == [b"second-life"] * 3


def test_defect_09_a_compaction_by_another_pool_is_seen_by_commits(tmp_path):
    store = FileStore(tmp_path)
    pool_a, pool_b = PoolCore(store), PoolCore(store)
    e = pool_a.acquire_writer("j", FULL)[0]
    for cid in (1, 2, 3):
        commit(pool_a, "j", cid, cid - 1, FULL, e, [put(OP, keyed(f"k{cid}"), b"v")])
    Lifecycle(store, on_manifest_replaced=pool_b.forget_manifest).compact("j", 3, force=True)
    result = commit(pool_a, "j", 4, 3, FULL, e, [])
    info, manifest_json = pool_a.describe_checkpoint("j", 4)
    assert result.checkpoint.complete and info.num_files == 1  # built on the compacted base, not the three old layers


def test_defect_10_an_empty_key_is_refused_at_put_erase_and_get(tmp_path):
    server = start_pool(FileStore(tmp_path))
    try:
        backend = _backend(server.address, "j", (0, 127))
        for call in (lambda: backend.put(OP, b"", b"v"), lambda: backend.erase(OP, b""), lambda: backend.get(OP, b"")):
            with pytest.raises(InvalidArgumentError, match="empty"):
                call()
        backend.put(OP, keyed("k"), b"v")
        assert backend.snapshot(1).checkpoint.complete  # nothing was wedged
    finally:
        server.stop(0)


def test_defect_11_bytes_after_the_end_of_stream_are_corrupt():
    table = pa.table({"op_id": pa.array([1], pa.uint64()), "key_bytes": [b"\x00v|a"], "value_bytes": [b"1"]})
    one = s.write_snapshot(table)
    with pytest.raises(CorruptSnapshotError, match="after the end"):
        s.read_snapshot(one + one)


def test_defect_11_a_stored_data_file_read_by_any_arrow_reader_yields_every_row_or_fails(tmp_path):
    store = FileStore(tmp_path)
    core = PoolCore(store)
    e = core.acquire_writer("j", FULL)[0]
    rows = [put(OP, keyed(f"k{i}"), b"x" * 2000) for i in range(400)] + [put(OP, op_key("o"), b"1")]
    core_with_small_segments = PoolCore(store, core.config.__class__(segment_target_bytes=4096))
    commit(core_with_small_segments, "j", 1, 0, FULL, e, rows)
    [path] = [o.key for o in store.list("jobs/j/data/")]
    data = store.get(path)
    try:
        got = ipc.open_file(pa.py_buffer(data)).read_all().num_rows
    except pa.ArrowInvalid:
        got = None
    if got is None:
        try:
            got = ipc.open_stream(pa.py_buffer(data)).read_all().num_rows
        except pa.ArrowInvalid:
            got = "refused"
    assert got in (len(rows), "refused")
    assert got == len(rows)  # the IPC file format: every reader gets every row


def test_examine_a_parent_compacted_between_two_attempts_of_one_commit(tmp_path):
    store = FileStore(tmp_path)
    core = PoolCore(store)
    e = core.acquire_writer("j", FULL)[0]
    commit(core, "j", 1, 0, FULL, e, [put(OP, keyed("a"), b"1")])
    commit(core, "j", 2, 1, FULL, e, [put(OP, keyed("b"), b"2")])
    request = CommitRequest("j", 3, 2, FULL, e, "", OPERATOR_PAIRS)
    blob = changelog([put(OP, keyed("c"), b"3")])
    core.commit_checkpoint(request, [blob])  # its reply is lost
    Lifecycle(store).compact("j", 2, force=True)
    again = core.commit_checkpoint(request, [blob])
    assert again.checkpoint.complete
    assert scan_dict(PoolCore(store), "j", 3) == {(OP, keyed("a")): b"1", (OP, keyed("b")): b"2", (OP, keyed("c")): b"3"}


def test_examine_retention_keeps_the_checkpoint_a_rewound_job_restored_from(tmp_path):
    server = start_pool(FileStore(tmp_path))
    try:
        a = _backend(server.address, "j", (0, 127))
        for cid in range(1, 6):
            a.put(OP, keyed("k"), f"v{cid}".encode())
            a.snapshot(cid)
        a.restore(2)
        Lifecycle(server.store).retain("j", keep_last=2)
        a.put(OP, keyed("k"), b"after-rewind")
        assert a.snapshot(3).checkpoint.complete
    finally:
        server.stop(0)


def test_examine_two_concurrent_restores_into_one_new_job(tmp_path):
    inner = FileStore(tmp_path)
    core = PoolCore(inner)
    e = core.acquire_writer("src", FULL)[0]
    commit(core, "src", 1, 0, FULL, e, [put(OP, keyed("a"), b"1")])
    other = PoolCore(inner)
    e = other.acquire_writer("src2", FULL)[0]
    commit(other, "src2", 1, 0, FULL, e, [put(OP, keyed("b"), b"2")])
    store = HookStore(inner)
    outcome = {}

    def racing_restore() -> None:
        try:
            Lifecycle(inner).restore_job("new", job="src2", checkpoint_id=1)
            outcome["racer"] = "ok"
        except ConflictError:
            outcome["racer"] = "conflict"

    store.on("put_if_absent", "jobs/new/", racing_restore)
    try:
        Lifecycle(store).restore_job("new", job="src", checkpoint_id=1)
        outcome["first"] = "ok"
    except ConflictError:
        outcome["first"] = "conflict"
    assert sorted(outcome.values()) == ["conflict", "ok"]
    state = scan_dict(PoolCore(inner), "new", 1)
    assert state in ({(OP, keyed("a")): b"1"}, {(OP, keyed("b")): b"2"})


def test_examine_get_finds_an_empty_legacy_key_that_a_scan_returns(tmp_path):
    store = FileStore(tmp_path)
    table = pa.table({"op_id": pa.array([OP, OP], pa.uint64()), "key_bytes": [b"", keyed("k")], "value_bytes": [b"empty", b"v"]})
    store.put("savepoints/legacy/_metadata", b"")  # placeholder, replaced below
    from store.datafile import KIND_BASE, encode_datafile
    from store.manifest import MANIFEST_FORMAT, Manifest, Part

    encoded = encode_datafile(table, changelog=False)
    store.put("jobs/j/data/base.arrow", encoded.data)
    m = Manifest(
        MANIFEST_FORMAT,
        "j",
        1,
        0,
        0,
        (),
        "",
        (Part(0, 127, 1, 0, (("data/base.arrow",),)),),
        (encoded.entry("data/base.arrow", KIND_BASE, 0, 127, 1),),
    )
    store.put("jobs/j/chk-1/_metadata", m.to_json())
    core = PoolCore(store)
    assert scan_dict(core, "j", 1)[(OP, b"")] == b"empty"
    assert all_reads(core, "j", 1, OP, b"") == [b"empty"] * 3


def test_examine_file_store_etags_never_repeat_after_a_replace(tmp_path):
    store = FileStore(tmp_path)
    seen = set()
    for i in range(300):
        etag = store.put("jobs/j/writers", b"%04d" % (i % 2))  # same size, alternating content: inodes get reused
        assert etag not in seen
        seen.add(etag)


def test_defect_05_restore_in_place_takes_a_new_epoch(tmp_path):
    server = start_pool(FileStore(tmp_path))
    try:
        a = _backend(server.address, "j", (0, 127))
        a.put(OP, keyed("k"), b"1")
        a.snapshot(1)
        before = a.epoch
        a.restore(1)
        assert a.epoch > before
        with pytest.raises((FencedError, NotFoundError, ConflictError)):
            PoolCore(server.store).commit_checkpoint(CommitRequest("j", 2, 1, FULL, before, "", OPERATOR_PAIRS), [changelog([])])
    finally:
        server.stop(0)


# Safeguards no other check isolates: each test below fails with its mutant (tests/sim/mutants.py) put back.
# GC keeps its minimum age (files written by the commit in flight are young); what existed before is made old.


def _age_everything(root) -> None:
    import os
    import time

    old = time.time() - 7200
    for path in root.rglob("*"):
        if path.is_file():
            os.utime(path, (old, old))


def test_safeguard_a_commit_whose_parent_vanished_after_gc_listed_never_completes(tmp_path):
    """The parent is deleted and GC removes its files between the commit reading its parent and writing its part."""
    inner = FileStore(tmp_path)
    store = HookStore(inner)
    core = PoolCore(store)
    e = core.acquire_writer("j", FULL)[0]
    commit(core, "j", 1, 0, FULL, e, [put(OP, keyed("a"), b"1")])
    commit(core, "j", 2, 1, FULL, e, [put(OP, keyed("b"), b"2")])

    _age_everything(tmp_path)

    def delete_parent_then_gc() -> None:
        PoolCore(inner).delete_checkpoint("j", 2)
        PoolCore(inner).delete_checkpoint("j", 1)
        assert Lifecycle(inner, LifecycleConfig(gc_min_age_s=600)).gc("j").deleted  # the parents' files go

    store.on("put_if_absent", "chk-3/parts/", delete_parent_then_gc)
    try:
        result = commit(core, "j", 3, 2, FULL, e, [put(OP, keyed("c"), b"3")])
    except (ConflictError, NotFoundError, UnavailableError):
        result = None
    if result is not None and result.checkpoint.complete:  # complete only if every file it names is there
        assert scan_dict(PoolCore(inner), "j", 3) == {(OP, keyed("a")): b"1", (OP, keyed("b")): b"2", (OP, keyed("c")): b"3"}
    assert not inner.exists("jobs/j/chk-3/_metadata") or scan_dict(PoolCore(inner), "j", 3)


def test_safeguard_a_restore_from_a_checkpoint_deleted_meanwhile_is_refused(tmp_path):
    inner = FileStore(tmp_path)
    core = PoolCore(inner)
    e = core.acquire_writer("j", FULL)[0]
    commit(core, "j", 1, 0, FULL, e, [put(OP, keyed("a"), b"1")])
    commit(core, "j", 2, 1, FULL, e, [put(OP, keyed("b"), b"2")])
    core.delete_checkpoint("j", 1)
    with pytest.raises(NotFoundError, match="1"):
        PoolCore(inner).acquire_writer("j", FULL, restore_from=1)
    assert core.acquire_writer("j", FULL, restore_from=2)[0] > e


def test_safeguard_a_commit_racing_a_compaction_of_its_parent_completes_and_keeps_its_files(tmp_path):
    """Compaction replaces the parent's _metadata while a commit carries its files: the replaced files stay named (retired)."""
    inner = FileStore(tmp_path)
    store = HookStore(inner)
    core = PoolCore(store)
    e = core.acquire_writer("j", FULL)[0]
    for cid in range(1, 4):
        commit(core, "j", cid, cid - 1, FULL, e, [put(OP, keyed(f"k{cid}"), str(cid).encode())])

    _age_everything(tmp_path)

    def compact_parent_then_gc() -> None:
        assert Lifecycle(inner).compact("j", 3, force=True).folded
        Lifecycle(inner, LifecycleConfig(gc_min_age_s=600)).gc("j")

    store.on("put_if_absent", "chk-4/parts/", compact_parent_then_gc)
    result = commit(core, "j", 4, 3, FULL, e, [put(OP, keyed("k4"), b"4")])
    assert result.checkpoint.complete
    _age_everything(tmp_path)
    Lifecycle(inner, LifecycleConfig(gc_min_age_s=600)).gc("j")
    assert scan_dict(PoolCore(inner), "j", 4) == {(OP, keyed(f"k{c}")): str(c).encode() for c in range(1, 5)}


# ---- each regression test above fails with its defect put back (tests/sim/mutants.py) ------------------------------


@pytest.mark.parametrize(
    ("name", "test"),
    [
        ("layers_in_listed_order", test_defect_01_rescale_4_2_4_2_never_brings_an_overwritten_value_back),
        ("empty_fold_writes_no_base", test_defect_02_compacting_a_part_whose_fold_is_empty_keeps_an_erase),
        ("gc_skips_vanished_manifests", test_defect_03_gc_never_deletes_a_file_a_checkpoint_committed_during_the_run_references),
        ("no_parent_check_after_commit", test_safeguard_a_commit_whose_parent_vanished_after_gc_listed_never_completes),
        ("restore_from_vanished_checkpoint", test_safeguard_a_restore_from_a_checkpoint_deleted_meanwhile_is_refused),
        ("compaction_forgets_retired_files", test_safeguard_a_commit_racing_a_compaction_of_its_parent_completes_and_keeps_its_files),
    ],
)
def test_a_regression_test_fails_with_its_defect_put_back(tmp_path, name: str, test) -> None:
    test(tmp_path / "ok")  # passes on the code as it is
    with mutant(name), pytest.raises((Exception, pytest.fail.Exception)):  # a wrong answer, an error, or a pytest.raises that saw none
        test(tmp_path / "mutant")
