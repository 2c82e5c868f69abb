"""The pool's status page: what each job holds (checkpoints, pins, savepoints, writers, maintenance) as bounded JSON and HTML views."""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import parse_qs, quote, unquote, urlsplit

from pool.core import PoolCore
from pool.describe import manifest_summary
from pool.domain import KeyGroupRange
from pool.lifecycle_context import LifecycleConfig, LifecycleContext
from pool.live_exports import gaps
from pool.pins import Pins
from snapshot.errors import ClinkError, CorruptDataError, InvalidArgumentError, NotFoundError
from snapshot.names import validate_job
from store.layout import (
    SAVEPOINT_ENTRIES,
    SAVEPOINTS,
    checkpoints_prefix,
    job_prefix,
    job_savepoint_name,
    parse_job_key,
    pin_prefix,
    savepoint_manifest_key,
)
from store.manifest import Manifest, info_field, manifest_extra_fields, parse_manifest
from store.writers import WriterTable

log = logging.getLogger("clink.pool.status")

# the routes this module answers; every other path belongs to the export (/jobs/JOB/state.arrow, /healthz)
INDEX_PATH = "/"
JOB_PAGE = "/status/jobs/"  # /status/jobs/JOB and /status/jobs/JOB/checkpoints/N
API = "/api"  # /api, /api/jobs, /api/jobs/JOB, /api/jobs/JOB/checkpoints/N, /api/maintenance
ROUTES = (
    "/",
    "/status/jobs/JOB",
    "/status/jobs/JOB/checkpoints/N",
    "/api",
    "/api/jobs",
    "/api/jobs/JOB",
    "/api/jobs/JOB/checkpoints/N",
    "/api/maintenance",
)
_PARAMS = frozenset({"page", "per_page"})
_JOB_ROUTE = re.compile(r"^/(?P<kind>status|api)/jobs/(?P<job>[^/]+)(?:/checkpoints/(?P<cid>[^/]+))?/?$")
MAX_PAGE = 1_000_000  # a page number past any store's size: a bigger one is a typo, said as such
MAX_RUNS = 10  # maintenance runs shown per job, newest first


class MaintainerStatus(Protocol):
    """What the status page reads of the pool's maintainer (pool/maintenance.py): its status document, of one job or all."""

    def status(self, job: str | None = None) -> dict: ...


@dataclass(frozen=True)
class StatusPageConfig:
    """Bounds of one status request: rows per page and caps, so a store with thousands of jobs or checkpoints costs the same."""

    jobs_per_page: int = 25  # the index describes at most this many jobs (one LIST and one GET each, manifests cached)
    checkpoints_per_page: int = 20  # a job page reads at most this many manifests (cached by their listing's etag)
    max_per_page: int = 200  # the largest per_page a request may ask for
    max_pins: int = 64  # pin bodies read per job page (the rest counted as "N more")
    max_savepoints: int = 20  # savepoint _metadata read per job page (the rest counted as "N more")
    max_staged_parts: int = 256  # staged part bodies a checkpoint page reads
    refresh_s: int = 10  # the HTML pages reload themselves this often (meta refresh)
    max_requests: int = 4  # status requests served at once; more get 503 (each reads the store)

    def __post_init__(self) -> None:
        for name in ("jobs_per_page", "checkpoints_per_page", "max_per_page", "max_pins", "max_savepoints", "max_staged_parts"):
            if getattr(self, name) < 1:
                raise InvalidArgumentError(f"status page {name} = {getattr(self, name)} must be at least 1")
        if self.refresh_s < 1 or self.max_requests < 1:
            raise InvalidArgumentError("status page refresh_s and max_requests must be at least 1")


@dataclass(frozen=True)
class StatusRoute:
    """A parsed status request: which view (index, job, checkpoint, maintenance, api root), as HTML or JSON, which page."""

    view: str  # "index", "job", "checkpoint", "maintenance", "api", or "unknown" (a 404 listing the routes)
    api: bool
    job: str | None = None
    checkpoint_id: int | None = None
    page: int = 1
    per_page: int | None = None
    path: str = ""


def is_status_path(path: str) -> bool:
    """Whether a request path is the status page's (/, /status/..., /api, /api/...) rather than the export's."""
    return path == INDEX_PATH or path == "/status" or path.startswith("/status/") or path == API or path.startswith(API + "/")


def _positive(params: dict[str, list[str]], name: str, default: int | None, most: int) -> int | None:
    values = params.get(name)
    if not values:
        return default
    if len(values) > 1:
        raise InvalidArgumentError(f"parameter {name} given {len(values)} times")
    text = values[0]
    # the length first: int() refuses over 4300 digits with a ValueError the handler would not answer
    if not text.isascii() or not text.isdigit() or len(text) > 19 or not 1 <= int(text) <= most:
        raise InvalidArgumentError(f"{name}={text[:40]!r} must be a whole number in 1..{most}")
    return int(text)


def parse_status_route(target: str, max_per_page: int = StatusPageConfig.max_per_page) -> StatusRoute | None:
    """The status view a request target asks for; None when it is not a status path; InvalidArgumentError for bad parameters or names."""
    url = urlsplit(target)
    path = url.path
    if not is_status_path(path):
        return None
    api = path == API or path.startswith(API + "/")
    try:
        params = parse_qs(url.query, keep_blank_values=True, strict_parsing=bool(url.query))
    except ValueError:
        raise InvalidArgumentError(f"query string {url.query!r} is malformed") from None
    unknown = sorted(set(params) - _PARAMS)
    if unknown:
        raise InvalidArgumentError(f"unknown parameter(s) {', '.join(unknown)} (known: {', '.join(sorted(_PARAMS))})")
    page = _positive(params, "page", 1, MAX_PAGE) or 1
    per_page = _positive(params, "per_page", None, max_per_page)
    stripped = path.rstrip("/") or "/"
    if stripped == "/":
        return StatusRoute("index", False, page=page, per_page=per_page, path=path)
    if stripped == API:
        return StatusRoute("api", True, path=path)
    if stripped == API + "/jobs":
        return StatusRoute("index", True, page=page, per_page=per_page, path=path)
    if stripped == API + "/maintenance":
        return StatusRoute("maintenance", True, path=path)
    m = _JOB_ROUTE.match(path)
    if m is None:
        return StatusRoute("unknown", api, path=path)
    job = validate_job(unquote(m.group("job")), what="job id in the path")
    cid_text = m.group("cid")
    if cid_text is None:
        return StatusRoute("job", m.group("kind") == "api", job=job, page=page, per_page=per_page, path=path)
    if not cid_text.isascii() or not cid_text.isdigit() or len(cid_text) > 19 or not 1 <= int(cid_text) < 1 << 63:
        raise InvalidArgumentError(f"checkpoint id {unquote(cid_text)[:40]!r} in the path must be a positive integer")
    return StatusRoute("checkpoint", m.group("kind") == "api", job=job, checkpoint_id=int(cid_text), path=path)


def job_page_url(job: str) -> str:
    """The HTML page of a job (the job id percent-encoded whole, so no name can break out of the path)."""
    return f"{JOB_PAGE}{quote(job, safe='')}"


def job_api_url(job: str) -> str:
    """The JSON document of a job."""
    return f"{API}/jobs/{quote(job, safe='')}"


def checkpoint_page_url(job: str, checkpoint_id: int) -> str:
    """The HTML page of one checkpoint of a job."""
    return f"{job_page_url(job)}/checkpoints/{checkpoint_id}"


@dataclass
class _Listed:
    """One checkpoint id from a listing of the job's checkpoint folders: its _metadata (etag, time) and staged part objects."""

    checkpoint_id: int
    metadata_etag: str | None = None
    metadata_ms: int = 0
    parts: list[tuple[str, int, int, int | None, int, int]] = field(default_factory=list)  # (key, lo, hi, epoch, size, modified ms)


def _paging(total: int, page: int, per_page: int) -> dict[str, int]:
    """Where a page lies among ``total`` items: numbers, the slice shown and how many come after it."""
    pages = max(1, -(-total // per_page))
    first = min(total, (page - 1) * per_page)
    last = min(total, first + per_page)
    return {"page": page, "per_page": per_page, "pages": pages, "total": total, "first": first, "last": last, "more": total - last}


def _age_s(now_ms: int, then_ms: int) -> float | None:
    return round(max(0, now_ms - then_ms) / 1000, 3) if then_ms else None


class StatusPage:
    """Builds the status documents from one PoolCore: its store, cached checkpoint readers, fencing and live announcements.

    Every document is bounded (see StatusPageConfig): the index describes one page of jobs, a job page one page of its
    checkpoints (newest first) with capped pins and savepoints; the HTML pages render exactly these documents.
    """

    def __init__(
        self,
        core: PoolCore,
        config: StatusPageConfig | None = None,
        maintainer: Callable[[], MaintainerStatus | None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.core = core
        self.config = config or StatusPageConfig()
        self._maintainer = maintainer or (lambda: None)
        self.clock = clock
        # pins are read as `clink-pool ls` reads them, through the lifecycle's own module (sharing the core's segment cache)
        self.pins = Pins(LifecycleContext(core.store, LifecycleConfig(), clock, core.cache))

    def now_ms(self) -> int:
        """The clock in milliseconds."""
        return int(self.clock() * 1000)

    # ---- the store, read boundedly ---------------------------------------------------------------------------

    def _job(self, job: str) -> str:
        return validate_job(job, self.core.config.max_job_id_bytes)

    def _listing(self, job: str) -> list[_Listed]:
        """The job's checkpoint ids ascending, from one LIST of its checkpoint folders (keys and etags only, no bodies)."""
        found: dict[int, _Listed] = {}
        for info in self.core.store.list(checkpoints_prefix(job)):
            parsed = parse_job_key(info.key)
            if parsed is None or parsed.job != job or parsed.kind not in ("metadata", "part"):
                continue
            item = found.setdefault(parsed.checkpoint_id, _Listed(parsed.checkpoint_id))
            if parsed.kind == "metadata":
                item.metadata_etag, item.metadata_ms = info.etag, info.last_modified_ms
            else:
                item.parts.append((info.key, parsed.kg_lo, parsed.kg_hi, parsed.epoch, info.size, info.last_modified_ms))
        return [found[cid] for cid in sorted(found)]

    def _manifest(self, job: str, item: _Listed) -> Manifest | None:
        """A complete checkpoint's manifest through the core's cached reader (no GET when the listing's etag matches)."""
        try:
            return self.core.reader(job).manifest_and_etag(item.checkpoint_id, item.metadata_etag)[0]
        except NotFoundError:
            return None  # deleted since the listing

    def _exists(self, job: str) -> bool:
        return self.core.store.holds(job_prefix(job))

    def _maintenance(self, job: str | None) -> dict[str, Any] | None:
        """The maintainer's status (of ``job``, or of all), None when maintenance is off; {"error": ...} when it cannot say."""
        maintainer = self._maintainer()
        if maintainer is None:
            return None
        try:
            doc = maintainer.status(job)
        except Exception as exc:  # noqa: BLE001 - the page shows the rest of what it knows and names the failure
            log.warning("maintenance status failed: %s", exc)
            return {"error": f"maintenance status unavailable: {type(exc).__name__}: {exc}"}
        return doc if isinstance(doc, dict) else {"error": "maintenance status is not a document"}

    # ---- documents ---------------------------------------------------------------------------------------------

    def jobs_index(self, visible: Callable[[str], bool], page: int = 1, per_page: int | None = None) -> dict[str, Any]:
        """The index document: one page of the jobs ``visible`` lets the caller see, each summarised, and maintenance's state."""
        per_page = per_page or self.config.jobs_per_page
        jobs = [j for j in self.core.list_jobs() if visible(j)]  # names only: one delimiter listing of jobs/
        paging = _paging(len(jobs), page, per_page)
        maintenance = self._maintenance(None)
        job_status = maintenance.get("jobs", {}) if isinstance(maintenance, dict) and isinstance(maintenance.get("jobs"), dict) else {}
        now = self.now_ms()
        summaries = []
        for job in jobs[paging["first"] : paging["last"]]:
            summaries.append(self._job_summary(job, now, job_status.get(job) if maintenance is not None else None, maintenance is not None))
        return {
            "now_ms": now,
            "refresh_s": self.config.refresh_s,
            "jobs": summaries,
            "paging": paging,
            "maintenance": _maintenance_overview(maintenance),
        }

    def _job_summary(self, job: str, now: int, maintenance: dict | None, maintenance_on: bool) -> dict[str, Any]:
        """One row of the index: counts, the latest complete checkpoint, writers, live exports, the last maintenance run."""
        row: dict[str, Any] = {"job": job, "page": job_page_url(job), "api": job_api_url(job), "error": None}
        try:
            listing = self._listing(job)
            table, _ = self.core.fencing.read(job)
            complete = [c for c in listing if c.metadata_etag is not None]
            latest = None
            for item in reversed(complete):  # newest first: usually the first one answers
                m = self._manifest(job, item)
                if m is not None and not table.abandons(m.checkpoint_id, m.max_epoch):
                    latest = self._complete_doc(job, m, table, now, {}, with_parts=False)
                    break
            row.update(
                {
                    "checkpoints": len(complete),
                    "incomplete": len(listing) - len(complete),
                    "latest": latest,
                    "writers": len(table.writers),
                    "live_exports": len(self.core.live_exports.current(job)),
                }
            )
        except ClinkError as exc:
            row["error"] = str(exc)
        row["maintenance"] = _job_maintenance(maintenance, brief=True) if maintenance_on else None
        return row

    def job(self, job: str, page: int = 1, per_page: int | None = None) -> dict[str, Any]:
        """A job's document: one page of its checkpoints (newest first), pins, savepoints, writers, live exports, maintenance."""
        job = self._job(job)
        per_page = per_page or self.config.checkpoints_per_page
        listing = self._listing(job)
        if not listing and not self._exists(job):
            raise NotFoundError(f"job {job} not found")
        now = self.now_ms()
        table, _ = self.core.fencing.read(job)
        pins, pins_more = self._pins(job, now)
        newest_first = listing[::-1]
        paging = _paging(len(newest_first), page, per_page)
        checkpoints = []
        for item in newest_first[paging["first"] : paging["last"]]:
            checkpoints.append(self._checkpoint_doc(job, item, table, now, pins))
        savepoints, savepoints_more = self._savepoints(job, now)
        maintenance = self._maintenance(job)
        return {
            "job": job,
            "now_ms": now,
            "refresh_s": self.config.refresh_s,
            "page": job_page_url(job),
            "api": job_api_url(job),
            "checkpoints": checkpoints,
            "paging": paging,
            "complete_checkpoints": sum(1 for c in listing if c.metadata_etag is not None),
            "pins": pins,
            "pins_more": pins_more,
            "savepoints": savepoints,
            "savepoints_more": savepoints_more,
            "writers": _writers_doc(table, now),
            "retiring": [
                {"checkpoint_id": cid, "until_ms": until, "by": owner.split("-", 1)[0]}
                for cid, until, owner in sorted(table.retiring)
                if until > now
            ],
            "live_exports": self._live_exports(job),
            "maintenance": _job_maintenance_doc(maintenance, job),
        }

    def checkpoint(self, job: str, checkpoint_id: int) -> dict[str, Any]:
        """One checkpoint's document with every part (complete: from its manifest; incomplete: each staged part read)."""
        job = self._job(job)
        listing = self._listing(job)
        item = next((c for c in listing if c.checkpoint_id == checkpoint_id), None)
        if item is None:
            if not listing and not self._exists(job):
                raise NotFoundError(f"job {job} not found")
            raise NotFoundError(f"checkpoint {checkpoint_id} of job {job} not found")
        now = self.now_ms()
        table, _ = self.core.fencing.read(job)
        pins, _ = self._pins(job, now)
        doc = self._checkpoint_doc(job, item, table, now, pins, read_staged=True)
        doc.update({"job": job, "now_ms": now, "refresh_s": self.config.refresh_s, "job_page": job_page_url(job)})
        return doc

    def maintenance(self, visible: Callable[[str], bool]) -> dict[str, Any]:
        """The maintainer's status with only the jobs ``visible`` allows; {"enabled": false} when maintenance is off."""
        doc = self._maintenance(None)
        if doc is None:
            return {"enabled": False, "off": True}
        out = dict(doc)
        if isinstance(out.get("jobs"), dict):
            out["jobs"] = {j: _job_maintenance(s, brief=False) for j, s in sorted(out["jobs"].items()) if visible(j)}
        return out

    # ---- pieces ----------------------------------------------------------------------------------------------

    def _checkpoint_doc(
        self, job: str, item: _Listed, table: WriterTable, now: int, pins: list[dict], read_staged: bool = False
    ) -> dict[str, Any]:
        if item.metadata_etag is not None:
            m = self._manifest(job, item)
            if m is not None:
                return self._complete_doc(job, m, table, now, pins)
        return self._incomplete_doc(job, item, table, now, pins, read_staged)

    def _complete_doc(self, job: str, m: Manifest, table: WriterTable, now: int, pins: Any, with_parts: bool = True) -> dict[str, Any]:
        """A complete checkpoint as `clink-pool ls JOB` summarises it, with its state (abandoned, retiring), age and pins."""
        summary = manifest_summary(m, with_files=False)
        epochs = sorted({p.epoch for p in m.parts})
        doc: dict[str, Any] = {
            "checkpoint_id": m.checkpoint_id,
            "page": checkpoint_page_url(job, m.checkpoint_id),
            "complete": True,
            "abandoned": table.abandons(m.checkpoint_id, m.max_epoch),
            "retiring": m.checkpoint_id in table.retiring_ids(now),
            "parent_id": m.parent_id,
            "created_at_ms": m.created_at_ms,
            "age_s": _age_s(now, m.created_at_ms),
            "bytes": summary["bytes"],
            "rows": summary["rows_stored"],
            "files": summary["files"],
            "max_layers": summary["max_layers"],
            "epochs": epochs,
            "part_count": len(m.parts),
            "ranges": [[p.kg_lo, p.kg_hi] for p in m.parts],
            "pins": sorted(p["holder"] for p in pins if p["checkpoint_id"] == m.checkpoint_id and not p["expired"]) if pins else [],
        }
        if with_parts:
            doc["parts"] = [{k: p[k] for k in ("kg_lo", "kg_hi", "epoch", "layers", "bytes")} for p in summary["parts"]]
        return doc

    def _incomplete_doc(self, job: str, item: _Listed, table: WriterTable, now: int, pins: list[dict], read_staged: bool) -> dict[str, Any]:
        """An in-flight (or stuck) checkpoint: its staged parts by name (range, epoch, still current or fenced) and the ranges missing."""
        staged = []
        for key, lo, hi, epoch, size, modified in sorted(item.parts, key=lambda p: (p[1], p[2], p[3] or 0)):
            part: dict[str, Any] = {
                "kg_lo": lo,
                "kg_hi": hi,
                "epoch": epoch,
                "current": table.holds(lo, hi, epoch),  # a part of a fenced epoch never completes the checkpoint
                "age_s": _age_s(now, modified),
                "staged_bytes": size,
            }
            staged.append((key, part))
        current = sorted({(p["kg_lo"], p["kg_hi"]) for _, p in staged if p["current"]})
        newest = max((p[5] for p in item.parts), default=0)
        doc: dict[str, Any] = {
            "checkpoint_id": item.checkpoint_id,
            "page": checkpoint_page_url(job, item.checkpoint_id),
            "complete": False,
            "abandoned": False,
            "retiring": item.checkpoint_id in table.retiring_ids(now),
            "staged_at_ms": newest,
            "age_s": _age_s(now, newest),
            "part_count": len(staged),
            "ranges": [[lo, hi] for lo, hi in current],
            "epochs": sorted({p["epoch"] for _, p in staged if p["epoch"] is not None}),
            "missing_ranges": [[r.lo, r.hi] for r in gaps([KeyGroupRange(lo, hi) for lo, hi in current])],
            "pins": [],
            "staged": [p for _, p in staged],
        }
        if read_staged:
            self._read_staged(doc, staged)
        return doc

    def _read_staged(self, doc: dict[str, Any], staged: list[tuple[str, dict[str, Any]]]) -> None:
        """Add each staged part's layers, bytes and rows from its body (at most max_staged_parts bodies read)."""
        cap = self.config.max_staged_parts
        for key, part in staged[:cap]:
            try:
                m = parse_manifest(self.core.store.get(key), key)
            except NotFoundError:
                part["gone"] = True  # completed or removed since the listing
                continue
            except CorruptDataError as exc:
                part["problem"] = str(exc)
                continue
            mine = next((p for p in m.parts if (p.kg_lo, p.kg_hi) == (part["kg_lo"], part["kg_hi"])), None)
            paths = [x for layer in mine.layers for x in layer] if mine is not None else [f.path for f in m.files]
            files = {f.path: f for f in m.files}
            part["layers"] = len(mine.layers) if mine is not None else None
            part["bytes"] = sum(files[x].size for x in paths if x in files)
            part["rows"] = sum(files[x].rows for x in paths if x in files)
        doc["staged_more"] = max(0, len(staged) - cap)

    def _pins(self, job: str, now: int) -> tuple[list[dict], int]:
        """The job's pins (one LIST, at most max_pins bodies read), newest expiry first, and how many more there are."""
        infos = [i for i in self.core.store.list(pin_prefix(job)) if (k := parse_job_key(i.key)) is not None and k.kind == "pin"]
        cap = self.config.max_pins
        pins = self.pins.summaries(infos[:cap], now)
        for pin in pins:
            expires = pin.get("expires_at_ms")
            pin["expires_in_s"] = round((expires - now) / 1000, 3) if isinstance(expires, int) else None
        pins.sort(key=lambda pin: (-_int(pin.get("checkpoint_id")), str(pin.get("holder"))))
        return pins, max(0, len(infos) - cap)

    def _savepoints(self, job: str, now: int) -> tuple[list[dict], int]:
        """Savepoints in the job's own namespace savepoints/JOB/ (what the pool's RPC writes): one delimiter listing, capped reads."""
        names = [n for n in self.core.store.list_prefixes(f"{SAVEPOINTS}{job}/") if n not in SAVEPOINT_ENTRIES]
        cap = self.config.max_savepoints
        out = []
        for own in names[:cap]:
            name = job_savepoint_name(job, own)
            key = savepoint_manifest_key(name)
            sp: dict[str, Any] = {"name": name, "complete": False}
            try:
                raw = self.core.store.get(key)
                m = parse_manifest(raw, key)
            except NotFoundError:
                sp["problem"] = "no _metadata: never published (GC removes its files)"
                out.append(sp)
                continue
            except CorruptDataError as exc:
                sp["problem"] = str(exc)
                out.append(sp)
                continue
            info = info_field(manifest_extra_fields(raw), "savepoint")
            created = _int(info.get("created_at_ms"))
            sp.update(
                {
                    "complete": True,
                    "checkpoint_id": m.checkpoint_id,
                    "created_at_ms": created,
                    "age_s": _age_s(now, created),
                    "parts": len(m.parts),
                    "files": len(m.files),
                    "bytes": m.total_bytes,
                    "rows": m.total_rows,
                }
            )
            out.append(sp)
        return out, max(0, len(names) - cap)

    def _live_exports(self, job: str) -> list[dict]:
        """The job's live-export announcements neither expired nor fenced (the subtask's token is never shown)."""
        now = time.monotonic()  # announcements expire on the pool's monotonic clock (LiveExports' default)
        return [
            {
                "kg_lo": a.key_groups.lo,
                "kg_hi": a.key_groups.hi,
                "epoch": a.epoch,
                "url": a.url,
                "expires_in_s": round(a.expires_at - now, 1),
            }
            for a in self.core.live_exports.current(job)
        ]


def _int(value: object) -> int:
    """An integer field of a document read from the store or the maintainer; 0 when it is missing or not an integer."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _writers_doc(table: WriterTable, now: int) -> list[dict]:
    return [
        {"kg_lo": w.kg_lo, "kg_hi": w.kg_hi, "epoch": w.epoch, "restored_from": w.base}
        for w in sorted(table.writers, key=lambda w: (w.kg_lo, w.kg_hi))
    ]


def _runs(status: dict) -> list[dict]:
    runs = status.get("runs") if isinstance(status, dict) else None
    if not isinstance(runs, list):
        return []
    # the maintainer lists runs oldest first: reversed, then a stable sort, so runs of one millisecond stay newest first
    good = [r for r in reversed(runs) if isinstance(r, dict)]
    good.sort(key=lambda r: _int(r.get("started_ms")), reverse=True)
    return good[:MAX_RUNS]


def _job_maintenance(status: dict | None, brief: bool) -> dict[str, Any]:
    """A job's maintenance state: its lease, its last runs (newest first, at most MAX_RUNS) and last error."""
    if not isinstance(status, dict):
        return {"lease": None, "runs": [], "last_run": None, "last_error": None}
    runs = _runs(status)
    lease = status.get("lease") if isinstance(status.get("lease"), dict) else None
    out: dict[str, Any] = {"lease": lease, "last_run": runs[0] if runs else None, "last_error": status.get("last_error")}
    if not brief:
        out["runs"] = runs
    return out


def _job_maintenance_doc(doc: dict | None, job: str) -> dict[str, Any] | None:
    if doc is None:
        return None
    if "error" in doc and "jobs" not in doc:
        return {"error": doc["error"]}
    jobs = doc.get("jobs")
    out = _maintenance_overview(doc) or {}
    out.update(_job_maintenance(jobs.get(job) if isinstance(jobs, dict) else None, brief=False))
    return out


def _maintenance_overview(doc: dict | None) -> dict[str, Any] | None:
    """Maintenance as a whole: on or off, the pool's holder id, its configuration (None when maintenance is off)."""
    if doc is None:
        return None
    if "error" in doc and "jobs" not in doc:
        return {"error": doc["error"]}
    out: dict[str, Any] = {"enabled": bool(doc.get("enabled")), "holder_id": doc.get("holder_id"), "config": doc.get("config") or {}}
    for key in ("running", "rounds", "last_round_ms", "last_error"):  # the maintainer's own state, when it says
        if key in doc:
            out[key] = doc[key]
    return out


def api_root() -> dict[str, Any]:
    """What /api answers: the routes and what each document holds."""
    return {
        "routes": {
            "/api/jobs": "one page of jobs (?page=N&per_page=K), each with its latest complete checkpoint and counts",
            "/api/jobs/JOB": "a job: one page of checkpoints newest first, pins, savepoints, writers, live exports, maintenance",
            "/api/jobs/JOB/checkpoints/N": "one checkpoint with every part (an incomplete one: each staged part read)",
            "/api/maintenance": "the pool's maintainer: on or off, its configuration, each job's lease, runs and last error",
        },
        "html": ["/", "/status/jobs/JOB", "/status/jobs/JOB/checkpoints/N"],
    }


def to_json(doc: Any) -> bytes:
    """A document as the API sends it: UTF-8 JSON, keys sorted, one trailing newline."""
    return (json.dumps(doc, sort_keys=True, indent=1, default=str) + "\n").encode()


def is_api_path(path: str) -> bool:
    """Whether a status path asks for JSON (/api...) rather than HTML."""
    return path == API or path.startswith(API + "/")


def document(page: StatusPage, route: StatusRoute, visible: Callable[[str], bool]) -> dict[str, Any]:
    """The document a route asks for; NotFoundError for an unknown route, a job or checkpoint that is not there."""
    if route.view == "api":
        return api_root()
    if route.view == "index":
        return page.jobs_index(visible, route.page, route.per_page)
    if route.view == "maintenance":
        return page.maintenance(visible)
    if route.view == "job" and route.job is not None:
        return page.job(route.job, route.page, route.per_page)
    if route.view == "checkpoint" and route.job is not None and route.checkpoint_id is not None:
        return page.checkpoint(route.job, route.checkpoint_id)
    raise NotFoundError(f"no route {route.path}; the status page answers {', '.join(ROUTES)}")


HTML_TYPE = "text/html; charset=utf-8"
JSON_TYPE = "application/json"


def render(route: StatusRoute, doc: dict[str, Any]) -> tuple[str, bytes]:
    """(content type, body) of a document: JSON under /api, else the HTML page of its view."""
    if route.api:
        return JSON_TYPE, to_json(doc)
    from pool import status_html

    if route.view == "index":
        text = status_html.render_index(doc, route.per_page)
    elif route.view == "job":
        text = status_html.render_job(doc, route.per_page)
    else:
        text = status_html.render_checkpoint(doc)
    return HTML_TYPE, text.encode()


def render_failure(api: bool, status: int, error: BaseException, message: str, now_ms: int) -> tuple[str, bytes]:
    """(content type, body) of a refused status request: {"error": {status, type, message}} under /api, else an HTML page."""
    if api:
        return JSON_TYPE, to_json({"error": {"status": status, "type": type(error).__name__, "message": message}})
    from pool import status_html

    hint = "" if status != 404 else f"the status page answers {', '.join(r for r in ROUTES if not r.startswith(API))}"
    return HTML_TYPE, status_html.render_error(status, message, now_ms, hint).encode()
