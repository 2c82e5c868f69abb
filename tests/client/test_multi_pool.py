"""Several pools behind one name: address parsing, round-robin over a comma list, commits and scans retried on another pool,
live-export announcements to every pool, and dns:/// names (gRPC's round_robin over real DNS answers).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import snapshot
from client.backend import BackendConfig, RemoteReadBackend
from client.errors import InvalidArgumentError
from client.live_export import LiveExportConfig
from client.pool_addresses import PoolAddresses, parse_pool_addresses
from client.pool_client import PoolClient, RetryPolicy
from store.memory import MemoryStore
from store.objects import ObjectStore
from tests.client_fixtures import FOUR, OP_COUNT, TWO, in_range, keyed_keys, table_model
from tests.multi_pool_client_fixtures import DnsServer, ModelJob, Pools, reply_lost, running_pools, small_scan_chunks, stream_cut

METHODS = ("AcquireWriter", "CommitCheckpoint", "MultiGet", "ScanCheckpoint", "ListCheckpoints", "DescribeCheckpoint")
FAST = BackendConfig(retry=RetryPolicy(max_attempts=6, initial_backoff_s=0.01, max_backoff_s=0.05), call_deadline_s=10)


def _job() -> str:
    return f"multi-{uuid.uuid4().hex[:8]}"


# -- parsing -----------------------------------------------------------------------------------------------------


def test_one_address_a_comma_list_and_a_dns_name_parse_to_their_targets() -> None:
    assert parse_pool_addresses("127.0.0.1:7420").hosts == ("127.0.0.1:7420",)
    three = parse_pool_addresses("pool-a:7420,pool-b:7421, [::1]:7422")
    assert three.hosts == ("pool-a:7420", "pool-b:7421", "[::1]:7422") and three.dns is None
    assert three.host_names() == ("pool-a", "pool-b", "::1")
    dns = parse_pool_addresses("dns:///pools.internal:7420")
    assert dns.targets == ("dns:///pools.internal:7420",) and dns.host_names() == ("pools.internal",) and not dns.hosts


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("", "non-empty"),
        ("a:1,,b:2", "entry 2 of 3 is empty"),
        ("a:1,b:2,", "entry 3 of 3 is empty"),
        ("a:1,b:x", "'b:x' has a bad port 'x'"),
        ("a:1,b:0", "'b:0' has a bad port '0'"),
        ("a:1,b:70000", "'b:70000' has a bad port"),
        ("a:1,b", "'b' has no port"),
        ("a:1,A:1", "'A:1' is listed twice"),
        ("[::1]:5,[0:0::1]:5", "listed twice"),
        ("a:1,dns:///b:2", "mixed forms"),
        ("dns:///b:2,a:1", "mixed forms"),
        ("a:1,grpc://b:2", "'grpc://b:2' is not HOST:PORT"),
        ("dns://8.8.8.8/b:2", "three slashes"),
        ("dns:///b", "'b' has no port"),
        ("dns:///[::1]:5", "not an IPv6 address"),
        ("a b:1", "whitespace"),
        ("::1:5", "in brackets"),
        ("[zz]:5", "not an IPv6 address"),
        ("bad/host:1", "not a host name"),
    ],
)
def test_a_bad_address_is_refused_naming_the_entry(text: str, named: str) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        parse_pool_addresses(text)
    assert named in str(err.value) and "HOST:PORT" in str(err.value)
    if text:
        assert repr(text) in str(err.value)  # the whole address, then what in it is wrong
    with pytest.raises(InvalidArgumentError):
        PoolClient(text)  # the client refuses it before opening any channel


hosts = st.from_regex(r"[a-z][a-z0-9-]{0,10}[a-z0-9]", fullmatch=True) | st.ip_addresses(v=4).map(str)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(hosts, st.integers(1, 65535)), min_size=1, max_size=6, unique_by=lambda e: (e[0].lower(), e[1])))
def test_any_list_of_distinct_addresses_round_trips_in_order(entries: list[tuple[str, int]]) -> None:
    text = ",".join(f"{h}:{p}" for h, p in entries)
    assert parse_pool_addresses(text).hosts == tuple(f"{h}:{p}" for h, p in entries)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab1:,[]/ .dns"), max_size=20))
def test_any_string_parses_or_is_an_invalid_argument(text: str) -> None:
    try:
        parsed = parse_pool_addresses(text)
    except InvalidArgumentError:
        return
    assert parsed.targets and all(t for t in parsed.targets)


# -- a comma list of three pools on one store ----------------------------------------------------------------------


def test_three_pools_on_one_store_serve_writes_checkpoints_reads_and_rescales_with_calls_spread(store: ObjectStore) -> None:
    """``store`` runs this on a local directory and on moto S3: every pool sees what another committed."""
    with running_pools(store) as pools:
        job = ModelJob(pools.address, _job(), TWO, FAST, seed=5)
        for _ in range(3):
            job.write(120)
            job.checkpoint()
            job.check()
        job.rescale(FOUR)  # every new subtask restores through whichever pool its calls reach
        job.write(80)
        job.check()
        job.checkpoint()
        job.rescale([(0, 127)])
        job.check()
        job.close()
        assert job.retries() == 0
        # each client (7: two, four and one backend) rotates its calls, so its pools' counts differ by one at most
        totals = [pools.served(i, code=None) for i in range(3)]
        assert min(totals) > 20 and max(totals) - min(totals) <= 7, totals
        kinds = [{m for m in METHODS if pools.served(i, m)} for i in range(3)]
        assert all(len(k) >= 4 for k in kinds), kinds  # writes, commits, reads and scans alike, not one kind per pool


def test_each_call_starts_on_the_next_address() -> None:
    with running_pools(MemoryStore()) as pools, PoolClient(pools.address, FAST.pool_client_config()) as client:
        for _ in range(30):
            client.list_jobs()
        assert [pools.served(i, "ListJobs") for i in range(3)] == [10, 10, 10]


def test_a_commit_whose_reply_was_lost_on_one_pool_is_recovered_on_another_and_lands_once() -> None:
    with running_pools(MemoryStore()) as pools:
        job = _job()
        backend = RemoteReadBackend.connect(pools.address, job, (0, 127), FAST)
        keys = keyed_keys(50, seed=1)
        model = {(OP_COUNT, k): bytes([i]) for i, k in enumerate(keys)}
        backend.put_many(OP_COUNT, keys, [bytes([i]) for i in range(len(keys))])
        with reply_lost(pools.running(), "commit_checkpoint") as calls:
            result = backend.snapshot(1)  # whichever pool it reaches first loses the reply; the next answers
        assert sorted(calls) == [0, 1, 1]
        assert result.recovered and result.attempts == 2 and result.checkpoint.complete
        failed = [i for i in range(3) if pools.served(i, "CommitCheckpoint", "UNAVAILABLE")]
        answered = [i for i in range(3) if pools.served(i, "CommitCheckpoint", "OK")]
        assert len(failed) == 1 and len(answered) == 1 and failed != answered  # the repeat went to another pool
        _, manifest = backend.pool.describe_checkpoint(job, 1)
        assert len(json.loads(manifest)["files"]) == 1  # one delta file: the state is not doubled
        assert table_model(snapshot.read_snapshot(backend.export_arrow_snapshot()).table) == model
        backend.close()
        with RemoteReadBackend.connect(pools.address, job, (0, 127), FAST) as reader:
            reader.restore(required=True)
            assert reader.get_many(OP_COUNT, keys) == [model[(OP_COUNT, k)] for k in keys]


def test_a_lost_reply_of_one_part_retried_on_another_pool_still_completes_the_checkpoint_with_both_parts() -> None:
    """The repeat lands on a pool that staged no part of this checkpoint and cached nothing of it: it lists the store."""
    with running_pools(MemoryStore()) as pools:
        job = ModelJob(pools.address, _job(), TWO, FAST, seed=9)
        job.write(100)
        job.checkpoint()
        job.write(100)
        job.cid += 1
        first, second = job.backends
        with reply_lost(pools.running(), "commit_checkpoint") as calls:
            lost = first.snapshot(job.cid)
        assert lost.recovered and not lost.checkpoint.complete and sorted(calls) == [0, 1, 1]
        done = second.snapshot(job.cid)
        assert done.checkpoint.complete and not done.recovered
        _, manifest = first.pool.describe_checkpoint(job.job, job.cid)
        assert sorted((p["kg_lo"], p["kg_hi"]) for p in json.loads(manifest)["parts"]) == TWO
        job.check()
        job.rescale([(0, 127)])
        job.check()
        job.close()


def test_a_lost_writer_grant_asked_again_on_another_pool_leaves_the_backend_the_newer_usable_epoch() -> None:
    with running_pools(MemoryStore()) as pools:
        job = _job()
        with reply_lost(pools.running(), "acquire_writer") as calls:
            backend = RemoteReadBackend.connect(pools.address, job, (0, 127), FAST)
        assert backend.pool.retries == 1 and sorted(calls) == [0, 1, 1]
        backend.put(OP_COUNT, b"\x00k|x", b"v")
        assert backend.snapshot(1).checkpoint.complete  # the epoch it holds is the newest: not fenced
        with PoolClient(pools.address, FAST.pool_client_config()) as probe:
            _, manifest = probe.describe_checkpoint(job, 1)
            assert json.loads(manifest)["parts"][0]["epoch"] == backend.epoch
        backend.close()


def test_a_scan_cut_midway_on_one_pool_is_retried_from_the_start_on_another() -> None:
    with running_pools(MemoryStore(), pool=small_scan_chunks()) as pools:
        job = ModelJob(pools.address, _job(), [(0, 127)], FAST, seed=3, keys=600)
        job.write(600)
        job.checkpoint()
        backend = job.backends[0]
        with stream_cut(pools.running()) as calls:
            blob = backend.pool.scan_checkpoint(job.job, job.cid)
        assert sorted(calls) == [0, 1, 1]  # one cut stream, then a whole one on another pool
        assert table_model(snapshot.read_snapshot(blob).table) == job.model  # nothing of the cut stream is kept
        job.close()


# -- live exports: announced to every pool ------------------------------------------------------------------------


def _live(port: int, job: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/jobs/{job}/state.arrow?live=1", timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_live_exports_are_announced_to_every_pool_of_a_comma_list_and_withdrawn_from_each() -> None:
    with running_pools(MemoryStore(), http=True) as pools:
        job = ModelJob(pools.address, _job(), TWO, FAST, seed=4)
        job.write(150)
        job.checkpoint()
        job.write(60)  # live state: after the checkpoint too
        for b in job.backends:
            b.serve_live_export(config=LiveExportConfig(ttl_s=30))
        for i in range(3):  # any pool's ?live=1 sees both subtasks
            status, body = _live(pools.server(i).http_port or 0, job.job)
            assert status == 200, body
            assert table_model(snapshot.read_snapshot(body).table) == job.model, i
        job.close()  # withdraws from every pool
        assert [_live(pools.server(i).http_port or 0, job.job)[0] for i in range(3)] == [404, 404, 404]


def test_a_live_export_still_announces_with_a_pool_down_and_reaches_it_once_back() -> None:
    with running_pools(MemoryStore(), http=True) as pools:
        job = ModelJob(pools.address, _job(), [(0, 127)], FAST, seed=6)
        job.write(50)
        pools.stop(1)
        backend = job.backends[0]
        backend.serve_live_export(config=LiveExportConfig(ttl_s=30))
        for i in (0, 2):
            assert _live(pools.server(i).http_port or 0, job.job)[0] == 200
        pools.restart(1)
        assert backend.live_export is not None
        backend.live_export.announce()  # a renewal: each one tells every pool again
        status, body = _live(pools.server(1).http_port or 0, job.job)
        assert status == 200, body
        assert table_model(snapshot.read_snapshot(body).table) == job.model
        job.close()


# -- dns:/// names: one channel, gRPC's round_robin ------------------------------------------------------------------


@pytest.fixture
def three_named_pools() -> Iterator[tuple[Pools, DnsServer, PoolAddresses]]:
    """Three pools on 127.0.0.1-3, one port, and a DNS server resolving pools.test to them; a dns target asking it."""
    pools = Pools(MemoryStore(), hosts=("127.0.0.1", "127.0.0.2", "127.0.0.3"), http=True)
    dns = DnsServer({"pools.test": ["127.0.0.1", "127.0.0.2", "127.0.0.3"]})
    port = pools.ports[0]
    # dns:///pools.test:PORT as parse_pool_addresses makes it, but asking this DNS server rather than the system's
    addresses = PoolAddresses(
        f"dns:///pools.test:{port}", dns=f"dns://127.0.0.1:{dns.port}/pools.test:{port}", dns_host="pools.test", dns_port=port
    )
    try:
        yield pools, dns, addresses
    finally:
        pools.close()
        dns.close()


def test_a_dns_name_spreads_calls_over_every_address_it_resolves_to_and_survives_one_stopping(three_named_pools) -> None:
    pools, dns, addresses = three_named_pools
    config = FAST.pool_client_config()
    with PoolClient(addresses, config) as client:
        for _ in range(30):
            client.list_jobs()
        assert all(pools.served(i, "ListJobs") >= 5 for i in range(3)), [pools.served(i, "ListJobs") for i in range(3)]
        assert dns.queries > 0
        pools.stop(1)
        before = [pools.served(i, "ListJobs") for i in (0, 2)]
        for _ in range(20):
            client.list_jobs()  # round_robin drops the stopped address; a call that raced it is retried
        assert sum(pools.served(i, "ListJobs") for i in (0, 2)) - sum(before) == 20


def test_a_backend_on_a_dns_name_commits_reads_and_announces_its_live_export_to_each_resolved_pool(three_named_pools) -> None:
    pools, dns, addresses = three_named_pools
    config = replace(FAST, resolve_host=dns.resolve)
    job = _job()
    with PoolClient(addresses, config.pool_client_config()) as client:
        backend = RemoteReadBackend.connect(client, job, (0, 127), config)
        keys = keyed_keys(40, seed=8)
        backend.put_many(OP_COUNT, keys, [b"v%d" % i for i in range(len(keys))])
        backend.snapshot(1)
        backend.put(OP_COUNT, keys[0], b"live")
        model = {(OP_COUNT, k): b"v%d" % i for i, k in enumerate(keys)} | {(OP_COUNT, keys[0]): b"live"}
        backend.serve_live_export(config=LiveExportConfig(ttl_s=30))
        for i in range(3):  # each pool behind the name holds the announcement
            status, body = _live(pools.server(i).http_port or 0, job)
            assert status == 200, (i, body)
            assert table_model(snapshot.read_snapshot(body).table) == in_range(model, 0, 127)
        backend.close()
        assert [_live(pools.server(i).http_port or 0, job)[0] for i in range(3)] == [404, 404, 404]


def test_a_dns_name_through_the_system_resolver_reaches_its_pool() -> None:
    with running_pools(MemoryStore(), n=1) as pools, PoolClient(f"dns:///localhost:{pools.ports[0]}", FAST.pool_client_config()) as client:
        client.wait_ready(10)
        assert client.list_jobs() == [] and pools.served(0, "ListJobs") == 1


# -- the clink CLI: grpc:// sources and --store take every form ---------------------------------------------------


def test_clink_reads_a_pool_source_through_a_comma_list_even_with_one_pool_down(file_store: ObjectStore, tmp_path) -> None:
    from clink.cli.common import EXIT_UNAVAILABLE, EXIT_USAGE
    from tests.cli_fixtures import commit_checkpoints, generated_table, one_line_error, rows_of, run

    table = generated_table(31, keyed_rows=200)
    commit_checkpoints(file_store, "orders", [table])
    with running_pools(file_store) as pools:
        source = f"grpc://{pools.address}/orders"
        result = run(["state-cat", source, "--limit", "0", "-o", "json"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["total_rows"] == table.num_rows
        pools.stop(0)
        pools.stop(2)
        out = tmp_path / "orders.arrow"
        result = run(["state-export", "--from", f"{source}/chk-1", "--out", str(out)])  # two of three pools down
        assert result.exit_code == 0, result.output
        assert rows_of(snapshot.read_snapshot(out.read_bytes()).table) == rows_of(table)
        pools.stop(1)
        result = run(["--pool-timeout", "2", "state-cat", source])
        assert result.exit_code == EXIT_UNAVAILABLE
        assert all(a in one_line_error(result) for a in pools.addresses), one_line_error(result)
    result = run(["state-cat", "grpc://127.0.0.1:1,,127.0.0.1:2/orders"])
    assert result.exit_code == EXIT_USAGE and "entry 2 of 3 is empty" in one_line_error(result)
    result = run(["state-cat", "grpc://127.0.0.1:1,127.0.0.1:x/orders"])
    assert result.exit_code == EXIT_USAGE and "'127.0.0.1:x' has a bad port" in one_line_error(result)


def test_clink_reads_a_pool_source_through_a_dns_name() -> None:
    from tests.cli_fixtures import run

    with running_pools(MemoryStore(), n=1) as pools:
        job = ModelJob(pools.address, _job(), [(0, 127)], FAST, seed=2)
        job.write(40)
        job.checkpoint()
        result = run(["state-cat", f"grpc://dns:///localhost:{pools.ports[0]}/{job.job}", "--limit", "0", "-o", "json"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["total_rows"] == len(job.model)
        job.close()


def test_the_help_of_clink_teaches_the_forms() -> None:
    from tests.cli_fixtures import run

    text = run(["state-cat", "--help"]).stdout
    assert "grpc://H1:P1,H2:P2,H3:P3/JOB" in text and "grpc://dns:///NAME:PORT/JOB" in text


def test_store_option_takes_a_comma_list_or_a_dns_name_and_names_a_bad_entry() -> None:
    from clink.tools.handle_store import _pool_address

    assert _pool_address("grpc://a:1,b:2") == "a:1,b:2"
    assert _pool_address("pool://dns:///pools.internal:7420/") == "dns:///pools.internal:7420"
    with pytest.raises(InvalidArgumentError, match="'b:2x' has a bad port"):
        _pool_address("grpc://a:1,b:2x")
    with pytest.raises(InvalidArgumentError, match="no job or path"):
        _pool_address("grpc://a:1,b:2/orders")


def test_a_token_is_refused_in_plaintext_to_any_remote_host_of_a_list() -> None:
    from clink.tools.sources import SourceConfig, check_pool_token_transport

    config = SourceConfig(pool_token="secret")
    check_pool_token_transport(config, "127.0.0.1:1,localhost:2,[::1]:3", "pool")  # loopback only: allowed
    with pytest.raises(InvalidArgumentError, match="plaintext to pool-b"):
        check_pool_token_transport(config, "127.0.0.1:1,pool-b:2", "pool")
    with pytest.raises(InvalidArgumentError, match="plaintext to pools.internal"):
        check_pool_token_transport(config, "dns:///pools.internal:7420", "pool")
