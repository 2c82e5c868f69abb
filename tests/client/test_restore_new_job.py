"""restore() on a job with nothing to restore starts empty and returns None; required=True keeps the old NotFoundError."""

from __future__ import annotations

import pytest

import snapshot
from client import BackendConfig, KeyedInt64State, NotFoundError, RemoteReadBackend, RetryPolicy

FAST = BackendConfig(call_deadline_s=5, commit_deadline_s=10, retry=RetryPolicy(max_attempts=3, initial_backoff_s=0.05, max_backoff_s=0.2))
HALVES = [(0, 63), (64, 127)]


def test_restore_on_a_new_job_starts_empty_and_says_so(memory_pool_address: str) -> None:
    with RemoteReadBackend.connect(memory_pool_address, "new-job", config=FAST) as backend:
        counts = KeyedInt64State(backend, "counter", "count")
        counts.put(b"unsaved", 1)
        assert backend.restore() is None  # nothing to restore: a new job, an empty state
        assert backend.read_checkpoint is None and backend.parent_id == 0 and backend.delta_rows == 0
        assert counts.get(b"apple") is None
        assert counts.add(b"apple", 3) == 3
        assert backend.snapshot(1).checkpoint.complete
    with RemoteReadBackend.connect(memory_pool_address, "new-job", config=FAST) as again:
        info = again.restore()
        assert info is not None and info.checkpoint_id == 1
        assert KeyedInt64State(again, "counter", "count").get(b"apple") == 3


def test_required_restore_raises_and_changes_nothing(memory_pool_address: str) -> None:
    with RemoteReadBackend.connect(memory_pool_address, "strict-job", config=FAST) as backend:
        backend.put(backend.register_operator("counter"), b"\x01count|k", b"v")
        epoch = backend.epoch
        with pytest.raises(NotFoundError, match="job strict-job has no complete checkpoint to restore from"):
            backend.restore(required=True)
        assert backend.epoch == epoch and backend.delta_rows == 1
        with pytest.raises(NotFoundError):
            backend.restore(7)  # a checkpoint named that is not there is never an empty start


def test_every_subtask_of_a_new_job_restores_nothing_and_checkpoint_1_completes(memory_pool_address: str) -> None:
    backends = [RemoteReadBackend.connect(memory_pool_address, "split-job", r, FAST) for r in HALVES]
    try:
        first, second = backends
        assert first.restore() is None
        counts = KeyedInt64State(first, "counter", "count")
        key = next(k for k in (f"k{i}".encode() for i in range(100)) if snapshot.key_group(k) <= 63)  # the first half's
        counts.put(key, 5)
        assert not first.snapshot(1).checkpoint.complete  # half the key groups so far
        assert second.restore() is None  # the slower subtask starts later, still before checkpoint 1 is complete
        assert second.snapshot(1).checkpoint.complete
        with RemoteReadBackend.connect(memory_pool_address, "split-job", config=FAST) as restarted:
            info = restarted.restore()
            assert info is not None and info.checkpoint_id == 1 and not info.abandoned
            assert KeyedInt64State(restarted, "counter", "count").get(key) == 5
    finally:
        for b in backends:
            b.close()
