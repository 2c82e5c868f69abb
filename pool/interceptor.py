"""The one server interceptor: admits each call (token, limits, lane) before it is queued, maps domain errors through pool/errors.py."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import grpc

from pool.admission import OPEN_LANE, REFLECTION_LANE, WORK_LANE, Admission, Ticket, attach, tag
from pool.errors import ERROR_ATTRIBUTES_METADATA_KEY, ERROR_CLASS_METADATA_KEY, describe, status_for
from snapshot.errors import ClinkError, InvalidArgumentError, error_attributes

log = logging.getLogger("clink.pool")

REFLECTION_PREFIX = "/grpc.reflection."
HEALTH_PREFIX = "/grpc.health.v1.Health/"
HEALTH_WATCH = HEALTH_PREFIX + "Watch"


class RpcObserver(Protocol):
    """Receives one call per finished RPC and one per message on the wire (metrics implement this)."""

    def observe(self, method: str, code: grpc.StatusCode, seconds: float) -> None:
        """Record one finished RPC."""

    def received(self, method: str, nbytes: int) -> None:
        """Record one request message of ``nbytes`` serialized bytes."""

    def sent(self, method: str, nbytes: int) -> None:
        """Record one response message of ``nbytes`` serialized bytes."""


class _Call:
    """Book-keeping of one RPC: its outcome, decided once, and its admission ticket (which tracks waits on the client)."""

    __slots__ = ("method", "observer", "started", "done", "ticket", "redact")

    def __init__(self, method: str, observer: RpcObserver | None, ticket: Ticket | None, redact: Callable[[str], str] = str) -> None:
        self.redact = redact
        self.method = method
        self.observer = observer
        self.started = time.perf_counter()
        self.done = False
        self.ticket = ticket

    def waiting(self) -> None:
        if self.ticket is not None:
            self.ticket.waiting()

    def awaiting(self) -> None:
        if self.ticket is not None:
            self.ticket.awaiting()

    def working(self) -> None:
        if self.ticket is not None:
            self.ticket.working()

    def naming(self, exc: BaseException) -> tuple[tuple[str, str], ...]:
        """Trailers naming the domain error's class and attributes, so the client re-raises the same error."""
        attributes = _attributes_json(exc, self.redact)
        named = ((ERROR_CLASS_METADATA_KEY, type(exc).__name__),)
        return named + (((ERROR_ATTRIBUTES_METADATA_KEY, attributes),) if attributes else ())

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
            details = f"internal error in {self.method}: {type(exc).__name__}"
        else:
            log.info("%s -> %s: %s", self.method, code.name, details)
            context.set_trailing_metadata(self.naming(exc))
        self.finish(code)
        context.abort(code, self.redact(details))  # logged whole above; the client is not told where the store lives


def _attributes_json(exc: BaseException, redact: Callable[[str], str]) -> str | None:
    attributes = error_attributes(exc)
    if not attributes:
        return None
    text = redact(json.dumps(attributes, sort_keys=True, default=str))
    return text if len(text) <= 4096 else None  # trailers are small; the message still carries the same facts


def _current_code(context: grpc.ServicerContext) -> grpc.StatusCode | None:
    try:
        return context.code()
    except (AttributeError, NotImplementedError):
        return None


def _lane(method: str, open_methods: frozenset[str]) -> str:
    if method.startswith(HEALTH_PREFIX) or method in open_methods:
        return OPEN_LANE
    return REFLECTION_LANE if method.startswith(REFLECTION_PREFIX) else WORK_LANE


class StatusInterceptor(grpc.ServerInterceptor):
    """Wraps every handler: domain errors become status codes via STATUS_BY_ERROR, and each RPC is reported to an observer.

    It runs on grpc's serving thread, before a call is queued for a worker: ``admit`` (pool.auth.AuthInterceptor.authenticate)
    checks the token and ``admission`` the limits there, and a refused call is answered from the open lane without its
    request being read or decoded. Health checks (``open_methods``) keep grpc's non-blocking handlers and their own lane.
    """

    def __init__(
        self,
        observer: RpcObserver | None = None,
        admit: Callable[[grpc.HandlerCallDetails], Any] | None = None,
        admission: Admission | None = None,
        open_methods: frozenset[str] = frozenset(),
        redact: Callable[[str], str] = str,
    ) -> None:
        self.redact = redact
        self.observer = observer
        self.admit = admit
        self.admission = admission
        self.open_methods = open_methods

    def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Any], handler_call_details: grpc.HandlerCallDetails
    ) -> Any:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        full = handler_call_details.method
        method = full.rsplit("/", 1)[-1]
        lane = _lane(full, self.open_methods)
        if lane == OPEN_LANE:
            if full == HEALTH_WATCH and self.admission is not None and handler.unary_stream is not None:
                try:
                    watch = self.admission.watch(handler.unary_stream)
                except ClinkError as exc:
                    return self._refusal(method, exc)
                assert watch.watched is not None  # Admission.watch sets it
                return handler._replace(unary_stream=tag(watch.watched, watch))
            return _tagged(handler, Ticket(OPEN_LANE, None, None))
        try:
            grant = self.admit(handler_call_details) if self.admit is not None else None
            holder = f"{grant.name} ({grant.identity})" if grant is not None else None  # names may repeat; identities do not
            ticket = self.admission.admit(lane, holder) if self.admission is not None else None
        except ClinkError as exc:
            return self._refusal(method, exc)
        # built per call (the ticket is the call's), so one wrapper per direction and one _replace: each costs every call
        wrapped: dict[str, Callable] = {
            "request_deserializer": _request_decoder(handler.request_deserializer, method, ticket, self.observer)
        }
        if self.observer is not None:
            # bytes are counted where grpc hands them over (free), not with ByteSize() walking every message again
            wrapped["response_serializer"] = _counting_serializer(handler.response_serializer, method, self.observer)
        if handler.unary_unary is not None:
            wrapped["unary_unary"] = self._one_response(method, handler.unary_unary, _decoded_one, ticket)
        elif handler.stream_unary is not None:
            wrapped["stream_unary"] = self._one_response(method, handler.stream_unary, _decoded_stream, ticket)
        elif handler.unary_stream is not None:
            wrapped["unary_stream"] = self._streamed_response(method, handler.unary_stream, _decoded_one, ticket)
        elif handler.stream_stream is not None:
            wrapped["stream_stream"] = self._streamed_response(method, handler.stream_stream, _decoded_stream, ticket)
        return handler._replace(**wrapped)

    def _refusal(self, method: str, exc: ClinkError) -> grpc.RpcMethodHandler:
        """A handler answering ``exc`` at once from the open lane, without reading the request (it may be large, or never come)."""
        code, details, name, observer = status_for(exc), describe(exc), type(exc).__name__, self.observer
        log.info("%s refused -> %s: %s", method, code.name, details)

        def refuse(_request_iterator: Iterator[Any], context: grpc.ServicerContext) -> None:
            context.set_trailing_metadata(((ERROR_CLASS_METADATA_KEY, name),))
            if observer is not None:
                observer.observe(method, code, 0.0)
            context.abort(code, details)

        return grpc.stream_unary_rpc_method_handler(tag(refuse, Ticket(OPEN_LANE, None, None)))

    def _one_response(self, method: str, behavior: Callable, decode: Callable[[Any, _Call], Any], ticket: Ticket | None) -> Callable:
        """A handler answering one message: ``decode`` checks the request before ``behavior`` sees it."""

        def wrapped(request: Any, context: grpc.ServicerContext) -> Any:
            call = _Call(method, self.observer, ticket, self.redact)
            call.working()
            try:
                response = behavior(decode(request, call), context)
            except Exception as exc:
                call.fail(exc, context)
                raise
            call.finish(_current_code(context) or grpc.StatusCode.OK)
            call.waiting()  # grpc now sends the response: the client must take it
            return response

        return attach(wrapped, ticket) if ticket is not None else wrapped

    def _streamed_response(self, method: str, behavior: Callable, decode: Callable[[Any, _Call], Any], ticket: Ticket | None) -> Callable:
        """A handler answering with a stream: ``decode`` checks the request before ``behavior`` sees it."""

        def wrapped(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            call = _Call(method, self.observer, ticket, self.redact)
            call.working()
            yield from _guarded_stream(lambda: behavior(decode(request, call), context), call, context)

        return attach(wrapped, ticket) if ticket is not None else wrapped


def _tagged(handler: grpc.RpcMethodHandler, ticket: Ticket) -> grpc.RpcMethodHandler:
    """The handler with its behavior tagged with ``ticket``, so the lane executor runs and watches it."""
    for kind in ("unary_unary", "unary_stream", "stream_unary", "stream_stream"):
        behavior = getattr(handler, kind)
        if behavior is not None:
            return handler._replace(**{kind: tag(behavior, ticket)})
    return handler


class _Undecodable:
    """Stands in for a request message that did not parse (or that a deserializer refused), so the handler answers its error."""

    __slots__ = ("reason", "error")

    def __init__(self, reason: str, error: ClinkError | None = None) -> None:
        self.reason = reason
        self.error = error


def _request_decoder(
    deserialize: Callable[[bytes], Any] | None, method: str, ticket: Ticket | None, observer: RpcObserver | None
) -> Callable[[bytes], Any]:
    """The request deserializer: counts the message, tells the ticket it arrived, and hands on one that does not parse as _Undecodable."""

    def decode(raw: bytes) -> Any:
        if observer is not None:
            observer.received(method, len(raw))
        if ticket is not None:  # a message has arrived: decoding it is the pool's time, not the client's
            ticket.arrived(len(raw))
        if deserialize is None:
            return raw
        try:
            return deserialize(raw)
        except ClinkError as exc:  # a deserializer's own refusal (e.g. a request over a size limit), answered as it is
            return _Undecodable(str(exc), exc)
        except Exception as exc:  # noqa: BLE001 - any parse failure (truncated fields, bad UTF-8 in strings) is the caller's
            return _Undecodable(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)

    return decode


def _decoded(message: Any, method: str) -> Any:
    if isinstance(message, _Undecodable):
        if message.error is not None:
            raise message.error
        raise InvalidArgumentError(f"{method}: the request is not a valid protobuf message ({message.reason})")
    return message


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
    """The stream's messages, each checked to have parsed; the wait for each counts against the idle limit."""
    while True:
        call.awaiting()  # the clock runs on until enough bytes arrive (Ticket.arrived), not per message
        message = next(request_iterator, _END)
        if message is _END:
            call.working()
            return
        yield _decoded(message, call.method)


_END = object()


def _guarded_stream(start: Callable[[], Iterator[Any]], call: _Call, context: grpc.ServicerContext) -> Iterator[Any]:
    try:
        for response in start():
            call.waiting()  # until grpc has handed the message to a client that reads
            yield response
            call.working()
    except GeneratorExit:
        # the server closed the stream early (client cancelled)
        call.finish(grpc.StatusCode.CANCELLED)
        raise
    except Exception as exc:
        call.fail(exc, context)
        raise
    call.finish(_current_code(context) or grpc.StatusCode.OK)
