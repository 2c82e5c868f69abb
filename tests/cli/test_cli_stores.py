"""The clink CLI on checkpoints in object stores (a local directory and moto S3), and check-savepoint catching damage."""

from __future__ import annotations

import hashlib
import json
import zlib
from collections import Counter

import duckdb
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

import snapshot as s
from clink.cli.common import EXIT_DATA, EXIT_NOT_FOUND
from store.block_index import parse_block_index, parse_index_top
from store.manifest import job_prefix, metadata_key
from tests.cli_fixtures import OP_IDS, STATE_VERSIONS, commit_checkpoints, generated_table, one_line_error, rows_of, run, slot_counts

JOB = "orders"


@pytest.fixture
def s3_env(s3_config) -> dict[str, str]:
    """Environment for a CLI talking to moto: dummy credentials; the endpoint comes from --s3-endpoint-url or AWS_ENDPOINT_URL."""
    return {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture
def two_checkpoints(store):
    """Checkpoints 1 and 2 of JOB in the (file or S3) store, and their tables."""
    t1, t2 = generated_table(31, keyed_rows=300), generated_table(32, keyed_rows=350, operator_rows=3)
    commit_checkpoints(store, JOB, [t1, t2])
    return store, t1, t2


def _args(store, s3_config) -> list[str]:
    return ["--s3-endpoint-url", s3_config.endpoint_url] if store.uri.startswith("s3://") else []


def _chk(store, cid: int, suffix: str = "") -> str:
    return f"{store.uri}/jobs/{JOB}/chk-{cid}{suffix}"


def test_cat_and_export_read_exactly_the_committed_state(two_checkpoints, s3_config, s3_env, tmp_path) -> None:
    store, t1, t2 = two_checkpoints
    pre = _args(store, s3_config)
    for cid, table in ((1, t1), (2, t2)):
        for suffix in ("", "/_metadata"):
            out = tmp_path / f"c{cid}{'m' if suffix else ''}.arrow"
            result = run([*pre, "state-export", "--from", _chk(store, cid, suffix), "--out", str(out)], env=s3_env)
            assert result.exit_code == 0, result.output
            back = s.read_snapshot(out.read_bytes())
            assert rows_of(back.table) == rows_of(table)
            assert back.state_versions == STATE_VERSIONS
    result = run([*pre, "state-cat", _chk(store, 2), "--limit", "0", "-o", "json"], env=s3_env)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["total_rows"] == t2.num_rows
    assert {r["uid"] for r in doc["rows"]} == {"source", "window", "sink"}  # uids come from the manifest
    assert Counter(r["slot"] for r in doc["rows"]) == slot_counts(t2)


def test_diff_between_checkpoints_matches_the_model(two_checkpoints, s3_config, s3_env) -> None:
    store, t1, t2 = two_checkpoints
    a, b = rows_of(t1), rows_of(t2)
    result = run([*_args(store, s3_config), "state-diff", _chk(store, 1), _chk(store, 2), "-o", "json"], env=s3_env)
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    assert doc["added"] == len(b.keys() - a.keys())
    assert doc["removed"] == len(a.keys() - b.keys())
    assert doc["changed"] == sum(1 for k in a.keys() & b.keys() if a[k] != b[k])
    same = run([*_args(store, s3_config), "state-diff", _chk(store, 2), _chk(store, 2, "/_metadata")], env=s3_env)
    assert same.exit_code == 0, same.output


def test_query_and_parquet_on_a_checkpoint_with_pushdown(two_checkpoints, s3_config, s3_env, tmp_path) -> None:
    store, _, t2 = two_checkpoints
    pre = _args(store, s3_config)
    out = tmp_path / "state.parquet"
    result = run([*pre, "state-export", "--from", _chk(store, 2), "--out", str(out), "--key-groups", "32-95"], env=s3_env)
    assert result.exit_code == 0, result.output
    want = s.filter_key_groups(t2, 32, 95)
    got = dict(duckdb.connect().execute(f"SELECT slot, count(*) FROM '{out}' GROUP BY slot").fetchall())
    assert got == dict(slot_counts(want))
    result = run([*pre, "state-query", _chk(store, 2), "SELECT count(*) AS n FROM state", "--op", "uid:sink", "-o", "json"], env=s3_env)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["rows"][0]["n"] == sum(1 for op, _ in rows_of(t2) if op == OP_IDS["sink"])


def test_s3_endpoint_from_environment(make_s3_store, s3_config, s3_env, tmp_path) -> None:
    store = make_s3_store(prefix="deep/er")
    table = generated_table(41, keyed_rows=50)
    commit_checkpoints(store, JOB, [table])
    result = run(["state-cat", _chk(store, 1), "-o", "json", "--limit", "0"], env={**s3_env, "AWS_ENDPOINT_URL": s3_config.endpoint_url})
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["total_rows"] == table.num_rows


def test_unknown_checkpoint_and_bucket_are_one_line_errors(two_checkpoints, s3_config, s3_env) -> None:
    store, _, _ = two_checkpoints
    result = run([*_args(store, s3_config), "state-cat", _chk(store, 9)], env=s3_env)
    assert result.exit_code == EXIT_NOT_FOUND
    assert "checkpoint 9" in one_line_error(result)
    result = run([*_args(store, s3_config), "check-savepoint", _chk(store, 9)], env=s3_env)
    assert result.exit_code == EXIT_NOT_FOUND
    one_line_error(result)


# --- check-savepoint on stored checkpoints --------------------------------------------------------------------


def _manifest(store, cid: int) -> dict:
    return json.loads(store.get(metadata_key(JOB, cid)))


def _put_manifest(store, cid: int, doc: dict) -> None:
    store.put(metadata_key(JOB, cid), json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())


def _check(store, s3_config, s3_env, cid: int = 2, *extra: str) -> tuple[int, dict]:
    result = run([*_args(store, s3_config), "check-savepoint", _chk(store, cid), "-o", "json", *extra], env=s3_env)
    assert "Traceback" not in result.output
    return result.exit_code, json.loads(result.stdout)


def _fails(doc: dict) -> list[dict]:
    return [f for f in doc["findings"] if f["status"] == "fail"]


def test_check_passes_on_an_intact_checkpoint(two_checkpoints, s3_config, s3_env) -> None:
    store, _, t2 = two_checkpoints
    code, doc = _check(store, s3_config, s3_env, 2, "--expect-uid", "source", "--expect-uid", "window", "--expect-uid", "sink")
    assert code == 0, doc
    assert doc["rows"] == t2.num_rows and doc["files_checked"] == len(_manifest(store, 2)["files"]) >= 2


def test_check_names_a_file_with_a_flipped_byte(two_checkpoints, s3_config, s3_env) -> None:
    store, _, _ = two_checkpoints
    victim = _manifest(store, 2)["files"][0]["path"]
    data = bytearray(store.get(job_prefix(JOB) + victim))
    data[len(data) // 2] ^= 0x01
    store.put(job_prefix(JOB) + victim, bytes(data))
    code, doc = _check(store, s3_config, s3_env)
    assert code == 1
    fails = _fails(doc)
    assert [(f["check"], f["path"]) for f in fails] == [("checksum", victim)]
    assert "sha256" in fails[0]["detail"]
    # reading it is refused too, naming the file
    result = run([*_args(store, s3_config), "state-cat", _chk(store, 2)], env=s3_env)
    assert result.exit_code == EXIT_DATA and victim in one_line_error(result)


def test_check_names_a_missing_file(two_checkpoints, s3_config, s3_env) -> None:
    store, _, _ = two_checkpoints
    files = [f["path"] for f in _manifest(store, 2)["files"]]
    store.delete(job_prefix(JOB) + files[-1])
    code, doc = _check(store, s3_config, s3_env)
    assert code == 1
    fails = _fails(doc)
    assert [(f["check"], f["path"]) for f in fails] == [("presence", files[-1])]
    assert "missing" in fails[0]["detail"]


def _blocks_in_segment(data: bytes, index: list[int], seg: dict) -> int:
    """How many blocks (record batches) a segment of a block-indexed file holds, from its index's partitions."""
    offset, top_len, crc, _ = index
    top = parse_index_top(data[offset : offset + top_len], "x", crc, seg["offset"], seg["offset"] + seg["length"], seg["rows"])
    return sum(
        len(parse_block_index(data[offset + int(a) : offset + int(a) + int(n)], "x", int(c), int(s0), int(e0), int(r)).first_keys)
        for a, n, c, s0, e0, r in zip(top.text_offsets, top.text_lengths, top.crcs, top.starts, top.ends, top.rows, strict=True)
    )


def test_check_names_a_file_with_a_future_format_version(two_checkpoints, s3_config, s3_env) -> None:
    store, _, _ = two_checkpoints
    doc = _manifest(store, 2)
    entry = doc["files"][-1]
    old = store.get(job_prefix(JOB) + entry["path"])
    assert entry["encoding"] == "arrow-file"
    # rewrite the Arrow IPC file with format version 2 and make the manifest's checksums match, so only the version is wrong
    reader = ipc.open_file(pa.py_buffer(old))
    meta = {**(reader.schema.metadata or {}), b"clink.format_version": b"2"}
    sink = pa.BufferOutputStream()
    batches = iter(reader.get_batch(i) for i in range(reader.num_record_batches))
    with ipc.new_file(sink, reader.schema.with_metadata(meta)) as w:
        for seg in entry["segments"]:
            index = seg.pop("index")  # the rewritten file carries no block index: whole-segment reads
            blocks = _blocks_in_segment(old, index, seg)
            start = None
            for _ in range(blocks):
                batch = next(batches)
                w.write_batch(batch)
                start = sink.tell() - batch.serialize().size if start is None else start
            seg.update(offset=start, length=sink.tell() - start)
    new = sink.getvalue().to_pybytes()
    for seg in entry["segments"]:
        seg.update(crc32=zlib.crc32(new[seg["offset"] : seg["offset"] + seg["length"]]))
    entry.update(size=len(new), sha256=hashlib.sha256(new).hexdigest())
    store.put(job_prefix(JOB) + entry["path"], new)
    _put_manifest(store, 2, doc)
    code, report = _check(store, s3_config, s3_env)
    assert code == 1
    fails = _fails(report)
    assert [(f["check"], f["path"]) for f in fails] == [("format version", entry["path"])]
    assert "version 2" in fails[0]["detail"]


def test_check_lists_unexpected_and_absent_operators(two_checkpoints, s3_config, s3_env) -> None:
    store, _, _ = two_checkpoints
    code, doc = _check(store, s3_config, s3_env, 2, "--expect-uid", "source", "--expect-uid", "window", "--expect-uid", "enricher")
    assert code == 1
    details = [f["detail"] for f in _fails(doc)]
    assert len(details) == 2
    assert any("'sink'" in d and "present but not expected" in d for d in details)
    assert any("'enricher'" in d and "expected but absent" in d for d in details)
    # by op_id as well as by uid
    code, doc = _check(
        store, s3_config, s3_env, 2, "--expect-op", str(OP_IDS["source"]), "--expect-op", hex(OP_IDS["window"]), "--expect-op", "uid:sink"
    )
    assert code == 0, doc


def test_check_reports_a_corrupt_manifest(two_checkpoints, s3_config, s3_env) -> None:
    store, _, _ = two_checkpoints
    store.put(metadata_key(JOB, 2), b"{not json")
    code, doc = _check(store, s3_config, s3_env)
    assert code == 1
    fails = _fails(doc)
    assert fails[0]["check"] == "manifest" and fails[0]["path"] == "_metadata"


# --- savepoints: a self-contained copy (manifest plus the files it names) under savepoints/<name>/ -------------


def _copy_to_savepoint(src_store, dst_store, name: str, cid: int = 2) -> list[str]:
    """Copy checkpoint cid of JOB to savepoints/<name>/ of another store; returns the data file paths."""
    manifest = src_store.get(metadata_key(JOB, cid))
    paths = [f["path"] for f in json.loads(manifest)["files"]]
    for path in paths:
        dst_store.put(f"savepoints/{name}/{path}", src_store.get(job_prefix(JOB) + path))
    dst_store.put(f"savepoints/{name}/_metadata", manifest)
    return paths


@pytest.fixture
def savepoint(two_checkpoints, make_file_store, make_s3_store):
    """Checkpoint 2 copied to savepoints/release-1 of a different store of the same kind (relocated)."""
    store, _, t2 = two_checkpoints
    other = make_s3_store(prefix="archive") if store.uri.startswith("s3://") else make_file_store("archive")
    paths = _copy_to_savepoint(store, other, "release-1")
    return store, other, t2, paths


def test_savepoint_reads_as_the_checkpoint_it_was_copied_from(savepoint, s3_config, s3_env) -> None:
    store, other, t2, _ = savepoint
    pre = _args(store, s3_config)
    for src in (f"{other.uri}/savepoints/release-1", f"{other.uri}/savepoints/release-1/_metadata"):
        result = run([*pre, "state-cat", src, "--limit", "0", "-o", "json"], env=s3_env)
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["total_rows"] == t2.num_rows
    same = run([*pre, "state-diff", f"{other.uri}/savepoints/release-1", _chk(store, 2)], env=s3_env)
    assert same.exit_code == 0, same.output
    result = run(
        [
            *pre,
            "check-savepoint",
            f"{other.uri}/savepoints/release-1",
            "-o",
            "json",
            *sum((["--expect-uid", u] for u in ("source", "window", "sink")), []),
        ],
        env=s3_env,
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["rows"] == t2.num_rows


def test_check_savepoint_names_damaged_and_missing_files(savepoint, s3_config, s3_env) -> None:
    store, other, _, paths = savepoint
    pre = _args(store, s3_config)
    data = bytearray(other.get(f"savepoints/release-1/{paths[0]}"))
    data[-3] ^= 0x40
    other.put(f"savepoints/release-1/{paths[0]}", bytes(data))
    other.delete(f"savepoints/release-1/{paths[-1]}")
    result = run([*pre, "check-savepoint", f"{other.uri}/savepoints/release-1", "-o", "json"], env=s3_env)
    assert result.exit_code == 1, result.output
    fails = [(f["check"], f["path"]) for f in json.loads(result.stdout)["findings"] if f["status"] == "fail"]
    assert sorted(fails) == sorted([("checksum", paths[0]), ("presence", paths[-1])])
    missing = run([*pre, "check-savepoint", f"{other.uri}/savepoints/nope"], env=s3_env)
    assert missing.exit_code == EXIT_NOT_FOUND
    assert "nope" in one_line_error(missing)


def test_savepoint_written_by_the_pool_lifecycle(two_checkpoints, make_file_store, make_s3_store, s3_config, s3_env) -> None:
    """A savepoint as the pool writes it (layers folded into one base, relocated to another store) reads and checks clean."""
    from pool.lifecycle import Lifecycle

    store, _, t2 = two_checkpoints
    target = make_s3_store(prefix="vault") if store.uri.startswith("s3://") else make_file_store("vault")
    info = Lifecycle(store).savepoint(JOB, 2, "release-2", target_store=target)
    pre = _args(store, s3_config)
    src = f"{target.uri}/savepoints/release-2"
    result = run([*pre, "state-cat", src, "--limit", "0", "-o", "json"], env=s3_env)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["total_rows"] == t2.num_rows == info.rows
    assert run([*pre, "state-diff", src, _chk(store, 2)], env=s3_env).exit_code == 0
    code, doc = _check_src(pre, src, s3_env, "--expect-uid", "source", "--expect-uid", "window")
    assert code == 1
    assert [f["detail"] for f in _fails(doc) if "'sink'" in f["detail"]], doc


def _check_src(pre: list[str], src: str, env: dict, *extra: str) -> tuple[int, dict]:
    result = run([*pre, "check-savepoint", src, "-o", "json", *extra], env=env)
    return result.exit_code, json.loads(result.stdout)
