"""The object-store contract (as zarr's StoreTests): subclass StoreContract and give a `store` fixture of a fresh empty store.

Every ObjectStore implementation runs it: tests/store/test_store_contract.py holds the file store, the in-memory store, S3 on
moto, SeaweedFS and the retrying wrapper.
"""

from __future__ import annotations

import threading
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snapshot.errors import ConflictError, InvalidArgumentError, NotFoundError

_KEYS = st.sampled_from([f"d{d}/k{k}" for d in range(2) for k in range(3)])

_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), _KEYS, st.binary(max_size=8)),
        st.tuples(st.just("pia"), _KEYS, st.binary(max_size=8)),
        st.tuples(st.just("cas"), _KEYS, st.binary(max_size=8), st.booleans()),
        st.tuples(st.just("delete"), _KEYS),
        st.tuples(st.just("list"), st.sampled_from(["", "d0/", "d1/k", "d1/k2"])),
    ),
    max_size=25,
)


class StoreContract:
    """What every store must do: round trips, conditional writes, listing, ranges, races with one winner, a dict model."""

    def test_put_get_head_roundtrip(self, store):
        etag = store.put("a/b/c.bin", b"hello")
        assert store.get("a/b/c.bin") == b"hello"
        data, etag2 = store.get_with_etag("a/b/c.bin")
        assert (data, etag2) == (b"hello", etag)
        info = store.head("a/b/c.bin")
        assert (info.key, info.size, info.etag) == ("a/b/c.bin", 5, etag)
        assert info.last_modified_ms > 1_600_000_000_000

    def test_missing_key_names_the_key(self, store):
        for call in (lambda: store.get("no/such"), lambda: store.head("no/such"), lambda: store.get_range("no/such", 0, 3)):
            with pytest.raises(NotFoundError, match="no/such"):
                call()
        assert not store.exists("no/such")

    @pytest.mark.parametrize("key", ["", "/abs", "a/../b", "..", "a//b", "a\\b", "a\x00b", "a/./b", "x\n", ".clink-tmp/x", "a/"])
    def test_keys_that_escape_the_root_are_rejected(self, store, key):
        with pytest.raises(InvalidArgumentError):
            store.put(key, b"x")
        with pytest.raises(InvalidArgumentError):
            store.get(key)
        assert list(store.list("")) == []

    def test_put_overwrites_and_changes_etag(self, store):
        e1 = store.put("k", b"one")
        e2 = store.put("k", b"two!")
        assert store.get("k") == b"two!"
        assert e1 != e2

    def test_put_if_absent(self, store):
        store.put_if_absent("jobs/j/x", b"first")
        with pytest.raises(ConflictError, match="jobs/j/x"):
            store.put_if_absent("jobs/j/x", b"second")
        assert store.get("jobs/j/x") == b"first"

    def test_put_if_absent_file_puts_a_spooled_file_once(self, store):
        spool = store.spool_path()
        blob = bytes(range(256)) * 1000
        spool.write_bytes(blob)
        before = store.counters.snapshot()["bytes_written"]
        etag = store.put_if_absent_file("jobs/j/data/a.arrow", spool, len(blob))
        assert store.get("jobs/j/data/a.arrow") == blob and store.head("jobs/j/data/a.arrow").etag == etag
        assert store.counters.snapshot()["bytes_written"] - before == len(blob)
        spool.unlink()  # the caller's to remove; the object stays
        assert store.get("jobs/j/data/a.arrow") == blob
        again = store.spool_path()
        again.write_bytes(b"other bytes")
        with pytest.raises(ConflictError, match="jobs/j/data/a.arrow"):
            store.put_if_absent_file("jobs/j/data/a.arrow", again, 11)
        again.unlink()
        assert store.get("jobs/j/data/a.arrow") == blob
        assert not [i.key for i in store.list("") if "spool" in i.key]  # a spool is never an object of the store

    def test_compare_and_swap(self, store):
        e1 = store.compare_and_swap("w", b"v1", None)
        with pytest.raises(ConflictError):
            store.compare_and_swap("w", b"v1b", None)
        e2 = store.compare_and_swap("w", b"v2", e1)
        with pytest.raises(ConflictError):
            store.compare_and_swap("w", b"v3", e1)  # stale etag
        assert store.get("w") == b"v2"
        with pytest.raises(ConflictError):
            store.compare_and_swap("absent", b"x", e2)  # expected an object that is not there
        assert not store.exists("absent")

    def test_list_is_sorted_relative_and_prefix_filtered(self, store):
        for key in ["jobs/b/x", "jobs/a/2", "jobs/a/1", "jobs/ab", "other"]:
            store.put(key, key.encode())
        assert [i.key for i in store.list("jobs/a")] == ["jobs/a/1", "jobs/a/2", "jobs/ab"]
        assert [i.key for i in store.list("jobs/a/")] == ["jobs/a/1", "jobs/a/2"]
        assert [i.key for i in store.list("")] == ["jobs/a/1", "jobs/a/2", "jobs/ab", "jobs/b/x", "other"]
        assert [i.size for i in store.list("other")] == [5]
        assert list(store.list("nothing/")) == []

    def test_delete_is_idempotent(self, store):
        store.put("d/x", b"1")
        store.delete("d/x")
        store.delete("d/x")
        store.delete("never/was")
        assert not store.exists("d/x")
        assert list(store.list("d/")) == []

    def test_ranges(self, store):
        blob = bytes(range(256)) * 100
        store.put("r", blob)
        assert store.get_range("r", 10, 5) == blob[10:15]
        assert store.get_range("r", len(blob) - 3, 10) == blob[-3:]
        assert store.get_range("r", len(blob) + 5, 10) == b""
        assert store.get_range("r", 7, 0) == b""
        with pytest.raises(InvalidArgumentError):
            store.get_range("r", -1, 4)
        ranges = [(0, 10), (20, 10), (5000, 7), (25_000, 100), (3, 4)]
        store.counters.reset()
        got = store.get_ranges("r", ranges)
        assert got == [blob[s : s + n] for s, n in ranges]
        # near ranges coalesce (gap 16 KiB): 0..5007 in one GET, 25000.. in another
        assert store.counters.snapshot()["requests"] == {"get_range": 2}
        assert store.counters.bytes_read == 5007 + 100

    def test_put_if_absent_race_has_one_winner(self, store):
        winners, losers = [], []
        barrier = threading.Barrier(6)

        def attempt(i: int) -> None:
            barrier.wait(timeout=10)
            try:
                store.put_if_absent("race/key", f"writer-{i}".encode())
                winners.append(i)
            except ConflictError:
                losers.append(i)

        threads = [threading.Thread(target=attempt, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert len(winners) == 1 and len(losers) == 5
        assert store.get("race/key") == f"writer-{winners[0]}".encode()

    def test_compare_and_swap_counter_loses_no_increment(self, store):
        store.compare_and_swap("ctr", b"0", None)
        successes = []

        def bump(n: int) -> None:
            done = 0
            for _ in range(200):  # bounded retries
                if done == n:
                    break
                data, etag = store.get_with_etag("ctr")
                try:
                    store.compare_and_swap("ctr", str(int(data) + 1).encode(), etag)
                    done += 1
                except ConflictError:
                    continue
            successes.append(done)

        threads = [threading.Thread(target=bump, args=(5,)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert int(store.get("ctr")) == sum(successes) == 20

    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(ops=_OPS)
    def test_store_matches_a_dict_model(self, store, ops):
        ns = f"m{uuid.uuid4().hex[:8]}/"
        model: dict[str, tuple[bytes, str]] = {}
        stale: dict[str, str] = {}
        for op in ops:
            kind, key = op[0], ns + op[1] if op[0] != "list" else op[1]
            if kind == "put":
                if key in model:
                    stale[key] = model[key][1]
                model[key] = (op[2], store.put(key, op[2]))
            elif kind == "pia":
                if key in model:
                    with pytest.raises(ConflictError):
                        store.put_if_absent(key, op[2])
                else:
                    model[key] = (op[2], store.put_if_absent(key, op[2]))
            elif kind == "cas":
                use_current = op[3]
                expected = model[key][1] if (key in model and use_current) else (None if use_current else stale.get(key, "bogus-etag"))
                ok = (key in model and use_current) or (key not in model and use_current)
                if key in model and not use_current and expected == model[key][1]:
                    ok = True  # an S3 etag is a content hash: an old etag of equal bytes still matches
                if ok:
                    old = model.get(key)
                    model[key] = (op[2], store.compare_and_swap(key, op[2], expected))
                    if old:
                        stale[key] = old[1]
                else:
                    with pytest.raises(ConflictError):
                        store.compare_and_swap(key, op[2], expected)
            elif kind == "delete":
                store.delete(key)
                if key in model:
                    stale[key] = model.pop(key)[1]
            else:
                listed = {i.key: i for i in store.list(ns + key)}
                assert sorted(listed) == sorted(k for k in model if k.startswith(ns + key))
                for k, info in listed.items():
                    assert info.size == len(model[k][0]) and info.etag == model[k][1]
        for key, (data, etag) in model.items():
            assert store.get_with_etag(key) == (data, etag)

    def test_list_prefixes_names_folders_without_their_contents(self, store):
        for key in ["jobs/a/x", "jobs/a/y/z", "jobs/b/w", "jobs/top", "other/q"]:
            store.put(key, b"1")
        assert store.list_prefixes("") == ["jobs", "other"]
        assert store.list_prefixes("jobs/") == ["a", "b"]
        assert store.list_prefixes("jobs/a/") == ["y"]
        assert store.list_prefixes("nothing/") == []
        store.delete("jobs/b/w")
        assert store.list_prefixes("jobs/") == ["a"]  # an emptied folder is gone, as on S3
        with pytest.raises(InvalidArgumentError):
            store.list_prefixes("jobs")
