"""Fixtures of the live export reviews: a pool on loopback, and one whose live fetches have 1 s and 1 MiB."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pool.domain import LiveExportConfig as PoolLiveConfig
from pool.server import PoolServer
from tests.live_review_fixtures import start


@pytest.fixture
def pool() -> Iterator[PoolServer]:
    """A pool on loopback with the default live export limits."""
    server = start()
    try:
        yield server
    finally:
        server.stop(0)


@pytest.fixture
def quick_pool() -> Iterator[PoolServer]:
    """A pool whose live fetches have 1 s and 1 MiB in all."""
    server = start(PoolLiveConfig(fetch_timeout_s=1.0, max_bytes=1 << 20))
    try:
        yield server
    finally:
        server.stop(0)
