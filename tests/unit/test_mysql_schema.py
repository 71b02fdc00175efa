"""Following table definitions through DDL statements (ddl.py, schema.py), the settings check and
MariaDB GTID positions; no server needed."""

from __future__ import annotations

import pytest

from cdc.errors import PrerequisiteError
from cdc.events import TableId
from sources.mysql import ddl
from sources.mysql.catalog import check_settings
from sources.mysql.columns import BLOB, LONG, VARCHAR, ColumnSpec
from sources.mysql.gtid import GtidPosition
from sources.mysql.schema import SchemaTracker, TableSchema


def tracker(*tables: TableSchema) -> SchemaTracker:
    return SchemaTracker(lambda db, table: db == "shop", {(t.id.db, t.id.table): t for t in tables})


def create(sql: str) -> TableSchema:
    statement = ddl.parse(sql, "shop")
    assert isinstance(statement, ddl.CreateTable), statement
    return TableSchema(TableId(statement.db, None, statement.table), list(statement.columns), statement.key)


def shape(t: SchemaTracker, table: str) -> list[tuple[str, str, bool]]:
    return [(c.name, c.type_name, c.nullable) for c in t.get("shop", table).columns]


ORDERS = """CREATE TABLE `orders` (
  `id` bigint(20) unsigned NOT NULL AUTO_INCREMENT,
  customer INT NOT NULL COMMENT 'who, (really)',
  total DECIMAL(10, 2) DEFAULT '0.00',
  doc JSON,
  made DATETIME(3) NOT NULL DEFAULT current_timestamp(3),
  state ENUM('new','paid') CHARACTER SET latin1 DEFAULT 'new',
  raw VARBINARY(16), tag CHAR(3) CHARACTER SET binary,
  PRIMARY KEY (`id`), KEY by_customer (customer), CONSTRAINT c CHECK (total >= 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 /*!50100 PARTITION BY HASH (id) */"""


def test_create_table():
    table = create(ORDERS)
    assert table.key == ("id",)
    assert [(c.name, c.type_name, c.nullable) for c in table.columns] == [
        ("id", "bigint unsigned", False), ("customer", "int", False), ("total", "decimal(10,2)", True),
        ("doc", "json", True), ("made", "datetime(3)", False), ("state", "enum('new','paid')", True),
        ("raw", "varbinary(16)", True), ("tag", "char(3)", True)]
    assert table.json_columns() == {"doc"}
    types = {c.name: c.type for c in table.columns}
    assert types["made"].fsp == 3 and types["raw"].binary and types["tag"].binary and not types["state"].binary


def test_json_columns_logged_as_checked_longtext():
    table = create("CREATE TABLE `made` (\n  `id` int(11) NOT NULL,\n  `j` longtext CHARACTER SET utf8mb4 COLLATE "
                   "utf8mb4_bin DEFAULT NULL CHECK (json_valid(`j`)),\n  `t` longtext, k longtext,\n  "
                   "PRIMARY KEY (`id`), CONSTRAINT `c` CHECK (json_valid(`k`)))")
    assert table.json_columns() == {"j", "k"} and table.key == ("id",)


def test_alter_add_drop_modify_change_rename_columns():
    t = tracker(create(ORDERS))
    changes, truncated = t.apply(ddl.parse("ALTER TABLE orders ADD COLUMN note TEXT AFTER customer, "
                                           "DROP COLUMN raw, MODIFY total DECIMAL(12,4) NOT NULL, "
                                           "CHANGE COLUMN tag label VARCHAR(20), RENAME COLUMN doc TO body, "
                                           "ADD extra LONGTEXT FIRST, ALGORITHM=INPLACE", "shop"),
                                 "ALTER ...", 7, 1000)
    assert truncated == []
    assert [c.name for c in t.get("shop", "orders").columns] == [
        "extra", "id", "customer", "note", "total", "body", "made", "state", "label"]
    assert ("total", "decimal(12,4)", False) in shape(t, "orders")
    assert ("label", "varchar(20)", True) in shape(t, "orders")
    assert t.get("shop", "orders").json_columns() == {"body"}
    (change,) = changes
    assert change.table == TableId("shop", None, "orders") and change.ddl == "ALTER ..." and change.version == 7
    assert [c.name for c in change.columns if c.key] == ["id"]
    # The shape says which columns were renamed, so a sink keeps their values under the new name.
    assert {c.name: c.renamed_from for c in change.columns if c.renamed_from} == {"label": "tag", "body": "doc"}


def test_renames_in_one_statement_are_told_from_the_names_before_it():
    t = tracker(create("CREATE TABLE orders (id INT PRIMARY KEY, a INT, b INT, c INT)"))
    (change,), _ = t.apply(ddl.parse("ALTER TABLE orders RENAME COLUMN a TO a2, CHANGE a2 a3 BIGINT, "
                                     "RENAME COLUMN b TO b2, DROP COLUMN b2, CHANGE c c INT", "shop"), "", 8, 1)
    assert {c.name: c.renamed_from for c in change.columns} == {"id": None, "a3": "a", "c": None}
    (change,), _ = t.apply(ddl.parse("ALTER TABLE orders ADD COLUMN z INT", "shop"), "", 9, 1)
    # No row in between: a sink meets this shape only, so it carries the renames before it ...
    assert {c.name: c.renamed_from for c in change.columns} == {"id": None, "a3": "a", "c": None, "z": None}
    (change,), _ = t.apply(ddl.parse("ALTER TABLE orders RENAME COLUMN a3 TO a4", "shop"), "", 10, 1)
    assert {c.name: c.renamed_from for c in change.columns}["a4"] == "a"
    # ... until a table map: rows of that shape follow, so a sink has met it.
    specs = [ColumnSpec("id", LONG, nullable=False), ColumnSpec("a4", LONG), ColumnSpec("c", LONG),
             ColumnSpec("z", LONG)]
    assert t.from_table_map("shop", "orders", specs, ("id",), lambda: set(), 11, 1) is None
    (change,), _ = t.apply(ddl.parse("ALTER TABLE orders ADD COLUMN y INT", "shop"), "", 12, 1)
    assert not any(c.renamed_from for c in change.columns)


def test_a_resume_behind_the_catalog_publishes_the_binlogs_shapes_and_still_tells_renames():
    """The catalog read at a resume already has a rename made while the source was down: no shape
    goes out from it until the binlog says what the table was there, and the replayed RENAME is
    still a rename for a sink that holds the old name."""
    t = tracker(create("CREATE TABLE items (id INT PRIMARY KEY, title TEXT, extra INT)"))
    t.defer()
    specs = [ColumnSpec("id", LONG, nullable=False), ColumnSpec("title", BLOB, length=2, charset="utf8mb4"),
             ColumnSpec("extra", LONG)]
    change = t.from_table_map("shop", "items", specs, ("id",), lambda: set(), 5, 1)
    assert change is not None and [c.name for c in change.columns] == ["id", "title", "extra"]  # confirmed
    assert t.from_table_map("shop", "items", specs, ("id",), lambda: set(), 6, 1) is None
    # Nothing pending: the first thing the stream meets is the rename itself.
    t = tracker(create("CREATE TABLE items (id INT PRIMARY KEY, title TEXT, extra INT)"))
    t.defer()
    (change,), _ = t.apply(ddl.parse("ALTER TABLE items RENAME COLUMN label TO title", "shop"), "", 7, 1)
    assert {c.name: c.renamed_from for c in change.columns} == {"id": None, "title": "label", "extra": None}
    (change,), _ = t.apply(ddl.parse("ALTER TABLE items DROP COLUMN qty", "shop"), "", 8, 1)
    assert {c.name: c.renamed_from for c in change.columns}["title"] == "label"


def test_a_column_renamed_twice_while_the_source_was_down_keeps_its_first_name():
    """The catalog read at the resume has ``remark``; the binlog renames ``note`` to ``memo``
    (names the copy lacks both), then ``memo`` to ``remark``: the shape says ``remark`` was
    ``note``. With rows between the renames, their table map shows ``memo``, which was ``note``."""
    catalog = "CREATE TABLE items (id INT PRIMARY KEY, title TEXT, remark TEXT)"
    t = tracker(create(catalog))
    t.defer()
    (change,), _ = t.apply(ddl.parse("ALTER TABLE items RENAME COLUMN note TO memo", "shop"), "", 7, 1)
    assert not any(c.renamed_from for c in change.columns)
    (change,), _ = t.apply(ddl.parse("ALTER TABLE items RENAME COLUMN memo TO remark", "shop"), "", 8, 1)
    assert {c.name: c.renamed_from for c in change.columns}["remark"] == "note"
    t = tracker(create(catalog))
    t.defer()
    t.apply(ddl.parse("ALTER TABLE items RENAME COLUMN label TO title", "shop"), "", 7, 1)
    t.apply(ddl.parse("ALTER TABLE items CHANGE note memo TEXT", "shop"), "", 8, 1)
    specs = [ColumnSpec("id", LONG, nullable=False), ColumnSpec("title", BLOB, length=2, charset="utf8mb4"),
             ColumnSpec("memo", BLOB, length=2, charset="utf8mb4")]
    change = t.from_table_map("shop", "items", specs, ("id",), lambda: set(), 9, 1)
    assert {c.name: c.renamed_from for c in change.columns} == {"id": None, "title": "label", "memo": "note"}
    (change,), _ = t.apply(ddl.parse("ALTER TABLE items RENAME COLUMN memo TO remark", "shop"), "", 10, 1)
    assert {c.name: c.renamed_from for c in change.columns}["remark"] == "memo"


def test_alter_is_idempotent_over_a_catalog_that_already_has_the_change():
    t = tracker(create(ORDERS))
    for _ in range(2):
        t.apply(ddl.parse("ALTER TABLE shop.orders ADD COLUMN IF NOT EXISTS note TEXT", "other"), "", 1, 1)
        t.apply(ddl.parse("ALTER TABLE orders DROP COLUMN IF EXISTS raw", "shop"), "", 1, 1)
    names = [c.name for c in t.get("shop", "orders").columns]
    assert names.count("note") == 1 and "raw" not in names


def test_primary_key_changes():
    t = tracker(create("CREATE TABLE k (a INT NOT NULL, b INT NOT NULL, c INT)"))
    assert t.get("shop", "k").key == ()
    t.apply(ddl.parse("ALTER TABLE k ADD PRIMARY KEY (a, b)", "shop"), "", 1, 1)
    assert t.get("shop", "k").key == ("a", "b")
    t.apply(ddl.parse("ALTER TABLE k DROP PRIMARY KEY, ADD CONSTRAINT pk PRIMARY KEY (c)", "shop"), "", 1, 1)
    assert t.get("shop", "k").key == ("c",) and shape(t, "k")[2] == ("c", "int", False)


def test_rename_table_moves_the_definition_and_drops_the_old_name():
    t = tracker(create(ORDERS))
    changes, _ = t.apply(ddl.parse("RENAME TABLE orders TO orders_old, shop.x TO other.y", "shop"), "RENAME", 3, 1)
    assert t.get("shop", "orders") is None and t.get("shop", "orders_old") is not None
    assert [(c.table.table, len(c.columns)) for c in changes] == [("orders", 0), ("orders_old", 8)]
    changes, _ = t.apply(ddl.parse("ALTER TABLE orders_old RENAME TO other.archived", "shop"), "", 4, 1)
    assert t.get("shop", "orders_old") is None and t.get("other", "archived") is None  # not captured
    assert [(c.table.table, len(c.columns)) for c in changes] == [("orders_old", 0)]


def test_create_like_drop_and_truncate():
    t = tracker(create(ORDERS))
    changes, _ = t.apply(ddl.parse("CREATE TABLE IF NOT EXISTS copy LIKE orders", "shop"), "", 1, 1)
    assert shape(t, "copy") == shape(t, "orders") and len(changes) == 1
    changes, truncated = t.apply(ddl.parse("DROP TABLE IF EXISTS `copy`, missing /* generated by server */",
                                           "shop"), "", 2, 1)
    assert t.get("shop", "copy") is None and [c.columns for c in changes] == [()]
    assert truncated == [TableId("shop", None, "copy")]
    assert t.apply(ddl.parse("TRUNCATE TABLE orders", "shop"), "", 3, 1) == ([], [TableId("shop", None, "orders")])
    assert t.apply(ddl.parse("TRUNCATE other.t", "shop"), "", 3, 1) == ([], [])


def test_statements_that_change_no_table():
    for sql in ("CREATE DATABASE x", "CREATE INDEX i ON t (a)", "GRANT ALL ON *.* TO u", "FLUSH TABLES",
                "CREATE TEMPORARY TABLE tmp (a int)", "DROP VIEW v", "INSERT INTO t VALUES (1)", ""):
        assert ddl.parse(sql, "shop") is None, sql


def test_what_the_parser_cannot_follow_is_left_to_the_next_table_map():
    t = tracker(create(ORDERS))
    statement = ddl.parse("CREATE TABLE made AS SELECT * FROM orders", "shop")
    assert statement == ddl.Unparsed("shop", "made")
    statement = ddl.parse("ALTER TABLE orders SOMETHING NEW (x)", "shop")
    assert statement == ddl.Unparsed("shop", "orders")
    t.apply(statement, "ALTER TABLE orders SOMETHING NEW (x)", 5, 1)
    specs = [ColumnSpec("id", LONG, nullable=False), ColumnSpec("doc", BLOB, length=4, charset="utf8mb4"),
             ColumnSpec("name", VARCHAR, length=80, charset="utf8mb4")]
    change = t.from_table_map("shop", "orders", specs, ("id",), lambda: {"doc"}, 9, 2)
    assert change is not None and change.ddl == "ALTER TABLE orders SOMETHING NEW (x)"
    assert [(c.name, c.type) for c in change.columns] == [("id", "int"), ("doc", "json"),
                                                          ("name", "varchar(80 bytes)")]
    assert t.from_table_map("shop", "orders", specs, ("id",), lambda: set(), 10, 2) is None  # now in step


def test_a_table_map_with_other_columns_wins_over_the_tracked_definition():
    t = tracker(create("CREATE TABLE s (id INT PRIMARY KEY, j JSON)"))
    specs = [ColumnSpec("id", LONG, nullable=False), ColumnSpec("j", BLOB, length=4, charset="utf8mb4"),
             ColumnSpec("new", LONG)]
    change = t.from_table_map("shop", "s", specs, ("id",), lambda: set(), 9, 2)
    assert [c.name for c in change.columns] == ["id", "j", "new"] and change.ddl is None
    assert t.get("shop", "s").json_columns() == {"j"}  # kept from the definition it had


def test_settings_check_names_every_problem_and_its_fix():
    good = {"log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "FULL", "binlog_row_metadata": "FULL",
            "log_bin_compress": "OFF"}
    check_settings(good)
    with pytest.raises(PrerequisiteError) as err:
        check_settings(good | {"binlog_format": "MIXED", "binlog_row_metadata": "MINIMAL", "log_bin": "OFF"})
    message = str(err.value)
    assert "binlog_format is MIXED" in message and "SET GLOBAL binlog_format = 'ROW'" in message
    assert "binlog_row_metadata is MINIMAL" in message and "column names" in message
    assert "log_bin is OFF" in message and "--log-bin" in message
    with pytest.raises(PrerequisiteError, match="binlog_row_image is MINIMAL.*whole rows"):
        check_settings(good | {"binlog_row_image": "MINIMAL"})
    with pytest.raises(PrerequisiteError, match="log_bin_compress"):
        check_settings(good | {"log_bin_compress": "ON"})
    with pytest.raises(PrerequisiteError, match="no binlog_row_metadata"):
        check_settings({k: v for k, v in good.items() if k != "binlog_row_metadata"})


def test_gtid_positions():
    position = GtidPosition.parse("0-1-57, 1-2-9")
    assert str(position) == "0-1-57,1-2-9"
    position.advance(0, 3, 58)
    assert str(position) == "0-3-58,1-2-9"
    assert GtidPosition.parse("0-1-50").covered_by(position)
    assert not GtidPosition.parse("0-1-59").covered_by(position)
    assert not GtidPosition.parse("2-1-1").covered_by(position)
    assert GtidPosition.parse("").covered_by(position) and str(GtidPosition.parse(None)) == ""
    with pytest.raises(ValueError, match="domain-server-sequence"):
        GtidPosition.parse("3E11FA47-71CA-11E1-9E33-C80AA9429562:23")


def test_a_table_renamed_away_after_a_resume_and_made_again_unparsed_follows_its_table_map():
    """After a resume, a table renamed away and made again by DDL the parser cannot follow is
    known from its first table map (the old name's copy went with the rename)."""
    t = tracker(create("CREATE TABLE items (id INT PRIMARY KEY, title TEXT)"))
    t.defer()
    t.apply(ddl.parse("RENAME TABLE items TO items_old", "shop"), "RENAME", 5, 1)
    t.apply(ddl.parse("CREATE TABLE items AS SELECT * FROM items_old", "shop"), "CREATE ... SELECT", 6, 1)
    specs = [ColumnSpec("id", LONG, nullable=False), ColumnSpec("title", BLOB, length=2, charset="utf8mb4")]
    change = t.from_table_map("shop", "items", specs, ("id",), lambda: set(), 7, 1)
    assert change is not None and [c.name for c in change.columns] == ["id", "title"]
    assert change.ddl == "CREATE ... SELECT"
