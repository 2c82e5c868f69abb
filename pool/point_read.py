"""One key read at a checkpoint without building arrays: the scalar twin of CheckpointReader.lookup_values that Get uses."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from snapshot import NUM_KEY_GROUPS, ROW_ERASE
from snapshot.key_index import hash_key
from store.checkpoint import CheckpointReader
from store.datafile import DataFile, Segment
from store.manifest import Manifest, ordered_layers

# manifests whose per-key-group probes are kept (as many as a reader keeps manifests)
PLAN_CACHE_ENTRIES = 256
# lookup_values indexes just the segments a read needs up to this many, else the whole file: the same rule, so the same index
FEW_SEGMENTS = 4


@dataclass(frozen=True)
class Probe:
    """One data file a keyed read looks in (newest layer first) and the segments its index covers (empty: none holds the key group)."""

    entry: DataFile
    segments: tuple[Segment, ...]


def key_group_probes(manifest: Manifest, key_group: int) -> tuple[Probe, ...]:
    """The files a read of ``key_group`` looks in, in lookup_values' order: parts in manifest order, layers newest first."""
    probes = []
    for part in manifest.parts:
        if not part.kg_lo <= key_group <= part.kg_hi:
            continue
        for layer in reversed(ordered_layers(manifest, part)):
            for path in layer:
                entry = manifest.file(path)
                if not entry.kg_lo <= key_group <= entry.kg_hi:
                    continue
                keyed = tuple(s for s in entry.segments if not s.operator)
                needed = tuple(s for s in keyed if s.kg_lo <= key_group <= s.kg_hi)
                probes.append(Probe(entry, needed if len(needed) <= FEW_SEGMENTS else keyed))
    return tuple(probes)


class PointReads:
    """Single-key reads over a CheckpointReader's cached indexes; what to probe per key group is worked out once per manifest."""

    def __init__(self) -> None:
        self._plans: OrderedDict[tuple[str, str], list[tuple[Probe, ...] | None]] = OrderedDict()
        self._lock = threading.Lock()

    def _probes(self, job: str, manifest: Manifest, key_group: int) -> tuple[Probe, ...]:
        key = (job, manifest.identity)
        with self._lock:
            plan = self._plans.get(key)
            if plan is None:
                plan = self._plans[key] = [None] * NUM_KEY_GROUPS
                while len(self._plans) > PLAN_CACHE_ENTRIES:
                    self._plans.popitem(last=False)
            else:
                self._plans.move_to_end(key)
        probes = plan[key_group]
        if probes is None:  # two threads may both work it out: the same answer either way
            probes = plan[key_group] = key_group_probes(manifest, key_group)
        return probes

    def lookup(self, reader: CheckpointReader, manifest: Manifest, op_id: int, key: bytes) -> tuple[bool, bytes]:
        """(found, value) of one (op_id, key) as lookup_values answers it: the newest layer holding the key, an erase there is absent."""
        key_hash = hash_key(op_id, key)
        lead = key[0] if key else 0  # an empty (legacy) key is key group 0, as in leading_bytes
        if lead >= NUM_KEY_GROUPS:  # operator state: its merged view of the checkpoint
            index = reader.operator_index(manifest)
            row = index.find_one(op_id, key, key_hash)
            return (True, index.value_at(row)) if row >= 0 else (False, b"")
        resolved = reader.resolved_index(manifest)
        if resolved is not None:  # a checkpoint read often: its merged view answers in one probe, as for MultiGet
            row = resolved.find_one(op_id, key, key_hash)
            return (True, resolved.value_at(row)) if row >= 0 else (False, b"")
        for probe in self._probes(reader.job, manifest, lead):
            if probe.segments and reader.reads_by_block(probe.entry):  # a file large next to the cache: one block, not segments
                held = reader.lookup_one_by_block(probe.entry, op_id, key, key_hash)
                if held is not None:
                    table, row = held
                    if probe.entry.changelog and table.column("row_kind")[row].as_py() == ROW_ERASE:
                        return False, b""
                    return True, table.column("value_bytes")[row].as_py()
            elif probe.segments:
                index = reader.key_index(probe.entry, probe.segments)
                row = index.find_one(op_id, key, key_hash)
                if row >= 0:
                    if probe.entry.changelog and index.table.column("row_kind")[row].as_py() == ROW_ERASE:
                        return False, b""
                    return True, index.value_at(row)
            if not probe.entry.changelog:  # a base is complete for its range: a miss there is final
                return False, b""
        return False, b""
