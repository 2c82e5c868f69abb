"""clink savepoint inspect | verify: a savepoint (or checkpoint) wherever it lies, by its directory URI or its _metadata."""

from __future__ import annotations

import click

from clink.cli.common import EXIT_NEGATIVE, EXIT_OK, output_of


def _open(ctx: click.Context, location: str):
    from clink.cli.state import source_config
    from clink.tools.sources import store_config
    from store.locations import open_location

    return open_location(location, store_config(source_config(ctx)))


@click.group("savepoint")
def savepoint_group() -> None:
    """Inspect and verify a savepoint or checkpoint: LOCATION is its directory URI or its _metadata.

    \b
    A savepoint is a directory holding _metadata and data/; copy it anywhere (another bucket, a
    local disk, by any tool) and these commands open it unchanged.
      clink savepoint inspect s3://bkt/pool/savepoints/orders/savepoint-42-a1b2c3
      clink savepoint inspect file:///archive/orders-release-7/_metadata -o json
      clink savepoint verify s3://bkt/pool/savepoints/orders/savepoint-42-a1b2c3
    """


@savepoint_group.command("inspect")
@click.argument("location")
@click.pass_context
def inspect_cmd(ctx: click.Context, location: str) -> None:
    """Operators (uid, op_id, parallelism, max parallelism, states, rows, bytes), subtasks, files and provenance.

    \b
    Reads _metadata only (no data file), as the State Processor API's SavepointReader would, with
    no JVM and no job. Rows are live rows for a savepoint (one folded layer per subtask) and stored
    rows (a key counted in every layer holding it) for a checkpoint with layers.
      clink savepoint inspect file:///data/pool/savepoints/demo/savepoint-3-0c1d2e
      clink savepoint inspect s3://bkt/pool/jobs/orders/chk-42 -o json
    """
    from clink.tools.savepoint_inspect import inspect_location, inspect_text

    doc = inspect_location(_open(ctx, location))
    output_of(ctx).result(doc, inspect_text(doc))


@savepoint_group.command("verify")
@click.argument("location")
@click.option("--expect-uid", "expect_uids", multiple=True, metavar="UID", help="An operator uid that must be present.")
@click.pass_context
def verify_cmd(ctx: click.Context, location: str, expect_uids: tuple[str, ...]) -> int:
    """Check every file as check-savepoint does; for a damaged or missing one, name it, what it holds, and what still restores.

    \b
    Exit code: 0 every check passed, 1 a check failed (the report names each damaged file, the
    operators and key-group ranges it holds, and the ranges that can still be restored), 2 not a
    savepoint (no _metadata, a future version, a truncated one, a data file in its place), 3 nothing there.
      clink savepoint verify file:///archive/orders-release-7
      clink savepoint verify s3://bkt/pool/savepoints/orders/savepoint-42-a1b2c3 -o json
    """
    from clink.cli.state import source_config
    from clink.tools.savepoint_check import FAIL, check_source
    from clink.tools.savepoint_inspect import DAMAGE_CHECKS, assess_damage, damage_text

    loc = _open(ctx, location)  # a location that is not a savepoint fails here, before any file is read
    # the opened location's own URI (absolute, normalised), so every spelling inspect accepts is checked the same way
    report = check_source(f"{loc.uri.rstrip('/')}/_metadata", source_config(ctx), (), list(expect_uids))
    bad = {
        f.path: f"{f.check}: {f.detail}"
        for f in report.findings
        if f.status == FAIL and f.path and f.path != "_metadata" and f.check in DAMAGE_CHECKS
    }
    damage = assess_damage(loc, bad)
    doc = {
        **report.as_dict(),
        "location": loc.uri,
        "damaged_files": damage.damaged,
        "restorable_key_groups": [list(r) for r in damage.restorable],
        "lost_key_groups": [list(r) for r in damage.lost],
    }
    lines = [f"{'ok  ' if f.status != FAIL else 'FAIL'} {f.check:<15} {f.path or '':<45} {f.detail}".rstrip() for f in report.findings]
    if bad:
        lines += damage_text(damage)
    lines.append("PASS" if report.passed else f"FAIL: {sum(1 for f in report.findings if f.status == FAIL)} problem(s)")
    output_of(ctx).result(doc, "\n".join(lines))
    return EXIT_OK if report.passed else EXIT_NEGATIVE


COMMANDS = (savepoint_group,)
