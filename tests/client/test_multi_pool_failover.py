"""Failover over a comma list of pools: a pool stopped mid-run (and started again on its port), a pool dying inside a
commit, every pool down, RESOURCE_EXHAUSTED backing off, and seeded random kill/restart schedules against a dict model.
"""

from __future__ import annotations

import json
import random
import threading
import uuid

import grpc
import pytest

from client.backend import BackendConfig, RemoteReadBackend
from client.errors import OverloadedError, UnavailableError
from client.pool_client import PoolClient, PoolClientConfig, RetryPolicy
from store.memory import MemoryStore
from store.objects import ObjectStore
from tests.client_fixtures import FOUR, OP_COUNT, TWO, free_port, keyed_keys
from tests.multi_pool_client_fixtures import ModelJob, Pools, reply_lost, running_pools

# a short rest, so a restarted pool is back in the rotation within a few calls' time
FAST = BackendConfig(
    retry=RetryPolicy(max_attempts=6, initial_backoff_s=0.01, max_backoff_s=0.05, down_pool_rest_s=0.2), call_deadline_s=10
)


def _job() -> str:
    return f"failover-{uuid.uuid4().hex[:8]}"


def _until_served(pools: Pools, i: int, call, limit: int = 200) -> int:
    """Make calls until pool ``i`` has served one more than now (bounded); how many it took."""
    import time

    before = pools.served(i)
    for n in range(1, limit + 1):
        call()
        if pools.served(i) > before:
            return n
        time.sleep(0.02)  # lets the rest of a refused address run out; not an assertion on time
    raise AssertionError(f"pool {i} served nothing in {limit} calls")


def test_one_pool_stopped_mid_run_then_started_again_on_its_port_costs_only_retries(store: ObjectStore) -> None:
    """``store``: a local directory and moto S3."""
    with running_pools(store) as pools:
        job = ModelJob(pools.address, _job(), TWO, FAST, seed=11)
        job.write(100)
        job.checkpoint()
        pools.stop(1)  # between calls: the next call that starts there fails over at once
        for _ in range(3):
            job.write(80)
            job.checkpoint()
            job.check()
        job.rescale(FOUR)  # restores and a fresh writer epoch for every range, with one pool down
        job.write(80)
        job.checkpoint()
        job.check()
        assert job.retries() > 0
        served_while_down = pools.served(1)
        pools.restart(1)  # same port: the clients' channels reconnect, and the address leaves its rest
        _until_served(pools, 1, lambda: job.backends[0].pool.list_jobs())
        for _ in range(2):
            job.write(60)
            job.checkpoint()
            job.check()
        assert pools.served(1) > served_while_down + 1  # back in the rotation for the backends' own calls too
        job.rescale([(0, 127)])
        job.check()
        job.close()


def test_a_pool_stopped_while_calls_are_in_flight_fails_them_over() -> None:
    with running_pools(MemoryStore()) as pools:
        job = ModelJob(pools.address, _job(), [(0, 127)], FAST, seed=12)
        job.write(200)
        job.checkpoint()
        backend = job.backends[0]
        keys, checkpoint = job.keys, job.cid
        expected = [job.model.get((OP_COUNT, k)) for k in keys]
        doomed = pools.server(2)
        real = doomed.core.multi_get_arrays
        entered, gate = threading.Event(), threading.Event()

        def held(*args, **kwargs):  # the first read on pool 2 is in flight when the pool stops
            entered.set()
            gate.wait(10)
            return real(*args, **kwargs)

        doomed.core.multi_get_arrays = held  # type: ignore[method-assign]
        errors: list[BaseException] = []
        answers: list[bool] = []
        stop = threading.Event()

        def reader() -> None:
            try:
                while not stop.is_set():
                    answers.append(backend.pool.multi_get(job.job, checkpoint, [OP_COUNT], keys) == expected)
            except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
                errors.append(exc)

        threads = [threading.Thread(target=reader) for _ in range(4)]
        for t in threads:
            t.start()
        assert entered.wait(10)
        retries = backend.pool.retries
        pools.stop(2)  # the held call is cut (UNAVAILABLE or CANCELLED) and retried on another pool
        gate.set()
        job.write(50)
        job.checkpoint()
        stop.set()
        for t in threads:
            t.join(30)
        assert not errors, errors
        assert answers and all(answers) and backend.pool.retries > retries
        job.check()
        job.close()


def test_a_pool_dying_after_a_commit_landed_leaves_the_retry_on_another_pool_recovered() -> None:
    with running_pools(MemoryStore()) as pools:
        job = ModelJob(pools.address, _job(), TWO, FAST, seed=13)
        job.write(120)
        job.checkpoint()
        job.write(120)

        dead: list[int] = []

        def die(server) -> None:  # the pool goes down with the commit's reply unsent (the call is cut)
            dead.append(pools.servers.index(server))
            stopper = threading.Thread(target=pools.stop, args=(dead[0],))
            stopper.start()
            stopper.join(10)

        job.cid += 1
        with reply_lost(pools.running(), "commit_checkpoint", after=die) as calls:
            results = [b.snapshot(job.cid) for b in job.backends]
        assert len(dead) == 1 and pools.servers[dead[0]] is None
        assert sum(calls) == 3  # the cut one, its repeat on another pool, the other part
        assert results[0].recovered and results[1].checkpoint.complete
        _, manifest = job.backends[0].pool.describe_checkpoint(job.job, job.cid)
        parts = json.loads(manifest)["parts"]
        assert sorted((p["kg_lo"], p["kg_hi"]) for p in parts) == TWO
        job.check()
        job.close()


def test_every_pool_down_is_unavailable_naming_each_address_after_bounded_attempts() -> None:
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    sleeps: list[float] = []
    config = PoolClientConfig(retry=RetryPolicy(max_attempts=4, initial_backoff_s=0.01, max_backoff_s=0.02), sleep=sleeps.append)
    with PoolClient(",".join(addresses), config) as client:
        with pytest.raises(UnavailableError) as err:
            client.list_checkpoints("job")
    message = str(err.value)
    assert all(a in message for a in addresses) and "no pool is listening on" in message, message
    assert "gave up after 12 attempt(s)" in message  # 4 rounds of 3 addresses
    assert len(sleeps) == 3 and sum(sleeps) <= 3 * 0.02  # a backoff between rounds only, never between addresses
    assert err.value.unreachable.startswith("no pool is listening on")  # type: ignore[attr-defined]


def test_a_down_address_is_passed_over_at_once_and_later_calls_start_elsewhere() -> None:
    with running_pools(MemoryStore()) as pools:
        sleeps: list[float] = []
        retry = RetryPolicy(max_attempts=4, initial_backoff_s=0.01, down_pool_rest_s=60.0)
        with PoolClient(pools.address, PoolClientConfig(retry=retry, sleep=sleeps.append)) as client:
            pools.stop(0)
            for _ in range(30):
                client.list_jobs()
            assert sleeps == []  # another address was always there to fail over to, at once
            assert client.retries == 1  # pool 0 was tried once; resting, later calls start on the others
            assert pools.served(1, "ListJobs") + pools.served(2, "ListJobs") == 30


def test_a_pool_that_is_not_a_pool_is_passed_over_and_named_when_all_fail() -> None:
    import socket

    with socket.socket() as sock:  # accepts connections and answers HTTP/1: a wrong port, not a pool
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        port = sock.getsockname()[1]

        def answer() -> None:
            while True:
                try:
                    conn, _ = sock.accept()
                except OSError:
                    return
                with conn:
                    conn.recv(1024)
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

        threading.Thread(target=answer, daemon=True).start()
        dead = f"127.0.0.1:{free_port()}"
        config = PoolClientConfig(retry=RetryPolicy(max_attempts=3, initial_backoff_s=0.01), sleep=lambda s: None)
        with PoolClient(f"127.0.0.1:{port},{dead}", config) as client:
            with pytest.raises(UnavailableError) as err:
                client.list_jobs()
        message = str(err.value)
        assert f"127.0.0.1:{port}: not a gRPC pool (HTTP/1 answered)" in message and f"{dead}: nothing listening" in message


def test_resource_exhausted_backs_off_before_the_next_address() -> None:
    def overloaded() -> list[str]:
        raise OverloadedError("the pool is busy (injected)")

    with running_pools(MemoryStore()) as pools:
        for i in (0, 1):
            pools.server(i).core.list_jobs = overloaded  # type: ignore[method-assign]
        sleeps: list[float] = []
        config = PoolClientConfig(retry=RetryPolicy(max_attempts=3, initial_backoff_s=0.01), sleep=sleeps.append)
        with PoolClient(pools.address, config) as client:
            assert [client.list_jobs() for _ in range(3)] == [[], [], []]  # the calls start on pools 0, 1 and 2 in turn
        exhausted = [pools.served(i, "ListJobs", "RESOURCE_EXHAUSTED") for i in range(3)]
        assert exhausted == [1, 2, 0] or exhausted == [2, 1, 0], exhausted
        assert len(sleeps) == 3  # each overloaded answer was followed by a backoff, though another pool was there


def _reconnected(address: str, backends: list[RemoteReadBackend]) -> None:
    """Wait until each backend's channel to ``address`` is connected again.

    A channel that saw a pool down retries the connection after gRPC's reconnect backoff (at most 0.5 s here, a client
    option); these tests' retry budgets are far shorter than that, so with that pool the only one up they would give up.
    """
    for b in backends:
        for target in b.pool._targets:
            if target.address == address:
                grpc.channel_ready_future(target.channel).result(timeout=10)


# (chance of stopping a pool, chance of starting one again) by how many pools are up
KILL_RESTART = {3: (0.3, 0.0), 2: (0.2, 0.15), 1: (0.15, 0.2), 0: (0.0, 0.6)}
RANGES = (TWO, FOUR, [(0, 127)])


def kill_restart_schedule(seed: int, steps: int = 40) -> list[tuple[str, int]]:
    """Steps (what, argument): stop or restart pool i, write n changes, checkpoint, check, or rescale to RANGES[i]."""
    rng = random.Random(seed)
    up, out = {0, 1, 2}, []
    for _ in range(steps):
        stop_p, restart_p = KILL_RESTART[len(up)]
        roll = rng.random()
        if roll < stop_p:
            i = rng.choice(sorted(up))
            up.discard(i)
            out.append(("stop", i))
        elif roll < stop_p + restart_p:
            i = rng.choice(sorted({0, 1, 2} - up))
            up.add(i)
            out.append(("restart", i))
        else:
            step = rng.choice(("write", "checkpoint", "checkpoint", "check", "rescale"))
            out.append((step, rng.randrange(1, 40) if step == "write" else rng.randrange(len(RANGES))))
    return out


def _pools_up_at_each_step(schedule: list[tuple[str, int]]) -> list[int]:
    up, out = 3, []
    for what, _ in schedule:
        up += {"stop": -1, "restart": 1}.get(what, 0)
        out.append(up)
    return out


@pytest.mark.parametrize("seed", [1, 5, 7, 8, 26])  # schedules that reach one pool up and none up
def test_random_kill_and_restart_schedules_keep_the_state_equal_to_the_model(seed: int) -> None:
    """Seeded schedules of 40 steps: stop or restart a pool, or write, checkpoint, read every key, rescale.

    A step with every pool down must fail as UnavailableError, bounded, and lose nothing: the backends keep their deltas
    and the next checkpoint after a restart carries them. Each schedule runs calls with one pool up and with none.
    """
    schedule = kill_restart_schedule(seed)
    ups = _pools_up_at_each_step(schedule)
    calls_at = [up for (what, _), up in zip(schedule, ups, strict=True) if what in ("checkpoint", "check", "rescale")]
    assert 0 in calls_at and 1 in calls_at, calls_at  # the schedule reaches both (else pick another seed)
    config = BackendConfig(
        retry=RetryPolicy(max_attempts=3, initial_backoff_s=0.005, max_backoff_s=0.01, down_pool_rest_s=0.05), call_deadline_s=10
    )
    with running_pools(MemoryStore()) as pools:
        job = ModelJob(pools.address, _job(), TWO, config, seed=seed, keys=120)
        job.write(40)
        job.checkpoint()
        for what, arg in schedule:
            if what == "stop":
                pools.stop(arg)
            elif what == "restart":
                pools.restart(arg)
                _reconnected(pools.addresses[arg], job.backends)
            elif what == "write":
                job.write(arg)  # local only: never fails
            elif not pools.up():
                with pytest.raises(UnavailableError) as err:  # refused everywhere, after bounded attempts
                    job.checkpoint() if what == "checkpoint" else job.check()
                assert all(a in str(err.value) for a in pools.addresses)  # a failed checkpoint's id is skipped: ids may gap
            elif what == "checkpoint":
                job.checkpoint()
            elif what == "check":
                job.check()
            else:
                job.rescale(RANGES[arg])
        for i in range(3):
            if pools.servers[i] is None:
                pools.restart(i)
        job.backends[0].pool.wait_ready(10)
        job.checkpoint()
        job.rescale([(0, 127)])
        job.check()
        job.close()


def test_a_checkpoint_attempted_with_every_pool_down_keeps_its_delta_for_the_next() -> None:
    with running_pools(MemoryStore()) as pools:
        config = BackendConfig(retry=RetryPolicy(max_attempts=2, initial_backoff_s=0.005), call_deadline_s=10)
        job = ModelJob(pools.address, _job(), [(0, 127)], config, seed=21)
        job.write(60)
        job.checkpoint()
        job.write(60)
        for i in range(3):
            pools.stop(i)
        with pytest.raises(UnavailableError) as err:
            job.backends[0].snapshot(job.cid + 1)
        assert all(a in str(err.value) for a in pools.addresses)
        for i in range(3):
            pools.restart(i)
        job.backends[0].pool.wait_ready(10)  # its channels reconnect (gRPC's reconnect backoff: at most 0.5 s here)
        job.checkpoint()  # the failed checkpoint's writes are in this one
        job.rescale([(0, 127)])
        job.check()
        keys = keyed_keys(5, seed=99)
        assert job.backends[0].get_many(OP_COUNT, keys) == [job.model.get((OP_COUNT, k)) for k in keys]
        job.close()
        with RemoteReadBackend.connect(pools.address, job.job, (0, 127), config) as reader:
            assert reader.restore(required=True).checkpoint_id == job.cid
