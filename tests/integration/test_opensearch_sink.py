"""The OpenSearch sink against the stack's node: versions, remembered deletes across
``index.gc_deletes`` and a node restart, dead letters, live mappings, schema policy, rebuilds.

Events go through the real sink runtime on the embedded log (a real log, no server needed); the
end-to-end runs with PostgreSQL and Kafka are in test_opensearch_pipeline.py.
"""

from __future__ import annotations

import threading
import time

import orjson
import pytest
from opensearchpy import OpenSearch

from cdc.dev import stack
from cdc.errors import RebuildRequired, SchemaChangeError
from cdc.events import ChangeEvent, Column, Op, SchemaChange, TableId
from cdc.log.base import TopicSettings
from cdc.positions import Counter
from cdc.runtime.sink_runner import SinkRunner
from cdc.serde import EnvelopeEncoder, encode_schema_change
from sinks.opensearch import OpenSearchSink, OpenSearchSinkConfig
from sinks.opensearch.generations import STATE_INDEX
from tests.integration.pg_capture import embedded_log  # noqa: F401 - the fixture ``log``

pytestmark = pytest.mark.opensearch

TABLE = TableId("shop", "public", "items")
TOPIC = TABLE.topic("p")
COLUMNS = (Column("id", "integer", key=True), Column("name", "text"), Column("price", "numeric(10,2)"))


@pytest.fixture
def client(opensearch_url):
    instance = OpenSearch(opensearch_url)
    yield instance
    instance.close()


@pytest.fixture
def make_sink(opensearch_url, opensearch_index, client):
    """``make_sink(**config)`` -> an OpenSearchSink writing aliases ``<unique>.<table>``."""
    def make(**overrides) -> OpenSearchSink:
        settings = dict(name=opensearch_index, hosts=[opensearch_url], topics=["p.*"],
                        index_name=f"{opensearch_index}.{{table}}", batch_size=100, batch_wait_ms=10,
                        drop_old_generation_after_s=0)
        settings.update(overrides)
        return OpenSearchSink(OpenSearchSinkConfig(**settings))
    yield make
    client.delete(index=STATE_INDEX, id=opensearch_index, params={"ignore": 404})


def _publish(log, events: list[ChangeEvent], columns=COLUMNS, schema_version: int = 1, *, prefix: str = "p",
             partitions: int = 2) -> None:
    log.ensure_topic(TABLE.topic(prefix), TopicSettings(partitions=partitions))
    log.ensure_topic(f"{prefix}.schema-changes", TopicSettings(partitions=1))
    encoder = EnvelopeEncoder("postgresql", "src", prefix)
    writer = log.writer()
    records = [encode_schema_change(SchemaChange(TABLE, columns, schema_version, 0), "src", prefix)]
    writer.publish(records + encoder.encode(events), Counter(1))
    writer.flush(30)
    writer.close()


def _row(i: int, version: int, name: str | None = None) -> dict:
    return {"id": i, "name": name or f"item {i} v{version}", "price": f"{i}.{version % 100:02d}"}


def _upsert(i: int, version: int, op: Op = Op.UPDATE, **row) -> ChangeEvent:
    return ChangeEvent(op, TABLE, {"id": i}, None, {**_row(i, version), **row}, version, 0)


def _delete(i: int, version: int) -> ChangeEvent:
    return ChangeEvent(Op.DELETE, TABLE, {"id": i}, _row(i, version), None, version, 0)


def _caught_up(sink: OpenSearchSink, log, *, from_start: bool = False, group: str | None = None) -> SinkRunner:
    runner = SinkRunner(sink, log, "p", group=group)
    runner.run(threading.Event(), from_start=from_start, until_caught_up=True)
    return runner


def _documents(client, alias: str) -> dict[int, dict]:
    """What readers see: every document of the alias (tombstones are filtered out)."""
    from opensearchpy.helpers import scan

    client.indices.refresh(index=alias)
    hits = scan(client, index=alias, query={"query": {"match_all": {}}}, size=5000)
    return {h["_source"]["id"]: {k: v for k, v in h["_source"].items() if not k.startswith("__cdc")} for h in hits}


def _history(keys: int, rounds: int) -> tuple[list[ChangeEvent], dict[int, dict]]:
    """Inserts, updates and deletes (every third key deleted, some re-inserted): the events and
    the rows that remain."""
    events, rows, version = [], {}, 100
    for i in range(keys):
        version += 1
        events.append(_upsert(i, version, Op.CREATE))
        rows[i] = _row(i, version)
    for _ in range(rounds):
        for i in range(keys):
            version += 1
            if i % 3 == 0 and i in rows:
                events.append(_delete(i, version))
                del rows[i]
            elif i % 3 == 0 and i % 2 == 0:
                events.append(_upsert(i, version, Op.CREATE))
                rows[i] = _row(i, version)
            elif i in rows:
                events.append(_upsert(i, version))
                rows[i] = _row(i, version)
    return events, rows


def test_replays_never_move_a_document_backwards(make_sink, log, client, opensearch_index):
    events, rows = _history(60, 4)
    _publish(log, events)
    sink = make_sink()
    _caught_up(sink, log)
    alias = f"{opensearch_index}.items"
    assert _documents(client, alias) == rows
    replay = make_sink()
    _caught_up(replay, log, from_start=True, group="replay")
    assert _documents(client, alias) == rows
    assert replay.counters["written"] == 0 and replay.counters["conflicts"] > 0  # equal versions: no-ops


def test_read_rows_gives_back_what_readers_see_in_key_order(make_sink, log, client, opensearch_index):
    """cdc.api.ReadableSink: the documents readers see (deleted keys left out), keyed as their
    ``_id`` spells the key, in key order (numbers by value), paged by ``after``."""
    events, rows = _history(30, 2)
    _publish(log, events)
    sink = make_sink()
    _caught_up(sink, log)
    fresh = make_sink()  # another instance, as a tool would start one beside the running sink
    fresh.start()
    try:
        read = fresh.read_rows(TOPIC)
        assert [r.key for r in read] == [(str(i),) for i in sorted(rows)]
        assert {int(r.key[0]): r.row for r in read} == rows
        after = sorted(rows)[4]
        assert [r.key for r in fresh.read_rows(TOPIC, after=(after,), limit=2)] == \
            [(str(i),) for i in sorted(rows) if i > after][:2]
        assert fresh.read_rows("p.public.nothing") == []
    finally:
        fresh.stop()


@pytest.mark.serial
def test_deletes_stay_remembered_past_gc_deletes_and_a_node_restart(make_sink, log, client, opensearch_index):
    """A replay of the whole topic after the node forgot its own delete tombstones (index.gc_deletes
    of 1 s, then a restart) brings no deleted document back and moves none backwards. The same
    replay into an index with plain versioned deletes does resurrect them: the check can fail."""
    events, rows = _history(90, 3)
    deleted = {i for i in range(90) if i not in rows}
    assert deleted
    _publish(log, events)
    sink = make_sink(settings={"index": {"gc_deletes": "1s"}})
    _caught_up(sink, log)
    alias = f"{opensearch_index}.items"
    assert _documents(client, alias) == rows

    control = f"{opensearch_index}.control"  # what a sink with real deletes would have
    client.indices.create(index=control, body={"settings": {"index": {"gc_deletes": "1s"}}})
    for event in events:
        params = {"version": event.version, "version_type": "external", "ignore": 409}
        if event.op is Op.DELETE:
            client.delete(index=control, id=str(event.key["id"]), params=params)
        else:
            client.index(index=control, id=str(event.key["id"]), body=event.after, params=params)

    time.sleep(1.5)  # let index.gc_deletes pass (a precondition, not an assertion)
    stack.restart("opensearch")

    replay = make_sink(settings={"index": {"gc_deletes": "1s"}})
    _caught_up(replay, log, from_start=True, group="replay")
    assert _documents(client, alias) == rows
    assert replay.counters["written"] == 0

    for event in events:  # the control replays the older writes too
        if event.op is not Op.DELETE:
            client.index(index=control, id=str(event.key["id"]), body=event.after,
                         params={"version": event.version, "version_type": "external", "ignore": 409})
    client.indices.refresh(index=control)
    back = client.count(index=control)["count"] - len(rows)
    assert back > 0, "plain deletes were not forgotten: this test would not catch a resurrection"


def test_a_tombstone_alone_deletes_the_document(make_sink, log, client, opensearch_index):
    _publish(log, [_upsert(i, 10 + i, Op.CREATE) for i in range(5)])
    sink = make_sink()
    _caught_up(sink, log)
    from cdc.serde import Record
    writer = log.writer()
    writer.publish([Record(TOPIC, orjson.dumps({"id": 2}), None)])  # the delete was compacted away
    writer.flush(30)
    writer.close()
    _caught_up(make_sink(), log)
    assert set(_documents(client, f"{opensearch_index}.items")) == {0, 1, 3, 4}
    # An older write of the key after that is refused: the tombstone kept the row's version.
    _publish(log, [_upsert(2, 12)])
    _caught_up(make_sink(), log)
    assert 2 not in _documents(client, f"{opensearch_index}.items")


@pytest.mark.parametrize("writes_in_flight", [1, 2])
@pytest.mark.parametrize("resume_at", [1, 2])
def test_a_replayed_tombstone_alone_keeps_the_row_inserted_after_it(make_sink, log, client, opensearch_index,
                                                                     resume_at, writes_in_flight):
    """A row deleted and inserted again with the same key: insert @0, delete @1, tombstone @2,
    insert @3. A run wrote everything and was killed before committing past ``resume_at``; the
    replay cuts its batches after each record, so the tombstone is alone in its batch while the
    index holds the row at the version of the insert after it. That row must stay: the
    tombstone's delete was read (and written, refused as older), so it deletes nothing more."""
    _publish(log, [_upsert(7, 3, Op.CREATE), _delete(7, 5), _upsert(7, 7, Op.CREATE)], partitions=1)
    assert [r.offset for r in log.read_all(TOPIC)] == [0, 1, 2, 3]
    alias = f"{opensearch_index}.items"
    _caught_up(make_sink(), log)
    assert _documents(client, alias) == {7: _row(7, 7)}
    reader = log.reader(opensearch_index)
    reader.commit({(TOPIC, 0): resume_at})  # killed after the write of 2..3, before its commit
    reader.close()
    _caught_up(make_sink(batch_size=1, writes_in_flight=writes_in_flight), log)
    assert _documents(client, alias) == {7: _row(7, 7)}


def test_a_tombstone_alone_after_compaction_still_deletes(make_sink, log, client, opensearch_index):
    """The delete compacted away while the sink lagged: the tombstone alone deletes the row the
    index holds (written before the delete), also when its batch starts at it."""
    _publish(log, [_upsert(i, 10 + i, Op.CREATE) for i in range(3)], partitions=1)
    alias = f"{opensearch_index}.items"
    _caught_up(make_sink(), log)
    _publish(log, [_delete(1, 20), _upsert(2, 21)], partitions=1)
    log.compact(TOPIC)
    offsets = [r.offset for r in log.read_all(TOPIC)]
    assert 3 not in offsets and 4 in offsets  # the delete is gone, its tombstone stays
    _caught_up(make_sink(batch_size=1), log)
    assert set(_documents(client, alias)) == {0, 2}


def test_a_document_the_mapping_refuses_goes_to_the_dead_letters_alone(make_sink, log, client, opensearch_index):
    events = [_upsert(i, 10 + i, Op.CREATE) for i in range(40)]
    events[17] = _upsert(17, 27, Op.CREATE, price="not a number")
    _publish(log, events)
    sink = make_sink()
    _caught_up(sink, log)
    assert set(_documents(client, f"{opensearch_index}.items")) == set(range(40)) - {17}
    [dead] = [orjson.loads(r.value) for r in log.read_all(f"p.dead-letter.{opensearch_index}")]
    assert "mapper_parsing_exception" in dead["reason"] and "price" in dead["reason"]
    assert orjson.loads(dead["value"])["after"]["id"] == 17


def test_truncate_clears_older_documents_and_keeps_later_ones(make_sink, log, client, opensearch_index):
    _publish(log, [_upsert(i, 10 + i, Op.CREATE) for i in range(10)])
    _caught_up(make_sink(), log)
    truncate = ChangeEvent(Op.TRUNCATE, TABLE, {}, None, None, 100, 0)
    _publish(log, [truncate, _upsert(3, 101, Op.CREATE)])
    _caught_up(make_sink(), log)
    assert set(_documents(client, f"{opensearch_index}.items")) == {3}
    _publish(log, [_upsert(5, 50)])  # older than the truncate: refused
    _caught_up(make_sink(), log)
    assert set(_documents(client, f"{opensearch_index}.items")) == {3}


def _write(sink: OpenSearchSink, events: list[ChangeEvent], schema: dict) -> None:
    from cdc.sink_events import decode_record
    sink.schema_for = lambda topic, version=None: schema
    records = EnvelopeEncoder("postgresql", "src", "p").encode(events)
    sink.write([decode_record(type("R", (), {"topic": r.topic, "partition": 0, "offset": n, "key": r.key,
                                              "value": r.value})) for n, r in enumerate(records)])


def _schema(version: int, columns) -> dict:
    return orjson.loads(encode_schema_change(SchemaChange(TABLE, tuple(columns), version, 0), "src", "p").value)


def test_new_columns_are_mapped_live_and_a_type_change_follows_the_policy(make_sink, client, opensearch_index):
    sink = make_sink(schema_policy="fail")
    sink.start()
    try:
        _write(sink, [_upsert(1, 10, Op.CREATE)], _schema(1, COLUMNS))
        wider = (*COLUMNS, Column("stock", "bigint"))
        _write(sink, [_upsert(2, 11, Op.CREATE, stock=5)], _schema(2, wider))
        index = f"{opensearch_index}.items__g1"
        properties = client.indices.get_mapping(index=index)[index]["mappings"]["properties"]
        assert properties["stock"] == {"type": "long"} and properties["price"]["type"] == "scaled_float"
        changed = (COLUMNS[0], Column("name", "integer"), COLUMNS[2])
        with pytest.raises(SchemaChangeError, match=r"name: text -> long"):
            _write(sink, [_upsert(3, 12, Op.CREATE, name=3)], _schema(3, changed))
    finally:
        sink.stop()
    rebuilding = make_sink(schema_policy="rebuild")
    rebuilding.start()
    try:
        with pytest.raises(RebuildRequired):
            _write(rebuilding, [_upsert(3, 12, Op.CREATE, name=3)], _schema(3, changed))
    finally:
        rebuilding.stop()


def test_changing_the_configured_mapping_asks_for_a_rebuild(make_sink, log, client, opensearch_index):
    _publish(log, [_upsert(i, 10 + i, Op.CREATE) for i in range(5)])
    _caught_up(make_sink(), log)
    _publish(log, [_upsert(1, 30)])
    changed = make_sink(tables={"public.items": {"mappings": {"name": {"type": "keyword"}}}})
    runner = _caught_up(changed, log)
    alias = f"{opensearch_index}.items"
    assert client.indices.get_alias(name=alias) == {f"{alias}__g2": {"aliases": {alias: {
        "filter": {"bool": {"must_not": [{"term": {"__cdc_deleted": True}}]}}}}}}
    index = f"{alias}__g2"
    assert client.indices.get_mapping(index=index)[index]["mappings"]["properties"]["name"] == {"type": "keyword"}
    assert not client.indices.exists(index=f"{alias}__g1")
    assert _documents(client, alias)[1]["name"] == "item 1 v30"
    assert runner.stats.phase == "stopped"


def test_a_rebuild_never_shows_readers_a_partial_index(make_sink, log, client, opensearch_index):
    events, rows = _history(3000, 2)
    _publish(log, events)
    _caught_up(make_sink(), log)
    alias = f"{opensearch_index}.items"
    expected = len(rows)
    assert _documents(client, alias) == rows
    seen: list[int] = []
    stop = threading.Event()

    def reader():
        while not stop.is_set():
            seen.append(client.count(index=alias)["count"])

    watcher = threading.Thread(target=reader)
    watcher.start()
    try:
        sink = make_sink(drop_old_generation_after_s=3600)
        SinkRunner(sink, log, "p").rebuild(threading.Event())
    finally:
        stop.set()
        watcher.join()
    assert min(seen) == expected and len(seen) > 3
    assert client.indices.exists(index=f"{alias}__g1")  # kept for the configured delay
    assert _documents(client, alias) == rows
    state = client.get(index=STATE_INDEX, id=opensearch_index)["_source"]
    assert state["current"] == 2 and list(state["retired"]) == ["1"]
    described = {row["alias"]: row for row in sink_describe(make_sink())}
    assert described[alias]["generation"] == 2 and described[alias]["documents"] == expected
    later = make_sink()  # once the delay has passed (moved into the past here), a write drops it
    later.start()
    try:
        later.generations.state.retired[1] = 0.0
        later.write([])
        _write(later, [_upsert(0, 10**9, Op.CREATE)], _schema(1, COLUMNS))
    finally:
        later.stop()
    assert not client.indices.exists(index=f"{alias}__g1")


def _refresh_interval(client, index: str):
    return client.indices.get_settings(index=index)[index]["settings"]["index"].get("refresh_interval")


def test_a_generation_fills_without_periodic_refreshes_and_readers_get_the_configured_interval(
        make_sink, log, client, opensearch_index):
    """Nobody reads a generation being filled: it is made with refresh_interval -1 (no segment
    written every second), and takes the configured interval (or the default) back before the
    aliases move to it."""
    events, rows = _history(40, 1)
    _publish(log, events)
    alias = f"{opensearch_index}.items"
    while_filled = {}
    for configured in (None, "7s"):
        sink = make_sink(**({"settings": {"index": {"refresh_interval": configured}}} if configured else {}))
        switch = sink.switch_generation

        def observed(generation, switch=switch, configured=configured):
            while_filled[configured] = _refresh_interval(client, f"{alias}__g{generation}")
            switch(generation)

        sink.switch_generation = observed
        SinkRunner(sink, log, "p").rebuild(threading.Event())
        (live,) = client.indices.get_alias(name=alias)
        assert _refresh_interval(client, live) == configured
        assert _documents(client, alias) == rows
    assert while_filled == {None: "-1", "7s": "-1"}


def sink_describe(sink: OpenSearchSink) -> list[dict]:
    sink.start()
    try:
        return sink.describe()
    finally:
        sink.stop()


def test_cdc_status_shows_each_index(make_sink, log, client, opensearch_index, opensearch_url, tmp_path, capsys):
    from cdc.cli import main

    events, rows = _history(30, 2)
    _publish(log, events)
    _caught_up(make_sink(), log)
    config = tmp_path / "cdc.yaml"
    config.write_text(
        f"log:\n  embedded: {{path: '{tmp_path / 'log'}', topic_prefix: p}}\n"
        f"sinks:\n  - {{name: {opensearch_index}, type: opensearch, hosts: ['{opensearch_url}'], topics: ['p.*'], "
        f"index_name: '{opensearch_index}.{{table}}'}}\nhttp: null\n")
    client.indices.refresh(index=f"{opensearch_index}.items")  # counts are as of the last refresh
    capsys.readouterr()
    assert main(["status", str(config), "--json"]) == 0
    [row] = orjson.loads(capsys.readouterr().out)
    [store] = row["stores"]
    assert store["alias"] == f"{opensearch_index}.items" and store["index"] == f"{opensearch_index}.items__g1"
    assert store["generation"] == 1 and store["documents"] == len(rows) and store["lag"] == 0
    assert store["tombstones"] == 30 - len(rows)
    assert main(["status", str(config)]) == 0
    assert f"alias={opensearch_index}.items" in capsys.readouterr().out


READER = """
import sys, urllib.request, urllib.error
url = sys.argv[1]
while True:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            print(answer.read().decode().split('"count":')[1].split(",")[0], flush=True)
    except urllib.error.HTTPError as err:
        print("missing" if err.code == 404 else f"error {err.code}", flush=True)
"""


def test_bootstrap_fills_a_generation_readers_see_only_once_complete(make_sink, log, client, opensearch_index,
                                                                      opensearch_url, tmp_path):
    import subprocess
    import sys

    from cdc.cli import main

    events, rows = _history(4000, 1)
    _publish(log, events)
    config = tmp_path / "cdc.yaml"
    config.write_text(
        f"log:\n  embedded: {{path: '{tmp_path / 'log'}', topic_prefix: p}}\n"
        f"sinks:\n  - {{name: {opensearch_index}, type: opensearch, hosts: ['{opensearch_url}'], topics: ['p.*'], "
        f"index_name: '{opensearch_index}.{{table}}', batch_size: 200, drop_old_generation_after_s: 0}}\n"
        f"http: null\n")
    alias = f"{opensearch_index}.items"
    # A reader in a process of its own, counting through the alias as fast as it can.
    reader = subprocess.Popen([sys.executable, "-c", READER, f"{opensearch_url}/{alias}/_count"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert main(["bootstrap", str(config), opensearch_index, "--no-follow"]) == 0
    finally:
        reader.terminate()
        seen = reader.communicate()[0].split()
    assert _documents(client, alias) == rows
    partial = sorted({n for n in seen if n != "missing" and int(n) != len(rows)})
    assert not partial and "missing" in seen, f"readers saw partial counts {partial[:5]}"


def test_tombstones_are_purged_after_their_retention(make_sink, log, client, opensearch_index):
    events, rows = _history(30, 1)
    _publish(log, events)
    _caught_up(make_sink(), log)
    alias = f"{opensearch_index}.items"
    tombstones = {"query": {"term": {"__cdc_deleted": True}}}
    client.indices.refresh(index=alias)
    assert client.count(index=f"{alias}__g1", body=tombstones)["count"] == 30 - len(rows) > 0
    _publish(log, [_upsert(1, 10**6)])
    _caught_up(make_sink(tombstone_retention_hours=1e-9), log)  # every tombstone is older than that
    assert client.count(index=f"{alias}__g1", body=tombstones)["count"] == 0
    assert _documents(client, alias) == {**rows, 1: _row(1, 10**6)}


def test_a_rebuild_killed_half_way_leaves_readers_on_the_old_generation_and_starts_over(
        make_sink, log, client, opensearch_index, opensearch_url, tmp_path):
    import os
    import signal
    import subprocess
    import sys

    from tests.integration.pg_capture import wait_until

    events, rows = _history(20_000, 1)
    _publish(log, events)
    _caught_up(make_sink(), log)
    alias = f"{opensearch_index}.items"
    assert _documents(client, alias) == rows
    config = tmp_path / "cdc.yaml"
    config.write_text(
        f"log:\n  embedded: {{path: '{tmp_path / 'log'}', topic_prefix: p}}\n"
        f"sinks:\n  - {{name: {opensearch_index}, type: opensearch, hosts: ['{opensearch_url}'], topics: ['p.*'], "
        f"index_name: '{opensearch_index}.{{table}}', batch_size: 100, drop_old_generation_after_s: 0}}\n"
        f"http: null\n")

    def rebuild() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "cdc.cli", "rebuild", str(config), opensearch_index],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def filled(index: str) -> int:
        if not client.indices.exists(index=index):
            return 0
        client.indices.refresh(index=index)
        return client.count(index=index)["count"]

    first = rebuild()
    wait_until(lambda: filled(f"{alias}__g2") > 1000, timeout=120, what="the rebuild half way")
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    assert filled(f"{alias}__g2") < len(rows)  # it was struck before the end
    assert list(client.indices.get_alias(name=alias)) == [f"{alias}__g1"]
    assert _documents(client, alias) == rows
    second = subprocess.run([sys.executable, "-m", "cdc.cli", "rebuild", str(config), opensearch_index],
                            capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-2000:]
    assert list(client.indices.get_alias(name=alias)) == [f"{alias}__g2"]
    assert _documents(client, alias) == rows
    assert not client.indices.exists(index=f"{alias}__g1")
