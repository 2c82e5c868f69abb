"""Second hostile review of the live export (client/live_export.py, pool/live_exports.py, the ?live=1 route of pool/http_export.py)."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from contextlib import ExitStack

import pytest

import snapshot
from client.backend import RemoteReadBackend
from pool.server import PoolServer
from tests.client_fixtures import FOUR, OP_COUNT, OP_SOURCE, OP_WINDOW, Model, keyed_keys, owner, table_model
from tests.live_review_fixtures import (
    announced,
    answer,
    canonical,
    fake_subtask,
    get,
    live_url,
    subtasks,
)


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


def is_closed(s: socket.socket, wait: float = 0.3) -> bool:
    """Whether the peer let go of ``s`` (an answer or the end of the stream counts: either way it stopped waiting)."""
    s.settimeout(wait)
    try:
        s.recv(1)
        return True
    except TimeoutError:
        return False
    except OSError:
        return True


def fetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("live-fetch") and t.is_alive()]


# ---- defects ---------------------------------------------------------------------------------------------------


def test_a_client_trickling_its_headers_after_the_request_line_is_cut(pool: PoolServer, monkeypatch: pytest.MonkeyPatch) -> None:
    from client import live_export

    monkeypatch.setattr(live_export._Handler, "timeout", 1.0)  # SOCKET_TIMEOUT_S scaled down to 1 s (the header deadline too)
    with subtasks(pool, "slowheaders", [(0, 127)]) as (b,):
        with socket.create_connection(("127.0.0.1", port_of(b.live_export.url)), timeout=5) as s:  # type: ignore[union-attr]
            s.sendall(b"GET /state.arrow HTTP/1.1\r\n")  # the request line at once
            closed = False
            for byte in b"Host: x\r\nX-Pad: " + b"a" * 20:  # then ~3 s of header bytes, each well within the socket timeout
                try:
                    s.sendall(bytes([byte]))
                except OSError:
                    closed = True
                    break
                time.sleep(0.1)
            closed = closed or is_closed(s)
    assert closed, "a connection trickling its headers for 3 s is still open (header deadline 1 s)"


def test_connections_trickling_headers_cannot_lock_the_pool_out(pool: PoolServer) -> None:
    from client.live_export import MAX_CONNECTIONS

    with subtasks(pool, "lockout2", [(0, 127)]) as (b,):
        port = port_of(b.live_export.url)  # type: ignore[union-attr]
        with ExitStack() as stack:
            for _ in range(MAX_CONNECTIONS):
                s = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=5))
                s.sendall(b"GET /state.arrow HTTP/1.1\r\nHost: x\r\nX-Pad: a")  # the line, then a header never finished
            time.sleep(0.5)  # the server read every request line
            status, _, body = get(live_url(pool, "lockout2"))
    assert status == 200, body


def test_the_pool_reads_at_most_max_bytes_from_its_subtasks(quick_pool: PoolServer, monkeypatch: pytest.MonkeyPatch) -> None:
    read_by_fetch = [0]
    real_read = http.client.HTTPResponse.read

    def counting_read(self: http.client.HTTPResponse, amt: int | None = None) -> bytes:
        data = real_read(self, amt)
        if threading.current_thread().name.startswith("live-fetch"):
            read_by_fetch[0] += len(data)
        return data

    monkeypatch.setattr(http.client.HTTPResponse, "read", counting_read)
    huge = b"\0" * (6 << 20)  # 6 MiB where the pool takes 1 MiB
    with fake_subtask(lambda h: answer(h, huge, "budget")) as url, announced(quick_pool, "budget", url):
        status, _, body = get(live_url(quick_pool, "budget"))
    assert status in (413, 503) and b"limit" in body, (status, body)
    assert read_by_fetch[0] <= (1 << 20) + (64 << 10), f"the pool read {read_by_fetch[0]} bytes with max_bytes 1 MiB"


def test_a_token_with_a_newline_is_refused_or_never_echoed(pool: PoolServer, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from client.errors import InvalidArgumentError

    caplog.set_level(logging.DEBUG)
    secret = "abc\nsecret-tail-XYZZY"
    with fake_subtask(lambda h: answer(h, canonical([]), "nltoken")) as url:
        with RemoteReadBackend.connect(pool.address, "nltoken", (0, 127)) as b:
            b.restore()
            try:
                b.pool.announce_live_export("nltoken", (0, 127), b.epoch, url, secret, 30)
            except InvalidArgumentError:
                return  # refused at the door: the fix
            status, headers, body = get(live_url(pool, "nltoken"))
    text = body + repr(headers).encode() + "\n".join(r.getMessage() for r in caplog.records).encode()
    assert b"XYZZY" not in text, (status, body)


def test_a_fetch_whose_connection_comes_up_after_the_cut_does_not_outlive_the_deadline(
    quick_pool: PoolServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    stop = threading.Event()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]

    def trickle_headers() -> None:
        listener.settimeout(5)
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            for _ in range(40):  # a header byte every 0.2 s for 8 s (each read well within the 1 s socket timeout)
                if stop.wait(0.2):
                    return
                try:
                    conn.sendall(b"X")
                except OSError:
                    return

    server = threading.Thread(target=trickle_headers, daemon=True)
    server.start()
    real_getaddrinfo = socket.getaddrinfo

    def slow_dns(host: object, *args: object, **kwargs: object):  # noqa: ANN202 - socket's signature
        if host == "slow-dns.test":
            time.sleep(1.3)  # a resolver answering after the 1 s deadline
            return real_getaddrinfo("127.0.0.1", *args, **kwargs)  # type: ignore[arg-type]
        return real_getaddrinfo(host, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", slow_dns)
    try:
        with announced(quick_pool, "slowdns", f"http://slow-dns.test:{port}/state.arrow"):  # no token: http to any host
            status, _, body = get(live_url(quick_pool, "slowdns"))
            assert status == 503 and b"0-127" in body, (status, body)
            deadline = time.monotonic() + 2.5  # 3.5 s after the 1 s deadline
            while fetch_threads() and time.monotonic() < deadline:
                time.sleep(0.1)
            lingering = fetch_threads()
    finally:
        stop.set()
        server.join(5)
        listener.close()
        for t in fetch_threads():
            t.join(5)
    assert not lingering, f"{len(lingering)} fetch thread(s) still reading a subtask 3.5 s past the 1 s deadline"


def test_a_stopped_live_export_serves_no_kept_connection(pool: PoolServer) -> None:
    with subtasks(pool, "keptalive", [(0, 127)]) as (b,):
        live = b.live_export
        assert live is not None
        conn = http.client.HTTPConnection("127.0.0.1", port_of(live.url), timeout=5)
        try:
            conn.request("GET", "/state.arrow", headers={"Authorization": f"Bearer {live.token}"})
            first = conn.getresponse()
            first.read()
            assert first.status == 200
            live.stop()
            assert get(live_url(pool, "keptalive"))[0] == 404  # withdrawn
            try:
                conn.request("GET", "/state.arrow", headers={"Authorization": f"Bearer {live.token}"})
                again = conn.getresponse()
                again.read()
                served = again.status
            except (OSError, http.client.HTTPException):
                served = 0
        finally:
            conn.close()
    assert served == 0, f"a stopped live export answered HTTP {served} on a connection kept from before"


def test_the_pool_http_port_cuts_a_client_trickling_its_headers(pool: PoolServer, monkeypatch: pytest.MonkeyPatch) -> None:
    from pool import http_serving

    monkeypatch.setattr(http_serving.PoolRequestHandler, "header_deadline_s", 1.0)
    with socket.create_connection(("127.0.0.1", int(pool.http_port or 0)), timeout=5) as s:
        s.sendall(b"GET /jobs/j/state.arrow?live=1 HTTP/1.1\r\n")
        closed = False
        for byte in b"Host: x\r\nX-Pad: " + b"a" * 20:  # ~3 s of header bytes after the request line
            try:
                s.sendall(bytes([byte]))
            except OSError:
                closed = True
                break
            time.sleep(0.1)
        closed = closed or is_closed(s)
    assert closed, "the pool kept a connection trickling its headers for 3 s (header deadline 1 s)"


# ---- properties that hold --------------------------------------------------------------------------------------


def test_partial_allow_with_every_subtask_silent_is_an_empty_stream_naming_all(quick_pool: PoolServer) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)  # accepts in its backlog, never answers
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/state.arrow"
        with announced(quick_pool, "allsilent", url):
            status, headers, body = get(live_url(quick_pool, "allsilent", "live=1&partial=allow"))
    assert status == 200, body
    assert headers["X-Clink-Missing-Key-Groups"] == "0-127"
    assert headers["X-Clink-Subtasks"] == ""
    assert snapshot.read_snapshot(body).table.num_rows == 0


def test_a_silent_subtask_inside_a_filter_is_named_clipped_and_one_outside_whole(quick_pool: PoolServer) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/state.arrow"
        with subtasks(quick_pool, "clip", [(0, 63)]) as (a,):
            a.put(OP_COUNT, next(k for k in keyed_keys(50, seed=21) if k[0] < 64), b"a")
            with announced(quick_pool, "clip", url, key_groups=(64, 127)):
                inside = get(live_url(quick_pool, "clip", "live=1&partial=allow&key_groups=60-70"))
                outside = get(live_url(quick_pool, "clip", "live=1&partial=allow&key_groups=0-10"))
                strict = get(live_url(quick_pool, "clip", "live=1&key_groups=0-10"))
    assert inside[0] == 200 and inside[1]["X-Clink-Missing-Key-Groups"] == "64-70"
    assert outside[0] == 200 and outside[1]["X-Clink-Missing-Key-Groups"] == "64-127"  # its operator state is missing
    assert strict[0] == 503 and b"64-127" in strict[2] and strict[1].get("Retry-After") == "1"


def test_a_newer_writer_of_an_overlapping_range_displaces_the_old_announcement(pool: PoolServer) -> None:
    keys = keyed_keys(80, seed=22)
    low, high = next(k for k in keys if k[0] < 64), next(k for k in keys if k[0] >= 64)
    with subtasks(pool, "overlap", [(0, 127)]) as (old,):
        old.put(OP_COUNT, low, b"old")
        old.put(OP_COUNT, high, b"old")
        with subtasks(pool, "overlap", [(0, 63)]) as (new,):  # a newer epoch of 0-63: the old writer is fenced
            new.put(OP_COUNT, low, b"new")
            status, _, body = get(live_url(pool, "overlap"))
            assert status == 503 and b"64-127" in body, (status, body)
            status, headers, body = get(live_url(pool, "overlap", "live=1&partial=allow"))
    assert status == 200 and headers["X-Clink-Missing-Key-Groups"] == "64-127"
    assert headers["X-Clink-Subtasks"] == "0-63@0"
    assert table_model(snapshot.read_snapshot(body).table) == {(OP_COUNT, low): b"new"}


def test_only_fenced_announcements_is_a_404_naming_the_job(pool: PoolServer) -> None:
    with subtasks(pool, "allfenced", [(0, 127)]):
        with RemoteReadBackend.connect(pool.address, "allfenced", (0, 127)):  # fences the announcer, announces nothing
            status, _, body = get(live_url(pool, "allfenced"))
    assert status == 404 and b"allfenced" in body, (status, body)


def test_op_id_and_key_group_filters_match_the_model(pool: PoolServer) -> None:
    model: Model = {}
    keys = keyed_keys(120, seed=23)
    with subtasks(pool, "filters", FOUR) as backends:
        for i, key in enumerate(keys):
            op = (OP_COUNT, OP_WINDOW)[i % 2]
            backends[owner(FOUR, key)].put(op, key, bytes([i]))
            model[(op, key)] = bytes([i])
        for i, b in enumerate(backends):
            b.put(OP_SOURCE, snapshot.encode_operator_key("offsets", b""), (10 + i).to_bytes(8, "little"))
        model[(OP_SOURCE, snapshot.encode_operator_key("offsets", b""))] = (13).to_bytes(8, "little")
        cases = {
            f"live=1&op_id={OP_COUNT}": lambda op, k: op == OP_COUNT,
            "live=1&key_groups=20-70": lambda op, k: k[0] >= 0x80 or 20 <= k[0] <= 70,
            f"live=1&key_groups=40-40&op_id={OP_WINDOW}&op_id={OP_SOURCE}": lambda op, k: (
                op in (OP_WINDOW, OP_SOURCE) and (k[0] >= 0x80 or k[0] == 40)
            ),
        }
        for query, keep in cases.items():
            status, _, body = get(live_url(pool, "filters", query))
            assert status == 200, (query, body)
            got = table_model(snapshot.read_snapshot(body).table)
            assert got == {k: v for k, v in model.items() if keep(*k)}, query
    assert any(k[0] == 40 for _, k in model), "the seed gives key group 40 no key: the third case sees nothing"


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:1/state.arrow\r\nX-Evil: 1",
        "http://user:pw@127.0.0.1:1/state.arrow",
        "http://127.0.0.1:1/state.arrow#frag",
        "ftp://127.0.0.1:1/state.arrow",
        "http://127.0.0.1:99999/state.arrow",
    ],
    ids=["crlf", "credentials", "fragment", "scheme", "port"],
)
def test_a_bad_announced_url_is_refused_at_the_announcement(pool: PoolServer, url: str) -> None:
    from client.errors import InvalidArgumentError

    with RemoteReadBackend.connect(pool.address, "badurl", (0, 127)) as b:
        b.restore()
        with pytest.raises(InvalidArgumentError, match="live export url"):
            b.pool.announce_live_export("badurl", (0, 127), b.epoch, url, "", 30)
    assert get(live_url(pool, "badurl"))[0] == 404


@pytest.mark.parametrize("path", ["/state.arrow?\x7fx", "/st\u00e4te.arrow"], ids=["del", "non-ascii"])
def test_an_announced_url_http_client_cannot_send_is_a_503_naming_it(pool: PoolServer, path: str) -> None:
    with announced(pool, "oddurl", f"http://127.0.0.1:1{path}"):
        status, _, body = get(live_url(pool, "oddurl"))
    assert status == 503 and b"0-127" in body, (status, body)
    assert get(f"http://127.0.0.1:{pool.http_port}/healthz")[0] == 200


def test_fetch_threads_end_with_a_normal_export_and_a_stopped_export_leaves_no_listener(pool: PoolServer) -> None:
    with subtasks(pool, "threads", [(0, 63), (64, 127)]) as (a, b):
        a.put(OP_COUNT, next(k for k in keyed_keys(50, seed=24) if k[0] < 64), b"v")
        for _ in range(3):
            assert get(live_url(pool, "threads"))[0] == 200
        deadline = time.monotonic() + 2
        while fetch_threads() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not fetch_threads()
        url = b.live_export.url  # type: ignore[union-attr]
        b.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port_of(url)), timeout=2).close()


def test_a_fenced_subtasks_own_endpoint_answers_409_and_its_token_is_required(pool: PoolServer) -> None:
    with subtasks(pool, "zombie", [(0, 127)]) as (old,):
        live = old.live_export
        assert live is not None
        assert get(live.url)[0] == 401
        assert get(live.url, live.token + "x")[0] == 401
        with RemoteReadBackend.connect(pool.address, "zombie", (0, 127)) as new:
            new.restore()
            old.put(OP_COUNT, keyed_keys(1, seed=25)[0], b"z")  # the zombie learns it is fenced at its next pool call or not
            live.wake()  # its renewal is refused: the pool calls it fenced
            deadline, status = time.monotonic() + 5, 0
            while time.monotonic() < deadline and (status := get(live.url, live.token)[0]) != 409:
                time.sleep(0.1)
    assert status == 409


def test_the_pool_http_port_cuts_a_client_trickling_its_request_line(pool: PoolServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The control of the header test above: the same 1 s deadline does cut a request line sent byte by byte."""
    from pool import http_serving

    monkeypatch.setattr(http_serving.PoolRequestHandler, "header_deadline_s", 1.0)
    with socket.create_connection(("127.0.0.1", int(pool.http_port or 0)), timeout=5) as s:
        closed = False
        for byte in b"GET /jobs/j/state.arrow?live=1 HTTP/1.1\r\n":  # ~4 s of a request line
            try:
                s.sendall(bytes([byte]))
            except OSError:
                closed = True
                break
            time.sleep(0.1)
        closed = closed or is_closed(s)
    assert closed
