"""The clink-pool command line: `serve` runs a RemotePool; the store-level commands come from pool_lifecycle.py."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from clink.cli.common import (
    DURATION,
    ENV_POOL_STORE,
    EXIT_HELP,
    OUTPUT_OPTION,
    POSITIVE_DURATION,
    S3_OPTIONS,
    CommandLine,
    apply,
    output_of,
    shared_option,
    shared_value,
    store_config,
)
from snapshot.errors import InvalidArgumentError

if TYPE_CHECKING:
    from pool.lifecycle import LifecycleConfig
    from pool.maintenance import MaintenanceConfig

DEFAULT_STORE = "file://./pool-data"

STORE_OPTION = shared_option(
    "--store",
    envvar=ENV_POOL_STORE,
    metavar="URI",
    help=f"Where checkpoints live: a directory, file:///ABS/DIR or s3://BUCKET/PREFIX (a file URI names no host but localhost). "
    f"Env: {ENV_POOL_STORE}. serve's default: {DEFAULT_STORE}.",
)

# every command takes these before or after its name: `clink-pool --store S ls` = `clink-pool ls --store S`
STORE_OPTIONS = (STORE_OPTION, *S3_OPTIONS, OUTPUT_OPTION)


def store_uri_of(ctx: click.Context, default: str | None = None) -> str:
    """The --store given before or after the command (or in CLINK_POOL_STORE); a usage error when none and no default."""
    uri = shared_value(ctx, "store", default)
    if not uri:
        raise click.UsageError(f"--store is required (or set {ENV_POOL_STORE}), e.g. --store file:///data/pool", ctx)
    return uri


def store_config_of(ctx: click.Context):
    """The StoreConfig of the S3 options given wherever on the command line."""
    return store_config(shared_value(ctx, "s3_endpoint_url"), shared_value(ctx, "s3_region"))


def open_store_of(ctx: click.Context, uri: str | None = None, must_exist: bool = True):
    """The object store at ``uri`` (default: --store) with the S3 options given wherever.

    ``must_exist`` (every command but a restore or savepoint into a new store): "no such store", exit 3, for a missing
    one, and for a folder or prefix that holds no store (no jobs/, savepoints/ or the marker a serving pool writes).
    """
    from store.layout import require_store
    from store.objects import open_store

    store = open_store(uri or store_uri_of(ctx), store_config_of(ctx), must_exist=must_exist)
    if must_exist:
        require_store(store)
    return store


class _JsonFormatter(logging.Formatter):
    """One JSON object per log line, for log collectors."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"ts": round(record.created, 3), "level": record.levelname.lower(), "logger": record.name, "msg": record.getMessage()}
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def setup_logging(level: str, output: str) -> None:
    """Readable logs on stderr: `time level logger: message`, or JSON lines with --output json."""
    handler = logging.StreamHandler(sys.stderr)
    if output == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-5s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


class PoolCommandLine(CommandLine):
    """The clink-pool group: serve here, the store-level commands from pool_lifecycle.py; all take the store options."""

    command_modules = ("clink.cli.pool_lifecycle", "clink.cli.pool_import", "clink.cli.pool_retain")

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:  # noqa: D102
        apply(STORE_OPTIONS)(cmd)
        for sub in cmd.commands.values() if isinstance(cmd, click.Group) else ():  # clink-pool savepoint ls --store ...
            apply(STORE_OPTIONS)(sub)
        super().add_command(cmd, name)


@click.group(
    "clink-pool", cls=PoolCommandLine, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110}, epilog=EXIT_HELP
)
@apply(STORE_OPTIONS)
@click.version_option(package_name="clink-remote-state", prog_name="clink-pool")
def cli() -> None:
    """Run and operate the RemotePool, the state of record of clink jobs.

    The pool is a stateless gRPC server over an object store (a local directory or an S3 bucket).
    Several pool processes may serve one bucket at once: they coordinate only through conditional
    writes in the store.

    \b
    Start one on the embedded local store:
      clink-pool serve
    Serve an S3-compatible bucket (MinIO, SeaweedFS, AWS) with Prometheus metrics:
      clink-pool serve --store s3://my-bucket/pool --s3-endpoint-url http://127.0.0.1:8333 --metrics-port 9464
    Options before or after the command name mean the same.
    """


class ListenAddress(click.ParamType):
    """A click type for HOST:PORT (an IPv6 host in brackets, port 0..65535): a bad one is a usage error before anything starts."""

    name = "host:port"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:  # noqa: D102
        from pool.server import parse_listen

        try:
            parse_listen(value)
        except InvalidArgumentError as exc:
            self.fail(str(exc), param, ctx)
        return value


@cli.command()
@click.option(
    "--listen",
    type=ListenAddress(),
    default="127.0.0.1:7420",
    show_default=True,
    help="gRPC address HOST:PORT, an IPv6 host in brackets ([::1]:7420); port 0 picks a free one.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve Prometheus metrics on http://METRICS_HOST:PORT/metrics (0 picks a free port). Off when omitted.",
)
@click.option("--metrics-host", default="127.0.0.1", show_default=True, help="Address the metrics endpoint binds to.")
@click.option(
    "--http-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve GET /jobs/JOB/state.arrow?checkpoint=N&key_groups=LO-HI&op_id=ID (Arrow stream) on HTTP_HOST:PORT "
    "(0 picks a free port). Off when omitted.",
)
@click.option("--http-host", default="127.0.0.1", show_default=True, help="Address the HTTP export (--http-port) binds to.")
@click.option(
    "--create-bucket/--no-create-bucket",
    default=False,
    show_default=True,
    help="Create the S3 bucket if it does not exist (without it, a missing bucket stops serve at startup).",
)
@click.option(
    "--cache-mb", type=click.IntRange(0), default=256, show_default=True, help="Bytes of data files kept in memory for reads, in MiB."
)
@click.option("--max-workers", type=click.IntRange(1), default=16, show_default=True, help="Concurrent RPCs served at once.")
@click.option("--max-message-mb", type=click.IntRange(1), default=64, show_default=True, help="Largest gRPC message sent, in MiB.")
@click.option(
    "--max-request-mb",
    type=click.IntRange(1),
    default=16,
    show_default=True,
    help="Largest gRPC request message taken, in MiB (grpc holds a whole message before the pool can refuse it).",
)
@click.option("--grace", type=DURATION, default="5s", show_default=True, help="How long in-flight calls get to finish on SIGTERM/SIGINT.")
@click.option(
    "--tls-cert",
    type=click.Path(dir_okay=False),
    default=None,
    help="PEM certificate chain: serve gRPC and HTTP over TLS (needs --tls-key).",
)
@click.option("--tls-key", type=click.Path(dir_okay=False), default=None, help="PEM private key of --tls-cert.")
@click.option(
    "--tls-client-ca",
    type=click.Path(dir_okay=False),
    default=None,
    help="PEM CA bundle: clients must present a certificate it signed (mutual TLS).",
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False),
    default=None,
    envvar="CLINK_POOL_TOKEN_FILE",
    help="Require 'authorization: Bearer TOKEN'. Lines 'TOKEN JOB[,JOB..] read|write|rw' ('*' wildcard) or JSON "
    '{"tokens": [{"token": .., "jobs": [..], "access": "rw"}]}; TOKEN may be sha256:HEX of the token. '
    "Health checks stay open. Env: CLINK_POOL_TOKEN_FILE.",
)
@click.option(
    "--max-concurrent-rpcs",
    type=click.IntRange(1),
    default=64,
    show_default=True,
    help="Calls admitted at once (running or waiting for a worker); more get RESOURCE_EXHAUSTED at once. Health checks do not count.",
)
@click.option(
    "--max-rpcs-per-token",
    type=click.IntRange(0),
    default=8,
    show_default=True,
    help="Calls of one bearer token admitted at once (0: no per-token bound), so one caller cannot take every worker.",
)
@click.option(
    "--call-idle",
    type=POSITIVE_DURATION,
    default="60s",
    show_default=True,
    help="Cancel a call that waits this long on its client (a stream it stops sending or reading).",
)
@click.option(
    "--call-max",
    type=POSITIVE_DURATION,
    default="1h",
    show_default=True,
    help="Cancel any call running longer than this.",
)
@click.option("--max-multiget-keys", type=click.IntRange(1), default=100_000, show_default=True, help="Keys one MultiGet may ask for.")
@click.option(
    "--max-multiget-key-mb", type=click.IntRange(1), default=8, show_default=True, help="Key bytes one MultiGet may carry, in MiB."
)
@click.option(
    "--max-commit-mb", type=click.IntRange(1), default=1024, show_default=True, help="Delta bytes one CommitCheckpoint may carry, in MiB."
)
@click.option(
    "--request-memory-mb",
    type=click.IntRange(1),
    default=1024,
    show_default=True,
    help="Working memory of the commits and scan overlays in flight, in all, in MiB (a commit counts 4x its delta); "
    "past it they wait up to 30 s, then get RESOURCE_EXHAUSTED.",
)
@click.option(
    "--max-http-exports",
    type=click.IntRange(1),
    default=4,
    show_default=True,
    help="HTTP exports served at once; more get 503 with Retry-After.",
)
@click.option(
    "--live-timeout",
    type=click.FloatRange(min=0.1),
    default=10.0,
    show_default=True,
    help="Seconds the running subtasks of a job have to answer a live export (GET /jobs/JOB/state.arrow?live=1); "
    "past it the export is 503 naming the silent ranges.",
)
@click.option(
    "--live-ca",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="PEM roots the pool trusts for subtasks that serve their live export over https. Default: the system's.",
)
@click.option(
    "--max-concurrent-streams", type=click.IntRange(1), default=None, help="HTTP/2 streams per client connection. Default: grpc's."
)
@click.option(
    "--gc-min-age",
    type=DURATION,
    default=None,
    help="CollectGarbage and maintenance delete only unreferenced files older than this (90s, 15m, 2h), so commits in flight "
    "are safe. Default: 3600s (LifecycleConfig.gc_min_age_s).",
)
@click.option(
    "--compact-max-layers",
    type=click.IntRange(1),
    default=None,
    help="CompactCheckpoint (without force) and maintenance fold a part with more layers than this. Default: 8 "
    "(LifecycleConfig.compact_max_layers).",
)
@click.option(
    "--compact-max-delta-mb",
    type=click.IntRange(0),
    default=None,
    help="CompactCheckpoint (without force) and maintenance fold a part whose deltas hold more MiB than this. Default: 256 "
    "(LifecycleConfig.compact_max_delta_bytes).",
)
@click.option(
    "--maintenance",
    type=click.Choice(["on", "off"]),
    default="on",
    show_default=True,
    help="Compact, apply retention and collect garbage for every job by itself, every --maintenance-interval; several pools "
    "on one store elect one maintainer per job by a lease object (maintenance/leases/JOB.json).",
)
@click.option(
    "--maintenance-config",
    type=click.Path(dir_okay=False),
    default=None,
    help="TOML file holding a [maintenance] table: interval, lease_ttl, keep_last, compact_max_layers, compact_max_delta_bytes, "
    'gc_min_age, compaction, retention, gc, max_jobs_per_round, enabled (durations as 90, "30s", "5m", "1h"). Flags override '
    "its values; an unknown key or a bad value stops serve with one line naming it (exit 2).",
)
@click.option(
    "--maintenance-interval",
    type=POSITIVE_DURATION,
    default=None,
    help="How often maintenance visits every job (its lease lasts 3x this unless lease_ttl is set). Default: 60s.",
)
@click.option(
    "--keep-last",
    type=click.IntRange(1),
    default=None,
    help="Maintenance keeps the newest K complete checkpoints of a job, plus pinned ones and live writers' restore points "
    "(savepoints are never touched); a job's own policy overrides it. Default: 3.",
)
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info", show_default=True)
@click.pass_context
def serve(
    ctx: click.Context,
    listen: str,
    metrics_port: int | None,
    metrics_host: str,
    http_port: int | None,
    http_host: str,
    create_bucket: bool,
    cache_mb: int,
    max_workers: int,
    max_message_mb: int,
    max_request_mb: int,
    grace: float,
    tls_cert: str | None,
    tls_key: str | None,
    tls_client_ca: str | None,
    token_file: str | None,
    max_concurrent_rpcs: int,
    max_rpcs_per_token: int,
    call_idle: float,
    call_max: float,
    max_multiget_keys: int,
    max_multiget_key_mb: int,
    max_commit_mb: int,
    request_memory_mb: int,
    max_http_exports: int,
    live_timeout: float,
    live_ca: str | None,
    max_concurrent_streams: int | None,
    gc_min_age: float | None,
    compact_max_layers: int | None,
    compact_max_delta_mb: int | None,
    maintenance: str,
    maintenance_config: str | None,
    maintenance_interval: float | None,
    keep_last: int | None,
    log_level: str,
) -> None:
    """Serve the RemotePool until SIGTERM or SIGINT, then drain in-flight calls and exit 0.

    It binds its ports, then lists the store once: a port in use, a missing bucket or an unreadable directory
    stop it with one line and exit 69; missing or refused S3 credentials exit 6, as in every command. Once listening it prints one ready line on
    stdout naming the bound address
    (with --output json: {"event": "serving", "address": ..., "port": ..., "metrics_port": ...}).
    S3 credentials come from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY when set, otherwise from
    boto3's default chain (profile, instance role).
    Maintenance runs by itself (--maintenance off to disable): per job, while this pool holds the job's lease, it folds
    the latest checkpoint's parts over --compact-max-layers / --compact-max-delta-mb, keeps the newest --keep-last
    checkpoints (plus pinned ones and every savepoint), then deletes unreferenced files older than --gc-min-age.
    A job's own policy (`clink-pool retain`) overrides --keep-last and the thresholds for that job.
    The --gc-min-age and --compact-max-* flags also set what the CollectGarbage and CompactCheckpoint RPCs use;
    `clink-pool gc --keep-last K` runs retention and GC once on the store.
    """
    output = output_of(ctx)
    store_uri = store_uri_of(ctx, DEFAULT_STORE)
    if create_bucket and not store_uri.startswith("s3://"):
        raise click.UsageError(f"--create-bucket needs an s3:// store, not {store_uri}", ctx)
    # read before anything binds: a bad policy file is one line naming the key, exit 2
    maintenance_settings = maintenance_config_of_flags(
        maintenance, maintenance_config, maintenance_interval, keep_last, gc_min_age, compact_max_layers, compact_max_delta_mb
    )
    setup_logging(log_level, output.format)
    # imported here so `clink-pool --help` stays fast and works without the server's dependencies loaded
    from pool.domain import LiveExportConfig, PoolConfig
    from pool.server import PoolServer, PoolServerConfig, port_clashes, stop_on_signals

    config = PoolServerConfig(
        store_uri=store_uri,
        listen=listen,
        metrics_port=metrics_port,
        metrics_host=metrics_host,
        http_port=http_port,
        http_host=http_host,
        create_bucket=create_bucket,
        max_workers=max_workers,
        max_message_bytes=max_message_mb << 20,
        max_request_bytes=max_request_mb << 20,
        grace_seconds=grace,
        store=store_config(shared_value(ctx, "s3_endpoint_url"), shared_value(ctx, "s3_region")),
        pool=PoolConfig(
            cache_bytes=cache_mb << 20,
            max_multiget_keys=max_multiget_keys,
            max_multiget_key_bytes=max_multiget_key_mb << 20,
            max_commit_bytes=max_commit_mb << 20,
            request_memory_bytes=request_memory_mb << 20,
            live=LiveExportConfig(fetch_timeout_s=live_timeout, ca_pem=Path(live_ca).read_bytes() if live_ca else None),
        ),
        max_http_exports=max_http_exports,
    )
    from dataclasses import replace

    from pool.admission import AdmissionConfig
    from pool.auth import TlsConfig, TokenTable

    if bool(tls_cert) != bool(tls_key):
        raise InvalidArgumentError("--tls-cert and --tls-key go together")
    if tls_client_ca and not tls_cert:
        raise InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key")
    config = replace(
        config,
        tls=TlsConfig.from_files(tls_cert, tls_key, tls_client_ca) if tls_cert and tls_key else None,
        tokens=TokenTable.from_file(token_file) if token_file else None,
        admission=AdmissionConfig(
            max_calls=max_concurrent_rpcs, max_calls_per_token=max_rpcs_per_token or None, idle_s=call_idle, max_call_s=call_max
        ),
        max_concurrent_streams=max_concurrent_streams,
        lifecycle=lifecycle_config(gc_min_age, compact_max_layers, compact_max_delta_mb),
        maintenance=maintenance_settings,
    )
    if config.maintenance is not None:  # before anything binds, naming the flags that fix it
        try:
            config.maintenance.check_writes(config.lifecycle.max_write_s, config.pool.max_commit_s)
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(
                f"{exc}: raise --gc-min-age (or gc_min_age in --maintenance-config), or pass --maintenance off"
            ) from None
    for a, b, port in port_clashes(config):  # before anything binds: the second bind would blame "another process"
        raise click.UsageError(
            f"{_PORT_FLAGS[b]} {port} is the port {_PORT_FLAGS[a]} names: give each its own port (0 picks a free one)", ctx
        )
    server = PoolServer(config)
    server.start()
    stop_on_signals(server, grace)
    scheme = "https" if config.tls else "http"  # TLS covers the metrics and export ports too
    metrics = f", metrics {scheme}://{url_host(metrics_host)}:{server.metrics_port}/metrics" if server.metrics_port else ""
    metrics += f", state export {scheme}://{url_host(http_host)}:{server.http_port}/jobs/JOB/state.arrow" if server.http_port else ""
    ready = {
        "event": "serving",
        "address": server.address,
        "port": server.port,
        "metrics_port": server.metrics_port,
        "http_port": server.http_port,
        "store": server.store.uri,
    }
    output.event(ready, f"clink-pool: serving on {server.address} (store {server.store.uri}{metrics})")
    sys.stdout.flush()
    started = time.monotonic()
    while not server.wait(timeout=1.0):
        pass
    logging.getLogger("clink.pool").info("exiting after %.0fs", time.monotonic() - started)


# the serve flag of each port of PoolServerConfig
_PORT_FLAGS = {"listen": "--listen", "metrics_port": "--metrics-port", "http_port": "--http-port"}


def url_host(host: str) -> str:
    """``host`` as a URL writes it: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def lifecycle_config(
    gc_min_age_s: float | None = None, compact_max_layers: int | None = None, compact_max_delta_mb: int | None = None
) -> LifecycleConfig:
    """The server's LifecycleConfig from the serve flags; a flag left out keeps the dataclass default."""
    from pool.lifecycle import LifecycleConfig

    return LifecycleConfig(
        gc_min_age_s=LifecycleConfig.gc_min_age_s if gc_min_age_s is None else gc_min_age_s,
        compact_max_layers=LifecycleConfig.compact_max_layers if compact_max_layers is None else compact_max_layers,
        compact_max_delta_bytes=LifecycleConfig.compact_max_delta_bytes if compact_max_delta_mb is None else compact_max_delta_mb << 20,
    )


def maintenance_config_of_flags(
    mode: str,
    path: str | None = None,
    interval_s: float | None = None,
    keep_last: int | None = None,
    gc_min_age_s: float | None = None,
    compact_max_layers: int | None = None,
    compact_max_delta_mb: int | None = None,
) -> MaintenanceConfig | None:
    """The server's MaintenanceConfig: the policy file (if any) over the defaults, the flags given over both; None when off.

    A file is read (and refused when bad) even with --maintenance off, so a typo is found before it is switched on.
    """
    from dataclasses import replace

    from pool.maintenance import MaintenanceConfig, load_maintenance_policy

    config = load_maintenance_policy(path) if path else MaintenanceConfig()
    flags: dict[str, Any] = {
        "interval_s": interval_s,
        "keep_last": keep_last,
        "gc_min_age_s": gc_min_age_s,
        "compact_max_layers": compact_max_layers,
        "compact_max_delta_bytes": None if compact_max_delta_mb is None else compact_max_delta_mb << 20,
    }
    config = replace(config, **{k: v for k, v in flags.items() if v is not None})
    return config if mode == "on" and config.enabled else None


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    cli.main(args=argv, prog_name="clink-pool")


if __name__ == "__main__":
    main()
