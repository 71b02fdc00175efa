"""The table format a Spark sink's config names: its tables (``targets``), the properties of a
table it creates, and what its session needs (an Iceberg catalog). spark_sinks/tables.py holds
what the formats share and Delta's; spark_sinks/iceberg.py Iceberg's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from spark_sinks.iceberg import IcebergTarget, catalog_settings, table_properties
from spark_sinks.tables import DeltaTarget, TableTarget


def targets(config: Any, prefix: str) -> Callable[..., TableTarget]:
    """``make(topic, mode, area="")``: the tables of ``topic`` in the sink's table format."""
    if config.table_format == "iceberg":
        catalog = config.iceberg.catalog.name
        return lambda topic, mode, area="": IcebergTarget(catalog, topic, prefix, mode, area=area)
    return lambda topic, mode, area="": DeltaTarget(config.path, topic, prefix, mode, area=area)


def create_properties(config: Any) -> dict[str, str]:
    """The properties of a table the sink creates: the format's, then the config's."""
    if config.table_format == "iceberg":
        return {**table_properties(config.iceberg.write_mode), **config.table_properties}
    return dict(config.table_properties)


def session_settings(config: Any) -> dict[str, str]:
    """What the sink's Spark session needs for its table format (Iceberg: its catalog)."""
    if config.table_format == "iceberg":
        return catalog_settings(config.iceberg.catalog.name, config.iceberg.catalog, config.path)
    return {}
