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
