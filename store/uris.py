"""The one parser of store locations: RFC 8089 file URIs, s3://BUCKET/PREFIX and bare local paths."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from snapshot.errors import InvalidArgumentError

STORE_FORMS = "a directory path, file:///ABS/DIR or s3://BUCKET/PREFIX"

# a URI scheme (RFC 3986); "file" and "s3" are recognised with or without "//", any other only when "//" follows
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):(.*)$", re.DOTALL)
# bucket names as S3 and its look-alikes accept them (legacy buckets may hold capitals and underscores)
_BUCKET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# a "host" of file://./DIR, file://../DIR or file://~/DIR can only be a relative or home path (serve's default spells it so)
_PATH_HOSTS = (".", "..", "~")


@dataclass(frozen=True)
class StoreLocation:
    """Where a store lives: a local directory (``path``) or an S3 bucket and key prefix; ``spec`` is what was written."""

    scheme: str  # "file" or "s3"
    spec: str
    path: str = ""  # file: the directory; absolute for file: URIs, as given (maybe relative, maybe ~) for a bare path
    bucket: str = ""  # s3
    prefix: str = ""  # s3: the key prefix, without leading or trailing '/'

    @property
    def uri(self) -> str:
        """The canonical URI: file:///ABS/DIR (percent-encoded where needed) or s3://BUCKET[/PREFIX]."""
        if self.scheme == "s3":
            return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
        return Path(self.path).expanduser().resolve().as_uri()

    def child(self, *parts: str) -> StoreLocation:
        """The location ``parts`` below this one (a store root inside a path)."""
        if self.scheme == "s3":
            prefix = "/".join(p for p in (self.prefix, *parts) if p)
            return StoreLocation("s3", self.spec, bucket=self.bucket, prefix=prefix)
        return StoreLocation("file", self.spec, path=str(Path(self.path, *parts)))


def parse_store_uri(spec: str, what: str = "store") -> StoreLocation:
    """Read a store location; InvalidArgumentError naming the mistake for anything else (nothing is opened or created).

    - ``file:/ABS`` and ``file:///ABS`` are the absolute path /ABS (RFC 8089), percent-decoded; ``file://localhost/ABS``
      too; ``file://./DIR`` and ``file://~/DIR`` are DIR under the working or home directory; any other host is refused.
    - ``s3://BUCKET[/PREFIX]`` needs a bucket; ``s3:/x``, ``s3:x`` and unknown schemes (``gs://``) are refused.
    - Anything else is a local directory path, taken as written (relative to the working directory, ``~`` expanded).
    """
    if not isinstance(spec, str) or not spec.strip():
        raise InvalidArgumentError(f"{what} location is empty; give {STORE_FORMS}")
    if "\x00" in spec:
        raise InvalidArgumentError(f"{what} {spec!r} contains a NUL byte")
    m = _SCHEME.match(spec)
    scheme = m.group(1).lower() if m else ""
    if not m or (scheme not in ("file", "s3") and not m.group(2).startswith("//")):
        return StoreLocation("file", spec, path=spec)  # a bare path (a colon inside a folder name is no scheme)
    rest = m.group(2)
    if scheme == "s3":
        return _parse_s3(spec, rest, what)
    if scheme == "file":
        return _parse_file(spec, rest, what)
    raise InvalidArgumentError(f"{what} {spec!r} has an unknown scheme {scheme + '://'!r}; give {STORE_FORMS}")


def _parse_file(spec: str, rest: str, what: str) -> StoreLocation:
    if rest.startswith("//"):
        host, slash, tail = rest[2:].partition("/")
        path = slash + tail
        if host.lower() in ("", "localhost"):
            if not path:
                raise InvalidArgumentError(f"{what} {spec!r} names no directory; write file:///ABS/DIR")
        elif host in _PATH_HOSTS:
            path = host + path
        else:
            below = f"{host}{path}".rstrip("/")
            raise InvalidArgumentError(
                f"{what} {spec!r} names the host {host!r}, and a file URI takes none: "
                f"write file:///{below} for the absolute path /{below}, or {below} for a folder under the working directory"
            )
    elif rest.startswith("/"):
        path = rest  # file:/ABS (RFC 8089's minimal form)
    else:
        below = rest or "DIR"
        raise InvalidArgumentError(
            f"{what} {spec!r} is not an absolute file URI: write file:///{below.lstrip('/')} for /{below.lstrip('/')}, "
            f"or {below} for a folder under the working directory"
        )
    return StoreLocation("file", spec, path=unquote(path))


def _parse_s3(spec: str, rest: str, what: str) -> StoreLocation:
    if not rest.startswith("//"):
        raise InvalidArgumentError(f"{what} {spec!r} is not an S3 URI: write s3://BUCKET/PREFIX (two slashes)")
    bucket, _, prefix = rest[2:].partition("/")
    if not bucket:
        raise InvalidArgumentError(f"{what} {spec!r} names no bucket: write s3://BUCKET/PREFIX")
    if ":" in bucket or "@" in bucket:
        raise InvalidArgumentError(
            f"{what} {spec!r}: {bucket!r} is not a bucket name; s3://BUCKET/PREFIX takes the bucket, the endpoint goes in --s3-endpoint-url"
        )
    if not _BUCKET.match(bucket):
        raise InvalidArgumentError(f"{what} {spec!r}: {bucket!r} is not a bucket name (letters, digits, '.', '-', '_')")
    prefix = prefix.strip("/")
    if prefix:
        from store.objects import validate_key

        try:
            validate_key(prefix)
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"{what} {spec!r}: prefix {prefix!r} is not a valid key ({exc})") from None
    return StoreLocation("s3", spec, bucket=bucket, prefix=prefix)


def parse_endpoint_url(url: str, what: str = "S3 endpoint") -> str:
    """``url`` if it is an S3 endpoint boto3 can use (http:// or https://, a host, a port in range); InvalidArgumentError
    saying what to write otherwise (``127.0.0.1:5055`` has no scheme: write http://127.0.0.1:5055).
    """
    if not isinstance(url, str) or not url.strip():
        raise InvalidArgumentError(f"{what} is empty; write http://HOST:PORT (https:// for TLS)")
    if url != url.strip() or any(ch.isspace() or ord(ch) < 0x20 for ch in url):
        raise InvalidArgumentError(f"{what} {url!r} contains white space or a control character; write http://HOST:PORT")
    scheme, sep, rest = url.partition("://")
    if not sep:
        bare = url.split("/", 1)[0] if url.split("/", 1)[0] else "HOST:PORT"
        raise InvalidArgumentError(f"{what} {url!r} has no scheme; write http://{bare} (https:// for TLS)")
    if scheme.lower() not in ("http", "https"):
        hint = ": the bucket goes in the store URI (s3://BUCKET/PREFIX)" if scheme.lower() == "s3" else ""
        raise InvalidArgumentError(f"{what} {url!r} is not an http:// or https:// URL{hint}; write http://HOST:PORT")
    parts = urlsplit(url)
    if not parts.hostname:
        raise InvalidArgumentError(f"{what} {url!r} names no host; write http://HOST:PORT")
    try:
        parts.port  # noqa: B018 - urllib checks the port when it is read
    except ValueError:
        raise InvalidArgumentError(f"{what} {url!r} has a port that is not a number in 0..65535; write http://HOST:PORT") from None
    return url
