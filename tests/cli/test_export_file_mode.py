"""`clink state-export --out` writes files with the user's umask (not mkstemp's 0600); a replaced file keeps its mode; a failure leaves nothing."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import clink.cli.state
import snapshot as s
from clink.cli.common import EXIT_IO, EXIT_NOT_FOUND, EXIT_USAGE
from tests.cli_fixtures import generated_table, one_line_error, run

REPO = Path(__file__).resolve().parents[2]


def export(tmp_path: Path, umask: int, *args: str) -> subprocess.CompletedProcess[str]:
    """`clink state-export ARGS` in a process of its own, under ``umask`` (a umask is per process: the tests' own is left alone)."""
    return subprocess.run(
        [sys.executable, "-m", "clink.cli.state", "state-export", *args],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        umask=umask,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "in.arrow"
    path.write_bytes(s.write_snapshot(generated_table(91, keyed_rows=50)))
    return path


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
@pytest.mark.parametrize("suffix", [".arrow", ".parquet"])
def test_a_new_export_gets_the_mode_the_umask_gives(tmp_path: Path, source: Path, umask: int, mode: int, suffix: str):
    out = tmp_path / f"state{suffix}"
    done = export(tmp_path, umask, "--from", str(source), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert mode_of(out) == mode


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_a_file_replaced_with_force_keeps_its_mode_under_any_umask(tmp_path: Path, source: Path, umask: int):
    out = tmp_path / "state.arrow"
    out.write_bytes(b"old")
    out.chmod(0o640)
    done = export(tmp_path, umask, "--from", str(source), "--out", str(out), "--force")
    assert done.returncode == 0, done.stderr
    assert mode_of(out) == 0o640 and out.read_bytes() != b"old"


def test_a_failed_export_leaves_no_file_and_no_temporary(tmp_path: Path, source: Path):
    out = tmp_path / "state.arrow"
    missing = export(tmp_path, 0o022, "--from", str(tmp_path / "nope.arrow"), "--out", str(out))
    assert missing.returncode == EXIT_NOT_FOUND and missing.stderr.count("\n") == 1 and "nope.arrow" in missing.stderr
    refused = export(tmp_path, 0o022, "--from", str(source), "--out", str(out), "--key-groups", "9-3")
    assert refused.returncode == EXIT_USAGE and refused.stderr.count("\n") == 1 and "9-3" in refused.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.arrow"]  # no export, no .state.arrow.*.tmp


def test_an_export_failing_half_way_leaves_no_temporary_beside_the_target(tmp_path: Path, source: Path, monkeypatch):
    def disk_full(self, sink, table):
        sink.write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(clink.cli.state.SnapshotArrowWriter, "write_to", disk_full)
    out = tmp_path / "state.arrow"
    result = run(["state-export", "--from", str(source), "--out", str(out)])
    assert result.exit_code == EXIT_IO and "No space left on device" in one_line_error(result)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.arrow"]
