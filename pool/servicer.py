"""The RemotePool gRPC servicer: protobuf in, domain calls, protobuf out; nothing else lives here."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pool.auth import WRITE, caller
from pool.core import PoolCore
from pool.domain import CheckpointInfo, CommitRequest, KeyGroupRange
from pool.lifecycle import Lifecycle, LifecycleConfig
from pool.streaming import length_delimited_field_1
from protos import remote_pool_pb2 as pb
from protos import remote_pool_pb2_grpc as pb_grpc
from snapshot.errors import InvalidArgumentError, LimitExceededError
from store.layout import savepoint_prefix

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["RemotePool"].full_name


def _range(message: pb.KeyGroupRange) -> KeyGroupRange:
    return KeyGroupRange(lo=message.lo, hi=message.hi)


def _required_range(holder: object, what: str) -> KeyGroupRange:
    if not holder.HasField("key_groups"):  # type: ignore[attr-defined]
        raise InvalidArgumentError(f"{what}: key_groups is required (an inclusive range within 0..127)")
    return _range(holder.key_groups)  # type: ignore[attr-defined]


def _info(info: CheckpointInfo) -> pb.CheckpointInfo:
    return pb.CheckpointInfo(
        job=info.job,
        checkpoint_id=info.checkpoint_id,
        parent_id=info.parent_id,
        complete=info.complete,
        committed_ranges=[pb.KeyGroupRange(lo=r.lo, hi=r.hi) for r in info.committed_ranges],
        created_at_ms=info.created_at_ms,
        num_files=info.num_files,
        total_bytes=info.total_bytes,
        num_rows=info.num_rows,
        operators=[pb.OperatorInfo(op_id=op_id, uid=uid or "") for op_id, uid in info.operators],
        state_versions=info.state_versions,
        manifest_etag=info.manifest_etag,
        abandoned=info.abandoned,
    )


def _holder() -> str | None:
    """Whom the call's work counts against (the token's identity; None when the pool runs without tokens)."""
    grant = caller()
    return grant.identity if grant is not None else None


def _commit_request(header: pb.CommitHeader) -> CommitRequest:
    return CommitRequest(
        job=header.job,
        checkpoint_id=header.checkpoint_id,
        parent_id=header.parent_id,
        key_groups=_required_range(header, "CommitCheckpoint header"),
        epoch=header.epoch,
        state_versions=header.state_versions,
        operators=tuple((op.op_id, op.uid) for op in header.operators),
        attempt=header.attempt,
    )


def _delta_chunks(chunks: Iterator[pb.CommitChunk]) -> Iterator[bytes]:
    """The delta bytes of the chunks after the header, handed on one by one (never gathered here)."""
    for chunk in chunks:
        part = chunk.WhichOneof("part")
        if part == "delta":
            if chunk.delta:
                yield chunk.delta
        elif part == "header":
            raise InvalidArgumentError("CommitCheckpoint: a second header arrived; only the first message may be the header")


class RemotePoolServicer(pb_grpc.RemotePoolServicer):
    """Converts each RPC to one PoolCore call; domain errors are mapped to status codes by pool.errors.StatusInterceptor."""

    def __init__(self, core: PoolCore, lifecycle: Lifecycle | None = None, lifecycle_config: LifecycleConfig | None = None) -> None:
        self.core = core
        # lifecycle RPCs share the core's cache; a compaction makes the core forget the replaced manifest
        self.lifecycle = lifecycle or Lifecycle(core.store, lifecycle_config, cache=core.cache, on_manifest_replaced=core.forget_manifest)

    def AcquireWriter(self, request: pb.AcquireWriterRequest, context: grpc.ServicerContext) -> pb.AcquireWriterResponse:
        restore_from = request.restore_from if request.HasField("restore_from") else None
        epoch, latest = self.core.acquire_writer(request.job, _required_range(request, "AcquireWriter"), restore_from)
        return pb.AcquireWriterResponse(epoch=epoch, latest_checkpoint_id=latest)

    def CommitCheckpoint(self, request_iterator: Iterator[pb.CommitChunk], context: grpc.ServicerContext) -> pb.CommitCheckpointResponse:
        first = next(request_iterator, None)
        if first is None or first.WhichOneof("part") != "header":
            got = "an empty stream" if first is None else f"a {first.WhichOneof('part') or 'empty'} chunk"
            raise InvalidArgumentError(f"CommitCheckpoint: the first message must be the header, got {got}")
        result = self.core.commit_checkpoint(_commit_request(first.header), _delta_chunks(request_iterator), holder=_holder())
        return pb.CommitCheckpointResponse(
            checkpoint=_info(result.checkpoint), bytes_written=result.bytes_written, repeated=result.repeated
        )

    def Get(self, request: pb.GetRequest, context: grpc.ServicerContext) -> pb.GetResponse:
        manifest, etag = self.core.resolve(request.job, request.checkpoint_id, request.manifest_etag or None)
        found, value, checkpoint_id = self.core.get(request.job, manifest.checkpoint_id, request.op_id, request.key_bytes, etag)
        return pb.GetResponse(found=found, value=value, checkpoint_id=checkpoint_id, manifest_etag=etag)

    def MultiGet(self, request: pb.MultiGetRequest, context: grpc.ServicerContext) -> bytes:
        self.core.check_multi_get_size(len(request.keys), None)  # before a Python object is made per key
        keys = list(request.keys)
        op_ids = np.array(request.op_ids, dtype=np.uint64)  # one C-level conversion, no Python int per key
        if len(op_ids) == 1 and len(keys) > 1:
            op_ids = np.full(len(keys), op_ids[0], dtype=np.uint64)  # the proto allows one op_id shared by every key
        manifest, etag = self.core.resolve(request.job, request.checkpoint_id, request.manifest_etag or None)
        found, values, checkpoint_id = self.core.multi_get_arrays(request.job, manifest.checkpoint_id, op_ids, keys, etag)
        # encoded from the arrays in bulk (see encode_multi_get_response): no Python bytes object per value
        return encode_multi_get_response(found, values, checkpoint_id, etag)

    def ScanCheckpoint(self, request: pb.ScanCheckpointRequest, context: grpc.ServicerContext) -> Iterator[bytes]:
        key_groups = _range(request.key_groups) if request.HasField("key_groups") else None
        # each chunk already encoded as a ScanChunk message: upb would otherwise copy every MiB twice (see add_to_server)
        chunks = self.core.scan(
            request.job,
            request.checkpoint_id,
            key_groups,
            list(request.op_ids),
            request.delta or None,
            frame=length_delimited_field_1,
            manifest_etag=request.manifest_etag or None,
            holder=_holder(),
        )
        yield from chunks

    def ListJobs(self, request: pb.ListJobsRequest, context: grpc.ServicerContext) -> pb.ListJobsResponse:
        return pb.ListJobsResponse(jobs=self.core.list_jobs())

    def ListCheckpoints(self, request: pb.ListCheckpointsRequest, context: grpc.ServicerContext) -> pb.ListCheckpointsResponse:
        infos = self.core.list_checkpoints(request.job, include_incomplete=request.include_incomplete)
        return pb.ListCheckpointsResponse(checkpoints=[_info(i) for i in infos])

    def DescribeCheckpoint(self, request: pb.DescribeCheckpointRequest, context: grpc.ServicerContext) -> pb.DescribeCheckpointResponse:
        info, manifest_json = self.core.describe_checkpoint(request.job, request.checkpoint_id)
        return pb.DescribeCheckpointResponse(checkpoint=_info(info), manifest_json=manifest_json)

    def DeleteCheckpoint(self, request: pb.DeleteCheckpointRequest, context: grpc.ServicerContext) -> pb.DeleteCheckpointResponse:
        self.core.delete_checkpoint(request.job, request.checkpoint_id)
        return pb.DeleteCheckpointResponse()

    def Savepoint(self, request: pb.SavepointRequest, context: grpc.ServicerContext) -> pb.SavepointResponse:
        # under the job's own prefix: a job's token cannot create, squat or probe the names of another job's savepoints
        info = self.lifecycle.savepoint(request.job, request.checkpoint_id, request.name, under_job=True)
        # relative to the pool's store: the store's URI (bucket, prefix) is the operator's, not the caller's
        return pb.SavepointResponse(
            name=info.name,
            checkpoint_id=info.checkpoint_id,
            files=info.files,
            bytes=info.bytes,
            rows=info.rows,
            location=savepoint_prefix(info.name),
        )

    def PinCheckpoint(self, request: pb.PinCheckpointRequest, context: grpc.ServicerContext) -> pb.PinCheckpointResponse:
        grant = caller()  # a pin belongs to the token that made it
        checkpoint_id, expires = self.lifecycle.pin(
            request.job, request.checkpoint_id, request.holder, request.ttl_seconds, owner=grant.identity if grant else None
        )
        return pb.PinCheckpointResponse(checkpoint_id=checkpoint_id, expires_at_ms=expires)

    def UnpinCheckpoint(self, request: pb.UnpinCheckpointRequest, context: grpc.ServicerContext) -> pb.UnpinCheckpointResponse:
        grant = caller()  # another token's pin needs write access to go
        self.lifecycle.unpin(
            request.job,
            request.checkpoint_id,
            request.holder,
            owner=grant.identity if grant else None,
            may_unpin_others=grant is None or WRITE in grant.access,
        )
        return pb.UnpinCheckpointResponse()

    def CompactCheckpoint(self, request: pb.CompactCheckpointRequest, context: grpc.ServicerContext) -> pb.CompactCheckpointResponse:
        res = self.lifecycle.compact(request.job, request.checkpoint_id, request.force)
        return pb.CompactCheckpointResponse(
            checkpoint_id=res.checkpoint_id,
            folded=[pb.KeyGroupRange(lo=lo, hi=hi) for lo, hi, _ in res.folded],
            files_written=res.files_written,
            bytes_written=res.bytes_written,
        )

    def CollectGarbage(self, request: pb.CollectGarbageRequest, context: grpc.ServicerContext) -> pb.CollectGarbageResponse:
        if not request.job:
            raise InvalidArgumentError("CollectGarbage: job is required (a store-wide GC runs with `clink-pool gc`)")
        res = self.lifecycle.gc(request.job, request.dry_run)
        return pb.CollectGarbageResponse(
            deleted=res.deleted,
            deleted_bytes=res.deleted_bytes,
            listed_objects=res.listed_objects,
            referenced=res.referenced,
            too_young=res.too_young,
        )


def _encoded(message: bytes) -> bytes:
    return message


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_VALUES_TAG = 0x12  # field 2 (values), wire type 2 (length-delimited)
_MAX_RUNS = 16  # runs of equal value width encoded one 2-D block each; more go through one Arrow join


def encode_multi_get_response(found: np.ndarray, values: pa.Array, checkpoint_id: int, manifest_etag: str = "") -> bytes:
    """The wire bytes of MultiGetResponse(found, values, checkpoint_id, manifest_etag), built with numpy from the arrays.

    Byte for byte what protobuf writes (fields in number order, found packed), without a bytes object per value.
    """
    n = len(values)
    if len(found) != n:
        raise ValueError(f"{len(found)} found flags for {n} values")
    head = [b"\x0a" + _varint(n) + np.asarray(found, dtype=bool).astype(np.uint8).tobytes()] if n else []
    tail = b"\x18" + _varint(checkpoint_id) if checkpoint_id else b""
    if manifest_etag:
        etag = manifest_etag.encode()
        tail += b"\x22" + _varint(len(etag)) + etag  # field 4, length-delimited
    if not n:
        return b"".join(head) + tail
    offsets = np.frombuffer(values.buffers()[1], dtype=np.int32, count=n + 1, offset=values.offset * 4)
    raw = values.buffers()[2]
    data = np.frombuffer(raw, dtype=np.uint8)[offsets[0] : offsets[-1]] if raw is not None and raw.size else np.zeros(0, dtype=np.uint8)
    lens = np.diff(offsets)
    cuts = np.flatnonzero(lens[1:] != lens[:-1]) + 1
    if cuts.size <= _MAX_RUNS:  # a few runs of equal width (e.g. fixed-size values and some misses): strided 2-D copies
        pieces = head[:]
        bounds = [0, *cuts.tolist(), n]
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            width = int(lens[a])
            prefix = np.frombuffer(bytes([_VALUES_TAG]) + _varint(width), dtype=np.uint8)
            block = np.empty((b - a, prefix.size + width), dtype=np.uint8)
            block[:, : prefix.size] = prefix
            base = int(offsets[a] - offsets[0])
            block[:, prefix.size :] = data[base : base + (b - a) * width].reshape(b - a, width)
            pieces.append(block.tobytes())
        pieces.append(tail)
        return b"".join(pieces)
    # mixed widths: one (tag, length varint) header per value, joined to the values by Arrow's element-wise concatenation
    lens = lens.astype(np.int64)
    varint_bytes = 1 + (lens >= 1 << 7).astype(np.int64) + (lens >= 1 << 14) + (lens >= 1 << 21) + (lens >= 1 << 28)
    header_offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(1 + varint_bytes, out=header_offsets[1:])
    starts = header_offsets[:-1]
    headers = np.empty(int(header_offsets[-1]), dtype=np.uint8)
    headers[starts] = _VALUES_TAG
    for k in range(5):  # the k-th byte of every length's varint
        sel = np.flatnonzero(varint_bytes > k)
        if not sel.size:
            break
        more = np.where(varint_bytes[sel] > k + 1, 0x80, 0)
        headers[starts[sel] + 1 + k] = ((lens[sel] >> (7 * k)) & 0x7F) | more
    header_array = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(header_offsets), pa.py_buffer(headers)])
    joined = pc.binary_join_element_wise(header_array, values, b"")
    joined_offsets = np.frombuffer(joined.buffers()[1], dtype=np.int32, count=n + 1, offset=joined.offset * 4)
    out = np.frombuffer(joined.buffers()[2], dtype=np.uint8)[joined_offsets[0] : joined_offsets[-1]]
    return b"".join([*head, out.tobytes(), tail])


def _bounded(deserialize, core: PoolCore):
    """MultiGet's deserializer, refusing a request larger than its key limits allow before parsing it (parsing costs per key)."""
    config = core.config
    limit = config.max_multiget_key_bytes + 16 * config.max_multiget_keys + (64 << 10)  # keys, their framing and op_ids, the rest

    def decode(raw: bytes) -> pb.MultiGetRequest:
        if len(raw) > limit:
            raise LimitExceededError(
                f"a MultiGet request of {len(raw)} bytes; with --max-multiget-keys {config.max_multiget_keys} and "
                f"--max-multiget-key-mb {config.max_multiget_key_bytes >> 20} the pool takes at most {limit}: split it"
            )
        return deserialize(raw)

    return decode


class _HandlerCapture:
    """Stands in for a grpc.Server while the generated code registers its handlers, so they can be adjusted first."""

    def __init__(self) -> None:
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, _handlers: object) -> None:
        pass

    def add_registered_method_handlers(self, _service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self.handlers.update(handlers)


def add_to_server(servicer: RemotePoolServicer, server: grpc.Server) -> None:
    """Register the servicer like the generated add_RemotePoolServicer_to_server, except that ScanCheckpoint
    and MultiGet hand over messages already encoded (clients still see plain ScanChunk and MultiGetResponse messages on the wire).
    """
    capture = _HandlerCapture()
    pb_grpc.add_RemotePoolServicer_to_server(servicer, capture)
    handlers = dict(capture.handlers)
    handlers["ScanCheckpoint"] = handlers["ScanCheckpoint"]._replace(response_serializer=_encoded)
    handlers["MultiGet"] = handlers["MultiGet"]._replace(
        response_serializer=_encoded, request_deserializer=_bounded(handlers["MultiGet"].request_deserializer, servicer.core)
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)
