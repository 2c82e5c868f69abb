"""A backend's read checkpoint replaced by another attempt (simulation seed 51118): its reads fail typed, never answer
from the other attempt's state; compaction and the I3 replacement of an older attempt's other ranges read on normally.

Real pool server on loopback over an in-memory store, real PoolClient and RemoteReadBackend.
"""

from __future__ import annotations

import uuid

import pytest

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
    job = f"repl-{uuid.uuid4().hex[:10]}"
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
    job = f"repl-{uuid.uuid4().hex[:10]}"
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
    job = f"repl-{uuid.uuid4().hex[:10]}"
    a, b = _two_subtasks(memory_pool_address, job)
    a.close()
    b.close()
    with RemoteReadBackend.connect(memory_pool_address, job, (32, 95), config=NO_CACHE) as r, PoolClient(memory_pool_address) as pool:
        r.restore()  # the latest, 2: a base spanning both parts
        etag = r._read_etag
        assert pool.compact_checkpoint(job, 2, force=True)
        assert r.get(OP_COUNT, B_KEY) == b"b2"
        assert r._read_etag != etag and not r.fenced
