"""The pool's HTTP export read by pyarrow.ipc.open_stream over urllib: routes, filters, status codes, concurrency, the serve hook."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pyarrow.ipc as ipc
import pytest

import snapshot as s
from clink.cli.common import EXIT_NOT_FOUND
from pool.core import PoolCore
from pool.domain import PoolConfig
from pool.http_export import ARROW_STREAM_TYPE, parse_request, start_http_export
from store.manifest import job_prefix, metadata_key
from tests.cli_fixtures import OP_IDS, STATE_VERSIONS, commit_checkpoints, generated_table, rows_of

JOB = "orders"
TIMEOUT = 30


@pytest.fixture
def served(store):
    """Two checkpoints of JOB in the (file or S3) store, served by an HTTP export over a PoolCore with small scan chunks."""
    t1, t2 = generated_table(51, keyed_rows=300), generated_table(52, keyed_rows=500, operator_rows=4)
    commit_checkpoints(store, JOB, [t1, t2])
    core = PoolCore(store, PoolConfig(scan_chunk_bytes=4096))
    export = start_http_export(core, "127.0.0.1", 0)
    try:
        yield export, store, t1, t2
    finally:
        export.stop()


def _get(url: str):
    return urllib.request.urlopen(url, timeout=TIMEOUT)


def _status(url: str, method: str = "GET") -> tuple[int, str]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=TIMEOUT) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_state_arrow_streams_each_checkpoint(served) -> None:
    export, _, t1, t2 = served
    for cid, table in ((1, t1), (2, t2)):
        with _get(f"{export.url}/jobs/{JOB}/state.arrow?checkpoint={cid}") as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"] == ARROW_STREAM_TYPE
            assert resp.headers["X-Clink-Checkpoint"] == str(cid)
            reader = ipc.open_stream(resp)
            got = reader.read_all()
        assert rows_of(got) == rows_of(table)
        assert s.StateVersionMap.unpack(reader.schema.metadata[b"clink.state_versions"]) == STATE_VERSIONS
        assert reader.schema.metadata[b"clink.format_version"] == b"1"


def test_latest_checkpoint_and_filters(served) -> None:
    export, _, _, t2 = served
    with _get(f"{export.url}/jobs/{JOB}/state.arrow") as resp:
        assert resp.headers["X-Clink-Checkpoint"] == "2"
        assert rows_of(ipc.open_stream(resp).read_all()) == rows_of(t2)
    with _get(f"{export.url}/jobs/{JOB}/state.arrow?checkpoint=2&key_groups=40-80") as resp:
        got = ipc.open_stream(resp).read_all()
    assert rows_of(got) == rows_of(s.filter_key_groups(t2, 40, 80))
    op = OP_IDS["window"]
    with _get(f"{export.url}/jobs/{JOB}/state.arrow?key_groups=0-127&op_id={op}") as resp:
        got = ipc.open_stream(resp).read_all()
    assert rows_of(got) == {k: v for k, v in rows_of(t2).items() if k[0] == op}


@pytest.mark.parametrize(
    "path, status, needle",
    [
        ("/jobs/nobody/state.arrow", 404, "nobody"),
        (f"/jobs/{JOB}/state.arrow?checkpoint=9", 404, "checkpoint 9"),
        ("/nothing/here", 404, "no route"),
        (f"/jobs/{JOB}/state.arrow?checkpoint=abc", 400, "checkpoint"),
        (f"/jobs/{JOB}/state.arrow?checkpoint=-1", 400, "checkpoint id"),
        (f"/jobs/{JOB}/state.arrow?key_groups=9-3", 400, "key_groups"),
        (f"/jobs/{JOB}/state.arrow?key_groups=0-128", 400, "key_groups"),
        (f"/jobs/{JOB}/state.arrow?key_groups=x", 400, "LO-HI"),
        (f"/jobs/{JOB}/state.arrow?op_id=-1", 400, "op_id"),
        (f"/jobs/{JOB}/state.arrow?checkpoint=1&checkpoint=2", 400, "2 times"),
        (f"/jobs/{JOB}/state.arrow?colour=red", 400, "unknown parameter"),
    ],
)
def test_errors_map_to_status_codes_with_one_line(served, path: str, status: int, needle: str) -> None:
    export, _, _, _ = served
    code, body = _status(export.url + path)
    assert code == status
    assert needle in body and body.count("\n") == 1


def test_post_is_405_and_healthz_is_ok(served) -> None:
    export, _, _, _ = served
    assert _status(f"{export.url}/jobs/{JOB}/state.arrow", "POST")[0] == 405
    assert _status(f"{export.url}/healthz") == (200, "ok\n")


def test_corrupt_data_is_a_typed_502_line_and_the_server_stays_up(served) -> None:
    export, store, _, _ = served
    manifest = json.loads(store.get(metadata_key(JOB, 2)))
    victim = manifest["files"][-1]["path"]
    data = bytearray(store.get(job_prefix(JOB) + victim))
    data[10] ^= 0xFF
    store.put(job_prefix(JOB) + victim, bytes(data))
    code, body = _status(f"{export.url}/jobs/{JOB}/state.arrow?checkpoint=2")
    assert code == 502 and victim in body and body.count("\n") == 1  # the store gave damaged data: a bad gateway, naming the file
    assert _status(f"{export.url}/healthz")[0] == 200


def test_concurrent_readers_each_get_the_whole_stream(served) -> None:
    export, _, _, t2 = served
    results: list[object] = [None] * 4  # the export's default limit of concurrent streams (more get 503: tests/system/test_abuse.py)

    def fetch(i: int) -> None:
        try:
            with _get(f"{export.url}/jobs/{JOB}/state.arrow?checkpoint=2") as resp:
                results[i] = rows_of(ipc.open_stream(resp).read_all())
        except Exception as exc:  # noqa: BLE001 - reported by the assert below
            results[i] = exc

    threads = [threading.Thread(target=fetch, args=(i,)) for i in range(len(results))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=TIMEOUT)
    assert all(r == rows_of(t2) for r in results), [type(r) for r in results]


def test_parse_request_unit() -> None:
    req = parse_request("/jobs/a%2Fb/state.arrow?checkpoint=3&key_groups=1-2&op_id=5&op_id=6")
    assert (req.job, req.checkpoint_id, (req.key_groups.lo, req.key_groups.hi), req.op_ids) == ("a/b", 3, (1, 2), (5, 6))
    assert parse_request("/jobs/x/state.arrow?checkpoint=latest").checkpoint_id == 0
    assert parse_request("/jobs/x/other") is None


def test_clink_pool_serve_http_port_hook(tmp_path: Path) -> None:
    """The console script with --http-port serves the route; the ready line names the bound port."""
    from store.local import FileStore

    table = generated_table(61, keyed_rows=120)
    commit_checkpoints(FileStore(tmp_path / "pool"), JOB, [table])
    exe = shutil.which("clink-pool", path=os.path.dirname(sys.executable))
    assert exe, "clink-pool console script not installed: run pip install -e ."
    proc = subprocess.Popen(
        [exe, "serve", "--store", (tmp_path / "pool").as_uri(), "--listen", "127.0.0.1:0", "--http-port", "0", "--output", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        ready = json.loads(line)
        assert ready["http_port"]
        with _get(f"http://127.0.0.1:{ready['http_port']}/jobs/{JOB}/state.arrow") as resp:
            assert rows_of(ipc.open_stream(resp).read_all()) == rows_of(table)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
    assert proc.returncode == 0


def test_clink_reads_the_http_route_as_a_source(served, tmp_path: Path) -> None:
    from tests.cli_fixtures import one_line_error, run

    export, store, t1, t2 = served
    url = f"{export.url}/jobs/{JOB}/state.arrow"
    result = run(["state-cat", url, "--limit", "0", "-o", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["total_rows"] == t2.num_rows
    pre = ["--s3-endpoint-url", store.config.endpoint_url] if store.uri.startswith("s3://") else []
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    same = run([*pre, "state-diff", f"{url}?checkpoint=1", f"{store.uri}/jobs/{JOB}/chk-1"], env=env)
    assert same.exit_code == 0, same.output
    missing = run(["state-cat", f"{export.url}/jobs/nobody/state.arrow"])
    assert missing.exit_code == EXIT_NOT_FOUND
    line = one_line_error(missing)
    assert "HTTP 404" in line and "nobody" in line


def test_a_404_names_the_job_and_the_pools_store_not_its_location(store) -> None:
    """Clients never learn the bucket or directory (the operator's); the message still reads as a sentence."""
    from pool.errors import store_redactor

    commit_checkpoints(store, JOB, [generated_table(51, keyed_rows=10)])
    export = start_http_export(PoolCore(store), "127.0.0.1", 0, redact=store_redactor(store.uri))
    try:
        code, body = _status(f"{export.url}/jobs/nobody/state.arrow")
    finally:
        export.stop()
    location = store.uri.split("://", 1)[1].rstrip("/")
    assert code == 404 and "nobody" in body and "the pool's store" in body, body
    assert location not in body and "<store>" not in body


@pytest.mark.parametrize("uri", ["file:///srv/pool", "s3://bkt/prefix"])
def test_the_redactor_names_keys_relative_to_the_store(uri: str) -> None:
    from pool.errors import store_redactor

    redact = store_redactor(uri)
    assert redact(f"job x not found in {uri}") == "job x not found in the pool's store"
    assert redact(f"checksum mismatch in {uri}/jobs/x/data/f1") == "checksum mismatch in jobs/x/data/f1"
    if uri.startswith("file://"):
        assert redact("cannot read /srv/pool/jobs/x/writers") == "cannot read jobs/x/writers"


def test_the_export_names_the_operators_uids_in_its_metadata(served) -> None:
    """A reader of the export names operators as a reader of the store does (clink.operators, an additive key)."""
    from tests.cli_fixtures import OPERATOR_PAIRS

    export, _, _, _ = served
    with _get(f"{export.url}/jobs/{JOB}/state.arrow") as resp:
        metadata = ipc.open_stream(resp).schema.metadata
    from snapshot.format import OPERATORS_KEY

    named = json.loads(metadata[OPERATORS_KEY])
    assert named == {str(op): uid for op, uid in OPERATOR_PAIRS if uid} and named
    from click.testing import CliRunner

    from clink.cli.state import cli as state_cli

    shown = CliRunner().invoke(state_cli, ["state-cat", f"{export.url}/jobs/{JOB}/state.arrow", "-o", "json"])
    assert shown.exit_code == 0, shown.output
    assert any(uid in shown.stdout for uid in named.values())
