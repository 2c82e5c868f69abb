"""Findings of the fresh-eye review of issue 13 on the pool, store and clink-pool side (docs: /work/notes/review13.md).

Each test names its finding; each would fail before its fix. Errors are one line, the exit code comes from the shared
table (clink/cli/common.py), and nothing is written on error.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from clink.cli.common import EXIT_CONFLICT, EXIT_MEANINGS
from clink.cli.pool import cli as pool_cli
from clink.cli.state import cli as state_cli
from pool.core import PoolCore
from store.local import FileStore
from tests.lifecycle_helpers import build_job


def run_pool(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(pool_cli, list(args), env=env, catch_exceptions=False)


def error_line(result: Result) -> str:
    """The one line stderr holds."""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one error line, got: {result.stderr!r}"
    assert lines[0].startswith("clink-pool: error: "), lines[0]
    return lines[0]


def tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.fixture
def job_store(tmp_path: Path) -> tuple[FileStore, str]:
    """A local store holding job 'orders' with three checkpoints."""
    store = FileStore(tmp_path / "pool")
    build_job(PoolCore(store), "orders", 3, random.Random(13))
    return store, (tmp_path / "pool").as_uri()


# --- 14. "already exists" is a conflict of its own, and says what to do ---------------------------------------------


def test_14_the_exit_table_says_4_covers_an_existing_name_too():
    meaning = dict(EXIT_MEANINGS)[EXIT_CONFLICT]
    assert "exists already" in meaning and "concurrent change won" in meaning
    for cli in (state_cli, pool_cli):
        text = " ".join(CliRunner().invoke(cli, ["--help"]).output.split())
        assert f"{EXIT_CONFLICT} {meaning}" in text


def test_14_a_taken_savepoint_name_says_choose_another_name(job_store):
    store, uri = job_store
    assert run_pool("savepoint", "--store", uri, "orders", "nightly").exit_code == 0
    before = tree(store.root)
    again = run_pool("savepoint", "--store", uri, "orders", "nightly")
    assert again.exit_code == EXIT_CONFLICT and again.stdout == ""
    line = error_line(again)
    assert "savepoint 'nightly' already exists" in line and "another name" in line
    assert tree(store.root) == before


def test_14_a_restore_into_an_existing_job_says_give_a_new_job_name(job_store):
    store, uri = job_store
    assert run_pool("savepoint", "--store", uri, "orders", "nightly").exit_code == 0
    before = tree(store.root)
    taken = run_pool("restore", "--store", uri, "orders", "--from-savepoint", "nightly")
    assert taken.exit_code == EXIT_CONFLICT and taken.stdout == ""
    line = error_line(taken)
    assert "job orders already exists" in line and "new job name" in line
    assert tree(store.root) == before


# --- 7. gc of a job that is not there is "not found", not "deleted 0" ------------------------------------------------


@pytest.mark.parametrize("extra", [[], ["--dry-run"], ["--keep-last", "1"]], ids=["gc", "dry-run", "keep-last"])
def test_7_gc_of_an_unknown_job_is_not_found(job_store, extra):
    from clink.cli.common import EXIT_NOT_FOUND

    store, uri = job_store
    before = tree(store.root)
    result = run_pool("gc", "--store", uri, "--job", "nope", "--min-age", "0s", *extra)
    assert result.exit_code == EXIT_NOT_FOUND and result.stdout == ""
    assert "job nope not found" in error_line(result)
    assert tree(store.root) == before
    assert run_pool("gc", "--store", uri, "--job", "orders", "--min-age", "0s").exit_code == 0  # a known job still runs


# --- 12. unpin says when there is nothing to unpin, and takes 0 = latest as pin does -------------------------------


def test_12_unpin_twice_says_the_second_time_there_is_no_pin_to_remove(job_store):
    import json

    _, uri = job_store
    assert run_pool("pin", "--store", uri, "orders", "2", "backfill").exit_code == 0
    first = run_pool("unpin", "--store", uri, "orders", "2", "backfill", "-o", "json")
    assert first.exit_code == 0 and json.loads(first.stdout)["unpinned"] is True
    again = run_pool("unpin", "--store", uri, "orders", "2", "backfill")
    assert again.exit_code == 0 and again.stderr == ""
    assert "no pin of checkpoint 2 of orders held by backfill to remove" in again.stdout
    assert not again.stdout.startswith("unpinned")
    doc = json.loads(run_pool("unpin", "--store", uri, "orders", "2", "backfill", "-o", "json").stdout)
    assert doc["unpinned"] is False and doc["pinned_checkpoints"] == []


def test_12_unpin_of_the_wrong_checkpoint_names_the_one_the_holder_pins(job_store):
    _, uri = job_store
    assert run_pool("pin", "--store", uri, "orders", "1", "backfill").exit_code == 0
    wrong = run_pool("unpin", "--store", uri, "orders", "2", "backfill")
    assert wrong.exit_code == 0 and "no pin of checkpoint 2" in wrong.stdout and "backfill pins checkpoint 1" in wrong.stdout


def test_12_unpin_takes_0_for_the_latest_checkpoint_as_pin_does(job_store):
    import json

    store, uri = job_store
    pinned = json.loads(run_pool("pin", "--store", uri, "orders", "0", "reader", "-o", "json").stdout)
    assert pinned["checkpoint_id"] == 3
    result = run_pool("unpin", "--store", uri, "orders", "0", "reader", "-o", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"job": "orders", "checkpoint_id": 3, "holder": "reader", "unpinned": True}
    assert not list(store.list("jobs/orders/pins/"))


# --- 9. --listen advice: a port alone, a URL ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "listen, wanted, unwanted",
    [
        ("7420", "e.g. 127.0.0.1:7420", "7420:7420"),
        ("http://127.0.0.1:7421", "takes no scheme", "brackets"),
        ("grpc://127.0.0.1:7421/", "write HOST:PORT, e.g. 127.0.0.1:7421", "brackets"),
        ("http://[::1]:7421", "e.g. [::1]:7421", "brackets, e.g."),
    ],
)
def test_9_listen_advice_suggests_what_to_write(monkeypatch, tmp_path: Path, listen: str, wanted: str, unwanted: str):
    import clink.cli.pool
    import pool.server

    started: list[object] = []
    monkeypatch.setattr(pool.server, "PoolServer", lambda *a, **k: started.append(a))
    monkeypatch.setattr(clink.cli.pool, "setup_logging", lambda level, output: None)
    store = tmp_path / "store"
    result = run_pool("serve", "--store", store.as_uri(), "--listen", listen)
    assert result.exit_code == 2 and result.stdout == ""
    line = error_line(result)
    assert "--listen" in line and wanted in line and unwanted not in line
    assert started == [] and not store.exists()


# --- 13. one port for two of serve's listeners is a usage error; busy ports say so in the same words ------------------


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "flags, first, second",
    [
        (["--listen", "127.0.0.1:{p}", "--http-port", "{p}"], "--listen", "--http-port"),
        (["--listen", "127.0.0.1:0", "--metrics-port", "{p}", "--http-port", "{p}"], "--metrics-port", "--http-port"),
        (["--listen", "127.0.0.1:{p}", "--metrics-port", "{p}"], "--listen", "--metrics-port"),
        (["--listen", "0.0.0.0:{p}", "--http-port", "{p}", "--http-host", "127.0.0.1"], "--listen", "--http-port"),
    ],
    ids=["listen-http", "metrics-http", "listen-metrics", "wildcard"],
)
def test_13_one_port_for_two_listeners_is_a_usage_error_naming_both_flags(monkeypatch, tmp_path: Path, flags, first, second):
    import clink.cli.pool
    import pool.server

    port = _free_port()
    started: list[object] = []
    monkeypatch.setattr(pool.server, "PoolServer", lambda *a, **k: started.append(a))
    monkeypatch.setattr(clink.cli.pool, "setup_logging", lambda level, output: None)
    store = tmp_path / "store"
    result = run_pool("serve", "--store", store.as_uri(), *[f.format(p=port) for f in flags])
    assert result.exit_code == 2 and result.stdout == ""
    line = error_line(result)
    assert first in line and second in line and str(port) in line and "already in use" not in line
    assert started == [] and not store.exists()


def test_13_one_port_on_two_distinct_addresses_is_no_clash():
    from pool.server import PoolServerConfig, port_clashes

    config = PoolServerConfig(listen="127.0.0.1:0", metrics_port=9464, metrics_host="127.0.0.1", http_port=9464, http_host="127.0.0.2")
    assert port_clashes(config) == []
    assert port_clashes(PoolServerConfig(listen="127.0.0.1:0", metrics_port=0, http_port=0)) == []  # 0: a free port each


def test_13_the_server_refuses_one_port_for_two_listeners_too():
    from pool.server import PoolServer, PoolServerConfig
    from snapshot.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="metrics_port and http_port both name port 9464"):
        PoolServer(PoolServerConfig(listen="127.0.0.1:0", metrics_port=9464, http_port=9464))


@pytest.mark.parametrize("which", ["listen", "metrics_port", "http_port"])
def test_13_a_busy_port_says_so_in_the_same_words_for_every_listener(tmp_path: Path, which: str):
    import socket

    from pool.server import PoolServer, PoolServerConfig
    from snapshot.errors import UnavailableError

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ports = {"listen": "127.0.0.1:0", which: f"127.0.0.1:{port}" if which == "listen" else port}
        server = PoolServer(PoolServerConfig(store_uri=(tmp_path / "s").as_uri(), grace_seconds=0, **ports))
        with pytest.raises(UnavailableError) as refused:
            server.start()
    text = str(refused.value)
    assert text.startswith(f"cannot listen on 127.0.0.1:{port}")
    assert "address already in use (is another pool serving there?)" in text and "Address" not in text
    assert not (tmp_path / "s").exists()


# --- 3. --s3-endpoint-url without a scheme is a usage error saying what to write ------------------------------------


@pytest.mark.parametrize("cli_name", ["clink-pool", "clink"])
@pytest.mark.parametrize("given", ["flag", "env"])
def test_3_an_endpoint_without_a_scheme_is_a_usage_error(tmp_path: Path, cli_name: str, given: str):
    cli = pool_cli if cli_name == "clink-pool" else state_cli
    command = ["ls", "--store", "s3://bucket/pool"] if cli_name == "clink-pool" else ["state-cat", "s3://bucket/pool/jobs/j/chk-1"]
    flag = ["--s3-endpoint-url", "127.0.0.1:5055"] if given == "flag" else []
    env = {"AWS_ENDPOINT_URL": "127.0.0.1:5055", "AWS_ENDPOINT_URL_S3": ""} if given == "env" else None
    result = CliRunner().invoke(cli, [*command, *flag], env=env, catch_exceptions=False)
    assert result.exit_code == 2 and result.stdout == ""
    line = result.stderr.strip()
    assert "\n" not in line and line.startswith(f"{cli_name}: error: ")
    assert "has no scheme; write http://127.0.0.1:5055" in line and "internal error" not in line


# --- 5. missing S3 credentials: the same exit code and the same hint in every command ------------------------------


def _no_credentials_env(tmp_path: Path) -> dict[str, str | None]:
    """Unset every AWS variable boto3 reads credentials from, and point its files at nothing (for CliRunner's env)."""
    import os

    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("AWS_")}
    env.update(
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "no-aws" / "credentials"),
        AWS_CONFIG_FILE=str(tmp_path / "no-aws" / "config"),
        AWS_EC2_METADATA_DISABLED="true",
        AWS_REGION="us-east-1",
    )
    return env


@pytest.mark.parametrize(
    "command",
    [
        ["clink-pool", "serve", "--listen", "127.0.0.1:0"],
        ["clink-pool", "ls"],
        ["clink-pool", "ls", "orders"],
        ["clink-pool", "inspect", "orders"],
        ["clink-pool", "gc", "--dry-run"],
        ["clink", "state-cat", "{store}/jobs/orders/chk-1"],
    ],
    ids=lambda c: "-".join(c[:3]),
)
def test_5_missing_credentials_exit_6_with_the_same_hint_everywhere(monkeypatch, make_s3_store, moto_endpoint, tmp_path, command):
    import clink.cli.pool
    from clink.cli.common import EXIT_DENIED

    monkeypatch.setattr(clink.cli.pool, "setup_logging", lambda level, output: None)  # keep pytest's log handlers
    store = make_s3_store()  # the bucket exists: only the credentials are missing
    prog, *args = [part.format(store=store.uri) for part in command]
    cli = pool_cli if prog == "clink-pool" else state_cli
    if prog == "clink-pool":
        args += ["--store", store.uri]
    env = _no_credentials_env(tmp_path)
    result = CliRunner().invoke(cli, [*args, "--s3-endpoint-url", moto_endpoint], env=env, catch_exceptions=False)
    assert result.exit_code == EXIT_DENIED, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), result.stderr
    line = lines[0]
    assert "no credentials found" in line and moto_endpoint in line and store.uri in line
    assert "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, else boto3's default chain" in line
    assert result.stdout == "" and list(store.list()) == []


# --- 1. an S3 endpoint that accepts connections and never answers is named within seconds -----------------------------

SILENT_BOUND_S = 12  # the probe waits StoreConfig.probe_timeout_s (5 s), once; before the fix it waited 30 s x 6 attempts


@pytest.mark.parametrize(
    "command",
    [
        ["clink-pool", "serve", "--listen", "127.0.0.1:0"],
        ["clink-pool", "serve", "--listen", "127.0.0.1:0", "--create-bucket"],
        ["clink-pool", "ls"],
        ["clink", "state-cat", "s3://bucket/pool/jobs/orders/chk-1"],
    ],
    ids=["serve", "serve-create-bucket", "ls", "state-cat"],
)
def test_1_a_silent_endpoint_fails_within_seconds_naming_it(monkeypatch, silent_endpoint: str, command: list[str]):
    import time

    import clink.cli.pool
    from clink.cli.common import EXIT_UNAVAILABLE

    monkeypatch.setattr(clink.cli.pool, "setup_logging", lambda level, output: None)  # keep pytest's log handlers
    prog, *args = command
    if prog == "clink-pool":
        args += ["--store", "s3://bucket/pool"]
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}
    started = time.monotonic()
    result = CliRunner().invoke(
        pool_cli if prog == "clink-pool" else state_cli, [*args, "--s3-endpoint-url", silent_endpoint], env=env, catch_exceptions=False
    )
    took = time.monotonic() - started
    assert result.exit_code == EXIT_UNAVAILABLE, (result.stdout, result.stderr)
    assert took < SILENT_BOUND_S, took
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), result.stderr
    assert f"S3 endpoint {silent_endpoint} did not answer within 5 s" in lines[0] and "--s3-endpoint-url" in lines[0]
    assert result.stdout == ""


# --- 4. a prefix or folder that holds no store is "no such store", a new store a pool serves is an empty one -------------


@pytest.mark.parametrize(
    "command",
    [["ls"], ["ls", "orders"], ["inspect", "orders"], ["gc", "--dry-run"], ["pin", "orders", "0", "h"], ["unpin", "orders", "1", "h"]],
    ids=lambda c: "-".join(c),
)
@pytest.mark.parametrize("folder", ["empty", "other-files"])
def test_4_a_folder_that_holds_no_store_is_no_such_store(tmp_path: Path, command: list[str], folder: str):
    from clink.cli.common import EXIT_NOT_FOUND

    root = tmp_path / "not-a-store"
    root.mkdir()
    if folder == "other-files":
        (root / "notes.txt").write_text("someone else's folder")
        (root / "photos").mkdir()
        (root / "photos" / "cat.jpg").write_bytes(b"\xff\xd8")
    before = tree(tmp_path)
    result = run_pool(*command, "--store", root.as_uri())
    assert result.exit_code == EXIT_NOT_FOUND and result.stdout == ""
    line = error_line(result)
    assert f"no such store: {root.as_uri()}" in line
    assert ("nothing under it" in line) == (folder == "empty")
    assert tree(tmp_path) == before


def test_4_a_mistyped_s3_prefix_or_a_bucket_root_is_no_such_store(make_s3_store, s3_cli_env, tmp_path):
    from clink.cli.common import EXIT_NOT_FOUND

    store = make_s3_store(prefix="pool")
    build_job(PoolCore(store), "orders", 1, random.Random(4))
    bucket = store.uri.removeprefix("s3://").split("/")[0]
    typo = f"s3://{bucket}/pol"
    for uri, needle in ((typo, "nothing under it"), (f"s3://{bucket}", "no jobs/, savepoints/ or clink-store.json")):
        result = run_pool("ls", "--store", uri, env=s3_cli_env)
        assert result.exit_code == EXIT_NOT_FOUND, result.output
        line = error_line(result)
        assert f"no such store: {uri}" in line and needle in line
    cat = CliRunner().invoke(state_cli, ["state-cat", f"{typo}/jobs/orders/chk-1"], env=s3_cli_env, catch_exceptions=False)
    assert cat.exit_code == EXIT_NOT_FOUND and f"no such store: {typo} (nothing under it" in cat.stderr
    good = run_pool("ls", "--store", store.uri, "-o", "json", env=s3_cli_env)  # the real store, with no marker, still reads
    assert good.exit_code == 0 and '"orders"' in good.stdout


def test_4_a_missing_checkpoint_in_a_real_store_is_still_checkpoint_not_found(job_store):
    from clink.cli.common import EXIT_NOT_FOUND

    store, _ = job_store
    cat = CliRunner().invoke(state_cli, ["state-cat", f"{store.root}/jobs/orders/chk-9"], catch_exceptions=False)
    assert cat.exit_code == EXIT_NOT_FOUND and "checkpoint 9" in cat.stderr and "no such store" not in cat.stderr


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_4_a_new_store_a_pool_serves_lists_as_empty(tmp_path: Path, make_s3_store, s3_config, s3_cli_env, kind: str):
    import json

    from pool.server import PoolServer, PoolServerConfig
    from store.layout import STORE_MARKER

    if kind == "file":
        uri, env, config = (tmp_path / "new-store").as_uri(), None, None
    else:
        uri, env, config = make_s3_store(prefix="fresh").uri, s3_cli_env, s3_config
    assert run_pool("ls", "--store", uri, env=env).exit_code == 3  # nothing there yet: no such store
    extra = {"store": config} if config is not None else {}
    PoolServer(PoolServerConfig(store_uri=uri, listen="127.0.0.1:0", grace_seconds=0, **extra)).start().stop(0)
    listed = run_pool("ls", "--store", uri, "-o", "json", env=env)
    assert listed.exit_code == 0, listed.output
    assert json.loads(listed.stdout) == {"jobs": [], "savepoints": []}
    assert run_pool("ls", "--store", uri, env=env).stdout.strip() == "(empty store)"
    if kind == "file":
        marker = json.loads((tmp_path / "new-store" / STORE_MARKER).read_text())
        assert marker["format"] == "clink.store" and marker["version"] == 1
    assert run_pool("gc", "--store", uri, "--min-age", "0s", env=env).exit_code == 0  # gc leaves the marker alone
    assert run_pool("ls", "--store", uri, env=env).exit_code == 0


def test_4_serving_a_store_that_holds_jobs_writes_no_marker(job_store):
    from pool.server import PoolServer, PoolServerConfig
    from store.layout import STORE_MARKER

    store, uri = job_store
    PoolServer(PoolServerConfig(store_uri=uri, listen="127.0.0.1:0", grace_seconds=0)).start().stop(0)
    assert not store.exists(STORE_MARKER)


# --- 11. a job whose workers connected but never checkpointed says so ------------------------------------------------


def test_11_ls_of_a_job_with_writers_only_says_no_checkpoint_yet_and_who_connected(tmp_path: Path):
    import json

    from pool.domain import KeyGroupRange

    store = FileStore(tmp_path / "pool")
    core = PoolCore(store)
    build_job(core, "orders", 1, random.Random(11))
    epoch, _ = core.acquire_writer("nojob", KeyGroupRange(0, 63))  # a worker connected to a mistyped job and failed its restore
    uri = (tmp_path / "pool").as_uri()
    listed = json.loads(run_pool("ls", "--store", uri, "-o", "json").stdout)
    assert listed["jobs"] == ["nojob", "orders"]
    result = run_pool("ls", "--store", uri, "nojob")
    assert result.exit_code == 0, result.output
    assert "nojob: no checkpoint yet" in result.stdout and f"0-63 (epoch {epoch})" in result.stdout
    doc = json.loads(run_pool("ls", "--store", uri, "nojob", "-o", "json").stdout)
    assert doc["checkpoints"] == [] and doc["writers"] == [{"kg_lo": 0, "kg_hi": 63, "epoch": epoch}]
    # a job with checkpoints keeps its table: the writers line is only for a job that holds no state yet
    assert "no checkpoint yet" not in run_pool("ls", "--store", uri, "orders").stdout
