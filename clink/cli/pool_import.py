"""clink-pool import: checkpoint 1 of a new job from any SRC clink reads, as the State Processor API writes savepoints."""

from __future__ import annotations

import click

from clink.cli.common import apply, output_of, progress_callback
from clink.cli.pool import open_store_of
from clink.cli.pool_lifecycle import _mb
from clink.cli.state import POOL_OPTIONS, source_config
from snapshot import NUM_KEY_GROUPS


@click.command("import")
@click.argument("job")
@click.option(
    "--from",
    "src",
    required=True,
    metavar="SRC",
    help="The state to import: a snapshot file (canonical or changelog), a `clink state-export --format parquet` file, "
    "a checkpoint (file:///.../jobs/J/chk-N, s3://...), a savepoint directory, a pool (grpc://HOST:PORT/JOB[/chk-N]; HOST1:PORT1,HOST2:PORT2 or dns:///NAME:PORT for several), "
    "or a RocksDB checkpoint directory (rocksdb:///path, as RocksDBStateBackend.create_checkpoint writes it).",
)
@click.option(
    "--parallelism",
    "-p",
    type=click.IntRange(1, NUM_KEY_GROUPS),
    default=1,
    show_default=True,
    help=f"Subtasks the checkpoint is split for (1-{NUM_KEY_GROUPS}): one base file each, over even key-group ranges. "
    "Workers may still restore it at any parallelism.",
)
@click.option(
    "--progress/--no-progress", "show_progress", default=None, help="Progress bar on stderr (default: when stderr is a terminal)."
)
@apply(POOL_OPTIONS)
@click.pass_context
def import_cmd(ctx: click.Context, job: str, src: str, parallelism: int, show_progress: bool | None) -> None:
    """Create JOB's checkpoint 1 from SRC: a new job bootstrapped from a snapshot file, an export or another job's state.

    \b
    The rows are checked (each key once, every keyed row's key-group byte FNV-1a(user key) mod 128),
    split into --parallelism even key-group ranges and folded into one base file per range, about one
    segment per key group. JOB must be new; on any error nothing is left in the store. Workers of JOB
    then acquire any key-group ranges (any parallelism) and commit checkpoint 2 on top.
      clink-pool import --store s3://bkt/pool orders-v2 --from state.snap -p 4
      clink-pool import --store file:///pool orders-v2 --from state.parquet
      clink-pool import --store file:///pool orders-v2 --from file:///old/pool/jobs/orders/chk-42
      clink-pool import --store s3://bkt/pool orders-v2 --from s3://archive/savepoints/release-7 -o json
      clink-pool import --store file:///pool orders-v2 --from grpc://pool:7420/orders --pool-token "$TOKEN"
      clink-pool import --store file:///pool orders-v2 --from rocksdb:///var/clink/rocksdb-chk-42
    SRC is read as every `clink` command reads it (`clink --help`); a changelog variant is replayed first.
    """
    from clink.tools.sources import load_source
    from pool.importer import Importer
    from pool.lifecycle import Lifecycle

    life = Lifecycle(open_store_of(ctx, must_exist=False))  # an import may start a new store
    importer = Importer(life.context)
    job = importer.refuse_existing(job)  # a bad or taken name is refused before SRC is read
    config = source_config(ctx)
    source = load_source(src, config)
    ref = source.ref
    provenance = {
        "source": ref.spec,
        "source_kind": ref.kind,
        **({"source_job": ref.job} if ref.job else {}),
        **({"source_checkpoint_id": source.checkpoint_id or ref.checkpoint_id} if (source.checkpoint_id or ref.checkpoint_id) else {}),
        **({"source_savepoint": ref.savepoint} if ref.savepoint else {}),
        **({"source_was_changelog": True} if source.was_changelog else {}),
        "source_format_version": source.format_version,
    }
    with progress_callback("writing data files", show_progress) as step:
        m = importer.import_table(
            job,
            source.table,
            source.operators,
            source.state_versions,
            parallelism,
            provenance,
            source=source.label,
            progress=step,
        )
    doc = {
        "job": m.job,
        "checkpoint_id": m.checkpoint_id,
        "rows": source.table.num_rows,
        "parallelism": len(m.parts),
        "files": len(m.files),
        "bytes": m.total_bytes,
        "source": source.label,
        "source_kind": ref.kind,
    }
    output_of(ctx).result(
        doc,
        f"imported {source.label} as checkpoint 1 of {m.job}: {doc['rows']} rows, {doc['parallelism']} subtask(s), "
        f"{doc['files']} file(s), {_mb(m.total_bytes)}",
    )


COMMANDS = (import_cmd,)
