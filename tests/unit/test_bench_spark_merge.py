"""bench/spark_merge.py's --variant spec: Spark SQL settings and table properties told apart."""

from __future__ import annotations

from bench.spark_merge import parse_variant


def test_a_variant_splits_into_its_label_settings_and_table_properties():
    label, conf, props = parse_variant(
        "cow:table.delta.enableDeletionVectors=false;spark.databricks.delta.stats.collect=false")
    assert label == "cow"
    assert conf == {"spark.databricks.delta.stats.collect": "false"}
    assert props == {"delta.enableDeletionVectors": "false"}


def test_a_value_may_hold_an_equals_sign_and_a_trailing_separator_is_ignored():
    assert parse_variant("x:k=a=b;") == ("x", {"k": "a=b"}, {})
