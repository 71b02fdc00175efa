"""``cdc validate`` of ``documents:`` against the captured shapes, read from an embedded log that a
test fills with shape records (tests/shapes.py): each problem at its file:line (the line marked
``#!``), ``--offline``, a log that cannot be read; and the key families the checks compare."""

from __future__ import annotations

import textwrap

import pytest

from cdc.cli import main
from cdc.events import Column, TableId
from cdc.log.embedded import EmbeddedLog, log_file
from sinks.documents.keys import key_family
from tests.shapes import ShapedTopics


def table(name: str) -> TableId:
    schema, table_name = name.split(".")
    return TableId("shop", schema, table_name)


def col(name: str, type_name: str = "integer", key: bool = False) -> Column:
    return Column(name, type_name, key)


SHOP = {
    "public.orders": [col("id", key=True), col("customer_id"), col("placed_at", "timestamp with time zone"),
                      col("note", "text"), col("internal_note", "text"), col("total", "numeric(10,2)")],
    "public.customers": [col("id", key=True), col("name", "text"), col("password_hash", "text")],
    "public.order_items": [col("order_id", key=True), col("line_no", key=True), col("product_id", "text"),
                           col("qty")],
    "public.products": [col("id", "character varying(20)", key=True), col("sku", "text"), col("name", "text"),
                        col("category_id", "bigint")],
    "public.categories": [col("id", "bigint", key=True), col("name", "text")],
    "public.item_discounts": [col("id", key=True), col("order_id"), col("line_no"), col("percent", "numeric(5,2)")],
    "public.notes": [col("order_ref"), col("body", "text")],   # a table captured with no key
}


@pytest.fixture
def shop(tmp_path):
    """A config head whose embedded log holds the shop's shapes (source shop_pg), and the log."""
    log = EmbeddedLog(tmp_path / "log", fsync=False)
    topics = ShapedTopics(log, "cdc", source="shop_pg")
    for number, (name, columns) in enumerate(SHOP.items()):
        topics.publish(table(name), 100 + number, columns, [])
    yield log
    log.close()


HEAD = """\
log: {embedded: {path: ./log}}
sinks:
  - name: shop_search
    type: opensearch
    topics: ["cdc.public.*"]
"""


def validate(tmp_path, capsys, body: str, *flags: str) -> tuple[int, list[str]]:
    file = tmp_path / "shop.yaml"
    file.write_text(HEAD + textwrap.indent(textwrap.dedent(body), "    "))
    code = main(["validate", str(file), *flags])
    return code, capsys.readouterr().out.splitlines()


def marked_line(body: str) -> int:
    lines = (HEAD + textwrap.indent(textwrap.dedent(body), "    ")).splitlines()
    return next(number for number, line in enumerate(lines, 1) if "#!" in line)


GOOD = """\
documents:
  - name: orders
    table: public.orders
    exclude: [internal_note]
    rename: {placed_at: created}
    lookups:
      - {table: public.customers, as: customer, foreign_key: [customer_id], exclude: [password_hash]}
    children:
      - table: public.order_items
        as: items
        foreign_key: [order_id]
        order_by: [-line_no]
        lookups:
          - {table: public.products, as: product, foreign_key: [product_id], include: [id, sku, name],
             lookups: [{table: public.categories, as: category, foreign_key: [category_id]}]}
        children:
          - {table: public.item_discounts, as: discounts, foreign_key: [order_id, line_no]}
"""


def test_a_declaration_that_fits_the_shapes_passes(shop, tmp_path, capsys):
    code, out = validate(tmp_path, capsys, GOOD)
    assert code == 0, out
    assert out == [f"{tmp_path / 'shop.yaml'}: ok (0 sources, 1 sinks); sinks shop_search: checked against the "
                   "captured shapes"]


def one_change(old: str, new: str) -> str:
    assert GOOD.count(old) == 1, old
    return GOOD.replace(old, new)


CASES = {
    "an unknown column in exclude": (
        one_change("exclude: [internal_note]", "exclude: [internal_notes]   #!"),
        "documents[0].exclude[0]", "public.orders has no column 'internal_notes'; did you mean 'internal_note'?"),
    "an unknown column in include": (
        one_change("include: [id, sku, name],", "include: [id, sku, title],   #!"),
        "documents[0].children[0].lookups[0].include[2]", "public.products has no column 'title'"),
    "an unknown column renamed": (
        one_change("rename: {placed_at: created}", "rename: {placed: created}   #!"),
        "documents[0].rename.placed", "public.orders has no column 'placed'"),
    "an unknown column to order by": (
        one_change("order_by: [-line_no]", "order_by: [-line]   #!"),
        "documents[0].children[0].order_by[0]", "public.order_items has no column 'line'"),
    "an unknown column in a child's foreign key": (
        one_change("foreign_key: [order_id]\n", "foreign_key: [orderid]   #!\n"),
        "documents[0].children[0].foreign_key[0]", "public.order_items has no column 'orderid'"),
    "an unknown column in a lookup's foreign key (the enclosing table's)": (
        one_change("foreign_key: [customer_id], exclude: [password_hash]}",
                   "foreign_key: [client_id], exclude: [password_hash]}   #!"),
        "documents[0].lookups[0].foreign_key[0]", "public.orders has no column 'client_id'"),
    "a foreign key of the wrong arity": (
        one_change("foreign_key: [order_id, line_no]}", "foreign_key: [order_id]}   #!"),
        "documents[0].children[0].children[0].foreign_key",
        "1 column(s) of public.item_discounts cannot reference the key of public.order_items, which has 2 "
        "(order_id, line_no)"),
    "an integer referencing text": (
        one_change("foreign_key: [product_id], include: [id, sku, name],",
                   "foreign_key: [qty], include: [id, sku, name],   #!"),
        "documents[0].children[0].lookups[0].foreign_key[0]",
        "public.order_items.qty (integer) cannot reference public.products.id (character varying(20)): their "
        "encoded keys would never match (key families integer and text)"),
    "a table outside the sink's topics": (
        one_change("table: public.orders", "table: shop.orders   #!"),
        "documents[0].table", "shop.orders: its topic cdc.shop.orders is not among the sink's topics (cdc.public.*)"),
    "a table without a shape": (
        one_change("table: public.order_items", "table: public.order_lines   #!"),
        "documents[0].children[0].table", "public.order_lines: no shape of it has been captured yet"),
    "a lookup of a table without a key": (
        one_change("- {table: public.customers, as: customer, foreign_key: [customer_id], exclude: [password_hash]}",
                   "- {table: public.notes, as: customer, foreign_key: [customer_id]}   #!"),
        "documents[0].lookups[0].table", "public.notes has no key columns in its captured shape"),
    "a leaf child of a table without a key (its rows could never be updated or deleted)": (
        one_change("      - table: public.order_items\n",
                   "      - {table: public.notes, as: notes, foreign_key: [order_ref]}   #!\n"
                   "      - table: public.order_items\n"),
        "documents[0].children[0].table", "public.notes has no key columns in its captured shape; every table of "
        "a document needs one"),
    "an as that is a column of the node": (
        one_change("as: items", "as: note   #!"),
        "documents[0].children[0].as", "'note' is also a field of public.orders"),
    "a rename onto a column that stays": (
        one_change("rename: {placed_at: created}", "rename: {placed_at: note}   #!"),
        "documents[0].rename.placed_at", "two columns of public.orders become field 'note'"),
}


@pytest.mark.parametrize("case", CASES)
def test_each_problem_is_reported_at_its_line(shop, tmp_path, capsys, case):
    body, path, message = CASES[case]
    code, out = validate(tmp_path, capsys, body)
    assert code == 2
    found = [problem for problem in out if message in problem]
    assert len(found) == 1, out
    assert found[0].startswith(f"{tmp_path / 'shop.yaml'}:{marked_line(body)}: sinks[0].{path}: {message}"), out


def test_tables_of_two_sources_are_refused_naming_each(shop, tmp_path, capsys):
    other = ShapedTopics(shop, "cdc", source="shop_my")
    other.publish(TableId("shop", "public", "products"), 500, SHOP["public.products"], [])
    code, out = validate(tmp_path, capsys, GOOD)
    assert code == 2
    assert out == [f"{tmp_path / 'shop.yaml'}:6: sinks[0].documents: versions compare only within one source: "
                   "shop_pg (public.orders, public.customers, public.order_items, public.categories, "
                   "public.item_discounts), shop_my (public.products)"]


def test_the_newest_shape_is_the_highest_version_not_the_last_read(shop, tmp_path, capsys):
    topics = ShapedTopics(shop, "cdc", source="shop_pg")
    topics.publish(table("public.orders"), 900, SHOP["public.orders"] + [col("channel", "text")], [])
    topics.publish(table("public.orders"), 800, SHOP["public.orders"], [])  # read after, yet older
    code, out = validate(tmp_path, capsys, GOOD.replace("exclude: [internal_note]", "include: [id, channel]"))
    assert code == 0, out


def test_offline_skips_the_log_and_says_so(tmp_path, capsys):
    code, out = validate(tmp_path, capsys, GOOD, "--offline")
    assert code == 0
    assert out == [f"{tmp_path / 'shop.yaml'}: ok (0 sources, 1 sinks); sinks shop_search: not checked against "
                   "the captured shapes (--offline)"]
    assert not log_file(tmp_path / "log").exists()


def test_without_a_log_every_table_lacks_its_shape_and_no_log_is_made(tmp_path, capsys):
    code, out = validate(tmp_path, capsys, GOOD)
    assert code == 2 and len(out) == 6 and all("no shape of it has been captured yet" in line for line in out)
    assert not (tmp_path / "log").exists()


def test_a_log_that_cannot_be_read_is_one_problem_naming_offline(tmp_path, capsys):
    file = tmp_path / "shop.yaml"
    file.write_text(HEAD.replace("log: {embedded: {path: ./log}}",
                                 "log: {kafka: {bootstrap_servers: '127.0.0.1:1', request_timeout: 1}}")
                    + textwrap.indent(GOOD, "    "))
    assert main(["validate", str(file)]) == 2
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith(f"{file}:1: log: cannot read the captured shapes from the log (")
    assert out[0].endswith("validate with --offline to check the file without them")


@pytest.mark.parametrize(("a", "b", "same"), [
    ("integer", "bigint", True), ("int(11) unsigned", "smallint", True), ("integer", "text", False),
    ("numeric(10,2)", "decimal(12,2)", True), ("numeric(10,2)", "numeric(10,3)", True),  # keys normalised
    ("numeric", "numeric(10,0)", True), ("integer", "numeric(10,0)", False),
    ("character varying(20)", "text", True), ("varchar(255)", "char(3)", True), ("enum('a','b')", "text", True),
    ("uuid", "char(36)", False), ("date", "datetime", False),
    ("timestamp(3) without time zone", "datetime(6)", True),
    ("timestamp with time zone", "timestamp", True),  # MySQL's timestamp is an instant
    ("timestamp without time zone", "timestamp with time zone", False),
    ("bytea", "varbinary(16)", True), ("integer[]", "integer", False), ("inet", "inet", True),
])
def test_key_families(a, b, same):
    assert (key_family(a) == key_family(b)) is same, (key_family(a), key_family(b))
