"""A trickle of transactions is not held back by the producer's batching; a backlog still is batched.

The producer's ``linger.ms`` is set to over 4 minutes and the writer's forced
drain (``barrier_interval``) to an hour, so a record reaches the topic within the test's wait only
if the runner sends it at once when the source has caught up (``Batch.caught_up`` ->
``LogWriter.send_now``). The waits are for evidence (records in the topic), not for timings.
"""

from __future__ import annotations

import pytest

from cdc.log.kafka import KafkaLog, KafkaWriter
from cdc.plugins import source_plugin
from tests.integration.pg_capture import Capture, execute, pg_config, wait_until
from tests.sql import query

pytestmark = [pytest.mark.postgres, pytest.mark.kafka]

LINGER_FOREVER = {"linger.ms": 250_000}  # below message.timeout.ms (300 s), as librdkafka requires


class NoForcedDrain(KafkaLog):
    """Writers whose only way to send early is ``send_now``: no drain is forced for an hour."""

    def writer(self) -> KafkaWriter:
        writer = KafkaWriter(self, self.producer_config, barrier_interval=3600)
        self._open.add(writer)
        return writer


def test_a_transaction_on_a_caught_up_source_reaches_kafka_without_waiting_for_the_linger(
        pg_dsn, tmp_path, kafka_bootstrap, kafka_topic):
    execute(pg_dsn, "CREATE TABLE items (id int PRIMARY KEY, note text)")
    log = NoForcedDrain(kafka_bootstrap, producer_config=LINGER_FOREVER)
    topic = f"{kafka_topic}.public.items"
    capture = Capture(pg_config(pg_dsn, tmp_path, snapshot="never"), log, kafka_topic).start()
    try:
        wait_until(lambda: capture.source.phase == "streaming", what="streaming", capture=capture)
        execute(pg_dsn, "INSERT INTO items VALUES (1, 'one'), (2, 'two')")

        def records() -> int:
            return sum(log.end_offsets(topic).values()) if topic in log.topics() else 0

        wait_until(lambda: records() == 2, 60, "both records in the topic (the linger is 250 s)", capture)
        # Sent and acknowledged: the transaction's end is a safe position, stored and confirmed.
        wait_until(lambda: capture.offsets.load("pg") is not None, 60, "a stored position", capture)
    finally:
        capture.stop()
        log.close()


def test_a_backlog_is_read_in_batches_that_are_not_caught_up_until_its_end(pg_dsn, tmp_path):
    """A backlog already sent by the server is read in full batches that keep the producer's
    batching; only the batch that empties what the server sent says it caught up."""
    execute(pg_dsn, "CREATE TABLE items (id int PRIMARY KEY, note text)")
    config = pg_config(pg_dsn, tmp_path, snapshot="never", max_batch_events=50, heartbeat_interval=3600)
    source = source_plugin("postgres")(config, None)
    source.start()
    try:
        while source.phase != "streaming":
            source.poll(0.1)
        execute(pg_dsn, "INSERT INTO items SELECT g, 'row ' || g FROM generate_series(1, 1000) g")
        end = query(pg_dsn, "SELECT pg_current_wal_lsn()")[0][0]
        # Evidence that the whole transaction waits in our socket: the walsender sent past its end.
        wait_until(lambda: query(pg_dsn, "SELECT r.sent_lsn >= %s FROM pg_stat_replication r JOIN "
                                           "pg_replication_slots s ON s.active_pid = r.pid "
                                           "WHERE s.database = current_database()", (end,)) == [(True,)],
                   what="the walsender to send the transaction")
        batches = []
        while not batches or batches[-1].checkpoint is None:
            batch = source.poll(1.0)
            if batch is not None and (batch.events or batches):
                batches.append(batch)
        assert sum(len(b.events) for b in batches) == 1000 and len(batches) >= 20
        assert [b.caught_up for b in batches] == [False] * (len(batches) - 1) + [True]
    finally:
        source.stop()
