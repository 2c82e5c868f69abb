"""The commit protocol: staging parts, completing checkpoints, fencing and rewinds, over one ObjectStore.

Invariants (each argued in docs/protocol.md and checked by tests/test_protocol_*.py and the simulation, tests/sim/):

I1 Completion. Checkpoint N is complete exactly when jobs/<job>/chk-N/_metadata exists. Only `complete()` writes it,
   from parts that were listed *before* the writers table was read (or that this pool wrote under that very table
   version, same etag, so written before it was read), whose (range, epoch) that table holds, that tile key groups
   0..127, and whose parents still hold every file the parts carried from them.
I2 Fencing. A part counts only while its writer's epoch owns exactly its range (epochs only grow, so once fenced never
   again). A commit learns its outcome from a writers table read *after* its part was written: if its epoch no longer
   holds, its part can never count and the commit raises FencedError. Nothing a fenced writer sends is ever visible.
   (The check before the upload uses the table this pool saw last: a zombie it has not seen fenced uploads garbage.)
I3 Attempts. Every restore takes a fresh epoch and records the checkpoint it restored from (its base). Parts are named
   by range *and* epoch, so a part of an older attempt neither counts nor blocks its successor's name. When a newer
   attempt's valid parts tile a checkpoint id whose _metadata an older attempt wrote, the newer replaces it (compare-and-
   swap, after re-reading the writers table). A complete checkpoint after some writer's base that only older epochs made
   is *abandoned*: never latest, never kept by retention as recent.
I4 Layers. A part lists its files oldest first by as_of (the checkpoint whose state a file holds); readers order by
   as_of too, never by the order in which a rescale joined parent parts. A base replaces every older row of the key
   groups it covers, even when it holds none (so an empty fold still marks its compaction point).
I5 Current manifests. A cached manifest is used only with proof that it is the current version: the etag from a
   listing, or a client's token matching; otherwise it is read. A commit reads its parent fresh, once per checkpoint
   per pool: the checkpoint's other commits reuse that version while the writers table is unchanged.
I6 References. Every reference to a data file is copied from a source (parent manifest, own parent part) that is
   checked to still hold it *after* the referencing object is written; a replaced _metadata keeps the files its previous
   version used as `retired`. GC deletes a file only when no manifest or part it listed (and read in full) names it and
   it is older than the minimum age; a commit that took longer than max_commit_s publishes nothing. Only an announced
   removal deletes a _metadata or part, so "the writers table kept its etag and records no removal of C" proves no
   object of C was deleted meanwhile: such a check needs no request.
I7 Idempotence. A repeated commit (same checkpoint, range, epoch and delta bytes) finishes as the first did, whatever
   happened to the parent in between; a different delta under the same name is a ConflictError.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import pyarrow as pa

from pool.domain import CheckpointInfo, CommitResult, KeyGroupRange, PoolConfig
from pool.writers import Fencing, fenced_error
from snapshot import StateVersionMap
from snapshot.errors import ConflictError, InvalidArgumentError, NotFoundError, UnavailableError
from store.anatomy import operators_named_or_held, operators_with_state
from store.checkpoint import CheckpointListing, CheckpointReader
from store.datafile import KIND_BASE, KIND_DELTA, DataFile, encode_datafile
from store.layout import job_file_key, legacy_part_key, metadata_key, new_data_path, parse_job_key, part_key, parts_prefix
from store.manifest import MANIFEST_FORMAT, PART_FORMAT, Manifest, Part, ordered_file_paths, parse_manifest, tiles
from store.objects import ObjectStore
from store.writers import WriterTable

# a re-completion racing compactions or other completers gives up after this many compare-and-swap rounds
_PUBLISH_ROUNDS = 8
# bytes of part JSON one pool keeps of the parts it wrote, so their last committer need not read them back (parsed,
# they take a few times this in memory)
STAGED_PART_CACHE_BYTES = 8 << 20
# parent versions one pool keeps for the other commits of the same checkpoint
PARENT_CACHE_ENTRIES = 256


@dataclass(frozen=True)
class ParentSource:
    """Where a commit copied its carried layers from: the parent's _metadata or this writer's own part of the parent.

    ``table_etag``: the etag of a writers table this pool held before the source was seen holding those layers (I6).
    """

    manifest: Manifest
    key: str
    etag: str
    from_part: bool
    table_etag: str | None = None


@dataclass(frozen=True)
class StagedName:
    """A staged part as its name says: store key, range and epoch (None for parts named before names carried it).

    ``etag``: the listing's etag of it ("" when not listed).
    """

    key: str
    kg_lo: int
    kg_hi: int
    epoch: int | None
    etag: str = ""


@dataclass(frozen=True)
class StagedPart:
    """A part this pool wrote: its etag and manifest, the etag of the writers table its commit held before writing it, and
    whether its parent was seen holding what it carried after it landed (step 6).
    """

    etag: str
    manifest: Manifest
    table_etag: str | None
    parent_checked: bool
    size: int


class StagedParts:
    """The parts this pool wrote, by key, bounded in bytes (least recently used out first); thread-safe."""

    def __init__(self, max_bytes: int = STAGED_PART_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._parts: OrderedDict[str, StagedPart] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> StagedPart | None:
        with self._lock:
            staged = self._parts.get(key)
            if staged is not None:
                self._parts.move_to_end(key)
            return staged

    def put(self, key: str, staged: StagedPart) -> None:
        with self._lock:
            old = self._parts.pop(key, None)
            self._bytes -= old.size if old else 0
            self._parts[key] = staged
            self._bytes += staged.size
            while self._bytes > self.max_bytes and self._parts:
                self._bytes -= self._parts.popitem(last=False)[1].size

    def parent_checked(self, key: str, etag: str) -> None:
        """Record that the part's parent held what it carried at a time after the part landed."""
        with self._lock:
            staged = self._parts.get(key)
            if staged is not None and staged.etag == etag:
                self._parts[key] = replace(staged, parent_checked=True)

    def forget(self, key: str) -> None:
        with self._lock:
            old = self._parts.pop(key, None)
            self._bytes -= old.size if old else 0


@dataclass(frozen=True)
class ReadParent:
    """A parent _metadata a commit of ``for_checkpoint`` read, with the etag of the writers table held before it read it."""

    manifest: Manifest
    etag: str
    table_etag: str
    for_checkpoint: int


def removing(table: WriterTable, cid: int) -> bool:
    """Whether the table records a removal of checkpoint ``cid``, live or expired (an expired one's deletes may be done)."""
    return any(c == cid for c, _, _ in table.retiring)


def merge_versions(packed: Iterable[str]) -> str:
    """Union of state-version maps; on a disagreement the higher version wins."""
    merged: dict[tuple[int, str], int] = {}
    for text in packed:
        for op, st, v in StateVersionMap.unpack(text).entries():
            merged[(op, st)] = max(v, merged.get((op, st), 0))
    return StateVersionMap(merged).pack()


def own_delta(part: Manifest) -> DataFile | None:
    """The delta a part's own commit wrote (as_of = its checkpoint), None for an empty delta."""
    for f in part.files:
        if f.kind == KIND_DELTA and f.as_of == part.checkpoint_id:
            return f
    return None


def carried_paths(part: Manifest) -> set[str]:
    """Paths a part carried from its parent (every file but its own delta)."""
    mine = own_delta(part)
    return {f.path for f in part.files if mine is None or f.path != mine.path}


def info_of(job: str, m: Manifest, etag: str = "", abandoned: bool = False) -> CheckpointInfo:
    """A complete manifest as CheckpointInfo."""
    key_group_bytes, operator_state_bytes = m.stored_bytes_by_key_group
    named = operators_named_or_held(m)
    counted = all(f.operators is not None for f in m.files)  # else which operators hold rows is not known from _metadata
    return CheckpointInfo(
        job=job,
        checkpoint_id=m.checkpoint_id,
        parent_id=m.parent_id,
        complete=m.complete,
        committed_ranges=tuple(KeyGroupRange(p.kg_lo, p.kg_hi) for p in m.parts),
        created_at_ms=m.created_at_ms,
        num_files=len(m.files),
        total_bytes=m.total_bytes,
        num_rows=m.total_rows,
        # every operator named or holding rows (unnamed: ""), so a restore sees state no uid was registered for
        operators=tuple((op, uid or "") for op, uid in named.items()),
        operators_without_state=tuple(sorted(set(named) - set(operators_with_state(m)))) if counted else (),
        state_versions=m.state_versions,
        manifest_etag=etag,
        abandoned=abandoned,
        key_group_bytes=key_group_bytes,
        operator_state_bytes=operator_state_bytes,
    )


def incomplete_info(job: str, checkpoint_id: int, ranges: Iterable[tuple[int, int]], parts: list[Manifest]) -> CheckpointInfo:
    """An in-flight checkpoint: the ranges staged by current writers; files, bytes and rows of the parts given."""
    files = {f.path: f for p in parts for f in p.files}
    ops = {o: u for p in parts for o, u in p.operators}
    return CheckpointInfo(
        job=job,
        checkpoint_id=checkpoint_id,
        parent_id=max((p.parent_id for p in parts), default=0),
        complete=False,
        committed_ranges=tuple(KeyGroupRange(lo, hi) for lo, hi in sorted(set(ranges))),
        created_at_ms=max((p.created_at_ms for p in parts), default=0),
        num_files=len(files),
        total_bytes=sum(f.size for f in files.values()),
        num_rows=sum(f.rows for f in files.values()),
        operators=tuple(sorted(ops.items())),
        state_versions=merge_versions(p.state_versions for p in parts),
    )


def carried_layers(parent: Manifest | None, kg: KeyGroupRange) -> tuple[list[tuple[str, ...]], dict[str, DataFile]]:
    """The parent's files that matter to this range (keyed segments in it, operator state, bases over it), oldest first.

    Each file is named once however many parent parts list it, and the order is by as_of (I4), not by parent part.
    """
    if parent is None:
        return [], {}
    files: dict[str, DataFile] = {}
    listed: list[str] = []
    for part in parent.parts:
        if not part.overlaps(kg.lo, kg.hi):
            continue
        for layer in part.layers:
            for path in layer:
                entry = parent.file(path)
                covers = entry.kind == KIND_BASE and entry.kg_lo <= kg.hi and kg.lo <= entry.kg_hi
                useful = covers or any(s.operator or s.overlaps(kg.lo, kg.hi) for s in entry.segments)
                if useful and path not in files:
                    files[path] = entry
                    listed.append(path)
    return [(p,) for p in ordered_file_paths(listed, files)], files


class CommitProtocol:
    """Commits and completes checkpoints of any job in one store; stateless but for the readers' caches it is given."""

    def __init__(
        self,
        store: ObjectStore,
        fencing: Fencing,
        reader: Callable[[str], CheckpointReader],
        config: PoolConfig,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.fencing = fencing
        self.reader = reader
        self.config = config
        self.clock = clock
        self.staged_parts = StagedParts()
        self._parents: OrderedDict[tuple[str, int], ReadParent] = OrderedDict()
        self._parents_lock = threading.Lock()

    def forget_parent(self, job: str, checkpoint_id: int) -> None:
        """Drop the parent version kept for other commits (its _metadata was replaced or deleted by this process)."""
        with self._parents_lock:
            self._parents.pop((job, checkpoint_id), None)

    # ---- writers ----------------------------------------------------------------------------------------------

    def acquire(self, job: str, key_groups: KeyGroupRange, base: int | None) -> int:
        """A fresh epoch for the range (I2, I3): overlapping writers are fenced; ``base`` is the checkpoint restored from."""
        if base is not None and (isinstance(base, bool) or not isinstance(base, int) or base < 0):
            raise InvalidArgumentError(f"restore point {base!r} must be a checkpoint id (>= 0) or None")
        return self.fencing.acquire(job, key_groups, base)

    # ---- commits ----------------------------------------------------------------------------------------------

    def commit(
        self,
        job: str,
        cid: int,
        pid: int,
        kg: KeyGroupRange,
        epoch: int,
        delta: pa.Table,
        operators: tuple[tuple[int, str], ...],
        versions: str,
        retry: bool = False,
        seen: tuple[WriterTable, str | None] | None = None,
    ) -> CommitResult:
        """Stage this writer's part of checkpoint ``cid`` and complete the checkpoint if the parts now tile (I1..I7).

        ``retry``: the client repeats a commit whose reply it lost; the part an earlier attempt staged is looked for
        first, so a repeat uploads nothing. ``seen``: the writers table (and etag) the epoch was checked against before
        the delta was read (step 1); by default the one this pool saw last.
        """
        started = self.clock()
        seen_table, seen_etag = seen if seen is not None else (self.fencing.seen(job) or self.fencing.read(job))
        key = part_key(job, cid, kg.lo, kg.hi, epoch)
        encoded = (
            encode_datafile(
                delta,
                changelog=True,
                target_segment_bytes=self.config.segment_target_bytes,
                target_block_bytes=self.config.block_target_bytes,
                spool=self.store.spool_path(),  # on local disk, not in memory: a commit holds its delta, not its file too
            )
            if delta.num_rows
            else None
        )
        delta_sha = encoded.sha256 if encoded else None
        part = self._repeat(job, key, kg, cid, delta_sha, missing_ok=True) if retry else None
        if part is None and retry:  # a part an earlier version staged under its legacy name, without the epoch in it
            part = self._repeat(job, legacy_part_key(job, cid, kg.lo, kg.hi), kg, cid, delta_sha, missing_ok=True, epoch=epoch)
        repeated = part is not None
        source = None
        written = 0
        part_etag = None  # set when this commit wrote its part (not a repeat)
        if part is None:
            source = self._parent_source(job, cid, pid, kg, epoch, seen_etag) if pid else None
            layers, files = carried_layers(source.manifest if source else None, kg)
            if encoded is not None:
                path = new_data_path()
                assert encoded.spooled is not None
                # immutable, unreferenced until a part names it
                self.store.put_if_absent_file(job_file_key(job, path), encoded.spooled, encoded.size)
                written += encoded.size
                files[path] = encoded.entry(path, KIND_DELTA, kg.lo, kg.hi, cid)
                layers.append((path,))
            if self.clock() - started > self.config.max_commit_s:  # I6: GC's minimum age only protects a commit this long
                raise UnavailableError(
                    f"commit of checkpoint {cid} key groups {kg} of job {job} took longer than "
                    f"{self.config.max_commit_s:g} s; nothing was published, retry"
                )
            part = Manifest(
                PART_FORMAT,
                job,
                cid,
                pid,
                int(self.clock() * 1000),
                operators,
                versions,
                (Part(kg.lo, kg.hi, epoch, pid, tuple(layers)),),
                tuple(files.values()),
            )
            blob = part.to_json()
            try:
                part_etag = self.store.put_if_absent(key, blob)
                written += len(blob)
                self.staged_parts.put(key, StagedPart(part_etag, part, seen_etag, source is None or not carried_paths(part), len(blob)))
            except ConflictError:
                part = self._repeat(job, key, kg, cid, delta_sha)
                repeated, written = True, 0  # what this attempt uploaded is garbage (GC): the earlier attempt's part stands
        assert part is not None  # _repeat without missing_ok or epoch returns the part or raises
        if repeated and part_etag is None and retry:
            # a client's repeat ends as its first attempt did (I7): complete if the checkpoint completed with this part,
            # whatever happened to the table or the parent since
            done = self._complete_with(job, cid, kg, epoch)
            if done is not None:
                return CommitResult(info_of(job, *done), written, repeated)
        # every writer of the table seen before the part was written has a part this pool wrote since: nothing to list,
        # if the table read next is that same version (I1)
        fresh = part_etag is not None
        known = self._known_parts(job, cid, seen_table, seen_etag) if fresh and seen_table.holds(kg.lo, kg.hi, epoch) else None
        listing = None if known is not None else self._listing(job, cid)
        table, table_etag = self._fenced_unless_held(job, kg, epoch, key)  # read after the part landed and after the listing (I1, I2)
        if known is not None and self._known_parts(job, cid, table, table_etag) != known:
            # the table changed since it was seen (this part was written under the seen etag, so only that version knows
            # it): list, then read the table again (in that order, I1), and decide from those
            known, listing = None, self._listing(job, cid)
            table, table_etag = self._fenced_unless_held(job, kg, epoch, key)
        if source is not None:
            if not (self._source_unchanged(source, pid, table, table_etag) or self._source_holds(source, part)):
                done = self._complete_with(job, cid, kg, epoch)
                if done is not None:  # a completer checked this part's parent before it went, and published it: done
                    return CommitResult(info_of(job, *done), written, repeated)
                raise NotFoundError(
                    f"parent checkpoint {pid} of job {job} was deleted or replaced while checkpoint {cid} was committed; "
                    "this part will never complete a checkpoint: restore from a complete checkpoint"
                )
            if part_etag is not None:
                self.staged_parts.parent_checked(key, part_etag)
        done = self.complete(
            job, cid, listing, table, deadline=self.clock() + self.config.max_commit_s, table_etag=table_etag, known=known, fresh=fresh
        )
        if done is not None and done[0].part_for(kg.lo, kg.hi, epoch) is not None:
            return CommitResult(info_of(job, *done), written, repeated)
        if done is not None:  # completed without this part: the writer was fenced before the checkpoint completed
            raise fenced_error(job, kg, epoch, self.fencing.read(job)[0])
        names = known if known is not None else (listing or [])
        ranges = [(n.kg_lo, n.kg_hi) for n in names if table.holds(n.kg_lo, n.kg_hi, n.epoch)]
        return CommitResult(incomplete_info(job, cid, ranges, [part]), written, repeated)

    def _fenced_unless_held(self, job: str, kg: KeyGroupRange, epoch: int, key: str) -> tuple[WriterTable, str | None]:
        """The writers table, read now; FencedError unless ``epoch`` still owns ``kg`` in it (I2).

        A part is never deleted on its own: a completer that read the table before the fence may be including it right
        now, and then the part is what keeps its files referenced (I6). This pool only stops counting it as known.
        """
        table, etag = self.fencing.read(job)
        if not table.holds(kg.lo, kg.hi, epoch):
            self.staged_parts.forget(key)
            raise fenced_error(job, kg, epoch, table)
        return table, etag

    def _known_parts(self, job: str, cid: int, table: WriterTable, etag: str | None) -> list[StagedName] | None:
        """Each writer of ``table``'s part of ``cid``, if they tile and this pool wrote every one since the table was ``etag``.

        While the table keeps that etag nobody was fenced or acquired, and no removal began or ended (I1, I6).
        """
        if etag is None or removing(table, cid):
            return None
        out = []
        for w in table.writers:
            key = part_key(job, cid, w.kg_lo, w.kg_hi, w.epoch)
            staged = self.staged_parts.get(key)
            if staged is None or staged.table_etag != etag:
                return None
            out.append(StagedName(key, w.kg_lo, w.kg_hi, w.epoch, staged.etag))
        return out if tiles([Part(n.kg_lo, n.kg_hi, 1, 0, ()) for n in out]) else None

    def _unchanged_part(self, name: StagedName, cid: int, table: WriterTable, table_etag: str | None) -> StagedPart | None:
        """The part this pool wrote under ``name``, if the listing shows that version and the table has not changed since (I6)."""
        staged = self.staged_parts.get(name.key)
        if staged is None or table_etag is None or staged.table_etag != table_etag or removing(table, cid):
            return None
        return staged if not name.etag or name.etag == staged.etag else None

    def _source_unchanged(self, source: ParentSource, pid: int, table: WriterTable, table_etag: str | None) -> bool:
        """Whether the source provably still holds what it held when seen, without asking the store (I6).

        Only a removal deletes a _metadata or part, and a removal announces itself in the writers table first; a
        replacement (compaction, re-completion) keeps every file the replaced version named. So if the table read after
        the part landed is the version held before the source was seen, with no removal of the parent recorded, the
        source was not deleted in between.
        """
        return source.table_etag is not None and table_etag == source.table_etag and not removing(table, pid)

    def _parent_source(self, job: str, cid: int, pid: int, kg: KeyGroupRange, epoch: int, seen_etag: str | None) -> ParentSource:
        """The parent's _metadata, unless this writer staged its own part of the parent and the _metadata is not built on it.

        The _metadata is read fresh once per checkpoint: other commits of ``cid`` in this pool reuse that version while
        the writers table is still the one held before it was read (I5); ``seen_etag`` is the table's etag held now.
        """
        meta = metadata_key(job, pid)
        own = part_key(job, pid, kg.lo, kg.hi, epoch)
        manifest: Manifest | None = None
        etag, table_etag = "", None
        with self._parents_lock:
            read = self._parents.get((job, pid))
        if read is not None and seen_etag is not None and read.table_etag == seen_etag and read.for_checkpoint == cid:
            manifest, etag, table_etag = read.manifest, read.etag, read.table_etag
        else:
            try:
                manifest, etag = self.reader(job).manifest_and_etag(pid)
                table_etag = seen_etag
            except NotFoundError:
                pass
            if manifest is not None and seen_etag is not None:
                with self._parents_lock:
                    self._parents[(job, pid)] = ReadParent(manifest, etag, seen_etag, cid)
                    self._parents.move_to_end((job, pid))
                    while len(self._parents) > PARENT_CACHE_ENTRIES:
                        self._parents.popitem(last=False)
        if manifest is not None and manifest.part_for(kg.lo, kg.hi, epoch) is not None:
            return ParentSource(manifest, meta, etag, False, table_etag)  # complete with this writer's own part (maybe compacted since)
        mine = self.staged_parts.get(own)
        if mine is not None and seen_etag is not None and mine.table_etag == seen_etag:
            return ParentSource(mine.manifest, own, mine.etag, True, mine.table_etag)  # staged by this pool, table unchanged since
        for key in (own, legacy_part_key(job, pid, kg.lo, kg.hi)):  # the legacy name: staged before an upgrade
            try:
                data, part_etag = self.store.get_with_etag(key)
            except NotFoundError:
                continue
            staged = parse_manifest(data, key)
            if staged.parts[0].epoch == epoch:
                return ParentSource(staged, key, part_etag, True, seen_etag)
        if manifest is not None:
            return ParentSource(manifest, meta, etag, False, table_etag)  # restored from it
        raise NotFoundError(
            f"parent checkpoint {pid} of job {job} not found (neither complete nor staged by this writer for key groups {kg})"
        )

    def _repeat(
        self, job: str, key: str, kg: KeyGroupRange, cid: int, delta_sha: str | None, missing_ok: bool = False, epoch: int | None = None
    ) -> Manifest | None:
        """The part already under this name: ours again when its own delta is byte-identical (I7), else a conflict.

        ``epoch``: only a part of this epoch is ours (a legacy-named part carries its epoch inside, not in its name).
        """
        try:
            existing = parse_manifest(self.store.get(key), key)
        except NotFoundError:
            if missing_ok:
                return None
            raise ConflictError(f"key groups {kg} of checkpoint {cid} of job {job} were committed and removed concurrently") from None
        if epoch is not None and existing.parts[0].epoch != epoch:
            return None
        staged = own_delta(existing)
        if (staged.sha256 if staged else None) != delta_sha:
            raise ConflictError(
                f"key groups {kg} of checkpoint {cid} of job {job} were already committed by this writer with another delta"
            )
        return existing

    def _complete_with(self, job: str, cid: int, kg: KeyGroupRange, epoch: int) -> tuple[Manifest, str] | None:
        """Checkpoint ``cid``'s (manifest, etag) if it is complete with this writer's part, else None."""
        try:
            manifest, etag = self.reader(job).manifest_and_etag(cid)
        except NotFoundError:
            return None
        return (manifest, etag) if manifest.part_for(kg.lo, kg.hi, epoch) is not None else None

    def _source_holds(self, source: ParentSource, part: Manifest) -> bool:
        """Whether the parent still holds every file this part carried from it, checked after the part was written (I6)."""
        try:
            if self.store.head(source.key).etag == source.etag:
                return True
        except NotFoundError:
            return False
        if source.from_part:
            return True  # a part is never rewritten: a new etag means it was written again with the same name and bytes
        try:
            current = self.reader(part.job).manifest(source.manifest.checkpoint_id)
        except NotFoundError:
            return False
        return carried_paths(part) <= current.referenced_paths

    # ---- completion -------------------------------------------------------------------------------------------

    def _listing(self, job: str, cid: int) -> list[StagedName]:
        out = []
        for info in self.store.list(parts_prefix(job, cid)):
            parsed = parse_job_key(info.key)
            if parsed is not None and parsed.kind == "part" and parsed.checkpoint_id == cid:
                out.append(StagedName(info.key, parsed.kg_lo, parsed.kg_hi, parsed.epoch, info.etag))
        return out

    def _valid(self, names: list[StagedName], table: WriterTable) -> list[StagedName]:
        """Staged parts whose writer still owns their range, one per (range, epoch).

        Parts named without an epoch (staged before an upgrade) are read to learn it; when the same writer's commit also
        staged under the new name (a retry after the upgrade), the earlier, legacy-named part is the one that counts.
        """
        out: dict[tuple[int, int, int], StagedName] = {}
        for n in sorted(names, key=lambda n: n.epoch is not None):  # legacy names first
            epoch = n.epoch
            if epoch is None:
                try:
                    epoch = parse_manifest(self.store.get(n.key), n.key).parts[0].epoch
                except NotFoundError:
                    continue
            if table.holds(n.kg_lo, n.kg_hi, epoch):
                out.setdefault((n.kg_lo, n.kg_hi, epoch), StagedName(n.key, n.kg_lo, n.kg_hi, epoch, n.etag))
        return list(out.values())

    def complete(
        self,
        job: str,
        cid: int,
        listing: list[StagedName] | None = None,
        table: WriterTable | None = None,
        deadline: float | None = None,
        table_etag: str | None = None,
        known: list[StagedName] | None = None,
        fresh: bool = False,
    ) -> tuple[Manifest, str] | None:
        """Write _metadata of checkpoint ``cid`` if the valid parts tile 0..127 (I1); (the manifest now in place, its etag), or None.

        ``deadline`` (clock seconds): past it nothing is published, as for a commit (I6: retention removes an incomplete
        checkpoint only once it is older than the minimum age, so a completer stalled that long must not publish it).
        ``known``: the valid parts, all written by this pool, when ``table`` (of ``table_etag``) is the version their
        commits held before writing them (no listing then: ``_known_parts``). ``fresh``: the caller's commit wrote a new
        part of ``cid`` just now, so retention, re-listing after it announces, never removes ``cid`` under this
        completion, and the parts this pool wrote may be used as written (I6).
        """
        for _ in range(_PUBLISH_ROUNDS):
            if known is None:
                if listing is None:
                    listing = self._listing(job, cid)
                    table = None
                if table is None:
                    table, table_etag = self.fencing.read(job)
                valid = self._valid(listing, table)
            else:
                valid = known
            assert table is not None
            if not tiles([Part(n.kg_lo, n.kg_hi, 1, 0, ()) for n in valid]):
                return None
            if cid in table.retiring_ids(int(self.clock() * 1000)) and not self.store.exists(metadata_key(job, cid)):
                # an incomplete checkpoint being removed (it is old): completing it would name files the removal frees. A
                # complete one being removed may be replaced: the removal compares its _metadata's etag before deleting
                return None
            parts, checked = [], []
            for n in valid:
                staged = self._unchanged_part(n, cid, table, table_etag) if fresh else None
                if staged is not None:  # this pool wrote it and no removal of cid began or ended since: as read (I6)
                    parts.append(staged.manifest)
                    checked.append(staged.parent_checked)
                    continue
                try:
                    parts.append(parse_manifest(self.store.get(n.key), n.key))
                    checked.append(False)
                except NotFoundError:
                    return None  # removed since the listing (retention or a delete): not completable now
            # a part whose parent its own commit saw holding its files after it landed needs no second look (I6)
            parents: dict[int, Manifest | None] = {}  # each parent read once, after every part was listed or written
            if not all(ok or self._parent_holds(job, p, parents) for p, ok in zip(parts, checked, strict=True)):
                return None
            manifest = assemble(job, cid, parts)
            if deadline is not None and self.clock() > deadline:
                raise UnavailableError(
                    f"completing checkpoint {cid} of job {job} took longer than {self.config.max_commit_s:g} s; "
                    "nothing was published: repeat the commit to complete it"
                )
            outcome = self._publish(job, cid, manifest)
            if outcome is not None:
                return outcome
            listing = table = known = None  # lost a compare-and-swap: decide again from a fresh listing
        raise UnavailableError(f"checkpoint {cid} of job {job}: its _metadata kept changing while it was completed; retry")

    def _parent_holds(self, job: str, part: Manifest, parents: dict[int, Manifest | None]) -> bool:
        """Whether a staged part's parent (its _metadata, or the writer's own part of it) still holds what the part carried.

        ``parents``: the parent _metadata versions this completion read so far (None: not complete), by id.
        """
        pid = part.parent_id
        if not pid:
            return True
        carried = carried_paths(part)
        if not carried:
            return True
        p = part.parts[0]
        if pid not in parents:
            try:
                parents[pid] = self.reader(job).manifest(pid)
            except NotFoundError:
                parents[pid] = None
        parent = parents[pid]
        if parent is not None and carried <= parent.referenced_paths:
            return True
        own = part_key(job, pid, p.kg_lo, p.kg_hi, p.epoch)
        try:
            parent_part = parse_manifest(self.store.get(own), own)
        except NotFoundError:
            return False
        return carried <= {f.path for f in parent_part.files}

    def _publish(self, job: str, cid: int, manifest: Manifest) -> tuple[Manifest, str] | None:
        """put-if-absent _metadata; if an older attempt's version is there, replace it (I3). None: lost a race, try again."""
        key = metadata_key(job, cid)
        try:
            return manifest, self.store.put_if_absent(key, manifest.to_json())
        except ConflictError:
            pass
        try:
            data, etag = self.store.get_with_etag(key)
        except NotFoundError:
            return None  # deleted meanwhile: try again
        existing = parse_manifest(data, key)
        ours = {(p.kg_lo, p.kg_hi, p.epoch) for p in manifest.parts}
        if {(p.kg_lo, p.kg_hi, p.epoch) for p in existing.parts} == ours:
            return existing, etag  # the same parts (another completer, or a compaction since)
        table, _ = self.fencing.read(job)  # read after the existing version: decides which attempt is current
        if not all(table.holds(*k) for k in ours):
            return existing, etag  # our parts were fenced meanwhile: the version in place stands
        if all(table.holds(p.kg_lo, p.kg_hi, p.epoch) for p in existing.parts):
            return existing, etag
        retired = tuple(sorted(existing.referenced_paths - {f.path for f in manifest.files}))
        replacement = Manifest(
            MANIFEST_FORMAT,
            job,
            cid,
            manifest.parent_id,
            manifest.created_at_ms,
            manifest.operators,
            manifest.state_versions,
            manifest.parts,
            manifest.files,
            retired,
        )
        try:
            new_etag = self.store.compare_and_swap(key, replacement.to_json(), etag)
        except (ConflictError, NotFoundError):
            return None
        self.reader(job).forget(cid)
        return replacement, new_etag

    # ---- listing ----------------------------------------------------------------------------------------------

    def staged(self, job: str, item: CheckpointListing) -> tuple[list[tuple[int, int]], list[Manifest]]:
        """An incomplete checkpoint's ranges staged by current writers, and their parts."""
        table, _ = self.fencing.read(job)
        names = [StagedName(k, lo, hi, e) for k, lo, hi, e in item.part_names]
        valid = self._valid(names, table)
        parts = []
        for n in valid:
            try:
                parts.append(parse_manifest(self.store.get(n.key), n.key))
            except NotFoundError:
                continue
        return [(n.kg_lo, n.kg_hi) for n in valid], parts


def remove_checkpoint(
    store: ObjectStore, job: str, cid: int, keys: list[str], decided_etag: str | None, stop_at_ms: int, clock: Callable[[], float]
) -> bool:
    """Delete a checkpoint announced as retiring: _metadata first (it vanishes atomically), then the rest as listed.

    Stops (False) once the clock passes ``stop_at_ms``, well inside the announcement's lease: past the lease a restore
    or a pin may take the checkpoint again. Skips a _metadata re-committed by a newer attempt since the decision.
    """
    meta = metadata_key(job, cid)
    if decided_etag is not None:
        try:
            if store.head(meta).etag != decided_etag:
                return True
        except NotFoundError:
            pass
    for key in sorted(keys, key=lambda k: k != meta):
        if int(clock() * 1000) >= stop_at_ms:
            return False
        store.delete(key)
    return True


def assemble(job: str, cid: int, parts: list[Manifest]) -> Manifest:
    """The manifest of tiling parts: a pure function of them, so racing completers write identical bytes."""
    parts = sorted(parts, key=lambda p: p.parts[0].kg_lo)
    files = {f.path: f for p in parts for f in p.files}
    ops = {o: u for p in parts for o, u in p.operators}
    return Manifest(
        MANIFEST_FORMAT,
        job,
        cid,
        max(p.parent_id for p in parts),
        max(p.created_at_ms for p in parts),
        tuple(sorted(ops.items())),
        merge_versions(p.state_versions for p in parts),
        tuple(p.parts[0] for p in parts),
        tuple(sorted(files.values(), key=lambda f: f.path)),
    )
