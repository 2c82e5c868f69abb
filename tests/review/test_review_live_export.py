"""Hostile review of the live export (client/live_export.py, pool/live_exports.py, the ?live=1 route of pool/http_export.py)."""

from __future__ import annotations

import logging
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from http.server import BaseHTTPRequestHandler

import pyarrow as pa
import pytest

import snapshot
from client.backend import RemoteReadBackend
from client.errors import ClinkError
from client.live_export import LiveExportConfig
from pool.domain import LiveExportConfig as PoolLiveConfig
from pool.server import PoolServer
from store.memory import MemoryStore
from tests.client_fixtures import FOUR, OFFSET_KEY, OP_COUNT, OP_SOURCE, OP_WINDOW, Model, keyed_keys, owner, table_model
from tests.live_review_fixtures import (
    announced,
    answer,
    canonical,
    fake_subtask,
    get,
    live_url,
    start,
    subtasks,
)

# ---- defects ---------------------------------------------------------------------------------------------------


def test_a_trickling_subtask_cannot_hold_the_live_export_past_its_deadline(quick_pool: PoolServer) -> None:
    def trickle(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Length", "100000")
        h.send_header("X-Clink-Job", "trickle")
        h.send_header("X-Clink-Key-Groups", "0-127")
        h.end_headers()
        for _ in range(20):  # 6 s in all, then the connection closes
            h.wfile.write(b"x")
            h.wfile.flush()
            time.sleep(0.3)

    with fake_subtask(trickle) as url, announced(quick_pool, "trickle", url):
        started = time.monotonic()
        status, _, _ = get(live_url(quick_pool, "trickle"))
        elapsed = time.monotonic() - started
    assert status == 503
    assert elapsed < 3.0, f"the 1 s live export took {elapsed:.1f} s"


def test_expired_announcements_of_dead_jobs_do_not_count_against_the_limit() -> None:
    server = start(PoolLiveConfig(max_announcements=1))
    try:
        with RemoteReadBackend.connect(server.address, "dead-job", (0, 127)) as dead:
            dead.restore()
            dead.pool.announce_live_export("dead-job", (0, 127), dead.epoch, "http://127.0.0.1:1/state.arrow", "", 1)
        time.sleep(1.3)  # its announcement expired; nobody reads dead-job's live route again
        with RemoteReadBackend.connect(server.address, "new-job", (0, 127)) as b:
            b.restore()
            try:
                b.pool.announce_live_export("new-job", (0, 127), b.epoch, "http://127.0.0.1:1/state.arrow", "", 30)
            except ClinkError as exc:
                pytest.fail(f"a live announcement refused because of an expired one: {exc}")
    finally:
        server.stop(0)


def test_live_0_with_partial_is_400(pool: PoolServer) -> None:
    status, _, body = get(live_url(pool, "j", "live=0&partial=allow"))
    assert status == 400 and b"partial" in body, (status, body)


def test_live_0_with_a_checkpoint_serves_the_checkpoint(pool: PoolServer) -> None:
    with RemoteReadBackend.connect(pool.address, "live0", (0, 127)) as b:
        b.restore()
        b.put(OP_COUNT, keyed_keys(1, seed=1)[0], b"v")
        b.snapshot(1)
    status, _, body = get(live_url(pool, "live0", "live=0&checkpoint=1"))
    assert status == 200, body


def test_a_renewal_racing_close_does_not_resurrect_the_announcement(pool: PoolServer) -> None:
    b = RemoteReadBackend.connect(pool.address, "race-close", (0, 127))
    b.restore()
    b.serve_live_export(config=LiveExportConfig(ttl_s=30))
    live = b.live_export
    assert live is not None
    real_announce, real_withdraw = b.pool.announce_live_export, b.pool.withdraw_live_export
    entered, gate, withdrawn = threading.Event(), threading.Event(), threading.Event()

    def held_announce(*args: object) -> int:
        entered.set()
        gate.wait(10)
        return real_announce(*args)  # type: ignore[arg-type]

    def spy_withdraw(*args: object) -> None:
        real_withdraw(*args)  # type: ignore[arg-type]
        withdrawn.set()

    b.pool.announce_live_export, b.pool.withdraw_live_export = held_announce, spy_withdraw  # type: ignore[method-assign]
    live.wake()  # a renewal: it passed its stop check and is in its RPC
    assert entered.wait(5)
    closer = threading.Thread(target=b.close)
    closer.start()
    assert withdrawn.wait(5)
    gate.set()  # the renewal reaches the pool after the withdraw
    closer.join(15)
    assert not closer.is_alive()
    status, _, body = get(live_url(pool, "race-close"))
    assert status == 404, (status, body)


def test_a_key_a_subtask_sends_twice_is_not_duplicated_in_the_export(pool: PoolServer) -> None:
    key = keyed_keys(1, seed=2)[0]
    body = canonical([(OP_COUNT, key, b"a"), (OP_COUNT, key, b"b")])
    with fake_subtask(lambda h: answer(h, body, "dup")) as url, announced(pool, "dup", url):
        status, _, got = get(live_url(pool, "dup"))
    assert status == 200
    merged = snapshot.read_snapshot(snapshot.merge_snapshot_bytes([body])).table
    table = snapshot.read_snapshot(got).table
    assert table.num_rows == merged.num_rows == 1, table.to_pylist()


def test_a_key_group_filter_does_not_change_the_merged_operator_state(pool: PoolServer) -> None:
    with subtasks(pool, "live-opfilter", FOUR) as backends:
        for i, b in enumerate(backends):
            b.put(OP_SOURCE, OFFSET_KEY, (100 + i).to_bytes(8, "little"))  # hot, no checkpoint: the greatest is 103
        full = table_model(snapshot.read_snapshot(get(live_url(pool, "live-opfilter"))[2]).table)
        part = table_model(snapshot.read_snapshot(get(live_url(pool, "live-opfilter", "live=1&key_groups=0-31"))[2]).table)
    assert full[(OP_SOURCE, OFFSET_KEY)] == (103).to_bytes(8, "little")
    assert part[(OP_SOURCE, OFFSET_KEY)] == full[(OP_SOURCE, OFFSET_KEY)]


def test_a_subtask_fenced_while_answering_is_not_served(pool: PoolServer) -> None:
    key = keyed_keys(1, seed=4)[0]
    with subtasks(pool, "fence-mid", [(0, 127)]) as (old,):
        old.put(OP_COUNT, key, b"zombie")
        real, entered, gate = old.export_arrow_snapshot, threading.Event(), threading.Event()

        def held() -> bytes:
            entered.set()
            gate.wait(10)
            return real()

        old.export_arrow_snapshot = held  # type: ignore[method-assign]
        result: list[tuple[int, dict[str, str], bytes]] = []
        reader = threading.Thread(target=lambda: result.append(get(live_url(pool, "fence-mid"))))
        reader.start()
        assert entered.wait(5)
        with RemoteReadBackend.connect(pool.address, "fence-mid", (0, 127)):  # a newer writer: the old one is fenced
            gate.set()
            reader.join(15)
        status, _, body = result[0]
    assert not (status == 200 and b"zombie" in body), "a fenced writer's rows were served"


def test_a_slow_client_cannot_hold_a_subtask_connection(pool: PoolServer, monkeypatch: pytest.MonkeyPatch) -> None:
    from client import live_export

    monkeypatch.setattr(live_export._Handler, "timeout", 1.0)  # SOCKET_TIMEOUT_S, scaled down to 1 s
    with subtasks(pool, "slowloris", [(0, 127)]) as (b,):
        port = int(b.live_export.url.rsplit(":", 1)[1].split("/")[0])  # type: ignore[union-attr]
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            closed = False
            for byte in b"GET /state.arrow HTTP/1.1\r\nHost: x\r\n":  # 3 s of a request line, never its final blank line
                try:
                    s.sendall(bytes([byte]))
                except OSError:
                    closed = True
                    break
                time.sleep(0.1)
            if not closed:
                s.settimeout(0.2)
                try:
                    s.recv(1)  # an answer (a 408) or the end of the stream: either way the server let go
                    closed = True
                except TimeoutError:
                    closed = False
                except OSError:
                    closed = True
    assert closed, "a connection trickling its request line for many seconds is still open (timeout 1 s)"


def test_idle_unauthenticated_connections_do_not_lock_the_pool_out(pool: PoolServer) -> None:
    from client.live_export import MAX_CONNECTIONS

    with subtasks(pool, "lockout", [(0, 127)]) as (b,):
        port = int(b.live_export.url.rsplit(":", 1)[1].split("/")[0])  # type: ignore[union-attr]
        with ExitStack() as stack:
            for _ in range(MAX_CONNECTIONS):
                stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=5))
            time.sleep(0.5)  # the server accepted them all
            status, _, body = get(live_url(pool, "lockout"))
    assert status == 200, body


def test_a_clear_text_export_advertised_off_loopback_is_refused() -> None:
    from client.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="clear text"):
        LiveExportConfig(advertise_host="10.1.2.3")


def test_the_live_export_names_every_subtasks_operators(pool: PoolServer) -> None:
    from snapshot.format import operators_from_metadata

    with subtasks(pool, "names", [(0, 63), (64, 127)]) as (a, b):
        keys = keyed_keys(50, seed=12)
        op_a, op_b = a.register_operator("alpha"), b.register_operator("beta")
        a.put(op_a, next(k for k in keys if k[0] < 64), b"1")
        b.put(op_b, next(k for k in keys if k[0] >= 64), b"2")
        status, _, body = get(live_url(pool, "names"))
        assert status == 200
        names = operators_from_metadata(snapshot.read_snapshot(body).extra_metadata)
        a.snapshot(1)
        b.snapshot(1)
        stored = operators_from_metadata(snapshot.read_snapshot(get(live_url(pool, "names", "checkpoint=1"))[2]).extra_metadata)
    assert stored == {op_a: "alpha", op_b: "beta"}
    assert names == stored


@contextmanager
def raw_subtask(reply: bytes) -> Iterator[str]:
    """http://127.0.0.1:PORT/state.arrow of a TCP server that reads a request, sends ``reply`` as is and closes."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.1)
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(5)
                data = b""
                while b"\r\n\r\n" not in data and (chunk := conn.recv(4096)):
                    data += chunk
                conn.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/state.arrow"
    finally:
        done.set()
        thread.join(5)
        listener.close()


@pytest.mark.parametrize(
    "reply",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\nX-Clink-Job: cut\r\nX-Clink-Key-Groups: 64-127\r\n\r\n" + b"\xff" * 100,
        b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-Junk: " + b"a" * 70_000 + b"\r\n\r\n",
    ],
    ids=["cut-mid-answer", "not-http", "header-too-long"],
)
def test_a_subtask_cut_mid_answer_is_503_naming_it_and_partial_serves_the_rest(pool: PoolServer, reply: bytes) -> None:
    with subtasks(pool, "cut", [(0, 63)]) as (a,):
        a.put(OP_COUNT, next(k for k in keyed_keys(50, seed=14) if k[0] < 64), b"kept")
        with raw_subtask(reply) as url, announced(pool, "cut", url, key_groups=(64, 127)):
            status, _, body = get(live_url(pool, "cut"))
            assert status == 503 and b"64-127" in body, (status, body)
            status, headers, body = get(live_url(pool, "cut", "live=1&partial=allow"))
            assert status == 200, body
            assert headers["X-Clink-Missing-Key-Groups"] == "64-127"


def test_a_renewal_racing_a_restore_does_not_silence_the_subtask_for_good(pool: PoolServer) -> None:
    entered, gate, armed = threading.Event(), threading.Event(), [0]

    class Gated(RemoteReadBackend):
        @property  # type: ignore[override]
        def epoch(self) -> int:
            if armed[0] and threading.current_thread().name == "live-export-renew":
                armed[0] -= 1
                if not armed[0]:  # its 2nd read: _renew's fenced check reads it first, announce() after key_groups
                    entered.set()
                    gate.wait(2)  # the renewal read key_groups; the restore runs before it reads the epoch (or waits on its lock)
            return self.__dict__["epoch"]

        @epoch.setter
        def epoch(self, value: int) -> None:
            self.__dict__["epoch"] = value

    with RemoteReadBackend.connect(pool.address, "race-restore", (0, 127)) as b:
        b.restore()
        b.serve_live_export(config=LiveExportConfig(ttl_s=3))
        b.__class__ = Gated
        armed[0] = 2
        b.live_export.wake()  # type: ignore[union-attr]
        assert entered.wait(5)
        b.restore(key_groups=(0, 63))  # scale up: this subtask keeps 0-63
        gate.set()
        deadline, status, body = time.monotonic() + 5, 0, b""
        while time.monotonic() < deadline:
            status, _, body = get(live_url(pool, "race-restore", "live=1&key_groups=0-63"))
            if status == 200:
                break
            time.sleep(0.2)
        b.__class__ = RemoteReadBackend
    assert status == 200, body


@pytest.mark.parametrize("job", ["a%0Ab", "%2e%2e", "x" * 300])
def test_a_bad_job_id_on_the_live_route_is_400_as_on_the_checkpoint_route(pool: PoolServer, job: str) -> None:
    assert get(live_url(pool, job, "checkpoint=1"))[0] == 400
    status, _, body = get(live_url(pool, job))
    assert status == 400 and b"job id" in body, (status, body)


# ---- properties that hold --------------------------------------------------------------------------------------


def test_pending_checkpoints_and_hot_writes_are_live(pool: PoolServer) -> None:
    """Checkpoint 1 complete, checkpoint 2 taken by two subtasks of four (pending), then more writes: live is the model."""
    model: Model = {}
    keys = keyed_keys(200, seed=11)
    with subtasks(pool, "pending", FOUR) as backends:
        for i, key in enumerate(keys[:100]):
            backends[owner(FOUR, key)].put(OP_COUNT, key, bytes([i]))
            model[(OP_COUNT, key)] = bytes([i])
        for b in backends:
            b.snapshot(1)
        for b in backends:
            b.refresh_completion()
        for key in keys[:30]:  # erases of checkpointed keys
            backends[owner(FOUR, key)].erase(OP_COUNT, key)
            del model[(OP_COUNT, key)]
        for key in keys[100:150]:
            backends[owner(FOUR, key)].put(OP_WINDOW, key, b"")  # empty values
            model[(OP_WINDOW, key)] = b""
        backends[0].snapshot(2)
        backends[1].snapshot(2)  # checkpoint 2 stays pending: two subtasks never take it
        for key in keys[150:]:
            backends[owner(FOUR, key)].put(OP_COUNT, key, b"late")
            model[(OP_COUNT, key)] = b"late"
        status, headers, body = get(live_url(pool, "pending"))
    assert status == 200, body
    assert table_model(snapshot.read_snapshot(body).table) == model


def test_bad_subtask_answers_are_503_naming_the_range_and_the_pool_stays_up(quick_pool: PoolServer) -> None:
    key = keyed_keys(1, seed=5)[0]
    plain = canonical([(OP_COUNT, key, b"v")])
    sink = pa.BufferOutputStream()
    table = snapshot.read_snapshot(plain).table
    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as w:
        big = [table["op_id"], table["key_bytes"], pa.array([b"\0" * 5_000_000], pa.binary())]
        w.write_table(pa.Table.from_arrays(big, schema=table.schema))
    compressed = sink.getvalue().to_pybytes()  # a 5 MB value in a few KB: a decompression bomb
    assert len(compressed) < 100_000

    def redirect(h: BaseHTTPRequestHandler) -> None:
        h.send_response(302)
        h.send_header("Location", "http://127.0.0.1:1/elsewhere")
        h.send_header("Content-Length", "0")
        h.end_headers()

    cases: list[tuple[str, Callable[[BaseHTTPRequestHandler], None], bytes]] = [
        ("not-arrow", lambda h: answer(h, b"<html>hello</html>", "bad"), b"not a canonical snapshot"),
        ("compressed", lambda h: answer(h, compressed, "bad"), b"0-127"),
        ("changelog", lambda h: answer(h, snapshot.SnapshotArrowWriter(changelog=True).write(pa.table({})), "bad"), b"0-127"),
        ("other-job", lambda h: answer(h, plain, "someone-else"), b"not the subtask announced"),
        ("other-range", lambda h: answer(h, plain, "bad", "0-63"), b"not the subtask announced"),
        ("redirect", redirect, b"HTTP 302"),
        ("huge", lambda h: answer(h, b"\0" * (2 << 20), "bad"), b"limit"),
    ]
    for name, behave, word in cases:
        with fake_subtask(behave) as url, announced(quick_pool, "bad", url):
            status, _, body = get(live_url(quick_pool, "bad"))
        assert status in (413, 503), (name, status, body)
        assert word in body, (name, body)
    assert get(f"http://127.0.0.1:{quick_pool.http_port}/healthz")[0] == 200


def test_a_silent_subtask_is_503_within_the_timeout(quick_pool: PoolServer) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)  # accepts in its backlog, never answers
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/state.arrow"
        with announced(quick_pool, "silent", url):
            started = time.monotonic()
            status, _, body = get(live_url(quick_pool, "silent"))
    assert status == 503 and b"0-127" in body
    assert time.monotonic() - started < 3.0


def test_the_announced_token_goes_only_to_loopback_or_https_and_never_into_answers_or_logs(
    pool: PoolServer, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "s3cr3t-announced-token"
    seen: list[str | None] = []

    def record(h: BaseHTTPRequestHandler) -> None:
        seen.append(h.headers.get("Authorization"))
        h.send_response(500)
        h.send_header("Content-Length", "0")
        h.end_headers()

    caplog.set_level(logging.DEBUG)
    with fake_subtask(record) as url:
        with announced(pool, "tok", url, token=secret):
            status, headers, body = get(live_url(pool, "tok"))
        assert status == 503 and seen == [f"Bearer {secret}"]
        off_loopback = url.replace("127.0.0.1", "localhost.example")
        with announced(pool, "tok2", off_loopback, token=secret):
            status2, _, body2 = get(live_url(pool, "tok2"))
        assert status2 == 503 and b"https only" in body2 and len(seen) == 1
    text = body + body2 + repr(headers).encode() + "\n".join(r.getMessage() for r in caplog.records).encode()
    assert secret.encode() not in text


def test_state_cat_exit_codes_on_the_live_route(pool: PoolServer, clink_run) -> None:
    result = clink_run("state-cat", live_url(pool, "nobody"))
    assert result.exit_code == 3 and "nobody" in result.output
    with subtasks(pool, "cat-stop", [(0, 63), (64, 127)]) as backends:
        backends[1].live_export._close_server()  # type: ignore[union-attr]
        result = clink_run("state-cat", live_url(pool, "cat-stop"))
        assert result.exit_code == 69 and "64-127" in result.output
        result = clink_run("state-cat", live_url(pool, "cat-stop", "live=1&key_groups=9-3"))
        assert result.exit_code == 2


def test_state_diff_of_the_live_route_against_its_checkpoint(pool: PoolServer, clink_run) -> None:
    with subtasks(pool, "diff", [(0, 63), (64, 127)]) as backends:
        keys = keyed_keys(40, seed=15)
        for key in keys:
            backends[owner([(0, 63), (64, 127)], key)].put(OP_COUNT, key, b"c")
        for b in backends:
            b.snapshot(1)
        for b in backends:
            b.refresh_completion()
        same = clink_run("state-diff", live_url(pool, "diff"), live_url(pool, "diff", "checkpoint=1"))
        assert same.exit_code == 0, same.output
        backends[owner([(0, 63), (64, 127)], keys[0])].erase(OP_COUNT, keys[0])  # an erase after the checkpoint
        differs = clink_run("state-diff", live_url(pool, "diff"), live_url(pool, "diff", "checkpoint=1"), "-o", "json")
        assert differs.exit_code == 1, differs.output


def test_a_restarted_pool_gets_the_announcements_back_within_a_renewal() -> None:
    store = MemoryStore()
    server = start(store=store)
    address, port = server.address, server.port
    with RemoteReadBackend.connect(address, "restart", (0, 127)) as b:
        b.restore()
        b.put(OP_COUNT, keyed_keys(1, seed=7)[0], b"r")
        b.serve_live_export(config=LiveExportConfig(ttl_s=3))
        assert get(live_url(server, "restart"))[0] == 200
        server.stop(0)
        server = start(store=store, port=port)
        try:
            assert get(live_url(server, "restart"))[0] == 404  # soft state: nothing until the next renewal
            deadline, status = time.monotonic() + 8, 0
            while time.monotonic() < deadline and (status := get(live_url(server, "restart"))[0]) != 200:
                time.sleep(0.2)
            assert status == 200
        finally:
            b.close()
            server.stop(0)


def test_close_leaves_no_thread_or_socket(pool: PoolServer) -> None:
    before = {t.name for t in threading.enumerate()}
    with subtasks(pool, "leak", [(0, 127)]) as (b,):
        live = b.live_export
        assert live is not None
        url, token = live.url, live.token
        assert get(url, token)[0] == 200
    time.sleep(0.3)
    after = {t.name for t in threading.enumerate() if t.is_alive()}
    assert not {n for n in after - before if n.startswith("live-export")}
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=2)


def test_concurrent_readers_of_a_subtask_get_the_same_state(pool: PoolServer) -> None:
    with subtasks(pool, "many", [(0, 127)]) as (b,):
        for i, key in enumerate(keyed_keys(500, seed=8)):
            b.put(OP_COUNT, key, i.to_bytes(4, "little"))
        live = b.live_export
        assert live is not None
        results: list[bytes] = []
        lock = threading.Lock()

        def read() -> None:
            status, _, body = get(live.url, live.token)
            with lock:
                results.append(body if status == 200 else b"status %d" % status)

        readers = [threading.Thread(target=read) for _ in range(12)]
        for t in readers:
            t.start()
        for t in readers:
            t.join(30)
        expected = b.export_arrow_snapshot()
    assert len(results) == 12 and set(results) == {expected}


def test_a_subtask_closed_before_it_restores_elsewhere_leaves_no_stale_range(pool: PoolServer) -> None:
    with subtasks(pool, "moves", [(0, 63), (64, 127)], ttl_s=3) as (a, b):
        b.close()
        a.restore(key_groups=(0, 127))  # scale down without a checkpoint
        deadline, headers, status = time.monotonic() + 8, {}, 0
        while time.monotonic() < deadline:
            status, headers, _ = get(live_url(pool, "moves"))
            if status == 200:
                break
            time.sleep(0.1)
    assert status == 200 and headers["X-Clink-Subtasks"] == "0-127@0"


def test_keyed_rows_outside_a_subtasks_range_are_dropped(pool: PoolServer) -> None:
    keys = keyed_keys(80, seed=16)
    mine, foreign = next(k for k in keys if k[0] < 64), next(k for k in keys if k[0] >= 64)
    liar = canonical([(OP_COUNT, mine, b"own"), (OP_COUNT, foreign, b"stolen")])
    with subtasks(pool, "outside", [(64, 127)]) as (real,):
        real.put(OP_COUNT, foreign, b"real")
        with fake_subtask(lambda h: answer(h, liar, "outside", "0-63")) as url, announced(pool, "outside", url, key_groups=(0, 63)):
            status, _, body = get(live_url(pool, "outside"))
    assert status == 200, body
    assert table_model(snapshot.read_snapshot(body).table) == {(OP_COUNT, mine): b"own", (OP_COUNT, foreign): b"real"}


def test_operator_state_collisions_follow_merge_snapshot_bytes(pool: PoolServer) -> None:
    """8-byte values: the greatest int64 (negative ones too); any other length in a group: the first subtask's."""
    k8, kmixed, kneg = (snapshot.encode_operator_key(n, b"") for n in ("eight", "mixed", "negative"))
    values = [
        {k8: (5).to_bytes(8, "little"), kmixed: (9).to_bytes(8, "little"), kneg: (-7).to_bytes(8, "little", signed=True)},
        {k8: (2**40).to_bytes(8, "little"), kmixed: b"abc", kneg: (-3).to_bytes(8, "little", signed=True)},
        {k8: (7).to_bytes(8, "little"), kneg: (-1 << 63).to_bytes(8, "little", signed=True)},
    ]
    ranges = [(0, 40), (41, 90), (91, 127)]
    with subtasks(pool, "opmerge", ranges) as backends:
        for b, vals in zip(backends, values, strict=True):
            for key, value in vals.items():
                b.put(OP_SOURCE, key, value)
        status, _, body = get(live_url(pool, "opmerge"))
        merged = snapshot.read_snapshot(snapshot.merge_snapshot_bytes(b.export_arrow_snapshot() for b in backends)).table
    assert status == 200
    got = table_model(snapshot.read_snapshot(body).table)
    assert got == table_model(merged)
    assert got[(OP_SOURCE, k8)] == (2**40).to_bytes(8, "little")
    assert got[(OP_SOURCE, kneg)] == (-3).to_bytes(8, "little", signed=True)


def test_a_rewind_shows_the_restored_state_not_the_dropped_hot_writes(pool: PoolServer) -> None:
    key = keyed_keys(1, seed=17)[0]
    with subtasks(pool, "rewind", [(0, 127)], ttl_s=3) as (b,):
        b.put(OP_COUNT, key, b"v1")
        b.snapshot(1)
        b.put(OP_COUNT, key, b"v2")  # hot, then dropped by the restore
        assert table_model(snapshot.read_snapshot(get(live_url(pool, "rewind"))[2]).table) == {(OP_COUNT, key): b"v2"}
        b.restore(1)
        deadline, seen = time.monotonic() + 5, []
        while time.monotonic() < deadline:
            status, headers, body = get(live_url(pool, "rewind"))
            if status == 200:
                seen.append((headers["X-Clink-Subtasks"], table_model(snapshot.read_snapshot(body).table)))
                break
            time.sleep(0.1)
    assert seen == [("0-127@1", {(OP_COUNT, key): b"v1"})]
