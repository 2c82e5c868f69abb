"""Hostile clients against a real `clink-pool serve` with TLS and tokens: each attack bounded, an honest Get answering throughout.

Every test runs one attack from the security review, then asserts that an honest client's Get answered within its deadline
while the attack ran, and that the pool's resident memory grew less than a stated bound (sampled from /proc every 20 ms).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from client.pool_client import PoolClient, PoolClientConfig, RetryPolicy
from protos import remote_pool_pb2 as pb
from protos import remote_pool_pb2_grpc as pb_grpc
from snapshot.format import CHANGELOG_SCHEMA, write_snapshot
from tests.security_fixtures import TOKENS_TEXT, make_pki, zstd_bomb

ROOT = Path(__file__).resolve().parents[2]
HONEST_DEADLINE_S = 2.0
IDLE_S = 2.0  # the pool's --call-idle in these tests
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the pool's RSS from /proc")]


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


class Pool:
    """A `clink-pool serve` subprocess with TLS, tokens, the HTTP export and small limits; job-a holds one checkpoint."""

    def __init__(self, tmp: Path) -> None:
        self.pki = make_pki()
        paths = self.pki.write(tmp / "pki")
        tokens = tmp / "tokens.txt"
        tokens.write_text(TOKENS_TEXT)
        self.store = tmp / "store"
        cmd = [
            sys.executable,
            "-m",
            "clink.cli.pool",
            "serve",
            "--store",
            f"file://{self.store}",
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
            "--http-port",
            "0",
            "--metrics-port",
            "0",
            "--call-idle",
            str(IDLE_S),
            "--request-memory-mb",
            "256",
            "--log-level",
            "warning",
        ]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        ready = json.loads(self.proc.stdout.readline())
        self.address, self.http_port, self.metrics_port = ready["address"], ready["http_port"], ready["metrics_port"]
        self.honest = PoolClient(
            self.address,
            PoolClientConfig(
                token="tok-a-rw",
                tls_root_certificates=self.pki.ca_pem,
                retry=RetryPolicy(max_attempts=1),
                call_deadline_s=HONEST_DEADLINE_S,
            ),
        )
        self.honest.wait_ready(10)
        lease = self.honest.acquire_writer("job-a", (0, 127))
        delta = write_snapshot(
            pa.table(
                {
                    "op_id": pa.array([7], pa.uint64()),
                    "key_bytes": [b"\x05honest"],
                    "value_bytes": [b"yes"],
                    "row_kind": pa.array([1], pa.int8()),
                },
                schema=CHANGELOG_SCHEMA,
            ),
            changelog=True,
        )
        self.honest.commit_checkpoint("job-a", 1, 0, (0, 127), lease.epoch, delta)
        n = 200_000  # checkpoint 2 adds ~24 MB, so a scan of it outlasts the connection's flow-control window
        bulk = pa.table(
            {
                "row_kind": pa.array([1] * n, pa.int8()),
                "op_id": pa.array([8] * n, pa.uint64()),
                "key_bytes": pa.array([b"\x06" + i.to_bytes(8, "big") for i in range(n)]),
                "value_bytes": pa.array([os.urandom(100) for _ in range(n)]),
            },
            schema=CHANGELOG_SCHEMA,
        )
        self.honest.commit_checkpoint("job-a", 2, 1, (0, 127), lease.epoch, write_snapshot(bulk, changelog=True))
        self.epoch = lease.epoch
        # ordinary traffic first (a Get, which indexes checkpoint 2's data file, and a scan of it), so the pool is at its
        # working set before the first attack is measured: a commit spools its file to disk and leaves little memory
        # behind for later requests to reuse, and the first attack would otherwise count the pool's own warm-up
        assert self.honest.get("job-a", 0, 7, b"\x05honest") == b"yes"
        assert len(self.honest.scan_checkpoint("job-a", 2)) > 20 << 20

    def channel(self, token: str | None = None) -> grpc.Channel:
        creds = grpc.ssl_channel_credentials(self.pki.ca_pem)
        if token is not None:
            creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(token))
        return grpc.secure_channel(
            self.address, creds, options=[("grpc.max_send_message_length", 256 << 20), ("grpc.max_receive_message_length", 256 << 20)]
        )

    def gauge(self, name: str) -> float:
        import ssl

        ctx = ssl.create_default_context(cadata=self.pki.ca_pem.decode())
        deadline = time.monotonic() + 10
        while True:  # released when grpc finishes each cancelled call: give it a moment
            with urllib.request.urlopen(f"https://127.0.0.1:{self.metrics_port}/metrics", context=ctx, timeout=5) as resp:
                text = resp.read().decode()
            value = next(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))
            if value == 0 or time.monotonic() > deadline:
                return value
            time.sleep(0.2)

    def rss(self) -> int:
        return rss_bytes(self.proc.pid)

    def close(self) -> None:
        self.honest.close()
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# One pool for the module, attacked in order: a bound holds for a pool the earlier attacks warmed, and the last test checks
# what is held after all of them (with -n, pyproject's --dist loadfile keeps a module on one worker).
@pytest.fixture(scope="module")
def pool(tmp_path_factory) -> Iterator[Pool]:
    p = Pool(tmp_path_factory.mktemp("abuse"))
    try:
        yield p
    finally:
        p.close()


class Probe:
    """During an attack: honest Gets in a loop (their worst latency) and the pool's RSS (its peak)."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.worst = 0.0
        self.failures: list[str] = []
        self.gets = 0
        self.base_rss = pool.rss()
        self.peak_rss = self.base_rss
        self._stop = threading.Event()

    def _gets(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            try:
                assert self.pool.honest.get("job-a", 0, 7, b"\x05honest") == b"yes"
                self.gets += 1
            except Exception as exc:  # noqa: BLE001 - any failure of the honest client is what the test reports
                self.failures.append(f"{type(exc).__name__}: {exc}")
            self.worst = max(self.worst, time.perf_counter() - started)
            self._stop.wait(0.05)

    def _rss(self) -> None:
        while not self._stop.is_set():
            self.peak_rss = max(self.peak_rss, self.pool.rss())
            self._stop.wait(0.02)

    @contextmanager
    def running(self) -> Iterator[Probe]:
        threads = [threading.Thread(target=self._gets, daemon=True), threading.Thread(target=self._rss, daemon=True)]
        for t in threads:
            t.start()
        try:
            yield self
        finally:
            time.sleep(0.3)  # at least a few honest gets after the attack's last call
            self._stop.set()
            for t in threads:
                t.join(10)

    def check(self, max_growth_mb: int) -> None:
        growth = (self.peak_rss - self.base_rss) / 2**20
        print(
            f"honest gets {self.gets}, worst {self.worst * 1000:.0f} ms; pool RSS {self.base_rss / 2**20:.0f} MB -> peak +{growth:.0f} MB"
        )
        assert not self.failures, f"the honest client failed during the attack: {self.failures[:3]}"
        assert self.gets > 0
        assert self.worst < HONEST_DEADLINE_S
        assert growth < max_growth_mb, f"the pool grew {growth:.0f} MB (bound {max_growth_mb} MB)"


def attack(pool: Pool, max_growth_mb: int, run: Callable[[], None]) -> None:
    probe = Probe(pool)
    with probe.running():
        run()
    probe.check(max_growth_mb)


def test_tokenless_health_watch_streams_do_not_take_workers(pool):
    channel = pool.channel()  # no token: Health is open
    stub = health_pb2_grpc.HealthStub(channel)
    watches = [stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=30) for _ in range(64)]

    def run() -> None:
        assert all(next(w).status == health_pb2.HealthCheckResponse.SERVING for w in watches)
        assert stub.Check(health_pb2.HealthCheckRequest(), timeout=HONEST_DEADLINE_S).status == health_pb2.HealthCheckResponse.SERVING
        time.sleep(1.0)

    try:
        attack(pool, 100, run)
    finally:
        for w in watches:
            w.cancel()
        channel.close()


def test_health_watches_are_capped_and_counted_until_they_end(pool):
    channel = pool.channel()
    stub = health_pb2_grpc.HealthStub(channel)
    try:
        for _ in range(2):  # twice: the first round's watches must have been counted out when they ended
            watches = [stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=30) for _ in range(300)]
            codes = []
            for w in watches:
                try:
                    next(w)
                    codes.append(grpc.StatusCode.OK)
                except grpc.RpcError as exc:
                    codes.append(exc.code())
            assert codes.count(grpc.StatusCode.OK) == 256 and codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 44
            for w in watches:
                w.cancel()
            time.sleep(0.5)
        assert stub.Check(health_pb2.HealthCheckRequest(), timeout=HONEST_DEADLINE_S).status == health_pb2.HealthCheckResponse.SERVING
    finally:
        channel.close()


def test_tokenless_requests_are_refused_before_they_are_read(pool):
    channel = pool.channel()
    stub = pb_grpc.RemotePoolStub(channel)
    big = pb.MultiGetRequest(job="job-a", op_ids=[7], keys=[b"\x05" * (4 << 20)])

    def run() -> None:
        calls = [stub.MultiGet.future(big, timeout=20) for _ in range(100)]
        codes = [c.exception().code() for c in calls]
        assert set(codes) == {grpc.StatusCode.UNAUTHENTICATED}

    try:
        # 400 MB sent on one connection; grpc takes in at most one stream window (1 MiB) of each refused call
        attack(pool, 60, run)
    finally:
        channel.close()


def test_a_compressed_scan_delta_is_refused_before_it_is_decompressed(pool):
    bomb = zstd_bomb(512 << 20)
    assert len(bomb) < 256 << 10
    channel = pool.channel("tok-a-ro")  # a read-only token is enough to send a scan delta
    stub = pb_grpc.RemotePoolStub(channel)

    def run() -> None:
        calls = [stub.ScanCheckpoint(pb.ScanCheckpointRequest(job="job-a", delta=bomb), timeout=20) for _ in range(4)]
        for call in calls:
            with pytest.raises(grpc.RpcError) as info:
                list(call)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "compressed" in info.value.details()

    try:
        attack(pool, 100, run)
    finally:
        channel.close()


def test_a_compressed_commit_writes_nothing(pool):
    bomb = zstd_bomb(64 << 20, changelog=True)
    channel = pool.channel("tok-b-rw")
    stub = pb_grpc.RemotePoolStub(channel)
    epoch = stub.AcquireWriter(pb.AcquireWriterRequest(job="job-b", key_groups=pb.KeyGroupRange(lo=0, hi=127)), timeout=10).epoch
    before = sorted(p.relative_to(pool.store) for p in pool.store.rglob("*") if p.is_file())

    def chunks() -> Iterator[pb.CommitChunk]:
        yield pb.CommitChunk(header=pb.CommitHeader(job="job-b", checkpoint_id=1, key_groups=pb.KeyGroupRange(lo=0, hi=127), epoch=epoch))
        yield pb.CommitChunk(delta=bomb)

    def run() -> None:
        with pytest.raises(grpc.RpcError) as info:
            stub.CommitCheckpoint(chunks(), timeout=20)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "compressed" in info.value.details()

    try:
        attack(pool, 100, run)
        after = sorted(
            p.relative_to(pool.store) for p in pool.store.rglob("*") if p.is_file() and "job-b" in str(p) and "writers" not in p.name
        )
        assert [p for p in after if p not in before] == []
    finally:
        channel.close()


def test_a_flood_of_one_row_batches_is_refused(pool):
    batch = pa.record_batch(
        [pa.array([1], pa.int8()), pa.array([7], pa.uint64()), pa.array([b"\x05k"]), pa.array([b"v"])], schema=CHANGELOG_SCHEMA
    )
    meta = dict(
        ipc.open_stream(
            write_snapshot(pa.table([c.slice(0, 0) for c in batch.columns], schema=CHANGELOG_SCHEMA), changelog=True)
        ).schema.metadata
    )
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, CHANGELOG_SCHEMA.with_metadata(meta)) as w:
        for _ in range(100_000):
            w.write_batch(batch)
    flood = sink.getvalue().to_pybytes()
    channel = pool.channel("tok-b-rw")
    stub = pb_grpc.RemotePoolStub(channel)
    epoch = stub.AcquireWriter(pb.AcquireWriterRequest(job="job-b", key_groups=pb.KeyGroupRange(lo=0, hi=127)), timeout=10).epoch

    def chunks() -> Iterator[pb.CommitChunk]:
        yield pb.CommitChunk(header=pb.CommitHeader(job="job-b", checkpoint_id=1, key_groups=pb.KeyGroupRange(lo=0, hi=127), epoch=epoch))
        for i in range(0, len(flood), 1 << 20):
            yield pb.CommitChunk(delta=flood[i : i + (1 << 20)])

    def run() -> None:
        with pytest.raises(grpc.RpcError) as info:
            stub.CommitCheckpoint(chunks(), timeout=30)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "record batches" in info.value.details()

    try:
        attack(pool, 150, run)
    finally:
        channel.close()


def test_a_multiget_of_millions_of_keys_is_refused_unparsed(pool):
    channel = pool.channel("tok-a-ro")
    method = f"/{pb.DESCRIPTOR.services_by_name['RemotePool'].full_name}/MultiGet"
    raw = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
    huge = pb.MultiGetRequest(job="job-a", op_ids=[7], keys=[b"\x05"] * 20_000_000).SerializeToString()  # 60 MB
    under = pb.MultiGetRequest(job="job-a", op_ids=[7], keys=[b"\x05"] * 5_000_000).SerializeToString()  # 15 MB: under the request limit

    def one_round() -> None:
        with pytest.raises(grpc.RpcError) as info:
            raw(huge, timeout=30)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        with pytest.raises(grpc.RpcError) as info:
            raw(under, timeout=30)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "split it" in info.value.details()

    def run() -> None:
        for _ in range(3):
            one_round()

    try:
        # grpc's first 16 MB receive grows malloc's arenas once (about 60 MB, whichever test comes first), and each
        # worker thread that takes one may keep its own arena: bounded by the request limit, not by the attack's size
        one_round()
        attack(pool, 128, run)
    finally:
        channel.close()


def test_stalled_scans_of_one_token_leave_workers_for_others_and_are_cancelled(pool):
    channel = pool.channel("tok-a-ro")
    stub = pb_grpc.RemotePoolStub(channel)
    codes: list[grpc.StatusCode] = []

    def run() -> None:
        calls = [stub.ScanCheckpoint(pb.ScanCheckpointRequest(job="job-a"), timeout=60) for _ in range(16)]  # never read
        time.sleep(IDLE_S * 3)
        for call in calls:
            try:
                for _ in call:
                    pass
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as exc:
                codes.append(exc.code())

    try:
        attack(pool, 250, run)
    finally:
        channel.close()
    # past the per-token limit (8) refused at once; the rest cancelled once idle for --call-idle, or sent out whole when
    # grpc's flow-control window took the stream (idle cancellation itself: test_stalled_commits_are_cancelled_after_the_idle_limit)
    assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) >= 8, codes
    assert set(codes) <= {grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.OK}, codes


def test_stalled_commits_are_cancelled_after_the_idle_limit(pool):
    channel = pool.channel("tok-b-rw")
    stub = pb_grpc.RemotePoolStub(channel)
    epoch = stub.AcquireWriter(pb.AcquireWriterRequest(job="job-b", key_groups=pb.KeyGroupRange(lo=0, hi=127)), timeout=10).epoch
    release = threading.Event()

    def stalled() -> Iterator[pb.CommitChunk]:
        yield pb.CommitChunk(header=pb.CommitHeader(job="job-b", checkpoint_id=5, key_groups=pb.KeyGroupRange(lo=0, hi=127), epoch=epoch))
        release.wait(30)

    def run() -> None:
        started = time.monotonic()
        calls = [stub.CommitCheckpoint.future(stalled(), timeout=60) for _ in range(16)]
        codes = [c.exception(40).code() for c in calls]
        assert set(codes) <= {grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
        assert grpc.StatusCode.DEADLINE_EXCEEDED in codes
        assert time.monotonic() - started < IDLE_S * 6

    try:
        attack(pool, 100, run)
    finally:
        release.set()
        channel.close()


def test_slow_http_export_readers_are_bounded(pool):
    url = f"https://127.0.0.1:{pool.http_port}/jobs/job-a/state.arrow"
    import ssl

    ctx = ssl.create_default_context(cadata=pool.pki.ca_pem.decode())
    statuses: list[int] = []

    def run() -> None:
        held = []
        for _ in range(20):
            req = urllib.request.Request(url, headers={"Authorization": "Bearer tok-a-ro"})
            try:
                held.append(urllib.request.urlopen(req, context=ctx, timeout=10))  # opened, never read
                statuses.append(200)
            except urllib.error.HTTPError as exc:
                statuses.append(exc.code)
                assert exc.headers.get("Retry-After") and "max-http-exports" in exc.read().decode()
        time.sleep(0.5)
        for h in held:
            h.close()

    attack(pool, 100, run)
    assert statuses.count(200) <= 4 and 503 in statuses


def test_savepoints_through_the_rpc_stay_in_their_jobs_namespace(pool):
    b = pb_grpc.RemotePoolStub(ch_b := pool.channel("tok-b-rw"))
    a = pb_grpc.RemotePoolStub(ch_a := pool.channel("tok-a-rw"))
    team = pb_grpc.RemotePoolStub(ch_t := pool.channel("tok-team"))  # write-only on team-*
    try:
        # job-b's token names a savepoint after job-a: it lands under job-b, and job-a's own name stays free
        sp = a.Savepoint(pb.SavepointRequest(job="job-a", name="release-7"), timeout=30)
        assert sp.location == "savepoints/job-a/release-7/" and "file://" not in sp.location
        with pytest.raises(grpc.RpcError) as info:
            b.Savepoint(pb.SavepointRequest(job="job-a", name="release-8"), timeout=30)
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(grpc.RpcError) as info:
            b.Savepoint(pb.SavepointRequest(job="job-b", name="../job-a/release-8"), timeout=30)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as info:
            team.Savepoint(pb.SavepointRequest(job="team-x", name="s"), timeout=30)
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED and "read and write" in info.value.details()
        assert not (pool.store / "savepoints" / "job-a" / "release-8").exists()
        # a savepoint of job-b named to pass as job-a's lands under job-b: nobody restoring job-a's savepoints finds it there
        with PoolClient(pool.address, PoolClientConfig(token="tok-b-rw", tls_root_certificates=pool.pki.ca_pem)) as client:
            lease = client.acquire_writer("job-b2", (0, 127))
            delta = write_snapshot(
                pa.table(
                    {
                        "row_kind": pa.array([1], pa.int8()),
                        "op_id": pa.array([7], pa.uint64()),
                        "key_bytes": [b"\x05b-data"],
                        "value_bytes": [b"b"],
                    },
                    schema=CHANGELOG_SCHEMA,
                ),
                changelog=True,
            )
            client.commit_checkpoint("job-b2", 1, 0, (0, 127), lease.epoch, delta)
            squat = client.savepoint("job-b2", "release-7")
        assert squat.name == "job-b2/release-7" and squat.location == "savepoints/job-b2/release-7/"
        assert (pool.store / "savepoints" / "job-a" / "release-7" / "_metadata").read_bytes() != (
            pool.store / "savepoints" / "job-b2" / "release-7" / "_metadata"
        ).read_bytes()
    finally:
        for ch in (ch_a, ch_b, ch_t):
            ch.close()


def test_pins_belong_to_their_token_and_are_bounded(pool):
    ro = pb_grpc.RemotePoolStub(ch_ro := pool.channel("tok-a-ro"))
    rw = pb_grpc.RemotePoolStub(ch_rw := pool.channel("tok-a-rw"))
    try:
        rw.PinCheckpoint(pb.PinCheckpointRequest(job="job-a", holder="backup", ttl_seconds=600), timeout=10)
        for call, req in (
            (ro.UnpinCheckpoint, pb.UnpinCheckpointRequest(job="job-a", checkpoint_id=2, holder="backup")),
            (ro.PinCheckpoint, pb.PinCheckpointRequest(job="job-a", holder="backup", ttl_seconds=60)),
        ):
            with pytest.raises(grpc.RpcError) as info:
                call(req, timeout=10)
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert (pool.store / "jobs" / "job-a" / "pins" / "2" / "backup.json").exists()
        with pytest.raises(grpc.RpcError) as info:  # a ten-year pin would block retention for ever
            ro.PinCheckpoint(pb.PinCheckpointRequest(job="job-a", holder="mine", ttl_seconds=10 * 365 * 86400 - 1), timeout=10)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "longer than the pool allows" in info.value.details()
        made = 1
        with pytest.raises(grpc.RpcError) as info:
            for i in range(100):
                ro.PinCheckpoint(pb.PinCheckpointRequest(job="job-a", holder=f"h{i}", ttl_seconds=60), timeout=10)
                made += 1
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and made == 64
        ro.UnpinCheckpoint(pb.UnpinCheckpointRequest(job="job-a", checkpoint_id=2, holder="h0"), timeout=10)  # its own: fine
        rw.UnpinCheckpoint(pb.UnpinCheckpointRequest(job="job-a", checkpoint_id=2, holder="h1"), timeout=10)  # write access: fine
        for i in range(2, 63):
            ro.UnpinCheckpoint(pb.UnpinCheckpointRequest(job="job-a", checkpoint_id=2, holder=f"h{i}"), timeout=10)
        rw.UnpinCheckpoint(pb.UnpinCheckpointRequest(job="job-a", checkpoint_id=2, holder="backup"), timeout=10)
    finally:
        ch_ro.close()
        ch_rw.close()


def test_errors_sent_to_clients_do_not_name_the_store(pool):
    stub = pb_grpc.RemotePoolStub(ch := pool.channel("tok-b-rw"))
    try:
        with pytest.raises(grpc.RpcError) as info:
            stub.Get(pb.GetRequest(job="job-b2", checkpoint_id=999, op_id=1, key_bytes=b"\x01k"), timeout=10)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        assert str(pool.store) not in info.value.details() and "file://" not in info.value.details()
    finally:
        ch.close()
    req = urllib.request.Request(
        f"https://127.0.0.1:{pool.http_port}/jobs/job-b2/state.arrow?checkpoint=999", headers={"Authorization": "Bearer tok-b-rw"}
    )
    import ssl

    with pytest.raises(urllib.error.HTTPError) as http:
        urllib.request.urlopen(req, context=ssl.create_default_context(cadata=pool.pki.ca_pem.decode()), timeout=10)
    body = http.value.read().decode()
    assert http.value.code == 404 and str(pool.store) not in body and http.value.headers["X-Clink-Error"] == "NotFoundError"


def test_an_idle_tls_connection_does_not_block_metrics(pool):
    import socket
    import ssl

    idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for port in (pool.metrics_port, pool.http_port) for _ in range(3)]
    try:
        ctx = ssl.create_default_context(cadata=pool.pki.ca_pem.decode())
        started = time.perf_counter()
        with urllib.request.urlopen(f"https://127.0.0.1:{pool.metrics_port}/metrics", context=ctx, timeout=5) as resp:
            assert b"clink_pool_requests" in resp.read()
        with urllib.request.urlopen(f"https://127.0.0.1:{pool.http_port}/healthz", context=ctx, timeout=5) as resp:
            assert resp.read() == b"ok\n"
        assert time.perf_counter() - started < HONEST_DEADLINE_S
    finally:
        for s in idle:
            s.close()


def test_a_fenced_writer_streaming_a_large_delta_is_refused_before_its_body_is_read(pool):
    stub = pb_grpc.RemotePoolStub(ch := pool.channel("tok-b-rw"))
    old = stub.AcquireWriter(pb.AcquireWriterRequest(job="job-b", key_groups=pb.KeyGroupRange(lo=0, hi=127)), timeout=10).epoch
    stub.AcquireWriter(pb.AcquireWriterRequest(job="job-b", key_groups=pb.KeyGroupRange(lo=0, hi=127)), timeout=10)  # fences `old`
    sent = []

    def chunks() -> Iterator[pb.CommitChunk]:
        yield pb.CommitChunk(header=pb.CommitHeader(job="job-b", checkpoint_id=9, key_groups=pb.KeyGroupRange(lo=0, hi=127), epoch=old))
        block = os.urandom(1 << 20)
        for _ in range(200):  # 200 MB
            sent.append(1)
            yield pb.CommitChunk(delta=block)

    def run() -> None:
        with pytest.raises(grpc.RpcError) as info:
            stub.CommitCheckpoint(chunks(), timeout=60)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION

    try:
        attack(pool, 60, run)
    finally:
        ch.close()
    assert len(sent) < 200, "the pool read the whole body of a fenced commit"


def _changelog_blob(n: int, value_bytes: int, tag: bytes) -> bytes:
    return write_snapshot(
        pa.table(
            {
                "row_kind": pa.array([1] * n, pa.int8()),
                "op_id": pa.array([9] * n, pa.uint64()),
                "key_bytes": pa.array([b"\x07" + tag + i.to_bytes(6, "big") for i in range(n)]),
                "value_bytes": pa.array([os.urandom(value_bytes)] * n),
            },
            schema=CHANGELOG_SCHEMA,
        ),
        changelog=True,
    )


def test_concurrent_large_commits_share_one_memory_budget(pool):
    blob = _changelog_blob(200_000, 200, b"big")  # ~43 MB each; the pool's budget (256 MiB) holds one at a time (4x)
    stub = pb_grpc.RemotePoolStub(ch := pool.channel("tok-b-rw"))
    leases = [
        stub.AcquireWriter(pb.AcquireWriterRequest(job="job-b", key_groups=pb.KeyGroupRange(lo=32 * i, hi=32 * i + 31)), timeout=10).epoch
        for i in range(4)
    ]
    codes: list[grpc.StatusCode] = []

    def chunks(i: int) -> Iterator[pb.CommitChunk]:
        yield pb.CommitChunk(
            header=pb.CommitHeader(job="job-b", checkpoint_id=20, key_groups=pb.KeyGroupRange(lo=32 * i, hi=32 * i + 31), epoch=leases[i])
        )
        for at in range(0, len(blob), 1 << 20):
            yield pb.CommitChunk(delta=blob[at : at + (1 << 20)])

    def run() -> None:
        calls = [stub.CommitCheckpoint.future(chunks(i), timeout=120) for i in range(4)]
        for c in calls:
            codes.append(c.exception(120).code() if c.exception(120) else grpc.StatusCode.OK)

    try:
        attack(pool, 450, run)
    finally:
        ch.close()
    # key group 7 lies in the first writer's range: its commit may land; the others are refused after their bodies were
    # decoded (keys outside the range) or, growing while another holds the budget, at once (clients retry those)
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED}, codes


def test_stalled_overlay_scans_hold_no_more_than_the_budget(pool):
    overlay = _changelog_blob(60_000, 200, b"ovl")  # ~13 MB, under the request limit
    stub = pb_grpc.RemotePoolStub(ch := pool.channel("tok-a-ro"))
    codes: list[grpc.StatusCode] = []

    def run() -> None:
        calls = [stub.ScanCheckpoint(pb.ScanCheckpointRequest(job="job-a", delta=overlay), timeout=60) for _ in range(8)]  # never read
        time.sleep(IDLE_S * 3)
        for call in calls:
            try:
                for _ in call:
                    pass
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as exc:
                codes.append(exc.code())

    try:
        attack(pool, 500, run)  # the budget (256 MiB of estimated working memory) plus the request messages held
    finally:
        ch.close()
    assert grpc.StatusCode.DEADLINE_EXCEEDED in codes or grpc.StatusCode.RESOURCE_EXHAUSTED in codes, codes
    assert pool.gauge("clink_pool_request_memory_bytes") == 0  # every reservation given back once the streams ended
    assert pool.gauge("clink_pool_calls_in_flight") <= 1  # (the scrape itself is not a call; a late honest Get may be)


def test_after_the_attacks_nothing_is_held(pool):
    """Whatever ran before on this pool (refused, cancelled, failed or finished), no admission or memory is still counted."""
    assert pool.gauge("clink_pool_calls_in_flight") == 0
    assert pool.gauge("clink_pool_request_memory_bytes") == 0
    assert pool.honest.get("job-a", 0, 7, b"\x05honest") == b"yes"


def test_idle_http_connections_are_capped_and_cut_and_the_export_keeps_serving(pool):
    import socket
    import ssl

    from pool.http_serving import HEADER_DEADLINE_S

    idle = []
    stop = threading.Event()

    def trickle() -> None:  # one byte of a TLS handshake now and then: a per-read timeout alone never fires
        while not stop.wait(1.0):
            for s in idle:
                try:
                    s.send(b"\x16")
                except OSError:
                    pass

    for _ in range(80):  # more than the 64 connections a port serves at once
        idle.append(socket.create_connection(("127.0.0.1", pool.http_port), timeout=5))
    trickler = threading.Thread(target=trickle, daemon=True)
    trickler.start()
    try:
        time.sleep(0.5)
        threads = int(
            next(line.split()[1] for line in Path(f"/proc/{pool.proc.pid}/status").read_text().splitlines() if line.startswith("Threads:"))
        )
        assert threads < 64 + 60, threads  # bounded: the capped connections, the pool's own lanes and grpc's threads
        ctx = ssl.create_default_context(cadata=pool.pki.ca_pem.decode())
        deadline = time.monotonic() + HEADER_DEADLINE_S + 5
        while True:  # the tricklers are cut after the header deadline: an honest request gets through while they go on
            try:
                with urllib.request.urlopen(f"https://127.0.0.1:{pool.http_port}/healthz", context=ctx, timeout=5) as resp:
                    assert resp.read() == b"ok\n"
                break
            except (urllib.error.URLError, OSError, ssl.SSLError):
                assert time.monotonic() < deadline, "the trickling connections were never cut"
                time.sleep(0.5)
    finally:
        stop.set()
        trickler.join(5)
        for s in idle:
            s.close()


def test_a_commit_trickling_tiny_chunks_is_cancelled_and_gives_its_budget_back(pool):
    stub = pb_grpc.RemotePoolStub(ch := pool.channel("tok-b-rw"))
    epoch = stub.AcquireWriter(pb.AcquireWriterRequest(job="job-b", key_groups=pb.KeyGroupRange(lo=64, hi=95)), timeout=10).epoch

    def chunks() -> Iterator[pb.CommitChunk]:
        yield pb.CommitChunk(header=pb.CommitHeader(job="job-b", checkpoint_id=30, key_groups=pb.KeyGroupRange(lo=64, hi=95), epoch=epoch))
        yield pb.CommitChunk(delta=os.urandom(8 << 20))  # takes budget...
        for _ in range(100):  # ...then keeps the stream "alive" with empty messages
            time.sleep(0.2)
            yield pb.CommitChunk(delta=b"")

    started = time.monotonic()
    try:
        with pytest.raises(grpc.RpcError) as info:
            stub.CommitCheckpoint(chunks(), timeout=60)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - started < IDLE_S * 4
    finally:
        ch.close()
    assert pool.gauge("clink_pool_request_memory_bytes") == 0
