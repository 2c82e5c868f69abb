"""Benchmark rocksdb_checkpoint_to_arrow of a RocksDB checkpoint vs a raw pyarrow IPC write of the same table, in one run.

When a C compiler and librocksdb-dev are there, bench/rocksdb_native_scan.c is compiled into a temp dir and RocksDB's own
sequential scan of the same checkpoint (every key and value copied into Arrow-ready buffers) is timed beside them: the
floor under any binding, so the ratio can be read against what RocksDB itself can do.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import snapshot  # noqa: E402
from bench.bench_client import VALUE_BYTES, bench_keys, binary_array  # noqa: E402
from client.rocksdb_backend import OP_ID_BYTES, RocksDBStateBackend, rocksdb_checkpoint_to_arrow  # noqa: E402

TARGET_RATIO = 3.0
OPERATORS = ("source", "window", "join", "sink")
NATIVE_SOURCE = Path(__file__).resolve().parent / "rocksdb_native_scan.c"
# the SST format the system librocksdb reads: Debian 12's RocksDB 7.8.3 knows block-based format_version <= 5,
# rocksdict's bundled RocksDB 9.x writes 6 by default
COMPATIBLE_FORMAT_VERSION = 5
COMPILE_TIMEOUT_S = 300
T = TypeVar("T")


def best_of(repeats: int, run: Callable[[], T]) -> tuple[float, T]:
    best, out = float("inf"), None
    for _ in range(repeats):
        started = time.perf_counter()
        out = run()
        best = min(best, time.perf_counter() - started)
    assert out is not None
    return best, out


def raw_ipc_write(table: pa.Table) -> pa.Buffer:
    """The baseline: plain pyarrow writing the table as an IPC stream into memory."""
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def operators_then_keys(table: pa.Table) -> bool:
    """Whether rows are sorted by op_id, then key bytes within an operator (the RocksDB export order), vectorised."""
    n = table.num_rows
    ops = table.column("op_id").to_numpy()
    keys = table.column("key_bytes")
    rising = pc.less(keys.slice(0, n - 1), keys.slice(1)).to_numpy(zero_copy_only=False)
    return bool(((ops[:-1] < ops[1:]) | ((ops[:-1] == ops[1:]) & rising)).all())


def read_all_pairs(path: Path) -> tuple[list[object], list[object]]:
    """Only the RocksDB iteration (every key, every value as Python bytes): the floor the binding sets."""
    from rocksdict import AccessType, Options, Rdict

    db = Rdict(str(path), Options(raw_mode=True), access_type=AccessType.read_only())
    try:
        return list(db.keys()), list(db.values())
    finally:
        db.close()


def compile_native_scan(cc: str, folder: Path) -> tuple[Path | None, str]:
    """The probe compiled into ``folder`` (linked statically when librocksdb.a is there, as rocksdict links RocksDB), or why not."""
    compiler = shutil.which(cc)
    if compiler is None:
        return None, f"no C compiler {cc!r} on PATH"
    out = folder / "rocksdb_native_scan"
    static = subprocess.run([compiler, "-print-file-name=librocksdb.a"], capture_output=True, text=True, check=False).stdout.strip()
    if static and Path(static).is_file():  # gcc echoes the bare name back when it finds no such file
        libs = [static, "-lstdc++", "-lsnappy", "-lz", "-lbz2", "-llz4", "-lzstd", "-lgflags", "-lpthread", "-lm"]
        link = "static"
    else:
        libs, link = ["-lrocksdb"], "shared"
    attempts = [(libs, link), (["-lrocksdb"], "shared")] if link == "static" else [(libs, link)]
    error = ""
    for libs, link in attempts:  # a static archive whose dependencies are missing falls back to the shared library
        proc = subprocess.run(
            [compiler, "-O2", "-o", str(out), str(NATIVE_SOURCE), *libs],
            capture_output=True,
            text=True,
            timeout=COMPILE_TIMEOUT_S,
            check=False,
        )
        if proc.returncode == 0:
            return out, link
        error = next((line for line in proc.stderr.splitlines() if "error" in line), proc.stderr.strip()[:200])
    if "rocksdb/c.h" in error:
        return None, "no RocksDB C header (rocksdb/c.h): install librocksdb-dev"
    return None, f"compiling {NATIVE_SOURCE.name} failed: {' '.join(error.split())}"


def run_native_scan(probe: Path, path: Path, repeats: int) -> tuple[dict[str, dict[str, float]], str]:
    """The probe's JSON line per variant ({variant: {rows, bytes, scan_s, ...}}), or ({}, its one-line error)."""
    proc = subprocess.run([str(probe), str(path), str(repeats)], capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        return {}, " ".join(proc.stderr.split())
    return {row.pop("variant"): row for row in map(json.loads, proc.stdout.splitlines())}, ""


def native_dump_matches(probe: Path, path: Path, table: pa.Table, folder: Path) -> bool:
    """Whether one native scan's buffers, read back as Arrow binary arrays, are the table's RocksDB keys and values."""
    prefix = folder / "dump"
    subprocess.run([str(probe), "--dump", str(path), str(prefix)], capture_output=True, timeout=600, check=True)

    def array(name: str) -> pa.Array:
        offsets = np.fromfile(f"{prefix}.{name}_offsets", dtype=np.int32)
        data = np.fromfile(f"{prefix}.{name}s", dtype=np.uint8)
        return pa.Array.from_buffers(pa.binary(), len(offsets) - 1, [None, pa.py_buffer(offsets), pa.py_buffer(data)])

    n = table.num_rows
    prefixes = binary_array(table.column("op_id").to_numpy().astype(">u8").view(np.uint8), OP_ID_BYTES)  # big-endian, as stored
    keys = pc.binary_join_element_wise(prefixes, table.column("key_bytes").combine_chunks(), b"")
    got_keys, got_values = array("key"), array("value")
    return len(got_keys) == n and got_keys.equals(keys) and got_values.equals(table.column("value_bytes").combine_chunks())


def compatible_copy(source: Path, target: Path) -> Path:
    """A copy of a RocksDB directory (every column family) written with an SST format the system librocksdb reads.

    For the measurement only: the rows, their order, LZ4 and one flushed SST per family are as in the source.
    """
    from rocksdict import AccessType, BlockBasedOptions, DBCompressionType, Options, Rdict, WriteBatch

    def options() -> Options:
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.create_missing_column_families(True)
        opts.set_compression_type(DBCompressionType.lz4())
        table_options = BlockBasedOptions()
        table_options.set_format_version(COMPATIBLE_FORMAT_VERSION)
        opts.set_block_based_table_factory(table_options)
        return opts

    names = Rdict.list_cf(str(source), Options(raw_mode=True))
    others = [name for name in names if name != "default"]
    src = Rdict(
        str(source), Options(raw_mode=True), column_families={n: Options(raw_mode=True) for n in others}, access_type=AccessType.read_only()
    )
    dst = Rdict(str(target), options(), column_families={n: options() for n in others})
    try:
        for name in names:
            family = src if name == "default" else src.get_column_family(name)
            batch = WriteBatch(raw_mode=True)
            if name != "default":
                batch.set_default_column_family(dst.get_column_family_handle(name))
            for k, v in zip(family.keys(), family.values(), strict=True):  # bench setup: the binding takes one pair per call
                batch.put(k, v)
            dst.write(batch)
        dst.flush()
    finally:
        dst.close()
        src.close()
    return target


@dataclass(frozen=True)
class NativeScan:
    """RocksDB's own scan of the benchmark's checkpoint: how the probe was built, what it read, its best seconds per variant."""

    link: str  # "static" or "shared" librocksdb
    read: str  # "checkpoint", or the compatible copy it read instead
    open_error: str  # why the system RocksDB could not open the checkpoint itself ("" when it could)
    scan_s: dict[str, float]
    # rocksdict's figures again on the copy the probe read (None when it read the checkpoint itself)
    copy_render_s: float | None = None
    copy_iteration_s: float | None = None


def native_scan(cc: str, folder: Path, checkpoint: Path, table: pa.Table, repeats: int) -> NativeScan | str:
    """RocksDB's own scan of the checkpoint (or of a compatible copy when the system RocksDB cannot open it), else why not."""
    probe, how = compile_native_scan(cc, folder)
    if probe is None:
        return how
    variants, open_error = run_native_scan(probe, checkpoint, repeats)
    copy_render_s = copy_iteration_s = None
    if not variants:
        if "format_version" not in open_error:
            return f"the system RocksDB cannot open the checkpoint: {open_error}"
        # the system RocksDB is older than rocksdict's: measure an identical copy in the format it reads (same rows, same LZ4)
        checkpoint = compatible_copy(checkpoint, folder / "compatible")
        variants, error = run_native_scan(probe, checkpoint, repeats)
        if not variants:
            return f"the system RocksDB cannot open the compatible copy either: {error}"
        copy_render_s = best_of(repeats, lambda: rocksdb_checkpoint_to_arrow(checkpoint))[0]
        copy_iteration_s = best_of(repeats, lambda: read_all_pairs(checkpoint))[0]
    expected_bytes = OP_ID_BYTES * table.num_rows
    expected_bytes += (
        pc.sum(pc.binary_length(table.column("key_bytes"))).as_py() + pc.sum(pc.binary_length(table.column("value_bytes"))).as_py()
    )
    for name, row in variants.items():
        assert row["rows"] == table.num_rows, f"the native scan ({name}) read {row['rows']} rows, not {table.num_rows}"
        assert row["bytes"] == expected_bytes, f"the native scan ({name}) saw {row['bytes']} bytes, not {expected_bytes}"
    assert native_dump_matches(probe, checkpoint, table, folder), "the native scan's buffers differ from the render's rows"
    read = "checkpoint" if copy_render_s is None else f"format_version {COMPATIBLE_FORMAT_VERSION} copy of the checkpoint"
    seconds = {name: float(row["scan_s"]) for name, row in variants.items()}
    return NativeScan(how, read, "" if read == "checkpoint" else open_error, seconds, copy_render_s, copy_iteration_s)


def native_result(native: NativeScan | str, baseline_s: float, render_s: float, iterate_s: float) -> dict[str, object]:
    """The JSON fields of the native scan: its seconds and its ratios to the raw IPC write and to rocksdict's figures."""
    if isinstance(native, str):
        return {"native_available": False, "native_reason": native}
    scans = native.scan_s
    scan_s = scans["default"]
    # single-threaded variants that copy every row: the like-for-like of one pyarrow writer
    copied = {name: t for name, t in scans.items() if name != "iterate_only" and not name.startswith("threads_")}
    best = min(copied, key=copied.__getitem__)
    # rocksdict's figures on the very directory the native scan read (the copy's when there is one)
    iteration_there = native.copy_iteration_s if native.copy_iteration_s is not None else iterate_s
    render_there = native.copy_render_s if native.copy_render_s is not None else render_s
    out: dict[str, object] = {
        "native_available": True,
        "native_link": native.link,
        "native_read": native.read,
        "native_open_error": native.open_error,
        "native_scan_s": {name: round(t, 7) for name, t in scans.items()},
        "native_ratio": round(scan_s / baseline_s, 3),
        "native_best_variant": best,
        "native_best_ratio": round(copied[best] / baseline_s, 3),
        "native_iterate_only_ratio": round(scans["iterate_only"] / baseline_s, 3),
        "native_threads_2_ratio": round(scans["threads_2"] / baseline_s, 3),
        "iteration_vs_native": round(iteration_there / scan_s, 3),
        "render_vs_native": round(render_there / scan_s, 3),
        "target_vs_native": round(TARGET_RATIO * baseline_s / scan_s, 3),
    }
    if native.copy_render_s is not None and native.copy_iteration_s is not None:
        out["copy_rocksdb_checkpoint_to_arrow_s"] = round(native.copy_render_s, 7)
        out["copy_rocksdb_iteration_s"] = round(native.copy_iteration_s, 7)
    return out


def print_native(native: NativeScan | str, result: dict[str, object], baseline_s: float) -> None:
    """The native RocksDB scan lines of the text report (one line saying why when there is no probe)."""
    if isinstance(native, str):
        print(f"native RocksDB scan: not measured ({native})")
        return
    print(f"native RocksDB scan ({native.link} librocksdb {rocksdb_version()}, C API, scan alone, best of runs) of the {native.read}:")
    if native.open_error:
        print(f"  (the system RocksDB cannot open the checkpoint itself: {native.open_error})")
    if native.copy_render_s is not None and native.copy_iteration_s is not None:
        print(
            f"  the copy through rocksdict: rocksdb_checkpoint_to_arrow {native.copy_render_s * 1000:.0f} ms, iteration {native.copy_iteration_s * 1000:.0f} ms"
        )
    for name, seconds in native.scan_s.items():
        print(f"  {name:<20} {seconds * 1000:6.0f} ms  ({seconds / baseline_s:5.2f}x raw IPC write)")
    print(
        f"native RocksDB scan / raw IPC write = {result['native_ratio']:.1f}x (best single-threaded variant, {result['native_best_variant']}: "
        f"{result['native_best_ratio']:.1f}x; iteration without copies: {result['native_iterate_only_ratio']:.1f}x; "
        f"2 threads: {result['native_threads_2_ratio']:.1f}x)"
    )
    print(
        f"rocksdict iteration / native scan = {result['iteration_vs_native']:.1f}x; "
        f"rocksdb_checkpoint_to_arrow / native scan = {result['render_vs_native']:.1f}x"
    )
    print(f"the {TARGET_RATIO:g}x target is {result['target_vs_native']:.2f}x of RocksDB's own scan time")


def rocksdb_version() -> str:
    """The system RocksDB's version from its header ("" when unknown)."""
    try:
        text = Path("/usr/include/rocksdb/version.h").read_text()
    except OSError:
        return ""
    parts = [re.search(rf"#define ROCKSDB_{part} (\d+)", text) for part in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(m.group(1) for m in parts if m) if all(parts) else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows in the RocksDB checkpoint (default 1M)")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of each measurement (best kept)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--cc", default="gcc", help="C compiler for the native RocksDB scan probe (default gcc; a missing one skips the probe)"
    )
    args = parser.parse_args(argv)
    if args.rows < len(OPERATORS):
        parser.error(f"--rows must be at least {len(OPERATORS)}")
    with tempfile.TemporaryDirectory(prefix="bench-rocksdb-") as folder:
        keys = bench_keys(0, args.rows)
        values = binary_array(np.random.default_rng(1).integers(0, 256, args.rows * VALUE_BYTES, dtype=np.uint8), VALUE_BYTES)
        started = time.perf_counter()
        with RocksDBStateBackend(Path(folder) / "db") as backend:
            for i, uid in enumerate(OPERATORS):  # rows spread over 4 operators
                op = backend.register_operator(uid)
                mine = pa.array(np.arange(i, args.rows, len(OPERATORS)))
                backend.put_many(op, keys.take(mine), values.take(mine))
            checkpoint = backend.create_checkpoint(Path(folder) / "chk")
        load_s = time.perf_counter() - started
        render_s, blob = best_of(args.repeats, lambda: rocksdb_checkpoint_to_arrow(checkpoint))
        table = snapshot.read_snapshot(blob).table
        assert table.num_rows == args.rows, "the render lost or added rows"
        assert operators_then_keys(table), "the render is not operators ascending, keys in byte order"
        baseline_s, raw = best_of(args.repeats, lambda: raw_ipc_write(table))
        assert ipc.open_stream(raw).read_all().equals(table)
        iterate_s, _ = best_of(args.repeats, lambda: read_all_pairs(checkpoint))
        native = native_scan(args.cc, Path(folder), checkpoint, table, args.repeats)
    ratio = render_s / baseline_s
    result = {
        "rows": args.rows,
        "stream_bytes": len(blob),
        "load_s": round(load_s, 7),
        "rocksdb_checkpoint_to_arrow_s": round(render_s, 7),
        "raw_ipc_write_s": round(baseline_s, 7),
        "rocksdb_iteration_s": round(iterate_s, 7),
        "ratio": round(ratio, 3),
        "iteration_ratio": round(iterate_s / baseline_s, 3),
        "target": TARGET_RATIO,
        "met": ratio <= TARGET_RATIO,
    }
    result.update(native_result(native, baseline_s, render_s, iterate_s))
    if args.json:
        print(json.dumps(result))
    else:
        print(f"RocksDB checkpoint: {args.rows:,} rows over {len(OPERATORS)} operators, {len(blob) / 1e6:.1f} MB as a stream")
        print(f"raw pyarrow IPC write of the same table:              {baseline_s * 1000:.0f} ms")
        print(f"rocksdb_checkpoint_to_arrow:                          {render_s * 1000:.0f} ms")
        print(f"  of which at least: RocksDB iteration (keys, values): {iterate_s * 1000:.0f} ms ({iterate_s / baseline_s:.2f}x)")
        print(
            f"rocksdb_checkpoint_to_arrow / raw IPC write: {ratio:.2f}x (target at most {TARGET_RATIO:g}x) {'met' if ratio <= TARGET_RATIO else 'MISSED'}"
        )
        print_native(native, result, baseline_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
