"""The Iceberg export: the five-column projection appended to a table in a pyiceberg catalog (a local SQL catalog needs no server)."""

from __future__ import annotations

from snapshot import ClinkError, ConflictError, InvalidArgumentError, UnavailableError

ICEBERG_PROPERTY_PREFIX = "clink."


def open_catalog(catalog_name: str, catalog_uri: str, warehouse: str | None):
    """A pyiceberg catalog from a URI: sqlite:// and other SQLAlchemy URLs give a SqlCatalog, http(s):// a REST catalog."""
    if catalog_uri.startswith(("http://", "https://")):
        from pyiceberg.catalog.rest import RestCatalog

        props = {"uri": catalog_uri}
        if warehouse:
            props["warehouse"] = warehouse
        return RestCatalog(catalog_name, **props)
    if not warehouse:
        raise InvalidArgumentError("--warehouse is required with a SQL catalog (for example file:///tmp/warehouse)")
    from pyiceberg.catalog.sql import SqlCatalog

    try:
        return SqlCatalog(catalog_name, uri=catalog_uri, warehouse=warehouse)
    except Exception as exc:  # noqa: BLE001 - SQLAlchemy raises many types for a bad URL; the user needs one line
        raise InvalidArgumentError(f"cannot open catalog {catalog_uri}: {type(exc).__name__}: {exc}") from exc


def _identifier(table_name: str) -> tuple[str, str]:
    parts = table_name.split(".")
    if len(parts) < 2 or not all(parts):
        raise InvalidArgumentError(f"--table {table_name!r} must be NAMESPACE.NAME (for example clink.orders)")
    return ".".join(parts[:-1]), parts[-1]


def write_iceberg(source, catalog_name: str, catalog_uri: str, warehouse: str | None, table_name: str, if_exists: str) -> str:
    """Append the source's Iceberg projection to ``table_name``; returns the table location."""
    from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError

    from clink.tools.projections import iceberg_projection, projection_metadata

    namespace, _ = _identifier(table_name)
    data = iceberg_projection(source.table)
    meta = projection_metadata(source.format_version, source.state_versions, "iceberg/1")
    properties = {k.decode(): v.decode() for k, v in meta.items()}
    catalog = open_catalog(catalog_name, catalog_uri, warehouse)
    try:
        try:
            catalog.create_namespace(namespace)
        except NamespaceAlreadyExistsError:
            pass
        created = False
        try:
            table = catalog.load_table(table_name)
            if if_exists == "fail":
                raise ConflictError(f"Iceberg table {table_name} already exists (use --if-exists replace or append)")
            if if_exists == "replace":
                table.overwrite(data)
            else:
                table.append(data)
            with table.transaction() as tx:
                tx.set_properties(**properties)
            return table.location()
        except NoSuchTableError:
            table = catalog.create_table(table_name, schema=data.schema, properties=properties)
            created = True
        try:
            table.append(data)
        except Exception:
            if created:
                # a failed first write leaves no empty table behind
                catalog.drop_table(table_name)
            raise
        return table.location()
    except ClinkError:
        raise
    except Exception as exc:  # noqa: BLE001 - pyiceberg/SQLAlchemy/filesystem errors become one line
        raise UnavailableError(f"Iceberg export to {table_name} failed: {type(exc).__name__}: {' '.join(str(exc).split())}") from None
