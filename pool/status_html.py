"""HTML of the status page: the status documents of pool/status_page.py as plain server-rendered pages, every string escaped."""

from __future__ import annotations

import datetime
import html
import json
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlencode

# a page never runs script (none is sent, and the policy forbids any that slipped in); styles are inline in <style>
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
MAX_RANGES_SHOWN = 6  # key-group ranges listed in a checkpoint's row before "+N more"

_CSS = """
:root { --fg:#1d2330; --muted:#5b6475; --line:#d9dde5; --head:#f3f5f8; --ok:#1a7f37; --warn:#9a6700; --bad:#cf222e; --link:#0b57d0; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color:var(--fg); background:#fff; }
header { background:#1d2330; color:#fff; padding:12px 24px; display:flex; align-items:baseline; gap:24px; flex-wrap:wrap; }
header h1 { font-size:18px; margin:0; font-weight:600; }
header a { color:#fff; text-decoration:none; }
header nav a { margin-right:16px; color:#c9d1e0; }
header .meta { margin-left:auto; color:#c9d1e0; font-size:12px; }
main { padding:16px 24px 32px; max-width:1400px; }
h2 { font-size:16px; margin:24px 0 8px; }
h2.title { font-size:20px; margin:4px 0 4px; }
p.crumbs { margin:14px 0 0; color:var(--muted); }
h2 .count { color:var(--muted); font-weight:400; }
p.note { color:var(--muted); margin:4px 0 8px; }
table { border-collapse:collapse; width:100%; margin:4px 0 8px; }
table.parts, table.staged { width:auto; min-width:720px; }
div.pair { display:grid; grid-template-columns:repeat(auto-fit, minmax(520px, 1fr)); gap:0 32px; }
th, td { text-align:left; padding:5px 10px; border-bottom:1px solid var(--line); vertical-align:top; }
th { background:var(--head); font-weight:600; font-size:12px; text-transform:uppercase; letter-spacing:.03em; color:#3b4354; }
td.num, th.num { text-align:right; font-variant-numeric:tabular-nums; white-space:nowrap; }
.nowrap { white-space:nowrap; }
td.mono, span.mono { font-family:ui-monospace, "DejaVu Sans Mono", Menlo, monospace; font-size:12.5px; }
tr:hover td { background:#fafbfc; }
a { color:var(--link); }
.badge { display:inline-block; padding:0 7px; border-radius:9px; font-size:12px; line-height:18px; border:1px solid; white-space:nowrap; }
.ok { color:var(--ok); border-color:#9bd3a8; background:#eef9f0; }
.warn { color:var(--warn); border-color:#e6cf8f; background:#fff8e5; }
.bad { color:var(--bad); border-color:#f0a8ae; background:#fff0f1; }
.muted { color:var(--muted); }
dl.facts { display:grid; grid-template-columns:max-content auto; gap:2px 16px; margin:8px 0; }
dl.facts dt { color:var(--muted); }
dl.facts dd { margin:0; }
dl.config { display:grid; grid-template-columns:repeat(4, max-content minmax(80px, auto)); gap:2px 14px; margin:4px 0 8px; font-size:13px; }
dl.config dt { color:var(--muted); }
dl.config dd { margin:0; font-family:ui-monospace, "DejaVu Sans Mono", Menlo, monospace; font-size:12.5px; }
nav.pages { margin:6px 0 12px; color:var(--muted); }
nav.pages a { margin-right:12px; }
.error { color:var(--bad); }
"""


def e(value: object) -> str:
    """``value`` as text safe inside an element or a quoted attribute (None as an empty string)."""
    return "" if value is None else html.escape(str(value), quote=True)


def link(href: str, text: object) -> str:
    """An <a> whose address and text are both escaped (addresses are built percent-encoded by pool/status_page.py)."""
    return f'<a href="{e(href)}">{e(text)}</a>'


def human_bytes(n: object) -> str:
    """Bytes for people: 0 B, 512 B, 1.5 KiB, 12.0 MiB, 3.25 GiB."""
    if not isinstance(n, int):
        return "—"
    value, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{n} B" if unit == "B" else f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"


def human_age(seconds: object) -> str:
    """An age for people: 4 s, 12 min, 3 h 5 min, 2 d 4 h ('—' when unknown)."""
    if not isinstance(seconds, int | float):
        return "—"
    s = int(max(0, seconds))
    if s < 120:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def utc(ms: object) -> str:
    """Milliseconds since the epoch as 2024-05-01 12:00:00 UTC ('—' for none)."""
    if not isinstance(ms, int) or ms <= 0:
        return "—"
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def ranges_text(ranges: Iterable[Iterable[int]], most: int = MAX_RANGES_SHOWN) -> str:
    """Key-group ranges as '0-31, 32-63, ... +N more'."""
    items = [f"{lo}-{hi}" for lo, hi in ranges]
    shown = ", ".join(items[:most])
    return shown + (f" +{len(items) - most} more" if len(items) > most else "") if items else "none"


def json_value(value: object) -> str:
    """A configuration value as its JSON spelling (true, null, 3600.0), as /api shows it."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return str(value)


def epochs_text(epochs: list[int]) -> str:
    """A checkpoint's part epochs, shortly: the newest, and how many older ones (all of them in the cell's title)."""
    if not epochs:
        return "—"
    return f"{max(epochs)}" + (f" +{len(epochs) - 1} older" if len(epochs) > 1 else "")


def _badge(text: str, kind: str) -> str:
    return f'<span class="badge {kind}">{e(text)}</span>'


def checkpoint_state(c: dict[str, Any]) -> tuple[str, str]:
    """(label, badge kind) of a checkpoint: complete, abandoned, being removed, or incomplete."""
    if c.get("retiring"):
        return "being removed", "warn"
    if c.get("complete"):
        return ("abandoned", "warn") if c.get("abandoned") else ("complete", "ok")
    return "incomplete", "bad" if c.get("missing_ranges") else "warn"


def _table(headers: list[str], rows: list[list[str]], numeric: Iterable[int] = (), css: str = "") -> str:
    """A table of already-escaped cells; columns in ``numeric`` right-aligned."""
    num = set(numeric)
    head = "".join(f"<th{' class=num' if i in num else ''}>{e(h)}</th>" for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(f"<td{' class=num' if i in num else ''}>{c}</td>" for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f'<table class="{e(css)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _page(title: str, refresh_s: int, now_ms: int, body: str, refresh: bool = True) -> str:
    meta = f'<meta http-equiv="refresh" content="{int(refresh_s)}">' if refresh else ""
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">{meta}'
        f"<title>{e(title)}</title><style>{_CSS}</style></head><body>"
        '<header><h1><a href="/">clink pool</a></h1><nav><a href="/">Jobs</a><a href="/api">API (JSON)</a></nav>'
        f'<span class="meta">{e(utc(now_ms))}{f" · refreshes every {int(refresh_s)} s" if refresh else ""}</span></header>'
        f"<main>{body}</main></body></html>"
    )


def _paging_nav(paging: dict[str, int], base: str, what: str, per_page_given: int | None) -> str:
    """'jobs 1–25 of 130 · next page' links (no script: plain links carrying page= and per_page=)."""
    total, first, last, page, pages = paging["total"], paging["first"], paging["last"], paging["page"], paging["pages"]

    def href(p: int) -> str:
        query = {"page": p, **({"per_page": per_page_given} if per_page_given else {})}
        return f"{base}?{urlencode(query)}"

    if not total:
        return f'<nav class="pages">no {e(what)} yet</nav>'
    shown = f"{what} {first + 1}–{last} of {total}" if last > first else f"no {what} on page {page} of {pages} ({total} in all)"
    links = []
    if page > 1:
        links.append(link(href(1), "first page"))
        links.append(link(href(min(page - 1, pages)), "previous page"))
    if paging["more"] > 0:
        links.append(link(href(page + 1), f"next page ({paging['more']} more)"))
        links.append(link(href(pages), "last page"))
    return f'<nav class="pages">{e(shown)}{" · " if links else ""}{" ".join(links)}</nav>'


def _maintenance_overview(m: dict[str, Any] | None) -> str:
    if m is None:
        return '<h2>Maintenance</h2><p class="note">maintenance off (this pool runs no compaction, retention or GC by itself)</p>'
    if "error" in m:
        return f'<h2>Maintenance</h2><p class="error">{e(m["error"])}</p>'
    state = _badge("on", "ok") if m.get("enabled") else _badge("disabled", "warn")
    config = m.get("config") or {}
    settings = "".join(f"<dt>{e(k)}</dt><dd>{e(json_value(v))}</dd>" for k, v in sorted(config.items())) if isinstance(config, dict) else ""
    rounds = ""
    if "rounds" in m:
        rounds = f"<dt>rounds</dt><dd>{e(m['rounds'])}, the last at {e(utc(m.get('last_round_ms')))}</dd>"
    if m.get("last_error"):
        rounds += f'<dt>last error</dt><dd class="error">{e(m["last_error"])}</dd>'
    return (
        f'<h2>Maintenance</h2><dl class="facts"><dt>state</dt><dd>{state}</dd>'
        f'<dt>this pool</dt><dd class="mono">{e(m.get("holder_id"))}</dd>{rounds}</dl>'
        + (f'<dl class="config">{settings}</dl>' if settings else "")
    )


def _last_run_cell(m: dict[str, Any] | None, now_ms: int) -> str:
    if m is None:
        return '<span class="muted">off</span>'
    if m.get("last_error"):
        return _badge("error", "bad") + f' <span class="error">{e(m["last_error"])}</span>'
    run = m.get("last_run")
    if not run:
        return '<span class="muted">no run yet</span>'
    kind = {"ok": "ok", "error": "bad"}.get(str(run.get("outcome")), "warn")
    started = run.get("started_ms")
    ago = f' <span class="muted">{e(human_age((now_ms - started) / 1000))} ago</span>' if isinstance(started, int) and started > 0 else ""
    return f"{e(run.get('task'))} {_badge(str(run.get('outcome')), kind)}{ago}"


def render_index(doc: dict[str, Any], per_page_given: int | None = None) -> str:
    """The index page: one page of jobs, each with its latest complete checkpoint, counts and last maintenance run."""
    rows = []
    for j in doc["jobs"]:
        name = link(j["page"], j["job"])
        if j.get("error"):
            rows.append([name, f'<span class="error">{e(j["error"])}</span>', "", "", "", "", "", "", "", ""])
            continue
        latest = j.get("latest")
        if latest:
            checkpoint = link(latest["page"], latest["checkpoint_id"])
            cells = [checkpoint, e(human_age(latest["age_s"])), e(latest["part_count"]), e(latest["max_layers"])]
            cells.append(f'<span title="{e(latest["bytes"])} bytes">{e(human_bytes(latest["bytes"]))}</span>')
        else:
            cells = ['<span class="muted">none yet</span>', "", "", "", ""]
        incomplete = f' <span class="badge warn">{e(j["incomplete"])} incomplete</span>' if j["incomplete"] else ""
        rows.append(
            [
                name,
                *cells,
                f"{e(j['checkpoints'])}{incomplete}",
                e(j["writers"]),
                e(j["live_exports"]),
                _last_run_cell(j.get("maintenance"), doc["now_ms"]),
            ]
        )
    paging = doc["paging"]
    table = _table(
        ["Job", "Latest checkpoint", "Age", "Parts", "Max layers", "Bytes", "Checkpoints", "Writers", "Live exports", "Maintenance"],
        rows,
        numeric=(1, 2, 3, 4, 5, 7, 8),
        css="jobs",
    )
    empty = '<p class="note">No jobs in this store yet (or none this token may read).</p>' if not paging["total"] else ""
    body = (
        f'<h2>Jobs <span class="count">({e(paging["total"])})</span></h2>{empty}{table if rows else ""}'
        f"{_paging_nav(paging, '/', 'jobs', per_page_given)}{_maintenance_overview(doc.get('maintenance'))}"
    )
    return _page("clink pool — jobs", doc["refresh_s"], doc["now_ms"], body)


def _checkpoint_rows(checkpoints: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for c in checkpoints:
        label, kind = checkpoint_state(c)
        ranges = ranges_text(c["ranges"])
        if not c["complete"] and c.get("missing_ranges"):
            ranges += f" (missing {ranges_text(c['missing_ranges'])})"
        all_epochs = ", ".join(str(x) for x in c["epochs"])
        when = c.get("created_at_ms") if c["complete"] else c.get("staged_at_ms")
        size = (
            f'<span title="{e(c["bytes"])} bytes">{e(human_bytes(c["bytes"]))}</span>' if c["complete"] else '<span class="muted">—</span>'
        )
        rows.append(
            [
                link(c["page"], c["checkpoint_id"]),
                _badge(label, kind),
                f'<span title="{e(utc(when))}">{e(human_age(c["age_s"]))}</span>',
                e(c["part_count"]),
                f'<span class="nowrap">{e(ranges)}</span>' if c["complete"] else e(ranges),
                f'<span class="mono nowrap" title="{e(all_epochs)}">{e(epochs_text(c["epochs"]))}</span>',
                e(c.get("max_layers", "—")),
                size,
                e(c.get("rows", "—")),
                e(", ".join(c["pins"])) if c["pins"] else '<span class="muted">—</span>',
            ]
        )
    return rows


CHECKPOINT_HEADERS = ["Checkpoint", "State", "Age", "Parts", "Key groups", "Newest epoch", "Max layers", "Bytes", "Rows", "Pinned by"]


def _parts_table(parts: list[dict[str, Any]]) -> str:
    rows = [
        [
            e(f"{p['kg_lo']}-{p['kg_hi']}"),
            f'<span class="mono">{e(p["epoch"])}</span>',
            e(p["layers"]),
            f'<span title="{e(p["bytes"])} bytes">{e(human_bytes(p["bytes"]))}</span>',
        ]
        for p in parts
    ]
    return _table(["Key groups", "Epoch", "Layers", "Bytes"], rows, numeric=(2, 3), css="parts")


def _staged_table(staged: list[dict[str, Any]]) -> str:
    rows = []
    for p in staged:
        state = _badge("current writer", "ok") if p["current"] else _badge("fenced epoch", "bad")
        if p.get("gone"):
            state += " " + _badge("gone", "warn")
        rows.append(
            [
                e(f"{p['kg_lo']}-{p['kg_hi']}"),
                f'<span class="mono">{e(p["epoch"] if p["epoch"] is not None else "—")}</span>',
                state,
                e(human_age(p["age_s"])),
                e(p.get("layers", "—")),
                e(human_bytes(p["bytes"])) if "bytes" in p else '<span class="muted">—</span>',
                f'<span class="error">{e(p["problem"])}</span>' if p.get("problem") else "",
            ]
        )
    return _table(["Key groups", "Epoch", "Writer", "Age", "Layers", "Bytes", ""], rows, numeric=(3, 4, 5), css="staged")


def _maintenance_job(m: dict[str, Any] | None) -> str:
    if m is None:
        return '<h2>Maintenance</h2><p class="note">maintenance off</p>'
    if "error" in m and "runs" not in m:
        return f'<h2>Maintenance</h2><p class="error">{e(m["error"])}</p>'
    lease = m.get("lease")
    if lease:
        holder = "this pool" if lease.get("ours") else str(lease.get("holder"))
        lease_text = f"held by {e(holder)} until {e(utc(lease.get('expires_ms')))}"
    else:
        lease_text = '<span class="muted">no lease held</span>'
    error = f'<dt>last error</dt><dd class="error">{e(m["last_error"])}</dd>' if m.get("last_error") else ""
    rows = []
    for r in m.get("runs") or []:
        kind = {"ok": "ok", "error": "bad"}.get(str(r.get("outcome")), "warn")
        duration = r.get("duration_s")
        rows.append(
            [
                f'<span class="nowrap">{e(utc(r.get("started_ms")))}</span>',
                e(r.get("task")),
                _badge(str(r.get("outcome")), kind),
                e(f"{duration:.3f} s" if isinstance(duration, int | float) else "—"),
                e(human_bytes(r.get("bytes_reclaimed"))),
                e(r.get("layers_folded", "—")),
                e(r.get("checkpoints_deleted", "—")),
                e(r.get("detail")),
            ]
        )
    runs = (
        _table(
            ["Started", "Task", "Outcome", "Took", "Reclaimed", "Layers folded", "Checkpoints deleted", "Detail"],
            rows,
            numeric=(3, 4, 5, 6),
            css="runs",
        )
        if rows
        else '<p class="note">no maintenance run yet</p>'
    )
    return f'<h2>Maintenance</h2><dl class="facts"><dt>lease</dt><dd>{lease_text}</dd>{error}</dl>{runs}'


def render_job(doc: dict[str, Any], per_page_given: int | None = None) -> str:
    """A job's page: its checkpoints (newest first), the parts of the newest complete one, pins, savepoints, writers, maintenance."""
    job = doc["job"]
    checkpoints = doc["checkpoints"]
    parts = ""
    newest = next((c for c in checkpoints if c["complete"] and not c["abandoned"]), None)
    if newest is not None:
        parts = f"<h2>Parts of checkpoint {link(newest['page'], newest['checkpoint_id'])}</h2>{_parts_table(newest['parts'])}"
    pins = _table(
        ["Checkpoint", "Holder", "Expires", "State"],
        [
            [
                e(p["checkpoint_id"]),
                e(p["holder"]),
                f'<span class="nowrap">{e(utc(p["expires_at_ms"]))}</span>',
                _badge("expired", "warn") if p["expired"] else _badge(f"{human_age(p['expires_in_s'])} left", "ok"),
            ]
            for p in doc["pins"]
        ],
        css="pins",
    )
    savepoints = _table(
        ["Savepoint", "Checkpoint", "Taken", "Parts", "Bytes", "Rows"],
        [
            [
                e(s["name"]),
                e(s.get("checkpoint_id", "—")),
                f'<span class="nowrap">{e(utc(s.get("created_at_ms")))}</span>',
                e(s.get("parts", "—")),
                e(human_bytes(s.get("bytes"))),
                e(s.get("rows", "—")),
            ]
            if s["complete"]
            else [e(s["name"]), f'<span class="error">{e(s.get("problem"))}</span>', "", "", "", ""]
            for s in doc["savepoints"]
        ],
        numeric=(3, 4, 5),
        css="savepoints",
    )
    writers = _table(
        ["Key groups", "Epoch", "Restored from"],
        [
            [e(f"{w['kg_lo']}-{w['kg_hi']}"), f'<span class="mono">{e(w["epoch"])}</span>', e(w["restored_from"] or "—")]
            for w in doc["writers"]
        ],
        css="writers",
    )
    live = _table(
        ["Key groups", "Epoch", "Serves at", "Expires in"],
        [
            [
                e(f"{a['kg_lo']}-{a['kg_hi']}"),
                f'<span class="mono">{e(a["epoch"])}</span>',
                f'<span class="mono">{e(a["url"])}</span>',
                e(human_age(a["expires_in_s"])),
            ]
            for a in doc["live_exports"]
        ],
        css="live",
    )
    retiring = ""
    if doc["retiring"]:
        retiring = "<h2>Being removed</h2>" + _table(
            ["Checkpoint", "By", "Until"],
            [[e(r["checkpoint_id"]), e(r["by"]), e(utc(r["until_ms"]))] for r in doc["retiring"]],
            css="retiring",
        )

    def more(n: int, what: str) -> str:
        return f'<p class="note">{e(n)} more {e(what)} not shown</p>' if n else ""

    def section(title: str, count: int, table: str, empty: str, extra: str = "") -> str:
        inner = table if count else f'<p class="note">{e(empty)}</p>'
        return f'<section><h2>{e(title)} <span class="count">({e(count)})</span></h2>{inner}{extra}</section>'

    paging = doc["paging"]
    body = (
        f'<p class="crumbs">{link("/", "Jobs")} / <strong>{e(job)}</strong> · {link(doc["api"], "as JSON")}</p>'
        f"<h2 class=title>Job {e(job)}</h2>"
        f'<h2>Checkpoints <span class="count">({e(paging["total"])}, {e(doc["complete_checkpoints"])} complete)</span></h2>'
        + (_table(CHECKPOINT_HEADERS, _checkpoint_rows(checkpoints), numeric=(2, 3, 6, 7, 8), css="checkpoints") if checkpoints else "")
        + _paging_nav(paging, doc["page"], "checkpoints", per_page_given)
        + parts
        + '<div class="pair">'
        + section("Writers", len(doc["writers"]), writers, "no writer registered")
        + section("Live exports", len(doc["live_exports"]), live, "no running subtask announces its live state")
        + section("Pins", len(doc["pins"]), pins, "no pins", more(doc["pins_more"], "pins"))
        + section(
            "Savepoints",
            len(doc["savepoints"]),
            savepoints,
            f"no savepoint under savepoints/{job}/",
            more(doc["savepoints_more"], "savepoints"),
        )
        + "</div>"
        + retiring
        + _maintenance_job(doc.get("maintenance"))
    )
    return _page(f"{job} — clink pool", doc["refresh_s"], doc["now_ms"], body)


def render_checkpoint(doc: dict[str, Any]) -> str:
    """One checkpoint's page: its facts and every part (incomplete: every staged part and the ranges still missing)."""
    job, cid = doc["job"], doc["checkpoint_id"]
    label, kind = checkpoint_state(doc)
    facts = [("state", _badge(label, kind)), ("age", e(human_age(doc["age_s"])))]
    if doc["complete"]:
        facts += [
            ("created", e(utc(doc["created_at_ms"]))),
            ("parent", e(doc["parent_id"] or "—")),
            ("parts", e(doc["part_count"])),
            ("bytes", f"{e(human_bytes(doc['bytes']))} ({e(doc['bytes'])} bytes)"),
            ("rows stored", e(doc["rows"])),
            ("files", e(doc["files"])),
            ("max layers", e(doc["max_layers"])),
            ("pinned by", e(", ".join(doc["pins"]) or "—")),
        ]
        parts = f"<h2>Parts <span class=count>({e(len(doc['parts']))})</span></h2>{_parts_table(doc['parts'])}"
    else:
        facts += [
            ("staged", e(utc(doc["staged_at_ms"]))),
            ("ranges staged by current writers", e(ranges_text(doc["ranges"], 32))),
            ("missing", e(ranges_text(doc["missing_ranges"], 32))),
        ]
        more = f'<p class="note">{e(doc["staged_more"])} more staged parts not read</p>' if doc.get("staged_more") else ""
        parts = f"<h2>Staged parts <span class=count>({e(len(doc['staged']))})</span></h2>{_staged_table(doc['staged'])}{more}"
    dl = "".join(f"<dt>{e(k)}</dt><dd>{v}</dd>" for k, v in facts)
    api = doc["job_page"].replace("/status/jobs/", "/api/jobs/", 1) + f"/checkpoints/{int(cid)}"
    body = (
        f'<p class="crumbs">{link("/", "Jobs")} / {link(doc["job_page"], job)} / <strong>checkpoint {e(cid)}</strong> · {link(api, "as JSON")}</p>'
        f'<h2 class=title>Checkpoint {e(cid)} of {e(job)}</h2><dl class="facts">{dl}</dl>{parts}'
    )
    return _page(f"{job} checkpoint {cid} — clink pool", doc["refresh_s"], doc["now_ms"], body)


def render_error(status: int, message: str, now_ms: int, hint: str = "") -> str:
    """An error page: the status and one escaped line saying what is wrong (no refresh: a 404 stays one)."""
    extra = f'<p class="note">{e(hint)}</p>' if hint else ""
    body = f'<h2>{e(status)}</h2><p class="error">{e(message)}</p>{extra}<p>{link("/", "All jobs")}</p>'
    return _page(f"{status} — clink pool", 0, now_ms, body, refresh=False)
