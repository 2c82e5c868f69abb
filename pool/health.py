"""The gRPC health service (Check and non-blocking Watch) holding no lock while it sends, so watch churn cannot wedge grpc."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

SendResponse = Callable[[Any], Any]


class _Watcher:
    """One Health.Watch stream: its send callback, the last status sent, and a lock that orders its sends."""

    __slots__ = ("send", "service", "sent", "send_lock")

    def __init__(self, send: SendResponse, service: str) -> None:
        self.send = send
        self.service = service
        self.sent: int | None = None
        self.send_lock = threading.Lock()


class PoolHealth(health_pb2_grpc.HealthServicer):
    """grpc_health's HealthServicer, but it never sends while holding the lock its stream-end callbacks take.

    grpc's reference servicer sends a watch's first status under its lock, and a send waits for grpc's serving thread; that
    thread runs the end-of-stream callbacks of other watches, which take the same lock: opening watches while others are
    cancelled deadlocks the whole server. Here the shared lock guards only the tables; each watch orders its own sends.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._status: dict[str, int] = {"": health_pb2.HealthCheckResponse.SERVING}
        self._watchers: dict[int, _Watcher] = {}
        self._shutting_down = False

    def Check(self, request: health_pb2.HealthCheckRequest, context: grpc.ServicerContext) -> health_pb2.HealthCheckResponse:
        with self._lock:
            status = self._status.get(request.service)
        if status is None:
            context.set_code(grpc.StatusCode.NOT_FOUND)
            return health_pb2.HealthCheckResponse()
        return health_pb2.HealthCheckResponse(status=status)

    def Watch(
        self, request: health_pb2.HealthCheckRequest, context: grpc.ServicerContext, send_response_callback: SendResponse | None = None
    ) -> None:
        if send_response_callback is None:  # grpc always passes it to a non-blocking behavior
            raise RuntimeError("PoolHealth.Watch runs only as a non-blocking handler")
        watcher = _Watcher(send_response_callback, request.service)
        with self._lock:
            self._watchers[id(watcher)] = watcher

        def forget() -> None:  # runs on grpc's serving thread when the stream ends: it must never wait for a send
            with self._lock:
                self._watchers.pop(id(watcher), None)

        if not context.add_callback(forget):  # the stream ended already
            forget()
            return
        self._send_current(watcher)

    Watch.experimental_non_blocking = True  # type: ignore[attr-defined]

    def _send_current(self, watcher: _Watcher) -> None:
        """Send ``watcher`` its service's status if it is not the last one it was sent (outside the shared lock)."""
        with watcher.send_lock:
            with self._lock:
                status = self._status.get(watcher.service, health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)
            if status != watcher.sent:
                watcher.sent = status
                watcher.send(health_pb2.HealthCheckResponse(status=status))

    def set(self, service: str, status: int) -> None:
        """Set ``service``'s status and tell its watchers (ignored once shutting down)."""
        self._update({service: status})

    def enter_graceful_shutdown(self) -> None:
        """Every service NOT_SERVING from now on; later ``set`` calls are ignored."""
        self._update(None)

    def _update(self, statuses: dict[str, int] | None) -> None:
        """Apply ``statuses`` (None: all NOT_SERVING and shut down) under the lock, then tell the watchers outside it."""
        with self._lock:
            if self._shutting_down:
                return
            if statuses is None:
                statuses = dict.fromkeys(self._status, health_pb2.HealthCheckResponse.NOT_SERVING)
                self._shutting_down = True
            self._status.update(statuses)
            watchers = [w for w in self._watchers.values() if w.service in statuses]
        for watcher in watchers:
            self._send_current(watcher)
