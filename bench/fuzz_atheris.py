"""Coverage-guided fuzzing (atheris/libFuzzer) of the snapshot reader, canonicalise, merge and manifest parsing, time-bounded.

    python bench/fuzz_atheris.py                      # 20 s per target, prints the inputs tried
    python bench/fuzz_atheris.py --seconds 60 --target manifest

Any exception other than the typed errors of snapshot/errors.py is a finding: libFuzzer stops, prints the input and exits 1.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGETS = ("reader", "merge", "manifest")


def _seeds() -> list[bytes]:
    import pyarrow as pa

    import snapshot

    op = snapshot.operator_id("fuzz")
    keys = [snapshot.encode_keyed_key("s", f"k{i}".encode()) for i in range(8)] + [snapshot.encode_operator_key("o", b"x")]
    table = pa.table(
        {
            "op_id": pa.array([op] * len(keys), pa.uint64()),
            "key_bytes": pa.array(keys, pa.binary()),
            "value_bytes": pa.array([b"v"] * len(keys), pa.binary()),
        }
    ).sort_by([("key_bytes", "ascending")])
    change = pa.table(
        {
            "row_kind": pa.array([1, 1, 2], pa.uint8()),
            "op_id": pa.array([op] * 3, pa.uint64()),
            "key_bytes": pa.array(keys[:3], pa.binary()),
            "value_bytes": pa.array([b"a", b"b", b""], pa.binary()),
        }
    )
    return [snapshot.write_snapshot(table, snapshot.StateVersionMap({(op, "value"): 2})), snapshot.write_snapshot(change, changelog=True)]


def _manifest_seed() -> bytes:
    return (
        b'{"format":"clink.checkpoint-manifest","version":1,"job":"j","checkpoint_id":2,"parent_id":1,"created_at_ms":5,'
        b'"operators":[{"op_id":1,"uid":"u"}],"state_versions":"","files":[{"path":"data/a.arrow","kind":"delta","kg_lo":0,'
        b'"kg_hi":127,"rows":3,"size":100,"sha256":"' + b"0" * 64 + b'","segments":[{"kg_lo":0,"kg_hi":127,"offset":0,'
        b'"length":100,"rows":3,"crc32":7}]}],"parts":[{"kg_lo":0,"kg_hi":127,"epoch":1,"parent_id":1,"layers":[["data/a.arrow"]]}]}'
    )


def run_target(target: str) -> None:
    """Fuzz one target in this process (libFuzzer flags come from sys.argv)."""
    import atheris

    with atheris.instrument_imports():
        import snapshot
        from snapshot.errors import ClinkError
        from store.manifest import parse_manifest

    seeds = _seeds()
    count = [0]

    def one_input(data: bytes) -> None:
        count[0] += 1
        if count[0] % 20000 == 0:
            print(f"[atheris] {target}: {count[0]} inputs", flush=True)
        try:
            if target == "reader":
                snapshot.canonicalise_state_snapshot(data)
            elif target == "merge":
                cut = len(data) // 2
                snapshot.merge_snapshot_bytes([seeds[0], data[:cut], data[cut:]])
            else:
                parse_manifest(data, "jobs/j/chk-2/_metadata")
        except ClinkError:
            pass

    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=20, help="libFuzzer -max_total_time per target")
    parser.add_argument("--target", choices=TARGETS, action="append", help="target(s) to fuzz (default: all)")
    parser.add_argument("--corpus", type=Path, default=Path(tempfile.gettempdir()) / "clink-fuzz-corpus", help="corpus and findings folder")
    parser.add_argument("--child", choices=TARGETS, help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.child:
        sys.argv = [sys.argv[0], *rest]
        run_target(args.child)
        return 0
    corpus_root = args.corpus
    failed = 0
    total = 0
    for target in args.target or TARGETS:
        corpus = corpus_root / target
        corpus.mkdir(parents=True, exist_ok=True)
        seeds = [_manifest_seed()] if target == "manifest" else _seeds()
        for i, seed in enumerate(seeds):
            (corpus / f"seed-{i}").write_bytes(seed)
        cmd = [
            sys.executable,
            __file__,
            "--child",
            target,
            f"-max_total_time={args.seconds}",
            "-rss_limit_mb=2048",
            "-timeout=10",
            f"-artifact_prefix={corpus_root}/{target}-",
            str(corpus),
        ]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        done = [line for line in proc.stderr.splitlines() if line.startswith("Done ")]
        runs = int(done[-1].split()[1]) if done else 0
        total += runs
        status = "ok" if proc.returncode == 0 else f"FAILED (exit {proc.returncode})"
        print(f"{target:9s} {runs:>9,d} inputs in {args.seconds}s  {status}")
        if proc.returncode != 0:
            failed += 1
            print("\n".join(proc.stderr.splitlines()[-40:]))
    print(f"total     {total:>9,d} inputs, {failed} target(s) with findings")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
