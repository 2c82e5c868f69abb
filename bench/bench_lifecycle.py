"""Lifecycle benchmark: bytes fetched to restore 1/8 of the key groups, and scan time over 50 delta layers before/after compaction.

Run: /tmp/venv/bin/python bench/bench_lifecycle.py [--rows 1000000] [--layers 50] [--store s3|file]
Bytes are counted at the store (store.counters); an s3 run uses an in-process moto server on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_pool import OPERATORS, make_delta, make_state  # noqa: E402
from pool.core import PoolCore  # noqa: E402
from pool.domain import FULL_RANGE, CommitRequest, PoolConfig  # noqa: E402
from pool.importer import Importer, subtask_ranges  # noqa: E402
from pool.lifecycle import Lifecycle, LifecycleConfig  # noqa: E402
from snapshot import NUM_KEY_GROUPS, ROW_PUT, encode_operator_key, write_snapshot  # noqa: E402
from store.objects import StoreConfig, open_store  # noqa: E402
from store.segment_cache import SegmentCache  # noqa: E402

EIGHTH = (16, 16 + NUM_KEY_GROUPS // 8 - 1)
TARGET_RATIO = 1.25  # x 1/8 of the bytes, plus a fixed overhead per file
ANATOMY_TARGET = 0.25  # deriving the anatomy: at most this share of writing the _metadata that carries it


def anatomy_cost(files: int, segments: int, repeats: int) -> dict[str, float]:
    """Seconds to derive the anatomy of a manifest of `files` files x `segments` segments, against its whole to_json."""
    from store.anatomy import anatomy
    from store.datafile import DataFile, OperatorStats, Segment
    from store.manifest import MANIFEST_FORMAT, Manifest, Part

    entries = [
        DataFile(
            path=f"data/{i:032x}.arrow",
            kind="base" if i < 4 else "delta",
            kg_lo=0,
            kg_hi=NUM_KEY_GROUPS - 1,
            rows=10 * segments,
            size=1000 * segments,
            sha256="0" * 64,
            segments=tuple(Segment(j * 1000, 1000, 10, j, j % NUM_KEY_GROUPS, j % NUM_KEY_GROUPS) for j in range(segments)),
            as_of=i,
            operators=tuple(OperatorStats(op, 5 * segments, 50 * segments) for op in (1, 2)),
        )
        for i in range(files)
    ]
    paths = [f.path for f in entries]
    parts = tuple(Part(p * 32, p * 32 + 31, 1, 0, tuple((x,) for x in paths[p::4])) for p in range(4))
    m = Manifest(MANIFEST_FORMAT, "bench", files, files - 1, 0, ((1, "a"), (2, "b")), "", parts, tuple(entries))
    derive = write = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        m.to_json()
        t1 = time.perf_counter()
        anatomy(m)
        t2 = time.perf_counter()
        write, derive = min(write, t1 - t0), min(derive, t2 - t1)
    return {
        "files": files,
        "segments": segments,
        "to_json_s": round(write, 3),
        "anatomy_s": round(derive, 3),
        "share": round(derive / write, 3),
        "ok": derive <= ANATOMY_TARGET * write,
    }


def operator_rows() -> bytes:
    import pyarrow as pa

    keys = [encode_operator_key("offsets", f"partition-{i}".encode()) for i in range(16)]
    table = pa.table(
        {
            "row_kind": pa.array([ROW_PUT] * 16, pa.uint8()),
            "op_id": pa.array([OPERATORS[0]] * 16, pa.uint64()),
            "key_bytes": pa.array(keys, pa.binary()),
            "value_bytes": pa.array([np.int64(i).tobytes() for i in range(16)], pa.binary()),
        }
    )
    return write_snapshot(table, changelog=True)


def commit(core: PoolCore, job: str, cid: int, epoch: int, delta: bytes) -> None:
    request = CommitRequest(job, cid, cid - 1, FULL_RANGE, epoch, "", ((OPERATORS[0], "counter"), (OPERATORS[1], "window")))
    core.commit_checkpoint(request, [delta[i : i + (1 << 20)] for i in range(0, len(delta), 1 << 20)])


def fetch_eighth(store, life: Lifecycle, opener, *args) -> tuple[int, int, int, float]:
    """(bytes fetched for key groups 16..31, data bytes of the source, files it has, seconds) on a cold cache."""
    cold = Lifecycle(store, life.config, cache=SegmentCache(1 << 30))
    reader, manifest, _ = getattr(cold, opener)(*args)
    store.counters.reset()
    started = time.perf_counter()
    table = cold.read_table(reader, manifest, EIGHTH)
    seconds = time.perf_counter() - started
    assert table.num_rows > 0
    return store.counters.bytes_read, manifest.total_bytes, len(manifest.files), seconds


def rescale_reads(store, life: Lifecycle, job: str, cid: int) -> dict[int, dict[str, float]]:
    """A savepoint of the state at parallelism 4, read back by every subtask of parallelism 2, 8 and 3: the worst subtask's
    bytes fetched over its share (its key groups' part of the keyed bytes, plus all operator state, which every subtask reads).
    """
    reader, manifest, _ = life.open_checkpoint(job, cid)
    table = life.read_table(reader, manifest)
    Importer(life.context).import_table("bench-p4", table, dict(manifest.operators), None, 4)
    life.savepoint("bench-p4", 0, "sp-p4")
    _, sp, _ = life.open_savepoint("sp-p4")
    per_group, operator_bytes = sp.stored_bytes_by_key_group
    out = {}
    for parallelism in (2, 8, 3):
        worst = 0.0
        for lo, hi in subtask_ranges(parallelism):
            cold = Lifecycle(store, life.config, cache=SegmentCache(1 << 30))
            cold_reader, cold_manifest, _ = cold.open_savepoint("sp-p4")
            store.counters.reset()
            cold.read_table(cold_reader, cold_manifest, (lo, hi))
            share = sum(per_group[lo : hi + 1]) + operator_bytes
            worst = max(worst, store.counters.bytes_read / share)
        out[parallelism] = {"worst_ratio_to_share": round(worst, 3), "ok": worst <= TARGET_RATIO}
    return out


def scan_seconds(store, life: Lifecycle, job: str, cid: int, repeats: int) -> float:
    """Best cold full scan (fresh cache: every file fetched, layers merged) of a checkpoint."""
    best = float("inf")
    for _ in range(repeats):
        cold = Lifecycle(store, life.config, cache=SegmentCache(1 << 30))
        reader, manifest, _ = cold.open_checkpoint(job, cid)
        started = time.perf_counter()
        cold.read_table(reader, manifest)
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000, help="keys in the state (default 1M)")
    parser.add_argument("--layers", type=int, default=50, help="delta layers on top of the first checkpoint (default 50)")
    parser.add_argument("--delta-fraction", type=float, default=0.01, help="share of the state each delta touches (default 1%%)")
    parser.add_argument("--store", choices=["s3", "file"], default="s3", help="moto S3 (default) or a temp directory")
    parser.add_argument("--segment-kb", type=int, default=64, help="segment target of committed delta files, KiB (pool default 64)")
    parser.add_argument("--repeats", type=int, default=3, help="scan repeats (best kept)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    tmp = tempfile.TemporaryDirectory()
    moto = None
    if args.store == "s3":
        from moto.server import ThreadedMotoServer

        moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        moto.start()
        host, port = moto.get_host_and_port()
        store = open_store(
            "s3://bench-lifecycle/pool",
            StoreConfig(endpoint_url=f"http://{host}:{port}", region="us-east-1", access_key_id="x", secret_access_key="x"),
        )
        store.create_bucket()
    else:
        store = open_store(f"file://{tmp.name}/pool")
    try:
        rng = np.random.default_rng(7)
        core = PoolCore(store, PoolConfig(cache_bytes=64 << 20, segment_target_bytes=args.segment_kb << 10))
        epoch = core.acquire_writer("bench", FULL_RANGE)[0]
        t0 = time.perf_counter()
        user_ints, ops, full = make_state(args.rows, rng)
        commit(core, "bench", 1, epoch, full)
        commit(core, "bench", 2, epoch, operator_rows())
        next_new = args.rows
        for cid in range(3, args.layers + 2):
            commit(core, "bench", cid, epoch, make_delta(user_ints, ops, args.delta_fraction, rng, next_new))
            next_new += args.rows
        last = args.layers + 1
        setup_s = time.perf_counter() - t0
        life = Lifecycle(store, LifecycleConfig(compact_max_layers=8))
        sp = life.savepoint("bench", last, "sp")

        sp_read, sp_bytes, sp_files, _ = fetch_eighth(store, life, "open_savepoint", "sp")
        rescale = rescale_reads(store, life, "bench", last)
        chk_read, chk_bytes, chk_files, _ = fetch_eighth(store, life, "open_checkpoint", "bench", last)
        before = scan_seconds(store, life, "bench", last, args.repeats)
        compaction_t0 = time.perf_counter()
        res = life.compact("bench", last)
        compaction_s = time.perf_counter() - compaction_t0
        after = scan_seconds(store, life, "bench", last, args.repeats)
        cmp_read, cmp_bytes, cmp_files, _ = fetch_eighth(store, life, "open_checkpoint", "bench", last)
    finally:
        if moto is not None:
            moto.stop()
        tmp.cleanup()

    def ratio(read: int, total: int) -> float:
        return read / (total / 8)

    # fixed per-file overhead: folded files have one segment per key group, so only the framing and the operator-state
    # segment are extra (16 KiB); committed deltas clip at segment granularity, so up to a segment at each edge is extra
    overhead = 16 << 10
    layered_overhead = overhead + 2 * (args.segment_kb << 10)
    figures = {
        "rows": args.rows,
        "layers": args.layers + 1,
        "store": args.store,
        "setup_s": round(setup_s, 1),
        "savepoint": {
            "bytes": sp_bytes,
            "files": sp_files,
            "fetched_eighth": sp_read,
            "ratio_to_eighth": round(ratio(sp_read, sp_bytes), 3),
            "ok": sp_read <= TARGET_RATIO * sp_bytes / 8 + overhead * sp_files,
            "overhead_per_file": overhead,
        },
        "checkpoint_layered": {
            "bytes": chk_bytes,
            "files": chk_files,
            "fetched_eighth": chk_read,
            "ratio_to_eighth": round(ratio(chk_read, chk_bytes), 3),
            "ok": chk_read <= TARGET_RATIO * chk_bytes / 8 + layered_overhead * chk_files,
            "overhead_per_file": layered_overhead,
        },
        "checkpoint_compacted": {
            "bytes": cmp_bytes,
            "files": cmp_files,
            "fetched_eighth": cmp_read,
            "ratio_to_eighth": round(ratio(cmp_read, cmp_bytes), 3),
            "ok": cmp_read <= TARGET_RATIO * cmp_bytes / 8 + overhead * cmp_files,
            "overhead_per_file": overhead,
        },
        "scan_s_before_compaction": round(before, 3),
        "scan_s_after_compaction": round(after, 3),
        "scan_speedup": round(before / after, 2),
        "compaction_s": round(compaction_s, 2),
        "folded": [list(f) for f in res.folded],
        "savepoint_rows": sp.rows,
        "rescale_from_parallelism_4": rescale,
        "anatomy_cost": anatomy_cost(2000, NUM_KEY_GROUPS, args.repeats),
    }
    if args.json:
        print(json.dumps(figures))
    else:
        print(
            f"state: {args.rows:,} keys, 1 full + {args.layers} delta checkpoints ({args.delta_fraction:.0%} each) on {args.store}; setup {setup_s:.1f} s"
        )
        for label, key in (
            ("savepoint (folded base)", "savepoint"),
            ("checkpoint, layered", "checkpoint_layered"),
            ("checkpoint, compacted", "checkpoint_compacted"),
        ):
            f = figures[key]
            print(
                f"restore 1/8 of the key groups of the {label}: fetched {f['fetched_eighth']:,} of {f['bytes']:,} bytes in {f['files']} file(s) "
                f"= {f['ratio_to_eighth']:.3f} x 1/8 (target <= {TARGET_RATIO} x 1/8 + {f['overhead_per_file'] >> 10} KiB/file: "
                f"{'ok' if f['ok'] else 'MISSED'})"
            )
        for parallelism, r in rescale.items():
            print(
                f"rescale a parallelism-4 savepoint to {parallelism}: the worst subtask fetched {r['worst_ratio_to_share']:.3f} x its share "
                f"(target <= {TARGET_RATIO}: {'ok' if r['ok'] else 'MISSED'})"
            )
        a = figures["anatomy_cost"]
        print(
            f"anatomy of a _metadata of {a['files']} files x {a['segments']} segments: {a['anatomy_s']:.3f} s of its {a['to_json_s']:.3f} s "
            f"to_json = {a['share']:.2f} (target <= {ANATOMY_TARGET}: {'ok' if a['ok'] else 'MISSED'})"
        )
        print(
            f"full scan with {args.layers + 1} layers: {before:.3f} s; after compaction (1 base): {after:.3f} s; "
            f"before/after = {before / after:.2f}x (compaction took {compaction_s:.2f} s)"
        )
    if not all(figures[k]["ok"] for k in ("savepoint", "checkpoint_layered", "checkpoint_compacted")) or not all(
        r["ok"] for r in rescale.values()
    ):
        sys.exit(1)


if __name__ == "__main__":
    main()
