"""Hostile review of issue 18 (the operating tier): the status page and /api/, job policies and RetainCheckpoints,
`clink-pool serve`'s maintenance flags and policy file, several pool addresses, `clink-pool retain`.

Each xfail(strict=True) test asserts the correct behaviour and fails today because of the defect its reason names;
the plain tests are attacks that held, kept as regressions.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from client.errors import InvalidArgumentError as ClientInvalidArgument
from client.pool_addresses import parse_pool_addresses
from client.pool_client import PoolClient, PoolClientConfig
from clink.cli.common import EXIT_DENIED, EXIT_NOT_FOUND, EXIT_USAGE
from clink.cli.pool import cli
from pool.auth import TokenTable
from pool.job_policy import JobPolicy, job_policy_key, read_job_policy, write_job_policy
from pool.maintenance import MaintenanceConfig
from pool.server import PoolServer, PoolServerConfig
from snapshot.errors import CorruptDataError, NotFoundError, PermissionDeniedError
from store.memory import MemoryStore
from tests.cli_fixtures import one_line_error
from tests.hook_store import HookStore
from tests.lifecycle_helpers import file_job
from tests.review.operating_review_fixtures import SECRET_URI, S3LikeStore, api, build, http_get

JOB = "orders"


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def serve_args(store: Path, *extra: str) -> list[str]:
    return ["--store", str(store), "serve", "--listen", "127.0.0.1:0", *extra]


@pytest.fixture
def pool() -> Iterator[PoolServer]:
    """A pool on loopback (memory store, HTTP port on, no maintenance) holding job orders with 3 checkpoints."""
    config = PoolServerConfig(listen="127.0.0.1:0", http_port=0, grace_seconds=0.2)
    server = PoolServer(config, store=MemoryStore()).start()
    try:
        with PoolClient(server.address) as client:
            build(client, JOB, 3)
        yield server
    finally:
        server.stop(0)


TOKENS = """\
tok-a   job-a   read
tok-aw  job-a   rw
tok-b   job-b   rw
"""


@pytest.fixture
def tokened() -> Iterator[PoolServer]:
    """A pool with tokens (tok-a reads job-a, tok-aw writes it, tok-b owns job-b) and maintenance on (hour-long interval)."""
    maintenance = MaintenanceConfig(interval_s=3600.0)
    config = PoolServerConfig(
        listen="127.0.0.1:0", http_port=0, grace_seconds=0.2, tokens=TokenTable.parse(TOKENS, "tokens.txt"), maintenance=maintenance
    )
    server = PoolServer(config, store=MemoryStore()).start()
    try:
        for job, token in (("job-a", "tok-aw"), ("job-b", "tok-b")):
            with PoolClient(server.address, PoolClientConfig(token=token)) as client:
                build(client, job, 2)
                if job == "job-b":
                    client.pin_checkpoint(job, "holder-of-b-secret", 3600, checkpoint_id=1)
        assert server.maintainer is not None
        server.maintainer.run_once()
        yield server
    finally:
        server.stop(0)


# ==== defects =========================================================================================================


def test_a_policy_file_that_is_not_utf8_is_one_line_naming_the_file_exit_2(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_bytes(b"[maintenance]\nkeep_last = 3\n# caf\xe9 in latin-1\n")
    result = invoke(*serve_args(tmp_path / "pool", "--maintenance-config", str(policy)))
    line = one_line_error(result)
    assert result.exit_code == EXIT_USAGE, (result.exit_code, line)
    assert str(policy) in line and "internal error" not in line
    assert not (tmp_path / "pool").exists()  # refused before the store was opened


def test_serve_keep_last_is_the_depth_retain_now_and_the_effective_policy_use() -> None:
    maintenance = MaintenanceConfig(interval_s=3600.0, keep_last=10)
    config = PoolServerConfig(listen="127.0.0.1:0", grace_seconds=0.2, maintenance=maintenance)
    with PoolServer(config, store=MemoryStore()) as server, PoolClient(server.address) as client:
        build(client, JOB, 6)
        assert client.job_policy_in_force(JOB).effective_keep_last == 10
        run = client.retain_checkpoints(JOB, 0, dry_run=True)
        assert (run.keep_last, run.keep_last_from, run.deleted) == (10, "pool", ())


@pytest.mark.parametrize(
    "path",
    ["/api/jobs?page=" + "1" * 5000, "/status/jobs/orders?per_page=" + "0" * 4999 + "5", "/api/jobs/orders/checkpoints/" + "1" * 5000],
    ids=["page", "per_page", "checkpoint"],
)
def test_numbers_of_thousands_of_digits_get_a_400_naming_them(pool: PoolServer, path: str) -> None:
    assert pool.http_port is not None
    try:
        status, _, body = http_get(pool.http_port, path)
    except http.client.RemoteDisconnected:
        pytest.fail(f"{path[:40]}...: the connection was dropped without an answer")
    assert status == 400, (status, body[:200])


def test_export_key_groups_of_thousands_of_digits_get_a_400(pool: PoolServer) -> None:
    assert pool.http_port is not None
    path = f"/jobs/{JOB}/state.arrow?key_groups={'1' * 5000}-2"
    try:
        status, _, _ = http_get(pool.http_port, path)
    except http.client.RemoteDisconnected:
        pytest.fail("the connection was dropped without an answer")
    assert status == 400


@pytest.mark.parametrize("method", ["OPTIONS", "TRACE"])
def test_options_and_trace_are_a_405_naming_the_methods_allowed(pool: PoolServer, method: str) -> None:
    assert pool.http_port is not None
    for path in ("/", "/api/jobs", f"/api/jobs/{JOB}"):
        status, headers, _ = http_get(pool.http_port, path, method=method)
        assert status == 405, (method, path, status)
        assert "GET" in headers.get("allow", ""), headers


def test_the_status_page_never_shows_the_stores_location() -> None:
    failing = {"on": False}
    store = S3LikeStore(lambda op, key: failing["on"] and op == "list" and key.startswith(f"jobs/{JOB}/"))
    maintenance = MaintenanceConfig(interval_s=3600.0)
    config = PoolServerConfig(listen="127.0.0.1:0", http_port=0, grace_seconds=0.2, maintenance=maintenance, store_retry=None)
    with PoolServer(config, store=store) as server, PoolClient(server.address) as client:
        build(client, JOB, 2)
        assert server.maintainer is not None and server.http_port is not None
        failing["on"] = True  # the bucket starts failing this job's listings
        server.maintainer.run_once()
        seen = {}
        for path in ("/api/jobs", "/", f"/api/jobs/{JOB}", "/api/maintenance", f"/status/jobs/{JOB}"):
            seen[path] = http_get(server.http_port, path)
        failing["on"] = False
        seen["/api/jobs/orders (store back)"] = http_get(server.http_port, f"/api/jobs/{JOB}")
    bucket = SECRET_URI.split("/")[2].encode()
    leaks = [path for path, (_, _, body) in seen.items() if bucket in body]
    assert any(b"the pool's store" in body or b"InternalError" in body for _, _, body in seen.values())  # the failure is shown
    assert leaks == [], f"the store's bucket appears in {leaks}"


def test_a_policy_beyond_int64_is_refused_and_the_pool_keeps_answering(tmp_path: Path) -> None:
    store, uri, _ = file_job(tmp_path / "pool", 3)
    result = invoke("retain", JOB, "--compact-max-delta-mb", "10000000000000", "--store", uri)
    assert result.exit_code == EXIT_USAGE, (result.exit_code, result.output)
    assert read_job_policy(store, JOB) is None  # nothing written
    old_build = {"format": "clink.job-policy", "version": 1, "job": JOB, "keep_last": 10**20, "maintenance": True, "updated_ms": 1}
    store.put(job_policy_key(JOB), json.dumps(old_build).encode())  # what an older build, or a hand edit, may have left
    config = PoolServerConfig(listen="127.0.0.1:0", grace_seconds=0.2)
    with PoolServer(config, store=store) as server, PoolClient(server.address) as client:
        try:  # refused as damaged data naming the object (CorruptDataError), never INTERNAL
            client.job_policy_in_force(JOB)
            pytest.fail("a keep_last of 10**20 was read back as a policy")
        except CorruptDataError as exc:
            assert job_policy_key(JOB) in str(exc) and "keep_last" in str(exc), exc
        assert server.maintainer is None


def test_two_retain_settings_at_once_keep_both(tmp_path: Path) -> None:
    inner, uri, _ = file_job(tmp_path / "pool", 3)
    write_job_policy(inner, JOB, JobPolicy(keep_last=3))
    store = HookStore(inner)

    def other_client_sets_layers() -> None:  # another operator's `retain orders --compact-max-layers 4`, between our two calls
        write_job_policy(inner, JOB, JobPolicy(keep_last=3, compact_max_layers=4))

    store.on("get", job_policy_key(JOB), other_client_sets_layers, when="after")
    config = PoolServerConfig(listen="127.0.0.1:0", grace_seconds=0.2)
    with PoolServer(config, store=store) as server:
        result = invoke("retain", JOB, "--keep-last", "5", "--pool", server.address)
    stored = read_job_policy(inner, JOB)
    assert stored is not None
    if result.exit_code == 0:  # it said it set keep_last 5 and kept the rest: then the other client's setting is there
        assert (stored.keep_last, stored.compact_max_layers) == (5, 4), stored
    else:  # or it refused as a conflict and changed nothing
        assert (stored.keep_last, stored.compact_max_layers) == (3, 4), stored


# ==== attacks that held ===============================================================================================


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (b"[maintenance]\nkeep_lats = 3\n", "keep_lats"),
        (b"[maintenance]\nkeep_last = '3'\n", "keep_last"),
        (b"[maintenance]\nkeep_last = 0\n", "keep_last"),
        (b"[maintenance]\n[maintenance.sub]\nx = 1\n", "sub"),
        (b"[maintenance\n", "not TOML"),
        (b"maintenance = 3\n", "maintenance"),
        (b"[other]\nx = 1\n", "other"),
        (b"[maintenance]\ninterval = inf\n", "interval"),
        (b"[maintenance]\ninterval = 'soon'\n", "interval"),
        (b"[maintenance]\ncompact_max_delta_bytes = 1.5\n", "compact_max_delta_bytes"),
        (b"[maintenance]\nenabled = 'yes'\n", "enabled"),
    ],
)
def test_a_bad_policy_file_is_one_line_naming_the_key_exit_2_before_anything_binds(tmp_path: Path, body: bytes, named: str) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_bytes(body)
    for mode in ("on", "off"):  # a file is checked even with maintenance off
        result = invoke(*serve_args(tmp_path / "pool", "--maintenance", mode, "--maintenance-config", str(policy)))
        line = one_line_error(result)
        assert result.exit_code == EXIT_USAGE and named in line, (mode, result.exit_code, line)
    assert not (tmp_path / "pool").exists()


def test_a_policy_file_that_is_a_directory_or_missing_is_exit_2(tmp_path: Path) -> None:
    (tmp_path / "dir.toml").mkdir()
    for path in (tmp_path / "dir.toml", tmp_path / "missing.toml"):
        result = invoke(*serve_args(tmp_path / "pool", "--maintenance-config", str(path)))
        line = one_line_error(result)
        assert result.exit_code == EXIT_USAGE and str(path) in line, line


def test_serve_help_teaches_the_maintenance_options() -> None:
    result = invoke("serve", "--help")
    assert result.exit_code == 0
    for flag in ("--maintenance [on|off]", "--maintenance-config", "--maintenance-interval", "--keep-last", "--gc-min-age"):
        assert flag in result.stdout, flag


def test_a_token_of_one_job_sees_nothing_of_another_on_the_status_page(tokened: PoolServer) -> None:
    port = tokened.http_port
    assert port is not None
    for path in ("/api/jobs", "/", "/api/maintenance", "/api", "/api/jobs/job-a", "/status/jobs/job-a"):
        status, _, body = http_get(port, path, "tok-a")
        assert status == 200, (path, status)
        assert b"job-b" not in body and b"holder-of-b-secret" not in body, path
    assert sorted(api(port, "/api/maintenance", "tok-a")["jobs"]) == ["job-a"]
    for path in ("/api/jobs/job-b", "/status/jobs/job-b", "/api/jobs/job-b/checkpoints/1", "/api/jobs/job-%62", "/api/jobs/job-b/"):
        status, _, body = http_get(port, path, "tok-a")
        assert status == 403 and b"holder-of-b-secret" not in body, (path, status)
    # a job that does not exist is 403 to a token without access to it, as one that does: no probing for names
    assert http_get(port, "/api/jobs/job-zz", "tok-a")[0] == http_get(port, "/api/jobs/job-b", "tok-a")[0] == 403
    for token in (None, "nope", "tok-aX"):
        assert http_get(port, "/api/jobs", token)[0] == 401, token


def test_path_tricks_get_a_clear_4xx(pool: PoolServer) -> None:
    port = pool.http_port
    assert port is not None
    cases = {
        "/api/jobs/%2e%2e": 400,
        "/api/jobs/a%2Fb": 400,
        "/api/jobs/%00": 400,
        "/api/jobs/" + "x" * 5000: 400,
        "/api/jobs/orders/checkpoints/0": 400,
        "/api/jobs/orders/checkpoints/-1": 400,
        "/api/jobs/orders/checkpoints/99999999999999999999": 400,
        "/api/jobs?page=0": 400,
        "/api/jobs?page=-1": 400,
        "/api/jobs?per_page=201": 400,
        "/api/jobs?page=1&page=2": 400,
        "/api/jobs?x=1": 400,
        "/api/jobs/orders/../orders": 404,
        "/api/jobs/orders/checkpoints/1/x": 404,
        "/status": 404,
        "/api/jobs/nope": 404,
        "/api/jobs/orders/checkpoints/77": 404,
    }
    for path, want in cases.items():
        status, headers, body = http_get(port, path)
        assert status == want, (path[:60], status, body[:200])
        if path.startswith("/api"):
            assert json.loads(body)["error"]["status"] == want
        assert headers.get("cache-control") == "no-store"
    assert api(port, "/api/jobs?page=1000000&per_page=200")["jobs"] == []
    assert http_get(port, "//api/jobs")[0] == 200  # the stdlib folds leading slashes: the same page, the same rules


def test_head_answers_headers_only_and_post_is_405(pool: PoolServer) -> None:
    port = pool.http_port
    assert port is not None
    status, headers, body = http_get(port, f"/api/jobs/{JOB}", method="HEAD")
    assert status == 200 and body == b"" and int(headers["content-length"]) > 0
    status, _, body = http_get(port, "/api/jobs", method="POST")
    assert status == 405 and b"GET" in body


def test_retention_rpcs_respect_tokens_and_name_no_store(tokened: PoolServer) -> None:
    with PoolClient(tokened.address, PoolClientConfig(token="tok-a")) as reader:
        assert reader.job_policy_in_force("job-a").stored is False
        with pytest.raises(PermissionDeniedError):
            reader.retain_checkpoints("job-a", 1)
        with pytest.raises(PermissionDeniedError):
            reader.set_job_policy("job-a", keep_last=1)
        with pytest.raises(PermissionDeniedError):
            reader.job_policy_in_force("job-b")
    with PoolClient(tokened.address, PoolClientConfig(token="tok-aw")) as writer:
        with pytest.raises(PermissionDeniedError):  # a job it has no access to: denied before it is looked up
            writer.set_job_policy("job-nope", keep_last=2)
        before = writer.list_checkpoints("job-a")
        dry = writer.retain_checkpoints("job-a", 1, dry_run=True)
        assert dry.dry_run and dry.deleted == (1,) and writer.list_checkpoints("job-a") == before
        with pytest.raises(Exception) as bad:
            writer.set_job_policy("job-a", keep_last=0)
        assert "keep_last" in str(bad.value)
        assert writer.get_job_policy("job-a") is None  # the refused set changed nothing


def test_policy_for_a_job_that_does_not_exist_is_not_found_naming_no_store(tmp_path: Path) -> None:
    store, _, _ = file_job(tmp_path / "pool", 2)
    config = PoolServerConfig(listen="127.0.0.1:0", grace_seconds=0.2)
    with PoolServer(config, store=store) as server, PoolClient(server.address) as client:
        with pytest.raises(NotFoundError) as err:
            client.set_job_policy("no-such-job", keep_last=2)
        assert str(tmp_path) not in str(err.value)
        assert not store.exists(job_policy_key("no-such-job"))
        huge = client.set_job_policy(JOB, keep_last=10**18)  # absurd but representable: kept, and retention keeps everything
        assert huge.keep_last == 10**18
        assert client.retain_checkpoints(JOB, 0).deleted == ()


@pytest.mark.parametrize(
    "text",
    [
        "",
        " ",
        "h1:1,",
        ",h1:1",
        "h1:1,,h2:2",
        "h1:1,h1:1",
        "h1:1,dns:///x:1",
        "dns:///x:1,h:2",
        "dns://8.8.8.8/x:1",
        "::1:7420",
        "[zz]:1",
        "h:0",
        "h:65536",
        "h:７４２０",
        "http://h:1",
        "h 1:2",
        "dns:///[::1]:7420",
        "h:1 h:2",
    ],
)
def test_odd_pool_addresses_are_refused_naming_them(text: str) -> None:
    with pytest.raises(ClientInvalidArgument) as err:
        parse_pool_addresses(text)
    assert "pool address" in str(err.value)


def test_many_and_spaced_addresses_parse() -> None:
    assert parse_pool_addresses(" h1:1 , [::1]:2 ").hosts == ("h1:1", "[::1]:2")
    many = ",".join(f"10.0.{i // 250}.{i % 250}:7420" for i in range(1000))
    assert len(parse_pool_addresses(many).hosts) == 1000


def test_retain_cli_refuses_bad_input_and_changes_nothing(tmp_path: Path) -> None:
    store, uri, _ = file_job(tmp_path / "pool", 4)
    before = sorted((o.key, o.etag) for o in store.list(""))
    for args, code in (
        (["--keep-last", "0"], EXIT_USAGE),
        (["--keep-last", "-1"], EXIT_USAGE),
        (["--keep-last", "lots"], EXIT_USAGE),
        (["--dry-run"], EXIT_USAGE),
        (["--now", "--keep-last", "pool"], EXIT_USAGE),
        (["--show", "--clear"], EXIT_USAGE),
        (["--now", "--maintenance", "off"], EXIT_USAGE),
        ([], EXIT_USAGE),
    ):
        result = invoke("retain", JOB, *args, "--store", uri)
        assert result.exit_code == code, (args, result.exit_code, result.output)
    assert invoke("retain", "no-such-job", "--keep-last", "2", "--store", uri).exit_code == EXIT_NOT_FOUND
    assert invoke("retain", "a/b", "--keep-last", "2", "--store", uri).exit_code == EXIT_USAGE
    dry = invoke("retain", JOB, "--now", "--dry-run", "--store", uri, "-o", "json")
    assert dry.exit_code == 0 and json.loads(dry.stdout)["dry_run"] is True
    assert sorted((o.key, o.etag) for o in store.list("")) == before


def test_retain_cli_through_a_pool_with_a_read_token_is_denied(tmp_path: Path) -> None:
    store, _, _ = file_job(tmp_path / "pool", 3)
    tokens = TokenTable.parse(f"tok-r {JOB} read\n", "t")
    config = PoolServerConfig(listen="127.0.0.1:0", grace_seconds=0.2, tokens=tokens)
    before = sorted((o.key, o.etag) for o in store.list(""))
    with PoolServer(config, store=store) as server:
        for args in (["--now", "--keep-last", "1"], ["--keep-last", "1"], ["--clear"]):
            result = invoke("retain", JOB, *args, "--pool", server.address, "--pool-token", "tok-r")
            assert result.exit_code == EXIT_DENIED, (args, result.output)
        shown = invoke("retain", JOB, "--show", "--pool", server.address, "--pool-token", "tok-r", "-o", "json")
        assert shown.exit_code == 0 and json.loads(shown.stdout)["policy"] is None
    assert sorted((o.key, o.etag) for o in store.list("")) == before


@pytest.fixture
def not_pools() -> Iterator[list[str]]:
    """Two servers that are no pool: an HTTP/1 server and one that writes junk bytes and hangs up."""
    import socket
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Answer(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            self.send_response(200)
            self.send_header("Content-Length", "5")
            self.end_headers()
            self.wfile.write(b"hello")

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's signature
            pass

    http_server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=http_server.serve_forever, daemon=True).start()
    junk = socket.socket()
    junk.bind(("127.0.0.1", 0))
    junk.listen(16)
    stop = threading.Event()

    def serve_junk() -> None:
        while not stop.is_set():
            try:
                conn, _ = junk.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"\x00\x01garbage" * 64)

    threading.Thread(target=serve_junk, daemon=True).start()
    try:
        yield [f"127.0.0.1:{http_server.server_address[1]}", f"127.0.0.1:{junk.getsockname()[1]}"]
    finally:
        stop.set()
        junk.close()
        http_server.shutdown()
        http_server.server_close()


def test_a_list_with_servers_that_answer_garbage_fails_over_to_the_pool(not_pools: list[str]) -> None:
    config = PoolServerConfig(listen="127.0.0.1:0", grace_seconds=0.2)
    with PoolServer(config, store=MemoryStore()) as server:
        with PoolClient(",".join([*not_pools, server.address]), PoolClientConfig(call_deadline_s=10)) as client:
            build(client, JOB, 3)
            for _ in range(10):
                assert [c.checkpoint_id for c in client.list_checkpoints(JOB)] == [1, 2, 3]
    for address in not_pools:  # alone, each is named as no pool, in one error
        with PoolClient(address, PoolClientConfig(call_deadline_s=5)) as client, pytest.raises(Exception) as err:
            client.list_checkpoints(JOB)
        assert type(err.value).__name__ == "UnavailableError" and "not a gRPC pool" in str(err.value), str(err.value)


def test_a_dns_name_that_does_not_resolve_is_an_unavailable_error_naming_it() -> None:
    from client.pool_client import RetryPolicy

    config = PoolClientConfig(call_deadline_s=3, retry=RetryPolicy(max_attempts=2))
    with PoolClient("dns:///no-such-pool.invalid:7420", config) as client, pytest.raises(Exception) as err:
        client.list_checkpoints(JOB)
    assert type(err.value).__name__ == "UnavailableError" and "no-such-pool.invalid" in str(err.value), str(err.value)
