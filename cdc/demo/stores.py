"""Read each table as its source and each derived store hold it, and compare them.

The stores are read through their sinks' own API (``cdc.api.ReadableSink.read_rows``: the rows as
the sink wrote them), so the demo knows nothing of how a store lays them out.

Every reader returns ``{table: {key: {column: value}}}`` over the columns the demo compares
(``COLUMNS``), each value in a canonical text form (``canonical``), so that a value is equal
wherever it lives: PostgreSQL's numeric ``12.30``, the event's ``"12.30"``, SQLite's ``12.3``
and Redis's hash field ``"12.30"`` all read ``12.3``; an integer column that became text in a
schema change reads ``1`` before and ``"1"`` after in the topics, and ``1`` either way here.
A NULL is ``None`` (Redis hashes have no field for it).

``differences`` says, per table, which keys are missing, extra, or different: empty when the
store equals its source.
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal, InvalidOperation
from typing import Any

import orjson

# table (as the demo names it) -> (where it lives in its source, key column, compared columns)
COLUMNS: dict[str, tuple[str, ...]] = {
    "customers": ("id", "name", "email", "tier"),
    "orders": ("id", "customer_id", "total", "status"),
    "products": ("id", "sku", "name", "stock", "price"),
}
PG_TABLES = ("customers", "orders")
MARIA_TABLES = ("products",)

Rows = dict[str, dict[str | None, dict[str, str | None]]]


def canonical(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode()
    text = str(value)
    try:
        number = Decimal(text)
    except InvalidOperation:
        return text
    if not number.is_finite():
        return text
    return format(number.normalize(), "f")


def _row(columns: Iterable[str], values: Iterable[Any]) -> dict[str, str | None]:
    return {c: canonical(v) for c, v in zip(columns, values)}


def _by_key(table: str, rows: Iterable[dict]) -> dict[str | None, dict[str, str | None]]:
    columns = COLUMNS[table]
    return {canonical(row.get("id")): {c: canonical(row.get(c)) for c in columns} for row in rows}


# -- the sources -------------------------------------------------------------------------------

def sql_rows(cursor, tables: Iterable[str]) -> Rows:
    """Any DB-API cursor (psycopg2, pymysql, sqlite3): the tables as they are now."""
    out: Rows = {}
    for table in tables:
        columns = COLUMNS[table]
        cursor.execute(f"SELECT {', '.join(columns)} FROM {table}")
        out[table] = {canonical(row[0]): _row(columns, row) for row in cursor.fetchall()}
    return out


# -- the stores --------------------------------------------------------------------------------

def sink_rows(sink, topics: dict[str, str]) -> Rows:
    """``topics``: table -> its topic. ``sink``: a started ``ReadableSink``."""
    return {table: _by_key(table, (stored.row for stored in sink.read_rows(topic))) for table, topic in topics.items()}


# -- the joined documents ----------------------------------------------------------------------

ORDER_FIELDS = ("customer_id", "total", "status")
CUSTOMER_FIELDS = ("id", "name", "email")


def _document(order: dict, customer: dict | None, items: Any) -> dict[str, str | None]:
    out = {c: canonical(order.get(c)) for c in ORDER_FIELDS}
    out["customer"] = None if customer is None else "|".join(str(canonical(customer.get(c))) for c in CUSTOMER_FIELDS)
    out["items"] = orjson.dumps(items, option=orjson.OPT_SORT_KEYS).decode()
    return out


def joined_orders(cursor) -> Rows:
    """PostgreSQL's orders joined with their customers (what each document must hold)."""
    cursor.execute("SELECT o.id, o.customer_id, o.total, o.status, o.items, c.id, c.name, c.email FROM orders o "
                   "LEFT JOIN customers c ON c.id = o.customer_id")
    out = {}
    for order_id, customer_id, total, status, items, *customer in cursor.fetchall():
        order = {"customer_id": customer_id, "total": total, "status": status}
        out[canonical(order_id)] = _document(order, None if customer[0] is None else
                                             dict(zip(CUSTOMER_FIELDS, customer)), items)
    return {"orders": out}


def document_rows(client, alias: str) -> Rows:
    """The documents readers see through ``alias`` (none while it does not exist yet)."""
    if not client.indices.exists_alias(name=alias):
        return {"orders": {}}
    client.indices.refresh(index=alias)
    hits = client.search(index=alias, body={"size": 10_000, "query": {"match_all": {}}})["hits"]["hits"]
    return {"orders": {canonical(hit["_id"]): _document(hit["_source"], hit["_source"].get("customer"),
                                                         hit["_source"].get("items")) for hit in hits}}


# -- the comparison ----------------------------------------------------------------------------

def differences(source: Rows, store: Rows) -> dict[str, str]:
    """table -> what differs (only tables that differ); a few keys of each kind are named."""
    out = {}
    for table, expected in source.items():
        held = store.get(table, {})
        missing = sorted(set(expected) - set(held), key=str)
        extra = sorted(set(held) - set(expected), key=str)
        changed = sorted((k for k in set(expected) & set(held) if expected[k] != held[k]), key=str)
        if missing or extra or changed:
            parts = [f"{what} {len(keys)} (e.g. {', '.join(map(str, keys[:3]))})"
                     for what, keys in (("missing", missing), ("extra", extra), ("different", changed)) if keys]
            if changed:
                k = changed[0]
                parts.append(f"key {k}: source {expected[k]} != store {held[k]}")
            out[table] = "; ".join(parts)
    return out
