"""The one table mapping pool gRPC status codes back to the domain errors of snapshot/errors.py."""

from __future__ import annotations

import grpc

from snapshot.errors import (
    ClinkError,
    ConflictError,
    CorruptDataError,
    FencedError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    UnauthenticatedError,
    UnavailableError,
)

__all__ = [
    "ClinkError",
    "ConflictError",
    "CorruptDataError",
    "FencedError",
    "InvalidArgumentError",
    "MissingOperatorsError",
    "NotFoundError",
    "PermissionDeniedError",
    "RETRYABLE_CODES",
    "STATUS_TO_ERROR",
    "UnauthenticatedError",
    "UnavailableError",
    "error_from_status",
]


class MissingOperatorsError(InvalidArgumentError):
    """A restore was asked for operators the checkpoint does not hold (or holds under another uid)."""

    def __init__(self, checkpoint_id: int, missing: dict[str, int]) -> None:
        names = ", ".join(f"{uid!r} (op_id {op_id})" for uid, op_id in sorted(missing.items()))
        super().__init__(f"checkpoint {checkpoint_id} has no state for operator(s) {names}; refusing to restore")
        self.checkpoint_id = checkpoint_id
        self.missing = dict(missing)


STATUS_TO_ERROR: dict[grpc.StatusCode, type[ClinkError]] = {
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgumentError,
    grpc.StatusCode.DATA_LOSS: CorruptDataError,
    grpc.StatusCode.ABORTED: ConflictError,
    grpc.StatusCode.ALREADY_EXISTS: ConflictError,
    grpc.StatusCode.FAILED_PRECONDITION: FencedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: UnavailableError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: UnavailableError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
}

# Codes whose request certainly did nothing durable, or is idempotent to repeat: retried with backoff.
RETRYABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED})


def error_from_status(code: grpc.StatusCode, details: str | None, what: str) -> ClinkError:
    """A domain error for a gRPC status; the pool's message (which names the file on DATA_LOSS) is kept."""
    cls = STATUS_TO_ERROR.get(code, ClinkError)
    message = details or code.name.lower()
    if cls is ClinkError:
        message = f"{code.name}: {message}"
    err = cls(f"{what}: {message}")
    err.grpc_code_name = code.name  # type: ignore[attr-defined]  # for logs and the CLI's exit codes, no grpc type
    return err
