"""The one table from domain errors to gRPC status codes (applied by pool/interceptor.py)."""

from __future__ import annotations

import grpc

from snapshot.errors import (
    ChecksumMismatchError,
    ConflictError,
    CorruptDataError,
    CorruptSnapshotError,
    FencedError,
    InvalidArgumentError,
    LimitExceededError,
    NotFoundError,
    OverloadedError,
    PermissionDeniedError,
    ResourceExhaustedError,
    UnauthenticatedError,
    UnavailableError,
    UnsupportedFormatVersionError,
    lookup_by_class,
)

# Looked up along the exception's MRO, so the most specific class wins (CorruptSnapshotError before CorruptDataError).
# ConflictError maps to ABORTED, not ALREADY_EXISTS: it covers a lost commit race *and* a lost compare-and-swap on the
# writers file; both mean "a concurrent writer won; re-read and decide", which is what ABORTED says.
STATUS_BY_ERROR: dict[type[BaseException], grpc.StatusCode] = {
    InvalidArgumentError: grpc.StatusCode.INVALID_ARGUMENT,
    CorruptSnapshotError: grpc.StatusCode.INVALID_ARGUMENT,
    UnsupportedFormatVersionError: grpc.StatusCode.INVALID_ARGUMENT,
    NotFoundError: grpc.StatusCode.NOT_FOUND,
    ChecksumMismatchError: grpc.StatusCode.DATA_LOSS,
    CorruptDataError: grpc.StatusCode.DATA_LOSS,
    ConflictError: grpc.StatusCode.ABORTED,
    FencedError: grpc.StatusCode.FAILED_PRECONDITION,
    UnavailableError: grpc.StatusCode.UNAVAILABLE,
    PermissionDeniedError: grpc.StatusCode.PERMISSION_DENIED,
    UnauthenticatedError: grpc.StatusCode.UNAUTHENTICATED,
    OverloadedError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    LimitExceededError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ResourceExhaustedError: grpc.StatusCode.RESOURCE_EXHAUSTED,
}

# Trailing-metadata key carrying the domain error's class name, so a client can re-raise the exact subclass.
ERROR_CLASS_METADATA_KEY = "clink-error-class"


# Trailing-metadata key carrying the error's public attributes as JSON (a ChecksumMismatchError's path), when it has any.
ERROR_ATTRIBUTES_METADATA_KEY = "clink-error-attributes"


def status_for(exc: BaseException) -> grpc.StatusCode:
    """The status code for an exception: the table entry of its most specific class, INTERNAL when none matches."""
    return lookup_by_class(STATUS_BY_ERROR, exc, grpc.StatusCode.INTERNAL)


def describe(exc: BaseException) -> str:
    """The status details for an exception: its message, or its class name when it has none."""
    text = str(exc)
    return text if text else type(exc).__name__


STORE_PLACEHOLDER = "the pool's store"


def store_redactor(store_uri: str):
    """A function taking the store's URI (and a file store's root path) out of a message sent to a client.

    The store's location (bucket, prefix, a server's directories) is the operator's: a key under it is named relative
    to it ("jobs/orders/chk-3/_metadata"), the store itself as "the pool's store"; the server logs the full message.
    """
    needles = [store_uri.rstrip("/")]
    if store_uri.startswith("file://"):
        needles.append(store_uri[len("file://") :].rstrip("/"))
    needles = sorted({n for n in needles if len(n) > 1}, key=len, reverse=True)

    def redact(message: str) -> str:
        for needle in needles:
            message = message.replace(needle + "/", "").replace(needle, STORE_PLACEHOLDER)
        return message

    return redact
