"""Helpers for the CLI tests: generated snapshots with a per-row model, checkpoints committed through PoolCore, a CLI runner."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pyarrow as pa
from click.testing import CliRunner

import snapshot as s

VECTORS = (
    Path(__file__).resolve().parents[1] / "format-vectors"
)  # a copy of ../shared/format-vectors (test_format_vectors checks they agree)
UIDS = ("source", "window", "sink")
OP_IDS = {uid: s.operator_id(uid) for uid in UIDS}
OPERATOR_PAIRS = tuple((OP_IDS[u], u) for u in UIDS)
STATE_VERSIONS = s.StateVersionMap({(OP_IDS["window"], "ValueState"): 3, (OP_IDS["sink"], "MapState"): 1})


def generated_table(seed: int, keyed_rows: int = 400, operator_rows: int = 6, raw_rows: int = 0) -> pa.Table:
    """A canonical table over three operators: int64 keys (slot count), text keys (profile), binary keys with '|' (blob), operator offsets."""
    rng = random.Random(seed)
    rows: dict[tuple[int, bytes], bytes] = {}
    ops = list(OP_IDS.values())
    while len(rows) < keyed_rows:
        op = rng.choice(ops)
        pick = rng.random()
        if pick < 0.5:
            key = s.encode_keyed_key("count", rng.randrange(-(1 << 40), 1 << 40).to_bytes(8, "little", signed=True))
            value = rng.randrange(0, 1 << 20).to_bytes(8, "little")
        elif pick < 0.8:
            key = s.encode_keyed_key("profile", f"user-{rng.randrange(10**6)}-ключ".encode())
            value = f'{{"n":{rng.randrange(100)}}}'.encode()
        else:
            key = s.encode_keyed_key("blob", bytes(rng.randrange(256) for _ in range(rng.randrange(0, 12))) + b"|x")
            value = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40)))
        rows[(op, key)] = value
    for i in range(operator_rows):
        rows[(ops[i % len(ops)], s.encode_operator_key("offsets", f"partition-{i}".encode()))] = (1000 + i).to_bytes(8, "little")
    for i in range(raw_rows):
        rows[(ops[0], f"legacy{i}".encode())] = b"raw"
    items = sorted(rows.items())
    rng.shuffle(items)
    return pa.table(
        {
            "op_id": pa.array([k[0] for k, _ in items], pa.uint64()),
            "key_bytes": pa.array([k[1] for k, _ in items], pa.binary()),
            "value_bytes": pa.array([v for _, v in items], pa.binary()),
        }
    )


def write_table(path: Path, table: pa.Table, versions: s.StateVersionMap | None = STATE_VERSIONS) -> Path:
    """Write a canonical snapshot file."""
    path.write_bytes(s.write_snapshot(table, versions))
    return path


def rows_of(table: pa.Table) -> dict[tuple[int, bytes], bytes]:
    """The model: (op_id, key_bytes) -> value_bytes."""
    d = table.to_pydict()
    return dict(zip(zip(d["op_id"], d["key_bytes"], strict=True), d["value_bytes"], strict=True))


def slot_counts(table: pa.Table) -> Counter:
    """Rows per slot, decoded row by row with the reference decode_key (the model for the vectorised projections)."""
    return Counter(s.decode_key(k).slot for k in table.column("key_bytes").to_pylist())


def commit_checkpoints(store, job: str, tables: list[pa.Table], versions: s.StateVersionMap = STATE_VERSIONS) -> list[int]:
    """Commit each table as the full state of checkpoint 1, 2, ... of ``job`` through PoolCore (deltas computed from the model)."""
    from pool.core import PoolCore
    from pool.domain import CommitRequest, KeyGroupRange

    core = PoolCore(store)
    full = KeyGroupRange(0, s.NUM_KEY_GROUPS - 1)
    epoch, _ = core.acquire_writer(job, full)
    previous: dict[tuple[int, bytes], bytes] = {}
    ids = []
    for i, table in enumerate(tables, start=1):
        current = rows_of(table)
        kinds, ops, keys, values = [], [], [], []
        for (op, key), value in current.items():
            if previous.get((op, key)) != value:
                kinds.append(s.ROW_PUT), ops.append(op), keys.append(key), values.append(value)
        for op, key in previous.keys() - current.keys():
            kinds.append(s.ROW_ERASE), ops.append(op), keys.append(key), values.append(b"")
        delta = pa.table(
            {
                "row_kind": pa.array(kinds, pa.uint8()),
                "op_id": pa.array(ops, pa.uint64()),
                "key_bytes": pa.array(keys, pa.binary()),
                "value_bytes": pa.array(values, pa.binary()),
            }
        )
        blob = s.write_snapshot(delta, versions, changelog=True)
        core.commit_checkpoint(CommitRequest(job, i, i - 1, full, epoch, versions.pack(), OPERATOR_PAIRS), [blob])
        ids.append(i)
        previous = current
    return ids


def run(args: list[str], **kwargs):
    """Invoke the clink group in process; the group's own handler maps errors to exit codes."""
    from clink.cli.state import cli

    return CliRunner().invoke(cli, args, catch_exceptions=False, **kwargs)


def one_line_error(result) -> str:
    """Assert stderr is exactly one 'clink...: error' line (no traceback) and return it."""
    err = result.stderr.strip()
    assert "Traceback" not in result.output + result.stderr
    lines = err.splitlines()
    assert len(lines) == 1, f"expected one error line, got: {err!r}"
    assert "error" in lines[0]
    return lines[0]
