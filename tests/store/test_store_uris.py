"""The one store-location parser (RFC 8089 file URIs, s3://, bare paths), and stores that create nothing until written."""

from __future__ import annotations

from pathlib import Path

import pytest

from snapshot.errors import InvalidArgumentError, NotFoundError
from store.local import FileStore
from store.objects import open_store
from store.uris import parse_store_uri


@pytest.mark.parametrize(
    ("spec", "path"),
    [
        ("file:/data/pool", "/data/pool"),  # RFC 8089's minimal form
        ("file:///data/pool", "/data/pool"),
        ("file://localhost/data/pool", "/data/pool"),
        ("FILE:///data/pool", "/data/pool"),
        ("file:///data/my%20pool%25", "/data/my pool%"),  # percent-decoded
        ("file://./pool-data", "./pool-data"),  # serve's default
        ("file://~/pool", "~/pool"),
        ("pool-data", "pool-data"),  # a bare path is a local directory, taken as written
        ("/abs/pool", "/abs/pool"),
        ("data:2024/pool", "data:2024/pool"),  # a colon inside a folder name is no scheme
    ],
)
def test_file_locations_read_as_the_path_meant(spec: str, path: str) -> None:
    location = parse_store_uri(spec)
    assert (location.scheme, location.path) == ("file", path)


@pytest.mark.parametrize(
    ("spec", "bucket", "prefix"),
    [("s3://bkt", "bkt", ""), ("s3://bkt/", "bkt", ""), ("s3://bkt/a/b/", "bkt", "a/b"), ("S3://Legacy_Bkt/p", "Legacy_Bkt", "p")],
)
def test_s3_locations_name_bucket_and_prefix(spec: str, bucket: str, prefix: str) -> None:
    location = parse_store_uri(spec)
    assert (location.scheme, location.bucket, location.prefix) == ("s3", bucket, prefix)
    assert location.uri == (f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}")


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("file://tmp/x", "names the host 'tmp', and a file URI takes none: write file:///tmp/x for the absolute path /tmp/x"),
        ("file://server/share", "names the host 'server'"),
        ("file:tmp/x", "is not an absolute file URI: write file:///tmp/x"),
        ("file:", "is not an absolute file URI"),
        ("file://", "names no directory"),
        ("s3:/bkt/p", "is not an S3 URI: write s3://BUCKET/PREFIX (two slashes)"),
        ("s3:bkt", "is not an S3 URI"),
        ("s3://", "names no bucket"),
        ("s3:///p", "names no bucket"),
        ("s3://127.0.0.1:9000/p", "the endpoint goes in --s3-endpoint-url"),
        ("s3://my bucket/p", "is not a bucket name"),
        ("s3://bkt/a/../b", "is not a valid key"),
        ("gs://bkt/p", "unknown scheme 'gs://'"),
        ("memory://x", "unknown scheme 'memory://'"),
        ("", "is empty"),
    ],
)
def test_mistyped_locations_are_refused_naming_the_mistake(spec: str, says: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        parse_store_uri(spec)
    assert says in str(info.value)
    assert "\n" not in str(info.value)


def test_open_store_goes_through_the_parser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for spec in ("file://tmp/x", "s3:/bkt/p", "file:rel"):
        with pytest.raises(InvalidArgumentError):
            open_store(spec)
    assert list(tmp_path.iterdir()) == []
    store = open_store(f"file:{tmp_path}/a%20b")
    assert isinstance(store, FileStore) and store.root == tmp_path / "a b"


def test_a_file_store_creates_nothing_until_its_first_write(tmp_path: Path) -> None:
    root = tmp_path / "deep" / "pool"
    store = open_store(root.as_uri())
    assert not (tmp_path / "deep").exists()
    with pytest.raises(NotFoundError):
        store.get("jobs/j/chk-1/_metadata")
    with pytest.raises(NotFoundError):
        store.head("jobs/j/chk-1/_metadata")
    assert list(store.list("jobs/")) == [] and store.list_prefixes("jobs/") == []
    store.delete("jobs/j/data/x.arrow")
    assert not (tmp_path / "deep").exists()
    store.put_if_absent("jobs/j/chk-1/_metadata", b"m")
    assert store.get("jobs/j/chk-1/_metadata") == b"m"
    store.check_exists()


def test_must_exist_says_no_such_store(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(NotFoundError, match=r"^no such store: file://.*/nope \(the directory .* does not exist\)$"):
        open_store(f"file://{missing}", must_exist=True)
    assert not missing.exists()
    (tmp_path / "a-file").write_bytes(b"x")
    with pytest.raises(InvalidArgumentError, match="is a file, not a directory"):
        open_store(str(tmp_path / "a-file"), must_exist=True)
    missing.mkdir()
    assert list(open_store(str(missing), must_exist=True).list()) == []  # an existing empty directory is an empty store


def test_a_missing_bucket_is_no_such_bucket(s3_config, make_s3_store) -> None:
    with pytest.raises(NotFoundError, match=r"^no such bucket: never-made-bucket \(store s3://never-made-bucket/p at http"):
        open_store("s3://never-made-bucket/p", s3_config, must_exist=True)
    store = make_s3_store(prefix="empty")
    open_store(store.uri, s3_config, must_exist=True)  # a prefix with no objects under an existing bucket is an empty store
    store.put("k", b"v")
    with pytest.raises(NotFoundError, match="^no such bucket: never-made-bucket"):
        open_store("s3://never-made-bucket", s3_config).get("k")


def test_a_retrying_store_checks_the_store_it_wraps(tmp_path: Path) -> None:
    from store.retry import RetryingStore

    with pytest.raises(NotFoundError, match="no such store"):
        RetryingStore(FileStore(tmp_path / "nope")).check_exists()
