"""clink-pool savepoint | restore | compact | gc | pin | unpin | ls | inspect: lifecycle commands straight on a store."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import click

from clink.cli.common import DURATION, iso_utc, output_of, progress_callback
from clink.cli.pool import open_store_of, store_config_of
from snapshot.errors import ConflictError, CorruptDataError, InvalidArgumentError, NotFoundError
from store.locations import directory_uri


def _lifecycle(ctx: click.Context, must_exist: bool = True, **config: Any):
    from pool.lifecycle import Lifecycle, LifecycleConfig

    return Lifecycle(open_store_of(ctx, must_exist=must_exist), LifecycleConfig(**config))


def _emit(ctx: click.Context, doc: dict, text: str) -> None:
    output_of(ctx).result(doc, text)


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB"


class SavepointGroup(click.Group):
    """`clink-pool savepoint JOB ...` is `clink-pool savepoint create JOB ...`; `ls` and `delete` are its other commands."""

    def resolve_command(self, ctx: click.Context, args: list[str]):  # noqa: ANN201, D102 - click's signature
        if args and args[0] not in self.commands:
            return "create", self.commands["create"], args
        return super().resolve_command(ctx, args)


# an option the group does not know (`savepoint -c 2 orders`) is create's: kept for it, not refused by the group
@click.group("savepoint", cls=SavepointGroup, context_settings={"ignore_unknown_options": True})
def savepoint_group() -> None:
    """Take, list and delete savepoints: `savepoint JOB` takes one (`savepoint create JOB` is the same, and the way for a job named ls, delete or create).

    \b
    A savepoint is a directory holding _metadata and data/*.arrow, relative paths only: copy it to
    any bucket or directory, by any tool, and every command that takes a LOCATION (its directory
    URI, or its _metadata URI) opens it there.
      clink-pool savepoint --store s3://bkt/pool orders
      clink-pool savepoint --store s3://bkt/pool orders -c 42 --to s3://archive/orders/release-7
      clink-pool savepoint ls --store s3://bkt/pool
      clink-pool savepoint delete --store s3://bkt/pool s3://bkt/pool/savepoints/orders/savepoint-42-a1b2c3
      clink savepoint inspect s3://archive/orders/release-7
    """


@savepoint_group.command("create")
@click.argument("job")
@click.argument("name", required=False)
@click.option("--checkpoint", "-c", type=click.IntRange(0), default=0, show_default=True, help="Checkpoint to save; 0 = latest complete.")
@click.option(
    "--to",
    "to",
    default=None,
    metavar="DIR_URI",
    help="Write the savepoint into this directory (any prefix of any file:// or s3:// store). "
    "Default: savepoints/<job>/savepoint-<chk>-<6 hex>/ of --store (savepoints/NAME/ with NAME).",
)
@click.option("--target-store", default=None, hidden=True, help="Write savepoints/NAME/ into this store instead (use --to).")
@click.pass_context
def savepoint_cmd(
    ctx: click.Context,
    job: str,
    name: str | None,
    checkpoint: int,
    to: str | None,
    target_store: str | None,
) -> None:
    """Take a savepoint of a checkpoint of JOB: one folded base file per subtask and a _metadata holding its anatomy.

    \b
    It keeps the checkpoint's parallelism (one part, one file per subtask, about one segment per key
    group), so any new parallelism reads only its key groups. Prints where it was written
    (-o json: {"location": ...}).
      clink-pool savepoint --store s3://bkt/pool orders
      clink-pool savepoint --store s3://bkt/pool orders -c 42 --to file:///archive/orders-release-7
      clink-pool savepoint --store s3://bkt/pool orders release-7      (savepoints/release-7/)
    """
    if to and (name or target_store):
        raise InvalidArgumentError("--to names the savepoint's directory: give either --to or a NAME (with --target-store)")
    life = _lifecycle(ctx)
    target = open_store_of(ctx, target_store, must_exist=False) if target_store else None  # an archive may start here
    directory = open_store_of(ctx, directory_uri(to), must_exist=False) if to else None
    info = life.savepoint(job, checkpoint, name, target, to=directory)
    _emit(
        ctx,
        asdict(info),
        f"savepoint of checkpoint {info.checkpoint_id} of {info.job} (parallelism {info.parallelism}): {info.rows} rows, "
        f"{info.files} file(s), {_mb(info.bytes)}\nlocation: {info.location}",
    )


@savepoint_group.command("ls")
@click.option("--job", default=None, help="Only the savepoints of this job (as their _metadata says).")
@click.pass_context
def savepoint_ls_cmd(ctx: click.Context, job: str | None) -> None:
    """The savepoints under savepoints/ of --store: location, job, checkpoint, parallelism, rows, bytes, when taken.

    \b
    A folder with data but no _metadata is a savepoint that was never published (GC removes its files).
      clink-pool savepoint ls --store s3://bkt/pool
      clink-pool savepoint ls --store s3://bkt/pool --job orders -o json
    """
    from clink.tools.savepoint_inspect import iso_time_or_none
    from store.layout import savepoint_prefix
    from store.locations import NotAStateLocationError, open_directory
    from store.manifest import info_field
    from store.views import PrefixStore

    life = _lifecycle(ctx)
    found = []
    for name in life.list_savepoints():
        directory = PrefixStore(life.store, savepoint_prefix(name))
        try:
            loc = open_directory(directory)
        except (NotAStateLocationError, CorruptDataError, NotFoundError) as exc:
            if job is None or name.split("/")[0] == job:  # an unpublished folder tells its job by its place only
                found.append({"name": name, "location": directory.uri, "complete": False, "problem": str(exc)})
            continue
        if job is not None and loc.job != job:
            continue
        sp = info_field(loc.extra, "savepoint")
        rows = sum(f.rows for f in loc.manifest.files)
        found.append(
            {
                "name": name,
                "location": directory.uri,
                "complete": True,
                "job": loc.job,
                "checkpoint_id": loc.checkpoint_id,
                "parallelism": len(loc.manifest.parts),
                "rows": rows,
                "bytes": loc.manifest.total_bytes,
                "created_at": iso_time_or_none(sp.get("created_at_ms")),
            }
        )
    lines = [
        f"{s['location']}  job {s['job']} checkpoint {s['checkpoint_id']}, parallelism {s['parallelism']}, {s['rows']} rows, "
        f"{_mb(s['bytes'])}, taken {s['created_at'] or '?'}"
        if s["complete"]
        else f"{s['location']}  not a savepoint: {s['problem']}"
        for s in found
    ]
    _emit(ctx, {"savepoints": found}, "\n".join(lines) or "(no savepoints in this store)")


@savepoint_group.command("delete")
@click.argument("location")
@click.option("--force", is_flag=True, help="Delete even while a job of --store was restored from it and still holds that checkpoint.")
@click.option("--dry-run", is_flag=True, help="Say what would be deleted; delete nothing.")
@click.pass_context
def savepoint_delete_cmd(ctx: click.Context, location: str, force: bool, dry_run: bool) -> None:
    """Delete the savepoint at LOCATION (its directory URI or its _metadata; `savepoint ls` prints them).

    \b
    Refused (exit 4) while a job of --store still holds the checkpoint it was restored from this
    savepoint as (its rollback point), unless --force. _metadata goes first, so a half-done delete
    is never a readable savepoint; only the files its _metadata names are deleted.
      clink-pool savepoint delete --store s3://bkt/pool s3://bkt/pool/savepoints/orders/savepoint-42-a1b2c3
      clink-pool savepoint delete --store s3://bkt/pool s3://archive/orders/release-7 --dry-run
    """
    from store.layout import SAVEPOINT_MANIFEST
    from store.local import FileStore
    from store.locations import open_location

    life = _lifecycle(ctx)
    loc = open_location(location, store_config_of(ctx))
    if loc.kind != "savepoint":
        raise InvalidArgumentError(f"{loc.uri} is a checkpoint of job {loc.job}, not a savepoint: retention and GC remove checkpoints")
    directory = loc.directory
    users = life.jobs_restored_from(loc.uri)
    if users and not force:
        raise ConflictError(
            f"savepoint {loc.uri} is where {', '.join(f'job {j} (checkpoint {c})' for j, c in users)} was restored from and that "
            "checkpoint is still held; delete it once retention has moved past it, or pass --force"
        )
    keys = [SAVEPOINT_MANIFEST, *sorted(f.path for f in loc.manifest.files)]
    size = sum(f.size for f in loc.manifest.files)
    if not dry_run:
        for key in keys:  # _metadata first: from here on it is no savepoint, whatever is left
            directory.delete(key)
        if isinstance(directory, FileStore):
            directory.remove_root_if_empty()  # its lock file would stay an object of the store around it
    doc = {"location": loc.uri, "deleted": [] if dry_run else keys, "would_delete": keys if dry_run else [], "bytes": size}
    doc["restored_jobs"] = [{"job": j, "checkpoint_id": c} for j, c in users]
    verb = "would delete" if dry_run else "deleted"
    _emit(ctx, doc, f"{verb} savepoint {loc.uri}: {len(keys)} object(s), {_mb(size)}")


@click.command("restore")
@click.argument("new_job")
@click.option(
    "--from",
    "location",
    default=None,
    metavar="LOCATION",
    help="A savepoint's directory URI (or its _metadata), or a checkpoint folder .../jobs/JOB/chk-N, in any store.",
)
@click.option("--from-savepoint", "savepoint", default=None, help="Savepoint NAME under savepoints/ of --source-store.")
@click.option("--from-job", "source_job", default=None, help="Job whose checkpoint to restore from (with --checkpoint).")
@click.option(
    "--checkpoint", "-c", type=click.IntRange(0), default=0, show_default=True, help="With --from-job: checkpoint id, 0 = latest."
)
@click.option("--source-store", default=None, help="Store holding the source (savepoint or job). Default: --store.")
@click.option(
    "--uid",
    "uids",
    multiple=True,
    metavar="UID",
    help="An operator the new job declares (repeat). State of any other operator in the source fails the restore (exit 2).",
)
@click.option("--allow-non-restored-state", is_flag=True, help="Drop the state of operators not declared with --uid instead of failing.")
@click.option(
    "--progress/--no-progress", "show_progress", default=None, help="Progress bar on stderr (default: when stderr is a terminal)."
)
@click.pass_context
def restore_cmd(
    ctx: click.Context,
    new_job: str,
    location: str | None,
    savepoint: str | None,
    source_job: str | None,
    checkpoint: int,
    source_store: str | None,
    uids: tuple[str, ...],
    allow_non_restored_state: bool,
    show_progress: bool | None,
) -> None:
    """Create NEW_JOB's checkpoint 1 from a savepoint or a checkpoint (files copied, checksums verified).

    \b
    Flink's rules: with --uid, state held for an operator the job does not declare fails the restore
    (naming its uid and op_id, nothing written) unless --allow-non-restored-state drops it; declared
    operators with no state are reported (a renamed uid shows before any state is lost). Workers of
    NEW_JOB then restore with any key-group ranges (any parallelism) and commit checkpoint 2.
      clink-pool restore --store s3://bkt/pool orders-v2 --from s3://archive/orders/release-7 --uid enricher --uid agg
      clink-pool restore --store file:///pool orders-v2 --from file:///pool/savepoints/orders/savepoint-42-a1b2c3/_metadata
      clink-pool restore --store s3://bkt/pool orders-replay --from-job orders -c 40
    """
    if sum(x is not None for x in (location, savepoint, source_job)) != 1:
        raise InvalidArgumentError("restore needs exactly one source: --from LOCATION, --from-savepoint NAME or --from-job JOB")
    if allow_non_restored_state and not uids:
        raise InvalidArgumentError("--allow-non-restored-state drops the state of operators not declared with --uid: declare some")
    from store.locations import StateLocation, open_location

    # restoring from another store may start a new one at --store; restoring within one store needs it there
    life = _lifecycle(ctx, must_exist=source_store is None and location is None)
    source: StateLocation
    if location is not None:
        source = open_location(location, store_config_of(ctx))
    elif savepoint is not None:
        src_store = open_store_of(ctx, source_store) if source_store else life.store
        source = life.context.savepoint_location(savepoint, src_store)
    else:
        assert source_job is not None  # exactly one source, checked above
        src_store = open_store_of(ctx, source_store) if source_store else life.store
        source = life.checkpoint_location(source_job, checkpoint, src_store)
    with progress_callback("copying data files", show_progress) as step:
        res = life.restorer.restore(new_job, source, list(uids), allow_non_restored_state, progress=step)
    m = res.manifest
    if source.kind == "checkpoint":
        origin = f"checkpoint {source.checkpoint_id} of {source.job}"
    else:  # say whose state it is: a savepoint's location alone does not tell which job it came from
        origin = f"savepoint {source.uri} of job {source.job} (checkpoint {source.checkpoint_id})"
    doc = {
        "job": m.job,
        "checkpoint_id": m.checkpoint_id,
        "files": len(m.files),
        "bytes": m.total_bytes,
        "parallelism": len(m.parts),
        "source": origin,
        "source_location": source.uri,
        "source_job": source.job,
        "source_checkpoint_id": source.checkpoint_id,
        "declared_without_state": res.declared_without_state,
        "dropped_operators": {f"0x{op:016x}": uid for op, uid in res.dropped.items()},
    }
    lines = [f"restored {origin} as checkpoint 1 of {m.job}: {len(m.files)} file(s), {_mb(m.total_bytes)}, parallelism {len(m.parts)}"]
    for uid, op in res.declared_without_state.items():  # on stderr: stdout stays the result a script reads
        output_of(ctx).note(f"warning: operator {uid!r} (op_id 0x{op:016x}) is declared but has no state in the source: it starts empty")
    for op, uid in res.dropped.items():
        lines.append(f"dropped the state of operator {uid or '(no uid)'} (op_id 0x{op:016x}): not declared (--allow-non-restored-state)")
    _emit(ctx, doc, "\n".join(lines))


@click.command("compact")
@click.argument("job")
@click.option(
    "--checkpoint", "-c", type=click.IntRange(0), default=0, show_default=True, help="Checkpoint to compact; 0 = latest complete."
)
@click.option("--max-layers", type=click.IntRange(1), default=8, show_default=True, help="Fold a part with more layers than this.")
@click.option(
    "--max-delta-mb", type=click.IntRange(0), default=256, show_default=True, help="... or whose delta layers hold more MB than this."
)
@click.option("--force", is_flag=True, help="Fold every part with more than one layer, whatever the thresholds.")
@click.pass_context
def compact_cmd(
    ctx: click.Context,
    job: str,
    checkpoint: int,
    max_layers: int,
    max_delta_mb: int,
    force: bool,
) -> None:
    """Fold the layers of a checkpoint's parts over the thresholds into one base file each.

    \b
    The manifest is replaced by compare-and-swap (a concurrent change makes it exit 4, changing nothing); every
    read answers the same before and after, and later checkpoints build on the base.
      clink-pool compact --store s3://bkt/pool orders
      clink-pool compact --store s3://bkt/pool orders -c 42 --force -o json
    """
    life = _lifecycle(ctx, compact_max_layers=max_layers, compact_max_delta_bytes=max_delta_mb << 20)
    res = life.compact(job, checkpoint, force)
    doc = asdict(res)
    doc["folded"] = [{"kg_lo": lo, "kg_hi": hi, "layers_before": n} for lo, hi, n in res.folded]
    if not res.folded:
        text = f"checkpoint {res.checkpoint_id} of {job}: no part over the thresholds, nothing to fold"
    else:
        ranges = ", ".join(f"{lo}-{hi} ({n} layers)" for lo, hi, n in res.folded)
        text = f"checkpoint {res.checkpoint_id} of {job}: folded {ranges} into {res.files_written} base file(s), {_mb(res.bytes_written)}"
    _emit(ctx, doc, text)


@click.command("gc")
@click.option("--job", default=None, help="Only this job (default: every job and savepoint in the store).")
@click.option(
    "--min-age",
    type=DURATION,
    default="1h",
    show_default=True,
    help="Only delete files older than this (90s, 15m, 2h, 7d): commits in flight are safe.",
)
@click.option(
    "--keep-last",
    type=click.IntRange(1),
    default=None,
    help="First apply retention: keep the newest K complete checkpoints of each job (pins hold others).",
)
@click.option("--dry-run", is_flag=True, help="List what would be deleted; delete nothing.")
@click.option(
    "--progress/--no-progress", "show_progress", default=None, help="Progress bar on stderr (default: when stderr is a terminal)."
)
@click.pass_context
def gc_cmd(
    ctx: click.Context,
    job: str | None,
    min_age: float,
    keep_last: int | None,
    dry_run: bool,
    show_progress: bool | None,
) -> None:
    """Delete data files no retained manifest, staged part or savepoint names, older than --min-age.

    \b
    One listing per run. An interrupted run leaves gc/progress.json; the next run reports it and finishes the work.
      clink-pool gc --store s3://bkt/pool --dry-run
      clink-pool gc --store s3://bkt/pool --keep-last 3 --min-age 2h -o json
    """
    life = _lifecycle(ctx, gc_min_age_s=min_age, retain_last=keep_last or 3)
    retained = []
    if keep_last is not None:
        jobs = [job] if job else life.store.list_prefixes("jobs/")
        retained = [asdict(life.retain(j, keep_last, dry_run)) for j in jobs]
    with progress_callback("deleting unreferenced files", show_progress and not dry_run) as step:
        res = life.gc(job, dry_run, progress=step)
    # a run that frees nothing says why: which checkpoints still name the files their newest checkpoint no longer reads
    held = [] if res.deleted else _held(life, [job] if job else life.store.list_prefixes("jobs/"))
    doc = {**asdict(res), "retention": retained, "held": held}
    verb = "would delete" if dry_run else "deleted"
    lines = []
    for r in retained:
        pinned = f", pinned {list(r['pinned'])}" if r["pinned"] else ""
        lines.append(
            f"{r['job']}: {'would remove' if dry_run else 'removed'} checkpoints {list(r['deleted']) or 'none'}, kept {list(r['kept'])}{pinned}"
        )
    if res.resumed is not None:
        lines.append(f"finishing an interrupted run (started_ms {res.resumed.get('started_ms')}, {res.resumed.get('planned')} planned)")
    lines += [f"  {key}" for key in res.deleted] if dry_run else []
    lines.append(
        f"gc {res.scope}: {verb} {len(res.deleted)} object(s), {_mb(res.deleted_bytes)}; {res.listed_objects} listed, "
        f"{res.referenced} referenced, {res.too_young} younger than {min_age:g}s"
    )
    for h in held:
        lines.append(
            f"  {h['job']}: {h['files']} file(s), {_mb(h['bytes'])} that checkpoint {h['newest_checkpoint']} no longer reads are "
            f"still named by the manifests of checkpoint(s) {_spans(h['checkpoints'])}; they go once those leave retention "
            "(--keep-last, pins; a compacted checkpoint keeps the layers it folded until then)"
        )
    _emit(ctx, doc, "\n".join(lines))


def _held(life, jobs: list[str]) -> list[dict]:
    """Per job, the files older or compacted checkpoints still hold (jobs holding none left out)."""
    return [h for j in jobs if (h := life.held_files(j)) is not None and h["files"]]


def _spans(ids: list[int]) -> str:
    """1, 2, 3, 5 as '1-3, 5'."""
    spans: list[list[int]] = []
    for i in ids:
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


@click.command("pin")
@click.argument("job")
@click.argument("checkpoint", type=click.IntRange(0))
@click.argument("holder")
@click.option(
    "--ttl", type=DURATION, default="1h", show_default=True, help="How long the pin holds (renew by pinning again): 90s, 15m, 2h, 7d."
)
@click.pass_context
def pin_cmd(ctx: click.Context, job: str, checkpoint: int, holder: str, ttl: float) -> None:
    """Keep CHECKPOINT of JOB (0 = latest) from retention while HOLDER reads it, until the TTL runs out."""
    life = _lifecycle(ctx)
    pinned, expires = life.pin(job, checkpoint, holder, ttl)
    _emit(
        ctx,
        {"job": job, "checkpoint_id": pinned, "holder": holder, "expires_at_ms": expires, "expires_at": iso_utc(expires)},
        f"pinned checkpoint {pinned} of {job} for {holder} until {iso_utc(expires)}",
    )


@click.command("unpin")
@click.argument("job")
@click.argument("checkpoint", type=click.IntRange(0))
@click.argument("holder")
@click.pass_context
def unpin_cmd(ctx: click.Context, job: str, checkpoint: int, holder: str) -> None:
    """Drop HOLDER's pin on CHECKPOINT of JOB (0 = latest); says so when there is none to remove (exit 0 all the same)."""
    life = _lifecycle(ctx)
    checkpoint, removed = life.unpin(job, checkpoint, holder, latest_for_0=True)
    doc: dict[str, Any] = {"job": job, "checkpoint_id": checkpoint, "holder": holder, "unpinned": removed}
    if removed:
        text = f"unpinned checkpoint {checkpoint} of {job} for {holder}"
    else:
        doc["pinned_checkpoints"] = held = life.pins_held_by(job, holder)
        where = f" ({holder} pins checkpoint {', '.join(map(str, held))})" if held else f" ({holder} pins no checkpoint of {job})"
        text = f"no pin of checkpoint {checkpoint} of {job} held by {holder} to remove{where}"
    _emit(ctx, doc, text)


@click.command("ls")
@click.argument("job", required=False)
@click.pass_context
def ls_cmd(ctx: click.Context, job: str | None) -> None:
    """Without JOB: the jobs and savepoints in the store. With JOB: its checkpoints (layers, files, bytes) and pins.

    \b
      clink-pool ls --store s3://bkt/pool
      clink-pool ls --store s3://bkt/pool orders -o json
    """
    life = _lifecycle(ctx)
    if job is None:
        doc = {"jobs": life.store.list_prefixes("jobs/"), "savepoints": life.list_savepoints()}
        text = "\n".join([f"job       {j}" for j in doc["jobs"]] + [f"savepoint {s}" for s in doc["savepoints"]]) or "(empty store)"
        _emit(ctx, doc, text)
        return
    doc = life.describe_job(job)
    for p in doc["pins"]:
        p["expires_at"] = iso_utc(p["expires_at_ms"])
    if not doc["checkpoints"]:
        ranges = ", ".join(f"{w['kg_lo']}-{w['kg_hi']} (epoch {w['epoch']})" for w in doc["writers"]) or "none"
        lines = [
            f"{job}: no checkpoint yet. Workers connected as writers of key groups {ranges}; "
            "the job holds state once they complete a checkpoint."
        ]
    else:
        lines = _checkpoint_table(doc)
    lines.append(f"{doc['data_files']} data file(s), {_mb(doc['data_bytes'])} under jobs/{job}/data/")
    _emit(ctx, doc, "\n".join(lines))


def _checkpoint_table(doc: dict[str, Any]) -> list[str]:
    """Ls JOB's lines for a job with checkpoints: one per checkpoint (complete or staged), then its pins."""
    lines = [f"{'chk':>6} {'state':<10} {'parts':>5} {'layers':>6} {'files':>5} {'bytes':>12}"]
    for c in doc["checkpoints"]:
        if c["complete"]:
            lines.append(
                f"{c['checkpoint_id']:>6} {'complete':<10} {len(c['parts']):>5} {c['max_layers']:>6} {c['files']:>5} {c['bytes']:>12}"
            )
        else:
            lines.append(
                f"{c['checkpoint_id']:>6} {'staged':<10} {len(c['staged_ranges']):>5} {'':>6} {'':>5} {'':>12}  ranges {', '.join(c['staged_ranges'])}"
            )
    for p in doc["pins"]:
        lines.append(
            f"pin: checkpoint {p['checkpoint_id']} held by {p['holder']} until {p['expires_at']}{' (expired)' if p['expired'] else ''}"
        )
    return lines


@click.command("inspect")
@click.argument("job", required=False)
@click.option("--checkpoint", "-c", type=click.IntRange(0), default=0, show_default=True, help="Checkpoint id; 0 = latest complete.")
@click.option("--savepoint", default=None, help="Inspect savepoints/NAME instead of a job's checkpoint.")
@click.pass_context
def inspect_cmd(ctx: click.Context, job: str | None, checkpoint: int, savepoint: str | None) -> None:
    """A checkpoint's or savepoint's manifest: parts, their layers (oldest first), every file with kind, rows, size, segments.

    \b
      clink-pool inspect --store s3://bkt/pool orders -c 42
      clink-pool inspect --store file:///archive --savepoint nightly -o json
    """
    from pool.lifecycle import manifest_summary

    if (job is None) == (savepoint is None):
        raise InvalidArgumentError("inspect needs a JOB or --savepoint NAME (not both)")
    life = _lifecycle(ctx)
    _, m, folder = life.open_savepoint(savepoint) if savepoint else life.open_checkpoint(job, checkpoint)
    doc = {**manifest_summary(m), "folder": folder}
    lines = [
        f"{folder}: checkpoint {m.checkpoint_id} of {m.job} (parent {m.parent_id}), {len(m.files)} file(s), {_mb(m.total_bytes)}, "
        f"{m.total_rows} rows stored"
    ]
    lines += [f"operator {o} {u or '(no uid)'}" for o, u in m.operators]
    files = {f["path"]: f for f in doc["file_entries"]}
    for p in doc["parts"]:
        lines.append(f"part {p['kg_lo']}-{p['kg_hi']} epoch {p['epoch']}: {p['layers']} layer(s), {_mb(p['bytes'])}")
        for i, layer in enumerate(p["layer_files"]):
            for path in layer:
                f = files[path]
                lines.append(
                    f"  [{i}] {f['kind']:<5} {path}  kg {f['kg_lo']}-{f['kg_hi']}, {f['rows']} rows, {f['size']} bytes, {f['segments']} segment(s)"
                )
    _emit(ctx, doc, "\n".join(lines))


COMMANDS = (savepoint_group, restore_cmd, compact_cmd, gc_cmd, pin_cmd, unpin_cmd, ls_cmd, inspect_cmd)
