"""The simulation kills each mutant it is meant to find (tests/sim/mutants.py) within a few seeds.

The regression tests and the property examples check their own mutants where they are defined:
`test_a_regression_test_fails_with_its_defect_put_back` in test_protocol_defects.py and
`test_the_property_examples_fail_with_their_defect_put_back` in test_protocol_properties.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sim.mutants import MUTANTS

# (first seed, seeds) windows holding seeds that kill each mutant today (bench/simulate.py --mutants --seeds 500 finds more)
SIM_KILLS = {
    "restore_keeps_its_epoch": (7, 2),
    "no_restore_records": (8, 1),
    "operator_writes_folded_into_cache": (15, 2),
    "retention_forgets_restore_points": (5, 2),
    "warm_table_keeps_changed_keys": (71, 2),
    "warm_operator_state_after_moving_on": (1191, 2),
    # the commit's caches (issue 14): each trusted without its check, a stale view in one of the pools completes wrongly
    "writers_table_trusted_after_the_part": (19, 2),
    "known_parts_not_confirmed": (487, 2),
    "parent_reused_without_its_table": (176, 2),
    # a reader's read checkpoint replaced by a rewound attempt: a stale cached manifest makes a live subtask's read fail
    "manifests_cached_by_id": (4, 2),
    # maintenance (issue 18): a maintainer that takes an unexpired lease, a GC that trusts files of any age
    "maintenance_lease_ignores_expiry": (2, 1),
    "maintenance_gc_without_min_age": (27, 1),
}


@pytest.mark.slow
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
