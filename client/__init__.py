"""The worker side of the remote-state tier: RemoteReadBackend, its pool client and typed state views."""

from client.backend import BackendConfig, RemoteReadBackend, changelog_table, ttl_expired_mask
from client.errors import (
    ClinkError,
    ConflictError,
    CorruptDataError,
    FencedError,
    InvalidArgumentError,
    MissingOperatorsError,
    NotFoundError,
    PermissionDeniedError,
    UnauthenticatedError,
    UnavailableError,
)
from client.pool_client import CheckpointInfo, CommitResult, PoolClient, PoolClientConfig, RetryPolicy, WriterLease
from client.typed import KeyedInt64State, KeyedState, OperatorInt64State, OperatorState, TtlState, decode_int64, encode_int64

__all__ = [
    "BackendConfig",
    "CheckpointInfo",
    "ClinkError",
    "CommitResult",
    "ConflictError",
    "CorruptDataError",
    "FencedError",
    "InvalidArgumentError",
    "KeyedInt64State",
    "KeyedState",
    "MissingOperatorsError",
    "NotFoundError",
    "OperatorInt64State",
    "OperatorState",
    "PermissionDeniedError",
    "PoolClient",
    "PoolClientConfig",
    "RemoteReadBackend",
    "RetryPolicy",
    "TtlState",
    "UnauthenticatedError",
    "UnavailableError",
    "WriterLease",
    "changelog_table",
    "decode_int64",
    "encode_int64",
    "ttl_expired_mask",
]
