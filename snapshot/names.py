"""The one rule for names a store keys by (job ids, savepoint names, pin holders), and what a host name means: pool, client and CLI apply them alike."""

from __future__ import annotations

import ipaddress

from snapshot.errors import InvalidArgumentError

MAX_NAME_BYTES = 128


def _forbidden(c: str) -> bool:
    # whitespace too: a job id is typed into URLs (grpc://HOST:PORT/JOB, /jobs/JOB/state.arrow) and shells unquoted
    return c in "/\\" or c.isspace() or ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 or 0xD800 <= ord(c) < 0xE000


def validate_job(job: object, max_bytes: int = MAX_NAME_BYTES, what: str = "job id") -> str:
    """A job id that cannot leave its prefix: non-empty, no whitespace, '/', '\\', '..' or control characters, at most max_bytes UTF-8."""
    if not isinstance(job, str) or not job:
        raise InvalidArgumentError(f"{what} must be a non-empty string, got {job!r}")
    size = len(job.encode("utf-8", errors="surrogatepass"))
    if size > max_bytes:
        raise InvalidArgumentError(f"{what} is {size} bytes; at most {max_bytes} are allowed")
    bad = next((c for c in job if _forbidden(c)), None)
    if bad is not None:
        raise InvalidArgumentError(
            f"{what} {job!r} contains a forbidden character {bad!r} (no whitespace, '/', '\\' or control characters)"
        )
    if ".." in job or job == "." or job.startswith(".clink-"):
        raise InvalidArgumentError(f"{what} {job!r} must not contain '..', be '.' or start with '.clink-'")
    return job


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` names this machine (a token sent there in plaintext never crosses a network)."""
    if not host:
        return False
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
