"""`clink demo`: a real pool on the embedded store, a 4-subtask word count that checkpoints, fails, rescales and exports."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import snapshot
from client.backend import BackendConfig, RemoteReadBackend
from client.errors import ClinkError, FencedError, InvalidArgumentError, UnavailableError
from client.pool_client import PoolClient, PoolClientConfig
from client.typed import KeyedInt64State, OperatorInt64State

JOB = "word-count-demo"
LOCK_NAME = ".clink-demo.lock"  # held while a demo runs in a folder, so two runs never share one pool.log or pick one job name
COUNT_UID, SOURCE_UID = "word-count", "source"
FOUR = [(0, 31), (32, 63), (64, 95), (96, 127)]
TWO = [(0, 63), (64, 127)]
# four source splits (think: Kafka partitions), one line per record
SPLITS = [
    ["the quick brown fox", "jumps over the lazy dog", "the dog sleeps", "a fox runs far", "state lives in the pool", "more words arrive"],
    [
        "streams of words",
        "the pool keeps checkpoints",
        "workers keep deltas",
        "a lazy restore reads little",
        "the end",
        "after the rescale",
    ],
    [
        "every word is counted",
        "once and only once",
        "the fox and the dog",
        "checkpoints are incremental",
        "rescale to two",
        "two subtasks now",
    ],
    ["arrow streams out", "duckdb queries the export", "the quick dog", "brown words again", "the last line", "the dog again"],
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Job:
    """The demo job: source subtasks own splits and offsets, word counts are keyed by word (all-to-all shuffle)."""

    def __init__(self, address: str, job: str, ranges: list[tuple[int, int]], echo: Callable[[str], None], restore: bool) -> None:
        self.address, self.ranges, self.echo = address, ranges, echo
        cfg = BackendConfig(call_deadline_s=10)
        self.backends = [RemoteReadBackend.connect(address, job, r, cfg) for r in ranges]
        if restore:
            for b in self.backends:
                b.restore(expected_operators={COUNT_UID: snapshot.operator_id(COUNT_UID), SOURCE_UID: snapshot.operator_id(SOURCE_UID)})
        self.counts = [KeyedInt64State(b, COUNT_UID, "count") for b in self.backends]
        self.offsets = [OperatorInt64State(b, SOURCE_UID, "offset") for b in self.backends]

    def owner(self, word: bytes) -> int:
        kg = snapshot.key_group(word)
        return next(i for i, (lo, hi) in enumerate(self.ranges) if lo <= kg <= hi)

    def splits_of(self, subtask: int) -> list[int]:
        return [s for s in range(len(SPLITS)) if s % len(self.ranges) == subtask]

    def offset(self, split: int) -> int:
        return self.offsets[split % len(self.ranges)].get(f"split-{split}".encode()) or 0

    def run(self, lines: int) -> int:
        """Read up to ``lines`` more records from every split (from its checkpointed offset); count their words."""
        records = 0
        for subtask in range(len(self.ranges)):
            for split in self.splits_of(subtask):
                start = self.offset(split)
                for line in SPLITS[split][start : start + lines]:
                    for word in line.split():
                        self.counts[self.owner(word.encode())].add(word.encode())
                    records += 1
                self.offsets[subtask].set(min(len(SPLITS[split]), start + lines), f"split-{split}".encode())
        return records

    def checkpoint(self, checkpoint_id: int) -> None:
        parts = []
        for i, b in enumerate(self.backends):
            rows, size = b.delta_rows, b.delta_bytes
            result = b.snapshot(checkpoint_id)
            parts.append(f"subtask {i} ({b.key_groups[0]}-{b.key_groups[1]}): {rows} rows/{size} B")
            done = result.checkpoint
        self.echo(f"  checkpoint {checkpoint_id}: " + "; ".join(parts))
        self.echo(
            f"  checkpoint {checkpoint_id} complete={done.complete}, parent {done.parent_id}, "
            f"{done.num_rows} rows in {done.num_files} file(s), {done.total_bytes} B referenced"
        )

    def word(self, word: str) -> int:
        return self.counts[self.owner(word.encode())].get(word.encode()) or 0

    def close(self) -> None:
        for b in self.backends:
            b.close()


def _start_pool(workdir: Path, echo: Callable[[str], None]) -> tuple[subprocess.Popen, str, Path]:
    """A pool subprocess on a free loopback port over ``workdir``/pool-data, logging to ``workdir``/pool.log (an absolute path)."""
    port = _free_port()
    address = f"127.0.0.1:{port}"
    store = f"file://{workdir / 'pool-data'}"
    log_path = workdir / "pool.log"
    log = open(log_path, "wb")  # noqa: SIM115  # handed to the child; closed when the demo ends
    cmd = [sys.executable, "-m", "clink.cli.pool", "serve", "--store", store, "--listen", address, "--grace", "1"]
    # every path it gets is absolute; the cwd is the package's folder so `-m` imports no look-alike package from the user's folder
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=str(Path(__file__).resolve().parents[1]))
    echo(f"starting a RemotePool: {' '.join(['clink-pool', *cmd[3:]])}")
    with PoolClient(address, PoolClientConfig(call_deadline_s=2)) as probe:
        deadline = time.monotonic() + 20
        while True:
            if proc.poll() is not None:
                raise ClinkError(f"the pool exited with code {proc.returncode}: {log_path.read_text(errors='replace').strip()[-400:]}")
            try:
                probe.wait_ready(timeout_s=0.5)
                break
            except ClinkError:
                if time.monotonic() > deadline:
                    raise
    echo(f"pool serving on {address}, store {store}")
    return proc, address, log_path


def _query(blob: bytes, echo: Callable[[str], None]) -> dict[str, int]:
    """Project the exported snapshot (vectorised) and query it with DuckDB."""
    import duckdb

    table = snapshot.read_snapshot(blob).table
    count_op = snapshot.operator_id(COUNT_UID)
    prefix_len = len(b"count|") + 1
    counts = table.filter(pc.equal(table.column("op_id"), pa.scalar(count_op, pa.uint64())))
    keys = counts.column("key_bytes").combine_chunks()
    words = pc.utf8_slice_codeunits(keys.cast(pa.string()), prefix_len)  # [kg]count|word; words are ASCII
    values = counts.column("value_bytes").combine_chunks()
    ints = (
        np.frombuffer(values.buffers()[2], dtype="<i8", count=len(values), offset=values.offset * 8) if len(values) else np.zeros(0, "<i8")
    )
    word_counts = pa.table({"word": words, "n": pa.array(ints)})
    raw = table
    con = duckdb.connect()
    con.register("word_counts", word_counts)
    con.register("raw", raw)
    echo("  DuckDB> SELECT op_id, count(*) AS rows, sum(octet_length(value_bytes)) AS value_bytes FROM raw GROUP BY op_id")
    names = {snapshot.operator_id(u): u for u in (COUNT_UID, SOURCE_UID)}
    for op_id, rows, size in con.execute(
        "SELECT op_id, count(*), sum(octet_length(value_bytes)) FROM raw GROUP BY op_id ORDER BY 2 DESC"
    ).fetchall():
        echo(f"    {names.get(op_id, op_id):<10} {rows:>4} rows {size:>5} B")
    echo("  DuckDB> SELECT word, n FROM word_counts ORDER BY n DESC, word LIMIT 5")
    for word, n in con.execute("SELECT word, n FROM word_counts ORDER BY n DESC, word LIMIT 5").fetchall():
        echo(f"    {word:<12} {n}")
    return dict(zip(words.to_pylist(), ints.tolist(), strict=True))


class FolderInUseError(UnavailableError):
    """Another demo is running in the same --workdir."""


@contextmanager
def _hold(root: Path) -> Iterator[None]:
    """Hold the folder's demo lock for the run; FolderInUseError when another demo holds it (nothing written then)."""
    try:
        import fcntl
    except ImportError:  # no flock on this platform: runs are not told apart
        yield
        return
    try:
        fh = open(root / LOCK_NAME, "a+")  # noqa: SIM115 - closed by the with below
    except OSError as exc:
        raise InvalidArgumentError(f"cannot use workdir {root}: {_why_not(root, exc)}") from None
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "?"
            raise FolderInUseError(
                f"{root} is in use by another clink demo (pid {holder}); wait for it or pass another --workdir"
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        try:
            yield
        finally:
            fh.truncate(0)  # the lock goes with the file's closing; an empty file names no holder


def job_name_for(root: Path) -> str:
    """The demo's job in ``root``: word-count-demo, or on a rerun the first word-count-demo-N that is not taken yet."""
    jobs = root / "pool-data" / "jobs"
    if not (jobs / JOB).exists():
        return JOB
    n = 2
    while (jobs / f"{JOB}-{n}").exists():
        n += 1
    return f"{JOB}-{n}"


def make_workdir(root: Path) -> None:
    """Create the demo's folder (and its parents); InvalidArgumentError "cannot create workdir ..." naming why, nothing made."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidArgumentError(f"cannot create workdir {root}: {_why_not(root, exc)}") from None


def _why_not(root: Path, exc: OSError) -> str:
    """Why a folder cannot be made: a file where a folder must be, else the system's words."""
    for parent in (root, *root.parents):
        if parent.exists():
            if not parent.is_dir():
                return f"{parent} is a file, not a folder"
            break
    return exc.strerror or str(exc)


def resolve_workdir(workdir: str | os.PathLike[str]) -> Path:
    """The demo's folder as an absolute path, resolved once before anything starts (a relative one against the current folder)."""
    return Path(workdir).expanduser().resolve()


def run_demo(
    workdir: str | os.PathLike[str] | None = None, echo: Callable[[str], None] = print, report: dict[str, object] | None = None
) -> int:
    """Run the demo end to end against a real pool subprocess; 0 when the final counts are exactly right.

    ``workdir`` keeps the store (pool-data/) and the pool's log (pool.log) in one folder; each run there is a new job.
    FolderInUseError when another demo is running in it. ``report``, when given, is filled with what the demo did (the
    facts of `clink demo -o json`): the job, where its store was kept, the checkpoints, the restore, the rescale, the export.
    """
    started = time.monotonic()
    report = {} if report is None else report
    if workdir is not None and not str(workdir).strip():
        raise InvalidArgumentError("--workdir is empty: give a folder, or leave --workdir out to use a temporary one")
    root = resolve_workdir(workdir) if workdir is not None else None
    if root is not None:
        make_workdir(root)
    with tempfile.TemporaryDirectory(prefix="clink-demo-") as tmp:
        root = root or Path(tmp)
        with _hold(root):
            job = job_name_for(root)
            report.update(job=job, workdir=str(root) if workdir else None, store=f"file://{root / 'pool-data'}" if workdir else None)
            proc = None
            try:
                proc, address, _ = _start_pool(root, echo)
                code = _drive(address, job, echo, started, report)
            except ClinkError as exc:
                echo(f"demo failed: {exc}")
                report.update(ok=False, failed=str(exc), seconds=round(time.monotonic() - started, 1))
                return 1
            finally:
                if proc is not None:
                    proc.terminate()
                    try:
                        proc.wait(10)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait(5)
                    echo("pool stopped")
            if workdir and code == 0:
                store = f"file://{root / 'pool-data'}"
                echo(f"kept in {root}: clink-pool ls --store {store}; clink state-cat {store}/jobs/{job}/chk-4")
            return code


def _drive(address: str, name: str, echo: Callable[[str], None], started: float, report: dict[str, object]) -> int:
    report.update(ok=False, checkpoints=[])
    checkpoints: list[int] = []
    echo(f"\n1. job {name}: four subtasks (key groups {', '.join(f'{lo}-{hi}' for lo, hi in FOUR)}) count words; checkpoint 1")
    job = _Job(address, name, FOUR, echo, restore=False)
    echo(f"  read {job.run(2)} records")
    job.checkpoint(1)
    checkpoints.append(1)
    report["checkpoints"] = checkpoints

    echo("\n2. more records; checkpoint 2 ships only what changed since checkpoint 1")
    echo(f"  read {job.run(2)} records")
    job.checkpoint(2)
    checkpoints.append(2)
    at_checkpoint_2 = job.word("the")
    echo(f"  count of 'the' = {at_checkpoint_2}")

    echo("\n3. more records arrive, then subtask 2 fails before checkpoint 3 (its unsaved writes are lost)")
    echo(f"  read {job.run(1)} records; count of 'the' now {job.word('the')}")
    lost = job.backends[2].delta_rows
    job.backends[2].close()
    echo(f"  subtask 2 dropped with {lost} unsaved write(s)")
    replacement = RemoteReadBackend.connect(address, name, FOUR[2])
    t0 = time.perf_counter()
    info = replacement.restore(required=True)  # checkpoint 2 is there: restoring nothing would be a bug here
    echo(
        f"  a new subtask 2 restores checkpoint {info.checkpoint_id} in {1000 * (time.perf_counter() - t0):.1f} ms (metadata only, values read lazily)"
    )
    job.backends[2] = replacement
    job.counts[2] = KeyedInt64State(replacement, COUNT_UID, "count")
    job.offsets[2] = OperatorInt64State(replacement, SOURCE_UID, "offset")
    for i, b in enumerate(job.backends):
        if i != 2:
            b.restore(info.checkpoint_id)  # all-to-all shuffle: the whole job rewinds to the checkpoint
    echo(
        f"  the job rewinds to checkpoint {info.checkpoint_id}: count of 'the' = {job.word('the')} (was {at_checkpoint_2} at checkpoint 2)"
    )
    echo(f"  sources resume from their checkpointed offsets {[job.offset(s) for s in range(4)]}; replay reads {job.run(1)} records")
    job.checkpoint(3)
    checkpoints.append(3)
    report["restored_checkpoint"] = info.checkpoint_id

    echo("\n4. the job rescales from 4 subtasks to 2 and restores checkpoint 3")
    old = job
    job = _Job(address, name, TWO, echo, restore=True)
    echo(f"  subtasks {', '.join(f'{lo}-{hi}' for lo, hi in TWO)} see every source offset: {[job.offset(s) for s in range(4)]}")
    try:
        old.offsets[0].set(999, b"split-0")  # a zombie of the old layout tries to move a source offset
        old.backends[0].snapshot(4)
        echo("  ERROR: an old subtask committed after the rescale")
        report["failed"] = "an old subtask committed after the rescale"
        return 1
    except FencedError:
        echo("  an old subtask's commit is fenced (FAILED_PRECONDITION): it can no longer write")
    old.close()
    echo(f"  read the rest: {job.run(10)} records")
    job.checkpoint(4)
    checkpoints.append(4)
    report["rescaled"] = {"from_subtasks": len(FOUR), "to_subtasks": len(TWO)}

    echo("\n5. export: each subtask's export_arrow_snapshot, merged, queried with DuckDB")
    blobs = [b.export_arrow_snapshot() for b in job.backends]
    merged = snapshot.merge_snapshot_bytes(blobs)
    echo(f"  exported {len(merged)} B: one Arrow IPC stream, format version {snapshot.read_snapshot(merged).format_version}")
    got = _query(merged, echo)
    job.close()
    expected = Counter(w for split in SPLITS for line in split for w in line.split())
    report.update(export_bytes=len(merged), words=sum(got.values()), distinct_words=len(got))
    if got != dict(expected):
        wrong = sorted(set(got.items()) ^ set(expected.items()))[:5]
        echo(f"\nMISMATCH against a plain Counter of the input: {wrong}")
        report.update(failed=f"counts differ from the input: {wrong}", seconds=round(time.monotonic() - started, 1))
        return 1
    report.update(ok=True, exactly_once=True, seconds=round(time.monotonic() - started, 1))
    echo(
        f"\nexactly-once: all {sum(expected.values())} words counted once, despite the failure and the rescale ({time.monotonic() - started:.1f}s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_demo())
