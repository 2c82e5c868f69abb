"""Access control of the pool: TLS settings, bearer tokens scoped to jobs (read/write), and the gRPC interceptor enforcing them."""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import json
import os
import ssl
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from protos import remote_pool_pb2 as pb
from snapshot.errors import InvalidArgumentError, PermissionDeniedError, UnauthenticatedError

READ = "read"
WRITE = "write"
READ_WRITE = "read and write"  # a method that reads a job's state and writes from it (a savepoint)
_ACCESS = {
    "r": frozenset({READ}),
    "read": frozenset({READ}),
    "w": frozenset({WRITE}),
    "write": frozenset({WRITE}),
    "rw": frozenset({READ, WRITE}),
    "read,write": frozenset({READ, WRITE}),
    "write,read": frozenset({READ, WRITE}),
}
# answered without a token, so load balancers and orchestrators can probe the pool
OPEN_METHODS = frozenset({"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"})
REMOTE_POOL_PREFIX = "/" + pb.DESCRIPTOR.services_by_name["RemotePool"].full_name + "/"


@dataclass(frozen=True)
class TlsConfig:
    """PEM certificate chain and key of the server; with a client CA, clients must present a certificate it signed."""

    cert_chain_pem: bytes
    private_key_pem: bytes
    client_ca_pem: bytes | None = None

    @classmethod
    def from_files(cls, cert: str | Path, key: str | Path, client_ca: str | Path | None = None) -> TlsConfig:
        """Read the PEM files; InvalidArgumentError naming a file that cannot be read."""

        def read(path: str | Path) -> bytes:
            try:
                return Path(path).read_bytes()
            except OSError as exc:
                raise InvalidArgumentError(f"cannot read TLS file {path}: {exc.strerror or exc}") from exc

        return cls(read(cert), read(key), read(client_ca) if client_ca else None)

    def grpc_credentials(self) -> grpc.ServerCredentials:
        """Server credentials for grpc.Server.add_secure_port."""
        return grpc.ssl_server_credentials(
            [(self.private_key_pem, self.cert_chain_pem)],
            root_certificates=self.client_ca_pem,
            require_client_auth=self.client_ca_pem is not None,
        )

    @contextmanager
    def pem_files(self) -> Iterator[tuple[str, str, str | None]]:
        """(cert, key, client CA or None) as paths of private temporary files, removed on exit (for APIs that take paths)."""
        with tempfile.TemporaryDirectory(prefix="clink-tls-") as folder:

            def write(name: str, pem: bytes) -> str:
                path = os.path.join(folder, name)
                with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as fh:
                    fh.write(pem)
                return path

            cert, key = write("cert.pem", self.cert_chain_pem), write("key.pem", self.private_key_pem)
            yield cert, key, None if self.client_ca_pem is None else write("ca.pem", self.client_ca_pem)

    def ssl_context(self) -> ssl.SSLContext:
        """A server-side SSLContext for the HTTP ports (TLS 1.2+)."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        with self.pem_files() as (cert, key, _):
            ctx.load_cert_chain(cert, key)
        if self.client_ca_pem is not None:
            ctx.load_verify_locations(cadata=self.client_ca_pem.decode())
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx


@dataclass(frozen=True)
class TokenGrant:
    """What one token may do: job patterns ('*' wildcard, fnmatch style) and access modes (read, write)."""

    token: str
    jobs: tuple[str, ...]
    access: frozenset[str]
    name: str = ""

    @property
    def identity(self) -> str:
        """A stable name of the token that reveals nothing usable: the start of its SHA-256 (the same for a hashed entry)."""
        digest = self.token[len("sha256:") :] if self.token.startswith("sha256:") else hashlib.sha256(self.token.encode()).hexdigest()
        return digest[:16].lower()

    def allows_job(self, job: str) -> bool:
        """Whether any job pattern matches ``job`` exactly (case-sensitive)."""
        return any(p == "*" or fnmatch.fnmatchcase(job, p) for p in self.jobs)


class TokenTable:
    """Bearer tokens and their grants; lookups compare every token in constant time."""

    def __init__(self, grants: list[TokenGrant]) -> None:
        if not grants:
            raise InvalidArgumentError("a token table needs at least one token")
        seen: set[str] = set()
        for grant in grants:
            if not grant.token or any(c.isspace() for c in grant.token):
                raise InvalidArgumentError(f"token {grant.name or '?'} must be non-empty without whitespace")
            if grant.token in seen:
                raise InvalidArgumentError(f"token {grant.name or grant.token[:4] + '...'} is listed twice")
            seen.add(grant.token)
        self.grants = tuple(grants)

    @classmethod
    def from_file(cls, path: str | Path) -> TokenTable:
        """Load JSON ({"tokens": [{"token", "jobs", "access", "name"?}]}) or lines ``TOKEN JOBS ACCESS`` (JOBS comma-separated, '#' comments).

        A TOKEN may be written as ``sha256:<hex digest of the token>``, so the file holds no usable secret.
        """
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidArgumentError(f"cannot read token file {path}: {exc}") from exc
        return cls.parse(text, str(path))

    @classmethod
    def parse(cls, text: str, name: str = "token file") -> TokenTable:
        """Parse the text of a token file (JSON or lines); InvalidArgumentError naming the file and entry."""
        if text.lstrip().startswith("{"):
            try:
                doc = json.loads(text)
                entries = doc["tokens"]
                grants = [
                    _grant(e.get("token"), e.get("jobs"), e.get("access"), e.get("name") or f"#{i}", name) for i, e in enumerate(entries)
                ]
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise InvalidArgumentError(f'{name}: not a token document ({{"tokens": [{{"token", "jobs", "access"}}]}}): {exc}') from exc
            return cls(grants)
        grants = []
        for lineno, line in enumerate(text.splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            fields = line.split()
            if len(fields) != 3:
                raise InvalidArgumentError(f"{name}:{lineno}: expected 'TOKEN JOB[,JOB...] read|write|rw', got {len(fields)} field(s)")
            grants.append(_grant(fields[0], fields[1].split(","), fields[2], f"line {lineno}", name))
        return cls(grants)

    def grant_for(self, token: str | None) -> TokenGrant:
        """The grant of a presented token; UnauthenticatedError for none or an unknown one."""
        if not token:
            raise UnauthenticatedError("no bearer token: send metadata 'authorization: Bearer <token>'")
        found = None
        presented = token.encode("utf-8", "surrogatepass")
        digest = "sha256:" + hashlib.sha256(presented).hexdigest()
        for grant in self.grants:
            # a file may hold 'sha256:<hex>' of a token instead of the token itself, so it leaks no usable secret
            hashed = grant.token.startswith("sha256:")
            if hmac.compare_digest(grant.token.encode(), digest.encode() if hashed else presented):
                found = grant
        if found is None:
            raise UnauthenticatedError("the bearer token is not valid for this pool")
        return found

    def authorize(self, token: str | None, job: str, mode: str) -> TokenGrant:
        """The grant if ``token`` may ``mode`` (read, write, or both) ``job``; UnauthenticatedError or PermissionDeniedError otherwise."""
        grant = self.grant_for(token)
        if not grant.allows_job(job):
            raise PermissionDeniedError(f"token {grant.name} has no access to job {job}")
        if mode == READ_WRITE and not {READ, WRITE} <= grant.access:
            raise PermissionDeniedError(f"token {grant.name} may not read and write job {job} (it may {', '.join(sorted(grant.access))})")
        if mode != READ_WRITE and mode not in grant.access:
            raise PermissionDeniedError(f"token {grant.name} may not {mode} job {job} (it may {', '.join(sorted(grant.access))})")
        return grant


def _grant(token: Any, jobs: Any, access: Any, entry: str, name: str) -> TokenGrant:
    if isinstance(jobs, str):
        jobs = [jobs]
    if not isinstance(token, str) or not isinstance(jobs, list) or not jobs or not all(isinstance(j, str) and j for j in jobs):
        raise InvalidArgumentError(f"{name}: entry {entry} needs a token string and a non-empty list of job patterns")
    modes = _ACCESS.get(str(access).lower().replace(" ", ""))
    if modes is None:
        raise InvalidArgumentError(f"{name}: entry {entry} has access {access!r}; use read, write or rw")
    return TokenGrant(token, tuple(jobs), modes, entry)


def bearer_token(value: str | None) -> str | None:
    """The token of an 'authorization' value 'Bearer <token>' (scheme case-insensitive), None when absent or another scheme."""
    if not value:
        return None
    scheme, _, token = value.strip().partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def _call_token(details: grpc.HandlerCallDetails) -> str | None:
    token = bearer_token(next((v for k, v in details.invocation_metadata or () if k == "authorization"), None))
    return token.decode("utf-8", "replace") if isinstance(token, bytes) else token


def _header_job(request_iterator: Iterator[pb.CommitChunk]) -> tuple[str, Iterator[pb.CommitChunk]]:
    first = next(request_iterator, None)
    job = first.header.job if first is not None and first.WhichOneof("part") == "header" else ""

    def replay() -> Iterator[pb.CommitChunk]:
        if first is not None:
            yield first
        yield from request_iterator

    return job, replay()


# the grant of the call being served (set by AuthInterceptor around the handler), for handlers that record who acted
CALLER: ContextVar[TokenGrant | None] = ContextVar("clink_pool_caller", default=None)


def caller() -> TokenGrant | None:
    """The grant of the token of the call being served; None when the pool runs without tokens."""
    return CALLER.get()


# The one place that says which job each RemotePool method touches and whether it reads or writes.
# CommitCheckpoint is a client stream: its job is in the header, the first message.
METHOD_ACCESS: dict[str, str] = {
    "AcquireWriter": WRITE,
    "CommitCheckpoint": WRITE,
    "DeleteCheckpoint": WRITE,
    "Get": READ,
    "MultiGet": READ,
    "ScanCheckpoint": READ,
    "ListCheckpoints": READ,
    "DescribeCheckpoint": READ,
    "ListJobs": READ,  # answered with the jobs the token may read
    "Savepoint": READ_WRITE,  # copies the job's state: a write-only token must not
    "PinCheckpoint": READ,  # readers pin what they read
    "UnpinCheckpoint": READ,
    "CompactCheckpoint": WRITE,
    "CollectGarbage": WRITE,
    "SetJobPolicy": WRITE,  # as CompactCheckpoint and CollectGarbage: it decides what maintenance deletes
    "GetJobPolicy": READ,
    "RetainCheckpoints": WRITE,
    "AnnounceLiveExport": WRITE,  # a writer of the job says where its live state is served
    "WithdrawLiveExport": WRITE,
}


class AuthInterceptor(grpc.ServerInterceptor):
    """Checks 'authorization: Bearer <token>' on every call but health checks; RemotePool calls also need the job's scope.

    Place it after pool.errors.StatusInterceptor: the errors it raises inside the handler are mapped by that one table
    (UnauthenticatedError -> UNAUTHENTICATED, PermissionDeniedError -> PERMISSION_DENIED). Give that interceptor
    ``admit=auth.authenticate`` too, so a missing or unknown token is refused before the request is decoded.
    """

    def __init__(self, tokens: TokenTable, open_methods: frozenset[str] = OPEN_METHODS) -> None:
        self.tokens = tokens
        self.open_methods = open_methods

    def authenticate(self, details: grpc.HandlerCallDetails) -> TokenGrant | None:
        """The grant of the call's token (None for open methods); UnauthenticatedError for a missing or unknown token."""
        if details.method in self.open_methods:
            return None
        return self.tokens.grant_for(_call_token(details))

    def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Any], details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(details)
        if handler is None or details.method in self.open_methods:
            return handler
        token = _call_token(details)
        method = details.method[len(REMOTE_POOL_PREFIX) :] if details.method.startswith(REMOTE_POOL_PREFIX) else None
        mode = METHOD_ACCESS.get(method or "")
        tokens = self.tokens

        def check(job: str | None) -> TokenGrant:
            if mode is None or job is None:
                return tokens.grant_for(token)  # reflection and other services: any valid token
            return tokens.authorize(token, job, mode)

        if handler.unary_unary is not None:
            inner = handler.unary_unary

            def unary_unary(request: Any, context: grpc.ServicerContext) -> Any:
                if method == "ListJobs":
                    grant = check(None)
                    if READ not in grant.access:
                        raise PermissionDeniedError(f"token {grant.name} may not read jobs")
                    response = inner(request, context)
                    allowed = [j for j in response.jobs if grant.allows_job(j)]
                    del response.jobs[:]
                    response.jobs.extend(allowed)
                    return response
                grant = check(getattr(request, "job", None) if mode else None)
                reset = CALLER.set(grant)
                try:
                    return inner(request, context)
                finally:
                    CALLER.reset(reset)

            return handler._replace(unary_unary=unary_unary)
        if handler.unary_stream is not None:
            inner_us = handler.unary_stream

            def unary_stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                reset = CALLER.set(check(getattr(request, "job", None) if mode else None))
                try:
                    yield from inner_us(request, context)
                finally:
                    CALLER.reset(reset)

            return handler._replace(unary_stream=unary_stream)
        if handler.stream_unary is not None:
            inner_su = handler.stream_unary

            def stream_unary(request_iterator: Iterator[Any], context: grpc.ServicerContext) -> Any:
                if mode is None:
                    check(None)
                    return inner_su(request_iterator, context)
                tokens.grant_for(token)  # no token: refused before a single chunk is read
                job, replay = _header_job(request_iterator)
                reset = CALLER.set(check(job))
                try:
                    return inner_su(replay, context)
                finally:
                    CALLER.reset(reset)

            return handler._replace(stream_unary=stream_unary)
        if handler.stream_stream is not None:
            inner_ss = handler.stream_stream

            def stream_stream(request_iterator: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
                check(None)
                yield from inner_ss(request_iterator, context)

            return handler._replace(stream_stream=stream_stream)
        return handler
