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


# --- finding 8: state-export's --out ---------------------------------------------------------------------------------------


@pytest.fixture
def snap_file(tmp_path):
    from tests.cli_fixtures import generated_table, write_table

    return write_table(tmp_path / "state.snap", generated_table(3, keyed_rows=20))


@pytest.mark.parametrize(
    ("out", "fmt", "means"),
    [("x.arrow", "parquet", "arrow"), ("x.parquet", "arrow", "parquet"), ("x.snap", "query", "arrow"), ("x.pq", "arrow", "parquet")],
)
def test_an_out_suffix_contradicting_format_is_refused_naming_both(tmp_path, snap_file, out, fmt, means) -> None:
    result = run(["state-export", "--from", str(snap_file), "--out", str(tmp_path / out), "--format", fmt])
    assert result.exit_code == EXIT_USAGE, result.output
    line = one_line_error(result)
    assert f"--out {tmp_path / out}" in line and f"--format {fmt}" in line and f"means {means}" in line
    assert not (tmp_path / out).exists() and result.stdout == ""


def test_a_matching_or_neutral_suffix_with_format_still_exports(tmp_path, snap_file) -> None:
    for out, fmt in (("q.pq", "query"), ("p.parquet", "parquet"), ("a.ipc", "arrow")):
        result = run(["state-export", "--from", str(snap_file), "--out", str(tmp_path / out), "--format", fmt])
        assert result.exit_code == 0, result.output


@pytest.mark.parametrize("fmt", [None, "parquet"])
def test_an_out_directory_is_said_to_be_a_directory_before_any_suffix_complaint(tmp_path, snap_file, fmt) -> None:
    folder = tmp_path / "exports"
    folder.mkdir()
    result = run(["state-export", "--from", str(snap_file), "--out", str(folder), *(["--format", fmt] if fmt else [])])
    assert result.exit_code == EXIT_USAGE, result.output
    line = one_line_error(result)
    assert f"--out {folder} is a directory; give a file name" in line
    assert "suffix" not in line
    assert list(folder.iterdir()) == []


def test_out_dash_to_a_terminal_is_refused_and_writes_nothing(snap_file) -> None:
    import os
    import pty
    import subprocess
    import sys
    from pathlib import Path

    leader, follower = pty.openpty()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "clink.cli.state", "state-export", "--from", str(snap_file), "--out", "-"],
            stdout=follower,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
            timeout=60,
            check=False,
        )
        os.close(follower)
        follower = -1
        written = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the terminal's other side is closed and everything was read
                break
            if not chunk:
                break
            written += chunk
    finally:
        if follower >= 0:
            os.close(follower)
        os.close(leader)
    assert proc.returncode == EXIT_USAGE, proc.stderr
    err = proc.stderr.decode().strip()
    assert len(err.splitlines()) == 1 and "stdout, which is a terminal; redirect stdout or give a file" in err
    assert written == b""


def test_out_dash_to_a_pipe_still_streams(snap_file) -> None:
    import snapshot

    result = run(["state-export", "--from", str(snap_file), "--out", "-"])
    assert result.exit_code == 0, result.output
    assert snapshot.read_snapshot(result.stdout_bytes).table.num_rows == 20 + 6


# --- finding 10: grpc:// to a port nothing listens on ----------------------------------------------------------------------


def test_a_grpc_source_with_nothing_listening_says_no_pool_is_listening() -> None:
    from clink.tools.sources import REFUSED_ATTEMPTS
    from tests.client_fixtures import free_port

    address = f"127.0.0.1:{free_port()}"
    result = run(["state-cat", f"grpc://{address}/orders"])
    assert result.exit_code == EXIT_UNAVAILABLE, result.output
    assert one_line_error(result) == f"clink: error: no pool is listening on {address} (start one with clink-pool serve)"
    assert result.stdout == ""
    assert REFUSED_ATTEMPTS <= 3  # a few quick tries, not 8 with backoff up to 2 s


# --- finding 15: clink demo --workdir that is empty or cannot be made ----------------------------------------------------


@pytest.mark.parametrize("workdir", ["", "  "])
def test_an_empty_demo_workdir_is_refused_not_replaced_by_a_temporary_folder(workdir, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = run(["demo", "--workdir", workdir])
    assert result.exit_code == EXIT_USAGE, result.output
    assert "--workdir is empty: give a folder, or leave --workdir out" in one_line_error(result)
    assert result.stdout == "" and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("where", ["afile/sub", "afile/sub/deeper", "afile", "/proc/clink-demo-x"])
def test_a_workdir_that_cannot_be_created_is_one_line_and_exit_2(where, tmp_path, monkeypatch) -> None:
    import os

    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("a file\n")
    if where.startswith("/proc") and not os.path.isdir("/proc"):
        pytest.skip("no /proc here")
    result = run(["demo", "--workdir", where])
    assert result.exit_code == EXIT_USAGE, result.output
    line = one_line_error(result)
    target = where if where.startswith("/") else str(tmp_path.resolve() / where)
    assert f"cannot create workdir {target}: " in line
    if where.startswith("afile"):
        assert line.endswith(f"{tmp_path.resolve() / 'afile'} is a file, not a folder")
    assert result.stdout == "" and sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


# --- finding 16: the small ones ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served_pool() -> Iterator[tuple[str, int, int]]:
    """(gRPC address, metrics port, HTTP export port) of a pool over a memory store holding job orders, checkpoints 1-7."""
    from pool.server import PoolServer, PoolServerConfig
    from store.memory import MemoryStore
    from tests.cli_fixtures import commit_checkpoints, generated_table

    store = MemoryStore()
    commit_checkpoints(store, "orders", [generated_table(seed, keyed_rows=30) for seed in range(7)])
    config = PoolServerConfig(listen="127.0.0.1:0", metrics_port=0, http_port=0, grace_seconds=0.2)
    server = PoolServer(config, store=store).start()
    try:
        assert server.metrics_port and server.http_port
        yield server.address, server.metrics_port, server.http_port
    finally:
        server.stop(0)


def test_a_missing_pool_checkpoint_offers_the_complete_ones_by_that_name(served_pool) -> None:
    from clink.tools.sources import complete_ids

    address, _, _ = served_pool
    result = run(["state-cat", f"grpc://{address}/orders/chk-99"])
    assert result.exit_code == 3, result.output
    line = one_line_error(result)
    assert "checkpoint 99 of job orders not found (the newest complete checkpoints: 3, 4, 5, 6, 7 (of 7))" in line
    assert "newest complete:" not in line
    assert complete_ids([2, 1]) == "complete checkpoints: 1, 2" and complete_ids([]) == "it has no complete checkpoint"


def test_grpc_to_the_metrics_port_says_it_is_the_metrics_port(served_pool) -> None:
    _, metrics_port, http_port = served_pool
    result = run(["state-cat", f"grpc://127.0.0.1:{metrics_port}/orders"])
    assert result.exit_code == EXIT_UNAVAILABLE, result.output
    line = one_line_error(result)
    assert f"127.0.0.1:{metrics_port} is the pool's metrics port" in line and "--listen" in line
    assert "--http-port" not in line
    result = run(["state-cat", f"grpc://127.0.0.1:{http_port}/orders"])  # the export's port keeps its own hint
    assert result.exit_code == EXIT_UNAVAILABLE and "is it the pool's --http-port?" in one_line_error(result)


@pytest.mark.parametrize(
    ("src", "suggestion"),
    [
        ("127.0.0.1:7420/orders", "grpc://127.0.0.1:7420/orders"),
        ("localhost:7420/orders/chk-3", "grpc://localhost:7420/orders/chk-3"),
        ("127.0.0.1:7420", "grpc://127.0.0.1:7420/JOB"),
        ("127.0.0.1:7421/jobs/orders/state.arrow", "http://127.0.0.1:7421/jobs/orders/state.arrow"),
    ],
)
def test_an_address_without_a_scheme_suggests_the_url(cwd_tmp, src, suggestion) -> None:
    result = run(["state-cat", src])
    assert result.exit_code == 3, result.output
    assert one_line_error(result) == f"clink: error: {src}: no such file or directory; did you mean {suggestion}?"


def test_a_missing_file_gets_no_suggestion(cwd_tmp) -> None:
    result = run(["state-cat", "nofile.snap"])
    assert result.exit_code == 3 and "did you mean" not in one_line_error(result)


def test_the_demo_help_lists_only_the_options_it_uses() -> None:
    demo_help = run(["demo", "--help"]).stdout
    for option in ("--pool-token", "--pool-ca-file", "--pool-cert-file", "--insecure", "--s3-endpoint-url", "--pool-timeout"):
        assert option not in demo_help
    assert "--output" in demo_help and "--workdir" in demo_help
    assert "--pool-token" in run(["state-cat", "--help"]).stdout  # commands that read a SRC keep them


@pytest.mark.parametrize("suffix", [".parquet", ".arrow"])
def test_exports_keep_the_operator_names_a_pool_gave(served_pool, tmp_path, suffix) -> None:
    import json

    from tests.cli_fixtures import OP_IDS

    address, _, _ = served_pool
    out = tmp_path / f"orders{suffix}"
    assert run(["state-export", "--from", f"grpc://{address}/orders", "--out", str(out)]).exit_code == 0
    result = run(["state-cat", str(out), "-o", "json", "-n", "0"])
    assert result.exit_code == 0, result.output
    uids = {row["op_id"]: row["uid"] for row in json.loads(result.stdout)["rows"]}
    assert uids and all(uids[op] == uid for uid, op in OP_IDS.items() if op in uids)
