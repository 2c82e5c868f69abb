"""`clink demo --workdir DIR`: one folder resolved once, a new job per run, and a folder in use said so with nothing written."""

from __future__ import annotations

import fcntl
from pathlib import Path

import clink.cli.demo as demo
from clink.cli.common import EXIT_UNAVAILABLE
from tests.cli_fixtures import one_line_error, run


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def test_a_relative_workdir_keeps_store_and_log_together_and_a_rerun_is_a_new_job(tmp_path, monkeypatch) -> None:
    name = f"demo-{tmp_path.name}"  # unique: a store landing beside the package would be found by this name
    monkeypatch.chdir(tmp_path)
    first = run(["demo", "--workdir", name])
    assert first.exit_code == 0, first.output
    root = tmp_path / name
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]
    assert {"pool.log", "pool-data"} <= {p.name for p in root.iterdir()}
    assert (root / "pool-data" / "jobs" / "word-count-demo" / "chk-4" / "_metadata").is_file()
    assert f"kept in {root}: clink-pool ls --store file://{root}/pool-data" in first.stdout
    assert not (Path(demo.__file__).resolve().parents[1] / name).exists()  # the old bug: the store under the package's folder

    second = run(["demo", "--workdir", name])  # the same folder again: a fresh job beside the first, not "already complete"
    assert second.exit_code == 0, second.output
    assert "1. job word-count-demo-2:" in second.stdout and "exactly-once" in second.stdout
    jobs = sorted(p.name for p in (root / "pool-data" / "jobs").iterdir())
    assert jobs == ["word-count-demo", "word-count-demo-2"]
    assert demo.job_name_for(root) == "word-count-demo-3"


def test_a_folder_another_demo_is_using_is_refused_and_left_alone(tmp_path) -> None:
    root = tmp_path / "busy"
    root.mkdir()
    (root / "pool.log").write_text("the other run's log\n")
    with open(root / demo.LOCK_NAME, "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another demo's run
        held.write("4242")
        held.flush()
        before = _tree(root)
        result = run(["demo", "--workdir", str(root)])
        after = _tree(root)
    assert result.exit_code == EXIT_UNAVAILABLE
    line = one_line_error(result)
    assert f"{root} is in use by another clink demo (pid 4242)" in line and "--workdir" in line
    assert result.stdout == ""
    assert after == before and (root / "pool.log").read_text() == "the other run's log\n"


def test_the_workdir_is_resolved_once_to_an_absolute_path(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert demo.resolve_workdir("a/../b") == tmp_path.resolve() / "b"
    assert demo.resolve_workdir("~").is_absolute()
