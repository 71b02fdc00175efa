"""A Spark session with the Kafka source and Delta Lake configured.

Spark's own ``spark.jars.packages`` resolver (Ivy) ignores Maven's mirror settings, so the jars are
resolved by Maven into the project's cache (``cdc dev up`` / ``SinkContext.spark_jars``) and
handed to Spark as plain files through ``spark.jars``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LOOPBACK = "127.0.0.1"
BIND_ADDRESS, DRIVER_HOST = "spark.driver.bindAddress", "spark.driver.host"


def driver_address(master: str, conf: Mapping[str, str], environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """Where a local driver listens: loopback, unless the user said otherwise.

    Spark's default is the address the host name resolves to, else the first external
    interface: a laptop's driver (block manager, RPC) then listens on the network. A local
    master needs nothing beyond loopback; a cluster's executors must reach the driver, so for
    any other master, and when ``conf`` or ``SPARK_LOCAL_IP``/``SPARK_LOCAL_HOSTNAME`` choose an
    address, nothing is set here."""
    chosen = BIND_ADDRESS in conf or DRIVER_HOST in conf or environ.get("SPARK_LOCAL_IP") \
        or environ.get("SPARK_LOCAL_HOSTNAME")
    if chosen or not master.startswith("local"):
        return {}
    return {BIND_ADDRESS: LOOPBACK, DRIVER_HOST: LOOPBACK}


def local_cores(master: str) -> int | None:
    """The worker threads of a ``local``/``local[N]``/``local[*]`` master (``local[N, F]`` too);
    None for any other master."""
    match = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\s*\d+)?\])?", master.strip())
    if match is None:
        return None
    count = match.group(1)
    if count is None:
        return 1
    return (os.cpu_count() or 1) if count == "*" else int(count)


def shuffle_partitions(master: str) -> dict[str, str]:
    """One shuffle partition per local core. Each partition of a MERGE's output is a file, and
    every later MERGE that touches a file scans it and writes a deletion vector for it (one
    more task each, the table growing by a file per partition per batch): four partitions on
    ``local[2]`` made twice the files for no more parallelism. Another master keeps the four it
    had (a cluster's size is the user's to set, in the sink's ``spark.conf``)."""
    cores = local_cores(master)
    return {"spark.sql.shuffle.partitions": str(max(1, cores) if cores is not None else 4)}


# Spark keeps the classes it generates for a query's code (whole-stage codegen, expressions) in
# a cache keyed by their source, 100 by default. A Delta MERGE batch plans some 30 queries of its
# own beside the sink's, and at 100 each 1M-change batch compiled 77 classes again (Janino, on
# the driver), which the JVM's JIT then compiled again too; at 1000, 2-4 (Spark's CodegenMetrics),
# and the C2 compiler's threads spent about 1 s less of the batch's JVM CPU (spark_sinks/README.md,
# "Speed"). The classes averaged 4 KB of bytecode.
CODEGEN_CACHE = {"spark.sql.codegen.cache.maxEntries": "1000"}


def local_session(app_name: str, *, jars: Sequence[str], master: str = "local[2]",
                  warehouse: str | None = None, driver_memory: str = "2g", conf: Mapping[str, str] | None = None):
    """Build (or get) a SparkSession for ``master`` with Delta's SQL extension and catalog;
    ``conf``: more settings (static ones too: they are given before the session starts)."""
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    settings = {
        "spark.master": master,
        "spark.app.name": app_name,
        "spark.jars": ",".join(jars),
        "spark.driver.memory": driver_memory,
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        **shuffle_partitions(master),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",   # progress bars are noise in a daemon's log
        "spark.sql.session.timeZone": "UTC",
        "spark.databricks.delta.snapshotPartitions": "2",
        **CODEGEN_CACHE,
        **({"spark.sql.warehouse.dir": warehouse} if warehouse else {}),
        **driver_address(master, conf or {}),
        **(conf or {}),
    }
    spark_conf = SparkConf(loadDefaults=False).setAll(list(settings.items()))
    if SparkContext._gateway is None:  # noqa: SLF001 - no public way to ask whether the JVM runs
        _start_jvm(spark_conf)
    builder = SparkSession.builder
    for name, value in settings.items():
        builder = builder.config(name, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    quiet_loggers(session)
    return session


# Loggers whose lines do not mean what their level says, and the level that hides them.
#
# Delta 4.0's DeltaParquetFileFormat logs "ERROR DeltaParquetFileFormat: Failed to translate filter
# EqualTo(__delta_internal_is_row_deleted,0)" whenever a scan reads files with deletion vectors in
# a table with column mapping: the sink's tables have both, so every MERGE over rows that an
# earlier one changed logged it. Delta adds that filter itself (predicate pushdown in scans with
# deletion vectors, delta-io/delta#2933) and then finds no physical column for it when it renames
# the pushed filters to physical names (delta-io/delta#2924, #3001): the filter is not handed to
# the Parquet reader, whose files lack the column anyway, and Spark applies it after the scan, so
# no row is affected. That line is the class's only log call (still ERROR in Delta 4.0.1 and on
# its main branch; no upstream issue found). It is logged on the driver, where scans are planned.
#
# Iceberg's HadoopTableOperations logs a WARN with a stack trace ("Error reading version hint
# file ... does not exist") whenever a hadoop catalog is asked for a table that does not exist
# yet, which the sink asks before it creates a table or its delete memory. A table that exists
# without its hint is read all the same (Iceberg lists the metadata files instead).
#
# Delta's MERGE materializes its source with a local checkpoint and unpersists it when done; Spark
# then logs a WARN per MERGE that the RDD "was locally checkpointed, its lineage has been truncated
# and cannot be recomputed after unpersisting" (RDD.unpersist, logged under the RDD's class): a
# line per batch about data nothing reads again.
QUIET_LOGGERS = {"org.apache.spark.sql.delta.DeltaParquetFileFormat": "FATAL",
                 "org.apache.iceberg.hadoop.HadoopTableOperations": "ERROR",
                 "org.apache.spark.rdd.MapPartitionsRDD": "ERROR"}


def quiet_loggers(session) -> None:
    """Set the driver's log4j levels of ``QUIET_LOGGERS`` (the session's default log4j profile
    otherwise; a user's log4j2.properties under spark-submit keeps every other logger)."""
    jvm = session.sparkContext._jvm  # noqa: SLF001 - log4j is reached through Py4J only
    for name, level in QUIET_LOGGERS.items():
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
            name, jvm.org.apache.logging.log4j.Level.toLevel(level))


def _start_jvm(spark_conf) -> None:
    """Start Spark's JVM in a process group of its own, with its SparkContext.

    pyspark starts it in ours, so a SIGTERM to the group (a service manager stopping the
    daemon, ``kill -- -PGID``) reached the JVM too: its shutdown hooks stopped the SparkContext
    under the batch in flight, and the sink printed pages of InterruptedException and
    StackOverflowError instead of stopping the query itself. Apart, the JVM is stopped by the
    sink (``DeltaSink.stop``), and still dies with this process: it exits when its stdin, a
    pipe from here, closes."""
    from pyspark import SparkContext
    from pyspark.java_gateway import launch_gateway

    gateway = launch_gateway(spark_conf, popen_kwargs={"start_new_session": True})
    SparkContext(conf=spark_conf, gateway=gateway)


@contextmanager
def conf_within(session: SparkSession, settings: dict[str, str]) -> Iterator[None]:
    """``settings`` in ``session``'s SQL conf inside, their former values (or none) after."""
    conf = session.conf
    former = {name: conf.get(name, None) for name in settings}
    for name, value in settings.items():
        conf.set(name, value)
    try:
        yield
    finally:
        for name, old in former.items():
            if old is None:
                conf.unset(name)
            else:
                conf.set(name, old)
