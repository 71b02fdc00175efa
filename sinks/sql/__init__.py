"""The SQL warehouse sink (``type: sql``): topics into tables of PostgreSQL, MySQL/MariaDB, SQLite
or DuckDB, through SQLAlchemy 2.

    config.py        SqlSinkConfig
    sink.py          SqlSink: lifecycle, the write transaction, data-error diagnosis
    reduce.py        a batch -> the newest action per (topic, key)
    tables.py        table names, creation, schema evolution (DDL), the plan of a write
    evolve.py        comparing source columns: added, dropped, incompatible
    types.py         source type names -> target column types; types inferred from values
    values.py        event values -> driver values (executemany dialects)
    plan.py          what one write does to one table
    apply_staged.py  PostgreSQL, DuckDB: the batch staged once (COPY / one JSON value), set-based SQL
    copy_rows.py     PostgreSQL: upserts as typed COPY text rows, per table shape
    bulk_load.py     PostgreSQL: a rebuild's windows COPYed straight into the new generation
    apply_generic.py MySQL/MariaDB, SQLite: executemany upserts/deletes
    bookkeeping.py   cdc_sink_generations, cdc_sink_tables, cdc_sink_deletes, cdc_sink_state
    generations.py   open/switch/drop generations behind views
    target.py        engine, session settings and dialect SQL of one target database
    errors.py        driver errors -> RetriableError / PermanentError, by code
"""

from sinks.sql.config import SqlSinkConfig
from sinks.sql.sink import SqlSink

__all__ = ["SqlSink", "SqlSinkConfig"]
