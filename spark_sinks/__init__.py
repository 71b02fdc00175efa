"""Spark Structured Streaming sinks (Kafka source, foreachBatch, Delta MERGE)."""
