"""The one table from domain errors to gRPC status codes, applied by one server interceptor."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import grpc

from snapshot.errors import (
    ChecksumMismatchError,
    ConflictError,
    CorruptDataError,
    CorruptSnapshotError,
    FencedError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    UnauthenticatedError,
    UnavailableError,
    UnsupportedFormatVersionError,
)

log = logging.getLogger("clink.pool")

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
}

# Trailing-metadata key carrying the domain error's class name, so a client can re-raise the exact subclass.
ERROR_CLASS_METADATA_KEY = "clink-error-class"


def status_for(exc: BaseException) -> grpc.StatusCode:
    """The status code for an exception: the table entry of its most specific class, INTERNAL when none matches."""
    for cls in type(exc).__mro__:
        code = STATUS_BY_ERROR.get(cls)
        if code is not None:
            return code
    return grpc.StatusCode.INTERNAL


def describe(exc: BaseException) -> str:
    """The status details for an exception: its message, or its class name when it has none."""
    text = str(exc)
    return text if text else type(exc).__name__


class RpcObserver(Protocol):
    """Receives one call per finished RPC and one per message on the wire (metrics implement this)."""

    def observe(self, method: str, code: grpc.StatusCode, seconds: float) -> None:
        """Record one finished RPC."""

    def received(self, method: str, nbytes: int) -> None:
        """Record one request message of ``nbytes`` serialized bytes."""

    def sent(self, method: str, nbytes: int) -> None:
        """Record one response message of ``nbytes`` serialized bytes."""


class _Call:
    """Book-keeping of one RPC: its outcome, decided once."""

    __slots__ = ("method", "observer", "started", "done")

    def __init__(self, method: str, observer: RpcObserver | None) -> None:
        self.method = method
        self.observer = observer
        self.started = time.perf_counter()
        self.done = False

    def finish(self, code: grpc.StatusCode) -> None:
        if self.done:
            return
        self.done = True
        if self.observer is not None:
            self.observer.observe(self.method, code, time.perf_counter() - self.started)

    def fail(self, exc: BaseException, context: grpc.ServicerContext) -> None:
        """Map ``exc`` to a status and abort the RPC with it (always raises)."""
        if not context.is_active():
            # the client went away (cancelled, deadline): nothing to tell it, nothing to log as a server fault
            self.finish(grpc.StatusCode.CANCELLED)
            raise exc
        current = _current_code(context)
        if current is not None and current is not grpc.StatusCode.OK:
            # the handler already aborted with its own status (e.g. the health service)
            self.finish(current)
            raise exc
        code = status_for(exc)
        details = describe(exc)
        if code is grpc.StatusCode.INTERNAL:
            log.error("%s failed with an unexpected error; the server stays up", self.method, exc_info=exc)
            details = f"internal error in {self.method}: {type(exc).__name__}: {details}"
        else:
            log.info("%s -> %s: %s", self.method, code.name, details)
            context.set_trailing_metadata(((ERROR_CLASS_METADATA_KEY, type(exc).__name__),))
        self.finish(code)
        context.abort(code, details)


def _current_code(context: grpc.ServicerContext) -> grpc.StatusCode | None:
    try:
        return context.code()
    except (AttributeError, NotImplementedError):
        return None


class StatusInterceptor(grpc.ServerInterceptor):
    """Wraps every handler: domain errors become status codes via STATUS_BY_ERROR, and each RPC is reported to an observer.

    ``admit`` (e.g. pool.auth.AuthInterceptor.authenticate) runs first on every call, before the request is decoded,
    so a caller it refuses learns nothing about its request; its errors go through the same table.
    """

    def __init__(self, observer: RpcObserver | None = None, admit: Callable[[grpc.HandlerCallDetails], Any] | None = None) -> None:
        self.observer = observer
        self.admit = admit

    def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Any], handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method.rsplit("/", 1)[-1]
        if handler.request_deserializer is not None:
            handler = handler._replace(request_deserializer=_tolerant(handler.request_deserializer))
        if self.observer is not None:
            # bytes are counted where grpc hands them over (free), not with ByteSize() walking every message again
            handler = handler._replace(
                request_deserializer=_counting_deserializer(handler.request_deserializer, method, self.observer),
                response_serializer=_counting_serializer(handler.response_serializer, method, self.observer),
            )
        admit = self.admit
        if admit is None:
            decode_one, decode_stream = _decoded_one, _decoded_stream
        else:
            def decode_one(message: Any, call: _Call) -> Any:
                admit(handler_call_details)
                return _decoded_one(message, call)

            def decode_stream(request_iterator: Iterator[Any], call: _Call) -> Iterator[Any]:
                admit(handler_call_details)
                return _decoded_stream(request_iterator, call)
        if handler.unary_unary is not None:
            return handler._replace(unary_unary=self._one_response(method, handler.unary_unary, decode_one))
        if handler.stream_unary is not None:
            return handler._replace(stream_unary=self._one_response(method, handler.stream_unary, decode_stream))
        if handler.unary_stream is not None:
            return handler._replace(unary_stream=self._streamed_response(method, handler.unary_stream, decode_one))
        if handler.stream_stream is not None:
            return handler._replace(stream_stream=self._streamed_response(method, handler.stream_stream, decode_stream))
        return handler

    def _one_response(self, method: str, behavior: Callable, decode: Callable[[Any, _Call], Any]) -> Callable:
        """A handler answering one message: ``decode`` admits the caller and checks the request before ``behavior`` sees it."""

        def wrapped(request: Any, context: grpc.ServicerContext) -> Any:
            call = _Call(method, self.observer)
            try:
                response = behavior(decode(request, call), context)
            except Exception as exc:
                call.fail(exc, context)
                raise
            call.finish(_current_code(context) or grpc.StatusCode.OK)
            return response

        return wrapped

    def _streamed_response(self, method: str, behavior: Callable, decode: Callable[[Any, _Call], Any]) -> Callable:
        """A handler answering with a stream: ``decode`` admits the caller and checks the request before ``behavior`` sees it."""

        def wrapped(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            call = _Call(method, self.observer)
            yield from _guarded_stream(lambda: behavior(decode(request, call), context), call, context)

        return wrapped


class _Undecodable:
    """Stands in for a request message that did not parse, so the handler can answer INVALID_ARGUMENT instead of INTERNAL."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _tolerant(deserializer: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def decode(raw: bytes) -> Any:
        try:
            return deserializer(raw)
        except Exception as exc:  # noqa: BLE001 - any parse failure (truncated fields, bad UTF-8 in strings) is the caller's
            return _Undecodable(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)

    return decode


def _decoded(message: Any, method: str) -> Any:
    if isinstance(message, _Undecodable):
        raise InvalidArgumentError(f"{method}: the request is not a valid protobuf message ({message.reason})")
    return message


def _counting_deserializer(deserialize: Callable[[bytes], Any] | None, method: str, observer: RpcObserver) -> Callable[[bytes], Any]:
    def deserialize_counted(raw: bytes) -> Any:
        observer.received(method, len(raw))
        return deserialize(raw) if deserialize is not None else raw

    return deserialize_counted


def _counting_serializer(serialize: Callable[[Any], bytes] | None, method: str, observer: RpcObserver) -> Callable[[Any], bytes]:
    def serialize_counted(message: Any) -> bytes:
        raw = serialize(message) if serialize is not None else message
        observer.sent(method, len(raw))
        return raw

    return serialize_counted


def _decoded_one(message: Any, call: _Call) -> Any:
    """The single request message, checked to have parsed."""
    return _decoded(message, call.method)


def _decoded_stream(request_iterator: Iterator[Any], call: _Call) -> Iterator[Any]:
    """The stream's messages, each checked to have parsed."""
    for message in request_iterator:
        yield _decoded(message, call.method)


def _guarded_stream(start: Callable[[], Iterator[Any]], call: _Call, context: grpc.ServicerContext) -> Iterator[Any]:
    try:
        yield from start()
    except GeneratorExit:
        # the server closed the stream early (client cancelled)
        call.finish(grpc.StatusCode.CANCELLED)
        raise
    except Exception as exc:
        call.fail(exc, context)
        raise
    call.finish(_current_code(context) or grpc.StatusCode.OK)
