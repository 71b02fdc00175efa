"""The shape of the delta sink's MERGEs (issue 18): what Delta is asked to do per batch.

Batches go straight through the sink's micro-batch (``DeltaJob.apply``) with records made by the
framework's encoder, no broker; the session-wide ``spark`` fixture.
"""

from __future__ import annotations

import json
import uuid

import pytest

from cdc.events import ChangeEvent, Op, TableId
from cdc.serde import EnvelopeEncoder
from spark_sinks.config import DeltaSinkConfig
from spark_sinks.job import DeltaJob

pytestmark = [pytest.mark.spark]

ITEMS = TableId("shop", "public", "items")
RECORD = {"source": "src", "db": "shop", "schema": "public", "table": "items", "version": 1, "ts_ms": 0,
          "columns": [{"name": "id", "type": "integer", "key": True, "nullable": False},
                      {"name": "name", "type": "text", "key": False, "nullable": True}]}


def _event(op: Op, key: int, version: int, name: str | None = None) -> ChangeEvent:
    after = None if op is Op.DELETE else {"id": key, "name": name}
    return ChangeEvent(op, ITEMS, {"id": key}, {"id": key} if op is Op.DELETE else None, after, version,
                       1_700_000_000_000 + version)


def test_a_new_tables_first_merge_only_inserts_and_later_ones_keep_the_guard(spark, tmp_path):
    """A table the job created holds nothing to match: its first MERGE is insert-only (Delta then
    skips the matched-row machinery: no join with the target's rows, no deletion vectors).
    Every later MERGE keeps the version guard and the remembered deletes."""
    encoder = EnvelopeEncoder("postgresql", "src", "p")
    config = DeltaSinkConfig(name="lake", type="delta", topics=["p.*"], path=str(tmp_path / "lake"),
                             checkpoint=str(tmp_path / "cp"))
    job = DeltaJob(config, bootstrap_servers="unused:9092", prefix="p")
    job.registry.remember(encoder.topic(ITEMS), RECORD)
    job.bind(f"test-{uuid.uuid4().hex}")
    offset = 0

    def apply(batch_id: int, *events: ChangeEvent) -> None:
        nonlocal offset
        records = [(r.key, r.value, r.topic, 0, offset + i) for i, r in enumerate(encoder.encode(list(events)))]
        offset += len(records)
        job.apply(spark.createDataFrame(records, "key binary, value binary, topic string, partition int, "
                                                 "offset long"), batch_id)

    # Batch 0: out of order within the batch, a delete of a key never seen, an insert then its delete.
    apply(0, _event(Op.CREATE, 1, 10, "a"), _event(Op.UPDATE, 1, 30, "a30"), _event(Op.UPDATE, 1, 20, "a20"),
          _event(Op.DELETE, 2, 20), _event(Op.CREATE, 3, 5, "c"), _event(Op.DELETE, 3, 6))
    # Batch 1: a late older update, a late insert of a remembered delete, a newer insert.
    apply(1, _event(Op.UPDATE, 1, 25, "late"), _event(Op.CREATE, 2, 15, "late"), _event(Op.CREATE, 3, 7, "c7"))

    path = f"{config.path}/public/items"
    assert sorted(tuple(r) for r in spark.read.format("delta").load(path)
                  .select("id", "name", "__cdc_version").collect()) == [(1, "a30", 30), (3, "c7", 7)]
    merges = [h for h in spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy("version").collect()
              if h.operation == "MERGE"]
    assert [json.loads(h.userMetadata)["batch"] for h in merges] == [0, 1]
    first, second = (json.loads(h.operationParameters["matchedPredicates"]) for h in merges)
    assert first == [] and second != []
