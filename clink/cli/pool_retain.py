"""clink-pool retain: set, show or clear a job's own maintenance policy, or run retention on it now (through a pool or on the store)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from clink.cli.common import apply, output_of
from clink.cli.pool import open_store_of
from clink.cli.state import POOL_OPTIONS, source_config

if TYPE_CHECKING:
    from client.pool_client import JobPolicyInfo

POOL_SETTING = "pool"  # a setting given as `pool`: unset it, so the pool's applies
_SETTINGS = ("keep_last", "compact_max_layers", "compact_max_delta_bytes")
MAX_SETTING = (1 << 63) - 1  # pool.job_policy.MAX_SETTING (the protocol's int64), not imported: --help stays light


class _Unset:
    """A policy setting given as `pool` on the command line (dropped from the job's policy)."""

    def __repr__(self) -> str:
        return POOL_SETTING


UNSET = _Unset()


class PolicySetting(click.ParamType):
    """A positive integer, or `pool` to unset the setting so the pool's applies."""

    name = "N|pool"

    def __init__(self, most: int = MAX_SETTING) -> None:
        self.most = most

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int | _Unset:  # noqa: D102
        if isinstance(value, int | _Unset) and not isinstance(value, bool):
            return value
        text = str(value).strip()
        if text.lower() == POOL_SETTING:
            return UNSET
        if not text.isascii() or not text.isdigit() or len(text) > 19 or not 1 <= int(text) <= self.most:
            self.fail(f"{value!r} is not a positive integer up to {self.most} (or `pool` for the pool's setting)", param, ctx)
        return int(text)


SETTING = PolicySetting()
MEBIBYTES_SETTING = PolicySetting(MAX_SETTING >> 20)  # N MiB, stored as N << 20 bytes in an int64


@dataclass(frozen=True)
class PolicyView:
    """A job's policy as this command shows it: its own settings (None: unset) and, where known, what applies."""

    job: str
    stored: bool
    keep_last: int | None
    compact_max_layers: int | None
    compact_max_delta_bytes: int | None
    maintenance: bool
    updated_ms: int
    effective: dict[str, int] | None  # None: unknown here (the store alone does not say how a pool was started)

    def doc(self, via: str) -> dict[str, Any]:
        own = {name: getattr(self, name) for name in _SETTINGS} | {"maintenance": self.maintenance, "updated_ms": self.updated_ms}
        return {"job": self.job, "via": via, "policy": own if self.stored else None, "effective": self.effective}

    def text(self) -> str:
        if not self.stored:
            head = f"job {self.job} has no policy of its own"
            if self.effective is None:
                return f"{head}: the serving pool's maintenance settings apply"
            return f"{head}; the pool's settings apply: " + ", ".join(_setting_text(n, self.effective[n]) for n in _SETTINGS)
        parts = []
        for name in _SETTINGS:
            value = getattr(self, name)
            if value is not None:
                parts.append(_setting_text(name, value))
            elif self.effective is not None:
                parts.append(f"{_setting_text(name, self.effective[name])} (the pool's)")
            else:
                parts.append(f"{name} (the pool's)")
        parts.append(f"maintenance {'on' if self.maintenance else 'off'}")
        return f"job {self.job}: " + ", ".join(parts)


def _setting_text(name: str, value: int) -> str:
    return f"{name} {value / (1 << 20):g} MiB" if name == "compact_max_delta_bytes" else f"{name} {value}"


class _Policies:
    """The four operations, either through a pool's RPCs or straight on the store (the same domain code the pool runs)."""

    def __init__(self, ctx: click.Context, pool: str | None) -> None:
        self.via = "pool" if pool else "store"
        self.client = None
        self.local = None
        if pool:
            from client.pool_client import PoolClient
            from clink.tools.sources import check_token_transport, pool_client_config

            config = source_config(ctx)
            for host in _pool_hosts(pool):
                check_token_transport(config, config.pool_tls_root_certificates is not None, host, f"pool {pool}")
            self.client = PoolClient(pool, pool_client_config(config))
        else:
            from pool.job_policy import JobPolicies
            from pool.lifecycle import Lifecycle

            self.local = JobPolicies(Lifecycle(open_store_of(ctx)))

    def close(self) -> None:
        if self.client is not None:
            self.client.close()

    def show(self, job: str) -> PolicyView:
        if self.client is not None:
            return _view_of(self.client.job_policy_in_force(job))
        assert self.local is not None
        # no effective settings here: a pool may run with other maintenance settings than this command's defaults
        policy = self.local.get(job)
        if policy is None:
            return PolicyView(job, False, None, None, None, True, 0, None)
        return PolicyView(
            job,
            True,
            policy.keep_last,
            policy.compact_max_layers,
            policy.compact_max_delta_bytes,
            policy.maintenance,
            policy.updated_ms,
            None,
        )

    def update(self, job: str, changes: dict[str, Any]) -> PolicyView:
        """Change only the settings given (the others stay, even ones another client sets meanwhile)."""
        if self.client is not None:
            values = {name: changes.get(name) for name in _SETTINGS}
            on = changes.get("maintenance", True)
            return _view_of(self.client.set_job_policy(job, maintenance=on, only=tuple(changes), **values))
        assert self.local is not None
        self.local.update(job, changes)
        return self.show(job)

    def clear(self, job: str) -> bool:
        if self.client is not None:
            return self.client.clear_job_policy(job)
        assert self.local is not None
        return self.local.clear(job)

    def retain(self, job: str, keep_last: int, dry_run: bool) -> dict[str, Any]:
        if self.client is not None:
            info = self.client.retain_checkpoints(job, keep_last, dry_run)
            return {
                "job": info.job,
                "deleted": list(info.deleted),
                "kept": list(info.kept),
                "pinned": list(info.pinned),
                "keep_last": info.keep_last,
                "keep_last_from": info.keep_last_from,
                "dry_run": info.dry_run,
            }
        assert self.local is not None
        run = self.local.retain(job, keep_last, dry_run)
        r = run.result
        return {
            "job": r.job,
            "deleted": list(r.deleted),
            "kept": list(r.kept),
            "pinned": list(r.pinned),
            "keep_last": run.keep_last,
            "keep_last_from": run.keep_last_from,
            "dry_run": r.dry_run,
        }


def _view_of(info: JobPolicyInfo) -> PolicyView:
    """The view of what a pool answered (it says what applies, too)."""
    return PolicyView(
        info.job,
        info.stored,
        info.keep_last,
        info.compact_max_layers,
        info.compact_max_delta_bytes,
        info.maintenance,
        info.updated_ms,
        {n: getattr(info, f"effective_{n}") for n in _SETTINGS},
    )


def _pool_hosts(pool: str) -> tuple[str, ...]:
    """The hosts a --pool value names (InvalidArgumentError naming a bad one), to decide whether a token may go in plaintext."""
    from client.pool_addresses import parse_pool_addresses

    return parse_pool_addresses(pool).host_names()


# where a depth the job's policy does not set comes from: the serving pool's settings, or the store commands' default
_POOL_DEPTH = {"pool": "the pool's setting", "store": "the default, as `clink-pool serve` without maintenance flags"}


def _ids(ids: list[int]) -> str:
    return ", ".join(map(str, ids)) if ids else "none"


@click.command("retain")
@click.argument("job")
@click.option(
    "--keep-last",
    type=SETTING,
    default=None,
    help="Keep the newest N complete checkpoints (pinned ones, writers' restore points and savepoints always stay). "
    "Stored in the job's policy; with --now, the depth of that run only. `pool`: drop it from the policy.",
)
@click.option("--compact-max-layers", type=SETTING, default=None, help="Compact a part with more layers than N. `pool`: the pool's.")
@click.option(
    "--compact-max-delta-mb",
    type=MEBIBYTES_SETTING,
    default=None,
    help="Compact a part whose deltas hold more than N MiB. `pool`: the pool's.",
)
@click.option(
    "--maintenance",
    type=click.Choice(["on", "off"]),
    default=None,
    help="off: the pool's maintainer leaves this job alone (the commands and RPCs still run when asked).",
)
@click.option("--show", is_flag=True, help="Print the job's policy (and, through --pool, what applies to it).")
@click.option("--clear", is_flag=True, help="Remove the job's policy: the pool's settings apply again.")
@click.option(
    "--now", is_flag=True, help="Run retention on the job now (with --keep-last N: N deep; else the job's policy, else the pool's)."
)
@click.option("--dry-run", is_flag=True, help="With --now: say which checkpoints would go; delete nothing.")
@click.option(
    "--pool",
    metavar="ADDR",
    default=None,
    help="Go through this serving pool's RPCs (HOST:PORT, a comma list HOST1:PORT1,HOST2:PORT2, or dns:///NAME:PORT; with the --pool-token and TLS options) instead of --store.",
)
@apply(POOL_OPTIONS)
@click.pass_context
def retain_cmd(
    ctx: click.Context,
    job: str,
    keep_last: int | _Unset | None,
    compact_max_layers: int | _Unset | None,
    compact_max_delta_mb: int | _Unset | None,
    maintenance: str | None,
    show: bool,
    clear: bool,
    now: bool,
    dry_run: bool,
    pool: str | None,
) -> None:
    """Set, show or clear JOB's own maintenance policy, or run retention on JOB now.

    \b
    A job's policy (maintenance/policies/JOB.json in the store) overrides the pool's maintenance
    settings for that job; a setting it leaves out is the pool's. Setting keeps the settings not
    given (give one as `pool` to drop it, or --clear to start over). Retention keeps the newest
    keep-last complete checkpoints, every pinned one and every one a running writer restored from;
    savepoints are never touched. Data files go later, by GC.
      clink-pool retain orders --keep-last 5 --store s3://bkt/pool
      clink-pool retain orders --maintenance off --pool pool:7420 --pool-token "$TOKEN"
      clink-pool retain orders --show --pool pool:7420 -o json
      clink-pool retain orders --keep-last pool --store s3://bkt/pool      (the pool's depth again)
      clink-pool retain orders --clear --store s3://bkt/pool
      clink-pool retain orders --now --dry-run --store s3://bkt/pool      (what would go)
      clink-pool retain orders --now --keep-last 2 --pool pool:7420
    Without --pool, the command works on --store directly, as a pool would.
    """
    given = {"keep_last": keep_last, "compact_max_layers": compact_max_layers, "compact_max_delta_bytes": compact_max_delta_mb}
    setting = any(v is not None for v in given.values()) or maintenance is not None
    modes = [name for name, on in (("--show", show), ("--clear", clear), ("--now", now)) if on]
    if len(modes) > 1:
        raise click.UsageError(f"{' and '.join(modes)} do not go together: give one of --show, --clear, --now, or settings", ctx)
    if dry_run and not now:
        raise click.UsageError("--dry-run goes with --now (setting a policy deletes nothing)", ctx)
    if now and (compact_max_layers is not None or compact_max_delta_mb is not None or maintenance is not None):
        raise click.UsageError("--now runs retention only: set --compact-max-*/--maintenance without --now", ctx)
    if now and keep_last is UNSET:
        raise click.UsageError("--now --keep-last takes a number (leave it out for the job's policy, else the pool's)", ctx)
    if modes and not now and setting:
        raise click.UsageError(f"{modes[0]} takes no settings: give the settings alone to set them", ctx)
    if not modes and not setting:
        raise click.UsageError("nothing to do: give settings (--keep-last N ...), --show, --clear or --now", ctx)
    from snapshot.names import validate_job

    job = validate_job(job)
    out = output_of(ctx)
    policies = _Policies(ctx, pool)
    try:
        if show:
            view = policies.show(job)
            out.result(view.doc(policies.via), view.text())
        elif clear:
            cleared = policies.clear(job)
            out.result(
                {"job": job, "via": policies.via, "cleared": cleared},
                f"removed the policy of job {job}: the pool's settings apply" if cleared else f"job {job} had no policy of its own",
            )
        elif now:
            doc = policies.retain(job, keep_last if isinstance(keep_last, int) else 0, dry_run)
            verb = "would remove" if dry_run else "removed"
            pinned = f"; kept by pins: {_ids(doc['pinned'])}" if doc["pinned"] else ""
            source = {"request": "--keep-last", "job policy": "the job's policy"}.get(doc["keep_last_from"], _POOL_DEPTH[policies.via])
            out.result(
                {**doc, "via": policies.via},
                f"{job}: {verb} checkpoints {_ids(doc['deleted'])}; kept {_ids(doc['kept'])}{pinned} "
                f"(keep_last {doc['keep_last']}, from {source})",
            )
        else:
            changes: dict[str, Any] = {}
            for name, value in given.items():
                if value is UNSET:
                    changes[name] = None
                elif isinstance(value, int):
                    changes[name] = value << 20 if name == "compact_max_delta_bytes" else value
            if maintenance is not None:
                changes["maintenance"] = maintenance == "on"
            view = policies.update(job, changes)
            out.result(view.doc(policies.via), view.text())
    finally:
        policies.close()


COMMANDS = (retain_cmd,)
