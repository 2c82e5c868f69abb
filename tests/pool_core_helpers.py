"""Helpers for the pool-core tests: a dict model of checkpoint state and changelog builders."""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from pathlib import Path

import snapshot as s
from pool.core import PoolCore
from pool.domain import CommitRequest, KeyGroupRange
from tests.pool_server_fixtures import changelog_bytes as changelog  # a changelog-variant stream of rows, in order

OPERATORS = ("source", "window", "sink")
OP_IDS = {uid: s.operator_id(uid) for uid in OPERATORS}
OPERATOR_PAIRS = tuple((OP_IDS[u], u) for u in OPERATORS)

Row = tuple[int, int, bytes, bytes]  # (row_kind, op_id, key_bytes, value_bytes)
Model = dict[tuple[int, bytes], bytes]

# a store written by 0.2.0's code, before block indexes (tests/data/store-before-block-index/README.md)
OLD_STORE_FIXTURE = Path(__file__).resolve().parent / "data" / "store-before-block-index"


def old_store_expected() -> dict[int, Model]:
    """The state of each checkpoint of the old store's job, as its expected.json records it."""
    raw = json.loads((OLD_STORE_FIXTURE / "expected.json").read_text())
    return {int(cid): {(op, bytes.fromhex(k)): bytes.fromhex(v) for op, k, v in rows} for cid, rows in raw.items()}


def apply(model: Model, rows: Iterable[Row]) -> None:
    """Apply puts and erases in order (the rows of one delta carry no materialisations)."""
    for kind, op, key, value in rows:
        if kind == s.ROW_ERASE:
            model.pop((op, key), None)
        else:
            model[(op, key)] = value


def keyed(user_key: str) -> bytes:
    """A keyed state key (slot 'v')."""
    return s.encode_keyed_key("v", user_key.encode())


def op_key(name: str) -> bytes:
    """An operator-state key (slot 'o')."""
    return s.encode_operator_key("o", name.encode())


def keys_in_range(lo: int, hi: int, count: int, tag: str = "k") -> list[str]:
    """``count`` user keys whose key groups lie in lo..hi."""
    out, i = [], 0
    while len(out) < count:
        name = f"{tag}{i}"
        if lo <= s.key_group(name.encode()) <= hi:
            out.append(name)
        i += 1
    return out


def random_delta(rng: random.Random, model: Model, universe: list[str], op_keys: list[str], n: int, step: int) -> list[Row]:
    """Puts of new keys, overwrites and erases of existing ones, across every operator."""
    rows: list[Row] = []
    for j in range(n):
        op = OP_IDS[rng.choice(OPERATORS)]
        key = op_key(rng.choice(op_keys)) if op_keys and rng.random() < 0.1 else keyed(rng.choice(universe))
        if (op, key) in model and rng.random() < 0.3:
            rows.append((s.ROW_ERASE, op, key, b""))
        else:
            rows.append((s.ROW_PUT, op, key, f"v{step}-{j}-{rng.random():.6f}".encode()))
    return rows


def scan_dict(core: PoolCore, job: str, cid: int, kg: KeyGroupRange | None = None, op_ids=(), delta: bytes | None = None) -> Model:
    """The scan of a checkpoint as a dict; asserts one RecordBatch and no duplicate keys."""
    blob = b"".join(core.scan(job, cid, kg, list(op_ids), delta))
    snap = s.read_snapshot(blob)
    assert not snap.is_changelog
    table = snap.table
    out = dict(
        zip(
            zip(table.column("op_id").to_pylist(), table.column("key_bytes").to_pylist(), strict=True),
            table.column("value_bytes").to_pylist(),
            strict=True,
        )
    )
    assert len(out) == table.num_rows, "scan returned a key twice"
    return out


def filter_model(model: Model, lo: int, hi: int, op_ids=()) -> Model:
    """The model restricted to key groups lo..hi (operator-state rows always kept) and optional op_ids."""
    return {k: v for k, v in model.items() if (k[1][0] >= 128 or lo <= k[1][0] <= hi) and (not op_ids or k[0] in op_ids)}


def commit(core: PoolCore, job: str, cid: int, parent: int, kg: KeyGroupRange, epoch: int, rows: list[Row]):
    """Commit ``rows`` as the delta of one range of checkpoint cid."""
    blob = changelog(rows)
    chunks = [blob[i : i + 1000] for i in range(0, len(blob), 1000)]
    return core.commit_checkpoint(CommitRequest(job, cid, parent, kg, epoch, "", OPERATOR_PAIRS), chunks)
