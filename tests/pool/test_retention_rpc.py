"""SetJobPolicy, GetJobPolicy and RetainCheckpoints on a real loopback server over moto, checked against a model of the checkpoints."""

from __future__ import annotations

import random
import urllib.request

import grpc
import pytest

from client.pool_client import PoolClient, PoolClientConfig
from pool.core import PoolCore
from pool.job_policy import JobPolicy, job_policy_key, read_job_policy
from pool.lifecycle import LifecycleConfig
from pool.server import PoolServer, PoolServerConfig
from protos import remote_pool_pb2 as pb
from protos import remote_pool_pb2_grpc as pb_grpc
from snapshot.errors import InvalidArgumentError, NotFoundError, PermissionDeniedError
from tests.lifecycle_helpers import HALVES, build_job, delta_for, scan_checkpoint
from tests.pool_core_helpers import apply, commit
from tests.security_fixtures import token_table

POOL = LifecycleConfig(retain_last=3, compact_max_layers=6, gc_min_age_s=0)


@pytest.fixture
def served(s3_store):
    config = PoolServerConfig(listen="127.0.0.1:0", grace_seconds=0.5, lifecycle=POOL, metrics_port=0)
    server = PoolServer(config, store=s3_store).start()
    channel = grpc.insecure_channel(server.address)
    client = PoolClient(server.address)
    try:
        yield s3_store, client, pb_grpc.RemotePoolStub(channel), server
    finally:
        client.close()
        channel.close()
        server.stop(0)


def keys(store) -> list[tuple[str, str]]:
    return sorted((o.key, o.etag) for o in store.list(""))


def complete(store, job: str) -> list[int]:
    return [c.checkpoint_id for c in PoolCore(store).list_checkpoints(job)]


def expected_retention(existing: set[int], abandoned: set[int], keep: int, pinned: set[int], bases: set[int]) -> set[int]:
    """The plain rule: the newest `keep` of the current attempt, pinned ones and restore bases stay; so do left-behind ones newer than the latest."""
    current = sorted(existing - abandoned)
    stay = set(current[-keep:]) | bases | pinned
    latest = current[-1]
    return {c for c in current if c not in stay} | {c for c in abandoned & existing if c < latest and c not in stay}


def test_a_policy_is_set_read_and_cleared(served):
    store, client, _, _ = served
    build_job(PoolCore(store), "j", 2, random.Random(1))
    assert client.get_job_policy("j") is None
    info = client.set_job_policy("j", keep_last=2, compact_max_delta_bytes=1 << 20, maintenance=False)
    assert (info.keep_last, info.compact_max_layers, info.compact_max_delta_bytes, info.maintenance) == (2, None, 1 << 20, False)
    # unset settings are the pool's (the server's LifecycleConfig)
    assert (info.effective_keep_last, info.effective_compact_max_layers, info.effective_compact_max_delta_bytes) == (2, 6, 1 << 20)
    assert info.updated_ms > 0 and client.get_job_policy("j") == info
    assert read_job_policy(store, "j") == JobPolicy(2, None, 1 << 20, False, info.updated_ms)
    again = client.set_job_policy("j", compact_max_layers=4)  # replaces the whole policy
    assert (again.keep_last, again.compact_max_layers, again.maintenance, again.effective_keep_last) == (None, 4, True, 3)
    assert client.clear_job_policy("j") is True
    assert client.get_job_policy("j") is None and not store.exists(job_policy_key("j"))
    assert client.clear_job_policy("j") is False


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"keep_last": 0}, "keep_last"),
        ({"compact_max_layers": -2}, "compact_max_layers"),
        ({"compact_max_delta_bytes": 0}, "compact_max_delta_bytes"),
    ],
)
def test_a_bad_setting_is_named_and_changes_nothing(served, settings, field):
    store, client, _, _ = served
    build_job(PoolCore(store), "j", 2, random.Random(2))
    client.set_job_policy("j", keep_last=5)
    before = keys(store)
    with pytest.raises(InvalidArgumentError, match=field):
        client.set_job_policy("j", **settings)
    assert keys(store) == before


def test_retention_now_deletes_what_the_model_says(served):
    store, client, stub, server = served
    core = PoolCore(store)
    rng = random.Random(3)
    models = build_job(core, "j", 10, rng)
    existing = set(range(1, 11))
    abandoned: set[int] = set()
    pinned: set[int] = set()
    bases: set[int] = set()
    client.pin_checkpoint("j", "reader", 600, checkpoint_id=3)
    pinned.add(3)

    # a dry run says what would go and deletes nothing
    before = keys(store)
    dry = client.retain_checkpoints("j", keep_last=2, dry_run=True)
    assert set(dry.deleted) == expected_retention(existing, abandoned, 2, pinned, bases) == {1, 2, 4, 5, 6, 7, 8}
    assert dry.dry_run and dry.pinned == (3,) and dry.kept == (9, 10) and (dry.keep_last, dry.keep_last_from) == (2, "request")
    assert keys(store) == before

    # 0: the job's policy decides
    client.set_job_policy("j", keep_last=5)
    run = client.retain_checkpoints("j")
    assert (run.keep_last, run.keep_last_from, run.dry_run) == (5, "job policy", False)
    gone = expected_retention(existing, abandoned, 5, pinned, bases)
    assert set(run.deleted) == gone == {1, 2, 4, 5} and run.pinned == (3,) and run.kept == (6, 7, 8, 9, 10)
    existing -= gone
    assert complete(store, "j") == sorted(existing)

    # no policy: the pool's retain_last
    client.clear_job_policy("j")
    run = client.retain_checkpoints("j")
    assert (run.keep_last, run.keep_last_from) == (3, "pool")
    gone = expected_retention(existing, abandoned, 3, pinned, bases)
    assert set(run.deleted) == gone == {6, 7}
    existing -= gone
    assert complete(store, "j") == sorted(existing)

    # a rewind: both subtasks restore checkpoint 8 and commit 11 and 12; 9 and 10 are left behind, 8 is the writers' base
    epochs = [core.acquire_writer("j", kg, restore_from=8)[0] for kg in HALVES]
    model = dict(models[8])
    for cid, parent in ((11, 8), (12, 11)):
        for i, kg in enumerate(HALVES):
            rows = delta_for(rng, model, kg, 30, cid, op_rows=i == 0)
            apply(model, rows)
            commit(core, "j", cid, parent, kg, epochs[i], rows)
        models[cid] = dict(model)
    existing |= {11, 12}
    abandoned |= {9, 10}
    bases.add(8)
    run = client.retain_checkpoints("j", keep_last=1)
    gone = expected_retention(existing, abandoned, 1, pinned, bases)
    assert set(run.deleted) == gone == {9, 10, 11} and run.kept == (8, 12) and run.pinned == (3,)
    existing -= gone
    assert sorted(c.checkpoint_id for c in PoolCore(store).list_checkpoints("j")) == sorted(existing) == [3, 8, 12]
    for cid in existing:
        assert scan_checkpoint(store, "j", cid) == models[cid]

    # the pin gone, a repeat takes 3 and nothing else; the raw response carries the same
    client.unpin_checkpoint("j", 3, "reader")
    resp = stub.RetainCheckpoints(pb.RetainCheckpointsRequest(job="j", keep_last=1), timeout=30)
    assert list(resp.deleted) == [3] and list(resp.kept) == [8, 12] and not resp.pinned
    assert complete(store, "j") == [8, 12]
    # each new RPC is counted under its own name, as every other RPC is
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read().decode()
    for method, calls in (("RetainCheckpoints", 5), ("SetJobPolicy", 2), ("GetJobPolicy", 0)):
        line = f'clink_pool_requests_total{{code="OK",method="{method}"}} {calls:.1f}'
        assert (line in metrics) == bool(calls), method


@pytest.mark.parametrize(
    ("call", "request_", "code", "needle"),
    [
        ("SetJobPolicy", pb.SetJobPolicyRequest(job="nope", policy=pb.JobPolicy(keep_last=2)), grpc.StatusCode.NOT_FOUND, "nope"),
        ("SetJobPolicy", pb.SetJobPolicyRequest(job="nope", clear=True), grpc.StatusCode.NOT_FOUND, "nope"),
        ("GetJobPolicy", pb.GetJobPolicyRequest(job="nope"), grpc.StatusCode.NOT_FOUND, "nope"),
        ("RetainCheckpoints", pb.RetainCheckpointsRequest(job="nope"), grpc.StatusCode.NOT_FOUND, "nope"),
        ("RetainCheckpoints", pb.RetainCheckpointsRequest(job="j", keep_last=-1), grpc.StatusCode.INVALID_ARGUMENT, "keep_last"),
        ("RetainCheckpoints", pb.RetainCheckpointsRequest(job="a/b"), grpc.StatusCode.INVALID_ARGUMENT, "job id"),
        ("SetJobPolicy", pb.SetJobPolicyRequest(job="j"), grpc.StatusCode.INVALID_ARGUMENT, "exactly one of policy"),
        (
            "SetJobPolicy",
            pb.SetJobPolicyRequest(job="j", policy=pb.JobPolicy(), clear=True),
            grpc.StatusCode.INVALID_ARGUMENT,
            "exactly one of policy",
        ),
        (
            "SetJobPolicy",
            pb.SetJobPolicyRequest(job="j", policy=pb.JobPolicy(compact_max_layers=0)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "compact_max_layers",
        ),
        ("GetJobPolicy", pb.GetJobPolicyRequest(job=""), grpc.StatusCode.INVALID_ARGUMENT, "job id"),
    ],
)
def test_errors_map_to_status_codes_and_change_nothing(served, call, request_, code, needle):
    store, _, stub, _ = served
    build_job(PoolCore(store), "j", 4, random.Random(4))
    before = keys(store)
    with pytest.raises(grpc.RpcError) as excinfo:
        getattr(stub, call)(request_, timeout=30)
    assert excinfo.value.code() == code and needle in excinfo.value.details()
    assert "s3://" not in excinfo.value.details()  # the store's location is the operator's
    assert keys(store) == before


def test_the_client_raises_the_domain_error_of_an_unknown_job(served):
    store, client, _, _ = served
    build_job(PoolCore(store), "j", 1, random.Random(5))
    for call in (
        lambda: client.set_job_policy("ordres", keep_last=1),
        lambda: client.get_job_policy("ordres"),
        lambda: client.clear_job_policy("ordres"),
        lambda: client.retain_checkpoints("ordres"),
    ):
        with pytest.raises(NotFoundError, match="ordres"):
            call()
    with pytest.raises(InvalidArgumentError, match="keep_last"):
        client.retain_checkpoints("j", keep_last=-1)
    with pytest.raises(InvalidArgumentError, match="compact_max_layers"):
        client.set_job_policy("j", compact_max_layers="8")


@pytest.fixture
def guarded(tmp_path, s3_store):
    config = PoolServerConfig(listen="127.0.0.1:0", grace_seconds=0.2, tokens=token_table(), lifecycle=POOL)
    server = PoolServer(config, store=s3_store).start()
    build_job(PoolCore(s3_store), "job-a", 6, random.Random(6))
    clients: list[PoolClient] = []

    def client_with(token: str) -> PoolClient:
        clients.append(PoolClient(server.address, PoolClientConfig(token=token)))
        return clients[-1]

    try:
        yield s3_store, client_with
    finally:
        for c in clients:
            c.close()
        server.stop(0)


def test_a_token_of_another_job_or_read_only_is_refused(guarded):
    store, client_with = guarded
    other, reader, owner = client_with("tok-b-rw"), client_with("tok-a-ro"), client_with("tok-a-rw")
    owner.set_job_policy("job-a", keep_last=4)
    before = keys(store)
    for call in (
        lambda: other.set_job_policy("job-a", keep_last=1),
        lambda: other.clear_job_policy("job-a"),
        lambda: other.get_job_policy("job-a"),
        lambda: other.retain_checkpoints("job-a", keep_last=1),
        lambda: other.retain_checkpoints("job-a", keep_last=1, dry_run=True),
        lambda: reader.set_job_policy("job-a", keep_last=1),
        lambda: reader.retain_checkpoints("job-a", keep_last=1),
    ):
        with pytest.raises(PermissionDeniedError, match="job-a"):
            call()
    assert keys(store) == before
    assert reader.get_job_policy("job-a").keep_last == 4  # reading the policy is a read
    assert set(owner.retain_checkpoints("job-a").deleted) == {1, 2}
    assert complete(store, "job-a") == [3, 4, 5, 6]


def test_a_fields_mask_changes_only_the_settings_it_names(served):
    """SetJobPolicy with fields merges into the stored policy (what `clink-pool retain --keep-last 5` sends); bad names refused."""
    store, client, stub, _ = served
    build_job(PoolCore(store), "j", 2, random.Random(3))
    client.set_job_policy("j", keep_last=2, compact_max_layers=4, maintenance=False)
    info = client.set_job_policy("j", keep_last=5, only=("keep_last",))
    assert (info.keep_last, info.compact_max_layers, info.maintenance) == (5, 4, False)
    info = client.set_job_policy("j", compact_max_layers=None, maintenance=True, only=("compact_max_layers", "maintenance"))
    assert (info.keep_last, info.compact_max_layers, info.maintenance) == (5, None, True)
    assert read_job_policy(store, "j") == JobPolicy(keep_last=5, maintenance=True, updated_ms=info.updated_ms)
    before = keys(store)
    for fields in (["keep_lats"], ["keep_last", "keep_last"]):
        req = pb.SetJobPolicyRequest(job="j", policy=pb.JobPolicy(keep_last=9), fields=fields)
        with pytest.raises(grpc.RpcError) as caught:
            stub.SetJobPolicy(req)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and fields[0] in caught.value.details()
    with pytest.raises(InvalidArgumentError, match="only="):
        client.set_job_policy("j", keep_last=9, only=())
    assert keys(store) == before
