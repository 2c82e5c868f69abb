"""Helpers of the maintenance review: a hand-moved clock, maintainers over a store, what a job's folder holds."""

from __future__ import annotations

import time
from collections.abc import Callable

from pool.job_listing import JobListing
from pool.lifecycle import Lifecycle, LifecycleConfig
from pool.maintenance import Maintainer, MaintenanceConfig
from store.layout import job_prefix
from store.objects import ObjectStore


class Clock:
    """A clock the test moves by hand (seconds), from the real time plus ``offset_s`` (a pool whose clock is skewed)."""

    def __init__(self, offset_s: float = 0.0) -> None:
        self.now = float(int(time.time())) + offset_s

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def ms(self) -> int:
        return int(self.now * 1000)


def maintainer_of(
    store: ObjectStore, config: MaintenanceConfig, holder: str, clock: Callable[[], float], max_write_s: float = 20.0
) -> Maintainer:
    """A maintainer on ``store`` as a pool builds one (its lifecycle on the same clock), not started: drive it by run_once."""
    life = Lifecycle(store, LifecycleConfig(max_write_s=max_write_s), clock=clock)
    return Maintainer(store, life, config, holder, clock, max_commit_s=max_write_s)


def complete_ids(store: ObjectStore, job: str) -> list[int]:
    """Ids of the job's complete checkpoints, as a listing shows them."""
    return sorted(JobListing.of(job, list(store.list(job_prefix(job)))).complete)


def data_keys(store: ObjectStore, job: str) -> list[str]:
    """Keys of the job's data files."""
    return [i.key for i in JobListing.of(job, list(store.list(job_prefix(job)))).data]


def referenced_keys(store: ObjectStore, job: str) -> set[str]:
    """Store keys of every data file a complete checkpoint's _metadata names (its layers and its retired files)."""
    from store.layout import job_file_key, metadata_key
    from store.manifest import parse_manifest

    out: set[str] = set()
    for cid in complete_ids(store, job):
        key = metadata_key(job, cid)
        out |= {job_file_key(job, p) for p in parse_manifest(store.get(key), key).referenced_paths}
    return out


class TwoPools:
    """Two real PoolServers on one store, each through its own HookStore view; ``lose_reply_after`` stops the pool that
    makes a chosen store call right after it (its gRPC server only, at once: the call it is running loses its reply).
    """

    def __init__(self, inner: ObjectStore) -> None:
        from pool.server import PoolServer, PoolServerConfig
        from tests.hook_store import HookStore

        self.inner = inner
        self.views = [HookStore(inner), HookStore(inner)]
        self.servers = [PoolServer(PoolServerConfig(listen="127.0.0.1:0", grace_seconds=0.2), store=v).start() for v in self.views]
        self.addresses = ",".join(s.address for s in self.servers)
        self.lost: list[int] = []  # which pool lost a reply

    def lose_reply_after(self, op: str, match: str, skip: int = 0) -> None:
        def stopper(n: int):  # noqa: ANN202
            def run() -> None:
                if self.lost:
                    return  # once in all: the retry on the other pool goes through
                self.lost.append(n)
                grpc_server = self.servers[n]._server  # noqa: SLF001 - the review stops only gRPC, as a SIGKILL would
                assert grpc_server is not None
                grpc_server.stop(0).wait(5)  # bounded: the cancellation has reached the call before it answers

            return run

        for n, view in enumerate(self.views):
            view.on(op, match, stopper(n), when="after", skip=skip)

    def close(self) -> None:
        for server in self.servers:
            server.stop(0)
