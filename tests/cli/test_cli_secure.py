"""The clink CLI against a pool with TLS and job-scoped bearer tokens, over gRPC and over the HTTPS export."""

from __future__ import annotations

import json

import pytest

from clink.cli.common import EXIT_DENIED, EXIT_UNAVAILABLE
from pool.server import PoolServer, PoolServerConfig
from tests.cli_fixtures import commit_checkpoints, generated_table, one_line_error, rows_of, run
from tests.security_fixtures import token_table

JOB = "job-a"


@pytest.fixture
def secured(file_store, pki, tmp_path):
    """A TLS + token pool serving JOB; yields (grpc base, https base, CA file, table)."""
    table = generated_table(81, keyed_rows=150)
    commit_checkpoints(file_store, JOB, [table])
    config = PoolServerConfig(
        store_uri=file_store.uri, listen="127.0.0.1:0", grace_seconds=0.2, http_port=0, tls=pki.server_tls(), tokens=token_table()
    )
    server = PoolServer(config, file_store).start()
    ca = tmp_path / "ca.pem"
    ca.write_bytes(pki.ca_pem)
    try:
        yield f"grpc://127.0.0.1:{server.port}", f"https://127.0.0.1:{server.http_port}", str(ca), table
    finally:
        server.stop(0)


def test_token_and_ca_read_the_pool_over_grpc_and_https(secured) -> None:
    grpc_base, https_base, ca, table = secured
    for src in (f"{grpc_base}/{JOB}", f"{https_base}/jobs/{JOB}/state.arrow"):
        result = run(["--pool-ca-file", ca, "--pool-token", "tok-a-ro", "state-cat", src, "--limit", "0", "-o", "json"])
        assert result.exit_code == 0, result.output
        doc = json.loads(result.stdout)
        assert doc["total_rows"] == table.num_rows
    # the token may also come from the environment
    result = run(
        ["--pool-ca-file", ca, "state-export", "--from", f"{grpc_base}/{JOB}", "--out", "-"], env={"CLINK_POOL_TOKEN": "tok-admin"}
    )
    assert result.exit_code == 0, result.stderr
    import snapshot as s

    assert rows_of(s.read_snapshot(result.stdout_bytes).table) == rows_of(table)


@pytest.mark.parametrize("token, needle", [(None, "token"), ("tok-b-rw", "job-a"), ("nonsense", "token")])
def test_missing_or_wrong_tokens_are_one_line_errors(secured, token: str | None, needle: str) -> None:
    grpc_base, https_base, ca, _ = secured
    pre = ["--pool-ca-file", ca, "--pool-timeout", "5"] + (["--pool-token", token] if token else [])
    for src in (f"{grpc_base}/{JOB}", f"{https_base}/jobs/{JOB}/state.arrow"):
        result = run([*pre, "state-cat", src], env={"CLINK_POOL_TOKEN": ""})
        assert result.exit_code == EXIT_DENIED, result.output
        assert needle in one_line_error(result).lower() or needle in one_line_error(result)


def test_a_missing_ca_file_is_a_usage_error(secured, tmp_path) -> None:
    grpc_base, _, _, _ = secured
    result = run(["--pool-ca-file", str(tmp_path / "none.pem"), "state-cat", f"{grpc_base}/{JOB}"])
    assert result.exit_code == 2
    assert "--pool-ca-file" in one_line_error(result)


def test_client_certificates_open_a_mutual_tls_pool(file_store, pki, tmp_path) -> None:
    table = generated_table(82, keyed_rows=40)
    commit_checkpoints(file_store, JOB, [table])
    config = PoolServerConfig(
        store_uri=file_store.uri,
        listen="127.0.0.1:0",
        grace_seconds=0.2,
        http_port=0,
        tls=pki.server_tls(client_ca=True),
        tokens=token_table(),
    )
    server = PoolServer(config, file_store).start()
    paths = pki.write(tmp_path / "pki")
    pre = ["--pool-ca-file", str(paths["ca_pem"]), "--pool-token", "tok-a-ro", "--pool-timeout", "5"]
    certs = ["--pool-cert-file", str(paths["client_cert_pem"]), "--pool-key-file", str(paths["client_key_pem"])]
    try:
        for src in (f"grpc://127.0.0.1:{server.port}/{JOB}", f"https://127.0.0.1:{server.http_port}/jobs/{JOB}/state.arrow"):
            without = run([*pre, "state-cat", src, "--limit", "0"])
            assert without.exit_code == EXIT_UNAVAILABLE, without.output  # the pool wants a client certificate
            result = run([*pre, *certs, "state-cat", src, "--limit", "0", "-o", "json"])
            assert result.exit_code == 0, result.output
            assert json.loads(result.stdout)["total_rows"] == table.num_rows
        half = run([*pre, "--pool-cert-file", str(paths["client_cert_pem"]), "state-cat", f"grpc://127.0.0.1:{server.port}/{JOB}"])
        assert half.exit_code == 2 and "--pool-key-file" in one_line_error(half)
    finally:
        server.stop(0)
