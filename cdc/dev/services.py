"""Every server of the local stack by name (``SERVICES``), one class each.

The base and its helpers are in ``service.py``; the servers in ``databases.py`` (PostgreSQL,
MariaDB), ``brokers.py`` (Kafka, the schema registry), ``stores.py`` (Redis, OpenSearch) and
``spark_cluster.py`` (a Spark standalone master and workers).
"""

from __future__ import annotations

from cdc.dev.brokers import Kafka, Kafka1, Kafka2, Kafka3, Registry
from cdc.dev.databases import MariaDB, Postgres, Postgres17
from cdc.dev.service import LOOPBACK, Service, _chown_tree, free_port, port_open
from cdc.dev.spark_cluster import SparkMaster, SparkWorker1, SparkWorker2
from cdc.dev.stores import OpenSearch, OpenSearchSecure, Redis, RedisCluster, RedisClusterReplicated

__all__ = ["SERVICES", "LOOPBACK", "Service", "free_port", "port_open", "_chown_tree", "Postgres", "Postgres17",
           "MariaDB", "Kafka", "Kafka1", "Kafka2", "Kafka3", "Registry", "Redis", "RedisCluster",
           "RedisClusterReplicated", "OpenSearch", "OpenSearchSecure", "SparkMaster", "SparkWorker1", "SparkWorker2"]

SERVICES: dict[str, type[Service]] = {
    cls.name: cls for cls in (Postgres, Postgres17, MariaDB, Kafka, Redis, RedisCluster, OpenSearch, OpenSearchSecure,
                              Registry, Kafka1, Kafka2, Kafka3, RedisClusterReplicated, SparkMaster,
                              SparkWorker1, SparkWorker2)
}

