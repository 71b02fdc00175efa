"""The Delta sink's reading of its query's checkpoint (``spark_sinks.reading.checkpoint_offsets``,
what ``cdc verify`` waits on): Spark's ``offsets/<batch>`` layout, and a typed error naming the
file and line for anything else. tests/integration/test_verify_delta.py reads a real one."""

from __future__ import annotations

import pytest

from cdc.api import PermanentError
from spark_sinks.reading import checkpoint_offsets

# As Spark 4.0's Kafka source writes it: a version line, the batch's metadata, a line per source.
WRITTEN = ('v1\n{"batchWatermarkMs":0,"batchTimestampMs":1765000000000,"conf":{"spark.sql.shuffle.partitions":"2"}}\n'
           '{"p.public.items":{"1":120,"0":75},"p.public.kinds":{"0":30}}')


def test_a_topics_offsets_per_partition_come_from_its_sources_line():
    assert checkpoint_offsets(WRITTEN, "p.public.items", "cp/offsets/7") == {0: 75, 1: 120}
    assert checkpoint_offsets(WRITTEN, "p.public.kinds", "cp/offsets/7") == {0: 30}
    assert checkpoint_offsets(WRITTEN, "p.public.other", "cp/offsets/7") == {}


@pytest.mark.parametrize(("text", "says"), [
    ("", "not a Structured Streaming offsets file"),
    ("v2\n{}\n{}", "not a Structured Streaming offsets file"),
    ('v1\n{}\n{"p.public.items": {"0": 7', "line 3: not a source's offsets"),
    ('v1\n{}\n{"p.public.items": [1, 2]}', "line 3: not a source's offsets"),
    ('v1\n{}\n{"p.public.items": {"zero": 1}}', "line 3: not a source's offsets"),
])
def test_anything_else_is_a_typed_error_naming_the_file_and_line(text, says):
    with pytest.raises(PermanentError, match=says) as raised:
        checkpoint_offsets(text, "p.public.items", "cp/offsets/7")
    assert "cp/offsets/7" in str(raised.value)
