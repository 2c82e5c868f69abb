"""One job-id rule (snapshot/names.py): the client refuses what the pool refuses, before it sends anything."""

from __future__ import annotations

import time

import pytest

import pool.core
import pool.lifecycle_context
from client import BackendConfig, InvalidArgumentError, PoolClient, PoolClientConfig, RemoteReadBackend
from snapshot.names import validate_job

BAD = ["my job", "tab\tjob", "nb\u00a0sp", "a/b", "a..b", "", "j" * 129, ".clink-x"]
NOWHERE = "127.0.0.1:1"  # nothing listens: a call that reached the network would fail as UNAVAILABLE, after retries


def test_pool_and_client_share_one_rule() -> None:
    assert pool.core.validate_job is validate_job
    assert pool.lifecycle_context.validate_job is validate_job


@pytest.mark.parametrize("job", BAD)
def test_connect_refuses_a_bad_job_id_before_opening_a_channel(job: str) -> None:
    started = time.monotonic()
    with pytest.raises(InvalidArgumentError, match="job id"):
        RemoteReadBackend.connect(NOWHERE, job, config=BackendConfig(call_deadline_s=1))
    assert time.monotonic() - started < 1


def test_connect_names_the_forbidden_character() -> None:
    with pytest.raises(InvalidArgumentError, match=r"job id 'my job' contains a forbidden character ' ' \(no whitespace"):
        RemoteReadBackend.connect(NOWHERE, "my job")


@pytest.mark.parametrize("job", BAD)
def test_every_pool_client_call_refuses_a_bad_job_id_without_a_call(job: str) -> None:
    with PoolClient(NOWHERE, PoolClientConfig(call_deadline_s=1)) as client:
        for call in (
            lambda: client.acquire_writer(job, (0, 127)),
            lambda: client.list_checkpoints(job),
            lambda: client.describe_checkpoint(job, 1),
            lambda: client.scan_checkpoint(job, 1),
            lambda: client.multi_get(job, 1, [1], [b"\x01k"]),
            lambda: client.commit_checkpoint(job, 1, 0, (0, 127), 2, b""),
            lambda: client.savepoint(job, "sp"),
            lambda: client.pin_checkpoint(job, "holder", 60),
            lambda: client.compact_checkpoint(job),
            lambda: client.collect_garbage(job),
            lambda: client.delete_checkpoint(job, 1),
        ):
            with pytest.raises(InvalidArgumentError, match="job id"):
                call()
        assert client.calls == 0


def test_savepoint_names_and_pin_holders_follow_the_same_rule() -> None:
    with PoolClient(NOWHERE) as client:
        with pytest.raises(InvalidArgumentError, match="savepoint name 'before upgrade'"):
            client.savepoint("orders", "before upgrade")
        with pytest.raises(InvalidArgumentError, match="pin holder"):
            client.pin_checkpoint("orders", "a/b", 60)
        assert client.calls == 0


@pytest.mark.parametrize("job", ["orders", "job-1", "a.b", "Ünïcode", "j" * 128])
def test_good_job_ids_pass(job: str) -> None:
    assert validate_job(job) == job
