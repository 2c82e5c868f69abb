"""clink with --store: changelog snapshots with materialisation handles exported, shown and diffed; bad handles named."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

import snapshot
from client import BackendConfig, RemoteReadBackend
from clink.cli.common import EXIT_DATA, EXIT_NOT_FOUND, EXIT_OK
from snapshot.handles import handle_positions
from tests.cli_fixtures import one_line_error, run
from tests.client_fixtures import OP_COUNT, keyed_keys, serving

JOB = "orders"


@pytest.fixture
def exported(tmp_path, make_file_store, make_s3_store, s3_config, request):
    """(store args, changelog path, full export path, pool address) of a backend with a checkpoint and a hot delta."""
    kind = getattr(request, "param", "file")
    store = make_file_store("pool") if kind == "file" else make_s3_store(prefix="pool")
    keys = keyed_keys(200, seed=3)
    with serving(store) as address:
        with RemoteReadBackend.connect(address, JOB, (0, 127), BackendConfig()) as backend:
            backend.restore()
            backend.put_many(OP_COUNT, keys, [b"v%d" % i for i in range(len(keys))])
            backend.snapshot(1)
            for k in keys[:5]:
                backend.erase(OP_COUNT, k)
            backend.put(OP_COUNT, keys[5], b"changed")
            changelog, full = tmp_path / "changelog.snap", tmp_path / "full.arrow"
            changelog.write_bytes(backend.export_changelog_snapshot())
            full.write_bytes(backend.export_arrow_snapshot())
        s3 = ["--s3-endpoint-url", s3_config.endpoint_url] if kind == "s3" else []
        yield store, s3, changelog, full, address


def _same(got: Path, want: Path) -> None:
    a, b = snapshot.read_snapshot(got.read_bytes()), snapshot.read_snapshot(want.read_bytes())
    assert snapshot.sort_for_layout(a.table).equals(snapshot.sort_for_layout(b.table))
    assert a.metadata == b.metadata


@pytest.mark.parametrize("exported", ["file", "s3"], indirect=True)
def test_state_export_with_store_equals_the_full_export(exported, tmp_path, s3_cli_env) -> None:
    store, s3, changelog, full, address = exported
    for i, where in enumerate((store.uri, f"grpc://{address}", f"pool://{address}")):
        out = tmp_path / f"state-{i}.arrow"
        result = run(["state-export", "--from", str(changelog), "--store", where, "--out", str(out), *s3], env=s3_cli_env)
        assert result.exit_code == EXIT_OK, result.output + result.stderr
        _same(out, full)


def test_state_cat_and_diff_take_store(exported) -> None:
    store, _, changelog, full, _ = exported
    cat = run(["state-cat", str(changelog), "--store", store.uri, "-o", "json", "--limit", "0"])
    assert cat.exit_code == EXIT_OK, cat.stderr
    want = run(["state-cat", str(full), "-o", "json", "--limit", "0"])
    assert json.loads(cat.stdout)["rows"] == json.loads(want.stdout)["rows"]
    same = run(["--store", store.uri, "state-diff", str(changelog), str(full)])  # the option before the command too
    assert same.exit_code == EXIT_OK, same.stdout + same.stderr


def _tamper(source: Path, /, **changes: object) -> Path:
    snap = snapshot.read_snapshot(source.read_bytes(), handles=True)
    table = snap.table
    pos = int(handle_positions(table)[0])
    values = table.column("value_bytes").to_pylist()
    values[pos] = json.dumps({**json.loads(values[pos]), **changes}).encode()
    table = table.set_column(3, "value_bytes", pa.array(values, pa.binary()))
    out = source.with_name("tampered.snap")
    out.write_bytes(snapshot.write_snapshot(table, snap.state_versions, snap.extra_metadata, changelog=True))
    return out


@pytest.mark.parametrize(
    ("changes", "code", "named"),
    [
        ({"commit_sha256": "f" * 64}, EXIT_DATA, "checkpoint 1 of job orders"),
        ({"checkpoint": 4}, EXIT_NOT_FOUND, "checkpoint 4 of job orders"),
        ({"job": "payments"}, EXIT_NOT_FOUND, "job payments"),
        ({"kind": "file", "path": "a/../../etc/passwd", "sha256": "0" * 64, "rows": 0}, EXIT_DATA, "a/../../etc/passwd"),
    ],
)
def test_a_bad_handle_is_one_line_naming_it_and_writes_nothing(exported, tmp_path, changes, code, named) -> None:
    store, _, changelog, _, address = exported
    bad = _tamper(changelog, **changes)
    for where in (store.uri, f"grpc://{address}"):
        out = tmp_path / "out.arrow"
        result = run(["state-export", "--from", str(bad), "--store", where, "--out", str(out)])
        assert result.exit_code == code
        assert named in one_line_error(result)
        assert not out.exists()
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(("out", ".out"))]  # no partial or temporary file


def test_without_store_it_says_store_is_needed(exported, tmp_path) -> None:
    _, _, changelog, _, _ = exported
    for args in (["state-export", "--from", str(changelog), "--out", str(tmp_path / "x.arrow")], ["state-cat", str(changelog)]):
        result = run(args)
        assert result.exit_code == EXIT_DATA
        line = one_line_error(result)
        assert "--store" in line and "checkpoint 1 of job orders, key groups 0-127" in line
    assert not (tmp_path / "x.arrow").exists()


def test_a_store_without_the_checkpoint_is_not_found(exported, tmp_path) -> None:
    _, _, changelog, _, _ = exported
    empty = tmp_path / "empty-store"
    empty.mkdir()
    result = run(["state-cat", str(changelog), "--store", empty.as_uri()])
    assert result.exit_code == EXIT_NOT_FOUND
    assert "checkpoint 1 of job orders" in one_line_error(result)


def test_a_malformed_pool_store_is_usage(exported) -> None:
    _, _, changelog, _, address = exported
    result = run(["state-cat", str(changelog), "--store", f"grpc://{address}/orders"])
    assert result.exit_code == 2
    assert "grpc://HOST:PORT" in one_line_error(result)
