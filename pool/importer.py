"""Import: checkpoint 1 of a new job written from a canonical table (any snapshot, export or checkpoint a tool read).

This is how the State Processor API writes a savepoint: the rows are checked (canonical, every keyed row's key-group
byte right), cut into the key groups of P subtasks and folded into one base file per subtask, about one segment per
key group. The new job's writers table is its claim (written first, as a restore's is), each part is written right
after its file (GC sees every file referenced) and the _metadata last: until it lands nothing is visible, and on any
failure what was written is removed again. Workers of the job then acquire any key-group ranges and commit
checkpoint 2 on top (parent 1).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pool.lifecycle_context import LifecycleConfig, LifecycleContext
from pool.savepoints import split_by_parts, write_folded
from pool.writers import first_epoch
from snapshot import NUM_KEY_GROUPS, StateVersionMap, check_rows, conform, operator_id, sort_for_layout
from snapshot.errors import ClinkError, ConflictError, InvalidArgumentError, UnavailableError
from snapshot.keys import key_groups_of_runs
from store.anatomy import WRITER_VERSION
from store.datafile import DataFile
from store.layout import job_file_key, job_prefix, metadata_key, part_key, writers_key
from store.manifest import MANIFEST_FORMAT, PART_FORMAT, Manifest, Part, manifest_json
from store.objects import ObjectStore
from store.segment_cache import SegmentCache
from store.views import PrefixStore
from store.writers import WriterTable

__all__ = ["Importer", "subtask_ranges", "wrong_key_group_rows"]

_SEP = 0x7C  # '|': splits slot from user key
_U64 = (1 << 64) - 1
_EXAMPLE_BYTES = 48  # how much of a key an error message shows


def subtask_ranges(parallelism: int) -> list[tuple[int, int]]:
    """The key groups of each subtask of a job of this parallelism: P contiguous even ranges tiling 0..127.

    Range i is [i*128//P, (i+1)*128//P - 1], the split a job of parallelism P uses.
    """
    _check_parallelism(parallelism)
    return [(i * NUM_KEY_GROUPS // parallelism, (i + 1) * NUM_KEY_GROUPS // parallelism - 1) for i in range(parallelism)]


def _check_parallelism(parallelism: object) -> int:
    if isinstance(parallelism, bool) or not isinstance(parallelism, int) or not 1 <= parallelism <= NUM_KEY_GROUPS:
        raise InvalidArgumentError(
            f"parallelism {parallelism!r} must be a whole number from 1 to {NUM_KEY_GROUPS} (each subtask holds at least one key group)"
        )
    return parallelism


def _wrong_in_chunk(keys: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(wrong, expected) per row of one binary chunk: a keyed row whose key-group byte is not FNV-1a(user key) mod 128."""
    n = len(keys)
    wrong = np.zeros(n, dtype=bool)
    expected = np.zeros(n, dtype=np.uint8)
    if n == 0:
        return wrong, expected
    _, off_buf, data_buf = keys.buffers()
    offsets = np.frombuffer(off_buf, dtype=np.int32, count=n + 1, offset=keys.offset * 4).astype(np.int64)
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None and data_buf.size else np.zeros(1, dtype=np.uint8)
    starts, ends = offsets[:-1], offsets[1:]
    lead = np.where(ends > starts, data[np.minimum(starts, data.size - 1)], 0)
    # the first '|' after the prefix byte; a keyed row has one and a prefix byte below 128 (raw keys have no '|')
    seps = np.flatnonzero(data == _SEP)
    sep = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    if seps.size:
        at = np.searchsorted(seps, starts + 1)
        found = at < seps.size
        sep[found] = seps[at[found]]
    keyed = (sep < ends) & (lead < NUM_KEY_GROUPS)
    rows = np.flatnonzero(keyed)
    if rows.size:
        user_start = sep[rows] + 1
        expected[rows] = key_groups_of_runs(data, user_start, ends[rows] - user_start)
        wrong[rows] = expected[rows] != lead[rows]
    return wrong, expected


def wrong_key_group_rows(key_bytes: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(mask, expected): keyed rows ([kg][slot]|[user key], kg < 128) whose kg byte is not FNV-1a(user key) mod 128.

    Operator-state rows (prefix >= 128) and legacy raw keys (no '|') have no key group and are never wrong.
    ``expected`` is the right key group of every keyed row (0 elsewhere). Vectorised per chunk, no per-row Python.
    """
    chunks = key_bytes.chunks if isinstance(key_bytes, pa.ChunkedArray) else [key_bytes]
    pieces = [_wrong_in_chunk(c.cast(pa.binary()) if c.type != pa.binary() else c) for c in chunks]
    if not pieces:
        return np.zeros(0, dtype=bool), np.zeros(0, dtype=np.uint8)
    return np.concatenate([w for w, _ in pieces]), np.concatenate([e for _, e in pieces])


def _example(key: bytes) -> str:
    shown = key[:_EXAMPLE_BYTES].hex()
    return f"0x{shown}{'...' if len(key) > _EXAMPLE_BYTES else ''}"


def _checked_table(table: pa.Table) -> pa.Table:
    """The rows as one canonical table in layout order; InvalidArgumentError (nothing written) for rows no job could hold."""
    if not isinstance(table, pa.Table):
        raise InvalidArgumentError(f"the rows to import must be a pyarrow Table, got {type(table).__name__}")
    table = conform(table)  # exact schema: op_id uint64, key_bytes and value_bytes binary, no nulls, no row_kind
    check_rows(table, False)
    wrong, expected = wrong_key_group_rows(table.column("key_bytes"))
    if wrong.any():
        first = int(np.flatnonzero(wrong)[0])
        key = table.column("key_bytes")[first].as_py()
        raise InvalidArgumentError(
            f"{int(wrong.sum())} keyed row(s) carry a key-group byte that is not FNV-1a(user key) mod {NUM_KEY_GROUPS}, "
            f"e.g. op_id {table.column('op_id')[first].as_py()} key_bytes {_example(key)} (byte {key[0]}, its key group is "
            f"{int(expected[first])}); such rows would be read by the wrong subtask: nothing was written"
        )
    table = sort_for_layout(table)
    n = table.num_rows
    if n > 1:
        keys = table.column("key_bytes")
        tied = pc.equal(keys.slice(0, n - 1), keys.slice(1)).to_numpy(zero_copy_only=False)
        ops = table.column("op_id").to_numpy()
        repeats = tied & (ops[:-1] == ops[1:])
        if repeats.any():
            first = int(np.flatnonzero(repeats)[0])
            raise InvalidArgumentError(
                f"{int(repeats.sum())} duplicate (op_id, key) row(s), e.g. op_id {int(ops[first])} key_bytes "
                f"{_example(keys[first].as_py())}: a canonical table holds each key once; nothing was written"
            )
    return table


def _checked_operators(operators: Mapping[int, str | None], table: pa.Table) -> tuple[tuple[int, str], ...]:
    """(op_id, uid or "") of every operator named or holding rows, sorted; a uid must hash to its op_id."""
    out: dict[int, str] = {}
    for op_id, uid in operators.items():
        if isinstance(op_id, bool) or not isinstance(op_id, int) or not 0 <= op_id <= _U64 or not (uid is None or isinstance(uid, str)):
            raise InvalidArgumentError(f"operator {(op_id, uid)!r} must be (uint64 op_id, uid string or None)")
        if uid and operator_id(uid) != op_id:
            raise InvalidArgumentError(f"operator uid {uid!r} has op_id {operator_id(uid)}, not {op_id}; nothing was written")
        out[op_id] = uid or out.get(op_id, "")
    if table.num_rows:
        for op_id in pc.unique(table.column("op_id")).to_pylist():
            out.setdefault(int(op_id), "")
    return tuple(sorted(out.items()))


class Importer:
    """Creates new jobs of one store from canonical tables: checkpoint 1 folded at a chosen parallelism."""

    @classmethod
    def on_store(cls, store: ObjectStore) -> Importer:
        """An importer into a bare store, with the lifecycle's default settings."""
        config = LifecycleConfig()
        return cls(LifecycleContext(store, config, time.time, SegmentCache(config.cache_bytes)))

    def __init__(self, context: LifecycleContext) -> None:
        self.context = context

    def refuse_existing(self, job: str) -> str:
        """The checked job id; ConflictError when the store holds anything under the job's folder (nothing written)."""
        job = self.context.job(job)
        if next(iter(self.context.store.list(job_prefix(job))), None) is not None:
            raise ConflictError(f"job {job} already exists in {self.context.store.uri}; import only creates new jobs: give a new job name")
        return job

    def import_table(
        self,
        new_job: str,
        table: pa.Table,
        operators: Mapping[int, str | None] | None = None,
        state_versions: StateVersionMap | None = None,
        parallelism: int = 1,
        provenance: Mapping[str, Any] | None = None,
        source: str = "a table",
        progress: Callable[[int, int], None] | None = None,
    ) -> Manifest:
        """Write checkpoint 1 of the NEW job ``new_job`` holding exactly ``table``'s rows, split over ``parallelism`` subtasks.

        ``operators``: op_id -> uid (None: unnamed) the manifest names (operators holding rows are named anyway);
        ``source`` describes where the rows came from and ``provenance`` adds facts, both kept in the _metadata's
        restored_from (information only). Bad input (name, parallelism, rows, uids) and a taken name raise before
        anything is written; any failure after the claim removes what was written and re-raises.
        """
        new_job = self.context.job(new_job)
        ranges = subtask_ranges(_check_parallelism(parallelism))
        versions = state_versions if state_versions is not None else StateVersionMap()
        if not isinstance(versions, StateVersionMap):
            raise InvalidArgumentError(f"state_versions must be a StateVersionMap, got {type(versions).__name__}")
        table = _checked_table(table)
        named = _checked_operators(operators or {}, table)
        packed = versions.pack()
        self.refuse_existing(new_job)
        # the writers table is the new job's claim: of two concurrent imports (or restores) into one name, one writes
        # nothing. Its epochs start at the clock, as a new job's do, so no process of an earlier job of this name holds one.
        epoch = first_epoch(self.context.clock)
        try:
            claim = self.context.store.put_if_absent(writers_key(new_job), WriterTable(epoch + 1, (), life=uuid.uuid4().hex).to_json())
        except ConflictError:
            raise ConflictError(f"job {new_job} was created concurrently in {self.context.store.uri}; this import wrote nothing") from None
        target = PrefixStore(self.context.store, job_prefix(new_job))
        created = self.context.now_ms()
        written: list[str] = []
        parts: list[Part] = []
        files: list[DataFile] = []
        total_bytes = 0
        try:
            for i, ((lo, hi), piece) in enumerate(zip(ranges, split_by_parts(table, ranges), strict=True)):
                # one range at a time, its part right after its file: GC sees each file referenced as soon as it lands
                started = self.context.clock()
                folded, new_files, size = write_folded(target, piece, [(lo, hi, epoch)], 1, versions)
                written.extend(job_file_key(new_job, f.path) for f in new_files)
                if self.context.clock() - started > self.context.config.max_write_s:
                    raise UnavailableError(
                        f"writing the file of key groups {lo}-{hi} took longer than {self.context.config.max_write_s:g} s; "
                        f"the import into {new_job} was undone, run it again"
                    )
                one = Manifest(PART_FORMAT, new_job, 1, 0, created, named, packed, tuple(folded), tuple(new_files))
                key = part_key(new_job, 1, lo, hi, epoch)
                self.context.store.put_if_absent(key, one.to_json())
                written.append(key)
                parts.extend(folded)
                files.extend(new_files)
                total_bytes += size
                if progress is not None:
                    progress(i + 1, len(ranges))
            imported = Manifest(
                MANIFEST_FORMAT, new_job, 1, 0, created, named, packed, tuple(parts), tuple(sorted(files, key=lambda f: f.path))
            )
            origin = {
                "restored_from": {
                    **dict(provenance or {}),
                    # information only (never used to open a file): where the rows came from when they were imported
                    "imported_from": source,
                    "kind": "import",
                    "rows": table.num_rows,
                    "parallelism": len(ranges),
                    "imported_at_ms": created,
                    "writer": WRITER_VERSION,
                }
            }
            body = manifest_json(imported, origin)
            self._publish(new_job, body)  # written last: the job's checkpoint 1 exists from here on
        except BaseException:
            self._undo(new_job, written, claim)
            raise
        return imported

    def _publish(self, new_job: str, body: bytes) -> None:
        """Put the _metadata; a put whose answer was lost but which landed (our bytes are there) counts as done."""
        key = metadata_key(new_job, 1)
        try:
            self.context.store.put_if_absent(key, body)
        except ClinkError:
            try:
                if self.context.store.get(key) == body:
                    return
            except ClinkError:
                pass
            raise

    def _undo(self, new_job: str, keys: list[str], claim_etag: str) -> None:
        """Remove what a failed import wrote (its parts and files, then its claim if nobody has changed it), best effort."""
        try:
            for key in reversed(keys):  # parts before the files they name
                self.context.store.delete(key)
            if self.context.store.head(writers_key(new_job)).etag == claim_etag:
                self.context.store.delete(writers_key(new_job))
        except ClinkError:
            pass  # what is left is unreferenced: GC removes the files, and the name stays taken until deleted
