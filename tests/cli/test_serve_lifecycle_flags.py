"""`clink-pool serve --gc-min-age/--compact-max-*`: the flags build the server's LifecycleConfig and its RPCs obey them."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
from click.testing import CliRunner

import clink.cli.pool
import pool.server
from client.pool_client import PoolClient, PoolClientConfig
from clink.cli.common import EXIT_UNAVAILABLE
from clink.cli.pool import cli, lifecycle_config
from pool.core import PoolCore
from pool.lifecycle import LifecycleConfig
from snapshot.errors import UnavailableError
from store.local import FileStore
from store.manifest import job_prefix
from tests.crash_fixtures import REPO, PoolProcess
from tests.lifecycle_helpers import build_job


def _serve_config(monkeypatch, *flags: str):
    """The PoolServerConfig `clink-pool serve FLAGS` builds, captured by a PoolServer that refuses to start."""
    seen = []

    class CapturingServer:
        def __init__(self, config):
            seen.append(config)
            raise UnavailableError("captured the config; not serving")

    monkeypatch.setattr(pool.server, "PoolServer", CapturingServer)
    monkeypatch.setattr(clink.cli.pool, "setup_logging", lambda level, output: None)  # keep pytest's log handlers
    result = CliRunner().invoke(cli, ["serve", "--store", "file://unused", *flags])
    assert result.exit_code == EXIT_UNAVAILABLE, result.output
    assert len(seen) == 1
    return seen[0]


def test_serve_flags_reach_the_lifecycle_config_and_omitted_ones_keep_its_defaults(monkeypatch):
    assert _serve_config(monkeypatch).lifecycle == LifecycleConfig()
    config = _serve_config(
        monkeypatch, "--maintenance", "off", "--gc-min-age", "0", "--compact-max-layers", "2", "--compact-max-delta-mb", "5"
    )
    assert config.lifecycle == LifecycleConfig(gc_min_age_s=0.0, compact_max_layers=2, compact_max_delta_bytes=5 << 20)
    assert _serve_config(monkeypatch, "--maintenance", "off", "--gc-min-age", "90.5").lifecycle == LifecycleConfig(gc_min_age_s=90.5)
    assert lifecycle_config() == LifecycleConfig()


def test_serve_refuses_out_of_range_lifecycle_flags_as_usage_errors():
    for flags in (["--gc-min-age", "-1"], ["--compact-max-layers", "0"], ["--gc-min-age", "soon"]):
        result = CliRunner().invoke(cli, ["serve", *flags])
        assert result.exit_code == 2, (flags, result.output)
        assert flags[0] in result.output


def test_serve_help_names_the_lifecycle_defaults_it_really_uses():
    done = subprocess.run(
        [sys.executable, "-m", "clink.cli.pool", "serve", "--help"], cwd=REPO, capture_output=True, text=True, timeout=60, check=True
    )
    text = " ".join(done.stdout.split())
    defaults = LifecycleConfig()
    assert "--gc-min-age DURATION CollectGarbage" in text
    assert f"Default: {defaults.gc_min_age_s:g}s (LifecycleConfig.gc_min_age_s)" in text
    assert f"Default: {defaults.compact_max_layers} (LifecycleConfig.compact_max_layers)" in text
    assert f"Default: {defaults.compact_max_delta_bytes >> 20} (LifecycleConfig.compact_max_delta_bytes)" in text


@pytest.mark.parametrize(("flags", "collected"), [((), False), (("--maintenance", "off", "--gc-min-age", "0"), True)])
def test_a_served_pool_collects_a_fresh_orphan_only_with_gc_min_age_zero(tmp_path, flags, collected):
    store = FileStore(tmp_path / "pool")
    build_job(PoolCore(store), "orders", 3, random.Random(5))
    orphan = job_prefix("orders") + "data/orphan-from-a-crashed-commit.arrow"
    store.put(orphan, b"no manifest names me")
    served = PoolProcess(f"file://{tmp_path / 'pool'}", extra=flags)
    try:
        with PoolClient(served.address, PoolClientConfig(call_deadline_s=30)) as client:
            gc = client.collect_garbage("orders")
    finally:
        served.kill9()
    assert (orphan in gc.deleted) is collected
    assert gc.too_young >= (0 if collected else 1)
    assert any(o.key == orphan for o in store.list(job_prefix("orders") + "data/")) is not collected
    assert gc.referenced > 0  # the job's live files are referenced and never deleted
