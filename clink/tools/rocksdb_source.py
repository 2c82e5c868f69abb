"""rocksdb:///path sources: a RocksDB checkpoint (or database) directory read as a canonical StateSource."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote

from clink.tools.sources import Selection, SourceRef, StateSource, apply_selection, operators_of
from snapshot import InvalidArgumentError
from snapshot.format import FORMAT_VERSION, operators_metadata

ROCKSDB_SCHEME = "rocksdb://"
KIND = "rocksdb"


def is_rocksdb_spec(spec: str) -> bool:
    """Whether SRC names a RocksDB directory (rocksdb:///abs/path, or rocksdb://relative/path)."""
    return spec[: len(ROCKSDB_SCHEME)].lower() == ROCKSDB_SCHEME


def parse_rocksdb(spec: str) -> SourceRef:
    """The SourceRef of a rocksdb:// SRC; nothing is read (nor created) yet."""
    path = unquote(spec[len(ROCKSDB_SCHEME) :])
    if not path.strip():
        raise InvalidArgumentError(f"{spec}: no directory named; write rocksdb:///path/to/checkpoint")
    return SourceRef(KIND, spec, path=str(Path(path).expanduser()))


def load_rocksdb(ref: SourceRef, selection: Selection) -> StateSource:
    """Read a RocksDB directory read-only into a StateSource (operators ascending, keys in byte order), selection applied.

    A path that is not a RocksDB directory is a one-line NotFoundError or InvalidArgumentError naming it; nothing is created.
    """
    from client.rocksdb_backend import read_rocksdb_checkpoint

    state = read_rocksdb_checkpoint(ref.path)
    table = apply_selection(state.table, selection)
    operators = operators_of(table, state.operators)
    return StateSource(ref, table, FORMAT_VERSION, state.state_versions, operators_metadata(state.operators), operators)
