"""Mutants: each puts one reviewed defect (or one protocol safeguard) back, so the simulation shows it would catch it.

`python bench/simulate.py --mutant NAME --seeds 200` must report failures for every mutant here; a mutant no seed
kills is a blind spot of the model or the workload.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

import client.backend as backend_mod
import client.warm as warm_mod
import pool.compaction as compaction_mod
import pool.gc as gc_mod
import pool.lifecycle as lifecycle_mod
import pool.protocol as protocol_mod
import pool.restore as restore_mod
import pool.savepoints as savepoints_mod
import store.checkpoint as checkpoint_mod
from snapshot.errors import NotFoundError
from store.layout import metadata_key
from store.manifest import MANIFEST_FORMAT, Manifest

# the lifecycle modules that write manifests: a mutant of what they write patches the Manifest each of them builds
_MANIFEST_WRITERS = (compaction_mod, restore_mod, savepoints_mod)


@contextmanager
def patched(obj: object, name: str, value: object) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


@contextmanager
def manifests_built_by(factory: Callable[..., Manifest]) -> Iterator[None]:
    """``factory`` in place of Manifest in every lifecycle module that writes manifests."""
    with ExitStack() as stack:
        for module in _MANIFEST_WRITERS:
            stack.enter_context(patched(module, "Manifest", factory))
        yield


def _layers_in_listed_order():  # defect 1: readers and commits trust the order parents were joined in
    def carried(parent, kg):
        if parent is None:
            return [], {}
        files, layers = {}, []
        for part in parent.parts:
            if part.overlaps(kg.lo, kg.hi):
                for layer in part.layers:
                    for path in layer:
                        entry = parent.file(path)
                        if path not in files and (
                            entry.kind == "base" or any(s.operator or s.overlaps(kg.lo, kg.hi) for s in entry.segments)
                        ):
                            files[path] = entry
                            layers.append((path,))
        return layers, files

    with (
        patched(checkpoint_mod, "ordered_layers", lambda manifest, part: list(part.layers)),
        patched(protocol_mod, "carried_layers", carried),
    ):
        yield


def _empty_fold_writes_no_base():  # defect 2: compacting a part whose fold is empty leaves no compaction point
    real = Manifest

    def manifest(fmt, job, cid, parent, created, ops, versions, parts, files, *rest, **kw):
        empty = {f.path for f in files if f.kind == "base" and f.rows == 0 and f.as_of == cid}
        if empty and fmt == MANIFEST_FORMAT:
            parts = tuple(
                type(p)(p.kg_lo, p.kg_hi, p.epoch, p.parent_id, tuple(layer for layer in p.layers if not set(layer) & empty)) for p in parts
            )
            files = tuple(f for f in files if f.path not in empty)
        return real(fmt, job, cid, parent, created, ops, versions, parts, files, *rest, **kw)

    with manifests_built_by(manifest):
        yield


def _gc_skips_vanished_manifests():  # defect 3: a manifest deleted while GC reads it is skipped, not a reason to re-list
    def refs(self, job, layout):
        out = set()
        for key in layout.manifest_keys:
            try:
                m = gc_mod.parse_manifest(self.context.store.get(key), key)
            except NotFoundError:
                continue
            out.update(f"jobs/{job}/" + p for p in m.referenced_paths)
        return out

    with patched(gc_mod.GarbageCollector, "_job_references", refs):
        yield


def _table_read_before_listing():  # defect 4: completion judges the parts against a writers table read before listing them
    import pool.writers as writers_mod

    local = threading.local()
    real_listing = protocol_mod.CommitProtocol._listing
    real_read = writers_mod.Fencing.read

    def listing(self, job, cid):
        local.table = real_read(self.fencing, job)  # the table first...
        return real_listing(self, job, cid)  # ...then the parts it judges

    def read(self, job):
        early = getattr(local, "table", None)
        if early is not None:
            local.table = None
            return early
        return real_read(self, job)

    with patched(protocol_mod.CommitProtocol, "_listing", listing), patched(writers_mod.Fencing, "read", read):
        yield


def _restore_keeps_its_epoch():  # defect 5: a restore in place keeps the old epoch, so an older attempt's parts still count
    real = backend_mod.RemoteReadBackend.restore

    def restore(self, checkpoint_id=None, key_groups=None, expected_operators=None):
        epoch = self.epoch
        pool = self._pool
        real_acquire = pool.acquire_writer
        pool.acquire_writer = lambda job, kg, restore_from=None: (
            type("Lease", (), {"epoch": epoch})() if tuple(kg) == tuple(self.key_groups) and epoch else real_acquire(job, kg, restore_from)
        )
        try:
            return real(self, checkpoint_id, key_groups, expected_operators)
        finally:
            pool.acquire_writer = real_acquire

    with patched(backend_mod.RemoteReadBackend, "restore", restore):
        yield


def _operator_writes_folded_into_cache():  # defect 7: after completion the backend serves its own operator-state write
    def fold(self, layer):
        warm = self._warm
        if warm is not None and warm.mark_changed(*layer.key_columns()):
            self._warm_stale = True
        for k, v in layer.top.items():
            self._cache.store(k, v)
        for run in layer.runs:
            self._cache.forget_run(run)

    with patched(backend_mod.RemoteReadBackend, "_fold_into_cache", fold):
        yield


def _warm_table_keeps_changed_keys():  # issue 15: keys a later checkpoint changed are still answered from the warm table
    with patched(warm_mod.WarmTable, "mark_changed", lambda self, op_ids, keys: False):
        yield


def _warm_operator_state_after_moving_on():  # issue 15: the warm table answers operator state of a checkpoint left behind
    real, real_many = warm_mod.WarmTable.lookup, warm_mod.WarmTable.lookup_many

    def lookup(self, key, read_checkpoint):
        return real(self, key, self.base)

    def lookup_many(self, ks, read_checkpoint):
        return real_many(self, ks, self.base)

    with patched(warm_mod.WarmTable, "lookup", lookup), patched(warm_mod.WarmTable, "lookup_many", lookup_many):
        yield


def _manifests_cached_by_id():  # defect 9: a cached manifest is served whatever its etag says
    real = checkpoint_mod.CheckpointReader.manifest_and_etag

    def manifest_and_etag(self, checkpoint_id, etag=None):
        with self._lock:
            cached = self._manifests.get(checkpoint_id)
        return cached if cached is not None else real(self, checkpoint_id, etag)

    with patched(checkpoint_mod.CheckpointReader, "manifest_and_etag", manifest_and_etag):
        yield


def _no_parent_check_after_commit():  # I6: a part copied from a parent deleted meanwhile may complete
    with (
        patched(protocol_mod.CommitProtocol, "_source_holds", lambda self, source, part: True),
        patched(protocol_mod.CommitProtocol, "_parent_holds", lambda self, job, part, parents: True),
    ):
        yield


def _retention_forgets_restore_points():  # a rewound job's base is deleted by retention
    real = lifecycle_mod.Lifecycle.retain

    def forget(table):  # the writers' restore points as if never written
        return dataclasses.replace(table, writers=tuple(dataclasses.replace(w, base=None) for w in table.writers))

    def retain(self, job, keep_last=None, dry_run=False):
        real_read = checkpoint_mod.CheckpointReader.writers

        def writers(reader):
            table = real_read(reader)
            return forget(table)

        with patched(checkpoint_mod.CheckpointReader, "writers", writers):
            real_retire = self.fencing.retire

            def retire(job_, decide, until, owner):
                return real_retire(job_, lambda t: decide(forget(t)), until, owner)

            self.fencing.retire = retire
            try:
                return real(self, job, keep_last, dry_run)
            finally:
                self.fencing.retire = real_retire

    with patched(lifecycle_mod.Lifecycle, "retain", retain):
        yield


def _no_restore_records():  # latest may be a checkpoint a rewind left behind
    import store.writers as writers_table

    with patched(writers_table.WriterTable, "abandons", lambda self, cid, max_epoch: False):
        yield


def _compaction_forgets_retired_files():  # a replaced _metadata stops naming files a concurrent commit copied
    real = Manifest

    def manifest(*a, **k):
        if len(a) >= 10:
            a = a[:9]
        k.pop("retired", None)
        return real(*a, **k)

    with manifests_built_by(manifest):
        yield


def _restore_from_vanished_checkpoint():  # a restore acquires even when its base is gone (retention deleted it meanwhile)
    import pool.writers as writers_mod

    real_exists = writers_mod.Fencing.acquire

    def acquire(self, job, key_groups, base=None):
        store = self.store
        real = store.exists
        store_exists = lambda key: True if key == metadata_key(job, base or 0) else real(key)  # noqa: E731
        try:
            store.exists = store_exists
            return real_exists(self, job, key_groups, base)
        finally:
            store.exists = real

    with patched(writers_mod.Fencing, "acquire", acquire):
        yield


def _writers_table_trusted_after_the_part():  # the pool's last-seen writers table decides a commit, not a read after its part
    real = protocol_mod.CommitProtocol._fenced_unless_held

    def fenced_unless_held(self, job, kg, epoch, key):
        seen = self.fencing.seen(job)
        if seen is not None and seen[0].holds(kg.lo, kg.hi, epoch):
            return seen
        return real(self, job, kg, epoch, key)

    with patched(protocol_mod.CommitProtocol, "_fenced_unless_held", fenced_unless_held):
        yield


def _known_parts_not_confirmed():  # the parts this pool wrote complete a checkpoint the table read after the part no longer backs
    real = protocol_mod.CommitProtocol._known_parts
    local = threading.local()

    def known_parts(self, job, cid, table, etag):
        predicted = getattr(local, "predicted", None)
        if predicted is not None and predicted[0] == (job, cid):
            local.predicted = None
            return predicted[1]  # the confirmation answers what the prediction said
        found = real(self, job, cid, table, etag)
        local.predicted = ((job, cid), found) if found is not None else None
        return found

    with patched(protocol_mod.CommitProtocol, "_known_parts", known_parts):
        yield


def _parent_reused_without_its_table():  # a parent version kept for the checkpoint's other commits is taken as seen under today's table
    real = protocol_mod.CommitProtocol._parent_source

    def parent_source(self, job, cid, pid, kg, epoch, seen_etag):
        with self._parents_lock:
            kept = self._parents.get((job, pid))
            if kept is not None and seen_etag is not None:
                self._parents[(job, pid)] = dataclasses.replace(kept, table_etag=seen_etag, for_checkpoint=cid)
        return real(self, job, cid, pid, kg, epoch, seen_etag)

    with patched(protocol_mod.CommitProtocol, "_parent_source", parent_source):
        yield


def _staged_parts_trusted_across_removals():  # parts this pool wrote used as written though the table changed since (a removal ran)
    def known_parts(self, job, cid, table, etag):
        out = []
        for w in table.writers:
            key = protocol_mod.part_key(job, cid, w.kg_lo, w.kg_hi, w.epoch)
            staged = self.staged_parts.get(key)
            if staged is None:
                return None
            out.append(protocol_mod.StagedName(key, w.kg_lo, w.kg_hi, w.epoch, staged.etag))
        return out if protocol_mod.tiles([protocol_mod.Part(n.kg_lo, n.kg_hi, 1, 0, ()) for n in out]) else None

    def unchanged_part(self, name, cid, table, table_etag):
        staged = self.staged_parts.get(name.key)
        return staged if staged is not None and (not name.etag or name.etag == staged.etag) else None

    with (
        patched(protocol_mod.CommitProtocol, "_known_parts", known_parts),
        patched(protocol_mod.CommitProtocol, "_unchanged_part", unchanged_part),
    ):
        yield


def _parent_check_skipped_during_its_removal():  # step 6 skipped on an unchanged table that records the parent's removal
    def source_unchanged(self, source, pid, table, table_etag):
        return source.table_etag is not None and table_etag == source.table_etag

    with patched(protocol_mod.CommitProtocol, "_source_unchanged", source_unchanged):
        yield


def _maintenance_lease_ignores_expiry():  # a pool takes a job's maintenance lease another pool still holds
    import pool.maintenance_lease as lease_mod

    def lapsed(self, job, lease, now_ms):
        return True  # every lease another pool holds looks given up, however recently it was renewed

    with patched(lease_mod.MaintenanceLeases, "_lapsed", lapsed):
        yield


def _maintenance_gc_without_min_age():  # the pool's maintainer runs GC with no minimum age (files of commits in flight go)
    import pool.maintenance as maintenance_mod

    real = maintenance_mod.Maintainer._job_context

    def job_context(self, policy):
        context = real(self, policy)
        context.config = dataclasses.replace(context.config, gc_min_age_s=0.0)
        return context

    with patched(maintenance_mod.Maintainer, "_job_context", job_context):
        yield


MUTANTS: dict[str, Callable[[], object]] = {
    "layers_in_listed_order": _layers_in_listed_order,
    "empty_fold_writes_no_base": _empty_fold_writes_no_base,
    "gc_skips_vanished_manifests": _gc_skips_vanished_manifests,
    "table_read_before_listing": _table_read_before_listing,
    "restore_keeps_its_epoch": _restore_keeps_its_epoch,
    "operator_writes_folded_into_cache": _operator_writes_folded_into_cache,
    "manifests_cached_by_id": _manifests_cached_by_id,
    "no_parent_check_after_commit": _no_parent_check_after_commit,
    "retention_forgets_restore_points": _retention_forgets_restore_points,
    "no_restore_records": _no_restore_records,
    "compaction_forgets_retired_files": _compaction_forgets_retired_files,
    "restore_from_vanished_checkpoint": _restore_from_vanished_checkpoint,
    "warm_table_keeps_changed_keys": _warm_table_keeps_changed_keys,
    "warm_operator_state_after_moving_on": _warm_operator_state_after_moving_on,
    "writers_table_trusted_after_the_part": _writers_table_trusted_after_the_part,
    "known_parts_not_confirmed": _known_parts_not_confirmed,
    "parent_reused_without_its_table": _parent_reused_without_its_table,
    "staged_parts_trusted_across_removals": _staged_parts_trusted_across_removals,
    "parent_check_skipped_during_its_removal": _parent_check_skipped_during_its_removal,
    "maintenance_lease_ignores_expiry": _maintenance_lease_ignores_expiry,
    "maintenance_gc_without_min_age": _maintenance_gc_without_min_age,
}


@contextmanager
def mutant(name: str | None) -> Iterator[None]:
    """Apply one named mutant for the duration (None: the code as it is)."""
    if not name:
        yield
        return
    if name not in MUTANTS:
        raise KeyError(f"unknown mutant {name!r}; known: {', '.join(sorted(MUTANTS))}")
    with contextmanager(MUTANTS[name])():
        yield
