"""Findings of the fresh-eye review of issue 13 at the store level (the command lines' side is tests/cli/test_review_findings_pool.py)."""

from __future__ import annotations

import pytest

from snapshot.errors import InvalidArgumentError
from store.objects import StoreConfig
from store.uris import parse_endpoint_url

# --- 3. an S3 endpoint without a scheme (or otherwise unusable) is refused, saying what to write -----------------------


@pytest.mark.parametrize(
    "url, needle",
    [
        ("127.0.0.1:5055", "has no scheme; write http://127.0.0.1:5055"),
        ("localhost:9000/", "write http://localhost:9000"),
        ("s3://bucket", "the bucket goes in the store URI"),
        ("ftp://127.0.0.1:21", "not an http:// or https:// URL"),
        ("http://", "names no host"),
        ("http://127.0.0.1:99999", "not a number in 0..65535"),
        ("http://127.0.0.1:50 55", "white space"),
        (" http://127.0.0.1:5055", "white space"),
    ],
)
def test_3_an_unusable_endpoint_is_an_invalid_argument_saying_what_to_write(url: str, needle: str):
    with pytest.raises(InvalidArgumentError, match="write http://") as refused:
        StoreConfig(endpoint_url=url)
    assert needle in str(refused.value)


@pytest.mark.parametrize("url", ["http://127.0.0.1:5055", "https://s3.eu-west-1.amazonaws.com", "http://[::1]:9000", "HTTP://minio"])
def test_3_good_endpoints_pass(url: str):
    assert parse_endpoint_url(url) == url
    assert StoreConfig(endpoint_url=url).endpoint_url == url


# --- 1. the first look at a store is one attempt with a short timeout --------------------------------------------------


@pytest.mark.parametrize("call", ["check_exists", "probe"])
def test_1_check_and_probe_take_one_attempt_within_the_probe_timeout(silent_endpoint: str, call: str):
    import time

    from snapshot.errors import UnavailableError
    from store.s3 import S3Store

    config = StoreConfig(endpoint_url=silent_endpoint, region="us-east-1", access_key_id="k", secret_access_key="s", probe_timeout_s=1)
    store = S3Store("bucket", "pool", config)
    started = time.monotonic()
    with pytest.raises(UnavailableError, match=f"S3 endpoint {silent_endpoint} did not answer within 1 s"):
        store.probe() if call == "probe" else store.check_exists()
    assert time.monotonic() - started < 3  # one attempt of 1 s, not 30 s x 6


def test_1_a_closed_port_is_named_at_once():
    import socket

    from snapshot.errors import UnavailableError
    from store.s3 import S3Store

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    config = StoreConfig(endpoint_url=closed, region="us-east-1", access_key_id="k", secret_access_key="s")
    with pytest.raises(UnavailableError, match=f"cannot reach S3 endpoint {closed}"):
        S3Store("bucket", "pool", config).check_exists()


# --- 4. what a store holds: holds(prefix) and the store rule ---------------------------------------------------------


def test_4_holds_says_whether_a_folder_holds_an_object(store):
    from store.layout import STORE_MARKER, holds_a_store

    assert not store.holds("") and not store.holds("jobs/") and not holds_a_store(store)
    store.put("notes/readme.txt", b"not a store")
    assert store.holds("") and store.holds("notes/") and not store.holds("jobs/") and not holds_a_store(store)
    store.put("savepoints/s/_metadata", b"{}")
    assert store.holds("savepoints/") and holds_a_store(store)
    store.delete("savepoints/s/_metadata")
    store.put(STORE_MARKER, b"{}")
    assert holds_a_store(store)


def test_4_a_file_store_s_own_temp_folder_and_lock_are_no_objects(tmp_path):
    from snapshot.errors import NotFoundError
    from store.layout import holds_a_store, require_store
    from store.local import FileStore

    store = FileStore(tmp_path / "s")
    store.create()
    (tmp_path / "s" / ".clink-lock").write_bytes(b"")
    assert not store.holds("") and not holds_a_store(store)
    with pytest.raises(NotFoundError, match=r"no such store: .* \(nothing under it"):
        require_store(store)
