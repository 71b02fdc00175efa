"""``documents:`` on OpenSearch and Redis sinks: what is refused without the tables, each problem at
its file:line (the line marked ``#!`` in each case), and a declaration that passes."""

from __future__ import annotations

import textwrap

import pytest

from cdc.api import SharedSink
from cdc.config import parse_config
from cdc.errors import ConfigError
from cdc.plugins import sink_class
from sinks.documents.declaration import Child, Lookup, walk
from sinks.opensearch.config import OpenSearchSinkConfig
from sinks.redis.config import RedisSinkConfig

OPENSEARCH = """\
sinks:
  - name: shop_search
    type: opensearch
    topics: ["cdc.public.*"]
"""
REDIS = """\
sinks:
  - name: shop_cache
    type: redis
    url: redis://127.0.0.1:6379
    topics: ["cdc.public.*"]
"""


def problems_of(head: str, body: str) -> list[tuple[int | None, str, str]]:
    text = head + textwrap.indent(textwrap.dedent(body), "    ")
    with pytest.raises(ConfigError) as caught:
        parse_config(text, file="shop.yaml")
    return [(p.line, p.path, p.message) for p in caught.value.problems]


def marked_line(head: str, body: str) -> int:
    lines = (head + textwrap.indent(textwrap.dedent(body), "    ")).splitlines()
    return next(number for number, line in enumerate(lines, 1) if "#!" in line)


CASES = {
    "two documents of one name": (OPENSEARCH, """\
        documents:
          - {name: orders, table: public.orders}
          - name: orders   #!
            table: public.orders
        """, "documents[1].name", "document name 'orders' is used twice"),
    "a name that cannot be an alias": (OPENSEARCH, """\
        documents:
          - name: Orders   #!
            table: public.orders
        """, "documents[0].name", "lowercase letters, digits"),
    "a glob for a table": (OPENSEARCH, """\
        documents:
          - name: orders
            table: public.*   #!
        """, "documents[0].table", "name one table as schema.table"),
    "two siblings under one as": (OPENSEARCH, """\
        documents:
          - name: orders
            table: public.orders
            lookups:
              - {table: public.customers, as: customer, foreign_key: [customer_id]}
            children:
              - {table: public.order_items, as: customer, foreign_key: [order_id]}   #!
        """, "documents[0].children[0].as", "'customer' names two nodes under public.orders (lookups[0] too)"),
    "an as that is an included field": (OPENSEARCH, """\
        documents:
          - name: orders
            table: public.orders
            include: [id, customer]
            lookups:
              - table: public.customers
                as: customer   #!
                foreign_key: [customer_id]
        """, "documents[0].lookups[0].as", "'customer' is also a field of public.orders"),
    "an as that a rename makes": (OPENSEARCH, """\
        documents:
          - name: orders
            table: public.orders
            rename: {customer_id: customer}
            lookups:
              - {table: public.customers, as: customer, foreign_key: [customer_id]}   #!
        """, "documents[0].lookups[0].as", "'customer' is also a field of public.orders (after rename)"),
    "include and exclude overlap": (OPENSEARCH, """\
        documents:
          - name: orders
            table: public.orders
            include: [id, note]
            exclude: [note]   #!
        """, "documents[0].exclude", "columns both included and excluded: ['note']"),
    "an empty foreign key of a child": (OPENSEARCH, """\
        documents:
          - name: orders
            table: public.orders
            children:
              - table: public.order_items
                as: items
                foreign_key: []   #!
        """, "documents[0].children[0].foreign_key", "empty: name the columns of this table"),
    "an empty foreign key of a lookup": (OPENSEARCH, """\
        documents:
          - name: orders
            table: public.orders
            lookups:
              - {table: public.customers, as: customer, foreign_key: []}   #!
        """, "documents[0].lookups[0].foreign_key", "empty: name the columns of the enclosing node's table"),
    "a missing foreign key": (OPENSEARCH, """\
        documents:
          - name: orders
            table: public.orders
            children:
              - table: public.order_items   #!
                as: items
        """, "documents[0].children[0].foreign_key", "required field is missing"),
    "a column named twice in a foreign key": (OPENSEARCH, """\
        documents:
          - name: orders
            table: public.orders
            children:
              - table: public.item_discounts
                as: discounts
                foreign_key:
                  - order_id
                  - order_id   #!
        """, "documents[0].children[0].foreign_key[1]", "column 'order_id' is named twice"),
    "order_by on the root": (OPENSEARCH, """\
        documents:
          - name: orders
            table: public.orders
            order_by: [id]   #!
        """, "documents[0].order_by", "only a child (an array) has an order; public.orders here is the root"),
    "order_by on a lookup": (OPENSEARCH, """\
        documents:
          - name: orders
            table: public.orders
            lookups:
              - table: public.customers
                as: customer
                foreign_key: [customer_id]
                order_by: [name]   #!
        """, "documents[0].lookups[0].order_by", "public.customers here is a lookup (one object)"),
    "nested on a lookup": (OPENSEARCH, """\
        documents:
          - name: orders
            table: public.orders
            lookups:
              - table: public.customers
                as: customer
                foreign_key: [customer_id]
                nested: true   #!
        """, "documents[0].lookups[0].nested", "nested maps a child's array"),
    "two columns renamed to one field": (OPENSEARCH, """\
        documents:
          - name: orders
            table: public.orders
            rename:
              placed_at: created
              created_at: created   #!
        """, "documents[0].rename.created_at", "'placed_at' and 'created_at' are both renamed to 'created'"),
    "a field of the sink's own": (OPENSEARCH, """\
        documents:
          - name: orders
            table: public.orders
            rename:
              version: __cdc_version   #!
        """, "documents[0].rename.version", "fields starting __cdc_ are the sink's own"),
    "per-table options beside documents": (OPENSEARCH, """\
        tables:   #!
          public.orders: {exclude: [note]}
        documents:
          - {name: orders, table: public.orders}
        """, "tables", "a sink with documents keeps only documents"),
    "an index name beside documents": (OPENSEARCH, """\
        index_name: "{table}"   #!
        documents:
          - {name: orders, table: public.orders}
        """, "index_name", "a document's alias is its name"),
    "nested on Redis": (REDIS, """\
        format: json
        documents:
          - name: orders
            table: public.orders
            children:
              - table: public.order_items
                as: items
                foreign_key: [order_id]
                nested: true   #!
        """, "documents[0].children[0].nested", "nested is an OpenSearch mapping; a redis sink has none"),
    "mappings on Redis": (REDIS, """\
        format: redisjson
        documents:
          - name: orders
            table: public.orders
            mappings: {note: {type: text}}   #!
        """, "documents[0].mappings", "mappings are OpenSearch's"),
    "documents in Redis hashes": (REDIS, """\
        format: hash   #!
        documents:
          - {name: orders, table: public.orders}
        """, "format", "a document is JSON: format json or redisjson, not hash"),
    "row options on a Redis sink of documents": (REDIS, """\
        format: json
        exclude: [note]   #!
        documents:
          - {name: orders, table: public.orders}
        """, "exclude", "give exclude on each document's nodes"),
}


@pytest.mark.parametrize("case", CASES)
def test_each_problem_is_reported_at_its_line(case):
    head, body, path, message = CASES[case]
    problems = problems_of(head, body)
    prefix = "sinks[0]."
    assert [(line, p) for line, p, m in problems if message in m] == [(marked_line(head, body), prefix + path)], \
        problems


def test_an_as_may_take_the_name_a_rename_gives_a_column_left_out():
    body = """\
        documents:
          - name: orders
            table: public.orders
            exclude: [customer_id]
            rename: {customer_id: customer}
            lookups:
              - {table: public.customers, as: customer, foreign_key: [customer_id]}
        """
    config = parse_config(OPENSEARCH + textwrap.indent(textwrap.dedent(body), "    ")).sinks[0]
    assert isinstance(config, OpenSearchSinkConfig) and config.documents is not None


def test_every_problem_of_a_declaration_is_reported_at_once():
    problems = problems_of(OPENSEARCH, """\
        documents:
          - name: orders
            table: public.orders
            order_by: [id]
            lookups:
              - {table: public.customers, as: customer, foreign_key: []}
          - {name: orders, table: public.orders}
        """)
    assert [path for _, path, _ in problems] == ["sinks[0].documents[0].order_by",
                                                 "sinks[0].documents[0].lookups[0].foreign_key",
                                                 "sinks[0].documents[1].name"]


DECLARATION = """\
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
        exclude: [order_id]
        nested: true
        lookups:
          - {table: public.products, as: product, foreign_key: [product_id], include: [id, sku, name],
             lookups: [{table: public.categories, as: category, foreign_key: [category_id]}]}
        children:
          - {table: public.item_discounts, as: discounts, foreign_key: [order_id, line_no]}
"""


def test_the_design_example_passes_on_both_sinks(tmp_path):
    search = parse_config(OPENSEARCH + textwrap.indent("state_dir: ./state\n" + DECLARATION, "    "),
                          base_dir=tmp_path).sinks[0]
    cache = parse_config(REDIS + textwrap.indent("format: redisjson\n" + DECLARATION.replace("nested: true", ""),
                                                 "    "), base_dir=tmp_path).sinks[0]
    assert isinstance(search, OpenSearchSinkConfig) and isinstance(cache, RedisSinkConfig)
    assert search.state_dir == tmp_path / "state" and search.needs_shapes() and cache.needs_shapes()
    places = list(walk(search.documents or []))
    assert [(p.kind, p.node.table) for p in places] == [
        ("root", "public.orders"), ("lookup", "public.customers"), ("child", "public.order_items"),
        ("lookup", "public.products"), ("lookup", "public.categories"), ("child", "public.item_discounts")]
    items = places[2].node
    assert isinstance(items, Child) and items.as_ == "items" and items.order_by == ["-line_no"] and items.nested
    assert isinstance(places[4].node, Lookup) and places[4].parent is places[3]
    assert places[5].path == ("documents", 0, "children", 0, "children", 0)


def test_a_sink_of_documents_is_its_plugins_document_sink():
    from cdc.api import DescribedSink, PipelinedSink, ReadableSink, RebuildableSink
    from cdc.plugins import sink_class, sink_plugin
    from sinks.opensearch.doc_sink import OpenSearchDocumentSink
    from sinks.redis.doc_sink import RedisDocumentSink

    documents = textwrap.indent("documents: [{name: orders, table: public.orders}]\n", "    ")
    search = parse_config(OPENSEARCH + documents).sinks[0]
    kind = sink_class(search)
    assert kind is OpenSearchDocumentSink and issubclass(kind, RebuildableSink) and issubclass(kind, DescribedSink)
    # Not cdc verify's ReadableSink: it reads tables back. Writes in flight, as the table sink.
    assert ReadableSink not in kind.__mro__ and PipelinedSink in kind.__mro__
    assert sink_class(parse_config(OPENSEARCH).sinks[0]) is sink_plugin("opensearch")
    cache = parse_config(REDIS + "    format: json\n" + documents).sinks[0]
    assert sink_class(cache) is RedisDocumentSink and ReadableSink not in RedisDocumentSink.__mro__
    with pytest.raises(ConfigError, match="documents are declared, so the sink's document class keeps them"):
        sink_plugin(cache.type)(cache)  # the table sink, built by hand


def test_a_sink_without_documents_reads_no_shapes():
    config = parse_config(OPENSEARCH).sinks[0]
    assert isinstance(config, OpenSearchSinkConfig) and config.documents is None and not config.needs_shapes()


@pytest.mark.parametrize("head", [OPENSEARCH, REDIS + "    format: json\n"], ids=["opensearch", "redis"])
def test_a_sink_of_documents_in_a_consumer_group_shares_its_documents_among_members(head):
    """Members of a document sink each read everything and write a share (sinks/documents/shared.py):
    accepted on Kafka with a member name and a share count; a name that would not fit a state
    file or a group id is refused, as a group on the embedded log is."""
    kafka = "log:\n  kafka: {bootstrap_servers: '127.0.0.1:9092'}\n"
    body = "    scale_out: group\n    member: host-1\n    shares: 8\n    documents: [{name: orders, table: public.orders}]\n"
    config = parse_config(kafka + head + body).sinks[0]
    kind = sink_class(config)
    assert issubclass(kind, SharedSink) and (config.member, config.shares) == ("host-1", 8)
    assert kind.reading_group(config) == f"{config.name}.member.host-1"
    problems = problems_of(kafka + head, """\
        scale_out: group
        member: "a/b"
        documents: [{name: orders, table: public.orders}]
        """)
    assert [path for _, path, _ in problems] == ["sinks[0].member"]
    problems = problems_of(head, """\
        scale_out: group
        documents: [{name: orders, table: public.orders}]
        """)
    assert any("Kafka consumer groups" in message for _, _, message in problems), problems


