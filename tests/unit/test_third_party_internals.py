"""The private internals of third-party libraries the product still uses, each checked against
the installed library, so that an upgrade that moves one fails here, loudly, instead of leaving
a feature that silently does nothing. Each is used in one small function that says why:

* PySpark's ``SparkContext._gateway`` and ``_jvm`` (``spark_sinks/session.py``, ``rebuild.py``,
  ``avro_records.py``): no public way to ask whether the JVM runs, and log4j, Hadoop's file system
  and the JVM's class loader are reached through Py4J only (PySpark is pinned < 4.1). The
  instance's ``_jsc`` (``rebuild._remove``) needs a session: the Delta rebuild tests run it.
"""

from __future__ import annotations


def test_pyspark_still_has_the_class_attributes_the_session_reads():
    import pyspark  # the spark extra, which scripts/setup installs

    assert hasattr(pyspark.SparkContext, "_gateway") and hasattr(pyspark.SparkContext, "_jvm")
