"""Helpers for the multi-pool client tests: N real pools on one store (stopped and restarted by index), RPCs counted per
pool, faults injected into one pool, and a tiny DNS server for dns:// names.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from pool.domain import PoolConfig
from pool.server import PoolServer, PoolServerConfig
from snapshot.errors import UnavailableError
from store.objects import ObjectStore


def requests_served(server: PoolServer, method: str | None = None, code: str | None = "OK") -> int:
    """RPCs one server finished, from its own clink_pool_requests metric (``method``/``code`` None: any)."""
    total = 0.0
    for family in text_string_to_metric_families(server.metrics.render().decode()):
        for sample in family.samples:
            if sample.name != "clink_pool_requests_total":
                continue
            if (method is None or sample.labels["method"] == method) and (code is None or sample.labels["code"] == code):
                total += sample.value
    return int(total)


class Pools:
    """``n`` pool servers over one store on loopback; ``address`` is the comma list a client takes.

    ``hosts``: one loopback address per pool, all on one port (what a DNS name resolving to several addresses gives);
    by default every pool is on 127.0.0.1 with a port of its own.
    """

    def __init__(
        self,
        store: ObjectStore,
        n: int = 3,
        hosts: tuple[str, ...] | None = None,
        http: bool = False,
        pool: PoolConfig | None = None,
    ) -> None:
        self.store = store
        self.hosts = hosts or ("127.0.0.1",) * n
        self.http = http
        self.pool = pool or PoolConfig()
        self.servers: list[PoolServer | None] = []
        self.ports: list[int] = []
        self._retired: list[list[PoolServer]] = []  # earlier lives of each pool (their counts still count)
        same_port = 0
        for i, host in enumerate(self.hosts):
            server = self._start(host, same_port if hosts else 0)
            if hosts and i == 0:
                same_port = server.port or 0
            self.servers.append(server)
            self.ports.append(server.port or 0)
            self._retired.append([])

    def _start(self, host: str, port: int) -> PoolServer:
        config = PoolServerConfig(listen=f"{host}:{port}", grace_seconds=0.2, http_port=0 if self.http else None, pool=self.pool)
        return PoolServer(config, store=self.store).start()

    @property
    def addresses(self) -> list[str]:
        return [f"{h}:{p}" for h, p in zip(self.hosts, self.ports, strict=True)]

    @property
    def address(self) -> str:
        return ",".join(self.addresses)

    def server(self, i: int) -> PoolServer:
        server = self.servers[i]
        assert server is not None, f"pool {i} is stopped"
        return server

    def stop(self, i: int) -> None:
        server = self.servers[i]
        if server is not None:
            server.stop(0)
            self._retired[i].append(server)
            self.servers[i] = None

    def restart(self, i: int) -> PoolServer:
        """Start pool ``i`` again on its own address and port."""
        assert self.servers[i] is None, f"pool {i} is running"
        server = self._start(self.hosts[i], self.ports[i])
        assert server.port == self.ports[i]
        self.servers[i] = server
        return server

    def up(self) -> list[int]:
        return [i for i, s in enumerate(self.servers) if s is not None]

    def running(self) -> list[PoolServer]:
        return [s for s in self.servers if s is not None]

    def served(self, i: int, method: str | None = None, code: str | None = "OK") -> int:
        """RPCs pool ``i`` finished over all its lives."""
        current = self.servers[i]
        lives = [*self._retired[i], *([current] if current is not None else [])]
        return sum(requests_served(s, method, code) for s in lives)

    def close(self) -> None:
        for i in range(len(self.servers)):
            self.stop(i)


@contextmanager
def running_pools(store: ObjectStore, n: int = 3, **kwargs: Any) -> Iterator[Pools]:
    pools = Pools(store, n, **kwargs)
    try:
        yield pools
    finally:
        pools.close()


@contextmanager
def reply_lost(
    servers: list[PoolServer], method: str, times: int = 1, after: Callable[[PoolServer], None] | None = None
) -> Iterator[list[int]]:
    """The first ``times`` calls of core ``method`` on any of ``servers`` take effect, then answer UNAVAILABLE (reply lost).

    ``after``: run with the server between the effect and the lost answer instead of raising (e.g. that pool dying then).
    Yields the calls each server got.
    """
    calls = [0] * len(servers)
    lost = [0]
    lock = threading.Lock()
    reals = [getattr(s.core, method) for s in servers]

    def patched(i: int) -> Callable[..., Any]:
        def lands_then_loses_the_reply(*args: Any, **kwargs: Any) -> Any:
            result = reals[i](*args, **kwargs)
            with lock:
                calls[i] += 1
                lose = lost[0] < times
                lost[0] += lose
            if lose:
                if after is not None:
                    after(servers[i])
                    return result
                raise UnavailableError("the reply of this call was lost (injected after it took effect)")
            return result

        return lands_then_loses_the_reply

    for i, server in enumerate(servers):
        setattr(server.core, method, patched(i))
    try:
        yield calls
    finally:
        for server, real in zip(servers, reals, strict=True):
            setattr(server.core, method, real)


@contextmanager
def stream_cut(servers: list[PoolServer], times: int = 1) -> Iterator[list[int]]:
    """The first ``times`` scans on any of ``servers`` send their first chunk, then fail UNAVAILABLE (a stream cut midway)."""
    calls = [0] * len(servers)
    cut_so_far = [0]
    reals = [s.core.scan for s in servers]

    def patched(i: int) -> Callable[..., Iterator[bytes]]:
        def cut(*args: Any, **kwargs: Any) -> Iterator[bytes]:
            calls[i] += 1
            chunks = reals[i](*args, **kwargs)
            if cut_so_far[0] >= times:
                return chunks
            cut_so_far[0] += 1

            def first_then_fail() -> Iterator[bytes]:
                yield next(iter(chunks))
                raise UnavailableError("the scan stream was cut (injected after its first chunk)")

            return first_then_fail()

        return cut

    for i, server in enumerate(servers):
        server.core.scan = patched(i)  # type: ignore[method-assign]
    try:
        yield calls
    finally:
        for server, real in zip(servers, reals, strict=True):
            server.core.scan = real  # type: ignore[method-assign]


def small_scan_chunks(config: PoolConfig | None = None, chunk_bytes: int = 4096) -> PoolConfig:
    """A PoolConfig whose scans stream in small chunks (so a cut stream has sent part of its rows)."""
    return replace(config or PoolConfig(), scan_chunk_bytes=chunk_bytes)


class DnsServer:
    """A UDP DNS server on 127.0.0.1 answering A queries for ``records`` (name -> IPv4 addresses); others get no answer.

    gRPC's c-ares resolver asks it when a target names it as the DNS server (dns://127.0.0.1:PORT/NAME:PORT).
    """

    def __init__(self, records: dict[str, list[str]]) -> None:
        self.records = {k.lower().rstrip("."): list(v) for k, v in records.items()}
        self.queries = 0
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="test-dns", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self._sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                data, peer = self._sock.recvfrom(512)
            except TimeoutError:
                continue
            except OSError:
                return
            reply = self.answer(data)
            if reply is not None:
                self._sock.sendto(reply, peer)

    def answer(self, data: bytes) -> bytes | None:
        """The reply to one query message (None: not a query this server reads)."""
        if len(data) < 17:
            return None
        qid = struct.unpack(">H", data[:2])[0]
        labels, i = [], 12
        while i < len(data) and data[i] != 0:
            labels.append(data[i + 1 : i + 1 + data[i]].decode("ascii", "replace"))
            i += 1 + data[i]
        if i + 5 > len(data):
            return None
        qtype = struct.unpack(">H", data[i + 1 : i + 3])[0]
        question = data[12 : i + 5]
        self.queries += 1
        ips = self.records.get(".".join(labels).lower(), []) if qtype == 1 else []
        answers = b"".join(b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 1, 4) + socket.inet_aton(ip) for ip in ips)
        return struct.pack(">HHHHHH", qid, 0x8180, 1, len(ips), 0, 0) + question + answers

    def resolve(self, name: str, port: int) -> list[str]:
        """What this server answers for ``name``, as HOST:PORT (a PoolClientConfig.resolve_host)."""
        return sorted(f"{ip}:{port}" for ip in self.records.get(name.lower().rstrip("."), []))

    def close(self) -> None:
        self._stop.set()
        self._sock.close()
        self._thread.join(2)


class ModelJob:
    """One job's subtasks (a backend per key-group range) on a pool address, driven by seeded writes and mirrored in a dict.

    Writes put new keys, overwrite and erase keys (and put erased ones again); subtask 0 also advances an operator-state
    offset. ``check()`` reads every key ever used (present or erased) from its owner and exports each range, against the
    model; ``rescale`` checkpoints, closes every backend and restores the checkpoint under new ranges.
    """

    def __init__(self, address: str, job: str, ranges: list[tuple[int, int]], config: Any, seed: int, keys: int = 240) -> None:
        import random

        from tests.client_fixtures import keyed_keys

        self.address, self.job, self.config = address, job, config
        self.rng = random.Random(seed)
        self.keys = keyed_keys(keys, seed=seed)
        self.model: dict[tuple[int, bytes], bytes] = {}
        self.offset = 0
        self.cid = 0
        self.ranges: list[tuple[int, int]] = []
        self.backends: list[Any] = []
        self._open(ranges, restore=False)

    def _open(self, ranges: list[tuple[int, int]], restore: bool) -> None:
        from client.backend import RemoteReadBackend

        self.ranges = list(ranges)
        self.backends = [RemoteReadBackend.connect(self.address, self.job, r, self.config) for r in ranges]
        for b in self.backends:
            if restore:
                b.restore(required=True)

    def write(self, count: int) -> None:
        from tests.client_fixtures import OFFSET_KEY, OP_COUNT, OP_WINDOW, owner

        for _ in range(count):
            key = self.rng.choice(self.keys)
            op = self.rng.choice((OP_COUNT, OP_WINDOW))
            b = self.backends[owner(self.ranges, key)]
            if (op, key) in self.model and self.rng.random() < 0.3:
                b.erase(op, key)
                del self.model[(op, key)]
            else:
                value = self.rng.randbytes(self.rng.randrange(0, 10))  # empty values too
                b.put(op, key, value)
                self.model[(op, key)] = value
        self.offset += 1  # operator state: 8 bytes, so a merge keeps the greatest
        value = self.offset.to_bytes(8, "little")
        self.backends[0].put(OP_COUNT, OFFSET_KEY, value)
        self.model[(OP_COUNT, OFFSET_KEY)] = value

    def checkpoint(self) -> list[Any]:
        """Commit the next checkpoint from every subtask; the results (the last one completes it)."""
        self.cid += 1
        results = [b.snapshot(self.cid) for b in self.backends]
        assert results[-1].checkpoint.complete, results[-1]
        return results

    def check(self) -> None:
        from tests.client_fixtures import OFFSET_KEY, OP_COUNT, OP_WINDOW, in_range, owner, table_model

        for op in (OP_COUNT, OP_WINDOW):
            by_owner: dict[int, list[bytes]] = {}
            for key in self.keys:
                by_owner.setdefault(owner(self.ranges, key), []).append(key)
            for i, keys in by_owner.items():
                got = self.backends[i].get_many(op, keys)
                assert got == [self.model.get((op, k)) for k in keys], (op, i)
        assert self.backends[0].get(OP_COUNT, OFFSET_KEY) == self.model[(OP_COUNT, OFFSET_KEY)]
        for b, (lo, hi) in zip(self.backends, self.ranges, strict=True):
            exported = table_model(read_canonical(b.export_arrow_snapshot()))
            expected = in_range(self.model, lo, hi)
            if b is not self.backends[0]:  # operator state another subtask wrote reaches it through completed checkpoints
                exported.pop((OP_COUNT, OFFSET_KEY), None)
                expected.pop((OP_COUNT, OFFSET_KEY), None)
            assert exported == expected, (lo, hi, len(exported), len(expected))

    def rescale(self, ranges: list[tuple[int, int]]) -> None:
        self.checkpoint()
        self.close()
        self._open(ranges, restore=True)

    def close(self) -> None:
        for b in self.backends:
            b.close()
        self.backends = []

    def retries(self) -> int:
        return sum(b.pool.retries for b in self.backends)


def read_canonical(blob: bytes):  # noqa: ANN201 - a pyarrow Table
    import snapshot

    return snapshot.read_snapshot(blob).table
