"""``cdc validate`` of ``documents:`` against shapes that the real PostgreSQL and MariaDB sources
captured into an embedded log: their type names as the servers print them, keys, and the
problems a declaration can have only against them (an unknown column, a foreign key's arity,
an integer referencing text, a table outside the sink's topics, tables of two sources), each at
its file:line; ``--offline`` skips the log. One test reads the shapes from Kafka instead."""

from __future__ import annotations

import textwrap

import pytest

from cdc.cli import main
from cdc.log.embedded import EmbeddedLog
from cdc.runtime.schemas import SchemaBook
from tests.conftest import _fresh_database, fresh_mysql_database
from tests.integration.pg_capture import capturing, execute, pg_config, wait_until
from tests.integration.test_mysql_source import execute as my_execute
from tests.integration.test_mysql_source import mysql_config

pytestmark = [pytest.mark.postgres, pytest.mark.mysql]

PG_TABLES = (
    "CREATE TABLE customers (id integer PRIMARY KEY, name text)",
    "CREATE TABLE coupons (code text PRIMARY KEY, percent numeric(5,2))",
    "CREATE TABLE orders (id integer PRIMARY KEY, customer_id integer, coupon_id integer, product_code "
    "varchar(20), note text)",
    "CREATE TABLE order_items (order_id integer, line_no integer, qty integer, PRIMARY KEY (order_id, line_no))",
    "CREATE TABLE item_discounts (id integer PRIMARY KEY, order_id integer, line_no integer)",
    "INSERT INTO customers VALUES (1, 'ada')",
)
MY_TABLES = (
    "CREATE TABLE categories (id int PRIMARY KEY, name varchar(50))",
    "CREATE TABLE products (code varchar(20) PRIMARY KEY, category_id int, name varchar(100))",
    "INSERT INTO categories VALUES (1, 'tools')",
)


@pytest.fixture(scope="module")
def pg_shop(pg_admin_dsn):
    yield from _fresh_database(pg_admin_dsn)


@pytest.fixture(scope="module")
def my_shop(mysql_url):
    yield from fresh_mysql_database(mysql_url)


@pytest.fixture(scope="module")
def captured(pg_shop, my_shop, mysql_url, tmp_path_factory):
    """A directory whose embedded log ``./log`` holds the shapes both sources captured."""
    home = tmp_path_factory.mktemp("documents")
    execute(pg_shop, *PG_TABLES)
    my_execute(mysql_url, my_shop, *MY_TABLES)
    log = EmbeddedLog(home / "log", fsync=False)
    wanted = {f"cdc.public.{t}" for t in ("customers", "coupons", "orders", "order_items", "item_discounts")} \
        | {f"cdc.{my_shop}.{t}" for t in ("categories", "products")}
    book = SchemaBook(log, "cdc")
    try:
        with capturing(pg_config(pg_shop, home, name="shop_pg"), log, "cdc"), \
                capturing(mysql_config(mysql_url, my_shop, name="shop_my"), log, "cdc"):
            wait_until(lambda: wanted <= set(book.newest_shapes()), 60, "both sources' shapes")
    finally:
        log.close()
    return home


HEAD = """\
log: {embedded: {path: ./log}}
sinks:
  - name: shop_search
    type: opensearch
    topics: ["cdc.public.*"]
"""
ORDERS = """\
documents:
  - name: orders
    table: public.orders
    lookups:
      - {table: public.customers, as: customer, foreign_key: [customer_id]}
    children:
      - table: public.order_items
        as: items
        foreign_key: [order_id]
        order_by: [-line_no]
        children:
          - {table: public.item_discounts, as: discounts, foreign_key: [order_id, line_no]}
"""


def validate(home, capsys, head: str, body: str, *flags: str) -> tuple[int, list[str], str]:
    text = head + textwrap.indent(body, "    ")
    (home / "shop.yaml").write_text(text)
    code = main(["validate", str(home / "shop.yaml"), *flags])
    return code, capsys.readouterr().out.splitlines(), text


def line_of(text: str, needle: str) -> int:
    return next(number for number, line in enumerate(text.splitlines(), 1) if needle in line)


def test_declarations_that_fit_both_servers_shapes_pass(captured, my_shop, capsys):
    mariadb = f"""\
  - name: catalog
    type: redis
    url: redis://127.0.0.1:6379
    format: json
    topics: ["cdc.{my_shop}.*"]
    documents:
      - name: products
        table: {my_shop}.products
        lookups: [{{table: {my_shop}.categories, as: category, foreign_key: [category_id]}}]
"""
    (captured / "both.yaml").write_text(HEAD + textwrap.indent(ORDERS, "    ") + mariadb)
    code = main(["validate", str(captured / "both.yaml")])
    out = capsys.readouterr().out.strip()
    assert code == 0, out
    assert out.endswith("sinks shop_search, catalog: checked against the captured shapes")


def test_an_unknown_column(captured, capsys):
    body = ORDERS.replace("order_by: [-line_no]", "order_by: [-line]")
    code, out, text = validate(captured, capsys, HEAD, body)
    assert code == 2
    assert out == [f"{captured / 'shop.yaml'}:{line_of(text, 'order_by')}: sinks[0].documents[0].children[0]."
                   "order_by[0]: public.order_items has no column 'line'; did you mean 'line_no'?"]


def test_a_foreign_key_of_another_arity_than_the_key(captured, capsys):
    body = ORDERS.replace("foreign_key: [order_id, line_no]", "foreign_key: [order_id]")
    code, out, text = validate(captured, capsys, HEAD, body)
    assert code == 2
    assert out == [f"{captured / 'shop.yaml'}:{line_of(text, 'item_discounts')}: sinks[0].documents[0]."
                   "children[0].children[0].foreign_key: 1 column(s) of public.item_discounts cannot reference "
                   "the key of public.order_items, which has 2 (order_id, line_no), matched in order"]


def test_an_integer_referencing_text(captured, capsys):
    body = ORDERS.replace("    lookups:\n", "    lookups:\n      - {table: public.coupons, as: coupon, "
                                             "foreign_key: [coupon_id]}\n")
    code, out, text = validate(captured, capsys, HEAD, body)
    assert code == 2
    assert out == [f"{captured / 'shop.yaml'}:{line_of(text, 'coupons')}: sinks[0].documents[0].lookups[0]."
                   "foreign_key[0]: public.orders.coupon_id (integer) cannot reference public.coupons.code "
                   "(text): their encoded keys would never match (key families integer and text)"]


def test_a_table_outside_the_sinks_topics(captured, capsys):
    head = HEAD.replace('["cdc.public.*"]', '["cdc.public.orders", "cdc.public.customers", "cdc.public.order_items"]')
    code, out, text = validate(captured, capsys, head, ORDERS)
    assert code == 2
    assert out == [f"{captured / 'shop.yaml'}:{line_of(text, 'item_discounts')}: sinks[0].documents[0]."
                   "children[0].children[0].table: public.item_discounts: its topic cdc.public.item_discounts is "
                   "not among the sink's topics (cdc.public.orders, cdc.public.customers, cdc.public.order_items)"]


def test_postgresql_and_mariadb_tables_in_one_document(captured, my_shop, capsys):
    head = HEAD.replace('["cdc.public.*"]', f'["cdc.public.*", "cdc.{my_shop}.*"]')
    body = ORDERS.replace("    lookups:\n", f"    lookups:\n      - {{table: {my_shop}.products, as: product, "
                                             "foreign_key: [product_code]}\n")
    code, out, text = validate(captured, capsys, head, body)
    assert code == 2
    assert out == [f"{captured / 'shop.yaml'}:{line_of(text, 'documents:')}: sinks[0].documents: versions compare "
                   "only within one source: shop_pg (public.orders, public.customers, public.order_items, "
                   f"public.item_discounts), shop_my ({my_shop}.products)"]
    code, out, _ = validate(captured, capsys, head, body, "--offline")
    assert code == 0
    assert out[0].endswith("sinks shop_search: not checked against the captured shapes (--offline)")


@pytest.mark.kafka
def test_the_shapes_are_read_from_kafka_too(captured, pg_shop, kafka_bootstrap, kafka_topic, tmp_path, capsys):
    from cdc.log.kafka import KafkaLog

    log = KafkaLog(kafka_bootstrap)
    try:
        book = SchemaBook(log, kafka_topic)
        with capturing(pg_config(pg_shop, tmp_path, name="shop_pg_kafka"), log, kafka_topic):
            wait_until(lambda: f"{kafka_topic}.public.item_discounts" in book.newest_shapes(), 60, "the shapes")
    finally:
        log.close()
    head = HEAD.replace("log: {embedded: {path: ./log}}",
                        f"log: {{kafka: {{bootstrap_servers: '{kafka_bootstrap}', topic_prefix: {kafka_topic}}}}}")
    head = head.replace("cdc.public.*", f"{kafka_topic}.public.*")
    code, out, _ = validate(tmp_path, capsys, head, ORDERS)
    assert code == 0, out
    code, out, text = validate(tmp_path, capsys, head, ORDERS.replace("[customer_id]", "[customer]"))
    assert code == 2
    assert out == [f"{tmp_path / 'shop.yaml'}:{line_of(text, 'customer')}: sinks[0].documents[0].lookups[0]."
                   "foreign_key[0]: public.orders has no column 'customer'; did you mean 'customer_id'?"]
