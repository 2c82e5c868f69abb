"""Review 13's findings on the clink side: each mistake a user makes ends in one line naming it, with the table's exit code."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from clink.cli.common import EXIT_INTERNAL, EXIT_UNAVAILABLE, EXIT_USAGE
from tests.cli_fixtures import one_line_error, run

# --- finding 2: an http:// source whose port is no HTTP server -------------------------------------------------------


def test_an_http_source_on_a_grpc_port_says_it_speaks_grpc_and_names_the_grpc_spelling(memory_pool_address: str) -> None:
    result = run(["state-cat", f"http://{memory_pool_address}/jobs/orders/state.arrow"])
    assert result.exit_code == EXIT_UNAVAILABLE, result.output
    line = one_line_error(result)
    assert f"{memory_pool_address} speaks gRPC" in line
    assert f"grpc://{memory_pool_address}/orders" in line and "--http-port" in line
    assert "BadStatusLine" not in line and "internal error" not in line
    assert result.stdout == ""


@contextmanager
def _answering(reply: bytes) -> Iterator[str]:
    """A loopback server answering every connection with ``reply`` (whatever was asked), then closing it; yields host:port."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    conn.recv(65536)
                    conn.sendall(reply)
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        server.close()


@pytest.mark.parametrize(
    "reply",
    [
        b"",  # closed without a word (RemoteDisconnected)
        b"SSH-2.0-OpenSSH_9.6\r\n",  # another protocol's greeting (BadStatusLine)
        b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nshort",  # a cut body (IncompleteRead)
        b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(200)) + b"\r\n",  # too many headers
        b"\x00\x00\x12\x04\x00\x00\x00\x00\x00",  # HTTP/2 frames
    ],
    ids=["closed", "not-http", "cut-body", "many-headers", "http2"],
)
def test_no_http_client_failure_is_an_internal_error(reply: bytes) -> None:
    with _answering(reply) as address:
        result = run(["state-cat", f"http://{address}/jobs/orders/state.arrow", "--pool-timeout", "5s"])
    assert result.exit_code == EXIT_UNAVAILABLE, result.output
    line = one_line_error(result)
    assert "internal error" not in line and address in line
    assert result.stdout == ""


@pytest.mark.parametrize("url", ["http://[::1/x", "http://127.0.0.1:99999/x", "http://a..b/x"])
def test_an_unusable_http_url_is_a_usage_error_not_an_internal_one(url: str) -> None:
    result = run(["state-cat", url])
    assert result.exit_code == EXIT_USAGE, result.output
    assert result.exit_code != EXIT_INTERNAL
    assert "not a usable http:// URL" in one_line_error(result)


# --- finding 6: clink demo -o json ---------------------------------------------------------------------------------------


def test_demo_with_json_output_prints_one_document_and_tells_the_story_on_stderr(tmp_path) -> None:
    import json

    result = run(["demo", "-o", "json", "--workdir", str(tmp_path / "demo")])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)  # the whole of stdout is one JSON document
    assert doc["ok"] is True and doc["exactly_once"] is True
    assert doc["job"] == "word-count-demo" and doc["checkpoints"] == [1, 2, 3, 4]
    assert doc["workdir"] == str((tmp_path / "demo").resolve()) and doc["store"].startswith("file://")
    assert doc["restored_checkpoint"] == 2 and doc["rescaled"] == {"from_subtasks": 4, "to_subtasks": 2}
    assert doc["words"] == 85 and doc["export_bytes"] > 0
    assert "exactly-once" in result.stderr and "DuckDB>" in result.stderr
