"""Random job histories through a real `clink-pool serve` and RemoteReadBackend agree with a model on every seed."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.protocol.histories import History, ServePool

# CI runs these seeds; CLINK_HISTORY_SEEDS=100-199 (or bench/histories.py) runs others
SEEDS = os.environ.get("CLINK_HISTORY_SEEDS", "0-5")


pytestmark = pytest.mark.slow  # a real clink-pool process per history


def _seeds(spec: str) -> list[int]:
    lo, _, hi = spec.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    root = tmp_path_factory.mktemp("histories")
    pool = ServePool(root / "store", root / "serve.log")
    try:
        yield pool.address, root / "store"
    finally:
        pool.stop()


@pytest.mark.parametrize("seed", _seeds(SEEDS))
def test_a_random_history_agrees_with_the_model(served: tuple[str, Path], seed: int) -> None:
    address, store_dir = served
    stats = History(address, store_dir, seed).run(steps=45)
    assert stats["checkpoints"] > 0
