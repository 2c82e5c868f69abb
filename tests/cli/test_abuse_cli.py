"""The clink CLI against hostile servers and paths: the token never follows a redirect elsewhere, never goes down to plaintext,
never goes over plaintext to another machine unless --insecure says so; --out never replaces what it should not.
"""

from __future__ import annotations

import os
import ssl
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import snapshot as s
from clink.cli.common import EXIT_DATA, EXIT_DENIED, EXIT_UNAVAILABLE
from tests.cli_fixtures import generated_table, one_line_error, run
from tests.security_fixtures import make_pki, zstd_bomb

TOKEN = "tok-secret-123"


@contextmanager
def http_server(answer, tls: ssl.SSLContext | None = None) -> Iterator[tuple[int, list[dict]]]:
    """A loopback server answering every GET with answer(handler); yields (port, the headers of every request it saw)."""
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            seen.append({k.lower(): v for k, v in self.headers.items()})
            answer(self)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], seen
    finally:
        server.shutdown()
        server.server_close()


def redirect_to(url: str):
    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(302)
        handler.send_header("Location", url)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    return answer


def serve_bytes(data: bytes):
    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    return answer


@pytest.fixture(scope="module")
def stream() -> bytes:
    return s.write_snapshot(generated_table(3, keyed_rows=20))


def test_a_redirect_to_another_origin_does_not_carry_the_token(stream):
    with http_server(serve_bytes(stream)) as (other, seen_other):
        # 'localhost' and '127.0.0.1' are different origins for the same machine
        with http_server(redirect_to(f"http://localhost:{other}/state.arrow")) as (first, seen_first):
            result = run(["--pool-token", TOKEN, "state-cat", f"http://127.0.0.1:{first}/state.arrow", "--limit", "0", "-o", "json"])
    assert result.exit_code == 0, result.output
    assert seen_first[0]["authorization"] == f"Bearer {TOKEN}"
    assert len(seen_other) == 1 and "authorization" not in seen_other[0]


def test_a_redirect_within_the_origin_keeps_the_token(stream):
    def answer(handler: BaseHTTPRequestHandler) -> None:
        (serve_bytes(stream) if handler.path == "/real" else redirect_to("/real"))(handler)

    with http_server(answer) as (port, seen):
        result = run(["--pool-token", TOKEN, "state-cat", f"http://127.0.0.1:{port}/x", "--limit", "0", "-o", "json"])
    assert result.exit_code == 0, result.output
    assert [h.get("authorization") for h in seen] == [f"Bearer {TOKEN}"] * 2


def test_https_never_follows_a_redirect_down_to_http(stream, tmp_path):
    pki = make_pki()
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    paths = pki.write(tmp_path)
    ctx.load_cert_chain(paths["server_cert_pem"], paths["server_key_pem"])
    with http_server(serve_bytes(stream)) as (plain, seen_plain):
        with http_server(redirect_to(f"http://127.0.0.1:{plain}/state.arrow"), tls=ctx) as (secure, _):
            result = run(
                ["--pool-token", TOKEN, "--pool-ca-file", str(paths["ca_pem"]), "state-cat", f"https://127.0.0.1:{secure}/s.arrow"]
            )
    assert result.exit_code == EXIT_DENIED
    assert "from https down to http" in one_line_error(result)
    assert seen_plain == []


@pytest.mark.parametrize("src", ["http://192.0.2.1:8080/jobs/j/state.arrow", "grpc://192.0.2.1:7420/j"])
def test_no_token_in_plaintext_to_another_machine_without_insecure(src):
    result = run(["--pool-token", TOKEN, "--pool-timeout", "0.5", "state-cat", src, "--limit", "0"])
    assert result.exit_code == 2
    assert "refusing to send the pool token in plaintext" in one_line_error(result)
    insecure = run(["--insecure", "--pool-token", TOKEN, "--pool-timeout", "0.5", "state-cat", src, "--limit", "0"])
    assert (
        insecure.exit_code == EXIT_UNAVAILABLE and "refusing" not in insecure.stderr
    )  # it tried (and found nobody at the TEST-NET address)


def test_out_refuses_what_it_should_not_replace(stream, tmp_path):
    src = tmp_path / "in.arrow"
    src.write_bytes(stream)
    existing = tmp_path / "existing.arrow"
    existing.write_bytes(b"keep me")
    existing.chmod(0o640)
    result = run(["state-export", "--from", str(src), "--out", str(existing)])
    assert result.exit_code == 2 and "pass --force" in one_line_error(result)
    assert existing.read_bytes() == b"keep me"
    forced = run(["state-export", "--from", str(src), "--out", str(existing), "--force"])
    assert forced.exit_code == 0, forced.output
    assert existing.read_bytes() == stream and stat.S_IMODE(existing.stat().st_mode) == 0o640  # replaced, mode kept

    target = tmp_path / "target.txt"
    target.write_bytes(b"the link's target")
    link = tmp_path / "link.arrow"
    link.symlink_to(target)
    result = run(["state-export", "--from", str(src), "--out", str(link)])
    assert result.exit_code == 2 and "symlink" in one_line_error(result)
    assert link.is_symlink() and target.read_bytes() == b"the link's target"

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    result = run(["state-export", "--from", str(src), "--out", str(fifo)])
    assert result.exit_code == 2 and "device, FIFO or socket" in one_line_error(result)
    assert stat.S_ISFIFO(fifo.lstat().st_mode)

    result = run(["state-export", "--from", str(src), "--out", "/dev/null"])
    assert result.exit_code == 2 and stat.S_ISCHR(Path("/dev/null").lstat().st_mode)
    forced = run(["state-export", "--from", str(src), "--out", "/dev/null", "--force"])
    assert forced.exit_code == 0, forced.output
    assert stat.S_ISCHR(Path("/dev/null").lstat().st_mode)  # written into, never replaced by a file

    fresh = tmp_path / "fresh.arrow"
    assert run(["state-export", "--from", str(src), "--out", str(fresh)]).exit_code == 0
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o666 & ~umask  # a new file gets the usual mode, not mkstemp's 0600


def test_state_cat_refuses_a_decompression_bomb_without_inflating_it(tmp_path):
    import resource

    bomb = tmp_path / "bomb.arrow"
    bomb.write_bytes(zstd_bomb(1 << 30))  # 1 GiB of zeros in ~33 KB
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = run(["state-cat", str(bomb)])
    assert result.exit_code == EXIT_DATA and "compressed" in one_line_error(result)
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024 < 100 << 20


def test_the_file_store_does_not_follow_symlinks_out_of_its_root(tmp_path):
    from snapshot.errors import InvalidArgumentError
    from store.local import FileStore

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"not yours")
    store = FileStore(tmp_path / "store")
    (tmp_path / "store" / "jobs").mkdir(parents=True)  # a FileStore makes its root on the first write, not on open
    (tmp_path / "store" / "jobs" / "j").symlink_to(outside)
    for attempt in (
        lambda: store.get("jobs/j/secret"),
        lambda: store.head("jobs/j/secret"),
        lambda: store.put("jobs/j/new", b"x"),
        lambda: store.delete("jobs/j/secret"),
    ):
        with pytest.raises(InvalidArgumentError, match="outside the store"):
            attempt()
    assert (outside / "secret").read_bytes() == b"not yours" and not (outside / "new").exists()


def test_a_proxy_from_the_environment_never_sees_a_plaintext_token(stream, monkeypatch):
    proxy_seen: list[dict] = []

    def proxy_answer(handler: BaseHTTPRequestHandler) -> None:
        proxy_seen.append({k.lower(): v for k, v in handler.headers.items()})
        handler.send_response(502)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    with http_server(proxy_answer) as (proxy, _), http_server(serve_bytes(stream)) as (port, seen):
        monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{proxy}")
        monkeypatch.delenv("no_proxy", raising=False)
        monkeypatch.delenv("NO_PROXY", raising=False)
        result = run(["--pool-token", TOKEN, "state-cat", f"http://127.0.0.1:{port}/state.arrow", "--limit", "0"])
    assert result.exit_code == 0, result.output
    assert proxy_seen == [] and seen[0]["authorization"] == f"Bearer {TOKEN}"
