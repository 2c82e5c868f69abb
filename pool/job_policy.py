"""A job's own maintenance policy, one JSON object under maintenance/policies/ in the store (pure store I/O)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from snapshot.errors import ConflictError, CorruptDataError, InvalidArgumentError, NotFoundError
from snapshot.names import validate_job
from store.layout import job_prefix, writers_key
from store.objects import ObjectStore
from store.writers import parse_writers

if TYPE_CHECKING:
    from pool.lifecycle import Lifecycle
    from pool.retention import RetentionResult

POLICY_PREFIX = "maintenance/policies/"
POLICY_FORMAT = "clink.job-policy"
POLICY_FORMAT_VERSION = 1
_POLICY_SUFFIX = ".json"
# the settings a stored policy may hold besides its format fields; anything else is refused by name
LIMIT_SETTINGS = ("keep_last", "compact_max_layers", "compact_max_delta_bytes")
# the settings one update may change (SetJobPolicy's fields mask, `clink-pool retain`'s given options)
POLICY_SETTINGS = (*LIMIT_SETTINGS, "maintenance")
MAX_SETTING = (1 << 63) - 1  # the protocol carries int64
_UPDATE_ATTEMPTS = 8  # compare-and-swap rounds an update tries against concurrent updates before ConflictError


@dataclass(frozen=True)
class JobPolicy:
    """A job's own maintenance settings; a None field falls back to the pool's maintenance policy."""

    keep_last: int | None = None
    compact_max_layers: int | None = None
    compact_max_delta_bytes: int | None = None
    maintenance: bool = True  # False: the pool's maintainer skips this job
    updated_ms: int = 0

    def validated(self) -> JobPolicy:
        """This policy when every field is in range; InvalidArgumentError naming the first field that is not."""
        for name in LIMIT_SETTINGS:
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SETTING:
                raise InvalidArgumentError(f"{name} = {value!r} must be an integer in 1..{MAX_SETTING} (or unset)")
        if not isinstance(self.maintenance, bool):
            raise InvalidArgumentError(f"maintenance = {self.maintenance!r} must be true or false")
        if isinstance(self.updated_ms, bool) or not isinstance(self.updated_ms, int) or self.updated_ms < 0:
            raise InvalidArgumentError(f"updated_ms = {self.updated_ms!r} must be a non-negative integer")
        return self

    def to_dict(self) -> dict[str, object]:
        """The policy as a plain dict (for JSON output)."""
        return asdict(self)


def job_policy_key(job: str) -> str:
    """maintenance/policies/<job>.json: outside jobs/ so GC, retention and job listings never take it for job state."""
    return f"{POLICY_PREFIX}{validate_job(job)}{_POLICY_SUFFIX}"


def job_of_policy_key(key: str) -> str | None:
    """The job a policy key names, None when ``key`` is not a policy key."""
    if not key.startswith(POLICY_PREFIX) or not key.endswith(_POLICY_SUFFIX):
        return None
    job = key[len(POLICY_PREFIX) : -len(_POLICY_SUFFIX)]
    try:
        return validate_job(job)
    except InvalidArgumentError:
        return None


def job_life(store: ObjectStore, job: str) -> str:
    """The life token of the job's writers table ("" when it has none yet, or one written before lives)."""
    key = writers_key(job)
    try:
        return parse_writers(store.get(key), key).life
    except NotFoundError:
        return ""


def encode_job_policy(job: str, policy: JobPolicy, life: str = "") -> bytes:
    """The stored JSON body of ``policy`` (validated first), tied to the job's ``life`` when it has one."""
    policy.validated()
    body: dict[str, object] = {"format": POLICY_FORMAT, "version": POLICY_FORMAT_VERSION, "job": validate_job(job)}
    if life:
        body["life"] = life
    body.update(asdict(policy))
    return json.dumps(body, sort_keys=True).encode()


def decode_job_policy(key: str, data: bytes) -> JobPolicy:
    """The policy stored under ``key``; CorruptDataError naming the key (and the field) when the body is not one."""
    return _decode_with_life(key, data)[0]


def _decode_with_life(key: str, data: bytes) -> tuple[JobPolicy, str]:
    """(the policy, the life it was set for: "" when set before the job had a writers table); see decode_job_policy."""
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise CorruptDataError(f"job policy {key} is not JSON") from None
    if not isinstance(body, dict):
        raise CorruptDataError(f"job policy {key} is not a JSON object")
    if body.get("format") != POLICY_FORMAT:
        raise CorruptDataError(f"job policy {key} has format {body.get('format')!r}, expected {POLICY_FORMAT!r}")
    if body.get("version") != POLICY_FORMAT_VERSION:
        raise CorruptDataError(f"job policy {key} has version {body.get('version')!r}, this pool reads {POLICY_FORMAT_VERSION}")
    known = {f.name for f in fields(JobPolicy)} | {"format", "version", "job", "life"}
    unknown = sorted(set(body) - known)
    if unknown:
        raise CorruptDataError(f"job policy {key} has unknown field {unknown[0]!r}")
    expected_job = job_of_policy_key(key)
    if body.get("job") != expected_job:
        raise CorruptDataError(f"job policy {key} names job {body.get('job')!r}, not {expected_job!r}")
    life = body.get("life", "")
    if not isinstance(life, str):
        raise CorruptDataError(f"job policy {key} has a life that is not a string")
    values = {f.name: body[f.name] for f in fields(JobPolicy) if f.name in body}
    try:
        return JobPolicy(**values).validated(), life
    except InvalidArgumentError as exc:
        raise CorruptDataError(f"job policy {key}: {exc}") from None


def read_job_policy(store: ObjectStore, job: str) -> JobPolicy | None:
    """The job's stored policy; None when none is set (or it was set for an earlier life of the job); CorruptDataError naming the key when the object is not a policy."""
    key = job_policy_key(job)
    try:
        data = store.get(key)
    except NotFoundError:
        return None
    return _of_life(key, data, job_life(store, job))


def _of_life(key: str, data: bytes, life: str) -> JobPolicy | None:
    """The policy in ``data`` when it belongs to the job's current ``life``; None for an earlier life's."""
    policy, set_for = _decode_with_life(key, data)
    return policy if not set_for or set_for == life else None  # a job deleted and made again starts without one


def write_job_policy(store: ObjectStore, job: str, policy: JobPolicy) -> JobPolicy:
    """Store ``policy`` for ``job`` (replacing any), validated first: InvalidArgumentError naming the field, nothing written."""
    key = job_policy_key(job)
    store.put(key, encode_job_policy(job, policy, job_life(store, job)))
    return policy


def update_job_policy(store: ObjectStore, job: str, changes: dict[str, Any], updated_ms: int) -> JobPolicy:
    """Change only the settings in ``changes`` (None: the pool's), keeping the rest of the stored policy; the policy stored.

    Read and written by compare-and-swap, so two updates at once (from two operators, through two pools) both land;
    ConflictError after repeated lost races. An unknown setting or a bad value is InvalidArgumentError, nothing written.
    """
    unknown = sorted(set(changes) - set(POLICY_SETTINGS))
    if unknown:
        raise InvalidArgumentError(f"unknown policy setting {unknown[0]!r} (known: {', '.join(POLICY_SETTINGS)})")
    key = job_policy_key(job)
    replace(JobPolicy(), **changes).validated()  # the values checked before anything is read
    for _ in range(_UPDATE_ATTEMPTS):
        try:
            data, etag = store.get_with_etag(key)
        except NotFoundError:
            data, etag = None, None
        life = job_life(store, job)
        current = None if data is None else _of_life(key, data, life)
        # none, or an earlier life's: the update starts from the pool's settings
        policy = replace(current or JobPolicy(), **changes, updated_ms=updated_ms).validated()
        try:
            store.compare_and_swap(key, encode_job_policy(job, policy, life), etag)
        except ConflictError:
            continue  # another update landed between the read and the write: merge into it
        return policy
    raise ConflictError(f"the policy of job {job} changed {_UPDATE_ATTEMPTS} times while this update was merged; retry")


def clear_job_policy(store: ObjectStore, job: str) -> bool:
    """Remove the job's policy (idempotent): whether one was there."""
    key = job_policy_key(job)
    if not store.exists(key):
        return False
    store.delete(key)
    return True


def list_job_policies(store: ObjectStore) -> dict[str, JobPolicy]:
    """Every job's stored policy by job (for the maintainer and the status page); a corrupt one raises CorruptDataError."""
    found: dict[str, JobPolicy] = {}
    for info in store.list(POLICY_PREFIX):
        job = job_of_policy_key(info.key)
        if job is None:
            continue
        try:
            policy = read_job_policy(store, job)
        except NotFoundError:
            continue  # cleared since the listing
        if policy is not None:
            found[job] = policy
    return found


def job_exists(store: ObjectStore, job: str) -> bool:
    """Whether ``job`` has anything under jobs/<job>/ (a policy alone does not make a job)."""
    return store.exists(writers_key(job)) or store.holds(job_prefix(job))


def effective_policy(policy: JobPolicy | None, defaults: JobPolicy) -> JobPolicy:
    """What applies to a job: its own settings, each unset one taken from ``defaults`` (the pool's)."""
    if policy is None:
        return defaults
    return replace(
        policy,
        keep_last=defaults.keep_last if policy.keep_last is None else policy.keep_last,
        compact_max_layers=defaults.compact_max_layers if policy.compact_max_layers is None else policy.compact_max_layers,
        compact_max_delta_bytes=defaults.compact_max_delta_bytes
        if policy.compact_max_delta_bytes is None
        else policy.compact_max_delta_bytes,
    )


KEEP_LAST_FROM_REQUEST = "request"
KEEP_LAST_FROM_JOB = "job policy"
KEEP_LAST_FROM_POOL = "pool"


def resolve_keep_last(requested: int, policy: JobPolicy | None, pool_keep_last: int) -> tuple[int, str]:
    """(depth, where it came from): ``requested`` when positive, else the job's policy, else the pool's setting."""
    if isinstance(requested, bool) or not isinstance(requested, int) or requested < 0:
        raise InvalidArgumentError(f"keep_last = {requested!r} must be a positive integer, or 0 for the job's policy")
    if requested:
        return requested, KEEP_LAST_FROM_REQUEST
    if policy is not None and policy.keep_last is not None:
        return policy.keep_last, KEEP_LAST_FROM_JOB
    return pool_keep_last, KEEP_LAST_FROM_POOL


@dataclass(frozen=True)
class RetentionRun:
    """A retention pass asked for now: what it did (RetentionResult) and the depth it applied, with its source."""

    result: RetentionResult
    keep_last: int
    keep_last_from: str


class JobPolicies:
    """Job policies and retention on demand over one Lifecycle's store: what the RPCs and `clink-pool retain` call.

    A policy is set only for a job that exists (a typo is NotFoundError, not a stray object); one left behind by a
    deleted job can still be read and cleared.
    """

    def __init__(self, lifecycle: Lifecycle, pool_policy: JobPolicy | None = None) -> None:
        self.lifecycle = lifecycle
        self.store = lifecycle.store
        # what a job's unset settings fall back to: the pool's maintenance settings, else its LifecycleConfig
        config = lifecycle.config
        own = pool_policy or JobPolicy()
        self.defaults = JobPolicy(
            keep_last=own.keep_last or config.retain_last,
            compact_max_layers=own.compact_max_layers or config.compact_max_layers,
            compact_max_delta_bytes=own.compact_max_delta_bytes or config.compact_max_delta_bytes,
            maintenance=own.maintenance,
        ).validated()

    def _require_job(self, job: str) -> str:
        job = validate_job(job)
        if not job_exists(self.store, job):
            raise NotFoundError(f"job {job} not found in {self.store.uri}")
        return job

    def set(self, job: str, policy: JobPolicy) -> JobPolicy:
        """Store ``policy`` for an existing job, stamped with the time: the policy stored. Bad input writes nothing."""
        policy.validated()
        job = self._require_job(job)
        return write_job_policy(self.store, job, replace(policy, updated_ms=self.lifecycle.context.now_ms()))

    def update(self, job: str, changes: dict[str, Any]) -> JobPolicy:
        """Change only the settings in ``changes`` of an existing job's policy, stamped with the time (see update_job_policy)."""
        job = self._require_job(job)
        return update_job_policy(self.store, job, changes, self.lifecycle.context.now_ms())

    def get(self, job: str) -> JobPolicy | None:
        """The job's own policy, None when it has none; NotFoundError for a job that has neither state nor policy."""
        job = validate_job(job)
        policy = read_job_policy(self.store, job)
        if policy is None:
            self._require_job(job)
        return policy

    def clear(self, job: str) -> bool:
        """Remove the job's policy: whether there was one; NotFoundError for a job that has neither state nor policy."""
        job = validate_job(job)
        if clear_job_policy(self.store, job):
            return True
        self._require_job(job)
        return False

    def effective(self, policy: JobPolicy | None) -> JobPolicy:
        """``policy`` with its unset fields the pool's."""
        return effective_policy(policy, self.defaults)

    def retain(self, job: str, keep_last: int = 0, dry_run: bool = False) -> RetentionRun:
        """Run retention on ``job`` now, keep_last deep (0: the job's policy, else the pool's); see Retention.retain."""
        resolve_keep_last(keep_last, None, 1)  # the argument checked before the job is looked up
        job = self._require_job(job)
        policy = None if keep_last else read_job_policy(self.store, job)
        depth, source = resolve_keep_last(keep_last, policy, self.defaults.keep_last or self.lifecycle.config.retain_last)
        return RetentionRun(self.lifecycle.retain(job, depth, dry_run), depth, source)
