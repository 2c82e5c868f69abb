"""SRC resolution for the CLI: snapshot files, checkpoints and savepoints on file:// or s3://, and pools over grpc://."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from snapshot import (
    ClinkError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    StateVersionMap,
    UnauthenticatedError,
    UnavailableError,
    filter_key_groups,
)
from snapshot.errors import ConflictError, CorruptDataError, LimitExceededError, error_class_named, prefixed, rebuilt
from snapshot.format import FORMAT_VERSION
from snapshot.names import is_loopback
from snapshot.state_selectors import parse_key_groups as parse_key_group_selector
from snapshot.state_selectors import parse_op as parse_op_selector
from store.layout import JOBS, SAVEPOINT_MANIFEST, SAVEPOINTS, StateFolder, find_state_folder, metadata_key, parse_checkpoint_dir
from store.uris import parse_store_uri

if TYPE_CHECKING:
    import ssl

METADATA_FILE = SAVEPOINT_MANIFEST
KeyGroups = tuple[int, int]


@dataclass(frozen=True)
class SourceConfig:
    """How sources are reached: the S3 endpoint (None: AWS default) and the pool call deadline."""

    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    pool_timeout_s: float = 30.0
    # bearer token for pools that require one; PEM roots switch the pool connection to TLS
    pool_token: str | None = None
    pool_tls_root_certificates: bytes | None = None
    pool_tls_server_name: str | None = None
    # PEM client certificate and key for pools that require mutual TLS
    pool_tls_client_cert: bytes | None = None
    pool_tls_client_key: bytes | None = None
    # allow sending the token over plaintext to a host other than this machine (it can be read on the way)
    insecure: bool = False
    # where the materialisation handles of changelog snapshots are resolved (--store: s3://, file://, grpc://HOST:PORT)
    handle_store: str | None = None


@dataclass(frozen=True)
class Selection:
    """Which part of a source to read: a key-group range (operator-state rows always included) and operators."""

    key_groups: KeyGroups | None = None
    op_ids: tuple[int, ...] = ()

    @property
    def is_everything(self) -> bool:
        """True when nothing is filtered out."""
        return self.key_groups is None and not self.op_ids


@dataclass(frozen=True)
class SourceRef:
    """A parsed SRC: what kind of thing it names and where."""

    kind: str  # "file", "object", "checkpoint", "savepoint", "pool" or "http" (a pool's HTTP export)
    spec: str
    path: str = ""  # local file path, or the object key for "object"
    store_uri: str = ""  # store root for "object", "checkpoint" and "savepoint"
    job: str = ""
    checkpoint_id: int | None = None  # None: the newest complete checkpoint (pools)
    savepoint: str = ""
    address: str = ""  # the pool's address: HOST:PORT, a comma list of them, or dns:///NAME:PORT (client.pool_addresses)

    def what(self) -> str:
        """What a stored source names, without where: "checkpoint 7 of job orders", "savepoint 'v2'"."""
        if self.kind == "checkpoint":
            return f"checkpoint {self.checkpoint_id} of job {self.job}"
        if self.kind == "savepoint":
            return f"savepoint {self.savepoint!r}" if self.savepoint else "savepoint"
        return self.spec

    def describe(self) -> str:
        """A short human name for messages."""
        if self.kind in ("checkpoint", "savepoint"):
            return f"{self.what()} in {self.store_uri}"
        if self.kind == "pool":
            which = f"checkpoint {self.checkpoint_id}" if self.checkpoint_id is not None else "latest checkpoint"
            return f"{which} of job {self.job} on pool {self.address}"
        return self.spec


@dataclass(frozen=True)
class StateSource:
    """A source as loaded: its canonical table (selection applied) and what it declares."""

    ref: SourceRef
    table: pa.Table
    format_version: int = FORMAT_VERSION
    state_versions: StateVersionMap = field(default_factory=StateVersionMap)
    extra_metadata: dict[bytes, bytes] = field(default_factory=dict)
    # op_id -> uid where a manifest or the pool names it (None: unnamed)
    operators: dict[int, str | None] = field(default_factory=dict)
    was_changelog: bool = False
    checkpoint_id: int | None = None

    @property
    def label(self) -> str:
        """Human name of the source."""
        if self.ref.kind == "pool" and self.checkpoint_id is not None:
            return f"checkpoint {self.checkpoint_id} of job {self.ref.job} on pool {self.ref.address}"
        return self.ref.describe()


# --- parsing --------------------------------------------------------------------------------------------


def parse_key_groups(text: str) -> KeyGroups:
    """'LO-HI' (inclusive) or a single 'N' to a key-group range within 0..127 (parsed as the pool's HTTP export parses it)."""
    return parse_key_group_selector(text)


def parse_op(text: str) -> int:
    """An operator given as a decimal or 0x-hex op_id, or as 'uid:NAME' (parsed as the pool's HTTP export parses it)."""
    return parse_op_selector(text)


def parse_source(spec: str) -> SourceRef:
    """Work out what SRC names; nothing is read yet (store locations go through store.uris.parse_store_uri)."""
    if not spec or not spec.strip():
        raise InvalidArgumentError("source is empty; give a snapshot file, a file:// or s3:// checkpoint, or grpc://HOST:PORT/JOB")
    if spec.startswith("grpc://"):
        return _parse_pool(spec)
    if spec.startswith(("http://", "https://")):
        return SourceRef("http", spec)
    from clink.tools.rocksdb_source import is_rocksdb_spec, parse_rocksdb

    if is_rocksdb_spec(spec):  # a RocksDB checkpoint directory, read by clink/tools/rocksdb_source.py
        return parse_rocksdb(spec)
    scheme = spec.split("://", 1)[0] if "://" in spec else ""
    if scheme and scheme.lower() not in ("file", "s3") and re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", scheme):
        raise InvalidArgumentError(f"{spec}: unknown source scheme {scheme!r} (use a path, file://, s3://, grpc:// or http://)")
    location = parse_store_uri(spec, what="source")
    if location.scheme == "s3":
        parts = [p for p in location.prefix.split("/") if p]
        return _parse_store_path(spec, f"s3://{location.bucket}", parts)
    return _parse_local(spec, Path(location.path))


def _check_checkpoint_name(spec: str, parts: list[str], job_parts: int) -> None:
    """Refuse JOB/chk-X where X is not a checkpoint number, naming it (rather than reading chk-X as part of a job id).

    ``job_parts`` is how many parts come before chk-X at least: 1 for a pool's JOB/chk-X, 2 for a store's jobs/JOB/chk-X.
    """
    if parts and parts[-1] == METADATA_FILE:
        parts = parts[:-1]
    if job_parts == 2 and (len(parts) < 3 or parts[-3] + "/" != JOBS):
        return
    if len(parts) > job_parts and parts[-1].startswith("chk-") and parse_checkpoint_dir(parts[-1]) is None:
        raise InvalidArgumentError(f"{spec}: {parts[-1]!r} is not a checkpoint number; write chk-N with N a whole number from 1 (chk-7)")


# what a grpc:// source looks like, said by every error about one
POOL_SOURCE_FORMS = "grpc://HOST:PORT/JOB[/chk-N], grpc://HOST1:PORT1,HOST2:PORT2/JOB or grpc://dns:///NAME:PORT/JOB"


def split_pool_url(spec: str, scheme: str = "grpc://") -> tuple[str, str]:
    """(the pool address, the path after it) of SCHEME ADDRESS[/PATH]: ADDRESS is HOST:PORT, a comma list, or dns:///NAME:PORT."""
    rest = spec[len(scheme) :]
    rest = re.split(r"[?#]", rest, maxsplit=1)[0]  # a query or fragment names nothing in a pool
    if rest[:7].lower() == "dns:///":
        name, _, path = rest[7:].partition("/")
        return rest[:7] + name, path
    address, _, path = rest.partition("/")
    return address, path


def parse_pool_address(spec: str, address: str) -> str:
    """The pool address of a source or --store as the client takes it; InvalidArgumentError naming ``spec`` and the bad entry."""
    from client.pool_addresses import parse_pool_addresses

    try:
        parsed = parse_pool_addresses(address)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"{spec}: {exc}") from None
    return parsed.dns or ",".join(parsed.hosts)


def _parse_pool(spec: str) -> SourceRef:
    address_text, path = split_pool_url(spec)
    if not address_text:
        raise InvalidArgumentError(f"{spec}: no pool address; pool sources are {POOL_SOURCE_FORMS}")
    if ":" not in address_text:
        raise InvalidArgumentError(f"{spec}: no port; pool sources are {POOL_SOURCE_FORMS}")
    address = parse_pool_address(spec, address_text)
    parts = [unquote(p) for p in path.split("/") if p]
    _check_checkpoint_name(spec, parts, 1)
    checkpoint_id = parse_checkpoint_dir(parts[-1]) if parts else None
    if checkpoint_id is not None:
        parts = parts[:-1]
    if not parts:
        raise InvalidArgumentError(f"{spec}: no job named; pool sources are {POOL_SOURCE_FORMS}")
    return SourceRef("pool", spec, job="/".join(parts), checkpoint_id=checkpoint_id, address=address)


def _parse_store_path(spec: str, root: str, parts: list[str]) -> SourceRef:
    _check_checkpoint_name(spec, parts, 2)
    found = find_state_folder(parts)
    if found is None:
        if not parts:
            raise InvalidArgumentError(
                f"{spec}: a checkpoint path ends in jobs/<job>/chk-<N>, a savepoint is a directory holding _metadata"
            )
        if parts[-1] == METADATA_FILE:  # a savepoint directory anywhere, named by its _metadata
            return SourceRef("savepoint", spec, store_uri="/".join([root, *parts[:-1]]))
        store_uri = "/".join([root, *parts[:-1]])
        return SourceRef("object", spec, path=parts[-1], store_uri=store_uri)
    return _stored_ref(spec, "/".join([root, *parts[: found.root_parts]]), found)


def _stored_ref(spec: str, store_uri: str, found: StateFolder) -> SourceRef:
    if found.savepoint is not None:  # opened as the directory itself: a savepoint opens wherever it lies
        return SourceRef("savepoint", spec, store_uri=f"{store_uri}/{SAVEPOINTS}{found.savepoint}", savepoint=found.savepoint)
    assert found.job is not None and found.checkpoint_id is not None
    return SourceRef("checkpoint", spec, store_uri=store_uri, job=found.job, checkpoint_id=found.checkpoint_id)


def _parse_local(spec: str, path: Path) -> SourceRef:
    path = path.expanduser()
    if path.is_file() and path.name != METADATA_FILE:
        return SourceRef("file", spec, path=str(path))
    if path.name == METADATA_FILE or path.is_dir() or not path.suffix:
        absolute = path.resolve()
        _check_checkpoint_name(spec, list(absolute.parts), 2)
        found = find_state_folder(absolute.parts[1:])
        if found is not None and found.savepoint is None:
            root = Path(absolute.anchor, *absolute.parts[1 : 1 + found.root_parts])
            return _stored_ref(spec, root.as_uri(), found)
        if path.name == METADATA_FILE or path.is_dir() or found is not None:  # a savepoint directory, wherever it lies
            directory = absolute.parent if path.name == METADATA_FILE else absolute
            return SourceRef("savepoint", spec, store_uri=directory.as_uri(), savepoint=(found.savepoint or "") if found else "")
    if not path.exists():
        raise NotFoundError(f"{spec}: no such file or directory{_did_you_mean(spec)}")
    return SourceRef("file", spec, path=str(path))


# HOST:PORT/... typed without a scheme: a pool's address, not a file
_ADDRESS_WITHOUT_SCHEME = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9.-]*):([0-9]{1,5})(/.*)?$")


def _did_you_mean(spec: str) -> str:
    """The hint "; did you mean grpc://SPEC?" for a missing path that reads as HOST:PORT/JOB (http:// for an export's URL), else ""."""
    m = _ADDRESS_WITHOUT_SCHEME.match(spec)
    if m is None or not 0 < int(m.group(2)) < 65536:
        return ""
    rest = m.group(3) or ""
    if re.match(r"^/jobs/[^/]+/state\.arrow(\?|$)", rest):
        return f"; did you mean http://{spec}?"
    return f"; did you mean grpc://{spec if rest.strip('/') else spec.rstrip('/') + '/JOB'}?"


# --- loading --------------------------------------------------------------------------------------------


def _with_prefix(exc: ClinkError, prefix: str) -> ClinkError:
    """The same error, attributes kept, with the source named in front."""
    return prefixed(exc, prefix)


def apply_selection(table: pa.Table, selection: Selection) -> pa.Table:
    """Filter a canonical table by operator ids and key-group range, vectorised."""
    if selection.op_ids and table.num_rows:
        wanted = pa.array(np.asarray(selection.op_ids, dtype=np.uint64), pa.uint64())
        table = table.filter(pc.is_in(table.column("op_id"), value_set=wanted))
    if selection.key_groups is not None:
        table = filter_key_groups(table, *selection.key_groups)
    return table


def operators_of(table: pa.Table, named: Mapping[int, str]) -> dict[int, str | None]:
    """Every operator holding rows in ``table`` (None: no uid known), and those ``named`` uids, with their uids."""
    operators: dict[int, str | None] = {int(o): None for o in pc.unique(table.column("op_id")).to_pylist()} if table.num_rows else {}
    operators.update(named)
    return operators


def snapshot_source(
    ref: SourceRef, data: bytes | pa.Buffer | pa.NativeFile, selection: Selection, config: SourceConfig | None = None
) -> StateSource:
    """A StateSource from snapshot bytes (canonical or changelog variant, replayed; its handles resolved via config.handle_store)."""
    from clink.tools.handle_store import source_handles
    from snapshot.format import operators_from_metadata
    from snapshot.ops import read_canonical

    try:
        with source_handles(config) as handles:
            snap = read_canonical(data, handles)
    except ClinkError as exc:
        raise _with_prefix(exc, ref.describe()) from exc
    table = apply_selection(snap.table, selection)
    operators = operators_of(table, operators_from_metadata(snap.extra_metadata))  # the uids a stream names, when it does
    return StateSource(ref, table, snap.format_version, snap.state_versions, snap.extra_metadata, operators, snap.replayed)


def _read_local(ref: SourceRef) -> pa.NativeFile:
    try:
        return pa.memory_map(ref.path, "r")
    except FileNotFoundError:
        raise NotFoundError(f"{ref.spec}: no such file") from None
    except IsADirectoryError:
        raise InvalidArgumentError(f"{ref.spec}: is a directory, not a snapshot file") from None
    except OSError as exc:
        raise InvalidArgumentError(f"{ref.spec}: cannot read: {exc.strerror or exc}") from exc


PARQUET_MAGIC = b"PAR1"


def _is_parquet(data: pa.NativeFile) -> bool:
    """Whether a local file starts and ends with Parquet's magic (an Arrow stream never does)."""
    size = data.size()
    return size >= 8 and data.read_at(4, 0) == PARQUET_MAGIC and data.read_at(4, size - 4) == PARQUET_MAGIC


def parquet_source(ref: SourceRef, selection: Selection) -> StateSource:
    """A StateSource from a Parquet file `clink state-export` wrote (its five columns back into the canonical table)."""
    import pyarrow.parquet as pq

    from clink.tools.projections import (
        PARQUET_SCHEMA,
        PROJECTION_KEY,
        READABLE_PROJECTIONS,
        canonical_from_projection,
    )
    from snapshot.format import FORMAT_VERSION_KEY, STATE_VERSIONS_KEY, operators_from_metadata

    try:
        parquet = pq.ParquetFile(ref.path)
        meta = parquet.schema_arrow.metadata or {}
    except (pa.ArrowException, OSError) as exc:
        raise CorruptDataError(f"{ref.spec}: a damaged Parquet file: {one_line_text(exc)}") from None
    projection = meta.get(PROJECTION_KEY, b"").decode("utf-8", errors="replace")
    if projection not in READABLE_PROJECTIONS:
        raise InvalidArgumentError(
            f"{ref.spec}: a Parquet file `clink state-export` did not write (no clink.projection parquet/1 or query/1 in its "
            "metadata); clink reads Arrow snapshot streams and its own Parquet exports"
        )
    try:
        table = canonical_from_projection(parquet.read(columns=PARQUET_SCHEMA.names))
        versions = StateVersionMap.unpack(meta.get(STATE_VERSIONS_KEY, b"").decode())
        format_version = int(meta.get(FORMAT_VERSION_KEY, str(FORMAT_VERSION).encode()))
    except (pa.ArrowException, ValueError, KeyError, ClinkError) as exc:
        raise CorruptDataError(f"{ref.spec}: a clink Parquet export that does not read back: {one_line_text(exc)}") from None
    table = apply_selection(table, selection)
    return StateSource(ref, table, format_version, versions, {}, operators_of(table, operators_from_metadata(meta)), False)


def one_line_text(exc: BaseException) -> str:
    """An exception's message on one line."""
    return " ".join(str(exc).split()) or type(exc).__name__


def store_config(config: SourceConfig):
    """The StoreConfig for the S3 endpoint the CLI was given."""
    from store import StoreConfig

    return StoreConfig(endpoint_url=config.s3_endpoint_url, region=config.s3_region)


def open_source_store(ref: SourceRef, config: SourceConfig):
    """The object store holding a checkpoint, savepoint or snapshot object; "no such store" when it is missing."""
    from store import open_store

    if ref.kind == "savepoint":  # a directory: what is missing is said by the _metadata check (the store under it is checked)
        if ref.savepoint:
            from store.layout import require_store

            root = ref.store_uri[: -len(f"/{SAVEPOINTS}{ref.savepoint}")]
            require_store(open_store(root, store_config(config), must_exist=True))
        return open_store(ref.store_uri, store_config(config))
    return open_store(ref.store_uri, store_config(config), must_exist=True)


def savepoint_directory_of(ref: SourceRef, config: SourceConfig) -> SourceRef:
    """An object source that names no object but a directory (objects under it): that savepoint; any other ref as it is.

    A directory without _metadata is read as a savepoint too, so it fails as one: "no _metadata" (exit 2), not "not found".
    A checkpoint ref whose folder holds a savepoint's own _metadata (written to a directory named .../jobs/J/chk-N) is that
    savepoint, as store.locations.open_location opens it.
    """
    if ref.kind == "checkpoint":
        return _savepoint_in_checkpoint_folder(ref, config) or ref
    if ref.kind != "object":
        return ref
    store = open_source_store(ref, config)
    if not store.exists(ref.path) and store.holds(f"{ref.path}/"):
        return SourceRef("savepoint", ref.spec, store_uri=f"{ref.store_uri.rstrip('/')}/{ref.path}")
    return ref


def _savepoint_in_checkpoint_folder(ref: SourceRef, config: SourceConfig) -> SourceRef | None:
    """The savepoint a checkpoint ref's folder holds (its _metadata carries the "savepoint" field), else None."""
    from store.manifest import manifest_extra_fields

    assert ref.job is not None and ref.checkpoint_id is not None
    key = metadata_key(ref.job, ref.checkpoint_id)
    try:
        data = open_source_store(ref, config).get(key)
    except ClinkError:  # what is missing or unreadable is said where the checkpoint is read
        return None
    if "savepoint" not in manifest_extra_fields(data):
        return None
    return SourceRef("savepoint", ref.spec, store_uri=f"{ref.store_uri.rstrip('/')}/{key.removesuffix('/' + SAVEPOINT_MANIFEST)}")


def load_source(spec: str, config: SourceConfig | None = None, selection: Selection | None = None) -> StateSource:
    """Resolve SRC and read it into a canonical table, selection pushed down where the source allows."""
    config = config or SourceConfig()
    selection = selection or Selection()
    ref = savepoint_directory_of(parse_source(spec), config)
    if ref.kind == "rocksdb":
        from clink.tools.rocksdb_source import load_rocksdb

        return load_rocksdb(ref, selection)
    if ref.kind == "file":
        data = _read_local(ref)
        if _is_parquet(data):
            return parquet_source(ref, selection)
        return snapshot_source(ref, data, selection, config)
    if ref.kind == "object":
        store = open_source_store(ref, config)
        try:
            data = store.get(ref.path)
        except ClinkError as exc:
            raise _with_prefix(exc, ref.spec) from exc
        return snapshot_source(ref, data, selection, config)
    if ref.kind in ("checkpoint", "savepoint"):
        return _load_stored(ref, config, selection)
    if ref.kind == "http":
        return snapshot_source(ref, _fetch_http(ref, config), selection, config)
    return _load_pool(ref, config, selection)


# HTTP status of a pool's export to the domain error it stands for, when the X-Clink-Error header names no class known here
ERROR_BY_HTTP_STATUS: dict[int, type[ClinkError]] = {
    400: InvalidArgumentError,
    401: UnauthenticatedError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: LimitExceededError,
    502: CorruptDataError,
    503: UnavailableError,
}


def check_token_transport(config: SourceConfig, tls: bool, host: str | None, where: str) -> None:
    """Refuse to send the bearer token in plaintext to another machine unless ``insecure`` says so."""
    if config.pool_token and not tls and not is_loopback(host) and not config.insecure:
        raise InvalidArgumentError(
            f"{where}: refusing to send the pool token in plaintext to {host}; use TLS (https://, or grpc:// with --pool-ca-file) "
            "or pass --insecure"
        )


def _origin(url: str) -> tuple[str, str, int | None]:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return parts.scheme.lower(), (parts.hostname or "").lower(), parts.port or {"http": 80, "https": 443}.get(parts.scheme.lower())


def _opener(config: SourceConfig, context):
    """A urllib opener whose redirects never carry the token to another origin and never go from https down to http."""
    import urllib.request

    class Redirects(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001 - urllib's signature
            old, new = _origin(req.full_url), _origin(newurl)
            if old[0] == "https" and new[0] != "https":
                raise PermissionDeniedError(f"{req.full_url}: redirected to {newurl}, from https down to {new[0]}; refused")
            redirected = super().redirect_request(req, fp, code, msg, headers, newurl)
            if redirected is not None and new != old:  # another origin gets no token
                for name in list(redirected.headers):
                    if name.lower() == "authorization":
                        del redirected.headers[name]
                redirected.unredirected_hdrs.pop("Authorization", None)
            return redirected

    handlers = [Redirects(), urllib.request.HTTPSHandler(context=context)]
    if config.pool_token:  # a proxy from the environment would see a plaintext request's token (https is tunnelled)
        handlers.append(urllib.request.ProxyHandler({"https": p} if (p := urllib.request.getproxies().get("https")) else {}))
    return urllib.request.build_opener(*handlers)


def _fetch_http(ref: SourceRef, config: SourceConfig) -> bytes:
    """GET a snapshot stream (a pool's /jobs/JOB/state.arrow, or any URL serving one)."""
    import http.client
    import ssl
    import urllib.error
    import urllib.request

    try:
        scheme, host, _ = _origin(ref.spec)
    except ValueError as exc:  # urlsplit's words for a broken URL ("Invalid IPv6 URL", a port out of range)
        raise InvalidArgumentError(f"{ref.spec}: not a usable http:// URL ({one_line_text(exc)})") from None
    check_token_transport(config, scheme == "https", host, ref.spec)
    headers = {"Accept": "application/vnd.apache.arrow.stream"}
    if config.pool_token:
        headers["Authorization"] = f"Bearer {config.pool_token}"
    context = None
    if scheme == "https":
        context = (
            ssl.create_default_context(cadata=config.pool_tls_root_certificates.decode("ascii"))
            if config.pool_tls_root_certificates
            else ssl.create_default_context()
        )
        if config.pool_tls_client_cert and config.pool_tls_client_key:
            _load_client_cert(context, config.pool_tls_client_cert, config.pool_tls_client_key)
    try:
        with _opener(config, context).open(urllib.request.Request(ref.spec, headers=headers), timeout=config.pool_timeout_s) as resp:
            return resp.read()
    except urllib.error.HTTPError as exc:
        try:
            body = " ".join(exc.read(500).decode("utf-8", errors="replace").split())
        except (OSError, http.client.HTTPException):
            body = ""
        error = error_class_named(exc.headers.get("X-Clink-Error") or "") or ERROR_BY_HTTP_STATUS.get(exc.code, UnavailableError)
        raise rebuilt(error, f"{ref.spec}: HTTP {exc.code}: {body or exc.reason}") from exc
    except http.client.BadStatusLine as exc:
        # an HTTP/2-only server (a pool's gRPC port) answers an HTTP/1 request with binary frames, not a status line
        if isinstance(exc, ConnectionError):  # RemoteDisconnected: the server closed the connection without an answer
            raise UnavailableError(f"{ref.spec}: cannot fetch: {one_line_text(exc)}") from None
        if _looks_like_http2(str(getattr(exc, "line", ""))):
            raise UnavailableError(_speaks_grpc(ref.spec)) from None
        raise UnavailableError(f"{ref.spec}: the server did not answer in HTTP (bad status line)") from None
    except http.client.HTTPException as exc:  # a cut or malformed answer: IncompleteRead, too many headers, ...
        raise UnavailableError(f"{ref.spec}: the server's HTTP answer was cut or malformed ({type(exc).__name__})") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise UnavailableError(f"{ref.spec}: cannot fetch: {reason}") from None
    except ValueError as exc:  # urllib's words for a URL it cannot use (a bad host name, a bad port)
        raise InvalidArgumentError(f"{ref.spec}: not a usable http:// URL ({one_line_text(exc)})") from None


def _looks_like_http2(line: str) -> bool:
    """Whether a "status line" is the start of HTTP/2 frames (a 3-byte length, then a type byte), not text."""
    return len(line) >= 4 and line[0] == "\x00" and not line.startswith("HTTP/")


def _speaks_grpc(url: str) -> str:
    """The message for an http:// source whose port speaks gRPC: the grpc:// spelling of it, and the HTTP export's option."""
    parts = urlsplit(url)
    address = parts.netloc.rpartition("@")[2]
    segments = [unquote(p) for p in parts.path.split("/") if p]
    job = segments[1] if len(segments) >= 2 and segments[0] == "jobs" else "JOB"
    return (
        f"{url}: {address} speaks gRPC (HTTP/2), not HTTP: read the pool there with grpc://{address}/{job}, or use the port "
        "given to clink-pool serve --http-port for its HTTP export"
    )


def _load_client_cert(context: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    import os
    import tempfile

    with tempfile.TemporaryDirectory(prefix="clink-tls-") as folder:
        cert, key = os.path.join(folder, "cert.pem"), os.path.join(folder, "key.pem")
        for path, pem in ((cert, cert_pem), (key, key_pem)):
            with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as fh:
                fh.write(pem)
        context.load_cert_chain(cert, key)


def _load_stored(ref: SourceRef, config: SourceConfig, selection: Selection) -> StateSource:
    from clink.tools.stored import read_stored

    return read_stored(ref, open_source_store(ref, config), selection)


# attempts of a pool call when nothing listens at the address: a late pool is retried briefly, a wrong port said soon
REFUSED_ATTEMPTS = 3


def pool_client_config(config: SourceConfig):
    """The PoolClientConfig of the --pool-* options (deadlines, token, TLS, a short retry when nothing listens)."""
    from client.pool_client import PoolClientConfig, RetryPolicy

    return PoolClientConfig(
        call_deadline_s=config.pool_timeout_s,
        scan_deadline_s=max(config.pool_timeout_s, 60.0),
        token=config.pool_token,
        tls_root_certificates=config.pool_tls_root_certificates,
        tls_server_name=config.pool_tls_server_name,
        tls_client_cert=config.pool_tls_client_cert,
        tls_client_key=config.pool_tls_client_key,
        retry=RetryPolicy(refused_attempts=REFUSED_ATTEMPTS),
    )


def check_pool_token_transport(config: SourceConfig, address: str, where: str) -> None:
    """check_token_transport for each host of a pool address (a comma list's every host, a dns:/// name's name)."""
    from client.pool_addresses import parse_pool_addresses

    for host in parse_pool_addresses(address).host_names():
        check_token_transport(config, config.pool_tls_root_certificates is not None, host, where)


def _load_pool(ref: SourceRef, config: SourceConfig, selection: Selection) -> StateSource:
    from client.pool_client import PoolClient

    check_pool_token_transport(config, ref.address, f"pool {ref.address}")
    client_config = pool_client_config(config)
    try:
        return _scan_pool(ref, selection, PoolClient(ref.address, client_config))
    except UnavailableError as exc:
        reason = getattr(exc, "unreachable", None)
        if isinstance(reason, str):  # no pool at the address: the reason names it, the call that found out is beside the point
            if "HTTP/1 answered" in reason and "," not in ref.address and _serves_pool_metrics(ref.address, config.pool_timeout_s):
                reason = (
                    f"{ref.address} is the pool's metrics port (its /metrics answered), not its gRPC port: the pool speaks gRPC "
                    "on the port given to clink-pool serve --listen (7420 by default)"
                )
            raise UnavailableError(reason) from exc
        raise _with_prefix(exc, f"pool {ref.address}") from exc
    except ClinkError as exc:
        raise _with_prefix(exc, f"pool {ref.address}") from exc


def complete_ids(ids) -> str:
    """The complete checkpoints a not-found message offers instead: all of a few, else the newest five and how many."""
    have = sorted(ids)
    if not have:
        return "it has no complete checkpoint"
    if len(have) <= 5:
        return f"complete checkpoints: {', '.join(map(str, have))}"
    return f"the newest complete checkpoints: {', '.join(map(str, have[-5:]))} (of {len(have)})"


def _serves_pool_metrics(address: str, timeout_s: float) -> bool:
    """Whether http://ADDRESS/metrics answers with a pool's metrics (a grpc:// source given the --metrics-port)."""
    import urllib.request

    try:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"http://{address}/metrics", timeout=min(timeout_s, 3.0)) as resp:
            return resp.status == 200 and b"clink_pool_" in resp.read(1 << 16)
    except Exception:  # noqa: BLE001 - only a hint: any failure means "not known to be the metrics port"
        return False


def _scan_pool(ref: SourceRef, selection: Selection, client) -> StateSource:
    where = f"pool {ref.address}"
    with client:
        try:
            checkpoints = {c.checkpoint_id: c for c in client.list_checkpoints(ref.job)}
        except NotFoundError as exc:
            if type(exc) is not NotFoundError:
                raise
            # the client's context and the pool's message both name the job: say it once
            raise NotFoundError(f"{where}: job {ref.job} not found") from None
        if ref.checkpoint_id is None:
            if not checkpoints:
                raise NotFoundError(f"{where}: job {ref.job} has no complete checkpoint")
            checkpoint_id = max(checkpoints)
        else:
            checkpoint_id = ref.checkpoint_id
            if checkpoint_id not in checkpoints:  # said here, before a scan whose error would name the checkpoint twice
                raise NotFoundError(f"{where}: checkpoint {checkpoint_id} of job {ref.job} not found ({complete_ids(checkpoints)})")
        data = client.scan_checkpoint(ref.job, checkpoint_id, selection.key_groups, selection.op_ids)
        info = checkpoints.get(checkpoint_id)
    source = snapshot_source(ref, data, Selection(selection.key_groups, selection.op_ids))
    operators = dict(source.operators)
    if info is not None:
        operators.update({int(o): (uid or None) for o, uid in info.operators.items()})
    return StateSource(
        ref,
        source.table,
        source.format_version,
        source.state_versions,
        source.extra_metadata,
        operators,
        source.was_changelog,
        checkpoint_id,
    )
