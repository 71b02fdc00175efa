"""Reading the Spark sink's Iceberg tables with PyIceberg, as an engine other than Spark would.

A ``hadoop`` catalog's table is read from its directory (``metadata/version-hint.text`` names
the current metadata file); a ``jdbc`` catalog's through PyIceberg's SQL catalog on the same
database, which reads the pointers Iceberg's Java JdbcCatalog keeps (the same tables); a ``rest``
catalog's through PyIceberg's REST catalog (``RestCatalogServer`` runs one)."""

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
        kind = self.catalog.get("type", "hadoop")
        if kind == "hadoop":
            from pyiceberg.table import StaticTable

            return StaticTable.from_metadata(f"{self.warehouse}/{name.replace('.', '/')}")
        if kind == "rest":
            from pyiceberg.catalog.rest import RestCatalog

            return RestCatalog(self.catalog_name, uri=self.catalog["uri"]).load_table(name)
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


class RestCatalogServer:
    """Iceberg's REST catalog server (its compatibility kit's fixture, the ``iceberg-rest`` jars of
    ``cdc dev fetch``) over a JdbcCatalog in SQLite under ``work``, on a free port (the fixture
    takes no address to bind: it listens on every interface, and the tests reach it on loopback)."""

    def __init__(self, work) -> None:
        from cdc.dev.services import free_port

        self.work, self.port = work, free_port()
        self.process = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> RestCatalogServer:
        import os
        import shutil
        import subprocess
        import time
        import urllib.request

        from cdc.dev.jars import classpath

        self.work.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "CATALOG_REST_PORT": str(self.port), "CATALOG_WAREHOUSE": str(self.work / "warehouse"),
               "CATALOG_URI": f"jdbc:sqlite:file:{self.work / 'catalog.db'}", "CATALOG_JDBC_USER": "cdc",
               "CATALOG_JDBC_PASSWORD": "cdc"}
        java = shutil.which("java") or "java"
        with open(self.work / "rest-catalog.log", "ab") as out:
            self.process = subprocess.Popen([java, "-cp", classpath("iceberg-rest"),
                                             "org.apache.iceberg.rest.RESTCatalogServer"], env=env, stdout=out,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{self.uri}/v1/config", timeout=2):
                    return self
            except OSError:
                assert self.process.poll() is None, (self.work / "rest-catalog.log").read_text()[-2000:]
                assert time.monotonic() < deadline, "the Iceberg REST catalog did not start"
                time.sleep(0.3)

    def stop(self) -> None:
        from tests.daemon import kill_daemon

        if self.process is not None and self.process.poll() is None:
            kill_daemon(self.process)
