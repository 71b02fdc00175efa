"""The log: log-compacted topics keyed by primary key.

``base`` defines the interface (Log, LogWriter, LogReader); ``kafka`` (with ``kafka_writer`` and
``kafka_reader``) implements it on Apache Kafka through confluent-kafka, ``embedded`` on SQLite for
one machine (the default when no Kafka is configured). ``delivery`` tracks which checkpoint is safe once the log has acknowledged everything
before it.
"""

from cdc.log.base import Log, LogReader, LogRecord, LogWriter, TopicSettings

__all__ = ["Log", "LogReader", "LogRecord", "LogWriter", "TopicSettings"]
