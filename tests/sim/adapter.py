"""LocalPool: what RemoteReadBackend needs of a PoolClient, served in process by several PoolCores (no gRPC, so it stays deterministic)."""

from __future__ import annotations

import random
from collections.abc import Sequence

from client.backend import BackendConfig, RemoteReadBackend
from client.pool_client import CheckpointInfo, CommitResult, WriterLease
from pool.core import PoolCore
from pool.domain import CheckpointInfo as PoolCheckpointInfo
from pool.domain import CommitRequest, KeyGroupRange
from snapshot.errors import UnavailableError

RETRIES = 4  # attempts of one call, as PoolClient retries UNAVAILABLE


def client_info(info: PoolCheckpointInfo) -> CheckpointInfo:
    """The pool's CheckpointInfo as the client's."""
    return CheckpointInfo(
        job=info.job,
        checkpoint_id=info.checkpoint_id,
        parent_id=info.parent_id,
        complete=info.complete,
        committed_ranges=tuple((r.lo, r.hi) for r in info.committed_ranges),
        created_at_ms=info.created_at_ms,
        num_files=info.num_files,
        total_bytes=info.total_bytes,
        num_rows=info.num_rows,
        operators=dict(info.operators),
        state_versions=info.state_versions,
        manifest_etag=info.manifest_etag,
        abandoned=info.abandoned,
        key_group_bytes=info.key_group_bytes,
        operator_state_bytes=info.operator_state_bytes,
    )


class LocalPool:
    """Each call goes to a pool core the rng picks (pools share nothing but the store); retries as PoolClient does."""

    def __init__(self, cores: list[PoolCore], rng: random.Random) -> None:
        self.cores = cores
        self.rng = rng
        self.calls = 0

    def _core(self) -> PoolCore:
        return self.rng.choice(self.cores)

    def _retry(self, fn):
        for attempt in range(RETRIES):
            self.calls += 1
            try:
                return fn(attempt)
            except UnavailableError:
                if attempt == RETRIES - 1:
                    raise
        raise AssertionError("unreachable")

    def _seen(self, info: PoolCheckpointInfo) -> CheckpointInfo:
        return client_info(info)

    def acquire_writer(self, job: str, key_groups: tuple[int, int], restore_from: int | None = None) -> WriterLease:
        epoch, latest = self._retry(lambda _: self._core().acquire_writer(job, KeyGroupRange(*key_groups), restore_from))
        return WriterLease(job, tuple(key_groups), epoch, latest)

    def commit_checkpoint(
        self,
        job: str,
        checkpoint_id: int,
        parent_id: int,
        key_groups: tuple[int, int],
        epoch: int,
        delta,
        state_versions: str = "",
        operators: dict[int, str] | None = None,
    ) -> CommitResult:
        blob = bytes(delta)
        ops = tuple(sorted((operators or {}).items()))

        def run(attempt: int):
            request = CommitRequest(job, checkpoint_id, parent_id, KeyGroupRange(*key_groups), epoch, state_versions, ops, attempt)
            return self._core().commit_checkpoint(request, [blob])

        result = self._retry(run)
        return CommitResult(self._seen(result.checkpoint), result.bytes_written, recovered=result.repeated)

    def get(self, job: str, checkpoint_id: int, op_id: int, key: bytes, manifest_etag: str = "") -> bytes | None:
        return self.multi_get_at(job, checkpoint_id, [op_id], [key], manifest_etag)[0][0]

    def multi_get(
        self, job: str, checkpoint_id: int, op_ids: Sequence[int], keys: Sequence[bytes], manifest_etag: str = ""
    ) -> list[bytes | None]:
        return self.multi_get_at(job, checkpoint_id, op_ids, keys, manifest_etag)[0]

    def multi_get_at(self, job: str, checkpoint_id: int, op_ids: Sequence[int], keys: Sequence[bytes], manifest_etag: str = ""):
        op_ids = list(op_ids) * len(keys) if len(op_ids) == 1 and len(keys) != 1 else list(op_ids)

        def run(_: int):
            core = self._core()
            manifest, etag = core.resolve(job, checkpoint_id, manifest_etag or None)
            found, values, _ = core.multi_get(job, manifest.checkpoint_id, op_ids, list(keys), etag)
            return [v if f else None for f, v in zip(found, values, strict=True)], etag

        return self._retry(run)

    def scan_checkpoint(
        self, job: str, checkpoint_id: int, key_groups=None, op_ids=(), delta: bytes = b"", manifest_etag: str = ""
    ) -> bytes:
        kg = KeyGroupRange(*key_groups) if key_groups is not None else None
        return self._retry(
            lambda _: b"".join(self._core().scan(job, checkpoint_id, kg, list(op_ids), delta or None, manifest_etag=manifest_etag or None))
        )

    def list_checkpoints(self, job: str, include_incomplete: bool = False) -> list[CheckpointInfo]:
        return [self._seen(i) for i in self._retry(lambda _: self._core().list_checkpoints(job, include_incomplete))]

    def describe_checkpoint(self, job: str, checkpoint_id: int) -> tuple[CheckpointInfo, str]:
        info, doc = self._retry(lambda _: self._core().describe_checkpoint(job, checkpoint_id))
        return self._seen(info), doc

    def close(self) -> None:
        """Nothing to close."""


def connect(pool: LocalPool, job: str, key_groups: tuple[int, int], config: BackendConfig | None = None) -> RemoteReadBackend:
    """RemoteReadBackend.connect over a LocalPool."""
    backend = RemoteReadBackend(pool, job, key_groups, config or BackendConfig(), owns_pool=False)  # type: ignore[arg-type]
    lease = pool.acquire_writer(job, backend.key_groups)
    backend.epoch = lease.epoch
    backend.latest_checkpoint_at_connect = lease.latest_checkpoint_id
    return backend


__all__ = ["LocalPool", "client_info", "connect"]
