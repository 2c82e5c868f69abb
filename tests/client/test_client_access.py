"""The backend against a pool with TLS and per-job bearer tokens: what works, and the typed errors for what does not."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import snapshot
from client import (
    BackendConfig,
    PermissionDeniedError,
    RemoteReadBackend,
    RetryPolicy,
    UnauthenticatedError,
    UnavailableError,
)
from tests.client_fixtures import OP_COUNT, keyed_keys, table_model
from tests.security_fixtures import Pki, token_table

KEYS = keyed_keys(40, seed=3)
NO_RETRY = RetryPolicy(max_attempts=2, initial_backoff_s=0.01, max_backoff_s=0.02)


@pytest.fixture
def secured(pki: Pki, make_s3_store) -> Iterator[str]:
    from pool.server import PoolServer, PoolServerConfig

    cfg = PoolServerConfig(listen="127.0.0.1:0", grace_seconds=0.2, tls=pki.server_tls(client_ca=True), tokens=token_table())
    server = PoolServer(cfg, store=make_s3_store(prefix="secure")).start()
    try:
        yield server.address
    finally:
        server.stop(0)


def _config(pki: Pki, token: str | None, ca: bytes | None = None) -> BackendConfig:
    return BackendConfig(
        token=token,
        tls_root_certificates=ca or pki.ca_pem,
        tls_client_cert=pki.client_cert_pem,
        tls_client_key=pki.client_key_pem,
        retry=NO_RETRY,
        call_deadline_s=5,
    )


def test_backend_over_mutual_tls_with_a_job_token_writes_restores_and_exports(secured: str, pki: Pki) -> None:
    model = {}
    with RemoteReadBackend.connect(secured, "job-a", (0, 127), _config(pki, "tok-a-rw")) as writer:
        for k in KEYS:
            writer.put(OP_COUNT, k, b"v" + k)
            model[(OP_COUNT, k)] = b"v" + k
        assert writer.snapshot(1).checkpoint.complete
    with RemoteReadBackend.connect(secured, "job-a", (0, 127), _config(pki, "tok-a-rw")) as reader:
        reader.restore()
        assert reader.get_many(OP_COUNT, KEYS) == [model[(OP_COUNT, k)] for k in KEYS]
        assert table_model(snapshot.read_snapshot(reader.export_arrow_snapshot()).table) == model


def test_wrong_job_missing_token_and_untrusted_server_are_typed_errors(secured: str, pki: Pki) -> None:
    with pytest.raises(PermissionDeniedError):
        RemoteReadBackend.connect(secured, "job-b", (0, 127), _config(pki, "tok-a-rw"))
    with pytest.raises(UnauthenticatedError):
        RemoteReadBackend.connect(secured, "job-a", (0, 127), _config(pki, None))
    with pytest.raises(UnauthenticatedError):
        RemoteReadBackend.connect(secured, "job-a", (0, 127), _config(pki, "not-a-token"))
    with pytest.raises(UnavailableError):  # the server's certificate is not signed by the CA this client trusts
        RemoteReadBackend.connect(secured, "job-a", (0, 127), _config(pki, "tok-a-rw", ca=pki.other_ca_pem))
