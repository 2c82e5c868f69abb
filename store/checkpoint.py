"""Reading checkpoints straight from a store: manifests, verified segment reads, layer overlay, point lookups."""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from snapshot import (
    CANONICAL_SCHEMA,
    NUM_KEY_GROUPS,
    ROW_ERASE,
    composite_keys,
    empty_table,
    filter_key_groups,
    leading_bytes,
    merge_tables,
    overlay,
)
from snapshot.errors import InvalidArgumentError, NotFoundError
from store.datafile import DataFile, Segment, decode_segment, verify_file, verify_segment
from store.manifest import Manifest, Part, checkpoint_prefix, job_prefix, metadata_key, parse_manifest
from store.objects import ObjectStore

MANIFEST_CACHE_ENTRIES = 256
_CHK_RE = re.compile(r"^chk-([1-9][0-9]*)/(_metadata|parts/([0-9]+)-([0-9]+)\.json)$")


class SegmentCache:
    """A bounded LRU of decoded tables (segments, operator views), sized by Arrow buffer bytes; thread-safe."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.hits = 0
        self.misses = 0
        self._bytes = 0
        self._items: OrderedDict[Hashable, tuple[pa.Table, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> pa.Table | None:
        """The cached table, or None (counted as a miss)."""
        with self._lock:
            item = self._items.get(key)
            if item is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return item[0]

    def put(self, key: Hashable, table: pa.Table) -> None:
        """Insert, evicting least recently used entries beyond max_bytes (an oversized table is not kept)."""
        size = table.get_total_buffer_size()
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._items[key] = (table, size)
            self._bytes += size
            while self._bytes > self.max_bytes and self._items:
                _, (_, evicted) = self._items.popitem(last=False)
                self._bytes -= evicted

    @property
    def size_bytes(self) -> int:
        """Bytes currently held."""
        return self._bytes

    def clear(self) -> None:
        """Drop everything."""
        with self._lock:
            self._items.clear()
            self._bytes = 0


@dataclass(frozen=True)
class CheckpointListing:
    """What a listing of a job says about one checkpoint id."""

    checkpoint_id: int
    complete: bool
    part_ranges: tuple[tuple[int, int], ...]


def _check_range(key_groups: tuple[int, int] | None) -> tuple[int, int]:
    if key_groups is None:
        return 0, NUM_KEY_GROUPS - 1
    lo, hi = key_groups
    if not (isinstance(lo, int) and isinstance(hi, int) and 0 <= lo <= hi < NUM_KEY_GROUPS):
        raise InvalidArgumentError(f"key-group range {lo}-{hi} must satisfy 0 <= lo <= hi <= {NUM_KEY_GROUPS - 1}")
    return lo, hi


def _as_puts(table: pa.Table) -> pa.Table:
    """A canonical table as a changelog of puts."""
    kinds = pa.array(np.ones(table.num_rows, dtype=np.uint8))
    return pa.table({"row_kind": kinds, "op_id": table.column("op_id"), "key_bytes": table.column("key_bytes"), "value_bytes": table.column("value_bytes")})


def _live(changelog: pa.Table) -> pa.Table:
    """The put rows of a resolved changelog as canonical rows."""
    erased = pc.equal(changelog.column("row_kind"), ROW_ERASE)
    live = changelog.filter(pc.invert(erased)) if pc.any(erased).as_py() else changelog  # filtering copies: skip it when nothing is erased
    return live.select(["op_id", "key_bytes", "value_bytes"]).cast(CANONICAL_SCHEMA)


def search_sorted(table: pa.Table, q_keys: pa.Array, q_ops: np.ndarray) -> np.ndarray:
    """Row of each (op_id, key) query in a table sorted by (key_bytes, op_id), -1 if absent: a vectorised binary search."""
    n, m = table.num_rows, len(q_keys)
    keys = table.column("key_bytes")
    lo = np.zeros(m, dtype=np.int64)
    hi = np.full(m, n, dtype=np.int64)
    active = np.flatnonzero(lo < hi)
    while active.size:  # about log2(n) rounds, each comparing every open query at once
        mid = (lo[active] + hi[active]) // 2
        less = pc.less(keys.take(pa.array(mid)), q_keys.take(pa.array(active))).to_numpy(zero_copy_only=False)
        lo[active[less]] = mid[less] + 1
        hi[active[~less]] = mid[~less]
        active = active[lo[active] < hi[active]]
    pos = np.full(m, -1, dtype=np.int64)
    cand = np.flatnonzero(lo < n)
    step = 0
    while cand.size:  # equal keys of several operators sit next to each other, ordered by op_id
        idx = lo[cand] + step
        inside = idx < n
        cand, idx = cand[inside], idx[inside]
        if not cand.size:
            break
        same = pc.equal(keys.take(pa.array(idx)), q_keys.take(pa.array(cand))).to_numpy(zero_copy_only=False)
        cand, idx = cand[same], idx[same]
        op_match = table.column("op_id").take(pa.array(idx)).to_numpy(zero_copy_only=False) == q_ops[cand]
        pos[cand[op_match]] = idx[op_match]
        cand = cand[~op_match]
        step += 1
    return pos


def _take_chunked(column: pa.ChunkedArray, rows: np.ndarray) -> pa.Array:
    """column.take(rows) done chunk by chunk: one take per touched chunk instead of a slow many-chunk gather."""
    if column.num_chunks <= 1:
        return column.take(pa.array(rows)).combine_chunks() if isinstance(column, pa.ChunkedArray) else column.take(pa.array(rows))
    ends = np.cumsum([len(c) for c in column.chunks])
    chunk_of = np.searchsorted(ends, rows, side="right")
    order = np.argsort(chunk_of, kind="stable")
    pieces = []
    for c in np.unique(chunk_of):
        sel = order[chunk_of[order] == c]
        start = ends[c] - len(column.chunk(int(c)))
        pieces.append(column.chunk(int(c)).take(pa.array(rows[sel] - start)))
    gathered = pa.concat_arrays(pieces)
    return gathered.take(pa.array(np.argsort(order, kind="stable")))


class CheckpointReader:
    """Reads one job's checkpoints from any ObjectStore; pool-independent so the CLI can open file:// and s3:// alike."""

    def __init__(self, store: ObjectStore, job: str, cache: SegmentCache | None = None) -> None:
        self.store = store
        self.job = job
        self.cache = cache if cache is not None else SegmentCache(64 << 20)
        self._manifests: OrderedDict[int, Manifest] = OrderedDict()
        self._lock = threading.Lock()

    # ---- listing and manifests -------------------------------------------------------------------------------

    def listing(self) -> list[CheckpointListing]:
        """Every checkpoint id with a manifest or parts, ascending (one LIST of the job prefix)."""
        prefix = job_prefix(self.job)
        found: dict[int, tuple[bool, list[tuple[int, int]]]] = {}
        for info in self.store.list(prefix + "chk-"):
            m = _CHK_RE.match(info.key[len(prefix) :])
            if not m:
                continue
            cid = int(m.group(1))
            complete, ranges = found.setdefault(cid, (False, []))
            if m.group(2) == "_metadata":
                found[cid] = (True, ranges)
            else:
                ranges.append((int(m.group(3)), int(m.group(4))))
        return [CheckpointListing(cid, c, tuple(sorted(r))) for cid, (c, r) in sorted(found.items())]

    def list_checkpoints(self) -> list[int]:
        """Ids of complete checkpoints, ascending."""
        return [c.checkpoint_id for c in self.listing() if c.complete]

    def latest(self) -> int:
        """The newest complete checkpoint id, 0 if there is none."""
        ids = self.list_checkpoints()
        return ids[-1] if ids else 0

    def manifest(self, checkpoint_id: int) -> Manifest:
        """The complete manifest of checkpoint N (cached: a _metadata is never rewritten); NotFoundError otherwise."""
        with self._lock:
            cached = self._manifests.get(checkpoint_id)
        if cached is not None:
            return cached
        key = metadata_key(self.job, checkpoint_id)
        try:
            data = self.store.get(key)
        except NotFoundError:
            raise NotFoundError(f"checkpoint {checkpoint_id} of job {self.job} not found (no complete manifest in {self.store.uri})") from None
        manifest = parse_manifest(data, key)
        with self._lock:
            self._manifests[checkpoint_id] = manifest
            while len(self._manifests) > MANIFEST_CACHE_ENTRIES:
                self._manifests.popitem(last=False)
        return manifest

    def forget(self, checkpoint_id: int) -> None:
        """Drop a cached manifest (after a delete)."""
        with self._lock:
            self._manifests.pop(checkpoint_id, None)

    def checkpoint_prefix(self, checkpoint_id: int) -> str:
        """Store prefix of checkpoint N."""
        return checkpoint_prefix(self.job, checkpoint_id)

    # ---- segments ---------------------------------------------------------------------------------------------

    def load_segments(self, entry: DataFile, segments: Sequence[Segment]) -> list[pa.Table]:
        """Decoded tables of some segments of one file: cache first, then one coalesced ranged read, verified."""
        out: list[pa.Table | None] = []
        missing: list[int] = []
        for i, seg in enumerate(segments):
            table = self.cache.get((self.store.uri, self.job, entry.path, seg.offset))
            out.append(table)
            if table is None:
                missing.append(i)
        if missing:
            key = job_prefix(self.job) + entry.path
            wanted = [segments[i] for i in missing]
            if len(wanted) == len(entry.segments):
                data = self._get_file(key, entry)
                verify_file(entry, data)
                whole = pa.py_buffer(data)  # zero-copy slices: decoded columns point into the file's bytes
                blobs = [whole.slice(s.offset, s.length) for s in wanted]
            else:
                blobs = self._get_ranges(key, [(s.offset, s.length) for s in wanted])
                for seg, blob in zip(wanted, blobs, strict=True):
                    verify_segment(entry, seg, blob)
            for i, seg, blob in zip(missing, wanted, blobs, strict=True):
                table = decode_segment(entry, seg, blob)
                self.cache.put((self.store.uri, self.job, entry.path, seg.offset), table)
                out[i] = table
        return out  # type: ignore[return-value]

    def _get_file(self, key: str, entry: DataFile) -> bytes:
        try:
            return self.store.get(key)
        except NotFoundError:
            raise NotFoundError(f"data file {entry.path} of job {self.job} is missing from {self.store.uri}") from None

    def _get_ranges(self, key: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        try:
            return self.store.get_ranges(key, ranges)
        except NotFoundError:
            raise NotFoundError(f"data file {key} of job {self.job} is missing from {self.store.uri}") from None

    def _keyed_rows(self, entry: DataFile, lo: int, hi: int) -> pa.Table | None:
        """Rows of key groups lo..hi from one file (changelog for deltas, canonical for bases), or None."""
        if entry.kg_hi < lo or hi < entry.kg_lo:
            return None
        segs = [s for s in entry.segments if s.overlaps(lo, hi)]
        if not segs:
            return None
        tables = self.load_segments(entry, segs)
        table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        if any(s.kg_lo < lo or s.kg_hi > hi for s in segs):
            table = filter_key_groups(table, lo, hi)
        return table

    def _search_index(self, entry: DataFile, segments: Sequence[Segment], table: pa.Table) -> pa.Table:
        """Several segments as one contiguous chunk (cached): random access into 128 chunks is slow."""
        if len(segments) == 1:
            return table
        key = (self.store.uri, self.job, entry.path, "search-index", tuple(s.offset for s in segments))
        index = self.cache.get(key)
        if index is None:
            index = table.combine_chunks()
            self.cache.put(key, index)
        return index

    def _operator_rows(self, entry: DataFile) -> pa.Table | None:
        segs = [s for s in entry.segments if s.operator]
        if not segs:
            return None
        tables = self.load_segments(entry, segs)
        return pa.concat_tables(tables) if len(tables) > 1 else tables[0]

    # ---- layer overlay ----------------------------------------------------------------------------------------

    def _apply_layer(self, acc: pa.Table, tables: list[tuple[DataFile, pa.Table]], lo: int, hi: int) -> pa.Table:
        """Overlay one layer: delta files apply puts/erases; a base file replaces the key groups it covers."""
        deltas = [t for f, t in tables if f.changelog]
        for f, t in tables:
            if not f.changelog:  # a base is the whole state of its range: drop what older layers said there
                b_lo, b_hi = max(lo, f.kg_lo), min(hi, f.kg_hi)
                lead = leading_bytes(acc.column("key_bytes"))
                acc = acc.filter(pa.array(~((lead >= b_lo) & (lead <= b_hi))))
                deltas.append(_as_puts(t))
        if len(deltas) == 1 and acc.num_rows == 0 and len(tables) == 1:
            return _live(deltas[0])  # stored deltas are already resolved (one row per key): nothing to overlay onto
        if deltas:
            acc = overlay(acc, pa.concat_tables(deltas) if len(deltas) > 1 else deltas[0])
        return acc

    def part_keyed(self, manifest: Manifest, part: Part, lo: int, hi: int) -> pa.Table:
        """Canonical keyed rows of key groups lo..hi (clipped to the part) after every layer of the part."""
        lo, hi = max(lo, part.kg_lo), min(hi, part.kg_hi)
        acc = empty_table()
        if lo > hi:
            return acc
        for layer in part.layers:
            tables = []
            for path in layer:
                entry = manifest.file(path)
                t = self._keyed_rows(entry, lo, hi)
                if t is not None:
                    tables.append((entry, t))
            if tables:
                acc = self._apply_layer(acc, tables, lo, hi)
        return acc

    def part_operator(self, manifest: Manifest, part: Part) -> pa.Table:
        """Canonical operator-state rows of one part after every layer (each layer overlays the older ones)."""
        acc = empty_table()
        for layer in part.layers:
            tables = []
            for path in layer:
                entry = manifest.file(path)
                t = self._operator_rows(entry)
                if t is not None:
                    tables.append(t if entry.changelog else _as_puts(t))
            if tables:
                acc = overlay(acc, pa.concat_tables(tables) if len(tables) > 1 else tables[0])
        return acc

    def operator_view(self, manifest: Manifest) -> pa.Table:
        """Operator-state rows of a checkpoint: every part's view, merged by the format's rule in key-group order."""
        cache_key = (self.store.uri, self.job, "op-view", manifest.checkpoint_id, manifest.created_at_ms)
        cached = self.cache.get(cache_key)
        if cached is not None:
            return cached
        views = [self.part_operator(manifest, p) for p in manifest.parts]
        table = merge_tables(views) if len(views) > 1 else (views[0] if views else empty_table())
        table = table.cast(CANONICAL_SCHEMA)
        self.cache.put(cache_key, table)
        return table

    # ---- public reads -----------------------------------------------------------------------------------------

    def read_manifest_table(self, manifest: Manifest, key_groups: tuple[int, int] | None = None, op_ids: Sequence[int] | None = None) -> pa.Table:
        """Canonical rows of a loaded manifest: keyed rows of the range part by part, then operator-state rows."""
        lo, hi = _check_range(key_groups)
        tables = [self.part_keyed(manifest, p, lo, hi) for p in manifest.parts if p.overlaps(lo, hi)]
        tables.append(self.operator_view(manifest))
        table = pa.concat_tables([t.cast(CANONICAL_SCHEMA) for t in tables])
        if op_ids:
            table = table.filter(pc.is_in(table.column("op_id"), value_set=pa.array(list(op_ids), pa.uint64())))
        return table

    def read_table(self, checkpoint_id: int, key_groups: tuple[int, int] | None = None, op_ids: Sequence[int] | None = None) -> pa.Table:
        """Canonical table of checkpoint N (0 = latest complete) for a key-group range and optional op_ids."""
        if checkpoint_id == 0:
            checkpoint_id = self.latest()
            if checkpoint_id == 0:
                raise NotFoundError(f"job {self.job} has no complete checkpoint in {self.store.uri}")
        return self.read_manifest_table(self.manifest(checkpoint_id), key_groups, op_ids)

    def lookup(self, manifest: Manifest, op_ids: Sequence[int], keys: Sequence[bytes]) -> tuple[np.ndarray, list[bytes]]:
        """Point reads: (found mask, values) answered by the newest layer holding each key; erases hide older values."""
        n = len(keys)
        if len(op_ids) != n:
            raise InvalidArgumentError(f"{len(op_ids)} op_ids for {n} keys; they must pair up")
        found = np.zeros(n, dtype=bool)
        values: list[bytes] = [b""] * n
        if n == 0:
            return found, values
        q_ops = pa.array(list(op_ids), pa.uint64())
        q_keys = pa.array(list(keys), pa.binary())
        q_comp = composite_keys(q_ops, q_keys)
        lead = leading_bytes(q_keys)
        empty = pc.equal(pc.binary_length(q_keys), 0).to_numpy(zero_copy_only=False)
        keyed = (lead < NUM_KEY_GROUPS) & ~empty

        q_op_np = np.asarray(list(op_ids), dtype=np.uint64)

        def answer(idx: np.ndarray, table: pa.Table, changelog: bool, is_sorted: bool = True) -> np.ndarray:
            """Resolve queries idx against table; returns which of idx were decided (hit, or erased)."""
            if table.num_rows == 0 or idx.size == 0:
                return np.zeros(idx.size, dtype=bool)
            if is_sorted:  # data files are sorted by (key, op_id): binary search, nothing hashed per call
                pos = search_sorted(table, q_keys.take(pa.array(idx)), q_op_np[idx])
            else:
                comp = composite_keys(table.column("op_id"), table.column("key_bytes"))
                pos = pc.fill_null(pc.index_in(q_comp.take(pa.array(idx)), value_set=comp), -1).to_numpy(zero_copy_only=False)
            hit = pos >= 0
            if not hit.any():
                return hit
            rows = pos[hit].astype(np.int64)
            hit_idx = idx[hit]
            vals = _take_chunked(table.column("value_bytes"), rows).to_pylist()
            live = np.ones(hit_idx.size, dtype=bool)
            if changelog:
                live = _take_chunked(table.column("row_kind"), rows).to_numpy(zero_copy_only=False) != ROW_ERASE
            for j, (i, v) in enumerate(zip(hit_idx.tolist(), vals, strict=True)):  # loop over answered keys, not rows
                if live[j]:
                    found[i] = True
                    values[i] = v
            return hit

        for part in manifest.parts:
            pending = np.flatnonzero(keyed & (lead >= part.kg_lo) & (lead <= part.kg_hi))
            for layer in reversed(part.layers):
                if pending.size == 0:
                    break
                for path in layer:
                    if pending.size == 0:
                        break
                    entry = manifest.file(path)
                    inside = pending[(lead[pending] >= entry.kg_lo) & (lead[pending] <= entry.kg_hi)]
                    if inside.size == 0:
                        continue
                    groups = np.unique(lead[inside])
                    segs = [s for s in entry.segments if not s.operator and np.any((groups >= s.kg_lo) & (groups <= s.kg_hi))]
                    decided = np.zeros(inside.size, dtype=bool)
                    if segs:
                        tables = self.load_segments(entry, segs)
                        table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
                        decided = answer(inside, self._search_index(entry, segs, table), entry.changelog)
                    if not entry.changelog:
                        decided[:] = True  # a base is complete for its range: a miss there is final
                    pending = np.setdiff1d(pending, inside[decided], assume_unique=True)
        op_idx = np.flatnonzero(lead >= NUM_KEY_GROUPS)
        if op_idx.size:
            answer(op_idx, self.operator_view(manifest), False, is_sorted=False)
        return found, values
