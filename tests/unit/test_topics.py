"""The rule for the framework's own topics (cdc/topics.py), and that its users follow it."""

from __future__ import annotations

import re

import orjson

from cdc import topics
from cdc.log.base import TopicSettings
from cdc.log.embedded import EmbeddedLog
from cdc.serde import Record

OWN = [topics.offsets_topic("cdc"), topics.schema_changes_topic("cdc"), topics.dead_letter_topic("cdc", "search"),
       topics.offsets_topic("a.b"), topics.dead_letter_topic("a.b", "wh.2"),
       topics.shares_topic("cdc", "docs")]
TABLES = ["cdc.public.orders", "cdc.shop.items", "a.b.public.t", "cdc.public.offsets_archive", "cdc.dead.letter", "cdc.shares.docs"]


def test_the_framework_topics_are_internal_and_the_tables_are_not():
    assert all(topics.internal_topic(t) for t in OWN)
    assert not any(topics.internal_topic(t) for t in TABLES)


def test_the_subscription_lookahead_says_what_internal_topic_says():
    pattern = re.compile(f"{topics.INTERNAL_TOPICS_LOOKAHEAD}.*")
    for topic in OWN + TABLES:
        assert (pattern.fullmatch(topic) is None) == topics.internal_topic(topic), topic


def test_a_sink_reads_the_tables_its_globs_match_and_never_a_framework_topic():
    assert topics.table_topics(OWN + TABLES, ["cdc.*"]) == \
        ["cdc.dead.letter", "cdc.public.offsets_archive", "cdc.public.orders", "cdc.shares.docs", "cdc.shop.items"]
    assert topics.table_topics(OWN + TABLES, ["cdc.public.*", "a.b.*"]) == \
        ["a.b.public.t", "cdc.public.offsets_archive", "cdc.public.orders"]


def test_a_dead_letter_topic_names_its_sink():
    assert topics.dead_letter_sink("cdc", topics.dead_letter_topic("cdc", "wh.2")) == "wh.2"
    assert topics.dead_letter_sink("cdc", "cdc.public.orders") is None
    assert topics.dead_letter_sink("other", topics.dead_letter_topic("cdc", "wh")) is None


def test_the_demo_counts_change_events_and_skips_the_dead_letters(tmp_path):
    """A dead letter's value has no ``source``: the demo's count once read it as a change event
    (its topic, ``shop.dead-letter.<sink>``, has as many dots as a table's) and failed."""
    from cdc.demo import PREFIX, event_counts

    log = EmbeddedLog(str(tmp_path / "log.db"))
    try:
        change = {"before": None, "after": {"id": 1}, "op": "c",
                  "source": {"name": "pg", "snapshot": "false", "version": 1}}
        for topic in (f"{PREFIX}.public.orders", topics.dead_letter_topic(PREFIX, "search")):
            log.ensure_topic(topic, TopicSettings())
        writer = log.writer()
        writer.publish([Record(f"{PREFIX}.public.orders", b'{"id":1}', orjson.dumps(change)),
                        Record(topics.dead_letter_topic(PREFIX, "search"), b"{}", b'{"sink":"search"}')])
        writer.flush(10)
        writer.close()
        assert event_counts(log, ["pg"]) == {"pg": {"snapshot": 0, "live": 1}}
    finally:
        log.close()
