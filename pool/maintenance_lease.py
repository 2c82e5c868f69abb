"""One maintainer per job across the pools of a bucket: a lease object per job, written only by conditional writes."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from snapshot.errors import ConflictError, InvalidArgumentError, NotFoundError
from snapshot.names import validate_job
from store.objects import ObjectStore

MAINTENANCE_PREFIX = "maintenance/"
LEASE_PREFIX = f"{MAINTENANCE_PREFIX}leases/"
LEASE_FORMAT = "clink.maintenance-lease"
_LEASE_SUFFIX = ".json"


def lease_key(job: str) -> str:
    """maintenance/leases/<job>.json: outside jobs/, so GC, retention and job listings never take it for job state."""
    return f"{LEASE_PREFIX}{validate_job(job)}{_LEASE_SUFFIX}"


@dataclass(frozen=True)
class Lease:
    """A job's lease as read from the store: who holds it, since and until when (ms by the writer's clock), and its etag."""

    job: str
    holder: str
    acquired_ms: int
    expires_ms: int
    etag: str

    def to_dict(self, holder_id: str, now_ms: int) -> dict[str, object]:
        """The status page's view: holder, expiry, and whether ``holder_id`` holds it unexpired at ``now_ms``."""
        return {"holder": self.holder, "expires_ms": self.expires_ms, "ours": self.holder == holder_id and self.expires_ms > now_ms}


def encode_lease(job: str, holder: str, acquired_ms: int, expires_ms: int) -> bytes:
    """The stored JSON body of a lease."""
    body = {"format": LEASE_FORMAT, "job": job, "holder": holder, "acquired_ms": acquired_ms, "expires_ms": expires_ms}
    return json.dumps(body, sort_keys=True).encode()


def decode_lease(job: str, data: bytes, etag: str) -> Lease | None:
    """The lease a stored body holds; None when it is not one (a damaged body counts as expired and is taken over by CAS)."""
    try:
        body = json.loads(data)
        holder, acquired, expires = body["holder"], body["acquired_ms"], body["expires_ms"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None
    if body.get("format") != LEASE_FORMAT or not isinstance(holder, str) or not all(type(v) is int for v in (acquired, expires)):
        return None
    return Lease(job, holder, acquired, expires, etag)


class MaintenanceLeases:
    """The leases one pool (``holder_id``) takes, renews and releases; a lost race or a live lease of another is "not ours".

    Clock skew: a pool takes over a lease expired by its own clock, so tasks never overlap only while pools' clocks agree
    within lease_ttl_s minus the longest task; an overlap costs duplicate work, never data (every task is safe beside any other).
    """

    def __init__(self, store: ObjectStore, holder_id: str, ttl_s: float, clock: Callable[[], float]) -> None:
        if not isinstance(holder_id, str) or not holder_id:
            raise InvalidArgumentError(f"maintenance holder id {holder_id!r} must be a non-empty string")
        if not ttl_s > 0:
            raise InvalidArgumentError(f"lease_ttl_s = {ttl_s!r} must be positive")
        self.store = store
        self.holder_id = holder_id
        self.ttl_ms = int(ttl_s * 1000)
        self.clock = clock

    def now_ms(self) -> int:
        """This pool's clock in milliseconds."""
        return int(self.clock() * 1000)

    def read(self, job: str) -> Lease | None:
        """The job's lease as stored (None when there is none); a damaged body reads as a lease expired at 0 held by nobody."""
        key = lease_key(job)
        try:
            data, etag = self.store.get_with_etag(key)
        except NotFoundError:
            return None
        return decode_lease(job, data, etag) or Lease(job, "", 0, 0, etag)

    def acquire(self, job: str) -> tuple[Lease | None, Lease | None]:
        """Take or renew the job's lease: (our lease, None) when held, (None, the current lease or None) when not ours.

        New: put_if_absent. Ours (even expired) or another's expired by our clock: compare_and_swap on the etag read, so
        of two pools racing for it exactly one wins; the loser's ConflictError is the normal "not ours". Store errors
        other than a lost race propagate (the round records them).
        """
        key = lease_key(job)
        current = self.read(job)
        now = self.now_ms()
        if current is not None and current.holder != self.holder_id and current.expires_ms > now:
            return None, current  # another pool holds it
        acquired = current.acquired_ms if current is not None and current.holder == self.holder_id and current.expires_ms > now else now
        expires = now + self.ttl_ms
        body = encode_lease(job, self.holder_id, acquired, expires)
        try:
            etag = self.store.put_if_absent(key, body) if current is None else self.store.compare_and_swap(key, body, current.etag)
        except (ConflictError, NotFoundError):
            return None, self.read(job)  # another pool wrote it first (or released it) since our read
        return Lease(job, self.holder_id, acquired, expires, etag), None

    def release(self, lease: Lease) -> bool:
        """Give a lease back (clean stop): expire it now by compare-and-swap on its etag; False when it is no longer ours as held."""
        now = self.now_ms()
        body = encode_lease(lease.job, self.holder_id, lease.acquired_ms, min(now, lease.expires_ms))
        try:
            self.store.compare_and_swap(lease_key(lease.job), body, lease.etag)
        except (ConflictError, NotFoundError):
            return False
        return True
