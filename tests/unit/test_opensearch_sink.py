"""The OpenSearch sink's pure logic: names and _ids, mappings, the batch reduction, bulk
classification, config checks. The behaviour against a real node is in
tests/integration/test_opensearch_sink.py."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from cdc.errors import ConfigError, RetriableError
from cdc.events import Op
from cdc.sink_events import SinkEvent
from sinks.opensearch.bulk import BulkWriter, Item
from sinks.opensearch.config import OpenSearchSinkConfig
from sinks.opensearch.documents import Delete, TableLayout, Tombstone, Upsert, reduce
from sinks.opensearch.mapping import compare, field_mapping
from sinks.opensearch.naming import alias_name, document_id, split_generation


def test_document_ids_single_composite_and_long_keys():
    assert document_id({"id": 42}) == "42"
    assert document_id({"code": "ab-CD"}) == "ab-CD"
    assert document_id({"tenant": 7, "region": "eu"}) == '[7,"eu"]'
    assert document_id({"region": "eu", "tenant": 7}) == '["eu",7]'  # the key's column order
    long_id = document_id({"k": "x" * 600})
    assert long_id.startswith("sha256:") and len(long_id) == 7 + 64
    assert document_id({"k": "x" * 600}) == long_id


def test_alias_names_from_the_template_lowercased_and_checked():
    source = {"schema": "Public", "table": "Orders", "db": "shop"}
    assert alias_name("{topic}", "App.Public.Orders", source) == "app.public.orders"
    assert alias_name("search-{db}-{table}", "app.public.orders", source) == "search-shop-orders"
    with pytest.raises(ConfigError, match="not a valid OpenSearch index name"):
        alias_name("_{table}", "app.public.orders", source)
    assert split_generation("app.public.orders__g12") == ("app.public.orders", 12)
    assert split_generation("app.public.orders") is None


@pytest.mark.parametrize("type_name, expected", [
    ("integer", {"type": "long"}),
    ("bigint unsigned", {"type": "unsigned_long"}),
    ("numeric(10,2)", {"type": "scaled_float", "scaling_factor": 100, "fields": {"exact": {"type": "keyword"}}}),
    ("numeric", {"type": "double", "fields": {"exact": {"type": "keyword"}}}),
    ("decimal(30,10)", {"type": "double", "fields": {"exact": {"type": "keyword"}}}),
    ("double precision", {"type": "double", "ignore_malformed": True}),
    ("boolean", {"type": "boolean"}),
    ("tinyint(1)", {"type": "long"}),   # MySQL's "boolean": its values are 0 and 1
    ("date", {"type": "date", "format": "strict_date"}),
    ("timestamp(3) with time zone", {"type": "date", "format": "strict_date_optional_time"}),
    ("datetime(6)", {"type": "date", "format": "strict_date_optional_time"}),
    ("character varying(20)", {"type": "text", "fields": {"keyword": {"type": "keyword", "ignore_above": 256}}}),
    ("uuid", {"type": "keyword"}),
    ("enum('a','b')", {"type": "keyword"}),
    ("jsonb", {"type": "object", "enabled": False}),
    ("integer[]", {"type": "long"}),
    ("bytea", {"type": "binary"}),
    ("geometry", {"type": "text", "fields": {"keyword": {"type": "keyword", "ignore_above": 256}}}),
])
def test_source_types_map_to_fields(type_name, expected):
    assert field_mapping(type_name) == expected


def test_compare_finds_new_fields_and_changes_it_cannot_follow():
    live = {"id": {"type": "long"}, "price": {"type": "scaled_float", "scaling_factor": 100.0},
            "name": {"type": "text", "fields": {"keyword": {"type": "keyword", "ignore_above": 256}}}}
    wanted = {"id": {"type": "long"}, "price": field_mapping("numeric(10,2)"), "name": field_mapping("varchar(9)"),
              "extra": {"type": "boolean"}}
    diff = compare(live, wanted)
    assert diff.added == {"extra": {"type": "boolean"}} and not diff.changed
    diff = compare(live, {"id": field_mapping("text")})
    assert list(diff.changed) == ["id"]


def _event(offset, key, op, version, after=None):
    return SinkEvent("p.public.t", 0, offset, key, op, None, after, version,
                     {"schema": "public", "table": "t"} if op else {})


def test_reduce_keeps_the_newest_action_per_document():
    events = [_event(0, {"id": 1}, Op.CREATE, 5, {"id": 1, "v": "a"}),
              _event(1, {"id": 1}, Op.UPDATE, 7, {"id": 1, "v": "b"}),
              _event(2, {"id": 1}, Op.UPDATE, 6, {"id": 1, "v": "older"}),   # a replayed older change
              _event(3, {"id": 2}, Op.CREATE, 8, {"id": 2}),
              _event(4, {"id": 2}, Op.DELETE, 9),
              _event(5, {"id": 2}, None, None),                             # the delete's tombstone
              _event(6, {"id": 3}, None, None)]                             # a tombstone alone
    actions = reduce(events)["p.public.t"].actions
    assert actions["1"] == Upsert("1", 7, {"id": 1, "v": "b"}, events[1])
    assert actions["2"] == Delete("2", 9, events[4])
    assert actions["3"] == Tombstone("3", None, events[6])
    # The actions are tuples: equal fields are not enough, the kind is what the sink acts on.
    assert [type(actions[k]) for k in "123"] == [Upsert, Delete, Tombstone]


def test_reduce_drops_what_a_truncate_clears():
    events = [_event(0, {"id": 1}, Op.CREATE, 5, {"id": 1}), _event(1, {}, Op.TRUNCATE, 6),
              _event(2, {"id": 2}, Op.CREATE, 7, {"id": 2})]
    topic = reduce(events)["p.public.t"]
    assert topic.truncate == 6 and list(topic.actions) == ["2"]


def test_layout_selects_and_renames_columns():
    config = OpenSearchSinkConfig(name="s", topics=["p.*"], tables={
        "public.users": {"exclude": ["password"], "rename": {"name": "full_name"}}})
    layout = TableLayout.for_table(config.tables, "public.users")
    assert layout.body({"id": 1, "name": "Ann", "password": "x"}) == {"id": 1, "full_name": "Ann"}
    assert TableLayout.for_table(config.tables, "public.other").body({"password": "x"}) == {"password": "x"}


def test_config_refuses_two_kinds_of_auth_and_unknown_placeholders():
    with pytest.raises(ValidationError, match="basic auth needs both"):
        OpenSearchSinkConfig(name="s", topics=["p.*"], username="u")
    with pytest.raises(ValidationError, match="unknown placeholder"):
        OpenSearchSinkConfig(name="s", topics=["p.*"], index_name="{prefix}.{table}")
    assert OpenSearchSinkConfig(name="s", topics=["p.*"]).verify_certs is True


class _FakeBulkClient:
    """Answers bulk requests: ``refusals`` maps _id -> the (status, error type) answers it gets,
    one per time it is sent; anything else is created."""

    def __init__(self, refusals):
        self.refusals = {doc_id: list(answers) for doc_id, answers in refusals.items()}
        self.sent: list[list[str]] = []

    def bulk(self, body, params):
        import orjson
        ids = [orjson.loads(line)["index"]["_id"] for line in body.split(b"\n")[0::2] if line]
        self.sent.append(ids)
        items = []
        for doc_id in ids:
            answers = self.refusals.get(doc_id)
            status, kind = answers.pop(0) if answers else (201, None)
            items.append({"index": {"status": status, **({"error": {"type": kind, "reason": "r"}} if kind else {})}})
        return {"errors": any("error" in i["index"] for i in items), "items": items}


def test_bulk_sends_rejected_items_again_counts_conflicts_and_returns_refusals(monkeypatch):
    monkeypatch.setattr("sinks.opensearch.bulk.FIRST_BACKOFF_S", 0.0)
    client = _FakeBulkClient({"1": [(429, "es_rejected_execution_exception")],
                              "2": [(409, "version_conflict_engine_exception")],
                              "3": [(400, "mapper_parsing_exception")]})
    writer = BulkWriter(client, max_docs=2, max_bytes=10_000, concurrency=1, what="t")
    items = [Item("i", str(n), n, {"n": n}) for n in range(1, 5)]
    outcome = writer.send(items)
    assert client.sent == [["1", "2"], ["3", "4"], ["1"]]   # sized chunks, then the 429 again alone
    assert (outcome.written, outcome.conflicts) == (2, 1)
    assert [(item.doc_id, reason) for item, reason in outcome.refused] == [("3", "400 mapper_parsing_exception: r")]


def test_bulk_gives_up_with_a_retriable_error(monkeypatch):
    monkeypatch.setattr("sinks.opensearch.bulk.FIRST_BACKOFF_S", 0.0)
    client = _FakeBulkClient({"1": [(429, "es_rejected_execution_exception")] * 10})
    with pytest.raises(RetriableError, match="kept refusing"):
        BulkWriter(client, max_docs=10, max_bytes=10_000, concurrency=1, what="t").send([Item("i", "1", 1, {})])


def test_bulk_chunks_by_bytes():
    client = _FakeBulkClient({})
    writer = BulkWriter(client, max_docs=100, max_bytes=200, concurrency=2, what="t")
    writer.send([Item("i", str(n), n, {"pad": "x" * 60}) for n in range(6)])
    writer.close()
    assert all(len(ids) <= 2 for ids in client.sent) and sum(map(len, client.sent)) == 6


def test_the_example_and_secret_files_load(tmp_path, monkeypatch):
    from pathlib import Path

    from cdc.config import load_config

    root = Path(__file__).resolve().parents[2]
    monkeypatch.setenv("KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    monkeypatch.setenv("PG_DSN", "postgresql://postgres@127.0.0.1/postgres")
    monkeypatch.setenv("OPENSEARCH_URL", "https://search.example:9200")
    [sink] = load_config(root / "examples" / "postgres-opensearch.yaml").sinks
    assert isinstance(sink, OpenSearchSinkConfig) and sink.hosts == ["https://search.example:9200"]
    (tmp_path / "password").write_text("s3cret")
    (tmp_path / "cdc.yaml").write_text(
        "sinks:\n  - {name: s, type: opensearch, topics: ['p.*'], hosts: ['https://h:9200'], "
        "username: u, password_file: password, ca_file: ca.pem}\n")
    [sink] = load_config(tmp_path / "cdc.yaml").sinks
    assert sink.password.get_secret_value() == "s3cret" and "s3cret" not in repr(sink)


def test_an_api_key_is_refused_with_what_opensearch_supports_instead(tmp_path):
    """OpenSearch 2.x has no API keys (the security plugin takes them from 3.7 on): a config
    naming one, inline or from a file, is a config error that says what to use."""
    from cdc.config import load_config
    from cdc.errors import ConfigError

    (tmp_path / "key").write_text("s3cret")
    (tmp_path / "cdc.yaml").write_text(
        "sinks:\n  - {name: s, type: opensearch, topics: ['p.*'], hosts: ['https://h:9200'], "
        "api_key_file: key, ca_file: ca.pem}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path / "cdc.yaml")
    message = str(caught.value)
    assert "OpenSearch 2.x has no API keys" in message and "3.7" in message
    assert "client_cert_file" in message and "password_file" in message and "s3cret" not in message
    with pytest.raises(ValidationError, match="no API keys"):
        OpenSearchSinkConfig(name="s", topics=["p.*"], api_key="k")


def test_the_client_uses_tls_with_verification_and_a_client_certificate(tmp_path):
    from cdc.errors import ConfigError
    from sinks.opensearch.client import make_client
    from tests.integration.redis_tls import make_tls_files

    files = make_tls_files(tmp_path / "tls")
    config = OpenSearchSinkConfig(name="s", topics=["p.*"], hosts=["https://h:9200"], ca_file=str(files.ca),
                                  client_cert_file=str(files.client_cert), client_key_file=str(files.client_key))
    client = make_client(config)
    [connection] = client.transport.connection_pool.connections
    assert connection.use_ssl and "authorization" not in connection.headers
    assert connection.pool.cert_reqs == "CERT_REQUIRED"
    assert (connection.pool.cert_file, connection.pool.key_file) == (str(files.client_cert), str(files.client_key))
    client.close()
    # A key that is not the certificate's, or a missing file: refused at once, naming the setting.
    for cert, key in ((files.client_cert, files.ca), (tmp_path / "missing.pem", files.client_key)):
        wrong = config.model_copy(update={"client_cert_file": str(cert), "client_key_file": str(key)})
        with pytest.raises(ConfigError, match="client_cert_file .* client_key_file"):
            make_client(wrong)
    with pytest.raises(ValidationError, match="not every host is https://"):
        OpenSearchSinkConfig(name="s", topics=["p.*"], client_cert_file="c.pem")
    with pytest.raises(ValidationError, match="client_cert_file is not"):
        OpenSearchSinkConfig(name="s", topics=["p.*"], hosts=["https://h:9200"], client_key_file="k.pem")


def test_bulk_requests_fill_every_slot_in_flight():
    # 10,000 documents in requests of at most 2,000 with 2 in flight: six requests of 1,667, not
    # five of 2,000 with the fifth alone while the other slot idles.
    from sinks.opensearch.bulk import per_request

    assert per_request(10_000, 2000, 2) == 1667
    assert per_request(8000, 2000, 2) == 2000
    assert per_request(1500, 2000, 2) == 2000
    assert per_request(10_000, 2000, 1) == 2000
    client = _FakeBulkClient({})
    writer = BulkWriter(client, max_docs=4, max_bytes=10_000, concurrency=2, what="t")
    writer.send([Item("i", str(n), n, {}) for n in range(12)])
    writer.close()
    assert sorted(map(len, client.sent)) == [3, 3, 3, 3]   # fixed chunks of 4 were 4, 4, 4: one alone
    assert sorted(i for ids in client.sent for i in ids) == sorted(str(n) for n in range(12))


def test_an_encoded_item_is_an_action_line_and_its_document():
    import orjson

    head, body, end = Item("orders", 'a"b', 7, {"x": 1}, version_type="external_gte").encode().split(b"\n")
    assert orjson.loads(head) == {"index": {"_index": "orders", "_id": 'a"b', "version": 7,
                                            "version_type": "external_gte"}}
    assert (orjson.loads(body), end) == ({"x": 1}, b"")


def test_an_assembled_document_gets_its_version_spliced_in_without_being_parsed_again():
    """sinks/opensearch/doc_sink.py: a joined document arrives as JSON bytes; its bulk line is
    the action and those bytes with the version field added (an empty document, and one that
    has a field of that name already, too)."""
    import orjson

    from sinks.documents.engine import Written
    from sinks.opensearch.doc_sink import _item
    from sinks.opensearch.mapping import VERSION_FIELD

    for body, want in ((b'{"id":1,"items":[{"a":"x"}]}', {"id": 1, "items": [{"a": "x"}], VERSION_FIELD: 9}),
                       (b"{}", {VERSION_FIELD: 9}),
                       (orjson.dumps({"id": 1, VERSION_FIELD: 3}), {"id": 1, VERSION_FIELD: 9})):
        item = _item("orders__g2", "1", 9, body, Written("orders", {"id": 1}, 9, body))
        head, source, end = item.encode().split(b"\n")
        assert orjson.loads(head) == {"index": {"_index": "orders__g2", "_id": "1", "version": 9,
                                                "version_type": "external"}}
        assert (orjson.loads(source), end) == (want, b"")


def test_a_write_in_parts_sends_each_part_at_once_and_returns_after_every_request():
    """BulkWriter.sending: a part's requests go out when it is added (the node indexes them while
    the sink encodes the next part); finish waits for all of them; the retries are as send's."""
    import threading
    import time

    release = threading.Event()

    class Held(_FakeBulkClient):
        def bulk(self, body, params):
            answer = super().bulk(body, params)
            assert release.wait(10)
            return answer

    client = Held({"3": [(429, "es_rejected_execution_exception")]})
    writer = BulkWriter(client, max_docs=2, max_bytes=10_000, concurrency=2, what="t")
    items = [Item("i", str(n), n, {}) for n in range(1, 6)]
    sending = writer.sending(len(items))
    sending.add(items[:2], [item.encode() for item in items[:2]])
    deadline = time.monotonic() + 10
    while not client.sent:  # sent before the write's other parts exist
        assert time.monotonic() < deadline
    sending.add(items[2:], [item.encode() for item in items[2:]])
    release.set()
    outcome = sending.finish()
    writer.close()
    assert outcome.written == 5 and outcome.refused == []
    assert client.sent[0] == ["1", "2"] and sorted(client.sent[1:3]) == [["3", "4"], ["5"]]
    assert client.sent[3:] == [["3"]]  # the 429 sent again alone


def test_an_abandoned_write_waits_for_its_requests_in_flight():
    import threading

    release, done = threading.Event(), []

    class Held(_FakeBulkClient):
        def bulk(self, body, params):
            assert release.wait(10)
            done.append(body)
            return super().bulk(body, params)

    client = Held({})
    writer = BulkWriter(client, max_docs=1, max_bytes=10_000, concurrency=2, what="t")
    sending = writer.sending(2)
    sending.add([Item("i", "1", 1, {}), Item("i", "2", 2, {})], [Item("i", str(n), n, {}).encode() for n in (1, 2)])
    threading.Timer(0.2, release.set).start()
    sending.abandon()
    assert len(done) == 2  # no request outlives the write
    writer.close()
