"""The Spark sink's table-format settings (spark_sinks/config.py) and what they make: defaults
per format, refusals with a message naming the setting, the Iceberg catalog's session settings
and table names (pure logic: no Spark session)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from spark_sinks.config import DELTA_PROPERTIES, DeltaSinkConfig
from spark_sinks.lakes import create_properties, session_settings, targets

BASE = dict(name="lake", type="delta", topics=["cdc.public.*"], path="/lake", checkpoint="/cp")


def test_delta_keeps_its_default_properties_and_iceberg_gets_its_own():
    delta = DeltaSinkConfig.model_validate(BASE)
    assert delta.table_format == "delta" and create_properties(delta) == DELTA_PROPERTIES
    assert session_settings(delta) == {}
    iceberg = DeltaSinkConfig.model_validate({**BASE, "table_format": "iceberg"})
    assert create_properties(iceberg) == {"format-version": "2", "write.merge.mode": "merge-on-read",
                                          "write.update.mode": "merge-on-read", "write.delete.mode": "merge-on-read",
                                          "write.metadata.delete-after-commit.enabled": "true",
                                          "write.metadata.previous-versions-max": "20"}
    mine = DeltaSinkConfig.model_validate({**BASE, "table_format": "iceberg", "table_properties": {"a": "b"},
                                           "iceberg": {"write_mode": "copy-on-write"}})
    assert create_properties(mine)["write.merge.mode"] == "copy-on-write" and create_properties(mine)["a"] == "b"


def test_the_iceberg_catalog_is_registered_on_the_session_under_its_name():
    config = DeltaSinkConfig.model_validate({**BASE, "table_format": "iceberg", "iceberg": {"catalog": {
        "type": "jdbc", "name": "lakehouse", "uri": "jdbc:postgresql://db:5432/cat",
        "properties": {"jdbc.user": "cdc"}}}})
    assert session_settings(config) == {
        "spark.sql.catalog.lakehouse": "org.apache.iceberg.spark.SparkCatalog",
        "spark.sql.catalog.lakehouse.type": "jdbc", "spark.sql.catalog.lakehouse.warehouse": "/lake",
        "spark.sql.catalog.lakehouse.uri": "jdbc:postgresql://db:5432/cat",
        "spark.sql.catalog.lakehouse.jdbc.user": "cdc"}
    target = targets(config, "cdc")("cdc.public.orders", "type1")
    assert (target.ref, target.deletes_ref) == ("`lakehouse`.`public`.`orders`",
                                                "`lakehouse`.`_cdc_deletes`.`public`.`orders`")
    staging = targets(config, "cdc")("cdc.public.orders", "type1", "_cdc_rebuild")
    assert staging.ref == "`lakehouse`.`_cdc_rebuild`.`public`.`orders`"
    assert targets(DeltaSinkConfig.model_validate(BASE), "cdc")("cdc.public.orders", "type1").path == \
        "/lake/public/orders"


@pytest.mark.parametrize("settings, message", [
    ({"iceberg": {"catalog": {"type": "jdbc"}}}, "an Iceberg jdbc catalog needs its uri"),
    ({"json_columns": "variant"}, "json_columns: variant needs Iceberg format version 3"),
    ({"iceberg": {"catalog": {"name": "no-dashes"}}}, "String should match pattern"),
    ({"iceberg": {"write_mode": "sometimes"}}, "'merge-on-read' or 'copy-on-write'"),
])
def test_a_wrong_iceberg_setting_is_refused_naming_it(settings, message):
    with pytest.raises(ValidationError, match=message):
        DeltaSinkConfig.model_validate({**BASE, "table_format": "iceberg", **settings})
