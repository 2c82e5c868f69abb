"""The CLI's --store: a store URI (s3://, file://, a directory, grpc:// or pool:// of a pool) as a materialisation-handle resolver."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pyarrow as pa

from snapshot.errors import InvalidArgumentError
from snapshot.handles import Handle, HandleResolver

if TYPE_CHECKING:
    from client.pool_client import PoolClient
    from clink.tools.sources import SourceConfig

POOL_SCHEMES = ("grpc://", "pool://")


def _pool_address(uri: str) -> str:
    """The pool address of --store grpc://ADDRESS (or pool://): HOST:PORT, HOST1:PORT1,HOST2:PORT2 or dns:///NAME:PORT."""
    from clink.tools.sources import parse_pool_address, split_pool_url

    scheme = next(s for s in POOL_SCHEMES if uri.startswith(s))
    address, path = split_pool_url(uri, scheme)
    if not address or ":" not in address or path.strip("/") or urlsplit(uri).query:
        raise InvalidArgumentError(
            f"--store {uri}: a pool is grpc://HOST:PORT (or pool://HOST:PORT, a comma list HOST1:PORT1,HOST2:PORT2, or "
            "dns:///NAME:PORT), with no job or path"
        )
    return parse_pool_address(f"--store {uri}", address)


class LazyHandleResolver:
    """A resolver opened at its first handle (a changelog without handles never connects), closed by close()."""

    def __init__(self, uri: str, config: SourceConfig) -> None:
        self.uri = uri
        self.config = config
        self._resolver: HandleResolver | None = None
        self._client: PoolClient | None = None
        if uri.startswith(POOL_SCHEMES):
            _pool_address(uri)  # a malformed --store is said now, whatever the source holds

    def _open(self) -> HandleResolver:
        if self._resolver is not None:
            return self._resolver
        if self.uri.startswith(POOL_SCHEMES):
            from client.changelog_export import PoolHandleResolver
            from client.pool_client import PoolClient
            from clink.tools.sources import check_pool_token_transport, pool_client_config

            address = _pool_address(self.uri)
            c = self.config
            check_pool_token_transport(c, address, f"--store {self.uri}")
            client = self._client = PoolClient(address, pool_client_config(c))
            self._resolver = PoolHandleResolver(client)
        else:
            from clink.tools.sources import store_config
            from store.handles import StoreHandleResolver
            from store.objects import open_store

            self._resolver = StoreHandleResolver(open_store(self.uri, store_config(self.config), must_exist=True))
        return self._resolver

    def resolve_handle(self, handle: Handle) -> pa.Table:
        """The verified rows of ``handle`` from the store or pool --store names."""
        return self._open().resolve_handle(handle)

    def close(self) -> None:
        """Close the pool channel, if one was opened."""
        client, self._client = self._client, None
        if client is not None:
            client.close()


@contextmanager
def source_handles(config: SourceConfig | None) -> Iterator[LazyHandleResolver | None]:
    """The resolver of ``config.handle_store`` (None without one), closed on leaving."""
    uri = getattr(config, "handle_store", None) if config is not None else None
    if not uri:
        yield None
        return
    assert config is not None
    resolver = LazyHandleResolver(uri, config)
    try:
        yield resolver
    finally:
        resolver.close()
