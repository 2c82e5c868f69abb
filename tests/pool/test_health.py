"""The pool's health service: Check and Watch answers, and no lock held while sending, so watch churn cannot wedge the pool."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from pool.health import PoolHealth
from pool.server import PoolServer, PoolServerConfig
from store.memory import MemoryStore

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


class FakeStream:
    """A servicer context for one Watch: end-of-stream callbacks kept, to be run as grpc's serving thread would."""

    def __init__(self) -> None:
        self.callbacks: list[Callable[[], None]] = []
        self.sent: list[int] = []
        self.ended = False

    def add_callback(self, callback: Callable[[], None]) -> bool:
        if self.ended:
            return False
        self.callbacks.append(callback)
        return True

    def end(self) -> None:
        self.ended = True
        for callback in self.callbacks:
            callback()

    def send(self, response: health_pb2.HealthCheckResponse | None) -> None:
        if response is not None:  # grpc's reference servicer sends None to close a stream
            self.sent.append(response.status)


def watch(servicer: Any, stream: FakeStream, service: str = "", send: Callable[[Any], None] | None = None) -> None:
    servicer.Watch(health_pb2.HealthCheckRequest(service=service), stream, send_response_callback=send or stream.send)


def ends_while_another_watch_sends(servicer: Any) -> bool:
    """Whether a watch's end-of-stream callback completes while another watch's first send is in flight.

    A grpc send waits for the serving thread, and that thread runs end-of-stream callbacks: a callback that waits for a lock the
    sender holds is the deadlock that wedged the whole pool.
    """
    first = FakeStream()
    watch(servicer, first)
    ended = threading.Event()

    def ending() -> None:
        first.end()
        ended.set()

    def send_waiting_for_the_serving_thread(response: health_pb2.HealthCheckResponse) -> None:
        serving_thread = threading.Thread(target=ending, daemon=True)
        serving_thread.start()
        ended.wait(2)

    watch(servicer, FakeStream(), send=send_waiting_for_the_serving_thread)
    return ended.is_set()


def test_grpcs_reference_servicer_has_the_deadlock_this_one_avoids() -> None:
    assert not ends_while_another_watch_sends(health.HealthServicer(experimental_non_blocking=True))
    assert ends_while_another_watch_sends(PoolHealth())


def test_watch_sends_the_status_then_each_change_once_and_not_serving_at_shutdown() -> None:
    servicer = PoolHealth()
    overall, named, unknown = FakeStream(), FakeStream(), FakeStream()
    watch(servicer, overall)
    watch(servicer, named, "svc")
    watch(servicer, unknown, "nobody")
    servicer.set("svc", SERVING)
    servicer.set("svc", SERVING)  # no change: nothing sent
    servicer.set("", NOT_SERVING)
    servicer.set("", SERVING)
    servicer.enter_graceful_shutdown()
    servicer.set("svc", SERVING)  # ignored after shutdown
    assert overall.sent == [SERVING, NOT_SERVING, SERVING, NOT_SERVING]
    assert named.sent == [UNKNOWN, SERVING, NOT_SERVING]
    assert unknown.sent == [UNKNOWN]


def test_an_ended_watch_is_told_nothing_more_and_is_forgotten() -> None:
    servicer = PoolHealth()
    gone, ended_before = FakeStream(), FakeStream()
    watch(servicer, gone)
    gone.end()
    ended_before.ended = True
    watch(servicer, ended_before)
    servicer.set("", NOT_SERVING)
    assert gone.sent == [SERVING] and ended_before.sent == []
    assert not servicer._watchers


def test_the_last_status_a_watch_is_sent_is_the_current_one_under_racing_changes() -> None:
    servicer = PoolHealth()
    streams: list[FakeStream] = []
    stop = threading.Event()

    def flip() -> None:
        status = SERVING
        while not stop.is_set():
            status = NOT_SERVING if status == SERVING else SERVING
            servicer.set("", status)

    flipper = threading.Thread(target=flip)
    flipper.start()
    try:
        for _ in range(300):
            stream = FakeStream()
            streams.append(stream)
            watch(servicer, stream)
    finally:
        stop.set()
        flipper.join(10)
    final = servicer.Check(health_pb2.HealthCheckRequest(), None).status
    assert all(s.sent and s.sent[-1] == final for s in streams)
    assert all(a != b for s in streams for a, b in zip(s.sent, s.sent[1:], strict=False)), "a watch was sent the same status twice in a row"


def test_check_of_an_unknown_service_is_not_found() -> None:
    class Context:
        code: grpc.StatusCode | None = None

        def set_code(self, code: grpc.StatusCode) -> None:
            self.code = code

    context = Context()
    PoolHealth().Check(health_pb2.HealthCheckRequest(service="nobody"), context)
    assert context.code == grpc.StatusCode.NOT_FOUND


@pytest.fixture
def served() -> Iterator[str]:
    server = PoolServer(PoolServerConfig(listen="127.0.0.1:0"), store=MemoryStore()).start()
    try:
        yield f"127.0.0.1:{server.port}"
    finally:
        server.stop(0)


def test_watches_opened_while_others_are_cancelled_leave_the_pool_answering(served: str) -> None:
    deadline = time.monotonic() + 3  # with grpc's reference servicer this wedged the pool within seconds, every run

    def churn() -> None:
        with grpc.insecure_channel(served) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline:
                watches = [stub.Watch(health_pb2.HealthCheckRequest(), timeout=10) for _ in range(40)]
                for w in watches[::2]:
                    w.cancel()
                for w in watches[1::2]:
                    try:
                        next(w)
                    except grpc.RpcError:
                        pass
                    w.cancel()

    threads = [threading.Thread(target=churn) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    with grpc.insecure_channel(served) as channel:
        assert health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=3).status == SERVING
