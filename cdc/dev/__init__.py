"""The local stack of real servers (`cdc dev up|down|status`), without Docker.

Every server runs as a local process on a free loopback port, with its data in a throwaway
directory. `cdc dev up` writes the connection settings to ``<dev home>/dev.env`` (shell syntax),
which the tests, the demo and the benchmarks read. Readiness is checked by connecting.

Layout:
  paths.py     where the cache (Maven jars) and the dev home (state, dev.env) live
  jars.py      Maven Central resolution of the Kafka, OpenSearch, Spark and Kafka Connect jars into the cache
  service.py   the base of the servers: how one is initialised, started, probed and stopped
  databases.py PostgreSQL (15 and 17) and MariaDB
  brokers.py   Kafka and the schema registry
  stores.py    Redis (single and cluster) and OpenSearch (plain and secure)
  services.py  every server by name
  stack.py     up/down/status over a set of services, the state file and dev.env
"""
