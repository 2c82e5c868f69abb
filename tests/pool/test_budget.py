"""The request memory budget: holdings grow, wait only while empty, never wait for each other, and always give back."""

from __future__ import annotations

import threading
import time

import pytest

from pool.budget import MemoryBudget
from snapshot.errors import OverloadedError


def test_a_holding_alone_may_pass_the_limit_and_gives_everything_back() -> None:
    budget = MemoryBudget(100, wait_s=0.2)
    with budget.holding() as held:
        for _ in range(5):
            held.add(60, "big")  # 300 of 100: alone, so admitted
        assert budget.reserved == 300
    assert budget.reserved == 0 and budget.peak == 300


def test_a_growing_holding_fails_at_once_when_another_holds_the_room() -> None:
    budget = MemoryBudget(100, wait_s=5)
    with budget.holding() as a, budget.holding() as b:
        a.add(60, "a")
        b.add(30, "b")
        started = time.monotonic()
        with pytest.raises(OverloadedError, match="--request-memory-mb"):
            b.add(30, "b")  # holds some already: no waiting (a might be waiting for b's room)
        assert time.monotonic() - started < 1
    assert budget.reserved == 0


def test_an_empty_holding_waits_for_room_and_gets_it() -> None:
    budget = MemoryBudget(100, wait_s=5)
    first = budget.holding()
    a = first.__enter__()
    a.add(90, "a")
    threading.Timer(0.2, lambda: first.__exit__(None, None, None)).start()
    started = time.monotonic()
    with budget.holding() as b:
        b.add(50, "b")
        assert 0.1 < time.monotonic() - started < 3
    assert budget.reserved == 0


def test_an_empty_holding_gives_up_after_its_wait() -> None:
    budget = MemoryBudget(100, wait_s=0.2)
    with budget.holding() as a:
        a.add(90, "a")
        with pytest.raises(OverloadedError), budget.holding() as b:
            b.add(50, "b")
        assert budget.reserved == 90


def test_one_token_cannot_take_more_than_its_share_while_another_holds_some() -> None:
    budget = MemoryBudget(100, wait_s=0.2)
    with budget.holding("victim") as victim, budget.holding("hog") as hog:
        victim.add(10, "victim")
        hog.add(40, "hog")
        with pytest.raises(OverloadedError):
            hog.add(20, "hog")  # 60 > half of 100 while the victim holds some
        with budget.holding("hog") as second:
            with pytest.raises(OverloadedError):
                second.add(20, "hog")  # the share counts every request of the token
        victim.add(40, "victim")  # the other tenant still finds room
    assert budget.reserved == 0


def test_at_most_a_few_requests_wait_for_room() -> None:
    budget = MemoryBudget(100, wait_s=2, max_waiters=2)
    first = budget.holding()
    first.__enter__().add(100, "full")
    waiting, refused = [], []

    def wait_for_room() -> None:
        try:
            with budget.holding() as h:
                h.add(50, "waiter")
                waiting.append(1)
        except OverloadedError:
            refused.append(1)

    threads = [threading.Thread(target=wait_for_room) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    assert budget.waiters == 2 and len(refused) == 2  # two wait (each holds a worker), two are refused at once
    first.__exit__(None, None, None)
    for t in threads:
        t.join(5)
    assert len(waiting) == 2 and budget.reserved == 0
