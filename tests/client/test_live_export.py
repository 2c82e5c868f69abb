"""Live export: running subtasks serve their live state, the pool merges every announced one at GET /jobs/JOB/state.arrow?live=1."""

from __future__ import annotations

import random
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import pyarrow as pa
import pytest

import snapshot
from client.backend import RemoteReadBackend
from client.errors import FencedError, InvalidArgumentError
from client.live_export import LiveExportConfig
from pool.server import PoolServer, PoolServerConfig
from store.memory import MemoryStore
from tests.client_fixtures import FOUR, OFFSET_KEY, OP_COUNT, OP_SOURCE, OP_WINDOW, Model, in_range, keyed_keys, owner, table_model

OPS = (OP_COUNT, OP_WINDOW)


@pytest.fixture
def pool() -> Iterator[PoolServer]:
    """A real pool over an in-memory store, with its HTTP export on a free port."""
    server = PoolServer(PoolServerConfig(listen="127.0.0.1:0", http_port=0, grace_seconds=0.2), store=MemoryStore()).start()
    try:
        yield server
    finally:
        server.stop(0)


def live_url(server: PoolServer, job: str, query: str = "live=1") -> str:
    return f"http://127.0.0.1:{server.http_port}/jobs/{job}/state.arrow?{query}"


def get(url: str, token: str | None = None) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of a GET (errors too)."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


@contextmanager
def subtasks(server: PoolServer, job: str, ranges: list[tuple[int, int]], serve: bool = True) -> Iterator[list[RemoteReadBackend]]:
    """One backend per range, each serving its live export (closed on leaving)."""
    with ExitStack() as stack:
        backends = [stack.enter_context(RemoteReadBackend.connect(server.address, job, r)) for r in ranges]
        for b in backends:
            b.restore()
            if serve:
                b.serve_live_export()
        yield backends


def write(backends: list[RemoteReadBackend], ranges: list[tuple[int, int]], model: Model, rng: random.Random, keys: list[bytes]) -> None:
    """Puts, overwrites and erases (of keys seen before) routed to the owning subtask, mirrored in the model."""
    for key in keys:
        op = rng.choice(OPS)
        b = backends[owner(ranges, key)]
        if (op, key) in model and rng.random() < 0.3:
            b.erase(op, key)
            del model[(op, key)]
        else:
            value = rng.randbytes(rng.randrange(0, 12))  # empty values too
            b.put(op, key, value)
            model[(op, key)] = value


def test_live_export_of_four_subtasks_equals_their_merge_and_shows_writes_after_the_checkpoint(pool: PoolServer) -> None:
    rng = random.Random(17)
    model: Model = {}
    keys = keyed_keys(400, seed=3)
    with subtasks(pool, "live-four", FOUR) as backends:
        write(backends, FOUR, model, rng, keys)
        for i, b in enumerate(backends):
            b.put(OP_SOURCE, OFFSET_KEY, (100 + i).to_bytes(8, "little"))  # operator state: the greatest offset wins the merge
        model[(OP_SOURCE, OFFSET_KEY)] = (103).to_bytes(8, "little")
        for b in backends:
            b.snapshot(1)
        for b in backends:
            b.refresh_completion()  # the first three committed before checkpoint 1 was complete
        write(backends, FOUR, model, rng, keys[:200] + keyed_keys(50, seed=4))  # after the checkpoint: only in the hot deltas
        status, headers, body = get(live_url(pool, "live-four"))
        assert status == 200, body
        got = snapshot.read_snapshot(body).table
        assert table_model(got) == model
        merged = snapshot.read_snapshot(snapshot.merge_snapshot_bytes(b.export_arrow_snapshot() for b in backends)).table
        assert table_model(got) == table_model(merged)
        assert headers["X-Clink-Subtasks"] == "0-31@1, 32-63@1, 64-95@1, 96-127@1"
        assert "X-Clink-Missing-Key-Groups" not in headers
        # a key-group filter asks only the subtasks it overlaps and keeps their rows of it
        status, _, body = get(live_url(pool, "live-four", "live=1&key_groups=40-70"))
        assert status == 200
        assert table_model(snapshot.read_snapshot(body).table) == in_range(model, 40, 70)


def test_one_subtask_stopped_gives_503_naming_its_range_or_the_rest_with_partial(pool: PoolServer) -> None:
    model: Model = {}
    with subtasks(pool, "live-stop", FOUR) as backends:
        write(backends, FOUR, model, random.Random(1), keyed_keys(200, seed=5))
        live = backends[2].live_export
        assert live is not None
        live._close_server()  # the subtask stops answering, its announcement stays until it expires
        status, headers, body = get(live_url(pool, "live-stop"))
        assert status == 503
        assert b"64-95" in body and headers.get("Retry-After") == "1"
        status, headers, body = get(live_url(pool, "live-stop", "live=1&partial=allow"))
        assert status == 200
        assert headers["X-Clink-Missing-Key-Groups"] == "64-95"
        rest = {k: v for k, v in model.items() if not 64 <= k[1][0] <= 95}
        assert table_model(snapshot.read_snapshot(body).table) == rest


def test_a_fenced_subtasks_announcement_is_gone(pool: PoolServer) -> None:
    with subtasks(pool, "live-fence", [(0, 127)]) as (old,):
        old.put(OP_COUNT, keyed_keys(1, seed=9)[0], b"old")
        assert get(live_url(pool, "live-fence"))[0] == 200
        with RemoteReadBackend.connect(pool.address, "live-fence", (0, 63)) as new:  # a newer writer of part of its range
            status, _, body = get(live_url(pool, "live-fence"))
            assert status == 404 and b"live-fence" in body  # the zombie is not served, even before the new one announces
            new.serve_live_export()
            status, _, body = get(live_url(pool, "live-fence"))
            assert status == 503 and b"64-127" in body  # the new subtask covers 0-63 only
            with pytest.raises(FencedError):
                old.live_export.announce()  # type: ignore[union-attr]
            status, _, _ = get(old.live_export.url, old.live_export.token)  # type: ignore[union-attr]
            assert status == 409  # the zombie's own endpoint says so too


def test_closing_a_subtask_withdraws_it_and_a_job_without_subtasks_is_404_naming_it(pool: PoolServer) -> None:
    status, _, body = get(live_url(pool, "nobody-here"))
    assert status == 404 and b"nobody-here" in body
    with subtasks(pool, "live-close", [(0, 63), (64, 127)]) as backends:
        assert get(live_url(pool, "live-close"))[0] == 200
        backends[1].close()
        status, _, body = get(live_url(pool, "live-close"))
        assert status == 503 and b"64-127" in body
        backends[0].close()
        assert get(live_url(pool, "live-close"))[0] == 404


def test_announcements_expire_unless_renewed(pool: PoolServer) -> None:
    with RemoteReadBackend.connect(pool.address, "live-ttl", (0, 127)) as b:
        b.serve_live_export(config=LiveExportConfig(ttl_s=3))
        live = b.live_export
        assert live is not None
        assert get(live_url(pool, "live-ttl"))[0] == 200
        live._stop.set()  # stops renewing, still serves
        live._wake.set()
        live._renewing.join(5)
        deadline = time.monotonic() + 10
        while get(live_url(pool, "live-ttl"))[0] == 200 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert get(live_url(pool, "live-ttl"))[0] == 404


def test_a_subtask_restored_to_another_range_announces_the_new_one(pool: PoolServer) -> None:
    with subtasks(pool, "live-rescale", [(0, 63), (64, 127)]) as (a, b):
        key = next(k for k in keyed_keys(50, seed=2) if k[0] >= 64)
        b.put(OP_COUNT, key, b"v")
        a.snapshot(1)
        b.snapshot(1)
        b.close()
        a.restore(1, key_groups=(0, 127))  # scale down: one subtask takes every key group
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            status, headers, body = get(live_url(pool, "live-rescale"))
            if status == 200:
                break
            time.sleep(0.1)
        assert status == 200, body
        assert headers["X-Clink-Subtasks"] == "0-127@1"
        assert table_model(snapshot.read_snapshot(body).table) == {(OP_COUNT, key): b"v"}


def test_the_subtask_endpoint_needs_its_token_and_state_cat_reads_the_pool_route(pool: PoolServer, clink_run) -> None:
    with subtasks(pool, "live-token", [(0, 127)]) as (b,):
        b.put(OP_COUNT, keyed_keys(1, seed=1)[0], b"x")
        live = b.live_export
        assert live is not None
        assert get(live.url)[0] == 401
        assert get(live.url, "wrong")[0] == 401
        status, headers, body = get(live.url, live.token)
        assert status == 200 and headers["X-Clink-Key-Groups"] == "0-127"
        assert snapshot.read_snapshot(body).table.num_rows == 1
        result = clink_run("state-cat", live_url(pool, "live-token"), "-o", "json")
        assert result.exit_code == 0, result.output
        assert '"x"' in result.output or "78" in result.output


@pytest.mark.parametrize(
    "query, word",
    [("live=2", "live"), ("live=1&checkpoint=3", "checkpoint"), ("partial=allow", "live=1"), ("live=1&partial=yes", "partial")],
)
def test_bad_live_parameters_are_400_naming_them(pool: PoolServer, query: str, word: str) -> None:
    status, _, body = get(live_url(pool, "j", query))
    assert status == 400 and word.encode() in body


def test_bad_announcements_are_refused(pool: PoolServer) -> None:
    with RemoteReadBackend.connect(pool.address, "live-bad", (0, 127)) as b:
        for url in ("ftp://127.0.0.1/x", "http://user:pw@127.0.0.1:1/state.arrow", "not a url", ""):
            with pytest.raises(InvalidArgumentError, match="url"):
                b.pool.announce_live_export("live-bad", (0, 127), b.epoch, url, "t", 30)
        with pytest.raises(InvalidArgumentError, match="ttl"):
            b.pool.announce_live_export("live-bad", (0, 127), b.epoch, "http://127.0.0.1:1/state.arrow", "t", 100_000)
        with pytest.raises(FencedError):
            b.pool.announce_live_export("live-bad", (0, 127), b.epoch - 1, "http://127.0.0.1:1/state.arrow", "t", 30)
        assert get(live_url(pool, "live-bad"))[0] == 404  # nothing was recorded
    with pytest.raises(InvalidArgumentError, match="clear text"):
        LiveExportConfig(host="0.0.0.0")


def test_a_subtask_answering_for_another_range_is_refused(pool: PoolServer) -> None:
    with subtasks(pool, "live-liar", [(0, 127)]) as (b,):
        live = b.live_export
        assert live is not None
        # announce the real URL for a range the backend does not serve (same epoch: it holds 0-127, so 0-127 is its)
        b.pool.withdraw_live_export("live-liar", (0, 127), b.epoch)
        other = RemoteReadBackend.connect(pool.address, "live-other", (0, 127))
        with other:
            other.pool.announce_live_export("live-other", (0, 127), other.epoch, live.url, live.token, 30)
            status, _, body = get(live_url(pool, "live-other"))
            assert status == 503 and b"not the subtask announced" in body


def test_live_rows_are_a_table_any_arrow_reader_opens(pool: PoolServer) -> None:
    with subtasks(pool, "live-arrow", [(0, 127)]) as (b,):
        b.put(OP_COUNT, keyed_keys(1, seed=6)[0], b"1")
        _, _, body = get(live_url(pool, "live-arrow"))
        table = pa.ipc.open_stream(body).read_all()
        assert table.column_names == ["op_id", "key_bytes", "value_bytes"] and table.num_rows == 1


def test_live_export_over_tls_with_tokens(pki) -> None:
    """Pool and subtasks on TLS with tokens: the job's read token reads the live route, another job's does not, a reader cannot announce."""
    from client.backend import BackendConfig
    from pool.domain import LiveExportConfig as PoolLiveConfig
    from pool.domain import PoolConfig
    from tests.security_fixtures import token_table

    config = PoolServerConfig(
        listen="127.0.0.1:0",
        http_port=0,
        grace_seconds=0.2,
        tls=pki.server_tls(),
        tokens=token_table(),
        pool=PoolConfig(live=PoolLiveConfig(ca_pem=pki.ca_pem)),
    )
    server = PoolServer(config, store=MemoryStore()).start()
    ctx = __import__("ssl").create_default_context(cadata=pki.ca_pem.decode())

    def get_tls(url: str, token: str | None) -> tuple[int, dict[str, str], bytes]:
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
        try:
            with urllib.request.urlopen(request, timeout=30, context=ctx) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()

    def backend(token: str) -> RemoteReadBackend:
        cfg = BackendConfig(token=token, tls_root_certificates=pki.ca_pem, tls_server_name="localhost")
        return RemoteReadBackend.connect(f"localhost:{server.port}", "job-a", (0, 127), cfg)

    try:
        with backend("tok-a-rw") as b:
            b.put(OP_COUNT, keyed_keys(1, seed=8)[0], b"tls")
            live_cfg = LiveExportConfig(tls_cert_pem=pki.server_cert_pem, tls_key_pem=pki.server_key_pem)
            url = b.serve_live_export(config=live_cfg)
            assert url.startswith("https://127.0.0.1:")
            route = f"https://localhost:{server.http_port}/jobs/job-a/state.arrow?live=1"
            status, _, body = get_tls(route, "tok-a-ro")
            assert status == 200, body
            assert snapshot.read_snapshot(body).table.column("value_bytes").to_pylist() == [b"tls"]
            assert get_tls(route, "tok-b-rw")[0] == 403
            assert get_tls(route, None)[0] == 401
            from client.errors import PermissionDeniedError
            from client.pool_client import PoolClient, PoolClientConfig

            reader_cfg = PoolClientConfig(token="tok-a-ro", tls_root_certificates=pki.ca_pem, tls_server_name="localhost")
            with PoolClient(f"localhost:{server.port}", reader_cfg) as reader, pytest.raises(PermissionDeniedError):
                reader.announce_live_export("job-a", (0, 127), b.epoch, url, "x", 30)  # a read token cannot redirect the job
    finally:
        server.stop(0)
