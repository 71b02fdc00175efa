"""Columns renamed (and others added and dropped) while the capture daemon is down, PostgreSQL
and MariaDB: the restarted source sees the table's new columns with no DDL of its own session in
between, and must still tell the sinks that the column was renamed, or the sink would add an empty
column under the new name and keep the values under the old one. After the restart an ``evolve``
sql sink holds every row's value under the new name (rows never written since too), has no
column of the old name, and equals the source. Real servers, Kafka, ``cdc run``.

One column is renamed twice, with rows written between the renames: the restarted stream meets
the middle name, which neither the catalog (it has the last name) nor the source's state (the
first) knows. PostgreSQL places it by its position among the columns (changes.py, ``_placed``),
MariaDB by the chain of its RENAME statements (schema.py, ``ahead``): its values stay too."""

from __future__ import annotations

import pytest

from tests.daemon import run_daemon, stop_daemon
from tests.integration.pg_capture import wait_until
from tests.integration.test_recreate_while_down import _config, assert_logs_clean, db, stop_once_the_shape_is_stored  # noqa: F401 - the fixture
from tests.live_ddl import converge, query, target_types

pytestmark = [pytest.mark.kafka]

TABLE = {"postgres": "CREATE TABLE items (id integer PRIMARY KEY, label text, note text, qty integer)",
         "mysql": "CREATE TABLE items (id int PRIMARY KEY, label text, note text, qty int)"}
ADD = {"postgres": "ALTER TABLE items ADD COLUMN extra integer", "mysql": "ALTER TABLE items ADD COLUMN extra int"}


@pytest.mark.parametrize("pending", [True, False], ids=["old-changes-pending", "nothing-pending"])
def test_columns_renamed_while_the_source_is_down_keep_their_values(db, kafka_bootstrap, tmp_path, pending):
    """``pending``: rows changed in the old shape after the stored position, so the restarted
    stream reads the old names first; else the new names are the first it sees."""
    db.execute(TABLE[db.kind])
    db.execute("INSERT INTO items VALUES " + ", ".join(f"({i}, 'l{i}', 'n{i}', {i})" for i in range(1, 21)))
    config = _config(tmp_path, db, kafka_bootstrap)
    target = f"sqlite:///{tmp_path}/ev.db"
    source, sink = run_daemon(config, "src", log="src.log"), run_daemon(config, "ev", log="ev.log")
    try:
        converge(target, db.url, "items", ["id", "label", "note", "qty"], "before the restart")
        stop_once_the_shape_is_stored(source, db, tmp_path)
        if pending:
            db.execute("UPDATE items SET label = 'changed' WHERE id <= 3")
        db.execute("ALTER TABLE items RENAME COLUMN label TO title")
        db.execute("ALTER TABLE items RENAME COLUMN note TO memo")
        db.execute("UPDATE items SET memo = 'm' WHERE id <= 2")  # rows of the middle name
        db.execute("ALTER TABLE items RENAME COLUMN memo TO remark")
        db.execute("ALTER TABLE items DROP COLUMN qty")
        db.execute(ADD[db.kind])
        db.execute("UPDATE items SET extra = id * 10 WHERE id > 15")  # the others are never written again
        source = run_daemon(config, "src", log="src.log")
        converge(target, db.url, "items", ["id", "title", "remark", "extra"], "after the restart")
        wait_until(lambda: not {"label", "note", "memo"} & set(target_types(target, "items")), timeout=60,
                   what="the old names gone from the target")
        assert query(target, "SELECT title, remark FROM items WHERE id = 7") == [("l7", "n7")]
    finally:
        stop_daemon(source)
        stop_daemon(sink)
    assert_logs_clean(tmp_path)
