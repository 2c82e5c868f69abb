"""Review 13's findings on the client side: an address with nothing behind it, and a required restore of an empty job."""

from __future__ import annotations

import pytest

from client import PoolClient, PoolClientConfig, UnavailableError
from client.pool_client import RetryPolicy
from tests.client_fixtures import free_port

# --- finding 10: nothing listens at the address ---------------------------------------------------------------------------


def test_nothing_listening_is_said_in_words_after_the_retries() -> None:
    address = f"127.0.0.1:{free_port()}"
    sleeps: list[float] = []
    config = PoolClientConfig(call_deadline_s=5, retry=RetryPolicy(max_attempts=4, initial_backoff_s=0.001), sleep=sleeps.append)
    with PoolClient(address, config) as client, pytest.raises(UnavailableError) as err:
        client.list_jobs()
    assert client.calls == 4 and len(sleeps) == 3  # a worker started before its pool keeps its whole budget
    message = str(err.value)
    assert f"no pool is listening on {address} (start one with clink-pool serve)" in message
    assert "failed to connect to all addresses" not in message and "gave up after 4 attempt(s)" in message
    assert err.value.unreachable == f"no pool is listening on {address} (start one with clink-pool serve)"


def test_refused_attempts_bounds_the_retries_of_a_refused_connection_only() -> None:
    address = f"127.0.0.1:{free_port()}"
    sleeps: list[float] = []
    retry = RetryPolicy(max_attempts=8, initial_backoff_s=0.001, refused_attempts=2)
    with PoolClient(address, PoolClientConfig(call_deadline_s=5, retry=retry, sleep=sleeps.append)) as client:
        with pytest.raises(UnavailableError, match="no pool is listening"):
            client.list_checkpoints("orders")
        assert client.calls == 2 and client.retries == 1
