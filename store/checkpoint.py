"""Reading checkpoints straight from a store: listings, manifests, verified segment reads, layers merged, point lookups."""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from snapshot import (
    CANONICAL_SCHEMA,
    NUM_KEY_GROUPS,
    ROW_ERASE,
    check_key_group_range,
    empty_table,
    filter_key_groups,
    leading_bytes,
    merge_tables,
    overlay,
)
from snapshot.errors import InvalidArgumentError, NotFoundError
from snapshot.key_index import KeyIndex, hash_keys
from store.assembly import (
    Piece,
    apply_layer,
    as_puts,
    assemble,
    deltas_in_sequence,
    live_piece,
    merge_same_checkpoint,
    overlay_pieces,
    pieces_of_op_ids,
)
from store.block_index import BlockIndex, IndexTop, parse_index_top, parse_partition
from store.datafile import (
    DataFile,
    Segment,
    decode_blocks,
    decode_segment,
    operator_state_sources,
    verify_block,
    verify_file,
    verify_segment,
)
from store.layout import checkpoint_prefix, checkpoints_prefix, job_file_key, metadata_key, parse_job_key, writers_key
from store.manifest import Manifest, Part, ordered_layers, parse_manifest
from store.objects import ObjectStore, coalesce_ranges
from store.segment_cache import SegmentCache
from store.writers import EMPTY_TABLE, WriterTable, parse_writers

MANIFEST_CACHE_ENTRIES = 256
# a segment's whole block index up to this many chars of footer text is read with its top, in one request
SMALL_INDEX_CHARS = 16 << 10


@dataclass(frozen=True)
class CheckpointListing:
    """What a listing of a job says about one checkpoint id: its _metadata's etag (None: incomplete) and its staged parts."""

    checkpoint_id: int
    complete: bool
    part_ranges: tuple[tuple[int, int], ...]
    metadata_etag: str | None = None
    part_names: tuple[tuple[str, int, int, int | None], ...] = ()  # (key, kg_lo, kg_hi, epoch from the name)


def _check_range(key_groups: tuple[int, int] | None) -> tuple[int, int]:
    if key_groups is None:
        return 0, NUM_KEY_GROUPS - 1
    lo, hi = key_groups
    return check_key_group_range(lo, hi)


def _keyed_segments(entry: DataFile) -> tuple[list[Segment], np.ndarray, np.ndarray]:
    """A file's keyed segments and their key-group bounds as arrays."""
    segs = [s for s in entry.segments if not s.operator]
    return segs, np.fromiter((s.kg_lo for s in segs), np.int64, len(segs)), np.fromiter((s.kg_hi for s in segs), np.int64, len(segs))


def find_in_block(table: pa.Table, keys: Sequence[bytes] | pa.Array, ops: np.ndarray) -> np.ndarray:
    """Row of each (key, op) in one block (rows sorted by key, then op_id), -1 where absent."""
    block_keys = table.column("key_bytes")
    pos = pc.index_in(pa.array(keys, pa.binary()) if not isinstance(keys, pa.Array) else keys, value_set=block_keys)
    pos_np = pc.fill_null(pos, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    if not (pos_np >= 0).any():
        return pos_np
    block_ops = table.column("op_id").to_numpy()
    hit = pos_np >= 0
    wrong_op = np.flatnonzero(hit & (block_ops[np.maximum(pos_np, 0)] != ops))
    for j in wrong_op.tolist():  # the same key under several operators: its rows, found in one vectorised pass each
        same = pc.equal(block_keys, block_keys[int(pos_np[j])]).to_numpy(zero_copy_only=False) & (block_ops == ops[j])
        rows = np.flatnonzero(same)
        pos_np[j] = rows[0] if rows.size else -1
    return pos_np


def find_one_in_block(table: pa.Table, key: bytes, op_id: int) -> int:
    """Row of (key, op_id) in one block (rows sorted by key, then op_id), -1 where absent: one scan in C, no arrays built."""
    row = pc.index(table.column("key_bytes"), pa.scalar(key, pa.binary())).as_py()
    if row < 0:
        return -1
    ops = table.column("op_id")
    if ops[row].as_py() == op_id:
        return int(row)
    return int(find_in_block(table, [key], np.array([op_id], dtype=np.uint64))[0])  # the key under several operators


class CheckpointReader:
    """Reads one job's checkpoints from any ObjectStore; pool-independent so the CLI can open file:// and s3:// alike."""

    def __init__(self, store: ObjectStore, job: str, cache: SegmentCache | None = None, resolved_index_after: int = 8) -> None:
        self.store = store
        self.job = job
        self.cache = cache if cache is not None else SegmentCache(64 << 20)
        # after this many point-read batches on one checkpoint, its merged view gets one index (one probe, not one per layer)
        self.resolved_index_after = resolved_index_after
        self._lookups: OrderedDict[str, int] = OrderedDict()
        self._building: set[tuple] = set()
        self._manifests: OrderedDict[int, tuple[Manifest, str]] = OrderedDict()
        self._bounds: dict[str, tuple[list[Segment], np.ndarray, np.ndarray]] = {}
        self._lock = threading.Lock()

    # ---- listing and manifests -------------------------------------------------------------------------------

    def listing(self) -> list[CheckpointListing]:
        """Every checkpoint id with a manifest or parts, ascending (one LIST of the job's checkpoint folders)."""
        found: dict[int, tuple[str | None, list[tuple[str, int, int, int | None]]]] = {}
        for info in self.store.list(checkpoints_prefix(self.job)):
            parsed = parse_job_key(info.key)
            if parsed is None or parsed.kind not in ("metadata", "part") or parsed.job != self.job:
                continue
            etag, parts = found.setdefault(parsed.checkpoint_id, (None, []))
            if parsed.kind == "metadata":
                found[parsed.checkpoint_id] = (info.etag, parts)
            else:
                parts.append((info.key, parsed.kg_lo, parsed.kg_hi, parsed.epoch))
        return [
            CheckpointListing(cid, etag is not None, tuple(sorted({(lo, hi) for _, lo, hi, _ in parts})), etag, tuple(sorted(parts)))
            for cid, (etag, parts) in sorted(found.items())
        ]

    def writers(self) -> WriterTable:
        """The job's writers table (empty when none was ever registered: a savepoint, a copied job)."""
        try:
            return parse_writers(self.store.get(writers_key(self.job)), writers_key(self.job))
        except NotFoundError:
            return EMPTY_TABLE

    def complete_checkpoints(self, listing: list[CheckpointListing] | None = None) -> list[tuple[Manifest, str, bool]]:
        """(manifest, etag, abandoned) of every complete checkpoint, ascending; abandoned: left behind by a rewind."""
        listing = self.listing() if listing is None else listing
        complete = [c for c in listing if c.complete]
        if not complete:
            return []
        table = self.writers()
        out = []
        for item in complete:
            try:
                manifest, etag = self.manifest_and_etag(item.checkpoint_id, item.metadata_etag)
            except NotFoundError:
                continue  # deleted since the listing
            out.append((manifest, etag, table.abandons(manifest.checkpoint_id, manifest.max_epoch)))
        return out

    def list_checkpoints(self) -> list[int]:
        """Ids of complete checkpoints that no rewind abandoned, ascending."""
        return [m.checkpoint_id for m, _, abandoned in self.complete_checkpoints() if not abandoned]

    def latest_manifest(self) -> tuple[Manifest, str] | None:
        """The newest complete checkpoint no rewind abandoned, with its etag; None if there is none (one LIST, one GET)."""
        listing = [c for c in self.listing() if c.complete]
        if not listing:
            return None
        table = self.writers()
        for item in reversed(listing):  # newest first: usually the first one answers
            try:
                manifest, etag = self.manifest_and_etag(item.checkpoint_id, item.metadata_etag)
            except NotFoundError:
                continue
            if not table.abandons(manifest.checkpoint_id, manifest.max_epoch):
                return manifest, etag
        return None

    def latest(self) -> int:
        """The newest complete checkpoint id no rewind abandoned, 0 if there is none."""
        found = self.latest_manifest()
        return found[0].checkpoint_id if found else 0

    def manifest(self, checkpoint_id: int, etag: str | None = None) -> Manifest:
        """The complete manifest of checkpoint N; from the cache only when ``etag`` says the cached one is current."""
        return self.manifest_and_etag(checkpoint_id, etag)[0]

    def manifest_and_etag(self, checkpoint_id: int, etag: str | None = None) -> tuple[Manifest, str]:
        """(manifest, etag) of checkpoint N: served from the cache when ``etag`` (from a listing or a client) matches, else read.

        A _metadata can be replaced (compaction, a newer attempt re-committing the id) or deleted and written again, so a
        cached manifest is only trusted with proof that it is the current version.
        """
        if etag is not None:
            with self._lock:
                cached = self._manifests.get(checkpoint_id)
            if cached is not None and cached[1] == etag:
                return cached
        key = metadata_key(self.job, checkpoint_id)
        try:
            data, current = self.store.get_with_etag(key)
        except NotFoundError:
            self.forget(checkpoint_id)
            raise NotFoundError(
                f"checkpoint {checkpoint_id} of job {self.job} not found (no complete manifest in {self.store.uri})"
            ) from None
        with self._lock:
            cached = self._manifests.get(checkpoint_id)
        if cached is not None and cached[1] == current:
            return cached
        manifest = parse_manifest(data, key)
        with self._lock:
            self._manifests[checkpoint_id] = (manifest, current)
            self._manifests.move_to_end(checkpoint_id)
            while len(self._manifests) > MANIFEST_CACHE_ENTRIES:
                self._manifests.popitem(last=False)
        return manifest, current

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
            key = job_file_key(self.job, entry.path)
            wanted = [segments[i] for i in missing]
            blobs: list[pa.Buffer] = [pa.py_buffer(b"")] * len(wanted)
            if sum(s.length for s in wanted) * 10 >= self._segment_bytes(entry) * 9:  # (nearly) all of it: one GET, checked by sha256
                data = self._get_file(key, entry)
                verify_file(entry, data)
                whole = pa.py_buffer(data)  # zero-copy slices: decoded columns point into the file's bytes
                blobs = [whole.slice(s.offset, s.length) for s in wanted]
            else:
                for start, length, members in coalesce_ranges([(s.offset, s.length) for s in wanted], self.store.coalesce_gap_bytes):
                    span = pa.py_buffer(self._get_range(key, entry, start, length))
                    for j in members:
                        rel = wanted[j].offset - start
                        blobs[j] = span.slice(
                            min(rel, span.size), max(0, min(wanted[j].length, span.size - rel))
                        )  # short read: caught below
                        verify_segment(entry, wanted[j], blobs[j])
            # segments of a big read are not kept: they would pin the whole read in memory (a scan keeps its result instead)
            keep = sum(b.size for b in blobs) <= self.cache.max_bytes // 8
            for i, seg, blob in zip(missing, wanted, blobs, strict=True):
                table = decode_segment(entry, seg, blob)
                if keep:
                    self.cache.put((self.store.uri, self.job, entry.path, seg.offset), table)
                out[i] = table
        return out  # every None was filled in above

    def _segment_bytes(self, entry: DataFile) -> int:
        """Bytes of a file's segments (the file less its header and footer, which hold the block indexes)."""
        return sum(s.length for s in entry.segments)

    @contextmanager
    def _file_named(self, entry: DataFile) -> Iterator[None]:
        """A missing data file is NotFoundError naming it, its job and the store (not the bare store key)."""
        try:
            yield
        except NotFoundError:
            raise NotFoundError(f"data file {entry.path} of job {self.job} is missing from {self.store.uri}") from None

    def _get_file(self, key: str, entry: DataFile) -> bytes:
        with self._file_named(entry):
            return self.store.get(key)

    def _get_range(self, key: str, entry: DataFile, start: int, length: int) -> bytes:
        with self._file_named(entry):
            return self.store.get_range(key, start, length)

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

    def key_index(self, entry: DataFile, segments: Sequence[Segment]) -> KeyIndex:
        """The (cached) hash index over some segments of a file: built once, shared by every checkpoint naming the file."""
        key = (self.store.uri, self.job, entry.path, "key-index", tuple(s.offset for s in segments))
        index = self.cache.get(key)
        if index is None:
            tables = self.load_segments(entry, segments)
            index = KeyIndex.build(pa.concat_tables(tables) if len(tables) > 1 else tables[0])
            self.cache.put(key, index, index.nbytes)
        return index

    def reads_by_block(self, entry: DataFile) -> bool:
        """Whether point reads of this file fetch single blocks: it has block indexes and is large next to the cache.

        A file that fits easily is indexed whole once (one probe answers many keys); one that does not would evict and
        re-read whole segments for every few keys, so it is read a block at a time instead.
        """
        return entry.size * 4 > self.cache.max_bytes and all(s.index is not None for s in entry.segments)

    def _cached_pieces(self, entry: DataFile, keys: list[tuple], range_of: Callable[[int], tuple[int, int]], decode) -> list:
        """The cached values under ``keys``; the missing ones fetched in one call of ranged reads, ``decode(i, bytes)`` to
        (value, bytes held) each and cached.
        """
        out = [self.cache.get(k) for k in keys]
        missing = [i for i, found in enumerate(out) if found is None]
        if missing:
            for i, data in zip(missing, self._get_ranges(entry, [range_of(i) for i in missing]), strict=True):
                value, size = decode(i, data)
                self.cache.put(keys[i], value, size)
                out[i] = value
        return out

    def index_tops(self, entry: DataFile, segments: Sequence[Segment]) -> list[IndexTop]:
        """The (cached) top block index of some segments, in one coalesced read: a small index is read whole, partitions too."""

        def range_of(i: int) -> tuple[int, int]:
            offset, top_len, _, total = segments[i].index  # type: ignore[misc]
            return offset, total if total <= SMALL_INDEX_CHARS else top_len

        def decode(i: int, data: bytes) -> tuple[IndexTop, int]:
            seg = segments[i]
            assert seg.index is not None
            _, top_len, crc, total = seg.index
            where = f"{entry.path} (block index of the segment at offset {seg.offset})"
            top = parse_index_top(data[:top_len], where, crc, seg.offset, seg.offset + seg.length, seg.rows)
            if len(data) == total:  # read whole: its partitions are here too
                for p in range(len(top.first_keys)):
                    at = int(top.text_offsets[p])
                    self._parse_partition(entry, seg, top, p, data[at : at + int(top.text_lengths[p])])
            return top, top.nbytes

        keys = [(self.store.uri, self.job, entry.path, "index-top", s.offset) for s in segments]
        return self._cached_pieces(entry, keys, range_of, decode)

    def index_partitions(self, entry: DataFile, wanted: Sequence[tuple[Segment, IndexTop, int]]) -> list[BlockIndex]:
        """The (cached) partitions (segment, its top, partition number) of one file: missing ones in one call of ranged reads."""

        def range_of(i: int) -> tuple[int, int]:
            seg, top, p = wanted[i]
            assert seg.index is not None
            return seg.index[0] + int(top.text_offsets[p]), int(top.text_lengths[p])

        def decode(i: int, data: bytes) -> tuple[BlockIndex, int]:
            part = self._parse_partition(entry, *wanted[i], data)
            return part, part.nbytes

        return self._cached_pieces(entry, [self._partition_key(entry, seg, p) for seg, _, p in wanted], range_of, decode)

    def _partition_key(self, entry: DataFile, seg: Segment, p: int) -> tuple:
        return (self.store.uri, self.job, entry.path, "index-part", seg.offset, p)

    def _parse_partition(self, entry: DataFile, seg: Segment, top: IndexTop, p: int, data: bytes) -> BlockIndex:
        part = parse_partition(data, f"{entry.path} (block index partition {p} of the segment at offset {seg.offset})", top, p)
        self.cache.put(self._partition_key(entry, seg, p), part, part.nbytes)
        return part

    def blocks(self, entry: DataFile, wanted: Sequence[tuple[BlockIndex, int]]) -> list[pa.Table]:
        """The (cached) rows of some (segment's index, block) of one file: missing ones in one call of concurrent ranged reads, verified."""

        def range_of(i: int) -> tuple[int, int]:
            index, b = wanted[i]
            return int(index.offsets[b]), int(index.lengths[b])

        def decode(i: int, data: bytes) -> tuple[pa.Table, int]:
            index, b = wanted[i]
            verify_block(entry, index, b, data)
            table = decode_blocks(entry, int(index.offsets[b]), data, int(index.rows[b]))
            where = f"data file {entry.path} (block at offset {int(index.offsets[b])})"
            index.check_first_row(b, table.column("key_bytes")[0].as_py(), table.column("op_id")[0].as_py(), where)
            return table, len(data) + 64

        keys = [(self.store.uri, self.job, entry.path, "block", int(index.offsets[b])) for index, b in wanted]
        return self._cached_pieces(entry, keys, range_of, decode)

    def lookup_one_by_block(self, entry: DataFile, op_id: int, key: bytes, key_hash: int) -> tuple[pa.Table, int] | None:
        """The block of ``entry`` holding (op_id, key) and its row there (a put, or an erase in a delta), or None if it holds none."""
        lead = key[0] if key else 0
        segment = next((s for s in entry.segments if s.overlaps(lead, lead)), None)
        if segment is None:
            return None
        (top,) = self.index_tops(entry, [segment])
        (part,) = self.index_partitions(entry, [(segment, top, top.partition_of(key, op_id))])
        if not part.may_hold(np.array([key_hash], dtype=np.uint64))[0]:
            return None
        (table,) = self.blocks(entry, [(part, part.block_of(key, op_id))])
        row = find_one_in_block(table, key, op_id)
        return (table, row) if row >= 0 else None

    def _get_ranges(self, entry: DataFile, ranges: list[tuple[int, int]]) -> list[bytes]:
        with self._file_named(entry):
            return self.store.get_ranges(job_file_key(self.job, entry.path), ranges)

    def _operator_rows(self, entry: DataFile) -> pa.Table | None:
        segs = [s for s in entry.segments if s.operator]
        if not segs:
            return None
        tables = self.load_segments(entry, segs)
        return pa.concat_tables(tables) if len(tables) > 1 else tables[0]

    # ---- layer overlay ----------------------------------------------------------------------------------------

    def part_keyed_pieces(self, manifest: Manifest, part: Part, lo: int, hi: int) -> list[Piece]:
        """Keyed rows of key groups lo..hi (clipped to the part) after every layer, as pieces still to assemble."""
        lo, hi = max(lo, part.kg_lo), min(hi, part.kg_hi)
        if lo > hi:
            return []
        pieces: list[Piece] = []
        pending: list[pa.Table] = []  # consecutive delta layers, applied together: one pass over what lies below them

        def flush(pieces: list[Piece]) -> list[Piece]:
            if not pending:
                return pieces
            rest = pending[:]
            if not pieces:
                pieces, rest = [live_piece(rest[0])], rest[1:]  # a stored delta is already resolved: onto nothing it is just its puts
            pending.clear()
            return overlay_pieces(pieces, deltas_in_sequence(rest)) if rest else pieces

        for layer in ordered_layers(manifest, part):
            tables = []
            for path in layer:
                entry = manifest.file(path)
                t = self._keyed_rows(entry, lo, hi)
                if t is None and not entry.changelog and entry.kg_lo <= hi and lo <= entry.kg_hi:
                    t = empty_table()  # a base without rows here still replaces what older layers hold for its key groups
                if t is not None:
                    tables.append((entry, t))
            if not tables:
                continue
            if all(f.changelog for f, _ in tables):
                pending.extend(t for _, t in tables)
            else:
                acc = assemble(flush(pieces)) if pieces or pending else empty_table()
                pieces = [(apply_layer(acc, tables, lo, hi), None)]
        return flush(pieces)

    def part_keyed(self, manifest: Manifest, part: Part, lo: int, hi: int) -> pa.Table:
        """Canonical keyed rows of key groups lo..hi (clipped to the part) after every layer of the part."""
        pieces = self.part_keyed_pieces(manifest, part, lo, hi)
        return assemble(pieces) if pieces else empty_table()

    def part_operator(self, manifest: Manifest, part: Part, legacy_only: bool = False) -> pa.Table:
        """Canonical operator-state rows of one part after every layer (each layer overlays the older ones).

        ``legacy_only``: only the files written before as_of existed (the state newer files start from).
        """
        acc = empty_table()
        for layer in part.layers:
            tables = []
            for path in layer:
                entry = manifest.file(path)
                if legacy_only and entry.as_of is not None:
                    continue
                t = self._operator_rows(entry)
                if t is not None:
                    tables.append(t if entry.changelog else as_puts(t))
            if tables:
                acc = overlay(acc, pa.concat_tables(tables) if len(tables) > 1 else tables[0])
        return acc

    def operator_view(self, manifest: Manifest) -> pa.Table:
        """Operator-state rows of a checkpoint: every part's view, merged by the format's rule in key-group order."""
        cache_key = (self.store.uri, self.job, "op-view", manifest.identity)
        cached = self.cache.get(cache_key)
        if cached is not None:
            return cached
        entries = {path: manifest.file(path) for p in manifest.parts for layer in p.layers for path in layer}
        legacy = [e for e in entries.values() if e.as_of is None]
        dated = [e for e in entries.values() if e.as_of is not None]
        if legacy and not any(not e.changelog for e in dated):
            # files written before as_of existed are older than every dated one: their state (the old per-part merge)
            # is where the dated deltas start from, unless a dated base (which holds the whole view as of it) supersedes it
            views = [self.part_operator(manifest, p, legacy_only=True) for p in manifest.parts]
            start = merge_tables(views) if len(views) > 1 else (views[0] if views else empty_table())
            table = self._recent_operator_rows(dated, start)
        else:
            table = self._recent_operator_rows(dated)
        table = table.cast(CANONICAL_SCHEMA)
        self.cache.put(cache_key, table)
        return table

    def _recent_operator_rows(self, entries: list[DataFile], start_table: pa.Table | None = None) -> pa.Table:
        """Operator state by recency: the newest base (a global view as of its checkpoint), then newer deltas checkpoint by checkpoint.

        Each file counts once however many parts name it. Deltas of one checkpoint (one per writing subtask) are combined by
        the format's rule: their puts merged (lowest key groups first), an erase applies where no subtask put the key.
        """
        newest, deltas = operator_state_sources(entries)
        acc = start_table if start_table is not None else empty_table()
        if newest is not None:
            rows = self._operator_rows(newest)
            acc = rows if rows is not None else acc
        for _, same in itertools.groupby(deltas, key=lambda e: e.as_of):
            tables = [t for t in (self._operator_rows(e) for e in same) if t is not None]
            acc = overlay(acc, merge_same_checkpoint(tables))
        return acc

    # ---- public reads -----------------------------------------------------------------------------------------

    def read_manifest_table(
        self, manifest: Manifest, key_groups: tuple[int, int] | None = None, op_ids: Sequence[int] | None = None
    ) -> pa.Table:
        """Canonical rows of a loaded manifest: keyed rows of the range part by part, then operator-state rows."""
        lo, hi = _check_range(key_groups)
        ops = tuple(sorted(set(op_ids))) if op_ids else ()
        # checkpoints never change, so a read asked for twice is answered from the cache
        cache_key = (self.store.uri, self.job, "table", manifest.identity, lo, hi, ops)
        cached = self.cache.get(cache_key)
        if cached is not None:
            return cached
        pieces = [piece for p in manifest.parts if p.overlaps(lo, hi) for piece in self.part_keyed_pieces(manifest, p, lo, hi)]
        pieces.append((self.operator_view(manifest), None))
        if ops:
            pieces = pieces_of_op_ids(pieces, ops)
        table = assemble(pieces)  # one contiguous chunk per column: the stream writer need not copy it again
        self.cache.put(cache_key, table)
        return table

    def read_table(self, checkpoint_id: int, key_groups: tuple[int, int] | None = None, op_ids: Sequence[int] | None = None) -> pa.Table:
        """Canonical table of checkpoint N (0 = latest complete) for a key-group range and optional op_ids."""
        if checkpoint_id == 0:
            checkpoint_id = self.latest()
            if checkpoint_id == 0:
                raise NotFoundError(f"job {self.job} has no complete checkpoint in {self.store.uri}")
        return self.read_manifest_table(self.manifest(checkpoint_id), key_groups, op_ids)

    def _segment_bounds(self, entry: DataFile) -> tuple[list[Segment], np.ndarray, np.ndarray]:
        """A file's keyed segments and their key-group bounds as arrays (memoised by path: data files never change)."""
        found = self._bounds.get(entry.path)
        if found is None:
            found = _keyed_segments(entry)
            with self._lock:
                if len(self._bounds) > 4096:
                    self._bounds.clear()
                self._bounds[entry.path] = found
        return found

    def lookup(
        self, manifest: Manifest, op_ids: Sequence[int] | np.ndarray, keys: Sequence[bytes] | pa.Array
    ) -> tuple[np.ndarray, list[bytes]]:
        """Point reads: (found mask, values) answered by the newest layer holding each key; erases hide older values."""
        found, values = self.lookup_values(manifest, op_ids, keys)
        return found, values.to_pylist()

    def lookup_values(
        self, manifest: Manifest, op_ids: Sequence[int] | np.ndarray, keys: Sequence[bytes] | pa.Array
    ) -> tuple[np.ndarray, pa.Array]:
        """Point reads like lookup, with the values as one binary array without nulls (b"" where not found), for callers that encode in bulk."""
        n = len(keys)
        if len(op_ids) != n:
            raise InvalidArgumentError(f"{len(op_ids)} op_ids for {n} keys; they must pair up")
        found = np.zeros(n, dtype=bool)
        if n == 0:
            return found, pa.array([], pa.binary())
        q_keys = keys if isinstance(keys, pa.Array) else pa.array(list(keys), pa.binary())
        q_ops = np.asarray(op_ids, dtype=np.uint64)
        q_hash = hash_keys(q_ops, q_keys)
        resolved = self.resolved_index(manifest)
        if resolved is not None:  # a checkpoint read often: its merged view answers in one probe
            pos = resolved.find(q_hash, q_keys, q_ops)
            found = pos >= 0
            vals = resolved.values.take(pa.array(pos, mask=~found))
            return found, pc.fill_null(vals, b"") if not found.all() else vals
        lead = leading_bytes(q_keys)
        open_ = lead < NUM_KEY_GROUPS  # keyed queries not yet decided by a newer layer (an empty legacy key is key group 0)
        answered_idx: list[np.ndarray] = []
        answered_vals: list[pa.Array] = []

        def record(idx: np.ndarray, table: pa.Table, pos: np.ndarray, changelog: bool) -> np.ndarray:
            """Take the answers of queries idx found at rows pos (-1: absent) of table; returns which were decided (hit, or erased)."""
            hit = pos >= 0
            if not hit.any():
                return hit
            rows, hit_idx = pos[hit], idx[hit]
            if changelog:
                live = table.column("row_kind").take(pa.array(rows)).to_numpy(zero_copy_only=False) != ROW_ERASE
                rows, hit_idx = rows[live], hit_idx[live]
            found[hit_idx] = True
            answered_idx.append(hit_idx)
            answered_vals.append(table.column("value_bytes").take(pa.array(rows)).combine_chunks())
            return hit

        def answer(idx: np.ndarray, index: KeyIndex, changelog: bool) -> np.ndarray:
            """Resolve queries idx against one index; returns which of idx were decided (hit, or erased)."""
            if index.table.num_rows == 0 or idx.size == 0:
                return np.zeros(idx.size, dtype=bool)
            return record(idx, index.table, index.find(q_hash[idx], q_keys.take(pa.array(idx)), q_ops[idx]), changelog)

        def answer_by_block(idx: np.ndarray, entry: DataFile, keyed_segs: list[Segment], seg_hi: np.ndarray) -> np.ndarray:
            """Resolve queries idx against one file a block at a time: its bloom filters skip the blocks that lack a key."""
            decided = np.zeros(idx.size, dtype=bool)
            seg_of = np.minimum(np.searchsorted(seg_hi, lead[idx], side="left"), len(keyed_segs) - 1)  # segments tile in order
            wanted = np.unique(seg_of)
            segs = [keyed_segs[i] for i in wanted]
            in_range = np.array([s.kg_lo for s in segs])[np.searchsorted(wanted, seg_of)] <= lead[idx]
            tops = dict(zip(wanted.tolist(), self.index_tops(entry, segs), strict=True))
            by_partition: dict[tuple[int, int], list[tuple[int, bytes]]] = {}
            for seg_i, top in tops.items():
                for j in np.flatnonzero((seg_of == seg_i) & in_range).tolist():  # a loop over queried keys, never over rows
                    q = int(idx[j])
                    key = q_keys[q].as_py()
                    by_partition.setdefault((seg_i, top.partition_of(key, int(q_ops[q]))), []).append((j, key))
            chosen = sorted(by_partition)
            parts = self.index_partitions(entry, [(keyed_segs[seg_i], tops[seg_i], p) for seg_i, p in chosen])
            by_block: dict[tuple[int, int, int], list[int]] = {}
            partitions = {}
            for (seg_i, p), part in zip(chosen, parts, strict=True):
                partitions[(seg_i, p)] = part
                in_part = by_partition[(seg_i, p)]
                maybe = part.may_hold(q_hash[idx[np.array([j for j, _ in in_part], dtype=np.int64)]])
                for (j, key), ok in zip(in_part, maybe.tolist(), strict=True):
                    if ok:
                        by_block.setdefault((seg_i, p, part.block_of(key, int(q_ops[int(idx[j])]))), []).append(j)
            in_file_order = sorted(by_block)  # so neighbouring blocks coalesce
            tables = self.blocks(entry, [(partitions[(seg_i, p)], b) for seg_i, p, b in in_file_order])
            one_idx: list[int] = []  # blocks asked for one key (the usual case once state outgrows the cache): no arrays
            one_vals: list[bytes] = []
            for block_key, table in zip(in_file_order, tables, strict=True):
                if len(by_block[block_key]) == 1:
                    (j,) = by_block[block_key]
                    q = int(idx[j])
                    row = find_one_in_block(table, q_keys[q].as_py(), int(q_ops[q]))
                    if row >= 0:
                        decided[j] = True
                        if not entry.changelog or table.column("row_kind")[row].as_py() != ROW_ERASE:
                            one_idx.append(q)
                            one_vals.append(table.column("value_bytes")[row].as_py())
                    continue
                members = np.asarray(by_block[block_key], dtype=np.int64)
                queries = idx[members]
                pos = find_in_block(table, q_keys.take(pa.array(queries)), q_ops[queries])
                decided[members] = record(queries, table, pos, entry.changelog)
            if one_idx:
                hits = np.asarray(one_idx, dtype=np.int64)
                found[hits] = True
                answered_idx.append(hits)
                answered_vals.append(pa.array(one_vals, pa.binary()))
            return decided

        for part in manifest.parts:
            in_part = (lead >= part.kg_lo) & (lead <= part.kg_hi)
            for layer in reversed(ordered_layers(manifest, part)):
                for path in layer:
                    entry = manifest.file(path)
                    inside = np.flatnonzero(open_ & in_part & (lead >= entry.kg_lo) & (lead <= entry.kg_hi))
                    if inside.size == 0:
                        continue
                    keyed_segs, seg_lo, seg_hi = self._segment_bounds(entry)
                    present = np.concatenate([[0], np.cumsum(np.bincount(lead[inside], minlength=NUM_KEY_GROUPS) > 0)])
                    needed = np.flatnonzero(present[seg_hi + 1] - present[seg_lo] > 0)  # segments holding a queried key group
                    decided = np.zeros(inside.size, dtype=bool)
                    if needed.size and self.reads_by_block(entry):
                        decided = answer_by_block(inside, entry, keyed_segs, seg_hi)
                    elif needed.size:
                        # a few segments: index just those; many: index the whole file once for every later lookup
                        segs = [keyed_segs[i] for i in needed] if needed.size <= 4 else keyed_segs
                        decided = answer(inside, self.key_index(entry, segs), entry.changelog)
                    if not entry.changelog:
                        decided[:] = True  # a base is complete for its range: a miss there is final
                    open_[inside[decided]] = False
                if not open_.any():
                    break
        op_idx = np.flatnonzero(lead >= NUM_KEY_GROUPS)
        if op_idx.size:
            answer(op_idx, self.operator_index(manifest), False)
        if not answered_idx:
            return found, pa.array([b""] * n, pa.binary())
        # one gather puts every answer in query order; unanswered queries read as b""
        where = np.full(n, -1, dtype=np.int64)
        where[np.concatenate(answered_idx)] = np.arange(sum(len(a) for a in answered_idx))
        vals = pa.concat_arrays(answered_vals).take(pa.array(where, mask=where < 0))
        return found, pc.fill_null(vals, b"")

    def resolved_index(self, manifest: Manifest) -> KeyIndex | None:
        """The index of the checkpoint's merged view once it has been read by key often enough (and fits the cache).

        Every call counts as a read by key (a Get or a MultiGet batch); past ``resolved_index_after`` of them the index is
        built off the request path, and until it is ready None is returned (read the layers).
        """
        key = (self.store.uri, self.job, "resolved-index", manifest.identity)
        index = self.cache.get(key)
        if index is not None:
            return index
        if self.resolved_index_after < 0:
            return None
        with self._lock:
            ident = manifest.identity
            count = self._lookups.pop(ident, 0) + 1
            self._lookups[ident] = count
            while len(self._lookups) > 256:
                self._lookups.popitem(last=False)
        if count <= self.resolved_index_after or manifest.total_bytes * 3 > self.cache.max_bytes:
            return None
        if self.resolved_index_after == 0:  # asked for at once (tests): build it here
            self._build_resolved(key, manifest)
            return self.cache.get(key)
        with self._lock:
            if key in self._building:
                return None
            self._building.add(key)
        # built off the request path: reads keep going layer by layer until the index is ready
        threading.Thread(target=self._build_resolved, args=(key, manifest), name="clink-resolved-index", daemon=True).start()
        return None

    def _build_resolved(self, key: tuple, manifest: Manifest) -> None:
        try:
            index = KeyIndex.build(self.read_manifest_table(manifest))
            self.cache.put(key, index, index.nbytes)
        except Exception:  # noqa: BLE001 - an optimisation only: the layer-by-layer path keeps answering (and reports errors)
            pass
        finally:
            with self._lock:
                self._building.discard(key)

    def operator_index(self, manifest: Manifest) -> KeyIndex:
        """The (cached) hash index of a checkpoint's operator-state view."""
        key = (self.store.uri, self.job, "op-index", manifest.identity)
        index = self.cache.get(key)
        if index is None:
            index = KeyIndex.build(self.operator_view(manifest))
            self.cache.put(key, index, index.nbytes)
        return index
