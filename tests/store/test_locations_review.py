"""Review fixes of store/locations.py and its users: what a location is depends on its _metadata, however it is spelled."""

from __future__ import annotations

import json
import random

import pytest

from pool.core import PoolCore
from store.checkpoint import CheckpointReader
from store.local import FileStore
from store.locations import open_location
from store.segment_cache import SegmentCache
from tests.lifecycle_helpers import build_job, fresh, scan_checkpoint, table_dict


def _orders(store):
    """Job ``orders`` with three checkpoints; its models by checkpoint id."""
    return build_job(PoolCore(store), "orders", 3, random.Random(16))


def _read(loc):
    """The rows a location holds, read as the lifecycle reads a checkpoint or savepoint."""
    reader = CheckpointReader(loc.store, loc.job, SegmentCache(1 << 20))
    return table_dict(fresh(loc.directory).read_table(reader, loc.manifest))


@pytest.fixture
def chk_named_savepoint(file_store, tmp_path):
    """A savepoint of orders' checkpoint 3 written to archive/jobs/orders/chk-3: (its directory, the model)."""
    models = _orders(file_store)
    target = tmp_path / "archive" / "jobs" / "orders" / "chk-3"
    target.mkdir(parents=True)
    fresh(file_store).savepoint("orders", to=FileStore(target))
    return target, models[3]


def test_a_real_checkpoint_folder_still_opens_as_a_checkpoint_of_its_store(store, s3_config):
    models = _orders(store)
    loc = open_location(f"{store.uri}/jobs/orders/chk-2/_metadata", s3_config)
    assert (loc.kind, loc.job, loc.checkpoint_id, loc.uri) == ("checkpoint", "orders", 2, f"{store.uri.rstrip('/')}/jobs/orders/chk-2")
    assert _read(loc) == models[2]


@pytest.mark.parametrize("spelled", ["{d}", "{d}/", "{d}/_metadata", "{d}//_metadata/", "{u}", "{u}/_metadata"])
def test_a_savepoint_in_a_checkpoint_named_directory_opens_as_that_savepoint_however_spelled(chk_named_savepoint, spelled):
    target, model = chk_named_savepoint
    loc = open_location(spelled.format(d=target, u=target.as_uri()))
    assert (loc.kind, loc.uri) == ("savepoint", FileStore(target).uri)
    assert _read(loc) == model


def test_verify_and_import_read_a_savepoint_in_a_checkpoint_named_directory_as_inspect_does(
    chk_named_savepoint, tmp_path, clink_run, clink_pool_run
):
    target, model = chk_named_savepoint
    verified = clink_run("savepoint", "verify", str(target), "-o", "json")
    assert verified.exit_code == 0 and json.loads(verified.stdout)["passed"], verified.output
    new = FileStore(tmp_path / "new")
    assert clink_pool_run("import", "--store", new.uri, "imp", "--from", str(target)).exit_code == 0
    assert scan_checkpoint(new, "imp", 1) == model


@pytest.mark.parametrize("spelled", ["jobs//orders/chk-3", "jobs/orders//chk-3//", "jobs/orders/chk-3//_metadata"])
def test_a_checkpoint_folder_with_doubled_slashes_opens_in_its_own_store(store, s3_config, spelled):
    models = _orders(store)
    loc = open_location(f"{store.uri.rstrip('/')}/{spelled}", s3_config)
    assert (loc.kind, loc.uri) == ("checkpoint", f"{store.uri.rstrip('/')}/jobs/orders/chk-3")
    assert _read(loc) == models[3]


@pytest.mark.parametrize("spelled", ["chk-3", "chk-3/", "chk-3/_metadata", "chk-3/_metadata/", "/chk-3"])
def test_verify_accepts_each_spelling_of_a_checkpoint_that_inspect_accepts(file_store, clink_run, spelled):
    _orders(file_store)
    location = f"{file_store.uri}/jobs/orders/{spelled}"
    assert clink_run("savepoint", "inspect", location).exit_code == 0
    verified = clink_run("savepoint", "verify", location, "-o", "json")
    assert verified.exit_code == 0 and json.loads(verified.stdout)["location"] == f"{file_store.uri}/jobs/orders/chk-3"


def test_a_name_that_is_a_folder_of_savepoints_without_its_own_metadata_is_not_found(file_store, clink_pool_run):
    _orders(file_store)
    fresh(file_store).savepoint("orders")  # savepoints/orders/savepoint-3-XXXXXX/: savepoints/orders/ holds objects, no _metadata
    result = clink_pool_run("inspect", "--store", file_store.uri, "--savepoint", "orders")
    assert result.exit_code == 3 and "not found" in result.stderr, result.output
