"""Tests of particular stores and store helpers (the contract every store passes is tests/store/store_contract.py)."""

from __future__ import annotations

import uuid

import pytest

from snapshot.errors import InvalidArgumentError, NotFoundError, UnavailableError
from store.local import FileStore
from store.objects import StoreConfig, coalesce_ranges, open_store, validate_key


def test_coalesce_ranges_respects_gap():
    spans = coalesce_ranges([(0, 10), (100, 10), (1000, 10)], gap=50)
    assert spans == [(0, 10, [0]), (100, 10, [1]), (1000, 10, [2])]
    spans = coalesce_ranges([(100, 10), (0, 10), (105, 20)], gap=90)
    assert spans == [(0, 125, [1, 0, 2])]


def test_open_store_by_scheme(tmp_path, s3_config):
    assert isinstance(open_store(str(tmp_path / "a")), FileStore)
    fs = open_store(f"file://{tmp_path / 'b'}")
    assert fs.uri == f"file://{tmp_path / 'b'}"
    s3 = open_store("s3://bucket-x/some/prefix", s3_config)
    assert s3.uri == "s3://bucket-x/some/prefix"
    with pytest.raises(InvalidArgumentError, match="unknown scheme"):
        open_store("gs://bucket")
    with pytest.raises(InvalidArgumentError, match="bucket"):
        open_store("s3:///prefix", s3_config)


def test_s3_prefix_isolation(make_s3_store):
    a = make_s3_store(prefix="one")
    b = make_s3_store(bucket=a.bucket, prefix="two")
    a.put("k", b"a")
    b.put("k", b"b")
    assert (a.get("k"), b.get("k")) == (b"a", b"b")
    assert [i.key for i in a.list("")] == ["k"]


def test_s3_missing_bucket_is_not_found(s3_config):
    from store.s3 import S3Store

    s = S3Store(f"missing-{uuid.uuid4().hex[:10]}", "", s3_config)
    with pytest.raises(NotFoundError, match="bucket"):
        s.get("k")


def test_s3_unreachable_endpoint_is_unavailable():
    from store.s3 import S3Store

    cfg = StoreConfig(
        endpoint_url="http://127.0.0.1:9",
        region="us-east-1",
        access_key_id="x",
        secret_access_key="y",
        max_attempts=1,
        connect_timeout_s=0.5,
        read_timeout_s=0.5,
    )
    with pytest.raises(UnavailableError, match="127.0.0.1:9|unreachable"):
        S3Store("b", "", cfg).get("k")


def test_validate_key_accepts_normal_keys():
    assert validate_key("jobs/j-1/chk-3/_metadata") == "jobs/j-1/chk-3/_metadata"


def test_file_store_hides_its_temp_files(file_store):
    file_store.put("a", b"1")
    assert [i.key for i in file_store.list("")] == ["a"]
    assert list((file_store.root / ".clink-tmp").iterdir()) == []
