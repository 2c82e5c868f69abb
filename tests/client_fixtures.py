"""Helpers for the client tests: a real pool server on loopback over moto, keys by key group, model helpers."""

from __future__ import annotations

import random
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pytest

import snapshot
from store.objects import ObjectStore

Model = dict[tuple[int, bytes], bytes]

OP_COUNT = snapshot.operator_id("word-count")
OP_WINDOW = snapshot.operator_id("window")
OP_SOURCE = snapshot.operator_id("source")
OFFSET_KEY = snapshot.encode_operator_key("offset", b"")
FOUR = [(0, 31), (32, 63), (64, 95), (96, 127)]
TWO = [(0, 63), (64, 127)]
EIGHT = [(i * 16, i * 16 + 15) for i in range(8)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keyed_keys(count: int, seed: int, slot: str = "v") -> list[bytes]:
    """``count`` distinct keyed keys spread over all key groups."""
    rng = random.Random(seed)
    out: dict[bytes, None] = {}
    while len(out) < count:
        out[snapshot.encode_keyed_key(slot, rng.randbytes(5))] = None
    return list(out)


def owner(ranges: list[tuple[int, int]], key: bytes) -> int:
    """Index of the range holding a keyed key (operator state: 0)."""
    lead = key[0] if key else 0
    if lead >= 128:
        return 0
    return next(i for i, (lo, hi) in enumerate(ranges) if lo <= lead <= hi)


def in_range(model: Model, lo: int, hi: int) -> Model:
    """Keyed keys of lo..hi plus every operator-state key."""
    return {(o, k): v for (o, k), v in model.items() if (k[0] if k else 0) >= 128 or lo <= (k[0] if k else 0) <= hi}


def table_model(table: pa.Table) -> Model:
    """A canonical table as a model; asserts one row per key."""
    rows = zip(
        table.column("op_id").to_pylist(), table.column("key_bytes").to_pylist(), table.column("value_bytes").to_pylist(), strict=True
    )
    out = {(o, k): v for o, k, v in rows}
    assert len(out) == table.num_rows, "a key appears twice"
    return out


def start_pool(store: ObjectStore, port: int = 0):
    """A real RemotePool server (in process) on 127.0.0.1 over ``store``."""
    from pool.server import PoolServer, PoolServerConfig

    return PoolServer(PoolServerConfig(listen=f"127.0.0.1:{port}", grace_seconds=0.2), store=store).start()


@pytest.fixture
def pool_store(make_s3_store: Callable[..., ObjectStore]) -> ObjectStore:
    """A fresh bucket on moto for one pool."""
    return make_s3_store(prefix="pool")


@contextmanager
def serving(store: ObjectStore) -> Iterator[str]:
    """host:port of a real pool server over ``store`` (start_pool's defaults), stopped on leaving."""
    server = start_pool(store)
    try:
        yield server.address
    finally:
        server.stop(0)


@pytest.fixture
def memory_pool_address() -> Iterator[str]:
    """host:port of a real pool server over an in-memory store: randomized tests take many steps, not S3 round trips."""
    from store.memory import MemoryStore

    with serving(MemoryStore()) as address:
        yield address


@pytest.fixture
def pool_address(pool_store: ObjectStore) -> Iterator[str]:
    """host:port of a real pool server over moto, stopped after the test."""
    with serving(pool_store) as address:
        yield address


@contextmanager
def counted(backend: Any, method: str) -> Iterator[list[int]]:
    """Count a backend's calls of one PoolClient method (the real one still runs)."""
    calls = [0]
    pool = backend.pool
    real = getattr(pool, method)

    def spy(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    setattr(pool, method, spy)
    try:
        yield calls
    finally:
        delattr(pool, method)


@contextmanager
def held_first_call(backend: Any, method: str) -> Iterator[tuple[threading.Event, threading.Event, list[int]]]:
    """A backend's first call of a PoolClient method waits for ``gate`` (``entered`` says it is waiting); counts calls."""
    gate, entered, calls = threading.Event(), threading.Event(), [0]
    pool = backend.pool
    real = getattr(pool, method)

    def held(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 1:
            entered.set()
            gate.wait(10)
        return real(*args, **kwargs)

    setattr(pool, method, held)
    try:
        yield gate, entered, calls
    finally:
        gate.set()
        delattr(pool, method)
