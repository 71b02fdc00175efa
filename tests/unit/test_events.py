import orjson
import pytest

from cdc.events import INT64_MAX, ChangeEvent, Op, SnapshotMarker, TableId, TransactionInfo
from cdc.serde import TRUNCATE_KEY, EnvelopeEncoder, decode

ORDERS = TableId("shop", "public", "orders")


def _event(op=Op.CREATE, **kw):
    base = dict(op=op, table=ORDERS, key={"id": 42}, before=None,
                after={"id": 42, "total": "19.99", "at": "2024-01-02T03:04:05.000006Z"},
                version=23456789, ts_ms=1732200000000,
                source_fields={"txId": 5123, "lsn": 23456789})
    base.update(kw)
    return ChangeEvent(**base).check()


def test_events_are_immutable_and_slotted():
    event = _event()
    with pytest.raises(AttributeError):
        event.op = Op.DELETE
    assert not hasattr(event, "__dict__")


def test_invalid_events_are_refused():
    with pytest.raises(ValueError, match="int64"):
        _event(version=INT64_MAX + 1)
    with pytest.raises(ValueError, match="no key"):
        _event(key={})
    with pytest.raises(ValueError, match="no 'after'"):
        _event(op=Op.UPDATE, after=None)
    with pytest.raises(ValueError, match="carries an 'after'"):
        _event(op=Op.DELETE)
    with pytest.raises(ValueError, match="truncate"):
        _event(op=Op.TRUNCATE, after=None)


def test_envelope_is_debezium_shaped():
    tx = TransactionInfo("5123", 3, 1)
    [record] = EnvelopeEncoder("postgresql", "shop_pg", "shop").encode(
        [_event(transaction=tx, snapshot=SnapshotMarker.FALSE)], now_ms=1732200000123)
    assert record.topic == "shop.public.orders"
    assert decode(record.key) == {"id": 42}
    value = decode(record.value)
    assert value == {
        "before": None,
        "after": {"id": 42, "total": "19.99", "at": "2024-01-02T03:04:05.000006Z"},
        "op": "c", "ts_ms": 1732200000123,
        "source": {"connector": "postgresql", "name": "shop_pg", "db": "shop", "schema": "public",
                   "table": "orders", "snapshot": "false", "ts_ms": 1732200000000, "txId": 5123,
                   "lsn": 23456789, "version": 23456789},
        "transaction": {"id": "5123", "total_order": 3, "data_collection_order": 1},
    }
    # Key columns keep their order; the source block's order is stable (readers diff it).
    assert list(value["source"])[:6] == ["connector", "name", "db", "schema", "table", "snapshot"]


def test_delete_is_followed_by_a_tombstone():
    event = _event(op=Op.DELETE, before={"id": 42, "total": "1.00"}, after=None)
    records = EnvelopeEncoder("postgresql", "s", "p").encode([event], now_ms=1)
    assert [(r.key, r.value is None) for r in records] == [(b'{"id":42}', False), (b'{"id":42}', True)]
    assert decode(records[0].value)["op"] == "d"


def test_truncate_goes_to_every_partition_keyed_empty():
    event = ChangeEvent(Op.TRUNCATE, ORDERS, None, None, None, 5, 1)
    [record] = EnvelopeEncoder("postgresql", "s", "p").encode([event], now_ms=1)
    assert record.key == TRUNCATE_KEY and record.to_all_partitions
    assert decode(record.value)["op"] == "t"


def test_mysql_topics_use_the_database_and_omit_schema():
    table = TableId("shop", None, "orders")
    [record] = EnvelopeEncoder("mysql", "shop_my", "shop").encode(
        [_event(table=table, source_fields={"file": "binlog.000003", "pos": 1234, "row": 0})], now_ms=1)
    assert record.topic == "shop.shop.orders"
    source = decode(record.value)["source"]
    assert "schema" not in source and source["db"] == "shop" and source["file"] == "binlog.000003"


def test_composite_keys_keep_column_order():
    event = _event(key={"tenant": "a", "id": 1}, after={"tenant": "a", "id": 1})
    [record] = EnvelopeEncoder("postgresql", "s", "p").encode([event], now_ms=1)
    assert record.key == orjson.dumps({"tenant": "a", "id": 1}) == b'{"tenant":"a","id":1}'


@pytest.mark.parametrize("event", [
    _event(),
    _event(op=Op.UPDATE, before={"id": 42, "total": "1.00"}, transaction=TransactionInfo('x"y', 2, 1)),
    _event(op=Op.DELETE, before={"id": 42}, after=None, snapshot=SnapshotMarker.FALSE, source_fields=None),
    _event(op=Op.READ, snapshot=SnapshotMarker.LAST, after={"id": 42, "f": 1.5}),
    ChangeEvent(Op.TRUNCATE, TableId("shop", None, "orders"), None, None, None, 5, 1),
])
def test_encoded_bytes_equal_the_envelope_dict(event):
    encoder = EnvelopeEncoder("postgresql", "shop_pg", "shop")
    record = encoder.encode([event], now_ms=99)[0]
    assert decode(record.value) == encoder.envelope(event, 99)
    # Twice through the cached head gives the same bytes.
    assert encoder.encode([event], now_ms=99)[0].value == record.value
