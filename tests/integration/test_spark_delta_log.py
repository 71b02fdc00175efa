"""What an operator reads of the delta sink: its output (the driver's Python log and the JVM's
log4j lines) as ``python -m cdc.runtime.submit`` prints it. An ERROR line must mean something
went wrong; MERGEs over rows that earlier MERGEs marked deleted (deletion vectors, the tables'
default) made Delta print one per MERGE with the data unaffected."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cdc.events import Op
from tests.integration.test_spark_delta_shutdown import submit_config
from tests.integration.test_spark_delta_sink import ITEM_COLUMNS, ITEMS, Topics, delete, rows, upsert

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

KEYS = 200
ERROR = re.compile(r"\b(ERROR|SEVERE|FATAL)\b")


def test_merges_over_deletion_vectors_print_no_error_line(spark, dev_env_for, kafka_bootstrap, kafka_topic,
                                                          tmp_path):
    topics = Topics(kafka_bootstrap, kafka_topic)
    try:
        topics.schema(ITEMS, ITEM_COLUMNS, 1)
        # Three rounds of one batch each (max_offsets_per_trigger): the second MERGE marks the
        # first one's rows deleted in its files (deletion vectors), the third reads those files.
        for round_ in range(3):
            topics.publish(*[upsert(k, 10 * round_ + 1, op=Op.CREATE if round_ == 0 else Op.UPDATE,
                                    name=f"n{k}.{round_}", qty=round_) for k in range(1, KEYS + 1)])
        topics.publish(*[delete(k, 100) for k in range(1, 11)])
    finally:
        topics.close()
    config_file, _ = submit_config(tmp_path, dev_env_for("spark")["SPARK_JARS"], kafka_bootstrap, kafka_topic,
                                   available_now=True, max_offsets_per_trigger=KEYS)
    result = subprocess.run([sys.executable, "-m", "cdc.runtime.submit", str(config_file), "lake"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900,
                            cwd=Path(__file__).resolve().parents[2])
    text = result.stdout.decode(errors="replace")
    assert result.returncode == 0, text
    table = str(tmp_path / "lake" / "public" / "items")
    assert rows(spark, table, "id", "name") == [(k, f"n{k}.2") for k in range(11, KEYS + 1)], text
    # The MERGEs did go over deletion vectors: at least two marked rows deleted in place.
    history = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").collect()
    marking = [h.version for h in history if h.operation == "MERGE" and sum(
        int((h.operationMetrics or {}).get(f"numTargetDeletionVectors{what}", 0)) for what in ("Added", "Updated")) > 0]
    assert len(marking) >= 2, json.dumps([(h.version, h.operation, h.operationMetrics) for h in history])
    assert [line for line in text.splitlines() if ERROR.search(line)] == [], text
    # Nor a WARN per MERGE about the source Delta materialized and let go (spark_sinks/session.py).
    assert "was locally checkpointed" not in text, text
