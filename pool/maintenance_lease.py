"""One maintainer per job across the pools of a bucket: a lease object per job, written only by conditional writes."""

from __future__ import annotations

import json
import threading
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
    released: bool = False

    def to_dict(self, holder_id: str, now_ms: int) -> dict[str, object]:
        """The status page's view: holder, expiry, and whether ``holder_id`` holds it unexpired at ``now_ms``."""
        return {"holder": self.holder, "expires_ms": self.expires_ms, "ours": self.holder == holder_id and self.expires_ms > now_ms}


def encode_lease(job: str, holder: str, acquired_ms: int, expires_ms: int, released: bool = False) -> bytes:
    """The stored JSON body of a lease (``released``: given back on a clean stop, free to take at once)."""
    body = {"format": LEASE_FORMAT, "job": job, "holder": holder, "acquired_ms": acquired_ms, "expires_ms": expires_ms}
    if released:
        body["released"] = True
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
    released = body.get("released", False)
    if type(released) is not bool:
        return None
    return Lease(job, holder, acquired, expires, etag, released)


class MaintenanceLeases:
    """The leases one pool (``holder_id``) takes, renews and releases; a lost race or a live lease of another is "not ours".

    Expiry is judged on the reader's own clock, never on the holder's stamp: another's lease is free once this pool has
    seen the same etag unchanged for lease_ttl_s (a live holder renews it every round), so pools' clocks may disagree by
    any amount; only their rates matter. An overlap costs duplicate work, never data (every task is safe beside any other).
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
        # job -> (etag of another's lease, when this pool first saw that etag, by its own clock)
        self._seen: dict[str, tuple[str, int]] = {}
        self._seen_lock = threading.Lock()

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

        New: put_if_absent. Ours, a released or damaged one, or another's whose etag this pool has seen unchanged for
        lease_ttl_s: compare_and_swap on the etag read, so of two pools racing for it exactly one wins; the loser's
        ConflictError is the normal "not ours". Store errors other than a lost race propagate (the round records them).
        """
        key = lease_key(job)
        current = self.read(job)
        now = self.now_ms()
        if (
            current is not None
            and current.holder not in (self.holder_id, "")
            and not current.released
            and not self._lapsed(job, current, now)
        ):
            return None, current  # another pool holds it
        ours = current is not None and current.holder == self.holder_id and not current.released
        acquired = current.acquired_ms if ours and current is not None else now
        expires = now + self.ttl_ms
        body = encode_lease(job, self.holder_id, acquired, expires)
        try:
            etag = self.store.put_if_absent(key, body) if current is None else self.store.compare_and_swap(key, body, current.etag)
        except (ConflictError, NotFoundError):
            return None, self.read(job)  # another pool wrote it first (or released it) since our read
        with self._seen_lock:
            self._seen.pop(job, None)
        return Lease(job, self.holder_id, acquired, expires, etag), None

    def _lapsed(self, job: str, lease: Lease, now_ms: int) -> bool:
        """True once this pool has seen ``lease``'s etag unchanged for ttl by its own clock (its holder stopped renewing)."""
        with self._seen_lock:
            seen = self._seen.get(job)
            if seen is None or seen[0] != lease.etag:
                self._seen[job] = (lease.etag, now_ms)
                return False
            return now_ms - seen[1] >= self.ttl_ms

    def release(self, lease: Lease) -> bool:
        """Give a lease back (clean stop): mark it released by compare-and-swap on its etag; False when no longer ours as held."""
        now = self.now_ms()
        body = encode_lease(lease.job, self.holder_id, lease.acquired_ms, min(now, lease.expires_ms), released=True)
        try:
            self.store.compare_and_swap(lease_key(lease.job), body, lease.etag)
        except (ConflictError, NotFoundError):
            return False
        return True
