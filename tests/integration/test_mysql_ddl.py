"""DDL in the middle of the stream: later events carry the right columns, and every change of a
captured table's shape is recorded in ``<prefix>.schema-changes`` with its statement."""

from __future__ import annotations

import orjson
import pytest

from tests.integration.pg_capture import (
    embedded_log,  # noqa: F401 - the fixture ``log``
    topic_state,
    wait_until,
)
from tests.integration.test_mysql_source import capturing, execute, mysql_config, records

pytestmark = pytest.mark.mysql


def shapes(log, table: str) -> list[list[tuple[str, str]]]:
    return [[(c["name"], c["type"]) for c in s["columns"]] for s in map(orjson.loads, (
        r.value for r in log.read_all("d.schema-changes"))) if s["table"] == table]


def test_columns_follow_alter_rename_and_new_tables(mysql_url, mysql_db, log):
    execute(mysql_url, mysql_db, "CREATE TABLE a (id INT PRIMARY KEY, v TEXT)", "INSERT INTO a VALUES (1, 'x')")
    with capturing(mysql_config(mysql_url, mysql_db), log, "d") as capture:
        wait_until(lambda: topic_state(log, f"d.{mysql_db}.a"), capture=capture)
        execute(mysql_url, mysql_db,
                "ALTER TABLE a ADD COLUMN extra INT", "INSERT INTO a VALUES (2, 'y', 7)",
                "ALTER TABLE a DROP COLUMN v", "UPDATE a SET extra = 0 WHERE extra IS NULL",
                "ALTER TABLE a MODIFY extra BIGINT NOT NULL",
                "INSERT INTO a VALUES (3, 8)",
                "ALTER TABLE a ADD COLUMN doc JSON AFTER id", "INSERT INTO a VALUES (4, '{\"k\": [1]}', 9)",
                "ALTER TABLE a CHANGE extra amount DECIMAL(8,2)", "UPDATE a SET amount = 1.5 WHERE id = 3",
                "RENAME TABLE a TO a2", "INSERT INTO a2 VALUES (5, NULL, 10)",
                "CREATE TABLE b (id INT PRIMARY KEY, w TEXT)", "INSERT INTO b VALUES (1, 'new table')",
                "DROP TABLE b", "CREATE TABLE b (id BIGINT PRIMARY KEY, other JSON)",
                "INSERT INTO b VALUES (2, '[1, {\"x\": null}]')")
        wait_until(lambda: topic_state(log, f"d.{mysql_db}.b") == {'{"id":2}': {"id": 2, "other": [1, {"x": None}]}},
                   what="the re-created table", capture=capture)
        wait_until(lambda: topic_state(log, f"d.{mysql_db}.a2"), capture=capture)
    a = topic_state(log, f"d.{mysql_db}.a")
    assert a == {'{"id":1}': {"id": 1, "extra": 0}, '{"id":2}': {"id": 2, "v": "y", "extra": 7},
                 '{"id":3}': {"id": 3, "doc": None, "amount": "1.50"},
                 '{"id":4}': {"id": 4, "doc": {"k": [1]}, "extra": 9}}
    assert topic_state(log, f"d.{mysql_db}.a2") == {'{"id":5}': {"id": 5, "doc": None, "amount": "10.00"}}
    b_records = records(log, f"d.{mysql_db}.b")  # DROP TABLE is a truncate (one per partition)
    assert sorted(r["op"] for r in b_records) == ["c", "c", "t", "t"]
    assert [r["after"] for r in b_records if r["op"] == "c"] == [{"id": 1, "w": "new table"},
                                                                {"id": 2, "other": [1, {"x": None}]}]

    assert shapes(log, "a") == [
        [("id", "int"), ("v", "text")],
        [("id", "int"), ("v", "text"), ("extra", "int")],
        [("id", "int"), ("extra", "int")],
        [("id", "int"), ("extra", "bigint")],
        [("id", "int"), ("doc", "json"), ("extra", "bigint")],
        [("id", "int"), ("doc", "json"), ("amount", "decimal(8,2)")],
        [],  # renamed away
    ]
    assert shapes(log, "a2") == [[("id", "int"), ("doc", "json"), ("amount", "decimal(8,2)")]]
    assert shapes(log, "b") == [[("id", "int"), ("w", "text")], [], [("id", "bigint"), ("other", "json")]]
    statements = [orjson.loads(r.value)["ddl"] for r in log.read_all("d.schema-changes")]
    assert "RENAME TABLE a TO a2" in statements and "ALTER TABLE a ADD COLUMN doc JSON AFTER id" in statements
    nullable = {c["name"]: c["nullable"] for c in orjson.loads(
        [r.value for r in log.read_all("d.schema-changes")][3])["columns"]}
    assert nullable == {"id": False, "extra": False}


def test_create_select_and_a_statement_the_parser_does_not_follow(mysql_url, mysql_db, log, monkeypatch):
    from sources.mysql import ddl, stream

    execute(mysql_url, mysql_db, "CREATE TABLE src (id INT PRIMARY KEY, j JSON)",
            "INSERT INTO src VALUES (1, '{\"a\": 1}')")
    parse = ddl.parse

    def parse_all_but_one(sql: str, db: str):  # as if the parser did not know this statement
        return ddl.Unparsed(db, "src") if "j2" in sql else parse(sql, db)

    monkeypatch.setattr(stream.ddl, "parse", parse_all_but_one)
    with capturing(mysql_config(mysql_url, mysql_db), log, "d") as capture:
        wait_until(lambda: topic_state(log, f"d.{mysql_db}.src"), capture=capture)
        # MariaDB logs CREATE ... SELECT as the CREATE TABLE of the result (JSON as a checked LONGTEXT).
        execute(mysql_url, mysql_db, "CREATE TABLE made (id INT PRIMARY KEY, j JSON) SELECT id, j, 'k' AS label "
                                     "FROM src",
                "ALTER TABLE src ADD COLUMN j2 JSON", "INSERT INTO src VALUES (2, NULL, '[2]')")
        wait_until(lambda: topic_state(log, f"d.{mysql_db}.made"), capture=capture)
        wait_until(lambda: len(topic_state(log, f"d.{mysql_db}.src")) == 2, capture=capture)
    assert topic_state(log, f"d.{mysql_db}.made") == {'{"id":1}': {"id": 1, "j": {"a": 1}, "label": "k"}}
    assert topic_state(log, f"d.{mysql_db}.src")['{"id":2}'] == {"id": 2, "j": None, "j2": [2]}
    changes = [s for s in map(orjson.loads, (r.value for r in log.read_all("d.schema-changes")))]
    (made,) = [s for s in changes if s["table"] == "made"]
    assert [(c["name"], c["type"], c["key"]) for c in made["columns"]][:2] == [("id", "int", True), ("j", "json", False)]
    # The statement it could not follow is recorded when the next table map gives the new shape.
    last = [s for s in changes if s["table"] == "src"][-1]
    assert last["ddl"] == "ALTER TABLE src ADD COLUMN j2 JSON"
    assert [(c["name"], c["type"]) for c in last["columns"]] == [("id", "int"), ("j", "json"), ("j2", "json")]
