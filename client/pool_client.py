"""PoolClient: the one client module that speaks gRPC; everything it returns or raises is a domain type."""

from __future__ import annotations

import itertools
import json
import logging
import random
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc

from client.errors import (
    ClinkError,
    ConflictError,
    FencedError,
    InvalidArgumentError,
    UnavailableError,
    error_attributes_of,
    error_class_of,
    error_from_status,
    retryable,
)
from client.pool_addresses import PoolAddresses, join_names, parse_pool_addresses
from protos import remote_pool_pb2 as pb
from protos import remote_pool_pb2_grpc as pb_grpc
from snapshot.keys import NUM_KEY_GROUPS
from snapshot.names import validate_job

KeyGroups = tuple[int, int]
T = TypeVar("T")
log = logging.getLogger("clink.client.pool")


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter for UNAVAILABLE / RESOURCE_EXHAUSTED, bounded attempts."""

    max_attempts: int = 8
    initial_backoff_s: float = 0.05
    max_backoff_s: float = 2.0
    multiplier: float = 2.0
    # attempts when nothing listens at the address ("connection refused"); None: max_attempts. A worker started before
    # its pool keeps the full budget; a command line that reads a pool once gives up sooner (clink sources use 3).
    refused_attempts: int | None = None
    # with several pool addresses: one that gave no answer (nothing listening, not a pool) starts no call for this long, then
    # is tried again, so a restarted pool is back in the rotation within it
    down_pool_rest_s: float = 1.0

    def backoff(self, attempt: int, rng: random.Random) -> float:
        """Sleep before retry number ``attempt`` (0-based): uniform in [0, min(cap, base * mult**attempt)]."""
        # full jitter, as store/retry.py backs off from the store: the client depends on no store code
        return rng.uniform(0.0, min(self.max_backoff_s, self.initial_backoff_s * self.multiplier**attempt))


# one MultiGet carries at most this many keys and key bytes (half the pool's default limits); larger asks are split
MULTI_GET_BATCH_KEYS = 50_000
MULTI_GET_BATCH_BYTES = 4 << 20


def _batches(sizes: list[int], max_items: int, max_bytes: int) -> Iterator[tuple[int, int]]:
    """[lo, hi) runs of items, each at most max_items long and max_bytes big (an item bigger alone is a run of one)."""
    lo, total = 0, 0
    for i, size in enumerate(sizes):
        if i > lo and (i - lo >= max_items or total + size > max_bytes):
            yield lo, i
            lo, total = i, 0
        total += size
    if lo < len(sizes) or not sizes:
        yield lo, len(sizes)


# grpc's words when a server answered at the address, but not in HTTP/2: no retry will change that
_NOT_HTTP2 = "Failed parsing HTTP/2"
_FRAME_TYPE = re.compile(r"got frame type (\d+)")
# the first bytes of an HTTP/1 answer read as an HTTP/2 frame header: "HTTP/1.1 400" (type 'P'), or "<!DOCTYPE" (type 'O'),
# the error page Python's http.server (the pool's --http-port) sends for HTTP/2's preface
_HTTP1_FRAME_TYPES = frozenset({ord("P"), ord("O")})


# grpc's words when nothing listens at the address (the TCP connection was refused)
_REFUSED = "connection refused"


def nothing_listening(code: grpc.StatusCode, details: str | None, address: str) -> str | None:
    """A one-line reason when a call failed because no server listens at ``address``, else None."""
    if code != grpc.StatusCode.UNAVAILABLE or not details or _REFUSED not in details.lower():
        return None
    return f"no pool is listening on {address} (start one with clink-pool serve)"


def not_a_pool(details: str | None, address: str) -> str | None:
    """A one-line reason when a call's failure says the server at ``address`` does not speak gRPC at all, else None."""
    if not details or _NOT_HTTP2 not in details:
        return None
    frame = _FRAME_TYPE.search(details)
    http1 = "http1.x" in details or (frame is not None and int(frame.group(1)) in _HTTP1_FRAME_TYPES)
    where = "the port given to clink-pool serve --listen (7420 by default)"
    if http1:
        return f"{address} is not a gRPC pool (HTTP/1 answered): is it the pool's --http-port? The pool speaks gRPC on {where}"
    return f"{address} is not a gRPC pool (it answered, but not in HTTP/2): the pool speaks gRPC on {where}"


def _unreachable(message: str, reason: str) -> UnavailableError:
    """UnavailableError for an address with no pool behind it; ``unreachable`` holds the reason without the call's name."""
    err = UnavailableError(message)
    err.unreachable = reason  # type: ignore[attr-defined]
    return err


@dataclass(frozen=True)
class PoolClientConfig:
    """How the client talks to a pool: deadlines per call kind, retries, message limits, credentials."""

    call_deadline_s: float = 10.0
    commit_deadline_s: float = 120.0
    scan_deadline_s: float = 300.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    max_message_bytes: int = 256 * 1024 * 1024
    commit_chunk_bytes: int = 1024 * 1024
    # Bearer token sent as the authorization metadata on every call; None sends none.
    token: str | None = None
    # PEM root certificates: set to talk TLS to the pool.
    tls_root_certificates: bytes | None = None
    tls_server_name: str | None = None
    # PEM client certificate chain and key, for pools that require mutual TLS
    tls_client_cert: bytes | None = None
    tls_client_key: bytes | None = None
    sleep: Callable[[float], None] = time.sleep
    seed: int | None = None
    # (host, port) -> every HOST:PORT the name resolves to; None: the system resolver. Used for a dns:/// address's live-export
    # announcements, which go to each pool behind the name
    resolve_host: Callable[[str, int], list[str]] | None = None


@dataclass(frozen=True)
class WriterLease:
    """A writer epoch for a job's key-group range, and the newest complete checkpoint when it was granted."""

    job: str
    key_groups: KeyGroups
    epoch: int
    latest_checkpoint_id: int


@dataclass(frozen=True)
class CheckpointInfo:
    """What the pool says about one checkpoint."""

    job: str
    checkpoint_id: int
    parent_id: int
    complete: bool
    committed_ranges: tuple[KeyGroups, ...]
    created_at_ms: int
    num_files: int
    total_bytes: int
    num_rows: int
    operators: dict[int, str]
    state_versions: str
    # etag of the complete checkpoint's _metadata (passed back on reads so the pool may answer from its cache)
    manifest_etag: str = ""
    # a complete checkpoint a rewind left behind: never the latest, and never restored from by default
    abandoned: bool = False
    # stored bytes of keyed rows per key group 0..127 (empty from older pools, and for incomplete checkpoints)
    key_group_bytes: tuple[int, ...] = ()
    operator_state_bytes: int = 0
    # op_ids of ``operators`` the pool knows hold no row (named by a committer that wrote none): a restore needs not declare them
    operators_without_state: frozenset[int] = frozenset()

    def range_bytes(self, lo: int, hi: int) -> int | None:
        """Stored bytes a reader of key groups lo..hi fetches (its keyed rows and all operator state); None if not reported."""
        if len(self.key_group_bytes) != NUM_KEY_GROUPS:
            return None
        return sum(self.key_group_bytes[lo : hi + 1]) + self.operator_state_bytes


@dataclass(frozen=True)
class CommitResult:
    """The outcome of a commit: the checkpoint as it now stands, and how many new bytes were written."""

    checkpoint: CheckpointInfo
    bytes_written: int
    attempts: int = 1
    # True when a retry was answered by the pool as a repeat of this writer's earlier, identical attempt that had landed
    recovered: bool = False


@dataclass(frozen=True)
class LiveExportAnnouncement:
    """An announcement sent to every pool: the earliest expiry (ms since the epoch), the pools told, and (address, why) of missed."""

    expires_at_ms: int
    pools: tuple[str, ...]
    missed: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class SavepointInfo:
    """A savepoint the pool wrote: savepoints/<job>/<name>/ in its store, one folded base file per part."""

    name: str
    checkpoint_id: int
    files: int
    bytes: int
    rows: int
    # the savepoint's folder relative to the pool's store (savepoints/<job>/<name>/): the store's URI is the operator's
    location: str


@dataclass(frozen=True)
class PinInfo:
    """A pin: the checkpoint it holds from retention and when it expires (ms since the epoch)."""

    checkpoint_id: int
    expires_at_ms: int


@dataclass(frozen=True)
class CompactionInfo:
    """What a compaction folded: the parts' key-group ranges, and the base files it wrote."""

    checkpoint_id: int
    folded: tuple[KeyGroups, ...]
    files_written: int
    bytes_written: int


@dataclass(frozen=True)
class GcInfo:
    """A GC run of one job: keys deleted (or, on a dry run, that would be), and what it saw."""

    dry_run: bool
    deleted: tuple[str, ...]
    deleted_bytes: int
    listed_objects: int
    referenced: int
    too_young: int


@dataclass(frozen=True)
class JobPolicyInfo:
    """A job's own maintenance policy as the pool stores it (a None setting: the pool's applies), and what applies."""

    job: str
    keep_last: int | None
    compact_max_layers: int | None
    compact_max_delta_bytes: int | None
    maintenance: bool  # False: the pool's maintainer leaves the job alone
    updated_ms: int
    effective_keep_last: int
    effective_compact_max_layers: int
    effective_compact_max_delta_bytes: int
    stored: bool = True  # False: the job has no policy of its own (every setting above is None, the pool's apply)


@dataclass(frozen=True)
class RetentionInfo:
    """A retention pass: checkpoints deleted (or, on a dry run, that would be), kept, kept only by a pin; the depth applied."""

    job: str
    deleted: tuple[int, ...]
    kept: tuple[int, ...]
    pinned: tuple[int, ...]
    keep_last: int
    keep_last_from: str  # "request", "job policy" or "pool"
    dry_run: bool


def _range(kg: KeyGroups) -> pb.KeyGroupRange:
    return pb.KeyGroupRange(lo=int(kg[0]), hi=int(kg[1]))


def _info(msg: pb.CheckpointInfo) -> CheckpointInfo:
    return CheckpointInfo(
        job=msg.job,
        checkpoint_id=msg.checkpoint_id,
        parent_id=msg.parent_id,
        complete=msg.complete,
        committed_ranges=tuple((r.lo, r.hi) for r in msg.committed_ranges),
        created_at_ms=msg.created_at_ms,
        num_files=msg.num_files,
        total_bytes=msg.total_bytes,
        num_rows=msg.num_rows,
        operators={o.op_id: o.uid for o in msg.operators},
        state_versions=msg.state_versions,
        manifest_etag=msg.manifest_etag,
        abandoned=msg.abandoned,
        key_group_bytes=tuple(msg.key_group_bytes),
        operator_state_bytes=msg.operator_state_bytes,
        operators_without_state=frozenset(o.op_id for o in msg.operators if o.without_state),
    )


# the service config of a dns:/// channel: gRPC spreads calls over every address the name resolves to (and re-resolves)
ROUND_ROBIN_SERVICE_CONFIG = json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})
# at most this often gRPC resolves a dns:/// name again (when a connection fails); its default is 30 s
DNS_RERESOLVE_MS = 5_000
# a live-export announcement waits this long at most for each pool (all at once): one being reconnected to after a
# restart (gRPC's reconnect backoff here is at most 0.5 s) is told, one that is down costs this much per renewal
EACH_POOL_WAIT_S = 2.0


@dataclass
class _Target:
    """One address a client dials: its channel and stub, and until when later calls start elsewhere (it gave no answer)."""

    address: str
    channel: grpc.Channel
    stub: pb_grpc.RemotePoolStub
    resting_until: float = 0.0  # time.monotonic()


def _short(details: str | None) -> str:
    """A status's details on one line, at most 200 characters (for an error listing several addresses)."""
    text = " ".join((details or "no details").split())
    return text if len(text) <= 200 else text[:197] + "..."


class _Attempts:
    """One call's way through the addresses: each is tried once per round, in rotation order; a failed round backs off."""

    def __init__(self, order: list[int], attempt: int = 0) -> None:
        self.order = order
        self.pos = 0
        self.round = attempt
        self.attempt = attempt
        self.failures: dict[str, tuple[str, bool]] = {}  # address -> (why its last try failed, whether no pool was there)
        self._start_round()

    def _start_round(self) -> None:
        self.round_no_pool = True  # every failure of this round found no pool (nothing listening, or not a pool)
        self.round_not_a_pool = True  # every failure of this round was a server that is not a pool at all

    @property
    def current(self) -> int:
        return self.order[self.pos]

    def failed(self, address: str, why: str, no_pool: bool, not_pool: bool) -> None:
        self.failures.pop(address, None)  # re-inserted: the order of the dict is the order of the last tries
        self.failures[address] = (why, no_pool)
        self.round_no_pool &= no_pool
        self.round_not_a_pool &= not_pool
        self.attempt += 1

    def next_address(self) -> bool:
        """Move on to the round's next address; False when every address was tried in this round."""
        if self.pos + 1 < len(self.order):
            self.pos += 1
            return True
        return False

    def next_round(self, order: list[int]) -> None:
        self.order, self.pos = order, 0
        self.round += 1
        self._start_round()


def _resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to, as HOST:PORT (IPv6 in brackets), sorted; [] when it does not resolve."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return []
    found = {str(info[4][0]) for info in infos}
    return sorted(f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}" for ip in found)


class PoolClient:
    """A RemotePool connection: deadlines on every call, retries with backoff and jitter, domain errors only.

    ``address``: one pool (HOST:PORT), several (HOST1:PORT1,HOST2:PORT2: one channel each, every call starts on the next,
    and a call that finds no pool fails over to the next address at once), or a dns:///NAME:PORT name (one channel whose
    round_robin policy spreads calls over every address the name resolves to). Pools are stateless over one store: any of
    them serves any call, and a commit retried on another pool is answered as its repeat (docs/protocol.md, I7).
    """

    def __init__(self, address: str | PoolAddresses, config: PoolClientConfig | None = None) -> None:
        self.addresses = address if isinstance(address, PoolAddresses) else parse_pool_addresses(address)
        self.address = self.addresses.text.strip()
        self.config = config or PoolClientConfig()
        self._rng = random.Random(self.config.seed)
        self._options: list[tuple[str, int | str]] = [
            ("grpc.max_receive_message_length", self.config.max_message_bytes),
            ("grpc.max_send_message_length", self.config.max_message_bytes),
            # reconnect quickly so a pool that comes up late is found by the next retry, not after grpc's 1-120 s backoff
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 500),
        ]
        self._credentials: grpc.ChannelCredentials | None = None
        if self.config.tls_root_certificates is not None:
            self._credentials = grpc.ssl_channel_credentials(
                root_certificates=self.config.tls_root_certificates,
                private_key=self.config.tls_client_key,
                certificate_chain=self.config.tls_client_cert,
            )
        elif self.config.token:  # a proxy from the environment would read the token of a plaintext channel
            self._options.append(("grpc.enable_http_proxy", 0))
        if self.addresses.dns is not None:
            self._targets = [self._open(self.addresses.dns, balanced=True)]
        else:
            self._targets = [self._open(a) for a in self.addresses.hosts]
        self._rotation = itertools.count(int(self._rng.random() * len(self._targets)))  # clients spread their first calls too
        self._local = threading.local()  # the address of the call this thread is running (what self._stub is)
        self._resolved: dict[str, _Target] = {}  # a dns:/// name's addresses, each dialled alone to announce live exports
        self._resolved_lock = threading.Lock()
        self._metadata = (("authorization", f"Bearer {self.config.token}"),) if self.config.token else None
        self._closed = False  # set by close(): a call cancelled then was cancelled here, not by a pool
        self.calls = 0
        self.retries = 0

    def _open(self, target: str, balanced: bool = False, server_name: str | None = None, authority: str | None = None) -> _Target:
        """A channel to ``target`` (balanced: round_robin over what a dns:/// name resolves to)."""
        options = list(self._options)
        if balanced:
            options += [("grpc.service_config", ROUND_ROBIN_SERVICE_CONFIG), ("grpc.dns_min_time_between_resolutions_ms", DNS_RERESOLVE_MS)]
        if authority:
            options.append(("grpc.default_authority", authority))
        if self._credentials is not None:
            name = self.config.tls_server_name or server_name
            if name:
                options.append(("grpc.ssl_target_name_override", name))
            channel = grpc.secure_channel(target, self._credentials, options=options)
        else:
            channel = grpc.insecure_channel(target, options=options)
        return _Target(target, channel, pb_grpc.RemotePoolStub(channel))

    # -- plumbing -----------------------------------------------------------------------------------

    @property
    def _stub(self) -> pb_grpc.RemotePoolStub:
        """The stub of the address this thread's running call is on (outside a call: the first address)."""
        target = getattr(self._local, "target", None)
        return (target or self._targets[0]).stub

    @property
    def _channel(self) -> grpc.Channel:
        target = getattr(self._local, "target", None)
        return (target or self._targets[0]).channel

    def _order(self) -> list[int]:
        """The addresses one call tries, in turn: the next in rotation first; those that gave no answer lately go last."""
        n = len(self._targets)
        if n == 1:
            return [0]
        start = next(self._rotation) % n
        now = time.monotonic()
        rotated = [(start + i) % n for i in range(n)]
        return [i for i in rotated if self._targets[i].resting_until <= now] + [i for i in rotated if self._targets[i].resting_until > now]

    def _attempts(self, what: str, fn: Callable[[int], T], refine: Callable[[grpc.RpcError, int], None] | None = None) -> T:
        """Run ``fn(attempt)`` on one address after another as _back_off_or_raise decides; ``refine`` may raise first."""
        call = _Attempts(self._order())
        previous = getattr(self._local, "target", None)
        try:
            while True:
                self._local.target = self._targets[call.current]
                self.calls += 1
                try:
                    return fn(call.attempt)
                except grpc.RpcError as exc:
                    if refine is not None:
                        refine(exc, call.attempt)
                    self._back_off_or_raise(exc, what, call.attempt, call)
        finally:
            self._local.target = previous

    def _call(self, what: str, fn: Callable[[], T], deadline_s: float | None = None) -> T:
        """Run an idempotent call, failing over and retrying retryable codes with full-jitter backoff; map failures to domain errors."""
        return self._attempts(what, lambda _attempt: fn())

    def _back_off_or_raise(self, exc: grpc.RpcError, what: str, attempt: int, call: _Attempts | None = None) -> None:
        """Go on to the next address, or sleep before the next round, if the failure is retryable and attempts remain;
        otherwise raise the domain error.

        The addresses of a round are tried one after the other at once (a RESOURCE_EXHAUSTED after its backoff); once every
        one failed in the round, the round backs off. An address that gave no answer (nothing listening, not a pool, no
        connection) starts no call for ``down_pool_rest_s``, and is then tried again: a restarted pool comes back.
        ``call`` None: a caller's own loop on the current address (no failover), ``attempt`` its failures so far.
        """
        policy = self.config.retry
        if call is None:
            current = getattr(self._local, "target", None) or self._targets[0]
            call = _Attempts([self._targets.index(current)] if current in self._targets else [0], attempt)
        target = self._targets[call.current]
        code, error_class, details = self._status_of(exc)
        wrong_server = not_a_pool(details, target.address)
        refused = nothing_listening(code, details, target.address)
        if wrong_server is None and not retryable(code, error_class):
            raise error_from_status(code, details, what, error_class, error_attributes_of(exc)) from None
        no_answer = wrong_server is not None or refused is not None or (code == grpc.StatusCode.UNAVAILABLE and error_class is None)
        if no_answer and len(self._targets) > 1:
            target.resting_until = time.monotonic() + policy.down_pool_rest_s
        if refused is not None:
            why = "nothing listening"
        elif wrong_server is not None:
            why = wrong_server.removeprefix(f"{target.address} is ")
        else:
            why = f"{code.name}: {_short(details)}"
        call.failed(target.address, why, wrong_server is not None or refused is not None, wrong_server is not None)
        if call.next_address():  # an address this round has not tried: at once, unless the pool asked to slow down
            self.retries += 1
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                self.config.sleep(policy.backoff(call.round, self._rng))
            return
        attempts = policy.max_attempts
        if call.round_no_pool and not call.round_not_a_pool and policy.refused_attempts is not None:
            attempts = min(attempts, max(1, policy.refused_attempts))
        if not call.round_not_a_pool and call.round + 1 < attempts:
            self.retries += 1
            self.config.sleep(policy.backoff(call.round, self._rng))
            call.next_round(self._order())
            return
        raise self._gave_up(exc, what, call, wrong_server, refused) from None

    def _status_of(self, exc: grpc.RpcError) -> tuple[grpc.StatusCode, str | None, str | None]:
        """(code, the pool's error class, details) of a failed call; CANCELLED by the pool (not by this client closing) is
        UNAVAILABLE: a pool that stops ends the calls it is running so, whatever they had done (as a lost reply).
        """
        code, error_class, details = exc.code(), error_class_of(exc), exc.details()
        if code == grpc.StatusCode.CANCELLED and not self._closed and error_class is None:
            return grpc.StatusCode.UNAVAILABLE, None, f"the pool ended the call ({details or 'cancelled'}): it may be stopping"
        return code, error_class, details

    def _gave_up(self, exc: grpc.RpcError, what: str, call: _Attempts, wrong_server: str | None, refused: str | None) -> ClinkError:
        """The error of a call that failed on every address it tried and has no attempt left; it names every address."""
        code, error_class, details = self._status_of(exc)
        tries = f"gave up after {call.attempt} attempt(s)"
        if len(self._targets) == 1:
            if wrong_server is not None:
                return _unreachable(f"{what}: {wrong_server}", wrong_server)
            if refused is not None:
                return _unreachable(f"{what}: {refused} ({tries})", refused)
            err = error_from_status(code, details, what, error_class, error_attributes_of(exc))
            err.args = (f"{err} ({tries})",)
            return err
        failures = call.failures
        addresses = [t.address for t in self._targets]
        listing = "; ".join(f"{address}: {why}" for address, (why, _) in failures.items())
        if all(no_pool for _, no_pool in failures.values()) and len(failures) == len(addresses):
            if all(why == "nothing listening" for why, _ in failures.values()):
                reason = f"no pool is listening on {join_names(addresses, 'or')} (start one with clink-pool serve)"
            else:
                reason = f"no pool answered at any of {join_names(addresses)} ({listing})"
            return _unreachable(f"{what}: {reason} ({tries})", reason)
        err = error_from_status(code, details, what, error_class, error_attributes_of(exc))
        err.args = (f"{err} ({tries} on {join_names(addresses)}: {listing})",)
        return err

    def _deadline(self, deadline_s: float | None = None) -> float:
        return self.config.call_deadline_s if deadline_s is None else deadline_s

    def close(self) -> None:
        """Close the channels."""
        self._closed = True
        with self._resolved_lock:
            resolved, self._resolved = list(self._resolved.values()), {}
        for target in [*self._targets, *resolved]:
            target.channel.close()

    def __enter__(self) -> PoolClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_ready(self, timeout_s: float = 10.0, every_pool: bool = False) -> None:
        """Block until a pool answers its health check as SERVING, or raise UnavailableError.

        With several addresses one serving pool is enough (calls fail over to it); ``every_pool``: wait for each address
        (a deployment check, or a pool just restarted that this client's channel must reconnect to).
        """
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        end = time.monotonic() + timeout_s
        last = {t.address: "no answer" for t in self._targets}
        not_pools: dict[str, str] = {}
        ready: set[str] = set()
        while time.monotonic() < end:
            for target in self._targets:
                if target.address in not_pools or target.address in ready:
                    continue
                stub = health_pb2_grpc.HealthStub(target.channel)
                try:
                    resp = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=min(1.0, timeout_s), metadata=self._metadata)
                    if resp.status == health_pb2.HealthCheckResponse.SERVING:
                        ready.add(target.address)
                    else:
                        last[target.address] = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
                except grpc.RpcError as exc:
                    wrong_server = not_a_pool(exc.details(), target.address)
                    if wrong_server is not None:
                        not_pools[target.address] = last[target.address] = wrong_server
                        if len(not_pools) == len(self._targets) or every_pool:
                            reason = wrong_server if len(not_pools) == 1 else "; ".join(not_pools.values())
                            raise _unreachable(reason, reason) from None
                        continue
                    last[target.address] = f"{exc.code().name}: {exc.details()}"
                    if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                        ready.add(target.address)  # a pool without the health service still serves RemotePool
                if ready and (not every_pool or len(ready) == len(self._targets)):
                    return
            time.sleep(0.05)
        if len(self._targets) == 1:
            raise UnavailableError(f"pool at {self.address} not ready after {timeout_s:.1f}s ({last[self._targets[0].address]})")
        states = "; ".join(f"{address}: {state}" for address, state in last.items() if address not in ready)
        which = "not every pool" if every_pool and ready else "no pool"
        raise UnavailableError(f"{which} of {self.addresses.describe()} ready after {timeout_s:.1f}s ({states})")

    # -- several addresses at once (live-export announcements live in each pool's memory) ----------------

    def _each_pool(self) -> list[_Target] | None:
        """Every pool to announce to, each dialled alone: the listed addresses, or what the dns:/// name resolves to now.

        None: one pool only (one address, or a name that resolves to one address or none): the call goes as any other.
        """
        if self.addresses.dns is None:
            return list(self._targets) if len(self._targets) > 1 else None
        resolve = self.config.resolve_host or _resolve
        found = resolve(self.addresses.dns_host, self.addresses.dns_port)
        if len(found) <= 1:
            return None
        name = self.addresses.dns_host
        with self._resolved_lock:
            gone = [self._resolved.pop(a) for a in list(self._resolved) if a not in found]
            for address in found:
                if address not in self._resolved:  # TLS checks the name's certificate, not the address's
                    self._resolved[address] = self._open(address, server_name=name, authority=f"{name}:{self.addresses.dns_port}")
            targets = [self._resolved[a] for a in found]
        for target in gone:
            target.channel.close()
        return targets

    def _to_each(
        self, targets: list[_Target], what: str, send: Callable[[pb_grpc.RemotePoolStub, float], grpc.Future]
    ) -> tuple[list[Any], list[tuple[str, str]]]:
        """``send(stub, deadline)`` once to every pool at once (it starts a call's future): the answers, and (address, why)
        of each pool that did not answer.

        A FencedError is raised (fencing lives in the store: every pool says the same); when no pool answered, the error
        they all gave, or UnavailableError naming every address.
        """
        answers: list[Any] = []
        missed: list[tuple[str, str]] = []
        errors: list[ClinkError] = []
        deadline = min(self._deadline(), EACH_POOL_WAIT_S)
        futures = [(target, send(target.stub, deadline)) for target in targets]
        self.calls += len(futures)
        for target, future in futures:
            try:
                answers.append(future.result())
            except grpc.RpcError as exc:
                code, error_class, details = exc.code(), error_class_of(exc), exc.details()
                err = error_from_status(code, details, f"{what} on {target.address}", error_class, error_attributes_of(exc))
                if isinstance(err, FencedError):
                    raise err from None
                if nothing_listening(code, details, target.address) is not None:
                    why = "nothing listening"
                elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
                    why = f"no answer within {deadline:g}s"
                else:
                    why = not_a_pool(details, target.address) or f"{code.name}: {_short(details)}"
                missed.append((target.address, why))
                errors.append(err)
        if not answers:
            if len({type(e) for e in errors}) == 1 and not isinstance(errors[0], UnavailableError):
                raise errors[0]
            listing = "; ".join(f"{address}: {why}" for address, why in missed)
            raise UnavailableError(f"{what}: no pool answered ({listing})")
        return answers, missed

    # -- the RemotePool calls -----------------------------------------------------------------------

    def acquire_writer(self, job: str, key_groups: KeyGroups, restore_from: int | None = None) -> WriterLease:
        """A fencing epoch for ``job``'s key-group range; fences older writers of overlapping ranges.

        ``restore_from``: the checkpoint the writer restores from; every restore needs a fresh epoch (a new attempt).
        """
        job = validate_job(job)  # refused here, before any call, by the rule the pool applies
        req = pb.AcquireWriterRequest(job=job, key_groups=_range(key_groups))
        if restore_from is not None:
            req.restore_from = restore_from
        resp = self._call(
            f"acquire writer for job {job} key groups {key_groups[0]}-{key_groups[1]}",
            lambda: self._stub.AcquireWriter(req, timeout=self._deadline(), metadata=self._metadata),
        )
        return WriterLease(job, (int(key_groups[0]), int(key_groups[1])), resp.epoch, resp.latest_checkpoint_id)

    def commit_checkpoint(
        self,
        job: str,
        checkpoint_id: int,
        parent_id: int,
        key_groups: KeyGroups,
        epoch: int,
        delta: bytes | memoryview,
        state_versions: str = "",
        operators: dict[int, str] | None = None,
    ) -> CommitResult:
        """Stream a changelog delta in ~1 MiB chunks and commit it, retrying after UNAVAILABLE / RESOURCE_EXHAUSTED.

        A retry is safe: the pool names a part by checkpoint, range and epoch, and answers a repeat of a commit that had
        landed (same delta bytes) as that commit's outcome (``recovered``); a different delta under the same name is a
        ConflictError. FAILED_PRECONDITION (fenced) and every other error are raised at once.
        """
        job = validate_job(job)
        header = pb.CommitHeader(
            job=job,
            checkpoint_id=checkpoint_id,
            parent_id=parent_id,
            key_groups=_range(key_groups),
            epoch=epoch,
            state_versions=state_versions,
            operators=[pb.OperatorInfo(op_id=o, uid=u or "") for o, u in sorted((operators or {}).items())],
        )
        view = memoryview(delta)
        step = max(1, int(self.config.commit_chunk_bytes))

        def chunks() -> Iterator[pb.CommitChunk]:
            yield pb.CommitChunk(header=header)
            for start in range(0, len(view), step):
                yield pb.CommitChunk(delta=bytes(view[start : start + step]))

        def send(attempt: int) -> CommitResult:
            # a repeat says so: the pool it reaches (this one or another) looks for the part an earlier attempt staged
            header.attempt = attempt
            resp = self._stub.CommitCheckpoint(chunks(), timeout=self.config.commit_deadline_s, metadata=self._metadata)
            return CommitResult(_info(resp.checkpoint), resp.bytes_written, attempts=attempt + 1, recovered=resp.repeated and attempt > 0)

        what = f"commit checkpoint {checkpoint_id} of job {job} key groups {key_groups[0]}-{key_groups[1]}"
        return self._attempts(what, send)

    def get(self, job: str, checkpoint_id: int, op_id: int, key: bytes, manifest_etag: str = "") -> bytes | None:
        """The value of one key at a checkpoint (0: newest complete), None when absent."""
        return self.multi_get_at(job, checkpoint_id, [op_id], [key], manifest_etag)[0][0]

    def multi_get(
        self, job: str, checkpoint_id: int, op_ids: Sequence[int], keys: Sequence[bytes], manifest_etag: str = ""
    ) -> list[bytes | None]:
        """Values of many keys in one call, in order; ``op_ids`` is one per key or a single shared one."""
        return self.multi_get_at(job, checkpoint_id, op_ids, keys, manifest_etag)[0]

    def multi_get_at(
        self, job: str, checkpoint_id: int, op_ids: Sequence[int], keys: Sequence[bytes], manifest_etag: str = ""
    ) -> tuple[list[bytes | None], str]:
        """multi_get, and the etag of the _metadata the pool read the answers from.

        ``manifest_etag``: the version of the checkpoint the caller holds (a backend's read checkpoint); a pool whose cached
        manifest has exactly it answers without reading _metadata again. Without it the pool reads _metadata to be sure.
        """
        job = validate_job(job)
        op_ids = list(op_ids)
        if len(op_ids) == 1 and len(keys) != 1:
            op_ids = op_ids * len(keys)  # the proto allows one shared op_id; pairing them up works with every pool version
        if len(op_ids) != len(keys):
            raise InvalidArgumentError(f"{len(op_ids)} op_ids for {len(keys)} keys; they must pair up")
        out: list[bytes | None] = []
        # batches within the pool's default limits (--max-multiget-keys, --max-multiget-key-mb), each pinned to the first's version
        for lo, hi in _batches([len(k) for k in keys], MULTI_GET_BATCH_KEYS, MULTI_GET_BATCH_BYTES):
            values, manifest_etag = self._multi_get_batch(job, checkpoint_id, op_ids[lo:hi], keys[lo:hi], manifest_etag)
            out.extend(values)
        return out, manifest_etag

    def _multi_get_batch(
        self, job: str, checkpoint_id: int, op_ids: list[int], keys: Sequence[bytes], manifest_etag: str
    ) -> tuple[list[bytes | None], str]:
        req = pb.MultiGetRequest(job=job, checkpoint_id=checkpoint_id, op_ids=op_ids, keys=list(keys), manifest_etag=manifest_etag)
        resp = self._call(
            f"multi-get of {len(keys)} key(s) from job {job} checkpoint {checkpoint_id}",
            lambda: self._stub.MultiGet(req, timeout=self._deadline(), metadata=self._metadata),
        )
        if len(resp.found) != len(keys) or len(resp.values) not in (len(keys), 0):
            raise UnavailableError(f"pool answered a multi-get of {len(keys)} key(s) with {len(resp.found)} result(s)")
        values = resp.values
        return [values[i] if hit else None for i, hit in enumerate(resp.found)], resp.manifest_etag

    def scan_checkpoint(
        self,
        job: str,
        checkpoint_id: int,
        key_groups: KeyGroups | None = None,
        op_ids: Sequence[int] = (),
        delta: bytes = b"",
        manifest_etag: str = "",
    ) -> bytes:
        """One canonical snapshot stream for a checkpoint, range and operators, with an optional changelog overlaid."""
        job = validate_job(job)
        req = pb.ScanCheckpointRequest(job=job, checkpoint_id=checkpoint_id, op_ids=list(op_ids), delta=delta, manifest_etag=manifest_etag)
        if key_groups is not None:
            req.key_groups.CopyFrom(_range(key_groups))

        def run() -> bytes:
            stream = self._stub.ScanCheckpoint(req, timeout=self.config.scan_deadline_s, metadata=self._metadata)
            return b"".join(chunk.data for chunk in stream)

        return self._call(f"scan of job {job} checkpoint {checkpoint_id}", run)

    def list_jobs(self) -> list[str]:
        """Every job the pool holds."""
        resp = self._call("list jobs", lambda: self._stub.ListJobs(pb.ListJobsRequest(), timeout=self._deadline(), metadata=self._metadata))
        return list(resp.jobs)

    def list_checkpoints(self, job: str, include_incomplete: bool = False) -> list[CheckpointInfo]:
        """Checkpoints of a job (complete ones unless asked), as the pool orders them."""
        job = validate_job(job)
        req = pb.ListCheckpointsRequest(job=job, include_incomplete=include_incomplete)
        resp = self._call(
            f"list checkpoints of job {job}", lambda: self._stub.ListCheckpoints(req, timeout=self._deadline(), metadata=self._metadata)
        )
        return [_info(c) for c in resp.checkpoints]

    def describe_checkpoint(self, job: str, checkpoint_id: int) -> tuple[CheckpointInfo, str]:
        """A checkpoint's info and its manifest JSON as stored."""
        job = validate_job(job)
        req = pb.DescribeCheckpointRequest(job=job, checkpoint_id=checkpoint_id)
        resp = self._call(
            f"describe checkpoint {checkpoint_id} of job {job}",
            lambda: self._stub.DescribeCheckpoint(req, timeout=self._deadline(), metadata=self._metadata),
        )
        return _info(resp.checkpoint), resp.manifest_json

    def resolve_handle(self, handle):  # noqa: ANN001, ANN201 - snapshot.handles.Handle -> pa.Table, typed in client/changelog_export.py
        """The verified rows of a checkpoint handle, so canonicalise_state_snapshot(data, store=this client) works."""
        from client.changelog_export import PoolHandleResolver

        return PoolHandleResolver(self).resolve_handle(handle)

    def delete_checkpoint(self, job: str, checkpoint_id: int) -> None:
        """Delete one checkpoint (its files are left to GC)."""
        job = validate_job(job)
        req = pb.DeleteCheckpointRequest(job=job, checkpoint_id=checkpoint_id)

        def send(attempt: int) -> None:
            try:
                self._stub.DeleteCheckpoint(req, timeout=self._deadline(), metadata=self._metadata)
            except grpc.RpcError as exc:
                if attempt and exc.code() == grpc.StatusCode.NOT_FOUND:
                    return  # an earlier attempt's answer was lost (maybe on another pool): the checkpoint is gone, as asked
                raise

        self._attempts(f"delete checkpoint {checkpoint_id} of job {job}", send)

    # -- lifecycle (pool/lifecycle.py on the pool's store) -------------------------------------------

    def savepoint(self, job: str, name: str | None = None, checkpoint_id: int = 0, deadline_s: float | None = None) -> SavepointInfo:
        """Fold a checkpoint (0: newest complete) into savepoints/<job>/<name>/ of the pool's store; ConflictError if taken.

        With no name the pool picks savepoint-<chk>-<6 hex>. A job's token writes only under its own job's folder.
        Not blindly repeated: the savepoint's manifest is put-if-absent, so a retry after UNAVAILABLE cannot overwrite
        anything, and a conflict on such a retry is reported saying the earlier attempt may have written it (with no
        name, such a retry may leave a second savepoint of the same checkpoint).
        """
        job = validate_job(job)
        name = validate_job(name, what="savepoint name") if name is not None else ""
        req = pb.SavepointRequest(job=job, checkpoint_id=checkpoint_id, name=name)
        what = f"savepoint {name or '(named by the pool)'!r} of job {job} checkpoint {checkpoint_id}"

        def send(_attempt: int) -> SavepointInfo:
            resp = self._stub.Savepoint(req, timeout=deadline_s or self.config.commit_deadline_s, metadata=self._metadata)
            return SavepointInfo(resp.name, resp.checkpoint_id, resp.files, resp.bytes, resp.rows, resp.location)

        def refine(exc: grpc.RpcError, attempt: int) -> None:
            if attempt and exc.code() in (grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.ABORTED):
                raise ConflictError(
                    f"{what}: {exc.details()} (an earlier attempt failed with its outcome unknown: the savepoint may be that attempt's)"
                ) from None

        return self._attempts(what, send, refine)

    def pin_checkpoint(self, job: str, holder: str, ttl_s: float, checkpoint_id: int = 0) -> PinInfo:
        """Hold a checkpoint (0: newest complete) from retention for ttl_s; pinning again renews (safe to repeat)."""
        job = validate_job(job)
        holder = validate_job(holder, what="pin holder")
        req = pb.PinCheckpointRequest(job=job, checkpoint_id=checkpoint_id, holder=holder, ttl_seconds=ttl_s)
        resp = self._call(
            f"pin checkpoint {checkpoint_id} of job {job} for {holder!r}",
            lambda: self._stub.PinCheckpoint(req, timeout=self._deadline(), metadata=self._metadata),
        )
        return PinInfo(resp.checkpoint_id, resp.expires_at_ms)

    def unpin_checkpoint(self, job: str, checkpoint_id: int, holder: str) -> None:
        """Remove holder's pin on a checkpoint (idempotent)."""
        job = validate_job(job)
        holder = validate_job(holder, what="pin holder")
        req = pb.UnpinCheckpointRequest(job=job, checkpoint_id=checkpoint_id, holder=holder)
        self._call(
            f"unpin checkpoint {checkpoint_id} of job {job} for {holder!r}",
            lambda: self._stub.UnpinCheckpoint(req, timeout=self._deadline(), metadata=self._metadata),
        )

    def compact_checkpoint(self, job: str, checkpoint_id: int = 0, force: bool = False, deadline_s: float | None = None) -> CompactionInfo:
        """Fold deep parts of a checkpoint (0: newest) into one base each; reads answer the same before and after.

        Retried like a read: the manifest is replaced by compare-and-swap, so a repeat after a lost reply finds the
        parts already folded (one layer each) and folds nothing; a concurrent change is ConflictError.
        """
        job = validate_job(job)
        req = pb.CompactCheckpointRequest(job=job, checkpoint_id=checkpoint_id, force=force)
        resp = self._call(
            f"compact checkpoint {checkpoint_id} of job {job}",
            lambda: self._stub.CompactCheckpoint(req, timeout=deadline_s or self.config.commit_deadline_s, metadata=self._metadata),
        )
        return CompactionInfo(resp.checkpoint_id, tuple((r.lo, r.hi) for r in resp.folded), resp.files_written, resp.bytes_written)

    def collect_garbage(self, job: str, dry_run: bool = False, deadline_s: float | None = None) -> GcInfo:
        """GC of one job's unreferenced data files older than the pool's minimum age (retried: recomputed each run)."""
        job = validate_job(job)
        req = pb.CollectGarbageRequest(job=job, dry_run=dry_run)
        resp = self._call(
            f"GC of job {job}",
            lambda: self._stub.CollectGarbage(req, timeout=deadline_s or self.config.commit_deadline_s, metadata=self._metadata),
        )
        return GcInfo(dry_run, tuple(resp.deleted), resp.deleted_bytes, resp.listed_objects, resp.referenced, resp.too_young)

    # -- live export ----------------------------------------------------------------------------------

    def announce_live_export(self, job: str, key_groups: KeyGroups, epoch: int, url: str, token: str, ttl_s: int) -> int:
        """Tell the pool(s) that the writer of ``key_groups`` at ``epoch`` serves its live state at ``url``; the expiry in ms."""
        announced = self.announce_live_export_to_each(job, key_groups, epoch, url, token, ttl_s)
        if announced.missed:  # those pools' ?live=1 lacks this subtask until a renewal reaches them
            log.warning(
                "live export of job %s key groups %d-%d: not announced to %s",
                job,
                key_groups[0],
                key_groups[1],
                "; ".join(f"{a} ({why})" for a, why in announced.missed),
            )
        return announced.expires_at_ms

    def announce_live_export_to_each(
        self, job: str, key_groups: KeyGroups, epoch: int, url: str, token: str, ttl_s: int
    ) -> LiveExportAnnouncement:
        """announce_live_export, to every pool: each keeps announcements in its own memory, and any one's ?live=1 reads them.

        With several addresses (or a dns:/// name resolving to several) each pool is told once; the announcement counts when
        one answered (the others are in ``missed``: the next renewal tells them). FencedError from any pool is raised.
        """
        job = validate_job(job)
        req = pb.AnnounceLiveExportRequest(job=job, key_groups=_range(key_groups), epoch=epoch, url=url, token=token, ttl_seconds=ttl_s)
        what = f"announce the live export of job {job} key groups {key_groups[0]}-{key_groups[1]}"
        targets = self._each_pool()
        if targets is None:
            resp = self._call(what, lambda: self._stub.AnnounceLiveExport(req, timeout=self._deadline(), metadata=self._metadata))
            return LiveExportAnnouncement(int(resp.expires_at_ms), (self.address,))
        answers, missed = self._to_each(
            targets,
            what,
            # a pool restarted lately is still being reconnected to: wait for it, a little (the next renewal tries again)
            lambda stub, deadline: stub.AnnounceLiveExport.future(req, timeout=deadline, metadata=self._metadata, wait_for_ready=True),
        )
        told = tuple(t.address for t in targets if t.address not in dict(missed))
        return LiveExportAnnouncement(min(int(a.expires_at_ms) for a in answers), told, tuple(missed))

    def withdraw_live_export(self, job: str, key_groups: KeyGroups, epoch: int) -> None:
        """Withdraw that announcement (a subtask closing), from every pool; raises only when no pool answered."""
        job = validate_job(job)
        req = pb.WithdrawLiveExportRequest(job=job, key_groups=_range(key_groups), epoch=epoch)
        what = f"withdraw the live export of job {job} key groups {key_groups[0]}-{key_groups[1]}"
        targets = self._each_pool()
        if targets is None:
            self._call(what, lambda: self._stub.WithdrawLiveExport(req, timeout=self._deadline(), metadata=self._metadata))
            return
        self._to_each(targets, what, lambda stub, deadline: stub.WithdrawLiveExport.future(req, timeout=deadline, metadata=self._metadata))

    # -- job policies and retention -------------------------------------------------------------------

    @staticmethod
    def _policy_setting(name: str, value: object) -> int | None:
        """A policy setting as the request carries it: None (the pool's applies) or an integer; the pool checks its range."""
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not -(1 << 63) <= value < 1 << 63:
            raise InvalidArgumentError(f"{name} = {value!r} must be an integer (or None for the pool's setting)")
        return value

    @staticmethod
    def _policy_info(job: str, policy: pb.JobPolicy, effective: pb.JobPolicy, stored: bool = True) -> JobPolicyInfo:
        def setting(name: str) -> int | None:
            return int(getattr(policy, name)) if policy.HasField(name) else None

        return JobPolicyInfo(
            job,
            setting("keep_last"),
            setting("compact_max_layers"),
            setting("compact_max_delta_bytes"),
            not policy.maintenance_disabled,
            int(policy.updated_ms),
            int(effective.keep_last),
            int(effective.compact_max_layers),
            int(effective.compact_max_delta_bytes),
            stored,
        )

    def set_job_policy(
        self,
        job: str,
        keep_last: int | None = None,
        compact_max_layers: int | None = None,
        compact_max_delta_bytes: int | None = None,
        maintenance: bool = True,
        only: Iterable[str] | None = None,
    ) -> JobPolicyInfo:
        """Store the job's own maintenance policy (replacing any; a None setting: the pool's applies); the policy now in force.

        ``maintenance=False``: the pool's maintainer leaves the job alone. Each setting is at least 1 (InvalidArgumentError
        naming it); an unknown job is NotFoundError. ``only`` names the settings to change (of keep_last,
        compact_max_layers, compact_max_delta_bytes, maintenance): the stored policy's others stay, merged on the pool by
        compare-and-swap so two updates at once both land. Retried: setting the same policy twice is one policy.
        """
        job = validate_job(job)
        if not isinstance(maintenance, bool):
            raise InvalidArgumentError(f"maintenance = {maintenance!r} must be True or False")
        policy = pb.JobPolicy(maintenance_disabled=not maintenance)
        for name, value in (
            ("keep_last", keep_last),
            ("compact_max_layers", compact_max_layers),
            ("compact_max_delta_bytes", compact_max_delta_bytes),
        ):
            if (checked := self._policy_setting(name, value)) is not None:
                setattr(policy, name, checked)
        fields = list(only) if only is not None else []
        if only is not None and not fields:
            raise InvalidArgumentError("only= names no setting to change (leave it out to replace the whole policy)")
        req = pb.SetJobPolicyRequest(job=job, policy=policy, fields=fields)
        resp = self._call(
            f"set the policy of job {job}", lambda: self._stub.SetJobPolicy(req, timeout=self._deadline(), metadata=self._metadata)
        )
        return self._policy_info(job, resp.policy, resp.effective)

    def clear_job_policy(self, job: str) -> bool:
        """Remove the job's own policy (the pool's settings apply again): whether there was one. Idempotent.

        After a retry (an earlier attempt's answer lost, maybe on another pool) True means only that none is left: the
        earlier attempt may have removed it.
        """
        job = validate_job(job)
        req = pb.SetJobPolicyRequest(job=job, clear=True)

        def send(attempt: int) -> bool:
            resp = self._stub.SetJobPolicy(req, timeout=self._deadline(), metadata=self._metadata)
            return bool(resp.cleared) or attempt > 0

        return self._attempts(f"clear the policy of job {job}", send)

    def get_job_policy(self, job: str) -> JobPolicyInfo | None:
        """The job's own policy with what applies to it; None when the job has none (the pool's settings apply)."""
        info = self.job_policy_in_force(job)
        return info if info.stored else None

    def job_policy_in_force(self, job: str) -> JobPolicyInfo:
        """What applies to the job: its own policy if it has one (stored), the pool's settings in the effective_* fields."""
        job = validate_job(job)
        req = pb.GetJobPolicyRequest(job=job)
        resp = self._call(
            f"get the policy of job {job}", lambda: self._stub.GetJobPolicy(req, timeout=self._deadline(), metadata=self._metadata)
        )
        return self._policy_info(job, resp.policy, resp.effective, resp.found)

    def retain_checkpoints(self, job: str, keep_last: int = 0, dry_run: bool = False, deadline_s: float | None = None) -> RetentionInfo:
        """Run retention on the job now: keep the newest keep_last complete checkpoints (0: the job's policy, else the pool's),
        every pinned one and every one a current writer restored from; the rest go (dry_run: only say which would).

        Retried like a read: a repeat after a lost reply finds those checkpoints gone and reports none deleted.
        """
        job = validate_job(job)
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or not 0 <= keep_last < 1 << 63:
            raise InvalidArgumentError(f"keep_last = {keep_last!r} must be a positive integer, or 0 for the job's policy")
        req = pb.RetainCheckpointsRequest(job=job, keep_last=keep_last, dry_run=dry_run)
        resp = self._call(
            f"retention of job {job}",
            lambda: self._stub.RetainCheckpoints(req, timeout=deadline_s or self.config.commit_deadline_s, metadata=self._metadata),
        )
        return RetentionInfo(
            job, tuple(resp.deleted), tuple(resp.kept), tuple(resp.pinned), int(resp.keep_last), resp.keep_last_from, resp.dry_run
        )
