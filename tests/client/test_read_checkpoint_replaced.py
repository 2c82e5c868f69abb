"""A backend's read checkpoint replaced by another attempt (simulation seed 51118): its reads fail typed, never answer
from the other attempt's state; compaction and the I3 replacement of an older attempt's other ranges read on normally.

Real pool server on loopback over an in-memory store, real PoolClient and RemoteReadBackend. The second half is a
fresh-eye review of the check: two attacks that broke it (fixed), pins of three that did not.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

import client.pool_client as pool_client
import snapshot
from client import BackendConfig, PoolClient, RemoteReadBackend
from client.errors import FencedError
from tests.client_fixtures import OP_COUNT, counted

NO_CACHE = BackendConfig(cache_bytes=0, warm_up="off")  # every read goes to the pool


def _key_in(lo: int, hi: int, tag: str) -> bytes:
    for i in range(10000):
        user = f"{tag}-{i}".encode()
        if lo <= snapshot.key_group(user) <= hi:
            return snapshot.encode_keyed_key("v", user)
    raise AssertionError("no key found")


A_KEY, B_KEY = _key_in(0, 63, "a"), _key_in(64, 95, "b")  # B_KEY also inside 32-95
C_KEY = _key_in(0, 63, "c")  # written by the other life only


def _job() -> str:
    return f"repl-{uuid.uuid4().hex[:10]}"


def _two_subtasks(address: str, job: str) -> tuple[RemoteReadBackend, RemoteReadBackend]:
    """Subtasks 0-63 and 64-127 complete checkpoints 1 and 2; B's key is written in 2 only. Both read checkpoint 2."""
    a = RemoteReadBackend.connect(address, job, (0, 63), config=NO_CACHE)
    b = RemoteReadBackend.connect(address, job, (64, 127), config=NO_CACHE)
    a.put(OP_COUNT, A_KEY, b"a1")
    b.put(OP_COUNT, _key_in(64, 127, "other"), b"b1")
    a.snapshot(1)
    assert b.snapshot(1).checkpoint.complete
    a.put(OP_COUNT, A_KEY, b"a2")
    b.put(OP_COUNT, B_KEY, b"b2")
    a.snapshot(2)
    assert b.snapshot(2).checkpoint.complete
    a.refresh_completion()
    assert a.read_checkpoint == b.read_checkpoint == 2
    return a, b


def test_a_fenced_backend_whose_read_checkpoint_another_attempt_completed_again_fails_its_reads(memory_pool_address: str) -> None:
    job = _job()
    a, b = _two_subtasks(memory_pool_address, job)
    # a rewind to checkpoint 1 as one subtask: it fences A and B, writes B's key otherwise, and completes 2 again
    with RemoteReadBackend.connect(memory_pool_address, job, (0, 127), config=NO_CACHE) as c:
        c.restore(1)
        c.erase(OP_COUNT, B_KEY)
        c.put(OP_COUNT, A_KEY, b"other life")
        assert c.snapshot(2).checkpoint.complete
    for zombie, key in ((b, B_KEY), (a, A_KEY)):  # B was never told it was fenced: it never committed since
        with pytest.raises(FencedError) as info:
            got = zombie.get(OP_COUNT, key)
            pytest.fail(f"the fenced backend read {got!r} from the other attempt's checkpoint 2")
        message = str(info.value)
        assert job in message and "checkpoint 2" in message and "replaced" in message, message
        assert zombie.fenced
        with pytest.raises(FencedError):
            zombie.get_many(OP_COUNT, [key])
    a.close()
    b.close()


def test_a_live_backend_reads_on_across_compaction_and_the_replacement_of_another_range(memory_pool_address: str) -> None:
    job = _job()
    a, b = _two_subtasks(memory_pool_address, job)
    etag = b._read_etag
    with PoolClient(memory_pool_address) as pool:
        assert pool.compact_checkpoint(job, 2, force=True)
        with counted(b, "describe_checkpoint") as described:
            assert b.get(OP_COUNT, B_KEY) == b"b2"  # answered from the compacted version: same parts, read on
        assert b._read_etag != etag and described[0] == 1
        # subtask 0-63 restarts from checkpoint 1 and commits 2 again: the version in place holds A's fenced part, so
        # the new one replaces it (I3); B's own part is in both, and B reads on
        a.close()
        with RemoteReadBackend.connect(memory_pool_address, job, (0, 63), config=NO_CACHE) as a2:
            a2.restore(1)
            a2.put(OP_COUNT, A_KEY, b"a2 again")
            assert a2.snapshot(2).checkpoint.complete
        etag = b._read_etag
        assert b.get(OP_COUNT, B_KEY) == b"b2"
        assert b._read_etag != etag and not b.fenced
    b.close()


def test_a_backend_restored_from_a_checkpoint_reads_on_after_its_compaction(memory_pool_address: str) -> None:
    job = _job()
    a, b = _two_subtasks(memory_pool_address, job)
    a.close()
    b.close()
    with RemoteReadBackend.connect(memory_pool_address, job, (32, 95), config=NO_CACHE) as r, PoolClient(memory_pool_address) as pool:
        r.restore()  # the latest, 2: a base spanning both parts
        etag = r._read_etag
        assert pool.compact_checkpoint(job, 2, force=True)
        assert r.get(OP_COUNT, B_KEY) == b"b2"
        assert r._read_etag != etag and not r.fenced


# ---- review: attacks on the check ---------------------------------------------------------------------------------


# -- false negative: refresh_completion adopts another life's version as the one it holds ---------------------------


def test_a_zombie_that_learns_of_its_checkpoint_through_refresh_completion_never_reads_the_other_life(
    memory_pool_address: str,
) -> None:
    """A commits 2 (incomplete), a rewind completes 2 without A's part: A.refresh_completion checks the listed version.

    It released 2 with the other life's etag, so no read ever saw an etag change and A read the other life's state.
    """
    job = _job()
    a = RemoteReadBackend.connect(memory_pool_address, job, (0, 63), config=NO_CACHE)
    b = RemoteReadBackend.connect(memory_pool_address, job, (64, 127), config=NO_CACHE)
    a.put(OP_COUNT, A_KEY, b"a1")
    b.put(OP_COUNT, B_KEY, b"b1")
    a.snapshot(1)
    assert b.snapshot(1).checkpoint.complete
    a.refresh_completion()
    a.put(OP_COUNT, A_KEY, b"a2")
    assert not a.snapshot(2).checkpoint.complete  # B has not committed 2: A's part waits
    with RemoteReadBackend.connect(memory_pool_address, job, (0, 127), config=NO_CACHE) as c:
        c.restore(1)  # the rewind: fences A and B
        c.put(OP_COUNT, C_KEY, b"other life")
        c.put(OP_COUNT, A_KEY, b"other life")
        assert c.snapshot(2).checkpoint.complete
    try:
        a.refresh_completion()  # FencedError here is a fine answer too
    except FencedError:
        pass
    for key in (C_KEY, A_KEY):
        try:
            got = a.get(OP_COUNT, key)
        except FencedError:
            continue
        assert got != b"other life", f"the fenced backend read {got!r} from the other attempt's checkpoint 2"
    a.close()
    b.close()


# -- false positive: an asynchronous read of an earlier attempt fences the live attempt that followed ----------------


def test_an_aget_of_the_attempt_before_a_restore_never_marks_the_live_attempt_fenced(memory_pool_address: str) -> None:
    """An aget issued at checkpoint 2 (A's own), then A restores from 1, 2 is compacted, the batch flushes: no fence.

    _fetch took the attempt at fetch time, not the read point's, so the old read was checked against the new epoch,
    failed, and set fenced=True on a backend whose writer holds its range (the flag even survived a successful commit).
    """
    job = _job()
    a, b = _two_subtasks(memory_pool_address, job)

    async def run() -> None:
        future = a.aget(OP_COUNT, A_KEY)  # looked up at the batch's flush (or when the restore seals it): a miss
        a.restore(1)
        with PoolClient(memory_pool_address) as pool:
            assert pool.compact_checkpoint(job, 2, force=True)
        try:
            assert await future in (b"a2", b"a1")
        except FencedError:
            pass  # debatable for the old attempt's read; the flag below is not

    asyncio.run(run())
    assert not a.fenced, "the live attempt (its writer holds 0-63) was marked fenced by an earlier attempt's read"
    assert a.get(OP_COUNT, A_KEY) == b"a1"
    a.put(OP_COUNT, A_KEY, b"a2 again")
    a.snapshot(2)  # the writer is live: the commit is accepted
    assert not a.fenced
    a.close()
    b.close()


# -- pins: attacks that fail to break it -----------------------------------------------------------------------------


def test_pin_describe_once_per_version_over_get_get_many_and_async_reads(memory_pool_address: str) -> None:
    job = _job()
    a, b = _two_subtasks(memory_pool_address, job)
    with PoolClient(memory_pool_address) as pool:
        assert pool.compact_checkpoint(job, 2, force=True)
    with counted(b, "describe_checkpoint") as described:
        pending = [b.get_async(OP_COUNT, B_KEY) for _ in range(3)]  # issued at the old etag
        assert [f.result(5) for f in pending] == [b"b2"] * 3
        for _ in range(3):
            assert b.get(OP_COUNT, B_KEY) == b"b2"
            assert b.get_many(OP_COUNT, [B_KEY, _key_in(64, 127, "nope")]) == [b"b2", None]
    assert described[0] == 1 and not b.fenced
    a.close()
    b.close()


def test_pin_batches_of_one_multi_get_across_a_compaction_and_across_a_rewind(
    memory_pool_address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One get_many split in batches: a compaction between them reads on; a rewind re-completing between them fails typed.

    The batches are pinned to the first's etag; the last batch's etag is the one checked.
    """
    monkeypatch.setattr(pool_client, "MULTI_GET_BATCH_KEYS", 1)
    job = _job()
    a, b = _two_subtasks(memory_pool_address, job)
    other = _key_in(64, 127, "other")
    real = PoolClient._multi_get_batch
    between: list = []

    def batch(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        if between:
            between.pop()()
        return out

    monkeypatch.setattr(PoolClient, "_multi_get_batch", batch)

    def compact() -> None:
        with PoolClient(memory_pool_address) as pool:
            assert pool.compact_checkpoint(job, 2, force=True)

    between.append(compact)
    assert b.get_many(OP_COUNT, [B_KEY, other]) == [b"b2", b"b1"] and not b.fenced

    def rewind() -> None:
        with RemoteReadBackend.connect(memory_pool_address, job, (0, 127), config=NO_CACHE) as c:
            c.restore(1)
            c.put(OP_COUNT, other, b"other life")
            assert c.snapshot(2).checkpoint.complete

    between.append(rewind)
    with pytest.raises(FencedError):
        b.get_many(OP_COUNT, [B_KEY, other])
    assert b.fenced
    a.close()
    b.close()


def test_pin_rescaled_restores_base_none_commit_and_i3_replacement_read_on(memory_pool_address: str) -> None:
    """Backends restored with a new range (a base of two parts) or started fresh read on after compaction and an I3 replacement."""
    job = _job()
    a, b = _two_subtasks(memory_pool_address, job)
    a.close()
    b.close()
    # scale up: four subtasks restore from 2; 32-95 reads a base made of parts 0-63 and 64-127
    ranges = [(0, 31), (32, 95), (96, 127)]
    subs = [RemoteReadBackend.connect(memory_pool_address, job, r, config=NO_CACHE) for r in ranges]
    for s in subs:
        s.restore(2)
    with PoolClient(memory_pool_address) as pool:
        assert pool.compact_checkpoint(job, 2, force=True)
        assert subs[1].get(OP_COUNT, B_KEY) == b"b2"
        for s in subs:
            s.snapshot(3)
        assert all(s.refresh_completion() == 3 for s in subs)
        assert pool.compact_checkpoint(job, 3, force=True)
        assert subs[1].get(OP_COUNT, B_KEY) == b"b2"
        # 96-127 fails over: restores 2 again and re-completes 3; the others' parts stay (I3), they read on
        before = [s._read_etag for s in subs[:2]]
        subs[2].restore(2)
        subs[2].snapshot(3)
        assert subs[2].read_checkpoint == 3
        assert subs[1].get(OP_COUNT, B_KEY) == b"b2" and subs[0].get(OP_COUNT, A_KEY) == b"a2"
        assert all(
            x != y for x, y in zip([s._read_etag for s in subs[:2]], before, strict=True)
        )  # answered from the replacement: checked, and passed
        assert not any(s.fenced for s in subs)
    for s in subs:
        s.close()
    fresh_job = _job()
    with RemoteReadBackend.connect(memory_pool_address, fresh_job, config=NO_CACHE) as f, PoolClient(memory_pool_address) as pool:
        assert f.restore() is None  # base None
        f.put(OP_COUNT, A_KEY, b"f1")
        f.snapshot(1)
        f.put(OP_COUNT, B_KEY, b"f2")
        f.snapshot(2)
        assert pool.compact_checkpoint(fresh_job, 2, force=True)
        assert f.get(OP_COUNT, A_KEY) == b"f1" and not f.fenced
