"""Benchmark the RemotePool over real gRPC against baselines measured in the same run (commit, MultiGet, scan)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import snapshot  # noqa: E402
from pool.server import PoolServer, PoolServerConfig, grpc_options  # noqa: E402
from protos import remote_pool_pb2 as pb  # noqa: E402
from protos import remote_pool_pb2_grpc as pb_grpc  # noqa: E402
from store.objects import StoreConfig, open_store  # noqa: E402

VALUE_BYTES = 32
SLOT = b"v|"
OPERATORS = tuple(snapshot.operator_id(uid) for uid in ("counter", "window"))
TARGETS = {
    "commit 1% delta / full commit": ("<=", 0.05),
    "MultiGet / raw echo": (">=", 0.25),
    "Get / raw echo": ("<=", 1.3),
    "scan / raw stream": (">=", 0.50),
    "scan peak memory / stream": ("<=", 3.0),
}
CHUNK = 1 << 20
MAX_MESSAGE = 64 << 20
ECHO_METHOD = "/bench.Echo/Unary"
STREAM_METHOD = "/bench.Echo/Stream"


def binary_array(data: np.ndarray, width: int) -> pa.Array:
    """A BinaryArray of equal-width values cut from one uint8 buffer (no per-row Python)."""
    n = data.size // width
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(data))])


def keyed_keys(user_ints: np.ndarray) -> pa.Array:
    """encode_keyed_key("v", 8-byte big-endian user key) for every int, vectorised (FNV-1a over the 8 bytes in numpy)."""
    users = user_ints.astype(">u8").view(np.uint8).reshape(-1, 8)
    h = np.full(len(users), snapshot.keys.FNV_OFFSET_BASIS, dtype=np.uint64)
    prime = np.uint64(snapshot.keys.FNV_PRIME)
    with np.errstate(over="ignore"):
        for i in range(8):
            h = (h ^ users[:, i].astype(np.uint64)) * prime
    kg = (h % np.uint64(snapshot.NUM_KEY_GROUPS)).astype(np.uint8)
    width = 1 + len(SLOT) + 8
    out = np.empty((len(users), width), dtype=np.uint8)
    out[:, 0] = kg
    out[:, 1 : 1 + len(SLOT)] = np.frombuffer(SLOT, dtype=np.uint8)
    out[:, 1 + len(SLOT) :] = users
    return binary_array(out.reshape(-1), width)


def changelog(kinds: np.ndarray, ops: np.ndarray, keys: pa.Array, values: pa.Array) -> bytes:
    """A changelog-variant snapshot stream."""
    table = pa.Table.from_arrays([pa.array(kinds, pa.uint8()), pa.array(ops, pa.uint64()), keys, values], schema=snapshot.CHANGELOG_SCHEMA)
    return snapshot.SnapshotArrowWriter(changelog=True).write(table)


def random_values(rng: np.random.Generator, n: int) -> pa.Array:
    return binary_array(rng.integers(0, 256, n * VALUE_BYTES, dtype=np.uint8), VALUE_BYTES)


def make_state(rows: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, bytes]:
    """The user ints, op ids and the full-state changelog (all puts)."""
    user_ints = rng.permutation(rows).astype(np.uint64)
    ops = np.array(OPERATORS, dtype=np.uint64)[rng.integers(0, len(OPERATORS), rows)]
    full = changelog(np.full(rows, snapshot.ROW_PUT, np.uint8), ops, keyed_keys(user_ints), random_values(rng, rows))
    return user_ints, ops, full


def make_delta(
    user_ints: np.ndarray,
    ops: np.ndarray,
    fraction: float,
    rng: np.random.Generator,
    next_new: int,
    keys_of: Callable[[np.ndarray], pa.Array] = keyed_keys,
) -> bytes:
    """A delta touching ``fraction`` of the state: 80% overwrites, 10% erases, 10% new keys (``keys_of``: user ints to keys)."""
    n = max(int(len(user_ints) * fraction), 10)
    n_over, n_erase = int(n * 0.8), int(n * 0.1)
    n_new = n - n_over - n_erase
    idx = rng.choice(len(user_ints), n_over + n_erase, replace=False)
    d_users = np.concatenate([user_ints[idx], np.arange(next_new, next_new + n_new, dtype=np.uint64)])
    d_ops = np.concatenate([ops[idx], np.full(n_new, OPERATORS[0], np.uint64)])
    kinds = np.concatenate(
        [np.full(n_over, snapshot.ROW_PUT), np.full(n_erase, snapshot.ROW_ERASE), np.full(n_new, snapshot.ROW_PUT)]
    ).astype(np.uint8)
    values = random_values(rng, n)
    return changelog(kinds, d_ops, keys_of(d_users), values)


def commit_chunks(job: str, cid: int, parent: int, epoch: int, delta: bytes) -> Iterator[pb.CommitChunk]:
    header = pb.CommitHeader(
        job=job,
        checkpoint_id=cid,
        parent_id=parent,
        key_groups=pb.KeyGroupRange(lo=0, hi=127),
        epoch=epoch,
        operators=[pb.OperatorInfo(op_id=op, uid=uid) for op, uid in zip(OPERATORS, ("counter", "window"), strict=True)],
    )
    yield pb.CommitChunk(header=header)
    view = memoryview(delta)
    for start in range(0, len(delta), CHUNK):
        yield pb.CommitChunk(delta=bytes(view[start : start + CHUNK]))


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def rate(fn: Callable[[], object], seconds: float, min_calls: int = 5) -> float:
    """Calls per second of ``fn`` over about ``seconds`` (after one warm-up call)."""
    fn()
    calls, start = 0, time.perf_counter()
    while calls < min_calls or time.perf_counter() - start < seconds:
        fn()
        calls += 1
    return calls / (time.perf_counter() - start)


class EchoServer:
    """The baseline: a generic gRPC server with the pool's options, one unary and one streaming handler over raw bytes."""

    def __init__(self, unary_reply: bytes, stream_chunks: list[bytes]) -> None:
        def unary(request: bytes, context: grpc.ServicerContext) -> bytes:
            return unary_reply

        def stream(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
            yield from stream_chunks

        handler = grpc.method_handlers_generic_handler(
            "bench.Echo",
            {"Unary": grpc.unary_unary_rpc_method_handler(unary), "Stream": grpc.unary_stream_rpc_method_handler(stream)},
        )
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), options=grpc_options(MAX_MESSAGE))
        self.server.add_generic_rpc_handlers((handler,))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def stop(self) -> None:
        self.server.stop(0).wait()


def _proc_status_bytes(field: str) -> int:
    """A kB figure of /proc/self/status (e.g. VmRSS, VmHWM) in bytes; 0 when the field is missing."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    return 0


def rss_bytes() -> int:
    return _proc_status_bytes("VmRSS")


def peak_rss_bytes() -> int:
    return _proc_status_bytes("VmHWM")


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux clear_refs 5); False when not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def scan_memory_child(store_uri: str, job: str, cid: int) -> None:
    """In a fresh process: start a pool on the store, scan once (cold cache), print the peak RSS growth as JSON."""
    endpoint = os.environ.get("CLINK_BENCH_S3_ENDPOINT")
    store_config = (
        StoreConfig(endpoint_url=endpoint, region="us-east-1", access_key_id="testing", secret_access_key="testing")
        if endpoint
        else StoreConfig()
    )
    server = PoolServer(PoolServerConfig(store_uri=store_uri, listen="127.0.0.1:0", store=store_config)).start()
    channel = grpc.insecure_channel(server.address, options=grpc_options(MAX_MESSAGE))
    stub = pb_grpc.RemotePoolStub(channel)
    stub.ListJobs(pb.ListJobsRequest(), timeout=30)  # connection and threads up before the baseline
    sampler_peak = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            sampler_peak[0] = max(sampler_peak[0], rss_bytes())
            time.sleep(0.002)

    before = rss_bytes()
    hwm_ok = reset_peak_rss()
    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    total = 0
    for chunk in stub.ScanCheckpoint(pb.ScanCheckpointRequest(job=job, checkpoint_id=cid), timeout=600):
        total += len(chunk.data)
    stop.set()
    thread.join()
    peak = max(peak_rss_bytes() if hwm_ok else 0, sampler_peak[0])
    print(json.dumps({"before": before, "peak": peak, "stream_bytes": total, "hwm": hwm_ok}))
    channel.close()
    server.stop(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000, help="keys in the state (default 1,000,000)")
    parser.add_argument("--delta", type=float, default=0.01, help="fraction of the state a delta touches (default 0.01)")
    parser.add_argument("--keys", type=int, default=1000, help="keys per MultiGet (default 1000)")
    parser.add_argument("--gets", type=int, default=1000, help="single Gets per timed round, of the MultiGet's keys (default 1000)")
    parser.add_argument("--seconds", type=float, default=3.0, help="time per rate measurement")
    parser.add_argument("--store", choices=["file", "moto"], default="file", help="object store behind the pool (default file)")
    parser.add_argument("--scan-memory-child", nargs=3, metavar=("URI", "JOB", "CID"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.scan_memory_child:
        uri, job, cid = args.scan_memory_child
        scan_memory_child(uri, job, int(cid))
        return

    rng = np.random.default_rng(42)
    tmp = tempfile.TemporaryDirectory(prefix="bench-pool-")
    moto = None
    if args.store == "moto":
        from moto.server import ThreadedMotoServer

        moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        moto.start()
        host, port = moto.get_host_and_port()
        os.environ["CLINK_BENCH_S3_ENDPOINT"] = f"http://{host}:{port}"  # for the scan-memory child process
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto logs every request otherwise
        store_config = StoreConfig(
            endpoint_url=f"http://{host}:{port}", region="us-east-1", access_key_id="testing", secret_access_key="testing"
        )
        store_uri = "s3://bench/pool"
        store = open_store(store_uri, store_config)
        store.create_bucket()  # type: ignore[attr-defined]
    else:
        store_config = StoreConfig()
        store_uri = f"file://{tmp.name}/store"
        store = open_store(store_uri, store_config)

    print(f"bench_pool: {args.rows:,} rows, {args.delta:.0%} delta, {args.keys} keys per MultiGet, store {args.store}")
    t0 = time.perf_counter()
    user_ints, ops, full = make_state(args.rows, rng)
    print(f"  state built in {time.perf_counter() - t0:.1f}s: full changelog {len(full) / 1e6:.1f} MB")

    server = PoolServer(PoolServerConfig(store_uri=store_uri, listen="127.0.0.1:0", store=store_config), store=store).start()
    channel = grpc.insecure_channel(server.address, options=grpc_options(MAX_MESSAGE))
    stub = pb_grpc.RemotePoolStub(channel)
    results: dict[str, float] = {}

    # 1. commit: the full state as one checkpoint, then 1% deltas on top of it
    full_times = []
    for attempt in range(2):
        job = f"full-{attempt}"
        epoch = stub.AcquireWriter(pb.AcquireWriterRequest(job=job, key_groups=pb.KeyGroupRange(lo=0, hi=127))).epoch
        seconds, resp = timed(lambda job=job, epoch=epoch: stub.CommitCheckpoint(commit_chunks(job, 1, 0, epoch, full), timeout=600))
        full_times.append(seconds)
        full_bytes = resp.bytes_written
    job = "full-0"
    epoch = stub.AcquireWriter(pb.AcquireWriterRequest(job=job, key_groups=pb.KeyGroupRange(lo=0, hi=127))).epoch
    delta_times, delta_bytes = [], 0
    next_new = args.rows + 1
    for cid in range(2, 5):
        delta = make_delta(user_ints, ops, args.delta, rng, next_new)
        next_new += args.rows
        seconds, resp = timed(
            lambda cid=cid, delta=delta: stub.CommitCheckpoint(commit_chunks(job, cid, cid - 1, epoch, delta), timeout=600)
        )
        delta_times.append(seconds)
        delta_bytes = resp.bytes_written
    last_cid = 4
    raw_put, _ = timed(lambda: store.put("bench/raw-full-upload", full))
    results["commit 1% delta / full commit"] = min(delta_times) / min(full_times)
    print(
        f"  commit full state: {min(full_times) * 1e3:.0f} ms ({full_bytes / 1e6:.1f} MB written); raw store put of the same bytes {raw_put * 1e3:.0f} ms"
    )
    print(
        f"  commit {args.delta:.0%} delta: {min(delta_times) * 1e3:.0f} ms ({delta_bytes / 1e6:.2f} MB written); "
        f"bytes ratio {delta_bytes / full_bytes:.4f}; time vs raw put {min(delta_times) / raw_put:.3f}"
    )

    # 2. MultiGet of 1,000 random keys vs a raw echo of the same request and response bytes
    pick = rng.choice(args.rows, args.keys, replace=False)
    keys = keyed_keys(user_ints[pick]).to_pylist()
    request = pb.MultiGetRequest(job=job, checkpoint_id=last_cid, op_ids=ops[pick].tolist(), keys=keys)
    response = stub.MultiGet(request, timeout=60)
    assert sum(response.found) >= args.keys * 0.8, "most picked keys should be found"
    unpinned = pb.MultiGetRequest()
    unpinned.CopyFrom(request)
    # as RemoteReadBackend sends it: pinned to the manifest version it holds (a call without the etag makes the pool read
    # _metadata again to be sure it is current; measured below as well)
    request.manifest_etag = response.manifest_etag
    echo_server = EchoServer(response.SerializeToString(), [])
    echo_channel = grpc.insecure_channel(f"127.0.0.1:{echo_server.port}", options=grpc_options(MAX_MESSAGE))
    # the client (de)serialises the same protobuf messages as the real stub; the echo handler itself touches raw bytes only
    echo = echo_channel.unary_unary(
        ECHO_METHOD, request_serializer=pb.MultiGetRequest.SerializeToString, response_deserializer=pb.MultiGetResponse.FromString
    )
    request_bytes = request.SerializeToString()
    # interleaved rounds, median ratio: other load on the machine hits both sides of a round alike
    rounds = [
        (rate(lambda: stub.MultiGet(request, timeout=60), args.seconds / 5), rate(lambda: echo(request, timeout=60), args.seconds / 5))
        for _ in range(5)
    ]
    pool_rate, echo_rate = sorted(rounds, key=lambda r: r[0] / r[1])[len(rounds) // 2]
    results["MultiGet / raw echo"] = pool_rate / echo_rate
    unpinned_rate = rate(lambda: stub.MultiGet(unpinned, timeout=60), args.seconds / 5)
    # the gRPC face's own ceiling: the same RPC with the core's answer precomputed (servicer + interceptor + protobuf only)
    canned = (np.array(response.found, dtype=bool), pa.array(list(response.values), pa.binary()), response.checkpoint_id)
    real_multi_get = server.core.multi_get_arrays
    server.core.multi_get_arrays = lambda *_a, **_k: canned  # type: ignore[method-assign]
    face_rate = rate(lambda: stub.MultiGet(request, timeout=60), args.seconds)
    server.core.multi_get_arrays = real_multi_get  # type: ignore[method-assign]
    core_seconds = min(
        timed(lambda: real_multi_get(job, last_cid, np.array(request.op_ids, np.uint64), list(request.keys)))[0] for _ in range(20)
    )
    print(
        f"  MultiGet {args.keys} keys: {pool_rate:.0f} calls/s = {pool_rate * args.keys:,.0f} keys/s; raw echo of the same "
        f"{len(request_bytes):,} B in / {response.ByteSize():,} B out: {echo_rate:.0f} calls/s; "
        f"without the manifest etag {unpinned_rate:.0f} calls/s ({unpinned_rate / echo_rate:.3f} of echo)"
    )
    print(
        f"    where the time goes: gRPC face alone (core answer canned) {face_rate:.0f} calls/s = {face_rate / echo_rate:.2f} of echo; "
        f"PoolCore.multi_get alone {core_seconds * 1e3:.2f} ms per call"
    )
    echo_server.stop()
    echo_channel.close()

    # 2b. single Gets one after another vs raw unary echoes of the same request and response bytes
    get_requests = [
        pb.GetRequest(job=job, checkpoint_id=last_cid, op_id=op, key_bytes=key, manifest_etag=response.manifest_etag)
        for op, key, hit in zip(request.op_ids, keys, response.found, strict=True)
        if hit  # found keys only: every response carries one value, as the echo's does
    ][: args.gets]
    # each key read once first: its segments and indexes are cached, so the store is not what is timed
    get_replies = [stub.Get(r, timeout=60) for r in get_requests]
    assert all(r.found for r in get_replies), "the picked keys were found by MultiGet"
    get_echo_server = EchoServer(get_replies[0].SerializeToString(), [])
    get_echo_channel = grpc.insecure_channel(f"127.0.0.1:{get_echo_server.port}", options=grpc_options(MAX_MESSAGE))
    get_echo = get_echo_channel.unary_unary(
        ECHO_METHOD, request_serializer=pb.GetRequest.SerializeToString, response_deserializer=pb.GetResponse.FromString
    )

    def per_call(call: Callable[..., object]) -> float:
        """Seconds per call of ``call`` over every Get request in turn, each call waiting for the one before."""
        start = time.perf_counter()
        for r in get_requests:
            call(r, timeout=60)
        return (time.perf_counter() - start) / len(get_requests)

    per_call(get_echo)  # connection up before the first round
    # interleaved rounds, median ratio: other load on the machine hits both sides of a round alike
    get_rounds = [(per_call(stub.Get), per_call(get_echo)) for _ in range(5)]
    get_seconds, get_echo_seconds = sorted(get_rounds, key=lambda r: r[0] / r[1])[len(get_rounds) // 2]
    results["Get / raw echo"] = get_seconds / get_echo_seconds
    # the gRPC face's own cost: the same RPC with the core's answer precomputed (servicer + interceptor + protobuf only)
    canned_get = (True, get_replies[0].value, get_replies[0].checkpoint_id, get_replies[0].manifest_etag)
    real_get = server.core.get_with_etag
    server.core.get_with_etag = lambda *_a, **_k: canned_get  # type: ignore[method-assign]
    get_face_seconds = per_call(stub.Get)
    server.core.get_with_etag = real_get  # type: ignore[method-assign]
    core_get_seconds = min(
        timed(lambda: [real_get(job, last_cid, r.op_id, r.key_bytes, r.manifest_etag) for r in get_requests])[0] for _ in range(3)
    ) / len(get_requests)
    print(
        f"  Get, {len(get_requests)} cached keys one after another: {get_seconds * 1e6:.0f} us per call; raw echo of the same "
        f"{get_requests[0].ByteSize()} B in / {get_replies[0].ByteSize()} B out: {get_echo_seconds * 1e6:.0f} us"
    )
    print(
        f"    where the time goes: gRPC face alone (core answer canned) {get_face_seconds * 1e6:.0f} us = "
        f"{get_face_seconds / get_echo_seconds:.2f} of echo; PoolCore.get_with_etag alone {core_get_seconds * 1e6:.1f} us per call"
    )
    get_echo_server.stop()
    get_echo_channel.close()

    # 3. ScanCheckpoint of the whole state vs raw streaming of the same chunks
    scan_request = pb.ScanCheckpointRequest(job=job, checkpoint_id=last_cid)
    cold, chunks = timed(lambda: [c.data for c in stub.ScanCheckpoint(scan_request, timeout=600)])
    stream_bytes = sum(len(c) for c in chunks)
    scanned_rows = snapshot.read_snapshot(b"".join(chunks)).table.num_rows
    # the same ScanChunk messages on the wire, parsed by the client the same way; the handler only replays bytes
    stream_server = EchoServer(b"", [pb.ScanChunk(data=c).SerializeToString() for c in chunks])
    stream_channel = grpc.insecure_channel(f"127.0.0.1:{stream_server.port}", options=grpc_options(MAX_MESSAGE))
    raw_stream = stream_channel.unary_stream(STREAM_METHOD, response_deserializer=pb.ScanChunk.FromString)

    def drain(call: Iterator[object]) -> int:
        return sum(len(c) for c in call)  # type: ignore[arg-type]

    scan_times, raw_times = [], []
    for _ in range(5):  # interleaved, so load from elsewhere hits both alike
        scan_times.append(timed(lambda: drain(c.data for c in stub.ScanCheckpoint(scan_request, timeout=600)))[0])
        raw_times.append(timed(lambda: drain(c.data for c in raw_stream(b"", timeout=600)))[0])
    results["scan / raw stream"] = min(raw_times) / min(scan_times)
    core_scan = min(timed(lambda: server.core.scan_table(job, last_cid, None, [], None))[0] for _ in range(3))
    print(
        f"  ScanCheckpoint {scanned_rows:,} rows, {stream_bytes / 1e6:.1f} MB in {len(chunks)} chunks: cold {cold * 1e3:.0f} ms, "
        f"warm {min(scan_times) * 1e3:.0f} ms ({stream_bytes / min(scan_times) / 1e6:.0f} MB/s); raw stream {min(raw_times) * 1e3:.0f} ms "
        f"({stream_bytes / min(raw_times) / 1e6:.0f} MB/s)"
    )
    print(f"    where the time goes: PoolCore.scan_table (merge of the layers) {core_scan * 1e3:.0f} ms of the warm scan")
    stream_server.stop()
    stream_channel.close()
    channel.close()
    server.stop(0)

    # 4. peak memory of a cold scan in a fresh process (so earlier phases' freed memory cannot hide it)
    env = dict(os.environ)
    child = subprocess.run(
        [sys.executable, __file__, "--scan-memory-child", store_uri, job, str(last_cid)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        check=False,
    )
    if child.returncode != 0:
        print(child.stderr, file=sys.stderr)
        raise SystemExit("scan memory child failed")
    mem = json.loads(child.stdout.strip().splitlines()[-1])
    growth = mem["peak"] - mem["before"]
    results["scan peak memory / stream"] = growth / mem["stream_bytes"]
    print(
        f"  cold scan in a fresh pool process: peak RSS growth {growth / 1e6:.1f} MB for a {mem['stream_bytes'] / 1e6:.1f} MB stream "
        f"({'VmHWM' if mem['hwm'] else 'sampled RSS'})"
    )

    print("\nratio                              value    target  ok")
    failed = False
    for name, value in results.items():
        op, target = TARGETS[name]
        ok = value <= target if op == "<=" else value >= target
        failed |= not ok
        print(f"  {name:32} {value:7.3f}   {op} {target:<5} {'yes' if ok else 'NO'}")
    if moto is not None:
        moto.stop()
    tmp.cleanup()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
