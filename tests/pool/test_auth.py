"""Access control: TLS on gRPC and HTTP, bearer tokens scoped per job (read/write), limits on messages and concurrent calls."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import ssl
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pyarrow.ipc as ipc
import pytest
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2, health_pb2_grpc

import snapshot
from client import RemoteReadBackend
from client.backend import BackendConfig
from client.errors import PermissionDeniedError, UnauthenticatedError, UnavailableError
from client.pool_client import PoolClient, PoolClientConfig, RetryPolicy
from pool.admission import AdmissionConfig
from pool.auth import TokenTable, bearer_token
from pool.core import PoolCore
from pool.domain import KeyGroupRange, PoolConfig
from pool.http_export import start_http_export
from pool.server import PoolServer, PoolServerConfig
from protos import remote_pool_pb2 as pb
from protos import remote_pool_pb2_grpc as pb_grpc
from snapshot.errors import InvalidArgumentError
from store.local import FileStore
from tests.security_fixtures import TOKENS_TEXT, token_table

OP = snapshot.operator_id("auth-op")
FAST = RetryPolicy(max_attempts=2, initial_backoff_s=0.001, max_backoff_s=0.01)


@pytest.fixture
def secured(tmp_path, pki):
    """A pool with TLS on gRPC and HTTP and the token table of security_fixtures."""
    config = PoolServerConfig(
        listen="127.0.0.1:0", grace_seconds=0.2, http_port=0, metrics_port=0, tls=pki.server_tls(), tokens=token_table()
    )
    server = PoolServer(config, store=FileStore(tmp_path / "store")).start()
    try:
        yield server
    finally:
        server.stop(0)


def _client(server, pki, token: str | None, tls: bool = True) -> PoolClient:
    config = PoolClientConfig(token=token, tls_root_certificates=pki.ca_pem if tls else None, retry=FAST, call_deadline_s=5)
    return PoolClient(server.address, config)


def _backend(server, pki, token: str, job: str) -> RemoteReadBackend:
    return RemoteReadBackend.connect(server.address, job, config=BackendConfig(token=token, tls_root_certificates=pki.ca_pem, retry=FAST))


def _seed(server, pki, job: str, token: str) -> bytes:
    key = snapshot.encode_keyed_key("v", job.encode())
    with _backend(server, pki, token, job) as backend:
        backend.put(OP, key, f"secret of {job}".encode())
        backend.snapshot(1)
    return key


def test_a_token_reaches_its_own_job_over_tls_and_is_denied_every_other_job(secured, pki):
    key_a = _seed(secured, pki, "job-a", "tok-a-rw")
    key_b = _seed(secured, pki, "job-b", "tok-b-rw")
    with _client(secured, pki, "tok-a-rw") as a:
        assert a.get("job-a", 0, OP, key_a) == b"secret of job-a"
        assert a.list_jobs() == ["job-a"]  # other jobs are not even named
        denied = [
            lambda: a.get("job-b", 0, OP, key_b),
            lambda: a.multi_get("job-b", 0, [OP], [key_b]),
            lambda: a.scan_checkpoint("job-b", 0),
            lambda: a.list_checkpoints("job-b"),
            lambda: a.describe_checkpoint("job-b", 1),
            lambda: a.acquire_writer("job-b", (0, 127)),
            lambda: a.commit_checkpoint("job-b", 2, 1, (0, 127), 1, b""),
            lambda: a.delete_checkpoint("job-b", 1),
        ]
        for call in denied:
            with pytest.raises(PermissionDeniedError, match="no access to job job-b"):
                call()
    with _client(secured, pki, "tok-a-ro") as ro:
        assert ro.get("job-a", 0, OP, key_a) == b"secret of job-a"
        for call in (
            lambda: ro.acquire_writer("job-a", (0, 127)),
            lambda: ro.commit_checkpoint("job-a", 2, 1, (0, 127), 1, b""),
            lambda: ro.delete_checkpoint("job-a", 1),
        ):
            with pytest.raises(PermissionDeniedError, match="may not write job job-a"):
                call()
        with pytest.raises(PermissionDeniedError):
            ro.get("job-b", 0, OP, key_b)
    with _client(secured, pki, "tok-admin") as admin:
        assert admin.list_jobs() == ["job-a", "job-b"]
        assert admin.get("job-b", 0, OP, key_b) == b"secret of job-b"
    with _client(secured, pki, "tok-team") as team:  # write-only, pattern team-*
        team.acquire_writer("team-x", (0, 127))
        with pytest.raises(PermissionDeniedError, match="may not read"):
            team.list_checkpoints("team-x")
        with pytest.raises(PermissionDeniedError):
            team.acquire_writer("job-a", (0, 127))
    # the state of job-b is untouched by every refused call
    with _client(secured, pki, "tok-b-rw") as b:
        assert [c.checkpoint_id for c in b.list_checkpoints("job-b")] == [1]
        assert b.get("job-b", 0, OP, key_b) == b"secret of job-b"


def test_no_or_a_wrong_token_is_unauthenticated_and_health_stays_open(secured, pki):
    _seed(secured, pki, "job-a", "tok-a-rw")
    for token in (None, "tok-nope", "tok-a-rwx", "Tok-A-Rw"):
        with _client(secured, pki, token) as anon:
            for call in (
                lambda c=anon: c.list_jobs(),
                lambda c=anon: c.get("job-a", 0, OP, b"\x01v|x"),
                lambda c=anon: c.commit_checkpoint("job-a", 2, 1, (0, 127), 1, b"x" * 10),
                lambda c=anon: c.scan_checkpoint("job-a", 0),
            ):
                with pytest.raises(UnauthenticatedError):
                    call()
            anon.wait_ready(5)  # the health check needs no token
    # the gRPC channel with a different scheme or a malformed header is refused too
    channel = grpc.secure_channel(secured.address, grpc.ssl_channel_credentials(pki.ca_pem))
    stub = pb_grpc.RemotePoolStub(channel)
    for value in ("Basic dG9rLWEtcnc=", "Bearer", "tok-a-rw", "Bearer  "):
        with pytest.raises(grpc.RpcError) as info:
            stub.ListJobs(pb.ListJobsRequest(), metadata=(("authorization", value),), timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    channel.close()


def test_tls_refuses_plaintext_clients_and_certificates_of_another_ca(secured, pki):
    with _client(secured, pki, "tok-admin", tls=False) as plain, pytest.raises(UnavailableError):
        plain.list_jobs()
    config = PoolClientConfig(token="tok-admin", tls_root_certificates=pki.other_ca_pem, retry=FAST, call_deadline_s=3)
    with PoolClient(secured.address, config) as wrong_ca, pytest.raises(UnavailableError):
        wrong_ca.list_jobs()
    with _client(secured, pki, "tok-admin") as good:
        assert good.list_jobs() == []


def test_mutual_tls_needs_a_client_certificate_signed_by_the_client_ca(tmp_path, pki):
    config = PoolServerConfig(listen="127.0.0.1:0", grace_seconds=0.2, tls=pki.server_tls(client_ca=True))
    server = PoolServer(config, store=FileStore(tmp_path / "store")).start()
    try:
        without = grpc.secure_channel(server.address, grpc.ssl_channel_credentials(pki.ca_pem))
        with pytest.raises(grpc.RpcError) as info:
            pb_grpc.RemotePoolStub(without).ListJobs(pb.ListJobsRequest(), timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        with_cert = grpc.secure_channel(server.address, grpc.ssl_channel_credentials(pki.ca_pem, pki.client_key_pem, pki.client_cert_pem))
        assert list(pb_grpc.RemotePoolStub(with_cert).ListJobs(pb.ListJobsRequest(), timeout=5).jobs) == []
        without.close()
        with_cert.close()
    finally:
        server.stop(0)


def _https(url: str, pki, token: str | None) -> tuple[int, bytes]:
    ctx = ssl.create_default_context(cadata=pki.ca_pem.decode())
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, context=ctx, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_http_export_is_https_and_checks_the_token_per_job(secured, pki):
    key_a = _seed(secured, pki, "job-a", "tok-a-rw")
    _seed(secured, pki, "job-b", "tok-b-rw")
    base = f"https://127.0.0.1:{secured.http_port}"
    assert _https(f"{base}/healthz", pki, None) == (200, b"ok\n")
    status, body = _https(f"{base}/jobs/job-a/state.arrow", pki, "tok-a-ro")
    assert status == 200
    table = ipc.open_stream(body).read_all()
    assert table.column("key_bytes").to_pylist() == [key_a] and table.column("value_bytes").to_pylist() == [b"secret of job-a"]
    assert _https(f"{base}/jobs/job-a/state.arrow", pki, None)[0] == 401
    assert _https(f"{base}/jobs/job-a/state.arrow", pki, "tok-nope")[0] == 401
    status, body = _https(f"{base}/jobs/job-b/state.arrow", pki, "tok-a-rw")
    assert status == 403 and b"secret" not in body
    for sneaky in ("job-a%2F..%2Fjob-b", "..%2Fjob-b", "job-a%2F%2E%2E%2Fjob-b", "%2E%2E"):
        status, body = _https(f"{base}/jobs/{sneaky}/state.arrow", pki, "tok-a-rw")
        assert status in (400, 403, 404) and b"secret" not in body, sneaky
    status, body = _https(f"https://127.0.0.1:{secured.metrics_port}/metrics", pki, None)  # the metrics port is HTTPS too
    assert status == 200 and b"clink_pool_requests" in body
    with pytest.raises((urllib.error.URLError, http.client.HTTPException, ConnectionError)):
        urllib.request.urlopen(f"http://127.0.0.1:{secured.metrics_port}/metrics", timeout=5).read()
    with pytest.raises((urllib.error.URLError, http.client.HTTPException, ConnectionError)):  # plain http to the TLS port gets no data
        urllib.request.urlopen(f"http://127.0.0.1:{secured.http_port}/jobs/job-a/state.arrow", timeout=5).read()


def _count_commits_in_flight(server) -> threading.Semaphore:
    """A semaphore released once per commit the server has started handling (so tests wait for it, not for a sleep)."""
    started = threading.Semaphore(0)
    commit = server.core.commit_checkpoint

    def observed(request, chunks, **kwargs):
        started.release()
        return commit(request, chunks, **kwargs)

    server.core.commit_checkpoint = observed
    return started


def test_message_size_and_concurrent_call_limits(tmp_path):
    config = PoolServerConfig(
        listen="127.0.0.1:0", grace_seconds=0.2, max_message_bytes=1 << 20, admission=AdmissionConfig(max_calls=2), max_workers=4
    )
    server = PoolServer(config, store=FileStore(tmp_path / "store")).start()
    in_flight = _count_commits_in_flight(server)
    channel = grpc.insecure_channel(server.address, options=[("grpc.max_send_message_length", 64 << 20)])
    stub = pb_grpc.RemotePoolStub(channel)
    try:
        with pytest.raises(grpc.RpcError) as info:
            stub.MultiGet(pb.MultiGetRequest(job="j", op_ids=[1], keys=[b"\x01" * (2 << 20)]), timeout=10)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # two commit streams held open use both slots: a third call is refused, not queued without bound
        release = threading.Event()

        epoch = stub.AcquireWriter(pb.AcquireWriterRequest(job="j", key_groups=pb.KeyGroupRange(lo=0, hi=127)), timeout=5).epoch

        def held():  # a writer holding its epoch (a fenced one is refused before its body is read)
            yield pb.CommitChunk(header=pb.CommitHeader(job="j", checkpoint_id=1, key_groups=pb.KeyGroupRange(lo=0, hi=127), epoch=epoch))
            release.wait(20)

        futures = [stub.CommitCheckpoint.future(held(), timeout=30) for _ in range(2)]
        assert in_flight.acquire(timeout=20) and in_flight.acquire(timeout=20)
        with pytest.raises(grpc.RpcError) as info:
            stub.ListJobs(pb.ListJobsRequest(), timeout=5)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        release.set()
        outcomes = []
        for f in futures:
            try:
                outcomes.append(f.result().checkpoint.complete)
            except grpc.RpcError as exc:
                outcomes.append(exc.code())
        assert outcomes == [True, True]  # identical commits: one lands, its twin is answered as a repeat
        assert list(stub.ListJobs(pb.ListJobsRequest(), timeout=5).jobs) == ["j"]  # healthy again once the slots are free
    finally:
        channel.close()
        server.stop(0)


def test_token_files_parse_json_and_lines_and_name_what_is_wrong(tmp_path):
    lines = token_table()
    assert lines.authorize("tok-b-rw", "job-b2", "write").name == "line 4"
    assert bearer_token("bearer abc") == "abc" and bearer_token("Basic abc") is None and bearer_token(None) is None
    doc = {
        "tokens": [{"token": "t1", "jobs": ["a", "b*"], "access": "read", "name": "reader"}, {"token": "t2", "jobs": "*", "access": "rw"}]
    }
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps(doc))
    table = TokenTable.from_file(path)
    assert table.authorize("t1", "bx", "read").name == "reader"
    assert table.authorize("t2", "anything", "write")
    bad = [
        ("tok job\n", "expected 'TOKEN JOB"),
        ("tok job sometimes\n", "access 'sometimes'"),
        ("tok job rw\ntok job2 rw\n", "listed twice"),
        ('{"tokens": [{"token": "", "jobs": ["a"], "access": "rw"}]}', "non-empty"),
        ('{"tokens": [{"token": "x", "jobs": [], "access": "rw"}]}', "non-empty list"),
        ('{"tokenz": []}', "not a token document"),
        ("# only a comment\n", "at least one token"),
    ]
    for text, message in bad:
        with pytest.raises(InvalidArgumentError, match=message):
            TokenTable.parse(text, "t.txt")
    hashed = TokenTable.parse(f"sha256:{hashlib.sha256(b'only-the-hash').hexdigest()} job-h read\n")
    assert hashed.authorize("only-the-hash", "job-h", "read")
    for wrong in ("sha256:" + hashlib.sha256(b"only-the-hash").hexdigest(), "only-the-has"):
        with pytest.raises(UnauthenticatedError):
            hashed.authorize(wrong, "job-h", "read")  # the digest itself is not a credential
    with pytest.raises(InvalidArgumentError, match="cannot read token file"):
        TokenTable.from_file(tmp_path / "missing")


def test_clink_pool_serve_with_tls_and_token_flags(tmp_path, pki):
    paths = pki.write(tmp_path / "pki")
    tokens = tmp_path / "tokens.txt"
    tokens.write_text(TOKENS_TEXT)
    cmd = [
        sys.executable,
        "-m",
        "clink.cli.pool",
        "serve",
        "--store",
        f"file://{tmp_path / 'store'}",
        "--listen",
        "127.0.0.1:0",
        "--output",
        "json",
        "--tls-cert",
        str(paths["server_cert_pem"]),
        "--tls-key",
        str(paths["server_key_pem"]),
        "--token-file",
        str(tokens),
        "--max-concurrent-rpcs",
        "8",
        "--max-concurrent-streams",
        "4",
        "--log-level",
        "warning",
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        ready = json.loads(proc.stdout.readline())
        address = ready["address"]
        config = PoolClientConfig(token="tok-a-rw", tls_root_certificates=pki.ca_pem, retry=FAST)
        with PoolClient(address, config) as a:
            a.wait_ready(10)
            lease = a.acquire_writer("job-a", (0, 127))
            assert lease.epoch >= 1 and lease.latest_checkpoint_id == 0
            with pytest.raises(PermissionDeniedError):
                a.acquire_writer("job-b", (0, 127))
        with (
            PoolClient(address, PoolClientConfig(tls_root_certificates=pki.ca_pem, retry=FAST)) as anon,
            pytest.raises(UnauthenticatedError),
        ):
            anon.list_jobs()
    finally:
        proc.terminate()
        proc.wait(10)
    bad = subprocess.run(
        [*cmd[:8], "--tls-cert", str(paths["server_cert_pem"])],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 2 and "--tls-cert and --tls-key go together" in bad.stderr and "Traceback" not in bad.stderr


def test_max_concurrent_streams_bounds_one_connection_not_the_server(tmp_path):
    config = PoolServerConfig(listen="127.0.0.1:0", grace_seconds=0.2, max_concurrent_streams=1)
    server = PoolServer(config, store=FileStore(tmp_path / "store")).start()
    in_flight = _count_commits_in_flight(server)
    busy = grpc.insecure_channel(server.address, options=[("grpc.use_local_subchannel_pool", 1)])
    other = grpc.insecure_channel(server.address, options=[("grpc.use_local_subchannel_pool", 1)])
    release = threading.Event()

    epoch = server.core.acquire_writer("j", KeyGroupRange(0, 127))[0]

    def held():
        yield pb.CommitChunk(header=pb.CommitHeader(job="j", checkpoint_id=1, key_groups=pb.KeyGroupRange(lo=0, hi=127), epoch=epoch))
        release.wait(20)

    try:
        stub = pb_grpc.RemotePoolStub(busy)
        assert list(stub.ListJobs(pb.ListJobsRequest(), timeout=5).jobs) == ["j"]  # connection up, settings exchanged
        holding = stub.CommitCheckpoint.future(held(), timeout=30)
        assert in_flight.acquire(timeout=20)
        with pytest.raises(grpc.RpcError) as info:  # the only stream of this connection is taken: the call waits, then times out
            stub.ListJobs(pb.ListJobsRequest(), timeout=0.5)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert list(pb_grpc.RemotePoolStub(other).ListJobs(pb.ListJobsRequest(), timeout=5).jobs) == ["j"]  # another connection is served
        release.set()
        assert holding.result().checkpoint.complete
        assert list(stub.ListJobs(pb.ListJobsRequest(), timeout=5).jobs) == ["j"]
    finally:
        release.set()
        busy.close()
        other.close()
        server.stop(0)


def test_garbled_requests_are_refused_unauthenticated_before_they_are_decoded(secured, pki):
    garbled = b"\x0a\xff\x01trunc"  # field 1, length 255, then 6 bytes: not a protobuf message
    with pytest.raises(DecodeError):
        pb.GetRequest.FromString(garbled)
    channel = grpc.secure_channel(secured.address, grpc.ssl_channel_credentials(pki.ca_pem))
    try:
        for method, kind in (("Get", channel.unary_unary), ("ListJobs", channel.unary_unary), ("ScanCheckpoint", channel.unary_stream)):
            call = kind(f"/clink.remote_state.v1.RemotePool/{method}")
            for metadata, expected in (
                ((), grpc.StatusCode.UNAUTHENTICATED),
                ((("authorization", "Bearer tok-nope"),), grpc.StatusCode.UNAUTHENTICATED),
                ((("authorization", "Bearer tok-a-rw"),), grpc.StatusCode.INVALID_ARGUMENT),
            ):
                with pytest.raises(grpc.RpcError) as info:
                    result = call(garbled, metadata=metadata, timeout=5)
                    list(result) if kind == channel.unary_stream else result
                assert info.value.code() == expected, (method, metadata)
                if expected is grpc.StatusCode.UNAUTHENTICATED:
                    assert "protobuf" not in (info.value.details() or "")
                else:
                    assert "not a valid protobuf message" in info.value.details()
    finally:
        channel.close()


def test_http_export_url_names_https_when_it_serves_tls(tmp_path, pki):
    core = PoolCore(FileStore(tmp_path / "store"), PoolConfig())
    for tls, scheme in ((pki.server_tls(), "https"), (None, "http")):
        export = start_http_export(core, "127.0.0.1", 0, tls=tls)
        try:
            assert export.url == f"{scheme}://127.0.0.1:{export.port}"
            if tls is not None:
                assert _https(f"{export.url}/healthz", pki, None) == (200, b"ok\n")  # the advertised URL is the one that answers
            else:
                with urllib.request.urlopen(f"{export.url}/healthz", timeout=10) as response:
                    assert response.read() == b"ok\n"
        finally:
            export.stop()


def test_clink_pool_serve_ready_line_names_https_urls_under_tls(tmp_path, pki):
    paths = pki.write(tmp_path / "pki")
    cmd = [
        sys.executable,
        "-m",
        "clink.cli.pool",
        "serve",
        "--store",
        f"file://{tmp_path / 'store'}",
        "--listen",
        "127.0.0.1:0",
        "--metrics-port",
        "0",
        "--http-port",
        "0",
        "--tls-cert",
        str(paths["server_cert_pem"]),
        "--tls-key",
        str(paths["server_key_pem"]),
        "--log-level",
        "warning",
        "--grace",
        "0",
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        ready = proc.stdout.readline()
    finally:
        proc.terminate()
        proc.wait(10)
    assert ready.startswith("clink-pool: serving on 127.0.0.1:"), ready
    assert "metrics https://127.0.0.1:" in ready and "state export https://127.0.0.1:" in ready and "http://" not in ready
