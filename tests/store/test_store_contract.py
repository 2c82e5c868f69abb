"""Every ObjectStore implementation runs the one contract (tests/store/store_contract.py): file, memory, S3 on moto, SeaweedFS, retrying."""

from __future__ import annotations

import uuid

import pytest

from store.local import FileStore
from store.memory import MemoryStore
from store.retry import RetryingStore, StoreRetryConfig
from tests.store.store_contract import StoreContract


class TestFileStore(StoreContract):
    @pytest.fixture
    def store(self, tmp_path):
        return FileStore(tmp_path / "store")


class TestMemoryStore(StoreContract):
    @pytest.fixture
    def store(self):
        return MemoryStore()


class TestS3StoreOnMoto(StoreContract):
    @pytest.fixture
    def store(self, make_s3_store):
        return make_s3_store()


@pytest.mark.seaweedfs
class TestS3StoreOnSeaweedFS(StoreContract):
    @pytest.fixture
    def store(self, seaweed):
        from store.s3 import S3Store

        store = S3Store("clink-contract", f"run-{uuid.uuid4().hex[:8]}", seaweed)
        store.create_bucket()
        return store


class TestRetryingStore(StoreContract):
    """The wrapper over a store that never fails must behave exactly like the store (tests/store/test_faults.py covers failures)."""

    @pytest.fixture
    def store(self, tmp_path):
        return RetryingStore(FileStore(tmp_path / "store"), StoreRetryConfig(seed=1))
