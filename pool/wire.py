"""Protobuf messages to domain objects and back, for the servicer; MultiGet and ScanChunk bodies encoded by hand, in bulk."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pool.compaction import CompactionResult
from pool.domain import CheckpointInfo, CommitRequest, CommitResult, KeyGroupRange
from pool.gc import GcResult
from pool.job_policy import LIMIT_SETTINGS, POLICY_SETTINGS, JobPolicy, RetentionRun
from pool.savepoints import SavepointInfo
from protos import remote_pool_pb2 as pb
from snapshot.errors import InvalidArgumentError
from store.layout import savepoint_prefix


def key_group_range_from_pb(message: pb.KeyGroupRange) -> KeyGroupRange:
    """A key-group range from its message."""
    return KeyGroupRange(lo=message.lo, hi=message.hi)


class KeyGroupsHolder(Protocol):
    """A message with a key_groups field (AcquireWriterRequest, CommitHeader, ScanCheckpointRequest, ...)."""

    @property
    def key_groups(self) -> pb.KeyGroupRange: ...

    def HasField(self, field_name: str) -> bool: ...  # noqa: N802 - protobuf's name


def optional_key_group_range_from_pb(holder: KeyGroupsHolder) -> KeyGroupRange | None:
    """The key_groups field of a request, None when it is not set (every key group)."""
    return key_group_range_from_pb(holder.key_groups) if holder.HasField("key_groups") else None


def required_key_group_range_from_pb(holder: KeyGroupsHolder, what: str) -> KeyGroupRange:
    """The key_groups field of a request that must carry one; InvalidArgumentError naming ``what`` otherwise."""
    if not holder.HasField("key_groups"):
        raise InvalidArgumentError(f"{what}: key_groups is required (an inclusive range within 0..127)")
    return key_group_range_from_pb(holder.key_groups)


def checkpoint_info_to_pb(info: CheckpointInfo) -> pb.CheckpointInfo:
    """A checkpoint's description as its message."""
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
        operators=[
            pb.OperatorInfo(op_id=op_id, uid=uid or "", without_state=op_id in info.operators_without_state)
            for op_id, uid in info.operators
        ],
        state_versions=info.state_versions,
        manifest_etag=info.manifest_etag,
        abandoned=info.abandoned,
        key_group_bytes=info.key_group_bytes,
        operator_state_bytes=info.operator_state_bytes,
    )


def commit_request_from_pb(header: pb.CommitHeader) -> CommitRequest:
    """The commit a CommitCheckpoint header asks for."""
    return CommitRequest(
        job=header.job,
        checkpoint_id=header.checkpoint_id,
        parent_id=header.parent_id,
        key_groups=required_key_group_range_from_pb(header, "CommitCheckpoint header"),
        epoch=header.epoch,
        state_versions=header.state_versions,
        operators=tuple((op.op_id, op.uid) for op in header.operators),
        attempt=header.attempt,
    )


def commit_result_to_pb(result: CommitResult) -> pb.CommitCheckpointResponse:
    """A commit's outcome as its response."""
    return pb.CommitCheckpointResponse(
        checkpoint=checkpoint_info_to_pb(result.checkpoint), bytes_written=result.bytes_written, repeated=result.repeated
    )


def commit_header_from_pb(first: pb.CommitChunk | None) -> pb.CommitHeader:
    """The header a CommitCheckpoint stream must open with; InvalidArgumentError naming what came instead."""
    if first is None or first.WhichOneof("part") != "header":
        got = "an empty stream" if first is None else f"a {first.WhichOneof('part') or 'empty'} chunk"
        raise InvalidArgumentError(f"CommitCheckpoint: the first message must be the header, got {got}")
    return first.header


def delta_chunks_from_pb(chunks: Iterator[pb.CommitChunk]) -> Iterator[bytes]:
    """The delta bytes of the chunks after the header, handed on one by one (never gathered here)."""
    for chunk in chunks:
        part = chunk.WhichOneof("part")
        if part == "delta":
            if chunk.delta:
                yield chunk.delta
        elif part == "header":
            raise InvalidArgumentError("CommitCheckpoint: a second header arrived; only the first message may be the header")


def multi_get_keys_from_pb(request: pb.MultiGetRequest) -> tuple[np.ndarray, list[bytes]]:
    """(op_ids, keys) of a MultiGet, one op_id per key (the proto allows one op_id shared by every key)."""
    keys = list(request.keys)
    op_ids = np.array(request.op_ids, dtype=np.uint64)  # one C-level conversion, no Python int per key
    if len(op_ids) == 1 and len(keys) > 1:
        op_ids = np.full(len(keys), op_ids[0], dtype=np.uint64)
    return op_ids, keys


def savepoint_info_to_pb(info: SavepointInfo) -> pb.SavepointResponse:
    """A written savepoint as its response; its location relative to the pool's store (the store's URI is the operator's)."""
    return pb.SavepointResponse(
        name=info.name,
        checkpoint_id=info.checkpoint_id,
        files=info.files,
        bytes=info.bytes,
        rows=info.rows,
        location=savepoint_prefix(info.name),
    )


def compaction_result_to_pb(result: CompactionResult) -> pb.CompactCheckpointResponse:
    """What a compaction folded, as its response."""
    return pb.CompactCheckpointResponse(
        checkpoint_id=result.checkpoint_id,
        folded=[pb.KeyGroupRange(lo=lo, hi=hi) for lo, hi, _ in result.folded],
        files_written=result.files_written,
        bytes_written=result.bytes_written,
    )


def gc_result_to_pb(result: GcResult) -> pb.CollectGarbageResponse:
    """What a GC run found and did, as its response."""
    return pb.CollectGarbageResponse(
        deleted=result.deleted,
        deleted_bytes=result.deleted_bytes,
        listed_objects=result.listed_objects,
        referenced=result.referenced,
        too_young=result.too_young,
    )


def job_policy_to_pb(policy: JobPolicy) -> pb.JobPolicy:
    """A job's policy as its message (an unset field stays unset)."""
    message = pb.JobPolicy(maintenance_disabled=not policy.maintenance, updated_ms=policy.updated_ms)
    for name in LIMIT_SETTINGS:
        value = getattr(policy, name)
        if value is not None:
            setattr(message, name, value)
    return message


def job_policy_from_pb(message: pb.JobPolicy) -> JobPolicy:
    """A job's policy from its message, validated (InvalidArgumentError naming the field); updated_ms is the pool's to set."""

    def optional(name: str) -> int | None:
        return int(getattr(message, name)) if message.HasField(name) else None

    return JobPolicy(
        keep_last=optional("keep_last"),
        compact_max_layers=optional("compact_max_layers"),
        compact_max_delta_bytes=optional("compact_max_delta_bytes"),
        maintenance=not message.maintenance_disabled,
    ).validated()


def job_policy_changes(message: pb.JobPolicy, names: Iterable[str]) -> dict[str, Any]:
    """The settings a SetJobPolicy fields mask changes, each to the message's value (an unset limit: None, the pool's)."""
    changes: dict[str, Any] = {}
    for name in names:
        if name in changes:
            raise InvalidArgumentError(f"SetJobPolicy: field {name!r} given twice in fields")
        if name == "maintenance":
            changes[name] = not message.maintenance_disabled
        elif name in LIMIT_SETTINGS:
            changes[name] = int(getattr(message, name)) if message.HasField(name) else None
        else:
            raise InvalidArgumentError(f"SetJobPolicy: unknown field {name!r} in fields (known: {', '.join(POLICY_SETTINGS)})")
    return changes


def retention_run_to_pb(run: RetentionRun) -> pb.RetainCheckpointsResponse:
    """What a retention pass removed and kept, and the depth it applied, as its response."""
    result = run.result
    return pb.RetainCheckpointsResponse(
        deleted=result.deleted,
        kept=result.kept,
        pinned=result.pinned,
        keep_last=run.keep_last,
        keep_last_from=run.keep_last_from,
        dry_run=result.dry_run,
    )


def length_delimited_field_1(size: int) -> bytes:
    """Protobuf wire header of field 1 as bytes of ``size`` (tag 0x0A, then the varint length): a ScanChunk's data."""
    out = bytearray(b"\x0a")
    while True:
        low = size & 0x7F
        size >>= 7
        if size:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


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
