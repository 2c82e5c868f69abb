"""PoolCore under attack: fencing, commit races, several cores on one store, corruption, relocation and bad input."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

import snapshot as s
from pool.core import PoolCore, validate_job
from pool.domain import CommitRequest, KeyGroupRange, PoolConfig
from snapshot.errors import ChecksumMismatchError, ConflictError, CorruptDataError, FencedError, InvalidArgumentError, NotFoundError
from store.local import FileStore
from store.manifest import metadata_key
from tests.pool_core_helpers import OP_IDS, OPERATOR_PAIRS, changelog, commit, keyed, keys_in_range, op_key, scan_dict

FULL = KeyGroupRange(0, 127)
LOW, HIGH = KeyGroupRange(0, 63), KeyGroupRange(64, 127)
SRC = OP_IDS["source"]


def _keys(store) -> list[tuple[str, str]]:
    return [(i.key, i.etag) for i in store.list("")]


def _put(key: str, value: bytes = b"v"):
    return (s.ROW_PUT, SRC, keyed(key), value)


def test_stale_epoch_is_fenced_and_publishes_nothing(store):
    core = PoolCore(store)
    old, _ = core.acquire_writer("j", FULL)
    commit(core, "j", 1, 0, FULL, old, [_put("a", b"1")])
    new, latest = core.acquire_writer("j", LOW)  # a restarted writer for part of the range fences the old one
    assert new > old and latest == 1
    before = _keys(store)
    with pytest.raises(FencedError, match=f"epoch {old}"):
        commit(core, "j", 2, 1, FULL, old, [_put("a", b"2")])
    assert _keys(store) == before  # fenced before any upload: not even a data file
    assert [c.checkpoint_id for c in core.list_checkpoints("j", include_incomplete=True)] == [1]
    assert core.get("j", 0, SRC, keyed("a")) == (True, b"1", 1)


def test_disjoint_ranges_never_fence_each_other(store):
    core = PoolCore(store)
    e_low, _ = core.acquire_writer("j", LOW)
    e_high, _ = core.acquire_writer("j", HIGH)
    e_high2, _ = core.acquire_writer("j", HIGH)  # restart of the high subtask fences only the old high writer
    a, b = keys_in_range(0, 63, 1)[0], keys_in_range(64, 127, 1)[0]
    commit(core, "j", 1, 0, LOW, e_low, [_put(a)])
    with pytest.raises(FencedError):
        commit(core, "j", 1, 0, HIGH, e_high, [_put(b)])
    result = commit(core, "j", 1, 0, HIGH, e_high2, [_put(b)])
    assert result.checkpoint.complete
    assert scan_dict(core, "j", 1) == {(SRC, keyed(a)): b"v", (SRC, keyed(b)): b"v"}


def test_part_of_a_writer_fenced_after_staging_is_never_included(store):
    core = PoolCore(store)
    e_low, _ = core.acquire_writer("j", LOW)
    e_high, _ = core.acquire_writer("j", HIGH)
    a, b = keys_in_range(0, 63, 1)[0], keys_in_range(64, 127, 1)[0]
    commit(core, "j", 1, 0, LOW, e_low, [_put(a, b"stale")])  # staged
    core.acquire_writer("j", LOW)  # the low subtask restarts: its staged part is now fenced
    result = commit(core, "j", 1, 0, HIGH, e_high, [_put(b)])
    assert not result.checkpoint.complete  # the stale part does not count towards the tiling
    with pytest.raises(NotFoundError):
        core.get("j", 1, SRC, keyed(a))


def test_same_checkpoint_and_range_twice_conflicts(store):
    core = PoolCore(store)
    epoch, _ = core.acquire_writer("j", FULL)
    commit(core, "j", 1, 0, FULL, epoch, [_put("a", b"first")])
    with pytest.raises(ConflictError, match="checkpoint 1"):
        commit(core, "j", 1, 0, FULL, epoch, [_put("a", b"second")])
    assert core.get("j", 1, SRC, keyed("a")) == (True, b"first", 1)


def test_racing_commits_of_one_checkpoint_have_one_winner(store):
    """Two cores (standing in for two pool processes) commit the same checkpoint and range at once."""
    cores = [PoolCore(store), PoolCore(store)]
    epoch, _ = cores[0].acquire_writer("j", FULL)
    for round_ in range(1, 4):
        outcomes: dict[int, object] = {}
        barrier = threading.Barrier(2)

        def run(i: int, cid: int = round_, barrier: threading.Barrier = barrier, outcomes: dict = outcomes) -> None:
            barrier.wait(timeout=10)
            try:
                outcomes[i] = commit(cores[i], "j", cid, cid - 1, FULL, epoch, [_put("k", f"core{i}-{cid}".encode())])
            except ConflictError as exc:
                outcomes[i] = exc

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        winners = [i for i, o in outcomes.items() if not isinstance(o, Exception)]
        assert len(winners) == 1 and len(outcomes) == 2
        assert cores[1 - winners[0]].get("j", round_, SRC, keyed("k")) == (True, f"core{winners[0]}-{round_}".encode(), round_)


def test_concurrent_subtasks_on_several_cores_lose_nothing(store):
    ranges = [KeyGroupRange(i * 32, i * 32 + 31) for i in range(4)]
    cores = [PoolCore(store) for _ in ranges]
    epochs = []
    for c, r in zip(cores, ranges, strict=True):
        epochs.append(c.acquire_writer("j", r)[0])
    expected: dict = {}
    errors: list[BaseException] = []
    rows_by = {}
    for i, r in enumerate(ranges):
        ks = keys_in_range(r.lo, r.hi, 10, tag=f"t{i}-")
        rows_by[i] = [(s.ROW_PUT, SRC, keyed(k), f"{i}:{k}".encode()) for k in ks] + [(s.ROW_PUT, SRC, op_key(f"sub{i}"), b"x")]
        for _, op, key, value in rows_by[i]:
            expected[(op, key)] = value

    def run(i: int) -> None:
        try:
            for cid in (1, 2):
                commit(cores[i], "j", cid, cid - 1, ranges[i], epochs[i], rows_by[i] if cid == 1 else [])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    fresh = PoolCore(store)
    assert [c.checkpoint_id for c in fresh.list_checkpoints("j")] == [1, 2]
    assert scan_dict(fresh, "j", 1) == expected == scan_dict(fresh, "j", 2)


def test_concurrent_writer_acquisition_gives_distinct_epochs(store):
    core = PoolCore(store, PoolConfig(max_cas_attempts=200))
    got: list[int] = []

    def run(i: int) -> None:
        got.append(core.acquire_writer("j", KeyGroupRange(i, i))[0])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(set(got)) == 6 and max(got) - min(got) == 5  # six consecutive epochs, one each
    writers, _ = core.fencing.read("j")
    assert sorted(w.epoch for w in writers.writers) == sorted(got)  # no acquisition lost a disjoint writer


def _data_files(store, job: str) -> list[str]:
    return [i.key for i in store.list(f"jobs/{job}/data/")]


def _flip(store, key: str, where: int) -> None:
    blob = bytearray(store.get(key))
    blob[where % len(blob)] ^= 0x01
    store.put(key, bytes(blob))


@pytest.mark.parametrize("offset", [100, -40])
def test_flipped_byte_is_reported_naming_the_file(store, offset):
    core = PoolCore(store, PoolConfig(segment_target_bytes=256))
    epoch, _ = core.acquire_writer("j", FULL)
    rows = [_put(f"k{i}", b"x" * 20) for i in range(300)]
    commit(core, "j", 1, 0, FULL, epoch, rows)
    (key,) = _data_files(store, "j")
    _flip(store, key, offset)
    name = key.split("/", 2)[2]  # data/<uuid>.arrow, as the manifest names it
    cold = PoolCore(store)
    with pytest.raises(ChecksumMismatchError, match=name) as info:  # whole-file read: sha256
        list(cold.scan("j", 1, None, [], None))
    assert name in info.value.path
    cold = PoolCore(store)
    probe = [keyed(f"k{i}") for i in range(300)]
    with pytest.raises(ChecksumMismatchError, match=name):  # ranged segment reads: crc32
        cold.multi_get("j", 1, [SRC] * len(probe), probe)


def test_damaged_manifest_is_corrupt_data_naming_it(store):
    core = PoolCore(store)
    epoch, _ = core.acquire_writer("j", FULL)
    commit(core, "j", 1, 0, FULL, epoch, [_put("a")])
    key = metadata_key("j", 1)
    store.put(key, store.get(key).replace(b'"kind":"delta"', b'"kind":"weird"'))
    with pytest.raises(CorruptDataError, match="chk-1/_metadata.*kind"):
        PoolCore(store).get("j", 1, SRC, keyed("a"))
    store.put(key, b"{not json")
    with pytest.raises(CorruptDataError, match="chk-1/_metadata"):
        PoolCore(store).list_checkpoints("j")


def _copy_prefix(src, dst, prefix: str) -> None:
    for info in src.list(prefix):
        dst.put(info.key, src.get(info.key))


def test_job_prefix_copied_elsewhere_still_scans(s3_store, make_s3_store, make_file_store):
    core = PoolCore(s3_store, PoolConfig(segment_target_bytes=256))
    epoch, _ = core.acquire_writer("j", FULL)
    commit(core, "j", 1, 0, FULL, epoch, [_put(f"k{i}", str(i).encode()) for i in range(200)] + [(s.ROW_PUT, SRC, op_key("o"), b"o")])
    commit(core, "j", 2, 1, FULL, epoch, [(s.ROW_ERASE, SRC, keyed("k3"), b""), _put("k4", b"four")])
    expected = {cid: scan_dict(core, "j", cid) for cid in (1, 2)}
    manifest = s3_store.get(metadata_key("j", 2))
    assert s3_store.bucket.encode() not in manifest and b"s3://" not in manifest and b'"/' not in manifest
    for target in (make_s3_store(prefix="archive/deep"), make_file_store("copied")):
        _copy_prefix(s3_store, target, "jobs/j/")
        moved = PoolCore(target)
        for cid in (1, 2):
            assert scan_dict(moved, "j", cid) == expected[cid]
        assert moved.get("j", 0, SRC, keyed("k4")) == (True, b"four", 2)


BAD_JOBS = ["", "..", "a/b", "a\\b", "x\x00", "tab\tbed", "my job", "a..b", "j" * 129, "é" * 65]


@pytest.mark.parametrize("job", BAD_JOBS)
def test_bad_job_ids_are_invalid(file_store, job):
    core = PoolCore(file_store)
    for call in (
        lambda: core.acquire_writer(job, FULL),
        lambda: core.get(job, 0, 1, b"\x01k"),
        lambda: core.list_checkpoints(job),
        lambda: core.scan(job, 0, None, [], None),
        lambda: core.commit_checkpoint(CommitRequest(job, 1, 0, FULL, 1), []),
    ):
        with pytest.raises(InvalidArgumentError):
            call()
    assert _keys(file_store) == []


def test_good_job_ids_are_accepted():
    for job in ("job-1", "a.b", "Ünïcode", "j" * 128):
        assert validate_job(job) == job


def test_unknown_job_and_checkpoint_are_not_found(store):
    core = PoolCore(store)
    with pytest.raises(NotFoundError, match="nope"):
        core.get("nope", 0, 1, b"\x01k")
    with pytest.raises(NotFoundError, match="nope"):
        core.list_checkpoints("nope")
    with pytest.raises(NotFoundError):
        core.delete_checkpoint("nope", 1)
    epoch, _ = core.acquire_writer("j", FULL)
    commit(core, "j", 1, 0, FULL, epoch, [_put("a")])
    with pytest.raises(NotFoundError, match="checkpoint 7"):
        core.scan("j", 7, None, [], None)
    with pytest.raises(NotFoundError, match="checkpoint 7"):
        core.describe_checkpoint("j", 7)
    with pytest.raises(NotFoundError, match="parent checkpoint 5"):
        commit(core, "j", 6, 5, FULL, epoch, [_put("a")])


def _bad_commits(epoch: int) -> list[tuple[str, CommitRequest, list[bytes]]]:
    good = changelog([_put("a")])
    wrong_schema = s.write_snapshot(
        pa.table({"op_id": pa.array([1], pa.uint64()), "key_bytes": [b"\x01k"], "value_bytes": [b"v"]})
    ).replace(b"value_bytes", b"value_bytez")
    outside = keys_in_range(64, 127, 1)[0]
    return [
        ("malformed arrow", CommitRequest("j", 2, 1, LOW, epoch), [b"definitely not arrow"]),
        ("truncated", CommitRequest("j", 2, 1, LOW, epoch), [good[: len(good) // 2]]),
        ("wrong schema", CommitRequest("j", 2, 1, LOW, epoch), [wrong_schema]),
        ("outside range", CommitRequest("j", 2, 1, LOW, epoch), [changelog([_put(keys_in_range(0, 63, 1)[0]), _put(outside)])]),
        ("empty key", CommitRequest("j", 2, 1, LOW, epoch), [changelog([(s.ROW_PUT, SRC, b"", b"v")])]),
        ("parent not below", CommitRequest("j", 2, 2, LOW, epoch), [good]),
        ("checkpoint 0", CommitRequest("j", 0, 0, LOW, epoch), [good]),
        ("bad versions", CommitRequest("j", 2, 1, LOW, epoch, "nonsense"), [good]),
        ("uid mismatch", CommitRequest("j", 2, 1, LOW, epoch, "", ((123, "source"),)), [good]),
        ("range type", CommitRequest("j", 2, 1, (0, 63), epoch), [good]),  # type: ignore[arg-type]
        ("epoch 0", CommitRequest("j", 2, 1, LOW, 0), [good]),
    ]


def test_bad_commits_are_invalid_and_change_nothing(store):
    core = PoolCore(store)
    epoch, _ = core.acquire_writer("j", LOW)
    a = keys_in_range(0, 63, 1)[0]
    commit(core, "j", 1, 0, LOW, epoch, [_put(a)])
    before = _keys(store)
    for name, request, chunks in _bad_commits(epoch):
        with pytest.raises(InvalidArgumentError) as info:
            core.commit_checkpoint(request, chunks)
        assert str(info.value), name
        assert _keys(store) == before, f"{name} changed the store"
    with pytest.raises(InvalidArgumentError, match="key group"):
        core.commit_checkpoint(_bad_commits(epoch)[3][1], _bad_commits(epoch)[3][2])
    with pytest.raises(InvalidArgumentError, match="0 <= lo <= hi"):
        KeyGroupRange(5, 200)
    with pytest.raises(InvalidArgumentError):
        core.multi_get("j", 0, [1, 2], [b"\x01k"])
    for bad_op in (-1, 2**64, "x"):
        with pytest.raises(InvalidArgumentError, match="op_id"):
            core.multi_get("j", 0, [bad_op], [b"\x01k"])
    with pytest.raises(InvalidArgumentError, match="keys"):
        core.multi_get("j", 0, [1], [None])
    with pytest.raises(InvalidArgumentError):
        core.scan("j", 0, None, [], b"junk delta")


def test_canonical_delta_is_taken_as_puts(file_store):
    core = PoolCore(file_store)
    epoch, _ = core.acquire_writer("j", FULL)
    canonical = s.write_snapshot(pa.table({"op_id": pa.array([SRC], pa.uint64()), "key_bytes": [keyed("c")], "value_bytes": [b"canon"]}))
    core.commit_checkpoint(CommitRequest("j", 1, 0, FULL, epoch, "", OPERATOR_PAIRS), [canonical])
    assert core.get("j", 1, SRC, keyed("c")) == (True, b"canon", 1)


def test_describe_and_delete(store):
    core = PoolCore(store)
    epoch, _ = core.acquire_writer("j", FULL)
    commit(core, "j", 1, 0, FULL, epoch, [_put("a", b"1")])
    commit(core, "j", 2, 1, FULL, epoch, [_put("a", b"2")])
    info, text = core.describe_checkpoint("j", 2)
    assert info.checkpoint_id == 2 and info.parent_id == 1 and info.operators == tuple(sorted(OPERATOR_PAIRS))
    assert '"format":"clink.checkpoint-manifest"' in text and '"parent_id":1' in text
    assert core.describe_checkpoint("j", 0)[0].checkpoint_id == 2
    core.delete_checkpoint("j", 1)
    with pytest.raises(NotFoundError):
        core.get("j", 1, SRC, keyed("a"))
    assert core.get("j", 2, SRC, keyed("a")) == (True, b"2", 2)  # a child never depends on its parent's manifest
    assert [c.checkpoint_id for c in core.list_checkpoints("j", include_incomplete=True)] == [2]
    with pytest.raises(NotFoundError):
        core.delete_checkpoint("j", 1)


def test_file_store_shared_by_two_cores_in_one_directory(tmp_path):
    a, b = PoolCore(FileStore(tmp_path / "s")), PoolCore(FileStore(tmp_path / "s"))
    epoch, _ = a.acquire_writer("j", FULL)
    commit(a, "j", 1, 0, FULL, epoch, [_put("x")])
    with pytest.raises(ConflictError):
        commit(b, "j", 1, 0, FULL, epoch, [_put("x", b"other")])
    assert b.get("j", 0, SRC, keyed("x")) == (True, b"v", 1)


def test_writer_fenced_during_upload_publishes_nothing(file_store):
    """A new writer takes the range while the old one uploads its data file: no part, no checkpoint."""
    core = PoolCore(file_store)
    old, _ = core.acquire_writer("j", FULL)
    commit(core, "j", 1, 0, FULL, old, [_put("a", b"1")])
    rival = PoolCore(file_store)
    original = file_store.put_if_absent_file  # a commit's delta is spooled to disk and put from there

    def put_then_get_fenced(key: str, path, size: int) -> str:
        etag = original(key, path, size)
        assert "/data/" in key
        rival.acquire_writer("j", KeyGroupRange(0, 10))
        return etag

    file_store.put_if_absent_file = put_then_get_fenced  # type: ignore[method-assign]
    with pytest.raises(FencedError):
        commit(core, "j", 2, 1, FULL, old, [_put("a", b"2")])
    file_store.put_if_absent_file = original  # type: ignore[method-assign]
    assert not file_store.exists("jobs/j/chk-2/_metadata")
    # its part stays (a completer that read the writers table before the fence may include it), but it never counts
    staged = {c.checkpoint_id: c for c in core.list_checkpoints("j", include_incomplete=True)}
    assert staged[2].committed_ranges == () and not staged[2].complete
    assert core.get("j", 0, SRC, keyed("a")) == (True, b"1", 1)


def test_a_repeated_identical_commit_is_answered_again(store):
    """A lost reply: the writer sends the same commit again and gets the same answer, nothing new written."""
    core = PoolCore(store)
    epoch, _ = core.acquire_writer("j", FULL)
    rows = [_put("a", b"1"), _put("b", b"2")]
    first = commit(core, "j", 1, 0, FULL, epoch, rows)
    before = _keys(store)
    retry = CommitRequest("j", 1, 0, FULL, epoch, "", OPERATOR_PAIRS, attempt=1)  # a client's retry says so: nothing is uploaded
    again = core.commit_checkpoint(retry, [changelog(rows)])
    assert again.bytes_written == 0 and again.repeated and again.checkpoint == first.checkpoint
    assert _keys(store) == before
    blind = commit(core, "j", 1, 0, FULL, epoch, rows)  # a repeat that does not say so: same answer (its upload is garbage)
    assert blind.repeated and blind.bytes_written == 0 and blind.checkpoint == first.checkpoint
    with pytest.raises(ConflictError):
        commit(core, "j", 1, 0, FULL, epoch, [_put("a", b"other")])
    newer, _ = core.acquire_writer("j", FULL)
    # a newer attempt re-committing the id replaces the older attempt's checkpoint (protocol I3); the older writer is fenced
    assert commit(core, "j", 1, 0, FULL, newer, [_put("a", b"newer")]).checkpoint.complete
    assert core.get("j", 1, SRC, keyed("a")) == (True, b"newer", 1)
    with pytest.raises(FencedError):
        commit(core, "j", 2, 1, FULL, epoch, rows)


def test_truncated_data_file_is_reported_naming_the_file(store):
    core = PoolCore(store, PoolConfig(segment_target_bytes=256))
    epoch, _ = core.acquire_writer("j", FULL)
    commit(core, "j", 1, 0, FULL, epoch, [_put(f"k{i}", b"x" * 20) for i in range(300)])
    (key,) = _data_files(store, "j")
    store.put(key, store.get(key)[:-100])
    name = key.split("/", 2)[2]
    with pytest.raises(ChecksumMismatchError, match=name):
        list(PoolCore(store).scan("j", 1, None, [], None))
    probe = [keyed(f"k{i}") for i in range(300)]
    with pytest.raises(ChecksumMismatchError, match=name):
        PoolCore(store).multi_get("j", 1, [SRC] * len(probe), probe)
