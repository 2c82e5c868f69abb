"""Live export: running subtasks announce where their live state is served; the pool fetches and merges them into one stream."""

from __future__ import annotations

import http.client
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pool.domain import FULL_RANGE, KeyGroupRange, LiveExportConfig
from pool.writers import Fencing, fenced_error
from snapshot import filter_key_groups, has_adjacent_repeats, in_layout_order, leading_bytes, merge_tables, read_snapshot
from snapshot.errors import (
    ClinkError,
    FencedError,
    InvalidArgumentError,
    LimitExceededError,
    NotFoundError,
    ResourceExhaustedError,
    UnavailableError,
)
from snapshot.format import CANONICAL_SCHEMA, SnapshotArrowWriter, operators_from_metadata, operators_metadata
from snapshot.keys import NUM_KEY_GROUPS
from snapshot.names import is_loopback
from snapshot.versions import StateVersionMap

log = logging.getLogger("clink.pool.live")

# headers a subtask's answer carries, checked against its announcement (a URL reused by another process is refused)
JOB_HEADER = "X-Clink-Job"
KEY_GROUPS_HEADER = "X-Clink-Key-Groups"
CHECKPOINT_HEADER = "X-Clink-Checkpoint"
_READ_CHUNK = 8 << 20


@dataclass(frozen=True)
class LiveAnnouncement:
    """One subtask's live-state URL for its range at its writer epoch, until ``expires_at`` (the pool's monotonic clock)."""

    job: str
    key_groups: KeyGroupRange
    epoch: int
    url: str
    token: str = field(repr=False)  # a bearer secret: never in a log line or an error
    expires_at: float = 0.0


@dataclass(frozen=True)
class SubtaskState:
    """What one subtask answered: its rows (keyed rows of its range and operator state) and the checkpoint they overlay."""

    announcement: LiveAnnouncement
    keyed: pa.Table  # its keyed rows, of its range only
    operator_state: pa.Table  # its operator-state rows (every subtask holds them; the merge's collision rule picks)
    checkpoint_id: int
    state_versions: StateVersionMap
    extra_metadata: dict[bytes, bytes]


@dataclass(frozen=True)
class LiveState:
    """A job's merged live state: one table, the subtasks it came from, and the key-group ranges nobody answered for."""

    job: str
    table: pa.Table
    subtasks: tuple[SubtaskState, ...]
    missing: tuple[KeyGroupRange, ...]
    writer: SnapshotArrowWriter

    def subtasks_header(self) -> str:
        """'LO-HI@CHECKPOINT' per subtask, ascending: which checkpoint each range's live rows overlay (0: none yet)."""
        return ", ".join(f"{s.announcement.key_groups}@{s.checkpoint_id}" for s in self.subtasks)

    def missing_header(self) -> str:
        """The ranges left out, comma-separated ('' when none)."""
        return ", ".join(str(r) for r in self.missing)


def check_live_url(url: str) -> str:
    """An announced URL: http(s)://host:port/path with no credentials, fragment or whitespace; InvalidArgumentError otherwise."""
    if not isinstance(url, str) or not url or len(url) > 2048 or any(c.isspace() or ord(c) < 32 for c in url):
        raise InvalidArgumentError(f"live export url {url!r} must be a short http(s):// URL without spaces")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidArgumentError(f"live export url {url!r} must be http://HOST:PORT/... or https://HOST:PORT/...")
    if parts.username is not None or parts.password is not None or parts.fragment:
        raise InvalidArgumentError(f"live export url {url!r} must carry no credentials or fragment (the token travels apart)")
    try:
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError:
        raise InvalidArgumentError(f"live export url {url!r} has a bad port") from None
    return url


def gaps(ranges: list[KeyGroupRange]) -> list[KeyGroupRange]:
    """The key groups of 0..127 that sorted, non-overlapping ``ranges`` leave out, as ranges."""
    out, nxt = [], 0
    for r in ranges:
        if r.lo > nxt:
            out.append(KeyGroupRange(nxt, r.lo - 1))
        nxt = max(nxt, r.hi + 1)
    if nxt < NUM_KEY_GROUPS:
        out.append(KeyGroupRange(nxt, NUM_KEY_GROUPS - 1))
    return out


class LiveExports:
    """The announcements a pool holds, in memory: a subtask renews its own before it expires, so a pool restart loses nothing."""

    def __init__(self, fencing: Fencing, config: LiveExportConfig | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.fencing = fencing
        self.config = config or LiveExportConfig()
        self._clock = clock
        self._lock = threading.Lock()
        self._by_job: dict[str, list[LiveAnnouncement]] = {}

    def _count(self) -> int:
        return sum(len(v) for v in self._by_job.values())

    def announce(self, job: str, key_groups: KeyGroupRange, epoch: int, url: str, token: str, ttl_s: int) -> int:
        """Record (or renew) a subtask's URL; FencedError unless ``epoch`` owns ``key_groups``. Returns the expiry in ms since the epoch."""
        check_live_url(url)
        if isinstance(ttl_s, bool) or not isinstance(ttl_s, int) or not 1 <= ttl_s <= self.config.max_ttl_s:
            raise InvalidArgumentError(f"live export ttl_seconds {ttl_s!r} must be 1..{self.config.max_ttl_s}")
        if len(token) > 4096 or any(not 0x21 <= ord(c) <= 0x7E for c in token):
            # a bearer goes into a header line: visible ASCII only (a newline would leak it into http.client's error)
            raise InvalidArgumentError("a live export token must be at most 4096 visible ASCII characters (no spaces or controls)")
        table = self.fencing.check(job, key_groups, epoch)  # a zombie cannot announce
        now = self._clock()
        entry = LiveAnnouncement(job, key_groups, epoch, url, token, now + ttl_s)
        with self._lock:
            self._prune_expired(now)  # jobs that died without withdrawing must not fill the limit
            current = list(self._by_job.get(job, []))
            newer = [a for a in current if a.key_groups.overlaps(key_groups) and a.epoch > epoch]
            if newer:  # a newer writer announced between our check and now
                raise fenced_error(job, key_groups, epoch, table)
            # the overlapping ranges (older writers, this subtask's own earlier range) and its old URL give way
            kept = [a for a in current if not a.key_groups.overlaps(key_groups) and a.url != url]
            if self._count() - len(self._by_job.get(job, [])) + len(kept) + 1 > self.config.max_announcements:
                raise ResourceExhaustedError(f"the pool holds {self.config.max_announcements} live export announcements, its limit")
            self._by_job[job] = sorted([*kept, entry], key=lambda a: a.key_groups.lo)
        return int((time.time() + ttl_s) * 1000)

    def _prune_expired(self, now: float) -> None:
        """Drop every job's expired announcements (under the lock)."""
        for job in list(self._by_job):
            kept = [a for a in self._by_job[job] if a.expires_at > now]
            if kept:
                self._by_job[job] = kept
            else:
                del self._by_job[job]

    def withdraw(self, job: str, key_groups: KeyGroupRange, epoch: int) -> bool:
        """Drop the announcement of exactly this range and epoch; whether there was one."""
        with self._lock:
            entries = self._by_job.get(job, [])
            kept = [a for a in entries if not (a.key_groups == key_groups and a.epoch == epoch)]
            if kept:
                self._by_job[job] = kept
            else:
                self._by_job.pop(job, None)
            return len(kept) != len(entries)

    def current(self, job: str) -> list[LiveAnnouncement]:
        """The job's announcements neither expired nor fenced (the writers table read once), ascending by range."""
        now = self._clock()
        with self._lock:
            entries = [a for a in self._by_job.get(job, []) if a.expires_at > now]
            if not entries:
                self._by_job.pop(job, None)
                return []
            self._by_job[job] = entries
        fenced = self._fenced(job, entries)
        return [a for a in entries if a not in fenced]

    def _fenced(self, job: str, entries: list[LiveAnnouncement]) -> list[LiveAnnouncement]:
        """Those of ``entries`` whose range a newer writer took (read from the writers table now); their announcements go for good."""
        table, _ = self.fencing.read(job)
        fenced = [a for a in entries if not table.holds(a.key_groups.lo, a.key_groups.hi, a.epoch)]
        if fenced:
            with self._lock:
                kept = [a for a in self._by_job.get(job, []) if a not in fenced]
                if kept:
                    self._by_job[job] = kept
                else:
                    self._by_job.pop(job, None)
        return fenced

    # -- the merge ------------------------------------------------------------------------------------------------

    def _ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cadata=self.config.ca_pem.decode() if self.config.ca_pem else None)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        return ctx

    def _late(self, a: LiveAnnouncement) -> UnavailableError:
        return UnavailableError(f"{_subtask(a)} did not finish within {self.config.fetch_timeout_s:g} s")

    def _over_budget(self, job: str) -> LimitExceededError:
        return LimitExceededError(f"live export of job {job}: the subtasks' state is over {self.config.max_bytes} bytes, the pool's limit")

    def _connect(self, a: LiveAnnouncement, timeout: float) -> http.client.HTTPConnection:
        """A connection to the announced host (http.client: no proxy from the environment, no redirect followed)."""
        parts = urlsplit(a.url)
        host = parts.hostname or ""
        if parts.scheme == "https":
            return http.client.HTTPSConnection(host, parts.port, timeout=timeout, context=self._ssl_context())
        return http.client.HTTPConnection(host, parts.port, timeout=timeout)

    def _fetch(
        self, a: LiveAnnouncement, deadline: float, budget: list[int], connections: dict[int, http.client.HTTPConnection], cut: set[int]
    ) -> SubtaskState:
        """GET one subtask's state; UnavailableError naming its range for any failure (the pool stays up, the export says which).

        Its connection is kept in ``connections`` (by id of the announcement) so that _gather can cut it at the deadline;
        ``cut`` holds the ids _gather gave up on (a connection made after that is closed before it sends anything).
        """
        what = _subtask(a)
        remaining = deadline - self._clock()
        if remaining <= 0:
            raise self._late(a)
        parts = urlsplit(a.url)
        if a.token and parts.scheme != "https" and not is_loopback(parts.hostname or ""):
            raise UnavailableError(f"{what}: the pool sends a subtask's token over https only, or to a loopback address")
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn = self._connect(a, remaining)
        connections[id(a)] = conn
        chunks = []
        try:
            conn.connect()  # a slow name lookup may outlast the deadline: checked below, before anything is sent
            if id(a) in cut or self._clock() > deadline:
                raise self._late(a)
            conn.request("GET", target, headers={"Authorization": f"Bearer {a.token}"} if a.token else {})
            response = conn.getresponse()
            if response.status != 200:
                raise UnavailableError(f"{what} answered HTTP {response.status}")
            job, kg = response.getheader(JOB_HEADER), response.getheader(KEY_GROUPS_HEADER)
            if job != a.job or kg != str(a.key_groups):
                raise UnavailableError(f"{what} answered for job {job!r} key groups {kg!r}: not the subtask announced")
            length = response.getheader("Content-Length")
            if length is not None and length.isdigit() and int(length) > budget[0]:
                raise self._over_budget(a.job)
            while True:
                if self._clock() > deadline:
                    raise self._late(a)
                with self._lock:
                    left = budget[0]
                chunk = response.read(max(1, min(_READ_CHUNK, left + 1)))  # never more than one byte past the budget
                if not chunk:
                    break
                with self._lock:
                    budget[0] -= len(chunk)
                    over = budget[0] < 0
                if over:
                    raise self._over_budget(a.job)
                chunks.append(chunk)
            checkpoint_id = int(response.getheader(CHECKPOINT_HEADER) or 0)
        except ClinkError:
            raise
        except (OSError, ValueError, http.client.HTTPException) as exc:  # refused, reset, timed out, cut, TLS refused, not HTTP
            if self._clock() > deadline or id(a) in cut:
                raise self._late(a) from None
            # an OS error says what the network did; the others would echo the peer's bytes or a header: their type only
            reason = f"{type(exc).__name__}: {exc}"[:300] if isinstance(exc, OSError) else f"{type(exc).__name__} (not an HTTP answer)"
            raise UnavailableError(f"{what} did not answer: {reason}") from None
        finally:
            conn.close()
        try:
            snap = read_snapshot(b"".join(chunks))
        except ClinkError as exc:
            raise UnavailableError(f"{what} sent a stream that is not a canonical snapshot: {exc}") from None
        if snap.is_changelog:
            raise UnavailableError(f"{what} sent a changelog stream, not its canonical live state")
        # keyed rows outside its range are not its to give (operator-state rows are every subtask's)
        table = snap.table.replace_schema_metadata(None)
        lead = leading_bytes(table.column("key_bytes")) if table.num_rows else np.zeros(0, dtype=np.uint8)
        operator_rows = lead >= NUM_KEY_GROUPS
        mine = ~operator_rows & (lead >= a.key_groups.lo) & (lead <= a.key_groups.hi)
        keyed = (table if mine.all() else table.filter(pa.array(mine))).cast(CANONICAL_SCHEMA)  # no copy when all are its own
        if keyed.num_rows > 1 and _may_repeat(keyed):
            keyed = merge_tables([keyed])  # a key sent twice is one row, by the rule merge_snapshot_bytes applies
        operator_state = table.filter(pa.array(operator_rows)) if operator_rows.any() else table.slice(0, 0)
        return SubtaskState(a, keyed, operator_state, checkpoint_id, snap.state_versions, dict(snap.extra_metadata))

    def _gather(
        self, job: str, chosen: list[LiveAnnouncement], executor: ThreadPoolExecutor | None
    ) -> tuple[list[SubtaskState], list[tuple[LiveAnnouncement, ClinkError]]]:
        """Fetch ``chosen`` at once; whatever has not answered by the deadline has its connection cut and counts as failed."""
        deadline = self._clock() + self.config.fetch_timeout_s
        budget = [self.config.max_bytes]
        connections: dict[int, http.client.HTTPConnection] = {}
        cut: set[int] = set()
        own = executor is None
        pool = executor or ThreadPoolExecutor(max_workers=min(16, max(1, len(chosen))), thread_name_prefix="live-fetch")
        answered: list[SubtaskState] = []
        failed: list[tuple[LiveAnnouncement, ClinkError]] = []
        try:
            futures: list[tuple[LiveAnnouncement, Future[SubtaskState]]] = [
                (a, pool.submit(self._fetch, a, deadline, budget, connections, cut)) for a in chosen
            ]
            wait([f for _, f in futures], timeout=max(0.0, deadline - self._clock()) + 0.05)
            for a, future in futures:
                if not future.done():  # a subtask trickling its answer: cut it, its thread ends at once
                    cut.add(id(a))  # first: a connection made after this sees it and sends nothing
                    _cut(connections.get(id(a)))
                    future.cancel()
                    failed.append((a, self._late(a)))
                    continue
                try:
                    answered.append(future.result())
                except LimitExceededError:
                    raise
                except (UnavailableError, FencedError) as exc:
                    failed.append((a, exc))
        finally:
            if own:
                pool.shutdown(wait=False, cancel_futures=True)
        # a subtask fenced while it answered (a newer writer restored its range) gave a zombie's rows: not served
        fenced = set(map(id, self._fenced(job, [s.announcement for s in answered])))
        for s in [s for s in answered if id(s.announcement) in fenced]:
            answered.remove(s)
            failed.append(
                (
                    s.announcement,
                    UnavailableError(
                        f"the subtask of key groups {s.announcement.key_groups} of job {job} was fenced while it answered (a newer writer took its range); retry"
                    ),
                )
            )
        return answered, failed

    def live_state(
        self, job: str, key_groups: KeyGroupRange | None = None, allow_partial: bool = False, executor: ThreadPoolExecutor | None = None
    ) -> LiveState:
        """Fetch every announced subtask of ``job`` at once and merge their state (keyed rows of ``key_groups`` only).

        Every subtask is fetched even for a key-group filter: operator state is every subtask's, merged by the collision rule.
        NotFoundError when no subtask of the job is announced; UnavailableError naming the ranges that no subtask covers
        or whose subtask did not answer in time, unless ``allow_partial`` (then they are named in ``missing``).
        """
        wanted = key_groups or FULL_RANGE
        announced = self.current(job)
        if not announced:
            raise NotFoundError(f"job {job} has no running subtask announcing a live export (see RemoteReadBackend.serve_live_export)")
        holes = [_clip(g, wanted) for g in gaps([a.key_groups for a in announced]) if g.overlaps(wanted)]
        if holes and not allow_partial:
            raise UnavailableError(
                f"live export of job {job}: no running subtask announces key groups {', '.join(map(str, holes))}; "
                "retry, or add &partial=allow for the rest"
            )
        answered, failed = self._gather(job, announced, executor)
        if failed and not allow_partial:
            raise UnavailableError("; ".join(str(exc) for _, exc in failed) + " (add &partial=allow for the rest)")
        for a, err in failed:
            log.warning("live export of job %s leaves out key groups %s: %s", job, a.key_groups, err)
        # a silent subtask outside the filter is named whole: its operator state is missing from the merge
        missing = sorted(
            [*holes, *(_clip(a.key_groups, wanted) if a.key_groups.overlaps(wanted) else a.key_groups for a, _ in failed)],
            key=lambda r: r.lo,
        )
        answered.sort(key=lambda s: s.announcement.key_groups.lo)
        # the ranges are disjoint, so keyed rows cannot collide: only operator state goes through the merge's collision rule
        table = pa.concat_tables([*(s.keyed for s in answered), merge_tables(s.operator_state for s in answered)])
        if key_groups is not None:
            table = filter_key_groups(table, wanted.lo, wanted.hi)
        return LiveState(job, table, tuple(answered), tuple(missing), _writer(answered))


def _may_repeat(table: pa.Table) -> bool:
    """Whether a (op_id, key) pair may occur twice: neighbours when sorted, else one hash pass over key_bytes (an equal key of two operators counts)."""
    if in_layout_order(table):
        return has_adjacent_repeats(table)
    return len(pc.unique(table.column("key_bytes"))) != table.num_rows


def _subtask(a: LiveAnnouncement) -> str:
    """How errors and logs name a subtask: its range, job and URL (never its token)."""
    return f"the subtask of key groups {a.key_groups} of job {a.job} ({a.url})"


def _clip(r: KeyGroupRange, wanted: KeyGroupRange) -> KeyGroupRange:
    return KeyGroupRange(max(r.lo, wanted.lo), min(r.hi, wanted.hi))


def _cut(conn: http.client.HTTPConnection | None) -> None:
    """Shut a fetch's socket down so that its blocked read fails at once."""
    sock = getattr(conn, "sock", None)
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _writer(answered: list[SubtaskState]) -> SnapshotArrowWriter:
    """The merged stream's writer: every subtask's operator names and state versions (the greater version where two differ)."""
    names: dict[int, str] = {}
    versions: dict[tuple[int, str], int] = {}
    extra: dict[bytes, bytes] = {}
    for s in answered:
        for key, value in s.extra_metadata.items():
            extra.setdefault(key, value)
        names.update({op: uid for op, uid in operators_from_metadata(s.extra_metadata).items() if op not in names})
        for (op, state), version in s.state_versions.items():
            versions[(op, state)] = max(version, versions.get((op, state), 0))
    extra.update(operators_metadata(names))
    return SnapshotArrowWriter(StateVersionMap(versions), extra)
