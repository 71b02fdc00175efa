"""Reading the Spark sink's Iceberg tables with PyIceberg, as an engine other than Spark would.

A ``hadoop`` catalog's table is read from its directory (``metadata/version-hint.text`` names
the current metadata file); a ``jdbc`` catalog's through PyIceberg's SQL catalog on the same
database, which reads the pointers Iceberg's Java JdbcCatalog keeps (the same tables)."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit


def jdbc_catalog(dsn: str) -> dict:
    """The sink's ``iceberg.catalog`` section for a jdbc catalog in the database of ``dsn``
    (postgresql://user[:password]@host:port/db)."""
    url = urlsplit(dsn)
    properties = {"jdbc.user": url.username or "postgres"}
    if url.password:
        properties["jdbc.password"] = url.password
    return {"type": "jdbc", "uri": f"jdbc:postgresql://{url.hostname}:{url.port}{url.path}",
            "properties": properties}


class IcebergTables:
    """The tables of one sink: ``rows("public.items", "id", "name", where=...)``."""

    def __init__(self, catalog: dict, warehouse: str, catalog_name: str = "cdc", dsn: str | None = None) -> None:
        self.catalog, self.warehouse, self.catalog_name, self.dsn = catalog, warehouse, catalog_name, dsn

    def table(self, name: str):
        if self.catalog.get("type", "hadoop") == "hadoop":
            from pyiceberg.table import StaticTable

            return StaticTable.from_metadata(f"{self.warehouse}/{name.replace('.', '/')}")
        from pyiceberg.catalog.sql import SqlCatalog

        assert self.dsn is not None
        url = urlsplit(self.dsn)
        catalog = SqlCatalog(self.catalog_name, uri=f"postgresql+psycopg2://{url.netloc}{url.path}",
                             warehouse=f"file://{self.warehouse}")
        return catalog.load_table(name)

    def exists(self, name: str) -> bool:
        try:
            self.table(name)
        except Exception:  # noqa: BLE001 - PyIceberg's NoSuchTableError, or no metadata file
            return False
        return True

    def frame(self, name: str) -> list[dict]:
        return self.table(name).scan().to_arrow().to_pylist()

    def rows(self, name: str, *columns: str, where: Callable[[dict], bool] | None = None) -> list[tuple]:
        return sorted(tuple(r[c] for c in columns) for r in self.frame(name) if where is None or where(r))

    def columns(self, name: str) -> dict[str, str]:
        return {f.name: str(f.field_type) for f in self.table(name).schema().fields}

    def properties(self, name: str) -> dict[str, str]:
        return dict(self.table(name).properties)
