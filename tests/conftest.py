"""Shared fixtures: an in-process moto S3 server and object stores over it or over a temp directory.

Fixtures (reuse them, do not copy them):

- ``moto_endpoint`` (session): URL of a ``moto.server.ThreadedMotoServer`` on 127.0.0.1, random port.
- ``s3_config`` (session): a ``StoreConfig`` pointing at it with dummy credentials and 2 retry attempts.
- ``make_s3_store`` (function): factory ``make_s3_store(bucket=None, prefix="") -> S3Store``; creates the
  bucket (a fresh random name when None), so every test gets its own empty bucket.
- ``s3_store``: a fresh empty ``S3Store`` on moto (``s3://<random bucket>/root``).
- ``file_store``: a fresh ``FileStore`` in ``tmp_path / "store"``.
- ``store``: parametrised over ``file`` and ``s3``; a test taking it runs against both implementations.
- ``make_file_store`` (function): factory ``make_file_store(name="other") -> FileStore`` under tmp_path.

Its plugins add more: ``seaweed`` (tests/seaweed_fixtures.py), ``pool_store``, ``pool_address`` and
``memory_pool_address`` (tests/client_fixtures.py), ``pki`` (tests/security_fixtures.py), ``cwd_tmp``, ``tmp_tree``,
``clink_run``, ``clink_pool_run``, ``s3_cli_env`` and ``silent_endpoint`` (tests/first_hour_fixtures.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest

from store.local import FileStore
from store.objects import ObjectStore, StoreConfig

# fixtures shared by modules in every folder, never imported by name; pytest reads pytest_plugins only in this top-level conftest
pytest_plugins = ["tests.seaweed_fixtures", "tests.client_fixtures", "tests.security_fixtures", "tests.first_hour_fixtures"]


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """Start one moto S3 server for the whole session on a random loopback port."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3_config(moto_endpoint: str) -> StoreConfig:
    """A StoreConfig for the moto server: explicit dummy credentials, few retries, short timeouts."""
    return StoreConfig(
        endpoint_url=moto_endpoint,
        region="us-east-1",
        access_key_id="testing",
        secret_access_key="testing",
        max_attempts=2,
        connect_timeout_s=2,
        read_timeout_s=10,
    )


@pytest.fixture
def make_s3_store(s3_config: StoreConfig) -> Callable[..., ObjectStore]:
    """Factory for S3 stores on moto; each call with bucket=None makes a new empty bucket."""
    from store.s3 import S3Store

    def make(bucket: str | None = None, prefix: str = "") -> S3Store:
        store = S3Store(bucket or f"t-{uuid.uuid4().hex[:20]}", prefix, s3_config)
        store.create_bucket()
        return store

    return make


@pytest.fixture
def s3_store(make_s3_store: Callable[..., ObjectStore]) -> ObjectStore:
    """A fresh empty S3 store on moto, rooted under a prefix to exercise prefix handling."""
    return make_s3_store(prefix="root")


@pytest.fixture
def make_file_store(tmp_path) -> Callable[..., ObjectStore]:
    """Factory for local-directory stores under tmp_path."""

    def make(name: str = "other") -> FileStore:
        return FileStore(tmp_path / name)

    return make


@pytest.fixture
def file_store(tmp_path) -> ObjectStore:
    """A fresh local-directory store."""
    return FileStore(tmp_path / "store")


@pytest.fixture(params=["file", "s3"])
def store(request: pytest.FixtureRequest) -> ObjectStore:
    """Both implementations: a test taking ``store`` runs once on a FileStore and once on moto S3."""
    return request.getfixturevalue(f"{request.param}_store")
