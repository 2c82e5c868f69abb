"""The HTTP export takes the CLI's selectors (one parser), counts every export in /metrics, logs it, and binds on --http-host."""

from __future__ import annotations

import logging
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pyarrow.ipc as ipc
import pytest
from click.testing import CliRunner

import clink.cli.pool
import pool.server
import snapshot as s
from clink.cli.common import EXIT_UNAVAILABLE, EXIT_USAGE
from clink.tools.sources import parse_key_groups, parse_op
from pool.http_export import parse_request
from pool.server import PoolServer, PoolServerConfig
from snapshot.errors import InvalidArgumentError, UnavailableError
from store.local import FileStore
from tests.cli_fixtures import OP_IDS, commit_checkpoints, generated_table, one_line_error, rows_of, run

JOB = "orders"
TIMEOUT = 30


@pytest.fixture
def exporting(tmp_path: Path) -> Iterator[tuple[PoolServer, object, object]]:
    """A PoolServer with the HTTP export and /metrics on free loopback ports over checkpoints 1 and 2 of JOB."""
    store = FileStore(tmp_path / "store")
    t1, t2 = generated_table(81, keyed_rows=200), generated_table(82, keyed_rows=300, operator_rows=4)
    commit_checkpoints(store, JOB, [t1, t2])
    config = PoolServerConfig(listen="127.0.0.1:0", metrics_port=0, http_port=0, metrics_host="localhost", grace_seconds=0)
    server = PoolServer(config, store=store).start()
    try:
        yield server, t1, t2
    finally:
        server.stop(0)


def _url(server: PoolServer, query: str = "") -> str:
    assert server.http_export is not None
    return f"{server.http_export.url}/jobs/{JOB}/state.arrow{query}"


def _fetch(url: str) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def _metrics(server: PoolServer) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=TIMEOUT).read().decode()


def _sample(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else 0.0


def _settled(server: PoolServer, done) -> str:
    """/metrics once ``done(text)`` holds: the export counts and logs after its last byte went out, so a client that has
    read the body may ask before the handler has; bounded (5 s), then the last text for the assertion to show.
    """
    deadline = time.monotonic() + 5
    text = _metrics(server)
    while not done(text) and time.monotonic() < deadline:
        time.sleep(0.02)
        text = _metrics(server)
    return text


@pytest.mark.parametrize("query", ["", "?checkpoint=0", "?checkpoint=latest", "?checkpoint="])
def test_checkpoint_0_or_absent_is_the_latest_complete_as_in_the_cli(exporting, query: str):
    server, _, t2 = exporting
    status, headers, body = _fetch(_url(server, query))
    assert status == 200 and headers["X-Clink-Checkpoint"] == "2"
    assert rows_of(ipc.open_stream(body).read_all()) == rows_of(t2)


def test_op_id_takes_decimal_hex_and_uid_names_repeatable_as_the_cli_does(exporting):
    server, _, t2 = exporting
    window, sink = OP_IDS["window"], OP_IDS["sink"]
    expected = {k: v for k, v in rows_of(t2).items() if k[0] in (window, sink)}
    for query in (f"?op_id={window}&op_id={sink}", f"?op_id={hex(window)}&op_id=uid:sink", "?op_id=uid:window&op_id=uid:sink"):
        status, _, body = _fetch(_url(server, query))
        assert status == 200, body
        assert rows_of(ipc.open_stream(body).read_all()) == expected, query


def test_key_groups_take_a_range_or_one_group_as_the_cli_does(exporting):
    server, _, t2 = exporting
    for text, (lo, hi) in (("40-80", (40, 80)), ("7", (7, 7))):
        status, _, body = _fetch(_url(server, f"?checkpoint=2&key_groups={text}"))
        assert status == 200
        assert rows_of(ipc.open_stream(body).read_all()) == rows_of(s.filter_key_groups(t2, lo, hi))


@pytest.mark.parametrize("text", ["0", "42", "0x2a", "0X2A", "uid:window", "18446744073709551615", "-1", "0x1" + "0" * 16, "abc", "uid"])
def test_the_export_and_the_cli_read_an_op_selector_the_same_way(text: str):
    def outcome(parse):
        try:
            return parse()
        except InvalidArgumentError:
            return "refused"

    cli = outcome(lambda: parse_op(text))
    http = outcome(lambda: parse_request(f"/jobs/j/state.arrow?op_id={text}").op_ids[0])  # type: ignore[union-attr]
    assert cli == http


@pytest.mark.parametrize("text", ["0-127", "7", " 3 - 9 ", "9-3", "0-128", "x", "1-2-3"])
def test_the_export_and_the_cli_read_a_key_group_selector_the_same_way(text: str):
    def outcome(parse):
        try:
            return parse()
        except InvalidArgumentError:
            return "refused"

    cli = outcome(lambda: parse_key_groups(text))
    request = outcome(lambda: parse_request(f"/jobs/j/state.arrow?key_groups={text.replace(' ', '+')}"))
    http = request if request == "refused" else (request.key_groups.lo, request.key_groups.hi)  # type: ignore[union-attr]
    assert cli == http


@pytest.mark.parametrize(
    "query, needle",
    [
        ("?op_id=zzz", "op_id 'zzz' must be an op_id"),
        ("?key_groups=9-3", "key_groups '9-3' must satisfy"),
        ("?checkpoint=-1", "checkpoint"),
    ],
)
def test_a_bad_selector_is_one_line_400_counted_and_logged(exporting, caplog, query: str, needle: str):
    server, _, _ = exporting
    caplog.set_level(logging.INFO, logger="clink.pool.http")
    before = _sample(_metrics(server), 'clink_pool_http_exports_total{code="400"}')
    status, headers, body = _fetch(_url(server, query))
    assert status == 400 and headers["X-Clink-Error"] == "InvalidArgumentError"
    assert needle in body.decode() and body.decode().count("\n") == 1
    after = _settled(server, lambda text: _sample(text, 'clink_pool_http_exports_total{code="400"}') > before)
    assert _sample(after, 'clink_pool_http_exports_total{code="400"}') == before + 1
    assert any("-> 400" in r.getMessage() and needle in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)


def test_the_cli_reading_a_bad_export_url_exits_2_with_one_line_and_writes_nothing(exporting, tmp_path: Path):
    server, _, _ = exporting
    out = tmp_path / "out.arrow"
    result = run(["state-export", "--from", _url(server, "?op_id=uid"), "--out", str(out)])
    assert result.exit_code == EXIT_USAGE
    assert "HTTP 400" in one_line_error(result) and "op_id" in one_line_error(result)
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["store"]


def test_an_export_is_counted_with_its_bytes_and_logged_with_job_checkpoint_rows_and_seconds(exporting, caplog):
    server, t1, _ = exporting
    caplog.set_level(logging.INFO, logger="clink.pool.http")
    before = _metrics(server)
    status, _, body = _fetch(_url(server, "?checkpoint=1"))
    assert status == 200
    counted = 'clink_pool_http_exports_total{code="200"}'
    after = _settled(server, lambda text: _sample(text, counted) > _sample(before, counted))
    assert _sample(after, 'clink_pool_http_exports_total{code="200"}') == _sample(before, 'clink_pool_http_exports_total{code="200"}') + 1
    assert _sample(after, "clink_pool_http_export_bytes_total") == _sample(before, "clink_pool_http_export_bytes_total") + len(body)
    assert _sample(after, "clink_pool_http_export_seconds_count") == _sample(before, "clink_pool_http_export_seconds_count") + 1
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO and r.name == "clink.pool.http"]
    assert any(
        re.fullmatch(rf"export of job {JOB} checkpoint 1 -> 200, {t1.num_rows} rows, {len(body)} bytes in [0-9.]+ s", line)
        for line in lines
    ), lines
    missing = _fetch(f"{server.http_export.url}/jobs/nobody/state.arrow")  # type: ignore[union-attr]
    assert missing[0] == 404
    assert (
        _sample(
            _settled(server, lambda text: _sample(text, 'clink_pool_http_exports_total{code="404"}') >= 1),
            'clink_pool_http_exports_total{code="404"}',
        )
        >= 1
    )


def test_the_export_binds_on_http_host_and_metrics_on_metrics_host(exporting):
    server, _, _ = exporting
    assert server.http_export is not None and server.http_export.host == "127.0.0.1"  # http_host's default
    assert server.config.metrics_host == "localhost"  # set apart in the fixture: the export does not follow it


def _serve_config(monkeypatch, *flags: str) -> PoolServerConfig:
    """The PoolServerConfig `clink-pool serve FLAGS` builds, captured by a PoolServer that refuses to start."""
    seen = []

    def capture(config):
        seen.append(config)
        raise UnavailableError("captured the config; not serving")

    monkeypatch.setattr(pool.server, "PoolServer", capture)
    monkeypatch.setattr(clink.cli.pool, "setup_logging", lambda level, output: None)  # keep pytest's log handlers
    result = CliRunner().invoke(clink.cli.pool.cli, ["serve", "--store", "file:///nonexistent-unused", *flags])
    assert result.exit_code == EXIT_UNAVAILABLE, result.output
    return seen[0]


def test_serve_has_an_http_host_of_its_own(monkeypatch):
    config = _serve_config(monkeypatch, "--http-port", "0", "--metrics-host", "0.0.0.0")
    assert (config.http_host, config.metrics_host) == ("127.0.0.1", "0.0.0.0")
    config = _serve_config(monkeypatch, "--http-port", "0", "--http-host", "::1", "--metrics-host", "127.0.0.1")
    assert (config.http_host, config.metrics_host) == ("::1", "127.0.0.1")
