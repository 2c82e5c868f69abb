"""The README demo runs end to end: a real pool subprocess, failure, rescale, export, DuckDB, exact counts."""

from __future__ import annotations

import time

from clink.cli.demo import run_demo


def test_demo_runs_end_to_end_against_a_pool_subprocess(tmp_path) -> None:
    lines: list[str] = []
    started = time.monotonic()
    rc = run_demo(str(tmp_path / "demo"), echo=lines.append)
    text = "\n".join(lines)
    assert rc == 0, text
    assert time.monotonic() - started < 120  # a hang guard with room for a loaded 2-core CI box, not a benchmark
    assert "checkpoint 2 complete=True, parent 1" in text
    assert "a new subtask 2 restores checkpoint 2" in text
    assert "fenced" in text and "exactly-once" in text
    assert "DuckDB>" in text and "pool stopped" in text
    assert (tmp_path / "demo" / "pool-data" / "jobs" / "word-count-demo").is_dir()  # the embedded store really was used
