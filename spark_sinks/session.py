"""A Spark session with the Kafka source and Delta Lake configured.

Spark's own ``spark.jars.packages`` resolver (Ivy) ignores Maven's mirror settings, so the jars are
resolved by Maven into the project's cache (``cdc dev up`` / ``cdc.api.spark_jars``) and handed
to Spark as plain files through ``spark.jars``.

A local session (``local[...]``) binds its driver to loopback: Spark otherwise binds the machine's
external interface (whatever the host name resolves to), opening the driver's ports to the network
for a process that talks only to itself. ``SPARK_LOCAL_IP`` (Spark's own setting) still wins.
"""

from __future__ import annotations

import os
from typing import Mapping, Sequence

LOOPBACK = "127.0.0.1"


def driver_address(master: str, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The driver's bind settings for ``master``: loopback for a local master unless
    ``SPARK_LOCAL_IP`` says otherwise; nothing for a cluster (its executors must reach the driver)."""
    env = os.environ if env is None else env
    if not master.startswith("local") or env.get("SPARK_LOCAL_IP"):
        return {}
    return {"spark.driver.bindAddress": LOOPBACK, "spark.driver.host": LOOPBACK}


def local_session(app_name: str, *, jars: Sequence[str] | None = None, master: str = "local[2]",
                  warehouse: str | None = None, driver_memory: str = "2g"):
    """Build (or get) a SparkSession for ``master`` with Delta's SQL extension and catalog."""
    from pyspark.sql import SparkSession

    if jars is None:
        from cdc.api import spark_jars

        jars = spark_jars()
    builder = (
        SparkSession.builder.appName(app_name).master(master)
        .config("spark.jars", ",".join(jars))
        .config("spark.driver.memory", driver_memory)
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.databricks.delta.snapshotPartitions", "2")
    )
    for key, value in driver_address(master).items():
        builder = builder.config(key, value)
    if warehouse:
        builder = builder.config("spark.sql.warehouse.dir", warehouse)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session
