"""The RemotePool gRPC servicer: protobuf in, domain calls, protobuf out; nothing else lives here."""

from __future__ import annotations

from collections.abc import Iterator

import grpc

from pool.auth import WRITE, caller
from pool.core import PoolCore
from pool.job_policy import JobPolicies, JobPolicy
from pool.lifecycle import Lifecycle, LifecycleConfig
from pool.wire import (
    checkpoint_info_to_pb,
    commit_header_from_pb,
    commit_request_from_pb,
    commit_result_to_pb,
    compaction_result_to_pb,
    delta_chunks_from_pb,
    encode_multi_get_response,
    gc_result_to_pb,
    job_policy_changes,
    job_policy_from_pb,
    job_policy_to_pb,
    length_delimited_field_1,
    multi_get_keys_from_pb,
    optional_key_group_range_from_pb,
    required_key_group_range_from_pb,
    retention_run_to_pb,
    savepoint_info_to_pb,
)
from protos import remote_pool_pb2 as pb
from protos import remote_pool_pb2_grpc as pb_grpc
from snapshot.errors import InvalidArgumentError, LimitExceededError

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["RemotePool"].full_name


def _holder() -> str | None:
    """Whom the call's work counts against (the token's identity; None when the pool runs without tokens)."""
    grant = caller()
    return grant.identity if grant is not None else None


class RemotePoolServicer(pb_grpc.RemotePoolServicer):
    """Converts each RPC to one PoolCore call; domain errors are mapped to status codes by pool.errors.StatusInterceptor."""

    def __init__(
        self,
        core: PoolCore,
        lifecycle: Lifecycle | None = None,
        lifecycle_config: LifecycleConfig | None = None,
        pool_policy: JobPolicy | None = None,
    ) -> None:
        self.core = core
        # lifecycle RPCs share the core's cache; a compaction makes the core forget the replaced manifest
        self.lifecycle = lifecycle or Lifecycle(core.store, lifecycle_config, cache=core.cache, on_manifest_replaced=core.forget_manifest)
        # pool_policy: the pool's maintenance settings, what a job's unset settings (and RetainCheckpoints' keep_last 0) fall back to
        self.policies = JobPolicies(self.lifecycle, pool_policy)

    def AcquireWriter(self, request: pb.AcquireWriterRequest, context: grpc.ServicerContext) -> pb.AcquireWriterResponse:
        restore_from = request.restore_from if request.HasField("restore_from") else None
        epoch, latest = self.core.acquire_writer(request.job, required_key_group_range_from_pb(request, "AcquireWriter"), restore_from)
        return pb.AcquireWriterResponse(epoch=epoch, latest_checkpoint_id=latest)

    def CommitCheckpoint(self, request_iterator: Iterator[pb.CommitChunk], context: grpc.ServicerContext) -> pb.CommitCheckpointResponse:
        header = commit_header_from_pb(next(request_iterator, None))
        result = self.core.commit_checkpoint(commit_request_from_pb(header), delta_chunks_from_pb(request_iterator), holder=_holder())
        return commit_result_to_pb(result)

    def Get(self, request: pb.GetRequest, context: grpc.ServicerContext) -> pb.GetResponse:
        found, value, checkpoint_id, etag = self.core.get_with_etag(
            request.job, request.checkpoint_id, request.op_id, request.key_bytes, request.manifest_etag or None
        )
        return pb.GetResponse(found=found, value=value, checkpoint_id=checkpoint_id, manifest_etag=etag)

    def MultiGet(self, request: pb.MultiGetRequest, context: grpc.ServicerContext) -> bytes:
        self.core.check_multi_get_size(len(request.keys), None)  # before a Python object is made per key
        op_ids, keys = multi_get_keys_from_pb(request)
        manifest, etag = self.core.resolve(request.job, request.checkpoint_id, request.manifest_etag or None)
        found, values, checkpoint_id = self.core.multi_get_arrays(request.job, manifest.checkpoint_id, op_ids, keys, etag)
        # encoded from the arrays in bulk (see encode_multi_get_response): no Python bytes object per value
        return encode_multi_get_response(found, values, checkpoint_id, etag)

    def ScanCheckpoint(self, request: pb.ScanCheckpointRequest, context: grpc.ServicerContext) -> Iterator[bytes]:
        key_groups = optional_key_group_range_from_pb(request)
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
        return pb.ListCheckpointsResponse(checkpoints=[checkpoint_info_to_pb(i) for i in infos])

    def DescribeCheckpoint(self, request: pb.DescribeCheckpointRequest, context: grpc.ServicerContext) -> pb.DescribeCheckpointResponse:
        info, manifest_json = self.core.describe_checkpoint(request.job, request.checkpoint_id)
        return pb.DescribeCheckpointResponse(checkpoint=checkpoint_info_to_pb(info), manifest_json=manifest_json)

    def DeleteCheckpoint(self, request: pb.DeleteCheckpointRequest, context: grpc.ServicerContext) -> pb.DeleteCheckpointResponse:
        self.core.delete_checkpoint(request.job, request.checkpoint_id)
        return pb.DeleteCheckpointResponse()

    def Savepoint(self, request: pb.SavepointRequest, context: grpc.ServicerContext) -> pb.SavepointResponse:
        # under the job's own prefix: a job's token cannot create, squat or probe the names of another job's savepoints
        return savepoint_info_to_pb(self.lifecycle.savepoint(request.job, request.checkpoint_id, request.name or None, under_job=True))

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
        return compaction_result_to_pb(self.lifecycle.compact(request.job, request.checkpoint_id, request.force))

    def CollectGarbage(self, request: pb.CollectGarbageRequest, context: grpc.ServicerContext) -> pb.CollectGarbageResponse:
        if not request.job:
            raise InvalidArgumentError("CollectGarbage: job is required (a store-wide GC runs with `clink-pool gc`)")
        return gc_result_to_pb(self.lifecycle.gc(request.job, request.dry_run))

    def SetJobPolicy(self, request: pb.SetJobPolicyRequest, context: grpc.ServicerContext) -> pb.SetJobPolicyResponse:
        if request.clear == request.HasField("policy"):
            raise InvalidArgumentError("SetJobPolicy: give exactly one of policy (to set it) and clear (to remove it)")
        if request.clear:
            cleared = self.policies.clear(request.job)
            return pb.SetJobPolicyResponse(cleared=cleared, effective=job_policy_to_pb(self.policies.effective(None)))
        if request.fields:
            policy = self.policies.update(request.job, job_policy_changes(request.policy, request.fields))
        else:
            policy = self.policies.set(request.job, job_policy_from_pb(request.policy))
        return pb.SetJobPolicyResponse(policy=job_policy_to_pb(policy), effective=job_policy_to_pb(self.policies.effective(policy)))

    def GetJobPolicy(self, request: pb.GetJobPolicyRequest, context: grpc.ServicerContext) -> pb.GetJobPolicyResponse:
        policy = self.policies.get(request.job)
        effective = job_policy_to_pb(self.policies.effective(policy))
        if policy is None:
            return pb.GetJobPolicyResponse(found=False, effective=effective)
        return pb.GetJobPolicyResponse(found=True, policy=job_policy_to_pb(policy), effective=effective)

    def RetainCheckpoints(self, request: pb.RetainCheckpointsRequest, context: grpc.ServicerContext) -> pb.RetainCheckpointsResponse:
        return retention_run_to_pb(self.policies.retain(request.job, request.keep_last, request.dry_run))

    def AnnounceLiveExport(self, request: pb.AnnounceLiveExportRequest, context: grpc.ServicerContext) -> pb.AnnounceLiveExportResponse:
        key_groups = required_key_group_range_from_pb(request, "AnnounceLiveExport")
        expires = self.core.announce_live_export(request.job, key_groups, request.epoch, request.url, request.token, request.ttl_seconds)
        return pb.AnnounceLiveExportResponse(expires_at_ms=expires)

    def WithdrawLiveExport(self, request: pb.WithdrawLiveExportRequest, context: grpc.ServicerContext) -> pb.WithdrawLiveExportResponse:
        self.core.withdraw_live_export(request.job, required_key_group_range_from_pb(request, "WithdrawLiveExport"), request.epoch)
        return pb.WithdrawLiveExportResponse()


def _encoded(message: bytes) -> bytes:
    return message


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
