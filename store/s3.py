"""The S3 object store on boto3 (the only module that imports it); conditional writes via If-None-Match / If-Match."""

from __future__ import annotations

import builtins
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import boto3
import botocore.exceptions as bex
from botocore.config import Config

from snapshot.errors import (
    ClinkError,
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    UnauthenticatedError,
    UnavailableError,
)
from store.objects import ObjectInfo, ObjectStore, StoreConfig, StoreCounters, validate_key, validate_prefix

# S3 error codes, then HTTP statuses, to domain errors: the one table of this boundary (an unlisted 5xx is unavailable).
ERROR_BY_S3_CODE: dict[str, type[ClinkError]] = {
    **dict.fromkeys(("NoSuchBucket", "NoSuchKey", "NotFound", "404"), NotFoundError),
    **dict.fromkeys(("PreconditionFailed", "ConditionalRequestConflict", "OperationAborted", "409", "412"), ConflictError),
    **dict.fromkeys(("InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken"), UnauthenticatedError),
    **dict.fromkeys(("AccessDenied", "AllAccessDisabled", "403"), PermissionDeniedError),
    **dict.fromkeys(
        ("SlowDown", "ServiceUnavailable", "Throttling", "ThrottlingException", "RequestTimeout", "InternalError", "500", "503"),
        UnavailableError,
    ),
}

# Said with every credentials problem, by every command (serve, ls, state-cat, ...): where boto3 looks for them
CREDENTIALS_HINT = (
    "S3 credentials come from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
    "else boto3's default chain (AWS_PROFILE, ~/.aws/credentials, an instance role)"
)

# What each domain error says, given the S3 code's message
_MESSAGE_BY_ERROR: dict[type[ClinkError], str] = {
    NotFoundError: "object {what} not found in {uri}",
    ConflictError: "conditional write of {what} in {uri} lost: {message}",
    UnauthenticatedError: "{uri} at {endpoint} rejected the credentials ({what}): {message}; " + CREDENTIALS_HINT,
    PermissionDeniedError: "access to {what} in {uri} at {endpoint} denied: {message}; " + CREDENTIALS_HINT,
    UnavailableError: "{uri} unavailable ({what}): {code} {message}",
}


def error_for_s3_code(code: str, status: str) -> type[ClinkError]:
    """The domain error an S3 error code (or, when the code is not listed, its HTTP status) stands for."""
    return ERROR_BY_S3_CODE.get(code) or ERROR_BY_S3_CODE.get(status) or UnavailableError


class _RangeNotSatisfiable(Exception):
    """S3 said 416: the range starts at or past the end of the object."""


def _strip(etag: str) -> str:
    return etag.strip('"')


class S3Store(ObjectStore):
    """Objects under ``s3://bucket/prefix``; endpoint, region and credentials come from StoreConfig."""

    def __init__(self, bucket: str, prefix: str = "", config: StoreConfig | None = None) -> None:
        config = config or StoreConfig()
        if not bucket:
            raise InvalidArgumentError("S3 store needs a bucket name")
        prefix = prefix.strip("/")
        if prefix:
            validate_key(prefix)
        self.bucket = bucket
        self.prefix = f"{prefix}/" if prefix else ""
        self.uri = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
        self.config = config
        self.counters = StoreCounters()
        self.coalesce_gap_bytes = config.coalesce_gap_bytes
        session = boto3.session.Session(
            aws_access_key_id=config.access_key_id,
            aws_secret_access_key=config.secret_access_key,
            region_name=config.region,
        )
        self._client = session.client(
            "s3",
            endpoint_url=config.endpoint_url,
            config=Config(
                retries={"max_attempts": config.max_attempts, "mode": "standard"},
                connect_timeout=config.connect_timeout_s,
                read_timeout=config.read_timeout_s,
                s3={"addressing_style": "path"} if config.endpoint_url else {},
                max_pool_connections=32,
            ),
        )
        # the first look (check_exists, probe): one attempt, short timeouts, so a silent endpoint is named in seconds
        self._probe_timeout_s = min(config.probe_timeout_s, config.connect_timeout_s + config.read_timeout_s)
        self._probe_client = session.client(
            "s3",
            endpoint_url=config.endpoint_url,
            config=Config(
                retries={"total_max_attempts": 1, "mode": "standard"},  # max_attempts would count the retries only
                connect_timeout=min(config.connect_timeout_s, self._probe_timeout_s),
                read_timeout=self._probe_timeout_s,
                s3={"addressing_style": "path"} if config.endpoint_url else {},
                max_pool_connections=1,
            ),
        )

    @property
    def endpoint(self) -> str:
        """The endpoint this store talks to, for messages: the configured URL or AWS's default."""
        return self.config.endpoint_url or "AWS's default endpoint"

    def check_exists(self) -> None:
        """NotFoundError "no such bucket" when the bucket is missing (a prefix with no objects is an empty store).

        One attempt with the probe timeout (StoreConfig.probe_timeout_s): an endpoint that never answers is UnavailableError
        naming it within seconds.
        """
        try:
            with self._errors(f"bucket {self.bucket}", self._probe_timeout_s):
                self._probe_client.head_bucket(Bucket=self.bucket)
        except NotFoundError:
            where = self.config.endpoint_url or "AWS"
            raise NotFoundError(f"no such bucket: {self.bucket} (store {self.uri} at {where})") from None
        self.counters.count("head")

    def probe(self) -> None:
        """List one key under the store's prefix (credentials, bucket and endpoint checked), one attempt, probe timeout."""
        with self._errors(f"list {self.prefix or '/'}", self._probe_timeout_s):
            self._probe_client.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix, MaxKeys=1)
        self.counters.count("list")

    def _full(self, key: str) -> str:
        return self.prefix + validate_key(key)

    @contextmanager
    def _errors(self, what: str, timeout_s: float | None = None) -> Iterator[None]:
        try:
            yield
        except bex.ClientError as exc:
            err = exc.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = str(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
            message = err.get("Message") or code
            if code == "InvalidRange" or status == "416":
                raise _RangeNotSatisfiable() from None
            if code == "NoSuchBucket":
                raise NotFoundError(f"no such bucket: {self.bucket} ({what} in {self.uri})") from exc
            error = error_for_s3_code(code, status)
            text = _MESSAGE_BY_ERROR[error].format(what=what, uri=self.uri, endpoint=self.endpoint, code=code, message=message)
            raise error(text) from exc
        except (bex.ReadTimeoutError, bex.ConnectTimeoutError) as exc:
            waited = timeout_s if timeout_s is not None else self.config.read_timeout_s
            verb = "did not accept a connection" if isinstance(exc, bex.ConnectTimeoutError) else "did not answer"
            raise UnavailableError(
                f"S3 endpoint {self.endpoint} {verb} within {waited:g} s ({what} in {self.uri}); "
                "is it the right URL (--s3-endpoint-url), and an S3 service that is up?"
            ) from exc
        except (bex.EndpointConnectionError, bex.ConnectionError) as exc:
            raise UnavailableError(f"cannot reach S3 endpoint {self.endpoint} ({what} in {self.uri}): {exc}") from exc
        except bex.NoCredentialsError:
            raise UnauthenticatedError(f"no credentials found for {self.uri} at {self.endpoint}; {CREDENTIALS_HINT}") from None
        except bex.BotoCoreError as exc:
            raise UnavailableError(f"{self.uri} failed on {what}: {exc}") from exc

    def get(self, key: str) -> bytes:
        """The whole object; NotFoundError naming the key."""
        return self.get_with_etag(key)[0]

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """``length`` bytes from ``start`` (shorter at the end of the object, b'' past it)."""
        if start < 0 or length < 0:
            raise InvalidArgumentError(f"range ({start}, {length}) of {key} must have start >= 0 and length >= 0")
        if length == 0:
            return b""
        full = self._full(key)
        try:
            with self._errors(key):
                resp = self._client.get_object(Bucket=self.bucket, Key=full, Range=f"bytes={start}-{start + length - 1}")
                data = resp["Body"].read()
        except _RangeNotSatisfiable:
            self.counters.count("get_range")
            return b""
        self.counters.count("get_range", read=len(data))
        return data

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        """The object and the etag of exactly those bytes."""
        full = self._full(key)
        with self._errors(key):
            resp = self._client.get_object(Bucket=self.bucket, Key=full)
            data = resp["Body"].read()
        self.counters.count("get", read=len(data))
        return data, _strip(resp["ETag"])

    def head(self, key: str) -> ObjectInfo:
        """Size, modification time and etag; NotFoundError naming the key."""
        full = self._full(key)
        with self._errors(key):
            resp = self._client.head_object(Bucket=self.bucket, Key=full)
        self.counters.count("head")
        return ObjectInfo(key, int(resp["ContentLength"]), int(resp["LastModified"].timestamp() * 1000), _strip(resp["ETag"]))

    def _put(self, key: str, data: bytes, op: str, **conditions: str) -> str:
        full = self._full(key)
        try:
            with self._errors(key):
                try:
                    resp = self._client.put_object(Bucket=self.bucket, Key=full, Body=bytes(data), **conditions)
                except bex.ClientError as exc:
                    etag = self._landed_before_sdk_retry(key, data, exc) if conditions else None
                    if etag is None:
                        raise
                    return etag
        finally:
            self.counters.count(op, written=len(data))
        return _strip(resp["ETag"])

    def _landed_before_sdk_retry(self, key: str, data: bytes, exc: bex.ClientError) -> str | None:
        """The etag of our own earlier attempt when the SDK's retry of a conditional PUT failed its condition, else None.

        boto3 repeats a PUT whose reply was lost; the repeat of an If-None-Match / If-Match PUT that landed then fails
        its condition (412), which is not a conflict: the object is read back, and holding exactly our bytes it is ours.
        """
        meta = exc.response.get("ResponseMetadata", {})
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = str(meta.get("HTTPStatusCode", ""))
        if not meta.get("RetryAttempts") or error_for_s3_code(code, status) is not ConflictError:
            return None
        try:
            current, etag = self.get_with_etag(key)
        except NotFoundError:
            return None
        return etag if current == bytes(data) else None

    def put(self, key: str, data: bytes) -> str:
        """One PUT (S3 objects appear atomically); returns the etag."""
        return self._put(key, data, "put")

    def put_if_absent(self, key: str, data: bytes) -> str:
        """PUT with If-None-Match: *; ConflictError if the key exists."""
        try:
            return self._put(key, data, "put_if_absent", IfNoneMatch="*")
        except ConflictError:
            raise ConflictError(f"object {key} already exists in {self.uri}") from None

    def put_if_absent_file(self, key: str, path: Path, size: int) -> str:
        """PUT with If-None-Match: * streaming a local file (never read whole); ConflictError if the key exists."""
        full = self._full(key)
        try:
            with self._errors(key), open(path, "rb") as body:
                try:
                    resp = self._client.put_object(Bucket=self.bucket, Key=full, Body=body, ContentLength=size, IfNoneMatch="*")
                except bex.ClientError as exc:
                    etag = self._landed_before_sdk_retry(key, Path(path).read_bytes(), exc)
                    if etag is None:
                        raise
                    return etag
        except ConflictError:
            raise ConflictError(f"object {key} already exists in {self.uri}") from None
        finally:
            self.counters.count("put_if_absent", written=size)
        return _strip(resp["ETag"])

    def compare_and_swap(self, key: str, data: bytes, expected_etag: str | None) -> str:
        """PUT with If-Match (or If-None-Match: * when expected_etag is None); ConflictError on mismatch."""
        if expected_etag is None:
            return self._put(key, data, "compare_and_swap", IfNoneMatch="*")
        try:
            return self._put(key, data, "compare_and_swap", IfMatch=f'"{_strip(expected_etag)}"')
        except NotFoundError:
            raise ConflictError(f"object {key} does not exist in {self.uri} (expected etag {expected_etag})") from None

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object whose key starts with ``prefix``, sorted by key, page by page."""
        validate_prefix(prefix)
        paginator = self._client.get_paginator("list_objects_v2")
        with self._errors(f"list {prefix!r}"):
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix):
                self.counters.count("list")
                for obj in page.get("Contents", []):
                    yield ObjectInfo(
                        obj["Key"][len(self.prefix) :],
                        int(obj["Size"]),
                        int(obj["LastModified"].timestamp() * 1000),
                        _strip(obj.get("ETag", "")),
                    )

    def list_prefixes(self, prefix: str = "") -> builtins.list[str]:
        """Common prefixes right under ``prefix`` (a delimiter listing: their contents are not listed)."""
        validate_prefix(prefix)
        if prefix and not prefix.endswith("/"):
            raise InvalidArgumentError(f"prefix {prefix!r} must be empty or end with '/'")
        paginator = self._client.get_paginator("list_objects_v2")
        names = []
        with self._errors(f"list {prefix!r}"):
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix, Delimiter="/"):
                self.counters.count("list")
                for common in page.get("CommonPrefixes", []):
                    names.append(common["Prefix"])
            # a filer-backed gateway (SeaweedFS) keeps a folder whose last object was deleted: keep those holding one
            held = []
            for full in names:
                self.counters.count("list")
                if self._client.list_objects_v2(Bucket=self.bucket, Prefix=full, MaxKeys=1).get("KeyCount", 0):
                    held.append(full[len(self.prefix) + len(prefix) :].rstrip("/"))
        return sorted(held)

    def holds(self, prefix: str = "") -> bool:
        """Whether any object's key starts with ``prefix``: one listing of at most one key."""
        validate_prefix(prefix)
        with self._errors(f"list {prefix!r}"):
            found = self._client.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix + prefix, MaxKeys=1).get("KeyCount", 0)
        self.counters.count("list")
        return bool(found)

    def delete(self, key: str) -> None:
        """DELETE; a missing key is fine."""
        full = self._full(key)
        with self._errors(key):
            self._client.delete_object(Bucket=self.bucket, Key=full)
        self.counters.count("delete")

    def create_bucket(self) -> None:
        """Create the bucket (tests and first-run setups); an existing bucket owned by us is fine."""
        with self._errors(f"create bucket {self.bucket}"):
            try:
                kwargs = {}
                if self.config.region and self.config.region != "us-east-1":
                    kwargs["CreateBucketConfiguration"] = {"LocationConstraint": self.config.region}
                self._client.create_bucket(Bucket=self.bucket, **kwargs)
            except bex.ClientError as exc:
                if exc.response.get("Error", {}).get("Code") not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    raise
