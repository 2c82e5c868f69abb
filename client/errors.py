"""The one table mapping pool gRPC status codes back to the domain errors of snapshot/errors.py."""

from __future__ import annotations

import json
from collections.abc import Mapping

import grpc

from snapshot.errors import (
    ClinkError,
    ConflictError,
    CorruptDataError,
    FencedError,
    InvalidArgumentError,
    LimitExceededError,
    NotFoundError,
    OverloadedError,
    PermissionDeniedError,
    UnauthenticatedError,
    UnavailableError,
    error_class_named,
    rebuilt,
)
from snapshot.errors import NonRestoredStateError as SharedNonRestoredStateError

__all__ = [
    "ClinkError",
    "ConflictError",
    "CorruptDataError",
    "FencedError",
    "InvalidArgumentError",
    "LimitExceededError",
    "OverloadedError",
    "MissingOperatorsError",
    "NonRestoredStateError",
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


def _operator_name(op_id: int, uid: str | None) -> str:
    """An operator as restore errors name it: its uid when known, and its op_id (decimal and hex)."""
    name = repr(uid) if uid else "unnamed operator"
    return f"{name} (op_id {op_id}, 0x{op_id:016x})"


class NonRestoredStateError(SharedNonRestoredStateError):
    """A restore found state for operators the job does not declare (Flink's non-restored state); nothing was changed.

    ``operators``: op_id -> uid (None when the checkpoint did not name it) of every such operator.
    """

    def __init__(self, checkpoint_id: int, operators: Mapping[int, str | None]) -> None:
        ordered = sorted(operators.items(), key=lambda item: (item[1] is None, item[1] or "", item[0]))
        names = ", ".join(_operator_name(op_id, uid) for op_id, uid in ordered)
        super().__init__(
            f"checkpoint {checkpoint_id} holds state for operator(s) this job does not declare: {names}; refusing to restore, "
            "nothing was changed. If an operator was renamed, register it under its old uid (register_operator); to restore "
            "without that state, pass allow_non_restored_state=True",
            dict(operators),
        )
        self.checkpoint_id = checkpoint_id
        self.operators = {op_id: uid or None for op_id, uid in operators.items()}


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
    grpc.StatusCode.RESOURCE_EXHAUSTED: OverloadedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
}

# The trailers the pool sends (pool.errors): the error's class, more precise than the code, and its attributes as JSON.
ERROR_CLASS_METADATA_KEY = "clink-error-class"
ERROR_ATTRIBUTES_METADATA_KEY = "clink-error-attributes"

# Codes whose request certainly did nothing durable, or is idempotent to repeat: retried with backoff.
RETRYABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED})


def _trailer(exc: grpc.RpcError, key: str) -> str | None:
    try:
        trailers = exc.trailing_metadata() or ()
    except Exception:  # noqa: BLE001 - an RpcError without trailers (e.g. raised by the channel itself)
        return None
    return next((v for k, v in trailers if k == key), None)


def error_class_of(exc: grpc.RpcError) -> str | None:
    """The domain error class the pool named in the call's trailing metadata, if any."""
    return _trailer(exc, ERROR_CLASS_METADATA_KEY)


def error_attributes_of(exc: grpc.RpcError) -> dict[str, object]:
    """The error's attributes the pool sent (a ChecksumMismatchError's path), empty when none or unreadable."""
    text = _trailer(exc, ERROR_ATTRIBUTES_METADATA_KEY)
    try:
        attributes = json.loads(text) if text else {}
    except ValueError:
        return {}
    return attributes if isinstance(attributes, dict) else {}


def retryable(code: grpc.StatusCode, error_class: str | None = None) -> bool:
    """Whether a failed call may be retried: a retryable code, unless the pool said the request itself exceeds a limit."""
    return code in RETRYABLE_CODES and error_class != LimitExceededError.__name__


def error_from_status(
    code: grpc.StatusCode,
    details: str | None,
    what: str,
    error_class: str | None = None,
    attributes: dict[str, object] | None = None,
) -> ClinkError:
    """A domain error for a gRPC status: the class the pool named (with its attributes) when known here, else the code's.

    The pool's message (which names the file on DATA_LOSS) is kept.
    """
    cls = error_class_named(error_class or "") or STATUS_TO_ERROR.get(code, ClinkError)
    message = details or code.name.lower()
    if cls is ClinkError:
        message = f"{code.name}: {message}"
    err = rebuilt(cls, f"{what}: {message}", attributes)
    err.grpc_code_name = code.name  # for logs and the CLI's exit codes, no grpc type
    return err
