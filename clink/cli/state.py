"""The clink command: inspect, diff, query, check and export job state from files, object stores and pools."""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import click
import pyarrow as pa
import pyarrow.compute as pc

from clink.cli.common import (
    EXIT_HELP,
    EXIT_NEGATIVE,
    EXIT_OK,
    OUTPUT_OPTION,
    POSITIVE_DURATION,
    S3_OPTIONS,
    CommandLine,
    apply,
    dumps,
    one_line,
    output_of,
    progress,
    shared_option,
    shared_value,
)
from snapshot import InvalidArgumentError, NotFoundError, PermissionDeniedError, SnapshotArrowWriter, UnauthenticatedError
from snapshot.errors import ClinkError

if TYPE_CHECKING:
    from rich.console import JustifyMethod

SOURCES_HELP = """\b
SRC may be:
  state.snap                                   a snapshot file (canonical or changelog variant; a changelog
                                               with materialisation handles needs --store URI)
  file:///data/jobs/JOB/chk-7[/_metadata]      a checkpoint in a local store (also file:/data/...,
                                               file://localhost/data/..., or the bare path data/jobs/...)
  s3://bucket/prefix/jobs/JOB/chk-7            a checkpoint in S3 (--s3-endpoint-url for MinIO, SeaweedFS, moto)
  file:///data/savepoints/NAME, s3://...       a savepoint
  grpc://HOST:PORT/JOB[/chk-N]                 a pool: its newest complete checkpoint, or checkpoint N
  grpc://H1:P1,H2:P2,H3:P3/JOB[/chk-N]         several pools on one store: each call goes to the next, and
                                               fails over to the others when one is down
  grpc://dns:///NAME:PORT/JOB[/chk-N]          the pools a DNS name resolves to (gRPC's round_robin)
  http://HOST:PORT/jobs/JOB/state.arrow?...    a pool's HTTP export (clink-pool serve --http-port; ?live=1 for
                                               the running job's live state)
  rocksdb:///path/to/checkpoint                a RocksDB checkpoint or database directory (read-only; needs
                                               the [rocksdb] extra)"""


# how state-cat, state-diff and the query projection render bytes (clink/tools/projections.py render_bytes)
RENDERING_HELP = """\b
User keys and values render as text when they are printable UTF-8: valid UTF-8 of at least one
character that is not a space, with no control, format, line or paragraph separator, private-use
or unassigned character (as Python's str.isprintable), whatever its length. Otherwise 8 bytes
render as their little-endian int64, anything else as 0x-hex. state-cat and state-diff show text
that reads as a number or as hex in double quotes ("42"), so it is not taken for an int64 key."""


def _stdout_console():
    from rich.console import Console

    stream = sys.stdout
    interactive = stream.isatty()
    # a pipe or a file gets a wide, plain table rather than rich's 80-column default
    return Console(file=stream, width=None if interactive else 200, no_color=not interactive, highlight=False, soft_wrap=False)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    cli.main(args=argv, prog_name="clink")


POOL_OPTIONS = (
    shared_option("--pool-timeout", type=POSITIVE_DURATION, default=30.0, help="Deadline of each pool call (30s, 2m). Default: 30s."),
    shared_option(
        "--pool-token", envvar="CLINK_POOL_TOKEN", metavar="TOKEN", help="Bearer token for pools that require one. Env: CLINK_POOL_TOKEN."
    ),
    shared_option(
        "--pool-ca-file",
        envvar="CLINK_POOL_CA_FILE",
        type=click.Path(dir_okay=False),
        help="PEM roots: talk TLS to grpc:// pools, trusting these CAs. Env: CLINK_POOL_CA_FILE.",
    ),
    shared_option("--pool-tls-server-name", metavar="NAME", help="Expected TLS server name when it differs from the pool's host."),
    shared_option(
        "--pool-cert-file",
        envvar="CLINK_POOL_CERT_FILE",
        type=click.Path(dir_okay=False),
        help="PEM client certificate for pools that require mutual TLS (with --pool-key-file). Env: CLINK_POOL_CERT_FILE.",
    ),
    shared_option(
        "--pool-key-file",
        envvar="CLINK_POOL_KEY_FILE",
        type=click.Path(dir_okay=False),
        help="PEM private key of --pool-cert-file. Env: CLINK_POOL_KEY_FILE.",
    ),
    shared_option(
        "--insecure",
        is_flag=True,
        default=None,
        help="Allow sending --pool-token without TLS to another machine (by default only loopback pools get it in plaintext).",
    ),
)

# a changelog snapshot's materialisation handles name state stored elsewhere: --store says where (docs/format.md)
HANDLE_STORE_OPTION = shared_option(
    "--store",
    "handle_store",
    metavar="URI",
    help="Where the materialisation handles of a changelog snapshot (export_changelog_snapshot) are resolved: the pool's store "
    "root (s3://bucket/prefix, file:///path or a directory) or the pool itself (grpc://HOST:PORT, several pools as "
    "grpc://H1:P1,H2:P2, or grpc://dns:///NAME:PORT). Each handle is verified "
    "(commit digest, SHA-256, rows); one that cannot be is an error naming it.",
)

# every command takes these before or after its name: `clink --s3-region R state-cat SRC` = `clink state-cat SRC --s3-region R`
SOURCE_OPTIONS = (*S3_OPTIONS, *POOL_OPTIONS, HANDLE_STORE_OPTION, OUTPUT_OPTION)
# the shared options of a command that reads no SRC, when not all of them (its --help lists only what it uses)
OWN_SHARED_OPTIONS: dict[str, tuple] = {"demo": (OUTPUT_OPTION,)}


def _answered_by_pool(exc: BaseException) -> bool:
    """Whether an error came back from a pool (a gRPC status or an HTTP export's status), not from an object store."""
    import urllib.error

    import grpc

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (grpc.RpcError, urllib.error.HTTPError)):
            return True
        current = current.__cause__ or current.__context__
    return False


def pool_auth_hint(exc: ClinkError, token_given: bool) -> str | None:
    """What to do about a pool's UNAUTHENTICATED / PERMISSION_DENIED (HTTP 401 / 403): name the option and the variable."""
    if not isinstance(exc, (UnauthenticatedError, PermissionDeniedError)) or not _answered_by_pool(exc):
        return None
    if not token_given:
        return "the pool wants a token: pass it with --pool-token TOKEN or $CLINK_POOL_TOKEN"
    if isinstance(exc, UnauthenticatedError):
        return "the pool refused the token given with --pool-token or $CLINK_POOL_TOKEN: check it against the pool's --token-file"
    return (
        "the token given with --pool-token or $CLINK_POOL_TOKEN is not allowed this: it needs access to the job in the pool's --token-file"
    )


class StateCommandLine(CommandLine):
    """The clink group: its subcommands take the source options too; `clink savepoint` comes from savepoint.py."""

    command_modules = ("clink.cli.savepoint",)

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:  # noqa: D102
        apply(OWN_SHARED_OPTIONS.get(cmd.name or "", SOURCE_OPTIONS))(cmd)
        for sub in cmd.commands.values() if isinstance(cmd, click.Group) else ():  # clink savepoint inspect ... --s3-endpoint-url
            apply(SOURCE_OPTIONS)(sub)
        super().add_command(cmd, name)

    def explain(self, exc: ClinkError) -> str | None:
        """A pool's refusal names the option and the variable that carry the token."""
        ctx = self._last_ctx
        hint = pool_auth_hint(exc, bool(ctx is not None and shared_value(ctx, "pool_token")))
        return f"{exc} ({hint})" if hint else None


@click.group(
    "clink",
    cls=StateCommandLine,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120},
    epilog=SOURCES_HELP + "\n\n" + EXIT_HELP,
)
@apply(SOURCE_OPTIONS)
@click.version_option(package_name="clink-remote-state", prog_name="clink")
def cli() -> None:
    """Inspect and move clink job state with tools you already know.

    \b
    Every command reads SRC the same way (see below) and decodes keys as
    [key group][slot]|[user key]; operator state has no key group.
    Options before or after the command name mean the same.
    \b
      clink state-cat state.snap --limit 20
      clink state-export --from grpc://pool:7420/orders --out state.parquet --format parquet
      clink state-query s3://bkt/jobs/orders/chk-9 "SELECT slot, count(*) FROM state GROUP BY slot"
      clink state-diff chk-8.snap chk-9.snap
      clink check-savepoint file:///data/savepoints/v2 --expect-uid orders-agg
    """


def source_config(ctx: click.Context):
    """How this invocation reaches its sources, from the source options wherever they were given."""
    from clink.tools.sources import SourceConfig

    def value(name: str, default=None):
        return shared_value(ctx, name, default)

    def read_pem(name: str, flag: str) -> bytes | None:
        path = value(name)
        if not path:
            return None
        try:
            return Path(path).expanduser().read_bytes()
        except OSError as exc:
            raise click.BadParameter(f"cannot read {path}: {exc.strerror or exc}", param_hint=flag) from exc

    if bool(value("pool_cert_file")) != bool(value("pool_key_file")):
        raise click.BadParameter("--pool-cert-file and --pool-key-file go together", param_hint="--pool-cert-file")
    return SourceConfig(
        s3_endpoint_url=value("s3_endpoint_url"),
        s3_region=value("s3_region"),
        pool_timeout_s=value("pool_timeout", 30.0),
        pool_token=value("pool_token"),
        pool_tls_root_certificates=read_pem("pool_ca_file", "--pool-ca-file"),
        pool_tls_server_name=value("pool_tls_server_name"),
        pool_tls_client_cert=read_pem("pool_cert_file", "--pool-cert-file"),
        pool_tls_client_key=read_pem("pool_key_file", "--pool-key-file"),
        insecure=bool(value("insecure", False)),
        handle_store=value("handle_store"),
    )


# --- shared options ---------------------------------------------------------------------------------------


def _selection_options(fn):
    fn = click.option(
        "--op",
        "ops",
        multiple=True,
        metavar="ID",
        help="Only this operator: an op_id (decimal or 0x-hex) or uid:NAME. Repeatable.",
    )(fn)
    fn = click.option(
        "--key-groups",
        metavar="LO-HI",
        help="Only keyed rows of key groups LO..HI (0-127, inclusive); operator-state rows are always kept.",
    )(fn)
    return fn


def _selection(key_groups: str | None, ops: tuple[str, ...]):
    from clink.tools.sources import Selection, parse_key_groups, parse_op

    return Selection(parse_key_groups(key_groups) if key_groups else None, tuple(parse_op(o) for o in ops))


def _load(ctx: click.Context, spec: str, key_groups: str | None = None, ops: tuple[str, ...] = (), show_progress: bool | None = None):
    from clink.tools.sources import load_source

    selection = _selection(key_groups, ops)
    with progress(show_progress) as step:
        step(f"reading {spec}")
        return load_source(spec, source_config(ctx), selection)


def _note_unmatched(
    ctx: click.Context,
    tables: list[pa.Table],
    key_groups: str | None,
    ops: tuple[str, ...],
    where: str,
    slots: dict[str, bool] | None = None,
) -> None:
    """One line on stderr naming each filter that matched no entry (the result, empty or not, stays as it was on stdout)."""
    from clink.tools.sources import parse_op
    from snapshot import NUM_KEY_GROUPS, leading_bytes

    unmatched = []
    if ops:
        present = {int(o) for t in tables if t.num_rows for o in pc.unique(t.column("op_id")).to_pylist()}
        unmatched += [f"--op {o}" for o in ops if parse_op(o) not in present]
    # operator-state rows pass any --key-groups: the filter matched when a keyed row is left
    if key_groups is not None and not any(t.num_rows and (leading_bytes(t.column("key_bytes")) < NUM_KEY_GROUPS).any() for t in tables):
        unmatched.append(f"--key-groups {key_groups} (no keyed entry)")
    unmatched += [f"--slot {name}" for name, found in (slots or {}).items() if not found]
    if unmatched:
        output_of(ctx).note(f"nothing matches {' and '.join(unmatched)} in {where}", unmatched=unmatched)


def _echo_json(doc: object) -> None:
    click.echo(dumps(doc))


def _op_label(op_id: int, operators: dict[int, str | None]) -> str:
    uid = operators.get(op_id)
    return f"{uid} ({op_id})" if uid else str(op_id)


# --- state-cat --------------------------------------------------------------------------------------------


@cli.command(
    "state-cat",
    epilog="""\b
Examples:
  clink state-cat state.snap                       first 50 entries, sorted by operator and key
  clink state-cat state.snap --slot count -n 0     every entry of slot "count"
  clink state-cat grpc://127.0.0.1:7420/orders -o json --limit 5

"""
    + RENDERING_HELP
    + """ Values are cut to --width
characters in text output; -o json adds user_key_hex and value_hex."""
    + "\n\n"
    + SOURCES_HELP,
)
@click.argument("src")
@click.option("--limit", "-n", type=click.IntRange(min=0), default=50, show_default=True, help="Rows to show (0: all).")
@click.option("--slot", "slots", multiple=True, metavar="NAME", help="Only this slot (repeatable); legacy raw keys are slot <raw>.")
@click.option("--width", type=click.IntRange(min=4), default=32, show_default=True, help="Characters of each value preview (text output).")
@_selection_options
@click.pass_context
def state_cat(ctx, src, limit, slots, width, key_groups, ops):
    """Show the entries of SRC as a readable table: operator, key group, slot, user key, value size and preview."""
    from clink.tools.projections import decode_keys, preview, render_bytes

    source = _load(ctx, src, key_groups, ops)
    table = source.table.select(["op_id", "key_bytes", "value_bytes"])
    selected = table
    found: set[str] = set()
    if slots:
        slot_column = decode_keys(table.column("key_bytes")).column("slot")
        table = table.filter(pc.is_in(slot_column, value_set=pa.array(list(slots), pa.string())))
        found = set(pc.unique(slot_column).to_pylist()) if len(slot_column) else set()
    _note_unmatched(ctx, [selected], key_groups, ops, source.label, {name: name in found for name in dict.fromkeys(slots)})
    total = table.num_rows
    order = [("op_id", "ascending"), ("key_bytes", "ascending")]
    if 0 < limit < total:
        # the first rows in key order without sorting everything
        table = table.take(pc.select_k_unstable(table, k=limit, sort_keys=order))
    if table.num_rows:
        table = table.take(pc.sort_indices(table, sort_keys=order))
    shown = table
    decoded = decode_keys(shown.column("key_bytes"))
    shown = pa.table(
        {
            "op_id": shown.column("op_id"),
            "key_bytes": shown.column("key_bytes"),
            "value_bytes": shown.column("value_bytes"),
            "kind": decoded.column("kind"),
            "key_group": decoded.column("key_group"),
            "slot": decoded.column("slot"),
            "user_key": decoded.column("user_key"),
        }
    )
    key_text, _ = render_bytes(shown.column("user_key"), quote_lookalikes=True)
    value_text, _ = render_bytes(shown.column("value_bytes"), quote_lookalikes=True)
    sizes = pc.binary_length(shown.column("value_bytes"))
    if output_of(ctx).is_json:
        rows = shown.select(["op_id", "kind", "key_group", "slot"]).to_pylist()
        for row, key, raw_key, value, size, raw_value in zip(
            rows,
            key_text.to_pylist(),
            shown.column("user_key").to_pylist(),
            value_text.to_pylist(),
            sizes.to_pylist(),
            shown.column("value_bytes").to_pylist(),
            strict=True,
        ):
            row["uid"] = source.operators.get(row["op_id"])
            row.update(user_key=key, user_key_hex=raw_key.hex(), value_size=size, value=value, value_hex=raw_value.hex())
        _echo_json({"source": source.label, "total_rows": total, "shown": len(rows), "rows": rows})
        return EXIT_OK
    from rich.table import Table

    out = Table(title=f"{source.label}: {total} entr{'y' if total == 1 else 'ies'}", title_justify="left", show_lines=False)
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("operator", "left"),
        ("kg", "right"),
        ("slot", "left"),
        ("user key", "left"),
        ("size", "right"),
        ("value", "left"),
    )
    for name, justify in columns:
        out.add_column(name, justify=justify, overflow="fold")
    previews = preview(value_text, width).to_pylist()
    for op, kind, kg, slot, key, size, value in zip(
        shown.column("op_id").to_pylist(),
        shown.column("kind").to_pylist(),
        shown.column("key_group").to_pylist(),
        shown.column("slot").to_pylist(),
        key_text.to_pylist(),
        sizes.to_pylist(),
        previews,
        strict=True,
    ):
        kg_text = str(kg) if kg is not None else ("op" if kind == "operator" else "-")
        out.add_row(_op_label(op, source.operators), kg_text, slot, key, str(size), value)
    console = _stdout_console()
    console.print(out)
    if len(previews) < total:
        console.print(f"showing {len(previews)} of {total} (use --limit 0 for all)")
    return EXIT_OK


# --- state-diff -------------------------------------------------------------------------------------------


@cli.command(
    "state-diff",
    epilog="""\b
Examples:
  clink state-diff before.snap after.snap
  clink state-diff grpc://pool:7420/orders/chk-8 grpc://pool:7420/orders/chk-9 --limit 0 -o json
  clink state-diff a.snap b.snap >/dev/null && echo same

\b
Entries match on (operator, key bytes); a key in B only is added, in A only removed, in both with
other value bytes changed. Exit code: 0 equal, 1 different, an error's as in clink --help (3 not found)."""
    + "\n\n"
    + RENDERING_HELP
    + "\n\n"
    + SOURCES_HELP,
)
@click.argument("a")
@click.argument("b")
@click.option("--limit", "-n", type=click.IntRange(min=0), default=20, show_default=True, help="Differing entries to list (0: all).")
@_selection_options
@click.pass_context
def state_diff(ctx, a, b, limit, key_groups, ops):
    """Compare two states: added, removed and changed entries per operator and slot."""
    from clink.tools.state_diff import diff_tables, rendered_entries

    source_a = _load(ctx, a, key_groups, ops)
    source_b = _load(ctx, b, key_groups, ops)
    _note_unmatched(ctx, [source_a.table, source_b.table], key_groups, ops, "A or B")
    diff = diff_tables(source_a.table, source_b.table)
    entries = rendered_entries(diff, None if limit == 0 else limit)
    counts = diff.counts()
    operators = {**source_a.operators, **{k: v for k, v in source_b.operators.items() if v}}
    if output_of(ctx).is_json:
        _echo_json(
            {
                "a": source_a.label,
                "b": source_b.label,
                "equal": diff.equal,
                "rows_a": diff.rows_a,
                "rows_b": diff.rows_b,
                **counts,
                "by_slot": diff.summary.to_pylist(),
                "entries": entries,
            }
        )
        return EXIT_OK if diff.equal else EXIT_NEGATIVE
    console = _stdout_console()
    if diff.equal:
        console.print(f"equal: {diff.rows_a} entries in both")
        return EXIT_OK
    from rich.table import Table

    console.print(f"A: {source_a.label} ({diff.rows_a} entries)\nB: {source_b.label} ({diff.rows_b} entries)")
    summary = Table(title="differences per operator and slot", title_justify="left")
    for name in ("operator", "slot", "added", "removed", "changed"):
        summary.add_column(name, justify="left" if name in ("operator", "slot") else "right")
    for row in diff.summary.to_pylist():
        summary.add_row(_op_label(row["op_id"], operators), row["slot"], str(row["added"]), str(row["removed"]), str(row["changed"]))
    summary.add_row("total", "", str(counts["added"]), str(counts["removed"]), str(counts["changed"]), style="bold")
    console.print(summary)
    if entries:
        listing = Table(
            title="entries" + (f" (first {len(entries)})" if len(entries) < diff.entries.num_rows else ""), title_justify="left"
        )
        for name in ("change", "operator", "slot", "user key", "A", "B"):
            listing.add_column(name, overflow="fold")
        for e in entries:
            listing.add_row(
                e["change"],
                _op_label(e["op_id"], operators),
                e["slot"],
                e["user_key"],
                _cut(e["value_a"]),
                _cut(e["value_b"]),
            )
        console.print(listing)
    return EXIT_NEGATIVE


def _cut(text: str | None, width: int = 40) -> str:
    if text is None:
        return "-"
    return text if len(text) <= width else text[:width] + "…"


# --- state-query ------------------------------------------------------------------------------------------


@cli.command(
    "state-query",
    epilog="""\b
The table is called state and has the columns
  op_id UBIGINT, key_group UTINYINT (NULL for operator state and raw keys), slot VARCHAR,
  user_key BLOB, value_bytes BLOB, kind VARCHAR (keyed|operator|raw),
  key_text VARCHAR, key_int64 BIGINT, value_size BIGINT, value_text VARCHAR, value_int64 BIGINT
(*_text: printable UTF-8 as text, whatever its length (valid UTF-8 of at least one character that
 is not a space, with no control, format, separator, private-use or unassigned character),
 else 8 bytes as little-endian int64, else 0x-hex;
 *_int64: the little-endian int64 reading of every 8-byte key/value, text or not, else NULL:
 key_text = 'user-179' finds a text key, key_int64 = 42 an int64 key).

\b
Examples:
  clink state-query state.snap "SELECT slot, count(*) AS n FROM state GROUP BY slot ORDER BY n DESC"
  clink state-query state.snap "SELECT key_int64, value_int64 FROM state WHERE slot = 'count' AND value_int64 > 10"
  clink state-query grpc://127.0.0.1:7420/orders "SELECT * FROM state WHERE key_group IS NULL" -o json
"""
    + "\n\n"
    + SOURCES_HELP,
)
@click.argument("src")
@click.argument("sql")
@click.option("--limit", "-n", type=click.IntRange(min=0), default=1000, show_default=True, help="Rows to print (0: all).")
@_selection_options
@click.pass_context
def state_query(ctx, src, sql, limit, key_groups, ops):
    """Run DuckDB SQL over SRC's query projection (table name: state)."""
    import duckdb

    from clink.tools.projections import query_projection

    source = _load(ctx, src, key_groups, ops)
    _note_unmatched(ctx, [source.table], key_groups, ops, source.label)
    state = query_projection(source.table)
    con = duckdb.connect(":memory:")
    try:
        con.register("state", state)
        relation = con.sql(sql)
        # a statement without a result (CREATE, SET, ...) has no relation
        result = relation.to_arrow_table() if relation is not None else pa.table({})
    except duckdb.Error as exc:
        raise InvalidArgumentError(f"query failed: {one_line(str(exc))}") from None
    finally:
        con.close()
    total = result.num_rows
    shown = result if limit == 0 else result.slice(0, limit)
    rows = shown.to_pylist()
    if output_of(ctx).is_json:
        _echo_json({"source": source.label, "columns": result.column_names, "total_rows": total, "rows": rows})
        return EXIT_OK
    from rich.table import Table

    out = Table(title_justify="left")
    for name in result.column_names:
        out.add_column(name, overflow="fold")
    for row in rows:
        out.add_row(*[_cell(v) for v in row.values()])
    console = _stdout_console()
    console.print(out)
    console.print(f"{total} row{'s' if total != 1 else ''}" + (f" (showing {len(rows)})" if len(rows) < total else ""))
    return EXIT_OK


def _cell(value: object) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, (bytes, bytearray)):
        return "0x" + bytes(value).hex()
    return str(value)


# --- check-savepoint --------------------------------------------------------------------------------------


@cli.command(
    "check-savepoint",
    epilog="""\b
Checks, in order: the manifest (for checkpoints and savepoints), every data file's presence and
checksum (each bad file is named), each stream's format version and state versions, the key
layout (key-group byte = FNV-1a(user key) mod 128, 0xFF operator prefix, slot names), and the
operators: present but not expected, or expected but absent (the silent uid-mismatch trap).

\b
Examples:
  clink check-savepoint file:///data/savepoints/release-7 --expect-uid orders-agg --expect-uid enricher
  clink check-savepoint s3://bkt/clink/jobs/orders/chk-42 --expect-op 0x1f2e3d4c5b6a7988
  clink check-savepoint state.snap -o json

\b
Exit code: 0 every check passed, 1 a check failed, 2 bad usage, 3 source not found (the rest in clink --help).
"""
    + "\n\n"
    + SOURCES_HELP,
)
@click.argument("src")
@click.option(
    "--expect-op", "expect_ops", multiple=True, metavar="ID", help="An operator that must be present: op_id (decimal, 0x-hex) or uid:NAME."
)
@click.option(
    "--expect-uid", "expect_uids", multiple=True, metavar="UID", help="An operator uid that must be present (op_id = SHA-256 of the uid)."
)
@click.pass_context
def check_savepoint(ctx, src, expect_ops, expect_uids):
    """Check that SRC can be restored: format, versions, key layout, files, checksums and operators."""
    from clink.tools.savepoint_check import FAIL, PASS, WARN, check_source
    from clink.tools.sources import parse_op

    ops = [parse_op(o) for o in expect_ops]
    with progress(None) as step:
        step(f"checking {src}")
        report = check_source(src, source_config(ctx), ops, list(expect_uids))
    if output_of(ctx).is_json:
        _echo_json(report.as_dict())
        return EXIT_OK if report.passed else EXIT_NEGATIVE
    from rich.table import Table

    console = _stdout_console()
    out = Table(title=f"{report.source}: {report.rows} entries, {report.files_checked} file(s) checked", title_justify="left")
    for name in ("check", "status", "file", "detail"):
        out.add_column(name, overflow="fold")
    styles = {PASS: "green", FAIL: "bold red", WARN: "yellow"}
    for f in report.findings:
        out.add_row(f.check, f"[{styles.get(f.status, 'dim')}]{f.status.upper()}[/]", f.path or "", f.detail)
    console.print(out)
    failed = sum(1 for f in report.findings if f.status == FAIL)
    console.print("PASS" if report.passed else f"FAIL: {failed} problem(s)")
    return EXIT_OK if report.passed else EXIT_NEGATIVE


# --- state-export -----------------------------------------------------------------------------------------


@cli.command(
    "state-export",
    epilog="""\b
Formats:
  arrow    the canonical snapshot stream (restorable; any Arrow reader opens it)
  parquet  op_id uint64, key_group uint8 (NULL for operator state and raw keys), slot utf8,
           user_key binary, value_bytes binary; clink.format_version and clink.state_versions
           in the file's key-value metadata (a derived projection, not restorable; state-cat,
           state-diff and state-query read it back)
  Both carry the operators' uids the source names (a pool, a stored checkpoint) as
  clink.operators, JSON {"op_id": "uid"}, so state-cat shows them when it reads the file back.
  iceberg  the same five columns as an Iceberg table (op_id bit-cast to long, key_group int)
           in the catalog you name; a local SQL catalog needs no server
  query    Parquet of the query projection (the five columns plus kind, key_text, key_int64,
           value_size, value_text, value_int64: what state-query sees as the table state)

\b
Examples:
  clink state-export --from state.snap --out state.parquet
  clink state-export --from changelog.snap --store s3://bkt/pool --out state.arrow
  clink state-export --from grpc://127.0.0.1:7420/orders --out orders.arrow --key-groups 0-63
  clink state-export --from s3://bkt/jobs/orders/chk-9 --format iceberg \\
      --catalog-uri sqlite:////tmp/cat.db --warehouse file:///tmp/wh --table clink.orders
  python -c "import duckdb; duckdb.sql(\\"SELECT slot, count(*) FROM 'state.parquet' GROUP BY slot\\").show()"

\b
Files are written to a temporary name and renamed into place: a failed export leaves no partial file.
"""
    + "\n\n"
    + SOURCES_HELP,
)
@click.option("--from", "src", required=True, metavar="SRC", help="Where the state comes from (see below).")
@click.option(
    "--out",
    "dst",
    metavar="DST",
    help="Output file (arrow, parquet; '-' writes the arrow stream to a redirected stdout, never to a terminal).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["arrow", "parquet", "iceberg", "query"]),
    help="Output format; default: from --out's suffix (.arrow, .arrows, .ipc, .snap: arrow; .parquet, .pq: parquet; any other "
    "is refused), arrow for '-', iceberg when --table is given. A suffix naming the other format is refused.",
)
@_selection_options
@click.option("--catalog-uri", metavar="URI", help="Iceberg: SQL catalog URI, e.g. sqlite:////tmp/catalog.db.")
@click.option("--warehouse", metavar="URI", help="Iceberg: warehouse location, e.g. file:///tmp/warehouse.")
@click.option("--table", "table_name", metavar="NS.NAME", help="Iceberg: table identifier (namespace created if missing).")
@click.option("--catalog-name", default="clink", show_default=True, help="Iceberg: catalog name.")
@click.option(
    "--if-exists",
    type=click.Choice(["fail", "replace", "append"]),
    default="fail",
    show_default=True,
    help="Iceberg: what to do when the table exists.",
)
@click.option("--row-group-rows", type=click.IntRange(min=1), default=1 << 17, show_default=True, help="Parquet: rows per row group.")
@click.option(
    "--force",
    is_flag=True,
    default=False,
    help="Replace an existing --out file (keeping its mode) or symlink, or write into a device or FIFO; refused without it.",
)
@click.option(
    "--progress/--no-progress", "show_progress", default=None, help="Progress bars on stderr (default: when stderr is a terminal)."
)
@click.pass_context
def state_export(
    ctx,
    src,
    dst,
    fmt,
    key_groups,
    ops,
    catalog_uri,
    warehouse,
    table_name,
    catalog_name,
    if_exists,
    row_group_rows,
    force,
    show_progress,
):
    """Export SRC as an Arrow snapshot stream, a Parquet file or an Iceberg table."""
    if dst and dst != "-" and Path(dst).expanduser().is_dir():  # said first: no suffix makes a folder a file
        example = Path(dst) / ("state.parquet" if fmt in ("parquet", "query") else "state.arrow")
        raise InvalidArgumentError(f"--out {dst} is a directory; give a file name (e.g. {example})")
    if fmt and dst:
        _check_suffix(dst, fmt)
    fmt = fmt or _infer_format(dst, table_name)
    if fmt in ("arrow", "parquet", "query") and not dst:
        raise click.UsageError(f"--out is required for --format {fmt}")
    if fmt == "iceberg":
        missing = [name for name, value in (("--catalog-uri", catalog_uri), ("--table", table_name)) if not value]
        if missing:
            raise click.UsageError(f"--format iceberg needs {' and '.join(missing)}")
        if dst:
            raise click.UsageError("--out does not apply to --format iceberg (the catalog decides where files go)")
    if dst == "-" and fmt != "arrow":
        raise click.UsageError("only --format arrow can be written to stdout")
    if dst == "-" and sys.stdout.isatty():
        raise click.UsageError("--out - writes a binary Arrow stream to stdout, which is a terminal; redirect stdout or give a file")
    selection = _selection(key_groups, ops)
    from clink.tools.sources import load_source

    if dst and dst != "-":
        _check_out(dst, force)  # before the source is read: a refusal costs nothing
    with progress(show_progress) as step:
        step(f"reading {src}")
        source = load_source(src, source_config(ctx), selection)
        _note_unmatched(ctx, [source.table], key_groups, ops, source.label)
        rows = source.table.num_rows
        if fmt == "arrow":
            written = _export_arrow(source, dst, step, force)
            where = dst
        elif fmt in ("parquet", "query"):
            written = _export_parquet(source, dst, row_group_rows, step, query=fmt == "query", force=force)
            where = dst
        else:
            written, where = _export_iceberg(source, catalog_name, catalog_uri, warehouse, table_name, if_exists, step)
    summary = {"source": source.label, "format": fmt, "out": where, "rows": rows, "bytes": written}
    if output_of(ctx).is_json:
        if dst != "-":
            _echo_json(summary)
    else:
        size = f", {written} bytes" if written is not None else ""
        click.echo(f"exported {rows} entries from {source.label} to {where} ({fmt}{size})", err=dst == "-")
    return EXIT_OK


# --out suffixes that name a format (.snap: the snapshot files of this project's examples)
ARROW_SUFFIXES = (".arrow", ".arrows", ".ipc", ".snap")
PARQUET_SUFFIXES = (".parquet", ".pq")


def _infer_format(dst: str | None, table_name: str | None) -> str:
    """The --format that --out's suffix names; a usage error for a suffix that names none (out.csv is no Arrow file)."""
    import stat

    if table_name and not dst:
        return "iceberg"
    if not dst or dst == "-":
        return "arrow"
    suffix = Path(dst).suffix.lower()
    if suffix in PARQUET_SUFFIXES:
        return "parquet"
    if suffix in ARROW_SUFFIXES:
        return "arrow"
    try:
        mode = Path(dst).expanduser().stat().st_mode
    except OSError:
        mode = stat.S_IFREG
    if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        return "arrow"  # a device or FIFO (/dev/stdout, a pipe) takes the stream
    named = f"the suffix {suffix!r}" if suffix else "a name without a suffix"
    raise click.UsageError(f"--out {dst}: {named} names no format; end it in .arrow or .parquet, or pass --format arrow, parquet or query")


def _check_suffix(dst: str, fmt: str) -> None:
    """Refuse an --out whose suffix names another format than --format (x.arrow holding Parquet misleads every reader)."""
    suffix = Path(dst).suffix.lower()
    named = "parquet" if suffix in PARQUET_SUFFIXES else "arrow" if suffix in ARROW_SUFFIXES else None
    writes = "parquet" if fmt in ("parquet", "query") else fmt
    if named is not None and writes in ("arrow", "parquet") and named != writes:
        ends = ".parquet" if writes == "parquet" else ".arrow"
        raise click.UsageError(
            f"--out {dst}: the suffix {suffix} means {named}, but --format {fmt} writes {writes}; end --out in {ends} or pass --format {named}"
        )


def _check_out(dst: str, force: bool) -> os.stat_result | None:
    """What is at --out now (None: nothing); InvalidArgumentError for what may not be replaced without --force."""
    import stat

    try:
        st = Path(dst).expanduser().lstat()
    except FileNotFoundError:
        return None
    if stat.S_ISDIR(st.st_mode):
        raise InvalidArgumentError(f"--out {dst} is a directory; give a file name")
    if not force:
        special = not stat.S_ISREG(st.st_mode) and not stat.S_ISLNK(st.st_mode)
        what = "a symlink" if stat.S_ISLNK(st.st_mode) else "a device, FIFO or socket" if special else "an existing file"
        raise InvalidArgumentError(f"--out {dst} is {what}; pass --force to {'write to it' if special else 'replace it'}")
    return st


@contextmanager
def _atomic_output(dst: str, force: bool = False) -> Iterator[str]:
    """A temporary path beside ``dst`` that replaces it only when the block finishes without error.

    An existing file is replaced only with ``force`` and keeps its mode; a symlink, device, FIFO or socket at ``dst`` is
    refused without ``force`` (with it, a symlink itself is replaced and a device or FIFO is written to in place).
    """
    import stat

    target = Path(dst).expanduser()
    st = _check_out(dst, force)
    special = st is not None and not stat.S_ISREG(st.st_mode) and not stat.S_ISLNK(st.st_mode)
    if special:  # --force on /dev/null or a FIFO: written in place (renaming over a device would replace the device)
        yield str(target)
        return
    if not target.parent.exists():
        raise NotFoundError(f"--out {dst}: directory {target.parent} does not exist")
    tmp = _new_file_beside(target)
    try:
        yield tmp
        if st is not None and stat.S_ISREG(st.st_mode):  # a replaced file keeps its mode
            os.chmod(tmp, stat.S_IMODE(st.st_mode))
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _new_file_beside(target: Path) -> str:
    """An empty, uniquely named file in ``target``'s folder, with the mode the user's umask gives a new file (0644 under 022).

    Not tempfile.mkstemp: its files are 0600, and an export is a file like any other the user writes.
    """
    for _ in range(100):
        tmp = target.parent / f".{target.name}.{secrets.token_hex(4)}.tmp"
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        return str(tmp)
    raise FileExistsError(f"--out {target}: no free temporary name beside it")


def _export_arrow(source, dst: str, step, force: bool = False) -> int | None:
    from snapshot.format import operators_metadata

    # the uids the source named travel in the stream's metadata (clink.operators), as in a Parquet export
    writer = SnapshotArrowWriter(source.state_versions, {**source.extra_metadata, **operators_metadata(source.operators)})
    advance = step("writing arrow stream", total=1)
    if dst == "-":
        sink = sys.stdout.buffer
        writer.write_to(sink, source.table)
        sink.flush()
        advance()
        return None
    with _atomic_output(dst, force) as tmp:
        with pa.OSFile(tmp, "wb") as sink:
            writer.write_to(sink, source.table)
        advance()
    return Path(dst).stat().st_size


def _export_parquet(source, dst: str, row_group_rows: int, step, query: bool = False, force: bool = False) -> int:
    import pyarrow.parquet as pq

    from clink.tools.projections import parquet_projection, projection_metadata, query_projection
    from snapshot.format import operators_metadata

    rows = source.table.num_rows
    if query:
        meta = projection_metadata(source.format_version, source.state_versions, "query/1")
        projected = query_projection(source.table).replace_schema_metadata(meta)
    else:
        projected = parquet_projection(source.table, source.format_version, source.state_versions)
    # the uids the source named (a pool's, a stored checkpoint's) travel with the file, so its readers show them
    projected = projected.replace_schema_metadata({**(projected.schema.metadata or {}), **operators_metadata(source.operators)})
    advance = step("writing parquet", total=max(rows, 1))
    with _atomic_output(dst, force) as tmp:
        with pq.ParquetWriter(tmp, projected.schema, compression="zstd") as writer:
            if rows == 0:
                writer.write_table(projected)
            for start in range(0, rows, row_group_rows):
                part = projected.slice(start, row_group_rows)
                writer.write_table(part, row_group_size=row_group_rows)
                advance(part.num_rows)
    return Path(dst).stat().st_size


def _export_iceberg(source, catalog_name, catalog_uri, warehouse, table_name, if_exists, step) -> tuple[int | None, str]:
    from clink.tools.iceberg_export import write_iceberg

    advance = step("writing iceberg table", total=1)
    location = write_iceberg(source, catalog_name, catalog_uri, warehouse, table_name, if_exists)
    advance()
    return None, location


# --- demo -------------------------------------------------------------------------------------------------


@cli.command(
    "demo",
    epilog="""\b
Examples:
  clink demo
  clink demo --workdir demo        keeps ./demo/pool-data and ./demo/pool.log
  clink demo --workdir demo        again: a second job, word-count-demo-2, beside the first
  clink demo -o json               the story on stderr, one JSON document of what it did on stdout""",
)
@click.option(
    "--workdir",
    type=click.Path(),
    help="Keep the demo's store (DIR/pool-data) and the pool's log (DIR/pool.log) in DIR, a relative DIR taken from the current "
    "folder (default: a temporary directory, removed afterwards). Each run in DIR is a new job: word-count-demo, then "
    "word-count-demo-2, ...; while another demo runs in DIR, a second one stops (exit 69) and writes nothing. An empty DIR, or one "
    "that cannot be created, is refused (exit 2).",
)
@click.pass_context
def demo(ctx, workdir):
    """Run the end-to-end demo: a pool on loopback, a job writing state, checkpoints, restore and export."""
    try:
        from clink.cli.demo import run_demo
    except ImportError:
        click.echo("clink: the demo is not available in this build (clink.cli.demo is missing)", err=True)
        return EXIT_NEGATIVE
    if not output_of(ctx).is_json:
        return int(run_demo(workdir=workdir, echo=click.echo) or 0)
    # -o json: the story is for people (stderr); stdout carries one document of what the demo did
    report: dict[str, object] = {}
    code = run_demo(workdir=workdir, echo=lambda line: click.echo(line, err=True), report=report)
    _echo_json({key: report[key] for key in DEMO_REPORT_KEYS if key in report})
    return int(code or 0)


# the facts of `clink demo -o json`, in this order (clink.cli.demo.run_demo fills them)
DEMO_REPORT_KEYS = (
    "ok",
    "job",
    "workdir",
    "store",
    "checkpoints",
    "restored_checkpoint",
    "rescaled",
    "export_bytes",
    "words",
    "distinct_words",
    "exactly_once",
    "failed",
    "seconds",
)


if __name__ == "__main__":
    main()
