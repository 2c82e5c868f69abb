"""Helpers for the pool-server tests: changelog deltas, a dict model of a job's state, raw gRPC calls."""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator

import grpc
import pyarrow as pa

import snapshot
from protos import remote_pool_pb2 as pb
from protos import remote_pool_pb2_grpc as pb_grpc

Model = dict[tuple[int, bytes], bytes]

OPS = (snapshot.operator_id("counter"), snapshot.operator_id("window"), snapshot.operator_id("dedup"))
OP_UIDS = (("counter", OPS[0]), ("window", OPS[1]), ("dedup", OPS[2]))


def keyed_keys_in(lo: int, hi: int, count: int, seed: int, slot: str = "v") -> list[bytes]:
    """``count`` distinct keyed keys whose key group is within lo..hi."""
    rng = random.Random(seed)
    out: list[bytes] = []
    seen: set[bytes] = set()
    while len(out) < count:
        user = rng.randbytes(6)
        if lo <= snapshot.key_group(user) <= hi:
            key = snapshot.encode_keyed_key(slot, user)
            if key not in seen:
                seen.add(key)
                out.append(key)
    return out


def changelog_bytes(rows: Iterable[tuple[int, int, bytes, bytes]], state_versions: snapshot.StateVersionMap | None = None) -> bytes:
    """A changelog-variant stream from (row_kind, op_id, key, value) rows."""
    rows = list(rows)
    table = pa.table(
        {
            "row_kind": pa.array([r[0] for r in rows], pa.uint8()),
            "op_id": pa.array([r[1] for r in rows], pa.uint64()),
            "key_bytes": pa.array([r[2] for r in rows], pa.binary()),
            "value_bytes": pa.array([r[3] for r in rows], pa.binary()),
        }
    )
    return snapshot.SnapshotArrowWriter(state_versions, changelog=True).write(table)


def apply(model: Model, rows: Iterable[tuple[int, int, bytes, bytes]]) -> Model:
    """The model after a changelog: puts overwrite, erases remove (materialisation rows count as puts)."""
    out = dict(model)
    for kind, op, key, value in rows:
        if kind == snapshot.ROW_ERASE:
            out.pop((op, key), None)
        else:
            out[(op, key)] = value
    return out


def random_delta(model: Model, keys: list[bytes], rng: random.Random, n: int, tag: str) -> list[tuple[int, int, bytes, bytes]]:
    """``n`` random puts, overwrites and erases over ``keys`` and the three operators (no key twice)."""
    rows = []
    chosen = rng.sample(keys, min(n, len(keys)))
    for key in chosen:
        op = rng.choice(OPS)
        if (op, key) in model and rng.random() < 0.3:
            rows.append((snapshot.ROW_ERASE, op, key, b""))
        else:
            rows.append((snapshot.ROW_PUT, op, key, f"{tag}:{key.hex()}".encode()))
    return rows


def table_to_model(table: pa.Table) -> Model:
    """A scanned canonical table as a model (asserts one row per key)."""
    ops = table.column("op_id").to_pylist()
    keys = table.column("key_bytes").to_pylist()
    values = table.column("value_bytes").to_pylist()
    out = dict(zip(zip(ops, keys, strict=True), values, strict=True))
    assert len(out) == table.num_rows, "scan returned a key twice"
    return out


def in_range(model: Model, lo: int, hi: int) -> Model:
    """The model restricted as a key-group scan restricts it: keyed keys in lo..hi plus every operator-state key."""
    return {(op, k): v for (op, k), v in model.items() if (k[0] if k else 0) >= 128 or lo <= (k[0] if k else 0) <= hi}


class RawPool:
    """Thin raw-stub wrapper for tests: every call is a plain gRPC call; errors stay grpc.RpcError."""

    def __init__(self, address: str, max_message_bytes: int = 64 << 20) -> None:
        self.channel = grpc.insecure_channel(
            address, options=[("grpc.max_send_message_length", max_message_bytes), ("grpc.max_receive_message_length", max_message_bytes)]
        )
        self.stub = pb_grpc.RemotePoolStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def acquire(self, job: str, lo: int = 0, hi: int = 127) -> int:
        return self.stub.AcquireWriter(pb.AcquireWriterRequest(job=job, key_groups=pb.KeyGroupRange(lo=lo, hi=hi)), timeout=30).epoch

    def commit(
        self,
        job: str,
        checkpoint_id: int,
        parent_id: int,
        epoch: int,
        delta: bytes,
        lo: int = 0,
        hi: int = 127,
        chunk: int = 1 << 20,
        state_versions: str = "",
    ) -> pb.CommitCheckpointResponse:
        header = pb.CommitHeader(
            job=job,
            checkpoint_id=checkpoint_id,
            parent_id=parent_id,
            key_groups=pb.KeyGroupRange(lo=lo, hi=hi),
            epoch=epoch,
            state_versions=state_versions,
            operators=[pb.OperatorInfo(op_id=op, uid=uid) for uid, op in OP_UIDS],
        )

        def chunks() -> Iterator[pb.CommitChunk]:
            yield pb.CommitChunk(header=header)
            for start in range(0, len(delta), chunk):
                yield pb.CommitChunk(delta=delta[start : start + chunk])

        return self.stub.CommitCheckpoint(chunks(), timeout=60)

    def scan_bytes(
        self,
        job: str,
        checkpoint_id: int = 0,
        key_groups: tuple[int, int] | None = None,
        op_ids: list[int] | None = None,
        delta: bytes = b"",
    ) -> bytes:
        request = pb.ScanCheckpointRequest(job=job, checkpoint_id=checkpoint_id, op_ids=op_ids or [], delta=delta)
        if key_groups is not None:
            request.key_groups.CopyFrom(pb.KeyGroupRange(lo=key_groups[0], hi=key_groups[1]))
        return b"".join(c.data for c in self.stub.ScanCheckpoint(request, timeout=60))

    def scan(self, job: str, checkpoint_id: int = 0, **kw: object) -> Model:
        return table_to_model(snapshot.read_snapshot(self.scan_bytes(job, checkpoint_id, **kw)).table)

    def get(self, job: str, checkpoint_id: int, op_id: int, key: bytes) -> pb.GetResponse:
        return self.stub.Get(pb.GetRequest(job=job, checkpoint_id=checkpoint_id, op_id=op_id, key_bytes=key), timeout=30)

    def multi_get(self, job: str, checkpoint_id: int, op_ids: list[int], keys: list[bytes]) -> pb.MultiGetResponse:
        return self.stub.MultiGet(pb.MultiGetRequest(job=job, checkpoint_id=checkpoint_id, op_ids=op_ids, keys=keys), timeout=30)

    def checkpoints(self, job: str, include_incomplete: bool = True) -> list[pb.CheckpointInfo]:
        return list(
            self.stub.ListCheckpoints(pb.ListCheckpointsRequest(job=job, include_incomplete=include_incomplete), timeout=30).checkpoints
        )
