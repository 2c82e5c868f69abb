"""Object-store faults: a fault at every step of a commit never exposes a half-written checkpoint; retries absorb transient faults."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from client import RemoteReadBackend
from client.backend import BackendConfig
from client.pool_client import RetryPolicy
from pool.core import PoolCore
from pool.domain import KeyGroupRange
from pool.server import PoolServer, PoolServerConfig
from snapshot.errors import ConflictError, NotFoundError, UnavailableError
from store.local import FileStore
from store.retry import RetryingStore, StoreRetryConfig
from tests.faults import FAILING_KINDS, KINDS, FaultyStore, InjectedFault
from tests.pool_core_helpers import Model, apply, commit, keys_in_range, op_key, random_delta, scan_dict

JOB = "faulty-job"
HALVES = (KeyGroupRange(0, 63), KeyGroupRange(64, 127))
NO_SLEEP = StoreRetryConfig(max_attempts=6, initial_backoff_s=0.0005, max_backoff_s=0.002, seed=1)
TOTALS = {"faults": 0, "commits": 0, "steps": 0}


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    print(f"\n[faults] steps faulted {TOTALS['steps']}, faults injected {TOTALS['faults']}, commits {TOTALS['commits']}")


def _deltas(seed: int, model: Model, step: int) -> list[list]:
    """One delta per half, drawn against the model."""
    rng = random.Random(seed)
    out = []
    for kg in HALVES:
        universe = keys_in_range(kg.lo, kg.hi, 40, tag=f"h{kg.lo}-")
        out.append(random_delta(rng, model, universe, [], 25, step))  # keyed only: op-state merging is tested elsewhere
    return out


def _base_store(root: Path) -> tuple[dict[int, Model], tuple[int, int], list[list]]:
    """A store holding checkpoint 1 (two halves, complete); returns the models of checkpoints 1 and 2, the epochs and the deltas of 2."""
    core = PoolCore(FileStore(root))
    epochs = tuple(core.acquire_writer(JOB, kg)[0] for kg in HALVES)
    model: Model = {}
    for kg, epoch, rows in zip(HALVES, epochs, _deltas(1, model, 1), strict=True):
        commit(core, JOB, 1, 0, kg, epoch, rows)
        apply(model, rows)
    assert core.reader(JOB).latest() == 1
    deltas = _deltas(2, model, 2)
    model2 = dict(model)
    for rows in deltas:
        apply(model2, rows)
    return {1: model, 2: model2}, epochs, deltas


def _check_visible(root: Path, models: dict[int, Model]) -> int:
    """Every complete checkpoint a fresh pool sees scans to its model; returns the latest."""
    core = PoolCore(FileStore(root))
    infos = core.list_checkpoints(JOB, include_incomplete=True)
    for info in infos:
        if info.complete:
            assert scan_dict(core, JOB, info.checkpoint_id) == models[info.checkpoint_id], (
                f"checkpoint {info.checkpoint_id} differs from its model"
            )
    latest = core.reader(JOB).latest()
    assert latest in (1, 2)
    assert scan_dict(core, JOB, 0) == models[latest]
    assert scan_dict(core, JOB, 1) == models[1], "the previous checkpoint no longer scans to its model"
    return latest


def _commit_two(core: PoolCore, epochs, deltas, root: Path, models: dict[int, Model]) -> int:
    """Commit both halves of checkpoint 2; a failed commit is checked for visibility, then retried once. Returns failures."""
    failures = 0
    for kg, epoch, rows in zip(HALVES, epochs, deltas, strict=True):
        try:
            commit(core, JOB, 2, 1, kg, epoch, rows)
        except InjectedFault:
            failures += 1
            _check_visible(root, models)
            commit(core, JOB, 2, 1, kg, epoch, rows)  # the retry of the same commit (same writer, same epoch)
        TOTALS["commits"] += 1
    return failures


@pytest.mark.parametrize("kind", FAILING_KINDS)
def test_a_fault_at_every_step_of_a_commit_exposes_nothing_half_written_and_the_retry_succeeds(tmp_path: Path, kind: str):
    base = tmp_path / "base"
    models, epochs, deltas = _base_store(base)

    # a fault-free run counts the store calls of the two commits
    dry = tmp_path / "dry"
    shutil.copytree(base, dry)
    counting = FaultyStore(FileStore(dry))
    _commit_two(PoolCore(counting), epochs, deltas, dry, models)
    steps = len(counting.calls)
    assert steps >= 10 and _check_visible(dry, models) == 2

    for step in range(steps):
        root = tmp_path / f"s{step}"
        shutil.copytree(base, root)
        faulty = FaultyStore(FileStore(root), plan={step: kind}, timeout_s=0.001)
        failures = _commit_two(PoolCore(faulty), epochs, deltas, root, models)
        assert faulty.faults_injected == 1 and failures == 1, f"step {step} ({faulty.calls[step].op}) did not fail its commit"
        assert _check_visible(root, models) == 2, f"checkpoint 2 is not complete after a {kind} at step {step} and a retry"
        TOTALS["steps"] += 1
        TOTALS["faults"] += faulty.faults_injected
        shutil.rmtree(root)
    print(
        f"\n[faults] no retry wrapper, '{kind}' at each of the {steps} store calls of a two-part commit: nothing half-written, retries succeed"
    )


@pytest.mark.parametrize("kind", KINDS)
def test_retrying_store_absorbs_one_fault_at_every_step(tmp_path: Path, kind: str):
    base = tmp_path / "base"
    models, epochs, deltas = _base_store(base)
    steps = 0
    step = 0
    while True:
        root = tmp_path / f"s{step}"
        shutil.copytree(base, root)
        faulty = FaultyStore(FileStore(root), plan={step: kind}, timeout_s=0.001, slow_s=0.001)
        core = PoolCore(RetryingStore(faulty, NO_SLEEP))
        for kg, epoch, rows in zip(HALVES, epochs, deltas, strict=True):
            commit(core, JOB, 2, 1, kg, epoch, rows)  # never raises: every fault is retried or resolved
        TOTALS["commits"] += 2
        assert _check_visible(root, models) == 2
        shutil.rmtree(root)
        if not faulty.faults_injected:
            break  # the plan's step lies past the last call: every step has been covered
        TOTALS["faults"] += faulty.faults_injected
        steps += 1
        step += 1
    assert steps >= 10
    TOTALS["steps"] += steps
    print(f"\n[faults] RetryingStore, '{kind}' at each of the {steps} store calls: every commit succeeded on its first call")


def test_put_if_absent_after_a_lost_reply_reads_back_and_claims_only_its_own_bytes(file_store):
    faulty = FaultyStore(file_store, plan={0: "lost", 2: "lost"})
    store = RetryingStore(faulty, NO_SLEEP)
    store.put_if_absent("jobs/j/data/a.arrow", b"mine")  # lost reply, retry conflicts, read-back says it is ours
    assert store.recovered_writes == 1 and file_store.get("jobs/j/data/a.arrow") == b"mine"
    file_store.put_if_absent("jobs/j/chk-1/_metadata", b"theirs")
    with pytest.raises(ConflictError):
        store.put_if_absent("jobs/j/chk-1/_metadata", b"mine")  # not ambiguous: a plain conflict
    faulty.plan = {len(faulty.calls): "error"}
    with pytest.raises(ConflictError):
        store.put_if_absent("jobs/j/chk-1/_metadata", b"mine")  # failed attempt, then conflict with bytes not ours
    assert file_store.get("jobs/j/chk-1/_metadata") == b"theirs"


def test_compare_and_swap_is_repeated_only_when_the_failed_attempt_provably_did_nothing(file_store):
    etag = file_store.put_if_absent("jobs/j/writers", b"v1")
    faulty = FaultyStore(file_store, plan={0: "error"})
    store = RetryingStore(faulty, NO_SLEEP)
    etag2 = store.compare_and_swap("jobs/j/writers", b"v2", etag)  # failed before acting: etag unchanged, repeated
    assert file_store.get("jobs/j/writers") == b"v2" and store.retries == 1
    faulty.plan = {len(faulty.calls): "lost"}
    with pytest.raises(UnavailableError, match="unknown outcome"):
        store.compare_and_swap("jobs/j/writers", b"v3", etag2)  # it landed, but identical bytes could be a rival's
    assert file_store.get("jobs/j/writers") == b"v3"


def test_mutable_puts_are_not_repeated_and_immutable_data_files_are(file_store):
    store = RetryingStore(FaultyStore(file_store, plan={0: "error", 1: "error"}), NO_SLEEP)
    with pytest.raises(InjectedFault):
        store.put("jobs/j/writers", b"x")
    store.put("jobs/j/data/0123abcd.arrow", b"y")
    assert store.retries == 1 and file_store.get("jobs/j/data/0123abcd.arrow") == b"y"
    assert not file_store.exists("jobs/j/writers")


def test_gives_up_after_max_attempts_with_a_clear_error(file_store):
    faulty = FaultyStore(file_store, rate=1.0, kinds=("throttle",))
    store = RetryingStore(faulty, NO_SLEEP)
    with pytest.raises(UnavailableError, match=r"SlowDown.*gave up on get jobs/j/x after 6 attempts"):
        store.get("jobs/j/x")
    assert len(faulty.calls) == 6
    with pytest.raises(NotFoundError):
        RetryingStore(file_store, NO_SLEEP).get("jobs/j/x")  # a missing key is an answer, not retried


def test_backoff_grows_exponentially_with_full_jitter_and_a_cap():
    config = StoreRetryConfig(initial_backoff_s=0.1, max_backoff_s=0.5, multiplier=2.0)
    rng = random.Random(7)
    for attempt, cap in [(0, 0.1), (1, 0.2), (2, 0.4), (3, 0.5), (9, 0.5)]:
        draws = [config.backoff(attempt, rng) for _ in range(300)]
        assert 0 <= min(draws) and max(draws) <= cap and max(draws) > cap * 0.8 and min(draws) < cap * 0.2


def test_random_faults_at_20_percent_on_moto_still_let_every_commit_succeed(make_s3_store):
    inner = make_s3_store(prefix="faults")
    faulty = FaultyStore(inner, rate=0.2, kinds=KINDS, seed=11, slow_s=0.002, timeout_s=0.002)
    core = PoolCore(RetryingStore(faulty, NO_SLEEP))
    epochs = []
    for kg in HALVES:
        for _ in range(5):  # acquire is a compare-and-swap: an unknown outcome is retried by the caller (the client does)
            try:
                epochs.append(core.acquire_writer(JOB, kg)[0])
                break
            except UnavailableError:
                continue
    assert len(epochs) == 2
    model: Model = {}
    models: dict[int, Model] = {}
    for cid in range(1, 13):  # commits make few requests each now: enough of them for 40 faults at 20%
        for kg, epoch, rows in zip(HALVES, epochs, _deltas(100 + cid, model, cid), strict=True):
            commit(core, JOB, cid, cid - 1, kg, epoch, rows)
            apply(model, rows)
            TOTALS["commits"] += 1
        models[cid] = dict(model)
        assert scan_dict(core, JOB, cid) == model
    fresh = PoolCore(RetryingStore(faulty, NO_SLEEP))
    for cid, expected in models.items():
        assert scan_dict(fresh, JOB, cid) == expected
    assert faulty.faults_injected >= 40, faulty.faults
    assert {"error", "throttle", "timeout", "slow"} <= set(faulty.faults)
    TOTALS["faults"] += faulty.faults_injected
    print(
        f"\n[faults] 20% random faults on moto: {len(faulty.calls)} store calls, {faulty.faults_injected} faults {dict(faulty.faults)}, 16 commits ok"
    )


def test_a_pool_server_over_a_flaky_store_serves_a_worker_to_the_model(tmp_path: Path):
    faulty = FaultyStore(FileStore(tmp_path / "store"), rate=0.2, kinds=KINDS, seed=5, slow_s=0.002, timeout_s=0.002)
    config = PoolServerConfig(listen="127.0.0.1:0", grace_seconds=0.2, store_retry=NO_SLEEP)
    server = PoolServer(config, store=faulty).start()
    quick = BackendConfig(retry=RetryPolicy(max_attempts=8, initial_backoff_s=0.001, max_backoff_s=0.01), seed=3)
    try:
        model: dict[bytes, bytes] = {}
        op = 7
        with RemoteReadBackend.connect(server.address, "flaky", config=quick) as backend:
            rng = random.Random(2)
            for cid in range(1, 7):
                for i in range(30):
                    key = op_key(f"k{rng.randrange(60)}") if i % 7 == 0 else bytes([rng.randrange(128)]) + b"v|" + rng.randbytes(3)
                    if key in model and rng.random() < 0.3:
                        backend.erase(op, key)
                        model.pop(key)
                    else:
                        model[key] = f"{cid}-{i}".encode()
                        backend.put(op, key, model[key])
                backend.snapshot(cid)
        with RemoteReadBackend.connect(server.address, "flaky", config=quick) as successor:
            successor.restore()
            assert successor.read_checkpoint == 6
            keys = sorted(model)
            assert successor.get_many(op, keys) == [model[k] for k in keys]
        assert faulty.faults_injected >= 15
        TOTALS["faults"] += faulty.faults_injected
    finally:
        server.stop(0)
