"""A hypothesis state machine drives RemoteReadBackends through a real pool on loopback over moto, against a dict model."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections import Counter

import pyarrow as pa
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

import snapshot
from client import BackendConfig, InvalidArgumentError, RemoteReadBackend
from tests.client_fixtures import (
    EIGHT,
    FOUR,
    OFFSET_KEY,
    OP_COUNT,
    OP_SOURCE,
    OP_WINDOW,
    TWO,
    Model,
    in_range,
    keyed_keys,
    owner,
    table_model,
)

KEYS = keyed_keys(24, seed=7)
OPS = [OP_COUNT, OP_WINDOW]
LAYOUTS = {1: [(0, 127)], 2: TWO, 4: FOUR, 8: EIGHT}
SMALL_CACHE = BackendConfig(cache_bytes=2_000, call_deadline_s=10)  # small enough that eviction happens
# restored subtasks draw one: the warm table in the background, before restore returns, partial (a cache that
# holds a few key groups, so the LRU evicts and stale keys fall through to it), or not at all
RESTORE_CONFIGS = [
    SMALL_CACHE,
    dataclasses.replace(SMALL_CACHE, warm_up="eager"),
    dataclasses.replace(SMALL_CACHE, warm_up="eager", cache_bytes=600),
    dataclasses.replace(SMALL_CACHE, warm_up="eager", cache_bytes=1 << 20),
    dataclasses.replace(SMALL_CACHE, warm_up="auto", cache_bytes=1 << 20),
    dataclasses.replace(SMALL_CACHE, warm_up="off"),
]


def test_backend_state_machine_against_a_dict_model(memory_pool_address: str) -> None:
    address = memory_pool_address
    fired: Counter[str] = Counter()

    class BackendMachine(RuleBasedStateMachine):
        """Writes, reads, checkpoints, restores, rescales and exports through the pool; the model is a dict."""

        def __init__(self) -> None:
            super().__init__()
            self.job = f"sm-{uuid.uuid4().hex[:10]}"
            self.ranges = FOUR
            self.backends = [RemoteReadBackend.connect(address, self.job, r, SMALL_CACHE) for r in self.ranges]
            self.current: Model = {}
            self.committed: dict[int, Model] = {}
            self.next_id = 1
            self.offset = 0
            self.dirty: list[set[tuple[int, bytes]]] = [set() for _ in self.ranges]

        def teardown(self) -> None:
            for b in self.backends:
                b.close()

        def _backend_for(self, key: bytes) -> RemoteReadBackend:
            return self.backends[owner(self.ranges, key)]

        @rule(
            writes=st.lists(
                st.tuples(st.sampled_from(OPS), st.sampled_from(KEYS), st.none() | st.binary(max_size=12)), min_size=1, max_size=8
            )
        )
        def write(self, writes: list[tuple[int, bytes, bytes | None]]) -> None:
            """A batch of puts and erases (None) routed to the subtask owning each key."""
            for op, key, value in writes:
                fired["put" if value is not None else "erase"] += 1
                if value is None:
                    self._backend_for(key).erase(op, key)
                    self.current.pop((op, key), None)
                else:
                    self._backend_for(key).put(op, key, value)
                    self.current[(op, key)] = value
                self.dirty[owner(self.ranges, key)].add((op, key))

        @rule(
            op=st.sampled_from(OPS),
            keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=12),
            arrow=st.booleans(),
            data=st.data(),
        )
        def put_many(self, op: int, keys: list[bytes], arrow: bool, data: st.DataObject) -> None:
            """A bulk write of one subtask's keys (a key may repeat: its last value wins), from lists or Arrow arrays."""
            i = data.draw(st.integers(0, len(self.backends) - 1))
            lo, hi = self.ranges[i]
            mine = [k for k in keys if lo <= k[0] <= hi]
            if not mine:
                return
            fired["put_many"] += 1
            values = [data.draw(st.binary(max_size=12)) for _ in mine]
            if arrow:
                self.backends[i].put_many(op, pa.array(mine, pa.binary()), pa.array(values, pa.binary()))
            else:
                self.backends[i].put_many(op, mine, values)
            for k, v in zip(mine, values, strict=True):
                self.current[(op, k)] = v
                self.dirty[i].add((op, k))

        @rule(op=st.sampled_from(OPS), keys=st.lists(st.sampled_from(KEYS), max_size=10), data=st.data())
        def async_reads(self, op: int, keys: list[bytes], data: st.DataObject) -> None:
            """Reads by aget under asyncio.gather and by get_async futures answer as get does."""
            fired["async_reads"] += 1
            i = data.draw(st.integers(0, len(self.backends) - 1))
            b = self.backends[i]
            lo, hi = self.ranges[i]
            mine = [k for k in keys if lo <= k[0] <= hi]
            want = [self.current.get((op, k)) for k in mine]

            async def gathered() -> list[bytes | None]:
                return list(await asyncio.gather(*(b.aget(op, k) for k in mine)))

            assert asyncio.run(gathered()) == want
            assert [f.result(timeout=10) for f in [b.get_async(op, k) for k in mine]] == want

        @rule(data=st.data())
        def warm_up_finishes(self, data: st.DataObject) -> None:
            fired["warm_up_finishes"] += 1
            b = self.backends[data.draw(st.integers(0, len(self.backends) - 1))]
            assert b.wait_warm(10)
            if b.cache_stats["warm_state"] in ("full", "partial"):
                fired["warm_table_loaded"] += 1

        @rule(step=st.integers(1, 1000))
        def advance_offset(self, step: int) -> None:
            fired["advance_offset"] += 1
            # operator state (a source offset) is written by subtask 0 only, and only grows
            self.offset += step
            self.backends[0].put(OP_SOURCE, OFFSET_KEY, self.offset.to_bytes(8, "little", signed=True))
            self.dirty[0].add((OP_SOURCE, OFFSET_KEY))
            self.current[(OP_SOURCE, OFFSET_KEY)] = self.offset.to_bytes(8, "little", signed=True)

        @rule(op=st.sampled_from(OPS), key=st.sampled_from(KEYS))
        def get(self, op: int, key: bytes) -> None:
            fired["get"] += 1
            assert self._backend_for(key).get(op, key) == self.current.get((op, key))

        @rule(op=st.sampled_from(OPS), keys=st.lists(st.sampled_from(KEYS), max_size=10), data=st.data())
        def get_many(self, op: int, keys: list[bytes], data: st.DataObject) -> None:
            fired["get_many"] += 1
            i = data.draw(st.integers(0, len(self.backends) - 1))
            lo, hi = self.ranges[i]
            mine = [k for k in keys if lo <= k[0] <= hi]
            assert self.backends[i].get_many(op, mine) == [self.current.get((op, k)) for k in mine]
            others = [k for k in keys if not lo <= k[0] <= hi]
            if others:
                with pytest.raises(InvalidArgumentError):
                    self.backends[i].get_many(op, others)

        @rule()
        def read_offset(self) -> None:
            fired["read_offset"] += 1
            assert self.backends[0].get(OP_SOURCE, OFFSET_KEY) == self.current.get((OP_SOURCE, OFFSET_KEY))

        @rule()
        def checkpoint(self) -> None:
            fired["checkpoint"] += 1
            cid = self.next_id
            self.next_id += 1
            results = [b.snapshot(cid) for b in self.backends]
            assert [r.checkpoint.complete for r in results] == [False] * (len(results) - 1) + [True]
            self.dirty = [set() for _ in self.ranges]
            self.committed[cid] = dict(self.current)

        @precondition(lambda self: self.committed)
        @rule(data=st.data())
        def subtask_fails_and_restores(self, data: st.DataObject) -> None:
            fired["subtask_fails_and_restores"] += 1
            i = data.draw(st.integers(0, len(self.backends) - 1))
            latest = max(self.committed)
            self.backends[i].close()  # unsaved writes are lost with it
            config = data.draw(st.sampled_from(RESTORE_CONFIGS))
            fired[f"restore warm_up={config.warm_up} cache={config.cache_bytes}"] += 1
            fresh = RemoteReadBackend.connect(address, self.job, self.ranges[i], config)
            info = fresh.restore()
            assert info.checkpoint_id == latest and fresh.delta_rows == 0
            self.backends[i] = fresh
            self.dirty[i] = set()
            lo, hi = self.ranges[i]
            restored = self.committed[latest]
            for op, key in list(self.current):
                if lo <= key[0] <= hi or (i == 0 and key[0] >= 128):
                    del self.current[(op, key)]
            for (op, key), value in restored.items():
                if lo <= key[0] <= hi or (i == 0 and key[0] >= 128):
                    self.current[(op, key)] = value
            if i == 0:
                self.offset = int.from_bytes(self.current.get((OP_SOURCE, OFFSET_KEY), bytes(8)), "little", signed=True)

        @precondition(lambda self: self.committed)
        @rule(parallelism=st.sampled_from(sorted(LAYOUTS)), config=st.sampled_from(RESTORE_CONFIGS))
        def rescale(self, parallelism: int, config: BackendConfig) -> None:
            fired["rescale"] += 1
            latest = max(self.committed)
            new_ranges = LAYOUTS[parallelism]
            kept = self.backends[: len(new_ranges)]
            for b in self.backends[len(new_ranges) :]:
                b.close()
            for b, r in zip(kept, new_ranges, strict=False):
                b.restore(key_groups=r)  # re-acquires a writer epoch for the new range
            fresh = [RemoteReadBackend.connect(address, self.job, r, config) for r in new_ranges[len(kept) :]]
            for b in fresh:
                b.restore()
            self.backends = kept + fresh
            self.ranges = new_ranges
            self.dirty = [set() for _ in self.ranges]
            self.current = dict(self.committed[latest])
            self.offset = int.from_bytes(self.current.get((OP_SOURCE, OFFSET_KEY), bytes(8)), "little", signed=True)

        @precondition(lambda self: self.committed)
        @rule(config=st.sampled_from(RESTORE_CONFIGS[1:-1]))
        def job_restarts_warm(self, config: BackendConfig) -> None:
            """Every subtask fails and restores from the latest checkpoint with a warm table: unsaved writes are lost."""
            fired["job_restarts_warm"] += 1
            latest = max(self.committed)
            for b in self.backends:
                b.close()
            self.backends = [RemoteReadBackend.connect(address, self.job, r, config) for r in self.ranges]
            for b in self.backends:
                assert b.restore().checkpoint_id == latest
            self.dirty = [set() for _ in self.ranges]
            self.current = dict(self.committed[latest])
            self.offset = int.from_bytes(self.current.get((OP_SOURCE, OFFSET_KEY), bytes(8)), "little", signed=True)

        @rule()
        def export(self) -> None:
            fired["export"] += 1
            blobs = [b.export_arrow_snapshot() for b in self.backends]
            for b, blob, (lo, hi) in zip(self.backends, blobs, self.ranges, strict=True):
                snap = snapshot.read_snapshot(blob)
                assert not snap.is_changelog and snap.format_version == 1
                got = table_model(snap.table)
                keyed = {k: v for k, v in got.items() if k[1][0] < 128}
                assert keyed == {k: v for k, v in in_range(self.current, lo, hi).items() if k[1][0] < 128}
                if b is self.backends[0]:
                    assert {k: v for k, v in got.items() if k[1][0] >= 128} == {k: v for k, v in self.current.items() if k[1][0] >= 128}
            merged = table_model(snapshot.read_snapshot(snapshot.merge_snapshot_bytes(blobs)).table)
            assert merged == self.current  # greater offset wins the operator-state merge

        @invariant()
        def delta_holds_exactly_the_unsaved_writes(self) -> None:
            for b, dirty in zip(self.backends, self.dirty, strict=True):
                if b._delta.runs:  # a key written by put and by put_many is held (and counted) in both until the snapshot
                    assert b.delta_rows >= len(dirty)
                    continue
                assert b.delta_rows == len(dirty)
                assert b.delta_bytes == sum(len(k) + len(self.current.get((o, k), b"")) for o, k in dirty)

    run_state_machine_as_test(BackendMachine, settings=settings(max_examples=20, stateful_step_count=30, deadline=None, derandomize=True))
    print("rules fired:", dict(fired))
    # derandomized so the rules every run exercises are stable; a failure here means the machine stopped reaching one
    reached = ("put", "erase", "get", "get_many", "checkpoint", "subtask_fails_and_restores", "rescale", "export", "put_many")
    assert all(fired[r] for r in (*reached, "async_reads", "warm_table_loaded")), fired
