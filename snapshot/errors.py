"""Domain errors shared by every part of the tier: one root, one subclass per meaning."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

T = TypeVar("T")


class ClinkError(Exception):
    """Root of every error the tier raises on purpose."""

    grpc_code_name: str  # declared only: set on an error rebuilt from a gRPC status (client.errors), for logs and exit codes


class InvalidArgumentError(ClinkError, ValueError):
    """The caller passed something malformed; nothing was changed."""


class NotFoundError(ClinkError, LookupError):
    """A job, checkpoint, savepoint or object does not exist."""


class CorruptDataError(ClinkError):
    """Stored or received bytes are not what they claim to be."""


class CorruptSnapshotError(CorruptDataError):
    """A snapshot stream violates the format contract."""


class ChecksumMismatchError(CorruptDataError):
    """A stored file's bytes do not match the checksum in its manifest."""

    def __init__(self, path: str, expected: str, actual: str) -> None:
        super().__init__(f"checksum mismatch in {path}: manifest says {expected}, file has {actual}")
        self.path = path
        self.expected = expected
        self.actual = actual


class UnsupportedFormatVersionError(ClinkError):
    """A snapshot declares a format version newer than this reader knows."""


class ConflictError(ClinkError):
    """A concurrent writer won a race (same checkpoint committed twice, CAS lost)."""


class FencedError(ClinkError):
    """A newer writer took over an overlapping key-group range; this writer must stop."""


class UnavailableError(ClinkError):
    """A dependency (object store, pool) is unreachable or throttling; safe to retry."""


class PermissionDeniedError(ClinkError):
    """The caller is authenticated but not allowed to touch this job."""


class UnauthenticatedError(ClinkError):
    """The caller presented no valid credentials."""


class ResourceExhaustedError(ClinkError):
    """A limit of the server or of a read was reached; the message names the limit and the flag that sets it."""


class OverloadedError(ResourceExhaustedError, UnavailableError):
    """Too many calls at once (in all, or of one token); nothing was done, so retrying later is safe."""


class LimitExceededError(ResourceExhaustedError):
    """The request itself is larger than a limit allows (keys, bytes, batches); the same request will fail again."""


def prefixed(exc: ClinkError, prefix: str) -> ClinkError:
    """The same error (same class, same attributes: a ChecksumMismatchError keeps its path) with ``prefix`` before its message."""
    if str(exc).startswith(prefix):
        return exc
    new = rebuilt(type(exc), f"{prefix}: {exc}")
    new.__dict__.update(exc.__dict__)
    return new


def lookup_by_class(table: Mapping[type, T], exc: BaseException, default: T) -> T:
    """The entry of the exception's most specific class in ``table`` (walking its MRO), ``default`` when none is listed.

    Every error boundary (gRPC status, HTTP status, exit code) is one such table, so a subclass is mapped by its own
    entry when it has one and by its nearest listed ancestor otherwise.
    """
    for cls in type(exc).__mro__:
        if cls in table:
            return table[cls]
    return default


def error_class_named(name: str) -> type[ClinkError] | None:
    """The ClinkError subclass called ``name``, for an error named across a boundary (gRPC trailer, HTTP header)."""
    pending: list[type[ClinkError]] = [ClinkError]
    while pending:
        cls = pending.pop()
        if cls.__name__ == name:
            return cls
        pending.extend(cls.__subclasses__())
    return None


def error_attributes(exc: BaseException) -> dict[str, object]:
    """The public attributes of an error that travel across a boundary: strings, numbers and flat dicts of them."""
    plain = (str, int, float, bool)
    out: dict[str, object] = {}
    for name, value in vars(exc).items():
        if name.startswith("_"):
            continue
        if isinstance(value, plain) or (isinstance(value, dict) and all(isinstance(v, plain) for v in value.values())):
            out[name] = value
    return out


def rebuilt(cls: type[ClinkError], message: str, attributes: Mapping[str, object] | None = None) -> ClinkError:
    """An error of ``cls`` carrying ``message`` and ``attributes``, made without its constructor (whose arguments differ by class)."""
    err = cls.__new__(cls)
    err.args = (message,)
    for name, value in (attributes or {}).items():
        if not name.startswith("_"):
            setattr(err, name, value)
    return err


class NonRestoredStateError(InvalidArgumentError):
    """A restore found state for operators the new job does not declare (Flink's non-restored state); nothing was changed."""

    def __init__(self, message: str, operators: dict[int, str | None] | None = None) -> None:
        super().__init__(message)
        self.operators = dict(operators or {})


class MaterialisationHandleError(CorruptSnapshotError):
    """A materialisation handle of a changelog snapshot could not be used; ``handle`` names it (job/checkpoint or path).

    A CorruptSnapshotError (so a CorruptDataError): a reader that cannot use a handle must refuse the stream, as any
    version-1 reader refuses row kind 3.
    """

    def __init__(self, message: str, handle: str = "") -> None:
        super().__init__(message)
        self.handle = handle


class HandleNeedsStoreError(MaterialisationHandleError):
    """A changelog snapshot holds materialisation handles and no store was supplied to resolve them."""


class HandleChecksumError(MaterialisationHandleError):
    """The state a materialisation handle names is not what the handle's checksum or row count says."""


class HandleNotFoundError(NotFoundError, MaterialisationHandleError):
    """The checkpoint or file a materialisation handle names is not in the store supplied."""

    def __init__(self, message: str, handle: str = "") -> None:
        MaterialisationHandleError.__init__(self, message, handle)
