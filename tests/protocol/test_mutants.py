"""Each reviewed defect, put back as a mutant, is caught: by its regression test, the property examples and the simulation."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import tests.test_protocol_defects as defects
import tests.test_protocol_properties as properties
from tests.sim.mutants import MUTANTS, mutant


def _fails(check) -> bool:
    try:
        check()
    except (AssertionError, Exception, pytest.fail.Exception):  # noqa: B014 - a wrong answer, an error, or a pytest.raises that saw none
        return True
    return False


@pytest.mark.parametrize(
    ("name", "test"),
    [
        ("layers_in_listed_order", defects.test_defect_01_rescale_4_2_4_2_never_brings_an_overwritten_value_back),
        ("empty_fold_writes_no_base", defects.test_defect_02_compacting_a_part_whose_fold_is_empty_keeps_an_erase),
        ("gc_skips_vanished_manifests", defects.test_defect_03_gc_never_deletes_a_file_a_checkpoint_committed_during_the_run_references),
        ("no_parent_check_after_commit", defects.test_safeguard_a_commit_whose_parent_vanished_after_gc_listed_never_completes),
        ("restore_from_vanished_checkpoint", defects.test_safeguard_a_restore_from_a_checkpoint_deleted_meanwhile_is_refused),
        (
            "compaction_forgets_retired_files",
            defects.test_safeguard_a_commit_racing_a_compaction_of_its_parent_completes_and_keeps_its_files,
        ),
    ],
)
def test_a_regression_test_fails_with_its_defect_put_back(tmp_path: Path, name: str, test) -> None:
    test(tmp_path / "ok")  # passes on the code as it is
    with mutant(name):
        assert _fails(lambda: test(tmp_path / "mutant")), f"{test.__name__} does not see mutant {name}"


@pytest.mark.parametrize(
    ("name", "eras", "start"), [("layers_in_listed_order", properties.DEFECT_1, 4), ("empty_fold_writes_no_base", properties.DEFECT_2, 1)]
)
def test_the_property_examples_fail_with_their_defect_put_back(name: str, eras, start: int) -> None:
    inner = properties.test_every_history_reads_as_the_model_says.hypothesis.inner_test
    inner(eras=eras, start=start)
    with mutant(name):
        assert _fails(lambda: inner(eras=eras, start=start))


# (first seed, seeds) windows holding seeds that kill each mutant today (bench/simulate.py --mutants --seeds 500 finds more)
SIM_KILLS = {
    "restore_keeps_its_epoch": (0, 6),
    "no_restore_records": (0, 12),
    "operator_writes_folded_into_cache": (60, 6),
    "retention_forgets_restore_points": (0, 6),
}


@pytest.mark.parametrize("name", sorted(SIM_KILLS))
def test_the_simulation_kills_the_mutant(name: str) -> None:
    env = dict(os.environ, PYTHONHASHSEED="0")
    start, seeds = SIM_KILLS[name]
    run = subprocess.run(
        [sys.executable, "bench/simulate.py", "--start", str(start), "--seeds", str(seeds), "--jobs", "2", "--mutant", name],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 1 and "FAILED seed" in run.stderr, f"no seed of {start}..{start + seeds - 1} caught {name}"


def test_every_mutant_is_known() -> None:
    assert set(SIM_KILLS) <= set(MUTANTS)
