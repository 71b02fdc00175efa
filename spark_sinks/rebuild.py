"""Tables built again from their compacted topics: one table when its source's shape asks for it
(``schema_policy: rebuild``, from a batch), or every table on ``cdc rebuild`` (before the query
starts). Each goes into a staging table (Delta: under ``<path>/_cdc_rebuild``; Iceberg: in the
namespace ``_cdc_rebuild.<schema>``) through the same path as every batch, then is swapped in by one overwrite commit: readers see the old table until then,
and a rebuild cut short leaves it; the next one deletes the staging table first."""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any

from pyspark.sql import SparkSession

from cdc.api import PermanentError, table_topics
from spark_sinks.schemas import TableShape
from spark_sinks.tables import TableTarget

log = logging.getLogger(__name__)

# ``job`` below is the sink's DeltaJob, untyped here: job.py imports this module, not the reverse.
DeltaJob = Any


def rebuild_all(job: DeltaJob, session: SparkSession, stop: threading.Event) -> list[str]:
    """``cdc rebuild``: every table of the sink's topics built again from offset 0 and swapped
    in, before the query starts (no MERGE of it runs beside a swap). The query then resumes
    from its checkpoint, which is behind the ends the rebuild read: what it reads again changes
    nothing (version-guarded). Stops between tables once ``stop`` is set: a table not reached
    keeps its rows, and the next ``cdc rebuild`` starts over. Returns the tables rebuilt."""
    if job.log is None:
        raise PermanentError(f"sink {job.name}: a rebuild needs the log's topic list (no log client)")
    job.bind(f"rebuild-{uuid.uuid4().hex}")  # the staging tables' commit ids; start() binds the query's
    done = []
    try:
        for topic in table_topics(job.log.topics(), job.config.topics):
            if stop.is_set():
                break
            target = job._target(topic)
            # A table not made yet is made by the query, from its first batch as always.
            if target.exists(session) and rebuild_table(job, session, target, None, 0):
                done.append(target.name)
    finally:
        job.unbind()
    return done


def rebuild_table(job: DeltaJob, session: SparkSession, target: TableTarget, shape: TableShape | None,
                  batch_id: int) -> bool:
    """Rebuild ``target`` from its compacted topic with ``shape``: into a staging table through
    the same path as every batch, then swapped in by one overwrite commit (readers see the old
    table until then). The topic is read to its current end; later batches that repeat some of
    it change nothing (version-guarded)."""
    staging = job._target(target.topic, "_cdc_rebuild")
    staging.drop(session)
    staging.forget()
    # Rows written before a rename the live table followed land under the new name.
    staging.inherited_former = target.former_names(session)
    full = (session.read.format("kafka").options(**job.source_options()).option("subscribe", target.topic)
            .option("includeHeaders", "true").option("startingOffsets", "earliest").option("endingOffsets", "latest")
            .option("failOnDataLoss", "false").load())
    rows, summary = job._read(full)
    if not summary:   # an empty topic: nothing to build a table from
        rows.unpersist()
        log.warning("table %s not rebuilt: %s holds no record", target.name, target.topic, extra=job._extra())
        return False
    try:
        [item] = summary
        job._learn_codecs(full, [item])
        job.apply_topic(session, rows, item, batch_id, staging, shape)
    finally:
        rows.unpersist()
    target.replace(session, staging.frame(session))
    target.forget()
    properties = {k: v for k, v in staging.properties(session).items() if k.startswith("cdc.")}
    target.set_properties(session, properties)
    if staging.deletes_exist(session):
        target.replace(session, staging.frame(session, deletes=True), deletes=True)
    elif target.deletes_exist(session):
        target.delete(session, None, deletes=True)
    staging.drop(session)
    staging.forget()
    target.forget()
    log.warning("table %s rebuilt from %s", target.name, target.topic, extra=job._extra())
    return True

