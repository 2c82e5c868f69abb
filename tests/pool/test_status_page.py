"""The pool's status page over a real PoolServer: every fact the HTML and /api/ show checked against PoolClient and Lifecycle,
escaping of hostile names, token scoping, bounded work on big stores, and the odd paths and methods.
"""

from __future__ import annotations

import html
import http.client
import json
import re
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from html.parser import HTMLParser
from typing import Any
from urllib.parse import quote

import pytest

import snapshot
from client.pool_client import PoolClient, PoolClientConfig
from pool.auth import TokenTable
from pool.core import PoolCore
from pool.domain import CommitRequest, KeyGroupRange
from pool.http_export import start_http_export
from pool.lifecycle import Lifecycle
from pool.maintenance import MaintenanceConfig
from pool.server import PoolServer, PoolServerConfig
from pool.status_html import epochs_text, human_bytes, ranges_text
from pool.status_page import StatusPageConfig
from store.memory import MemoryStore
from store.objects import ObjectStore
from tests.pool_server_fixtures import changelog_bytes, keyed_keys_in

OP = snapshot.operator_id("counter")
JOB = "orders"
TWO = [(0, 63), (64, 127)]
TIMEOUT = 30
# valid job ids, savepoint names and pin holders (no '/', whitespace or controls) that would be markup if not escaped
HOSTILE_JOB = "j<b>x\"onmouseover='alert(1)'&amp;<i>"
HOSTILE_NAME = "sp<img\"src=x'onerror=alert(2)>"
HOSTILE_HOLDER = 'h<svg"onload=alert(3)>&lt;'
HOSTILE_URL = "http://127.0.0.1:9/live<b>\"x'"


# ---- helpers -----------------------------------------------------------------------------------------------------


class Page(HTMLParser):
    """An HTML page read as a person reads it: its tables (header texts and row texts per table class), links, every tag."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tables: dict[str, list[list[str]]] = {}
        self.headers: dict[str, list[str]] = {}
        self.links: dict[str, str] = {}
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self._table: str | None = None
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self._in_head = False
        self._href: str | None = None
        self._link_text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag == "table":
            self._table = a.get("class") or ""
            self.tables.setdefault(self._table, [])
        elif tag == "thead":
            self._in_head = True
        elif tag == "tbody":
            self._in_head = False
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "a":
            self._href, self._link_text = a.get("href"), []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "tr" and self._row is not None and self._table is not None:
            if self._in_head:
                self.headers[self._table] = self._row
            else:
                self.tables[self._table].append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None
        elif tag == "a" and self._href is not None:
            self.links["".join(self._link_text).strip()] = self._href
            self._href = None

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)
        if self._href is not None:
            self._link_text.append(data)

    def rows(self, table: str) -> list[dict[str, str]]:
        """The rows of the table of class ``table`` as {header: cell text}."""
        return [dict(zip(self.headers[table], row, strict=True)) for row in self.tables[table]]

    def row(self, table: str, column: str, value: str) -> dict[str, str]:
        found = [r for r in self.rows(table) if r[column] == value]
        assert len(found) == 1, f"{table} rows with {column}={value!r}: {found} of {self.rows(table)}"
        return found[0]

    def all_text(self) -> str:
        return " ".join("".join(self.text).split())


def request(url: str, method: str = "GET", token: str | None = None, context: ssl.SSLContext | None = None) -> tuple[int, dict, bytes]:
    """(status, headers, body) of one request; HTTP errors are answers too."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(url, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT, context=context) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def get_page(base: str, path: str, **kw: Any) -> Page:
    status, headers, body = request(base + path, **kw)
    assert status == 200, (path, status, body[:500])
    assert headers["Content-Type"] == "text/html; charset=utf-8"
    return Page(body.decode())


def get_json(base: str, path: str, **kw: Any) -> Any:
    status, headers, body = request(base + path, **kw)
    assert status == 200, (path, status, body[:500])
    assert headers["Content-Type"] == "application/json"
    return json.loads(body)


def job_path(job: str, kind: str = "status") -> str:
    return f"/{kind}/jobs/{quote(job, safe='')}"


def commit(client: PoolClient, job: str, cid: int, kg: tuple[int, int], epoch: int, count: int, seed: int) -> None:
    keys = keyed_keys_in(kg[0], kg[1], count, seed)
    client.commit_checkpoint(job, cid, cid - 1, kg, epoch, changelog_bytes([(snapshot.ROW_PUT, OP, k, b"v%d" % seed) for k in keys]))


def build_job(client: PoolClient, job: str, savepoint_name: str = "before-upgrade", holder: str = "reader-a") -> dict[str, Any]:
    """Three complete checkpoints by two writers, checkpoint 4 staged by one current and one fenced writer, a pin, a savepoint,
    a live export; what was done, for the assertions.
    """
    leases = [client.acquire_writer(job, kg) for kg in TWO]
    for cid in (1, 2, 3):
        for i, (lease, kg) in enumerate(zip(leases, TWO, strict=True)):
            commit(client, job, cid, kg, lease.epoch, 10 + 7 * cid + i, seed=cid * 10 + i)
    commit(client, job, 4, TWO[1], leases[1].epoch, 5, seed=41)  # staged, then fenced: its writer is replaced next
    newer = client.acquire_writer(job, TWO[1])
    commit(client, job, 4, TWO[0], leases[0].epoch, 5, seed=40)  # the fenced part does not complete checkpoint 4 with it
    client.pin_checkpoint(job, holder, 3600, checkpoint_id=2)
    client.savepoint(job, name=savepoint_name, checkpoint_id=3)
    url = HOSTILE_URL if job == HOSTILE_JOB else "http://127.0.0.1:9/live"
    client.announce_live_export(job, TWO[0], leases[0].epoch, url, "subtask-secret-token", 120)
    return {"epochs": [leases[0].epoch, newer.epoch], "fenced_epoch": leases[1].epoch, "url": url}


@pytest.fixture
def served(store: ObjectStore) -> Iterator[tuple[str, PoolServer, PoolClient, dict]]:
    """A real pool (file or moto S3 store) with the HTTP port on, JOB built through the real client."""
    server = PoolServer(PoolServerConfig(listen="127.0.0.1:0", http_port=0, grace_seconds=0.2), store=store).start()
    client = PoolClient(server.address)
    try:
        facts = build_job(client, JOB)
        yield f"http://127.0.0.1:{server.http_port}", server, client, facts
    finally:
        client.close()
        server.stop(0)


@pytest.fixture
def memory_served() -> Iterator[tuple[str, PoolServer, PoolClient, MemoryStore]]:
    store = MemoryStore()
    server = PoolServer(PoolServerConfig(listen="127.0.0.1:0", http_port=0, grace_seconds=0.2), store=store).start()
    client = PoolClient(server.address)
    try:
        yield f"http://127.0.0.1:{server.http_port}", server, client, store
    finally:
        client.close()
        server.stop(0)


# ---- what the pages show, against what the client and the lifecycle report --------------------------------------


def test_job_page_and_api_show_every_fact_the_client_and_lifecycle_report(served) -> None:
    base, server, client, facts = served
    infos = {i.checkpoint_id: i for i in client.list_checkpoints(JOB, include_incomplete=True)}
    described = Lifecycle(server.store).describe_job(JOB)
    summaries = {c["checkpoint_id"]: c for c in described["checkpoints"]}
    doc = get_json(base, job_path(JOB, "api"))
    page = get_page(base, job_path(JOB))

    # checkpoints newest first, complete and incomplete, each with the client's counts and the manifest's parts
    assert [c["checkpoint_id"] for c in doc["checkpoints"]] == sorted(infos, reverse=True) == [4, 3, 2, 1]
    for c in doc["checkpoints"]:
        info = infos[c["checkpoint_id"]]
        assert c["complete"] == info.complete
        if not info.complete:
            continue
        manifest = json.loads(client.describe_checkpoint(JOB, info.checkpoint_id)[1])
        summary = summaries[info.checkpoint_id]
        assert (c["bytes"], c["rows"], c["files"], c["created_at_ms"]) == (
            info.total_bytes,
            info.num_rows,
            info.num_files,
            info.created_at_ms,
        )
        assert c["ranges"] == [list(r) for r in info.committed_ranges] == [[p["kg_lo"], p["kg_hi"]] for p in manifest["parts"]]
        assert c["epochs"] == sorted({p["epoch"] for p in manifest["parts"]})
        assert c["parts"] == [{k: p[k] for k in ("kg_lo", "kg_hi", "epoch", "layers", "bytes")} for p in summary["parts"]]
        assert c["max_layers"] == summary["max_layers"] and c["abandoned"] == info.abandoned
        row = page.row("checkpoints", "Checkpoint", str(info.checkpoint_id))
        assert row["State"] == "complete" and row["Parts"] == str(len(info.committed_ranges))
        assert row["Key groups"] == ranges_text([list(r) for r in info.committed_ranges])
        assert row["Newest epoch"] == epochs_text(c["epochs"]) and row["Max layers"] == str(summary["max_layers"])
        assert row["Bytes"] == human_bytes(info.total_bytes) and row["Rows"] == str(info.num_rows)
    # layers grow with each incremental checkpoint: the page would not see a layer count stuck at 1
    assert [summaries[i]["max_layers"] for i in (1, 2, 3)] == [1, 2, 3]

    # the incomplete checkpoint: the current writer's part, the fenced one flagged, the range still missing
    staged = next(c for c in doc["checkpoints"] if c["checkpoint_id"] == 4)
    assert [r[0] for r in infos[4].committed_ranges] == [0]  # the client counts only the current writer's part
    assert staged["ranges"] == [list(r) for r in infos[4].committed_ranges] and staged["missing_ranges"] == [[64, 127]]
    assert {(p["kg_lo"], p["epoch"], p["current"]) for p in staged["staged"]} == {
        (0, facts["epochs"][0], True),
        (64, facts["fenced_epoch"], False),
    }
    row = page.row("checkpoints", "Checkpoint", "4")
    assert row["State"] == "incomplete" and "missing 64-127" in row["Key groups"]

    # the parts of the newest complete checkpoint, as the lifecycle summarises them
    parts = page.rows("parts")
    assert [(p["Key groups"], p["Epoch"], p["Layers"], p["Bytes"]) for p in parts] == [
        (f"{p['kg_lo']}-{p['kg_hi']}", str(p["epoch"]), str(p["layers"]), human_bytes(p["bytes"])) for p in summaries[3]["parts"]
    ]

    # pins, writers, savepoints and live exports
    assert [(p["checkpoint_id"], p["holder"]) for p in doc["pins"]] == [(p["checkpoint_id"], p["holder"]) for p in described["pins"]]
    assert page.row("pins", "Holder", "reader-a")["Checkpoint"] == "2"
    assert page.row("checkpoints", "Checkpoint", "2")["Pinned by"] == "reader-a"
    assert doc["writers"] == [
        {"kg_lo": w["kg_lo"], "kg_hi": w["kg_hi"], "epoch": w["epoch"], "restored_from": None} for w in described["writers"]
    ]
    assert [w["Epoch"] for w in page.rows("writers")] == [str(e) for e in facts["epochs"]]
    (sp,) = doc["savepoints"]
    listed = Lifecycle(server.store).list_savepoints()
    assert sp["name"] in listed and sp["name"] == f"{JOB}/before-upgrade" and sp["checkpoint_id"] == 3 and sp["rows"] == infos[3].num_rows
    assert page.row("savepoints", "Savepoint", f"{JOB}/before-upgrade")["Checkpoint"] == "3"
    (live,) = doc["live_exports"]
    assert (live["kg_lo"], live["kg_hi"], live["epoch"], live["url"]) == (0, 63, facts["epochs"][0], facts["url"])
    assert page.row("live", "Key groups", "0-63")["Serves at"] == facts["url"]
    body = request(base + job_path(JOB, "api"))[2] + request(base + job_path(JOB))[2]
    assert b"subtask-secret-token" not in body  # a subtask's bearer is never shown
    assert doc["maintenance"] is None and "maintenance off" in page.all_text()


def test_index_links_each_job_and_shows_its_latest_checkpoint(served) -> None:
    base, _, client, facts = served
    client.acquire_writer("fresh-job", (0, 127))  # a job with a writer and no checkpoint yet
    infos = [i for i in client.list_checkpoints(JOB) if not i.abandoned]
    page = get_page(base, "/")
    doc = get_json(base, "/api/jobs")
    assert [j["job"] for j in doc["jobs"]] == client.list_jobs() == ["fresh-job", JOB]
    row = page.row("jobs", "Job", JOB)
    assert row["Latest checkpoint"] == str(infos[-1].checkpoint_id) == "3"
    assert row["Bytes"] == human_bytes(infos[-1].total_bytes) and row["Parts"] == "2"
    assert row["Checkpoints"] == f"{len(infos)} 1 incomplete" and row["Writers"] == "2" and row["Live exports"] == "1"
    assert page.row("jobs", "Job", "fresh-job")["Latest checkpoint"] == "none yet"
    assert page.links[JOB] == job_path(JOB) and page.links["fresh-job"] == job_path("fresh-job")
    # the link is followed to the job page, whose checkpoint links lead to each checkpoint's page
    job_page = get_page(base, page.links[JOB])
    cp = get_page(base, job_page.links["3"])
    assert cp.row("parts", "Key groups", "0-63")["Epoch"] == str(facts["epochs"][0])
    refresh = [a for t, a in page.tags if t == "meta" and a.get("http-equiv") == "refresh"]
    assert refresh and int(refresh[0]["content"] or 0) == StatusPageConfig().refresh_s
    assert not any(t == "script" for t, _ in page.tags + job_page.tags + cp.tags)


def test_checkpoint_page_reads_the_staged_parts_of_an_incomplete_checkpoint(served) -> None:
    base, server, client, facts = served
    doc = get_json(base, job_path(JOB, "api") + "/checkpoints/4")
    by_lo = {p["kg_lo"]: p for p in doc["staged"]}
    for lo, hi in TWO:  # each staged part's own body read: its layers, rows and the bytes of its files
        key = next(o.key for o in server.store.list(f"jobs/{JOB}/chk-4/parts/") if o.key.rsplit("/", 1)[1].startswith(f"{lo}-{hi}-"))
        staged = json.loads(server.store.get(key))
        part = next(p for p in staged["parts"] if p["kg_lo"] == lo)
        files = {f["path"]: f for f in staged["files"]}
        paths = [x for layer in part["layers"] for x in layer]
        assert by_lo[lo]["layers"] == len(part["layers"])
        assert by_lo[lo]["bytes"] == sum(files[x]["size"] for x in paths) and by_lo[lo]["rows"] == sum(files[x]["rows"] for x in paths)
    page = get_page(base, job_path(JOB) + "/checkpoints/4")
    assert page.row("staged", "Key groups", "64-127")["Writer"] == "fenced epoch"
    assert page.row("staged", "Key groups", "0-63")["Writer"] == "current writer"
    assert "64-127" in page.all_text() and "missing" in page.all_text()
    complete = get_json(base, job_path(JOB, "api") + "/checkpoints/2")
    assert complete["pins"] == ["reader-a"] and complete["complete"]


# ---- escaping ------------------------------------------------------------------------------------------------------


class _HostileMaintainer:
    def status(self, job: str | None = None) -> dict:
        run = {
            "task": "gc<b>",
            "started_ms": 1,
            "duration_s": 0.5,
            "outcome": "error",
            "detail": "<script>alert(4)</script>",
            "bytes_reclaimed": 0,
        }
        jobs = {HOSTILE_JOB: {"lease": {"holder": "pool<i>", "expires_ms": 2, "ours": False}, "runs": [run], "last_error": "x</td><b>boom"}}
        return {"holder_id": "me<b>", "enabled": True, "config": {"k<b>": "v<i>"}, "jobs": jobs if job in (None, HOSTILE_JOB) else {}}


def test_hostile_job_savepoint_holder_and_maintenance_strings_are_text_not_markup(memory_served) -> None:
    base, server, client, store = memory_served
    build_job(client, HOSTILE_JOB, savepoint_name=HOSTILE_NAME, holder=HOSTILE_HOLDER)
    assert server.http_export is not None
    server.http_export.server.maintainer = lambda: _HostileMaintainer()  # read per request, as the pool's own maintainer is
    hostile = [HOSTILE_JOB, HOSTILE_NAME, HOSTILE_HOLDER, HOSTILE_URL, "<script>alert(4)</script>", "x</td><b>boom", "pool<i>", "me<b>"]
    pages = ["/", job_path(HOSTILE_JOB), job_path(HOSTILE_JOB) + "/checkpoints/2", job_path(HOSTILE_JOB) + "/checkpoints/4"]
    for path in pages:
        status, headers, body = request(base + path)
        assert status == 200, (path, body[:300])
        text = body.decode()
        page = Page(text)
        # only the page's own tags: none a name could have opened, no attribute a name could have added
        assert {t for t, _ in page.tags} <= {
            "html",
            "head",
            "meta",
            "title",
            "style",
            "body",
            "header",
            "h1",
            "h2",
            "nav",
            "a",
            "span",
            "main",
            "p",
            "table",
            "thead",
            "tbody",
            "tr",
            "th",
            "td",
            "strong",
            "dl",
            "dt",
            "dd",
            "div",
            "section",
        }, path
        assert all(not k.startswith("on") and k != "src" for _, a in page.tags for k in a), path
        assert "script-src" not in headers["Content-Security-Policy"] and "default-src 'none'" in headers["Content-Security-Policy"]
        for raw in hostile:
            assert raw not in text or raw == html.escape(raw), (path, raw)
    job_page = Page(request(base + job_path(HOSTILE_JOB))[2].decode())
    readable = job_page.all_text()
    for raw in (HOSTILE_JOB, f"{HOSTILE_JOB}/{HOSTILE_NAME}", HOSTILE_HOLDER, HOSTILE_URL, "<script>alert(4)</script>", "x</td><b>boom"):
        assert raw in readable, raw  # shown to the reader exactly, as text
    index = Page(request(base + "/")[2].decode())
    assert index.links[HOSTILE_JOB] == job_path(HOSTILE_JOB)  # the link, percent-encoded, leads to the job
    assert get_json(base, job_path(HOSTILE_JOB, "api"))["job"] == HOSTILE_JOB
    status, _, body = request(base + "/status/jobs/" + quote('<b>nope&"', safe=""))
    assert status == 404 and b"<b>nope" not in body and html.escape('<b>nope&"').encode() in body


# ---- access: TLS and tokens as the export ---------------------------------------------------------------------------

TOKENS = """\
tok-a   job-a          read
tok-ab  job-a,job-b    rw
tok-w   job-a          write
tok-all *              read
"""


@pytest.fixture
def secured(pki) -> Iterator[tuple[str, ssl.SSLContext, PoolServer]]:
    tokens = TokenTable.parse(TOKENS, "tokens.txt")
    config = PoolServerConfig(listen="127.0.0.1:0", http_port=0, grace_seconds=0.2, tls=pki.server_tls(), tokens=tokens)
    server = PoolServer(config, store=MemoryStore()).start()
    ca = pki.ca_pem
    client = PoolClient(server.address, PoolClientConfig(token="tok-ab", tls_root_certificates=ca))
    try:
        for job in ("job-a", "job-b"):
            lease = client.acquire_writer(job, (0, 127))
            commit(client, job, 1, (0, 127), lease.epoch, 5, seed=len(job) + ord(job[-1]))
        context = ssl.create_default_context(cadata=ca.decode())
        yield f"https://127.0.0.1:{server.http_port}", context, server
    finally:
        client.close()
        server.stop(0)


def test_tokens_scope_the_index_and_the_job_pages_over_tls(secured) -> None:
    base, ctx, server = secured
    assert server.http_export is not None
    server.http_export.server.maintainer = lambda: _ScopedMaintainer()
    assert [j["job"] for j in get_json(base, "/api/jobs", token="tok-a", context=ctx)["jobs"]] == ["job-a"]
    assert [j["job"] for j in get_json(base, "/api/jobs", token="tok-ab", context=ctx)["jobs"]] == ["job-a", "job-b"]
    index = get_page(base, "/", token="tok-a", context=ctx)
    assert [r["Job"] for r in index.rows("jobs")] == ["job-a"] and "job-b" not in index.all_text()
    assert sorted(get_json(base, "/api/maintenance", token="tok-a", context=ctx)["jobs"]) == ["job-a"]
    assert get_page(base, "/status/jobs/job-a", token="tok-a", context=ctx).row("checkpoints", "Checkpoint", "1")["State"] == "complete"
    for path in ("/status/jobs/job-b", "/api/jobs/job-b", "/api/jobs/job-b/checkpoints/1", "/status/jobs/job-zzz"):
        status, _, body = request(base + path, token="tok-a", context=ctx)
        assert status == 403 and b"job-a" not in body, (path, body)
    status, _, body = request(base + "/api/jobs/job-zzz", token="tok-all", context=ctx)
    assert status == 404 and json.loads(body)["error"]["message"] == "job job-zzz not found"
    for token in (None, "tok-nope"):
        for path in ("/", "/api/jobs", "/status/jobs/job-a", "/api"):
            status, headers, _ = request(base + path, token=token, context=ctx)
            assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer"), (path, token)
    assert request(base + "/", token="tok-w", context=ctx)[0] == 403  # a write-only token reads nothing
    assert request(base + "/status/jobs/job-a", token="tok-w", context=ctx)[0] == 403
    assert request(base + "/healthz", context=ctx)[0] == 200
    with pytest.raises((urllib.error.URLError, http.client.HTTPException, ConnectionError)):  # plain http to the TLS port gets nothing
        urllib.request.urlopen(base.replace("https", "http") + "/", timeout=5).read()


class _ScopedMaintainer:
    def status(self, job: str | None = None) -> dict:
        jobs: dict[str, Any] = {j: {"lease": None, "runs": [], "last_error": None} for j in ("job-a", "job-b") if job in (None, j)}
        return {"holder_id": "p", "enabled": True, "config": {}, "jobs": jobs}


# ---- maintenance ---------------------------------------------------------------------------------------------------


def test_maintenance_runs_and_lease_are_shown_as_the_maintainer_reports_them() -> None:
    maintenance = MaintenanceConfig(interval_s=3600.0, compact_max_layers=2, keep_last=2)
    config = PoolServerConfig(listen="127.0.0.1:0", http_port=0, grace_seconds=0.2, maintenance=maintenance)
    with PoolServer(config, store=MemoryStore()) as server, PoolClient(server.address) as client:
        lease = client.acquire_writer(JOB, (0, 127))
        for cid in (1, 2, 3, 4):
            commit(client, JOB, cid, (0, 127), lease.epoch, 8, seed=cid)
        assert server.maintainer is not None
        server.maintainer.run_once()
        want = server.maintainer.status(JOB)
        doc = get_json(f"http://127.0.0.1:{server.http_port}", job_path(JOB, "api"))
        m = doc["maintenance"]
        runs = want["jobs"][JOB]["runs"][::-1]  # the maintainer lists them oldest first, the page newest first
        assert [r["started_ms"] for r in runs] == sorted((r["started_ms"] for r in runs), reverse=True)
        assert runs and m["runs"] == runs[: len(m["runs"])] and m["lease"] == want["jobs"][JOB]["lease"] and m["lease"]["ours"]
        assert {r["task"] for r in m["runs"]} == {"compaction", "retention", "gc"}
        assert m["holder_id"] == want["holder_id"] and m["config"] == want["config"]
        page = get_page(f"http://127.0.0.1:{server.http_port}", job_path(JOB))
        shown = page.rows("runs")
        assert [(row["Task"], row["Outcome"], row["Detail"]) for row in shown] == [
            (r["task"], r["outcome"], r["detail"]) for r in m["runs"]
        ]
        assert "held by this pool" in page.all_text()
        # retention removed what the page no longer lists: the page follows the store, not a cache
        assert [c["checkpoint_id"] for c in doc["checkpoints"]] == [i.checkpoint_id for i in reversed(client.list_checkpoints(JOB))]
        index = get_page(f"http://127.0.0.1:{server.http_port}", "/")
        assert index.row("jobs", "Job", JOB)["Maintenance"].startswith(m["runs"][0]["task"])


def test_a_maintainer_that_fails_leaves_the_rest_of_the_page(memory_served) -> None:
    base, server, client, _ = memory_served
    lease = client.acquire_writer(JOB, (0, 127))
    commit(client, JOB, 1, (0, 127), lease.epoch, 3, seed=1)

    class Broken:
        def status(self, job: str | None = None) -> dict:
            raise RuntimeError("lease table <unreadable>")

    assert server.http_export is not None
    server.http_export.server.maintainer = lambda: Broken()
    page = get_page(base, job_path(JOB))
    assert "maintenance status unavailable: RuntimeError: lease table <unreadable>" in page.all_text()
    assert page.row("checkpoints", "Checkpoint", "1")["State"] == "complete"
    assert get_page(base, "/").row("jobs", "Job", JOB)["Latest checkpoint"] == "1"


# ---- bounded work ----------------------------------------------------------------------------------------------------


def _requests(store: MemoryStore) -> dict[str, int]:
    return dict(store.counters.requests)


def _delta_requests(store: MemoryStore, before: dict[str, int]) -> dict[str, int]:
    after = _requests(store)
    return {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}


def test_a_store_with_many_jobs_and_checkpoints_costs_one_page_per_request() -> None:
    store = MemoryStore()
    core = PoolCore(store)
    jobs = [f"job-{i:04d}" for i in range(240)]
    full = KeyGroupRange(0, 127)
    for job in jobs:
        epoch, _ = core.acquire_writer(job, full)
        core.commit_checkpoint(CommitRequest(job, 1, 0, full, epoch), [changelog_bytes([(1, OP, b"\x00k", b"v")])])
    big = jobs[7]
    epoch = core.fencing.read(big)[0].writers[0].epoch
    for cid in range(2, 301):
        core.commit_checkpoint(CommitRequest(big, cid, cid - 1, full, epoch), [changelog_bytes([(1, OP, b"\x00k", b"v%d" % cid)])])
    config = StatusPageConfig(jobs_per_page=25, checkpoints_per_page=20)
    export = start_http_export(PoolCore(store), "127.0.0.1", 0, status=config)  # a fresh core: nothing cached yet
    base = export.url
    try:
        before = _requests(store)
        index = get_page(base, "/")
        cost = _delta_requests(store, before)
        assert [r["Job"] for r in index.rows("jobs")] == jobs[:25]
        assert "jobs 1–25 of 240" in index.all_text() and "215 more" in index.all_text()
        # one listing of the job names, then per job shown one LIST, the writers table and one manifest
        assert cost.get("list", 0) <= 1 + 25 and cost.get("get", 0) <= 2 * 25, cost
        doc = get_json(base, "/api/jobs?page=10&per_page=25")
        assert [j["job"] for j in doc["jobs"]] == jobs[225:] and doc["paging"]["more"] == 0
        nxt = get_page(base, index.links["next page (215 more)"])
        assert [r["Job"] for r in nxt.rows("jobs")] == jobs[25:50]

        before = _requests(store)
        page = get_page(base, job_path(big))
        cost = _delta_requests(store, before)
        shown = [int(r["Checkpoint"]) for r in page.rows("checkpoints")]
        assert shown == list(range(300, 280, -1)) and "280 more" in page.all_text()
        assert cost.get("get", 0) <= 20 + 3, cost  # twenty manifests, the writers table, no pins or savepoints to read
        again = _requests(store)
        get_page(base, job_path(big))
        assert _delta_requests(store, again).get("get", 0) <= 2  # manifests served from the reader's cache (etags listed)
        last = get_json(base, job_path(big, "api") + "?page=15")
        assert [c["checkpoint_id"] for c in last["checkpoints"]] == list(range(20, 0, -1))
        assert get_json(base, job_path(big, "api") + "?page=99")["checkpoints"] == []
        assert request(base + "/?per_page=201")[0] == 400  # past max_per_page
    finally:
        export.stop()


# ---- odd paths, methods, the export beside it ----------------------------------------------------------------------


def test_unknown_jobs_checkpoints_routes_and_parameters(served) -> None:
    base, _, _, _ = served
    status, headers, body = request(base + "/status/jobs/nobody-here")
    assert status == 404 and headers["Content-Type"].startswith("text/html") and b"job nobody-here not found" in body
    status, headers, body = request(base + "/api/jobs/nobody-here")
    assert status == 404 and json.loads(body)["error"] == {"status": 404, "type": "NotFoundError", "message": "job nobody-here not found"}
    status, _, body = request(base + job_path(JOB, "api") + "/checkpoints/77")
    assert status == 404 and json.loads(body)["error"]["message"] == f"checkpoint 77 of job {JOB} not found"
    cases = [
        ("/status", 404, "no route"),
        ("/status/jobs/", 404, "no route"),
        ("/status/jobs/orders/extra", 404, "no route"),
        ("/api/nothing", 404, "no route"),
        (job_path(JOB) + "/checkpoints/abc", 400, "positive integer"),
        (job_path(JOB) + "/checkpoints/0", 400, "positive integer"),
        ("/?page=0", 400, "page="),
        ("/?page=x", 400, "page="),
        ("/?page=1&page=2", 400, "2 times"),
        ("/?colour=red", 400, "unknown parameter"),
        ("/api/jobs/%2E%2E", 400, "must not contain"),
        ("/status/jobs/a%2Fb", 400, "forbidden character"),
        ("/status/jobs/%00", 400, "forbidden character"),
    ]
    for path, want, needle in cases:
        status, _, body = request(base + path)
        assert status == want and needle in html.unescape(body.decode()), (path, status, body[:300])
    assert get_json(base, "/api")["routes"] and get_json(base, "/api/")["routes"]
    assert get_page(base, "/status/jobs/orders/").row("checkpoints", "Checkpoint", "3")["State"] == "complete"  # a trailing slash
    assert get_json(base, "/api/maintenance") == {"enabled": False, "off": True}


def test_head_post_and_the_export_beside_the_status_page(served) -> None:
    base, _, _, _ = served
    for path in ("/", job_path(JOB), "/api/jobs", job_path(JOB, "api"), "/healthz"):
        status, headers, body = request(base + path, method="HEAD")
        assert status == 200 and body == b"" and int(headers["Content-Length"]) > 0, path
    status, _, body = request(base + "/status/jobs/nobody", method="HEAD")
    assert status == 404 and body == b""
    assert request(base + f"/jobs/{JOB}/state.arrow", method="HEAD")[0] == 405
    assert request(base + "/", method="POST")[0] == 405
    status, headers, body = request(base + f"/jobs/{JOB}/state.arrow")  # the export still streams
    assert status == 200 and headers["X-Clink-Checkpoint"] == "3" and body
    status, _, body = request(base + "/nothing/here")
    assert status == 404 and b"no route" in body and b"/api/jobs" in body
    # the JSON and the HTML of one page are built from the same document: the same checkpoints, the same order
    doc = get_json(base, job_path(JOB, "api"))
    page = get_page(base, job_path(JOB))
    assert [int(r["Checkpoint"]) for r in page.rows("checkpoints")] == [c["checkpoint_id"] for c in doc["checkpoints"]]
    assert re.search(r"refreshes every \d+ s", page.all_text())


class _HeldStore(MemoryStore):
    """A memory store whose listings of one prefix wait until released (a status page caught mid-read)."""

    def __init__(self) -> None:
        super().__init__()
        self.hold: str | None = None
        self.entered = threading.Event()
        self.release = threading.Event()

    def list(self, prefix: str = ""):  # noqa: ANN201 - the store's own signature
        if self.hold is not None and prefix.startswith(self.hold):
            self.entered.set()
            self.release.wait(TIMEOUT)
        return super().list(prefix)


def test_status_pages_built_at_once_are_bounded_and_the_export_is_not_held_up() -> None:
    store = _HeldStore()
    core = PoolCore(store)
    epoch, _ = core.acquire_writer(JOB, KeyGroupRange(0, 127))
    core.commit_checkpoint(CommitRequest(JOB, 1, 0, KeyGroupRange(0, 127), epoch), [changelog_bytes([(1, OP, b"\x00k", b"v")])])
    export = start_http_export(core, "127.0.0.1", 0, status=StatusPageConfig(max_requests=1))
    try:
        store.hold = f"jobs/{JOB}/chk-"
        first: list[int] = []
        waiting = threading.Thread(target=lambda: first.append(request(export.url + job_path(JOB, "api"))[0]))
        waiting.start()
        assert store.entered.wait(TIMEOUT)
        status, headers, body = request(export.url + "/api/jobs")
        assert status == 503 and headers["Retry-After"] == "1" and "status pages" in json.loads(body)["error"]["message"]
        store.hold = None  # the export reads the same listing: it streams meanwhile, under its own limit
        assert request(export.url + f"/jobs/{JOB}/state.arrow")[0] == 200
        store.release.set()
        waiting.join(TIMEOUT)
        assert first == [200]
        assert request(export.url + "/api/jobs")[0] == 200  # the slot was given back
    finally:
        store.release.set()
        export.stop()
