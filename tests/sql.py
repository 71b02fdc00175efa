"""Reading a database from a test: the rows of one statement, on a connection of its own.

One helper for every target the tests read, by SQLAlchemy URL or by the ``postgresql://`` DSN the
PostgreSQL fixtures hand out, so that no test file writes connect, execute, fetch and close again."""

from __future__ import annotations

import sqlalchemy as sa


def query(url: str, sql: str, params: tuple = ()) -> list[tuple]:
    """The rows of ``sql`` on the database at ``url``; ``params`` take the driver's own
    placeholders (``%s`` for PostgreSQL and MariaDB, ``?`` for SQLite)."""
    if url.startswith("postgresql://"):  # a libpq DSN: SQLAlchemy's default driver would be psycopg 3
        url = url.replace("postgresql://", "postgresql+psycopg2://", 1)
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.exec_driver_sql(sql, params)]
    finally:
        engine.dispose()
